"""The executor side of a checkpointed Spark job: fold records, snapshot at barriers, ack.

:func:`partition_step` builds the function a job passes to ``DataFrame.mapInArrow``
over the ``cutline-kafka`` source. Spark runs it once per task, i.e. per Kafka
partition of a micro-batch (the source makes one task per partition, and
``mapInArrow`` keeps partitions as they are). For each partition it:

1. loads the partition's state from the :class:`PartitionStateStore`: the newest
   version at or below the first row's offset (a re-run of the batch starts from
   the same version, since versions are keyed by offset);
2. on a barrier row (the first row of a barrier batch, at the batch's start
   offset): copies that version to ``<location>/<topic>-<partition>`` atomically
   and sends ``CheckpointAcknowledged`` with the handle and the offset, from this
   task; if the snapshot cannot be written it sends ``CheckpointDeclined`` and the
   batch goes on;
3. folds the records through the step's ``update`` and yields its output rows;
4. saves the version at the end of the partition's records.

Acks are idempotent under task retries and batch re-runs: a snapshot file that
exists already is a whole one of the same cut (same checkpoint id, same task, same
start offset), so it is hashed and acknowledged again, not rewritten, and the
coordinator ignores an ack it already has (DESIGN §4).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, Message, Producer

from events.kafka import produce_record, producer_config
from events.participant import REASON_IO, REASON_TASK_FAILURE, local_path, snapshot_uri, write_atomic
from events.records import CheckpointAcknowledged, CheckpointDeclined, StateHandle
from events.topics import Topics
from spark_tasks.kafka_source import BARRIER_COLUMN
from spark_tasks.state import KafkaRecord, PartitionStateStore, StatefulStep, task_id

__all__ = ["TaskSettings", "partition_step", "send_reply"]

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 10.0

_producers: dict[tuple[str, tuple[tuple[str, Any], ...]], Producer] = {}
"""One producer per Python worker and cluster: Spark reuses its Python workers, so
acks after the first do not pay for a connection (about 10 ms on loopback)."""


@dataclass(frozen=True)
class TaskSettings:
    """What every task of a job needs; pickled into the executors with the step."""

    job_id: str
    bootstrap: str
    state_dir: str
    topic_prefix: str = Topics().prefix
    producer_extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _producer(settings: TaskSettings) -> Producer:
    key = (settings.bootstrap, tuple(sorted(settings.producer_extra.items())))
    producer = _producers.get(key)
    if producer is None:
        producer = _producers[key] = Producer(producer_config(settings.bootstrap, settings.producer_extra))
    return producer


def send_reply(settings: TaskSettings, reply: CheckpointAcknowledged | CheckpointDeclined) -> None:
    """Send an ack or a decline and wait until the broker has it (or log why not)."""
    topics = settings.topics
    topic = topics.acks if isinstance(reply, CheckpointAcknowledged) else topics.declines
    errors: list[KafkaError] = []

    def delivered(error: KafkaError | None, msg: Message) -> None:
        if error is not None:
            errors.append(error)

    producer = _producer(settings)
    produce_record(producer, topic, reply, on_delivery=delivered)
    left = producer.flush(ACK_TIMEOUT_S)
    if errors or left:
        # The checkpoint then expires on the coordinator; failing the task would only
        # make Spark fail the query, and a retry could not do better than the broker.
        log.error(
            "task %s could not send %s of checkpoint %d to %s: %s",
            reply.task_id,
            type(reply).__name__,
            reply.checkpoint_id,
            topic,
            errors[0] if errors else f"not delivered within {ACK_TIMEOUT_S:g}s",
        )


def snapshot_reply(
    settings: TaskSettings, barrier: Mapping[str, Any], topic: str, partition: int, cut: int, data: bytes
) -> CheckpointAcknowledged | CheckpointDeclined:
    """Write ``data`` (the state at offset ``cut``) under the barrier's location; the ack, or a decline."""
    task = task_id(topic, partition)
    checkpoint_id, attempt = int(barrier["id"]), int(barrier["attempt"])
    started = time.perf_counter()
    try:
        uri = snapshot_uri(str(barrier["location"]), task)
        path = local_path(uri)
        if path.is_file():  # a retried task or a re-run batch: the same cut, written already
            data = path.read_bytes()
        else:
            write_atomic(path, data)
    except Exception as exc:
        log.warning("task %s declines checkpoint %d: %r", task, checkpoint_id, exc)
        return CheckpointDeclined(
            job_id=settings.job_id,
            checkpoint_id=checkpoint_id,
            attempt=attempt,
            task_id=task,
            timestamp_ms=_now_ms(),
            reason=REASON_IO if isinstance(exc, OSError) else REASON_TASK_FAILURE,
            message=f"{type(exc).__name__}: {exc}",
        )
    return CheckpointAcknowledged(
        job_id=settings.job_id,
        checkpoint_id=checkpoint_id,
        attempt=attempt,
        task_id=task,
        timestamp_ms=_now_ms(),
        state=StateHandle(uri=uri, size_bytes=len(data), sha256=hashlib.sha256(data).hexdigest()),
        offsets={f"{topic}:{partition}": cut},
        metrics={"write_ms": round((time.perf_counter() - started) * 1000), "bytes": len(data)},
    )


class _Partition:
    """One partition's state while a task folds its rows."""

    def __init__(
        self, step: StatefulStep[Any], store: PartitionStateStore, topic: str, partition: int, first: int
    ) -> None:
        self.topic, self.partition = topic, partition
        loaded = store.load(topic, partition, first)
        if loaded is None:
            self.data: bytes | None = None
            self.state = step.initial()
        else:
            self.data = loaded[1]
            self.state = step.deserialize(loaded[1])
        self.next_offset: int | None = None
        """One past the last record folded by this task; None before the first."""

    def snapshot_bytes(self, step: StatefulStep[Any]) -> bytes:
        return self.data if self.data is not None else step.serialize(self.state)


def partition_step(
    step: StatefulStep[Any], settings: TaskSettings, output: pa.Schema
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of a checkpointed job (see the module docstring).

    ``output`` is the Arrow schema of ``step.output_schema``.
    """

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = PartitionStateStore(settings.state_dir)
        partitions: dict[tuple[str, int], _Partition] = {}
        for batch in batches:
            records: dict[tuple[str, int], list[KafkaRecord]] = {}
            columns = batch.to_pydict()
            barriers = columns.get(BARRIER_COLUMN) or [None] * batch.num_rows
            for i in range(batch.num_rows):
                topic, partition, offset = columns["topic"][i], columns["partition"][i], columns["offset"][i]
                key = (topic, partition)
                current = partitions.get(key)
                if current is None:
                    current = partitions[key] = _Partition(step, store, topic, partition, offset)
                barrier = barriers[i]
                if barrier is not None:
                    if current.next_offset is not None or key in records:
                        raise RuntimeError(
                            f"barrier row of {topic}[{partition}] after its records: the source must "
                            "emit a batch's barrier first (spark_tasks.kafka_source)"
                        )
                    reply = snapshot_reply(
                        settings, json.loads(barrier), topic, partition, offset, current.snapshot_bytes(step)
                    )
                    send_reply(settings, reply)
                    continue
                records.setdefault(key, []).append(
                    KafkaRecord(
                        columns["key"][i],
                        columns["value"][i],
                        topic,
                        partition,
                        offset,
                        columns["timestamp"][i],
                    )
                )
            for key, chunk in records.items():
                current = partitions[key]
                current.state, rows = step.update(current.state, chunk)
                current.data = None
                current.next_offset = chunk[-1].offset + 1
                out = [
                    row if isinstance(row, Mapping) else dict(zip(output.names, row, strict=True))
                    for row in rows
                ]
                if out:
                    yield pa.RecordBatch.from_pylist(out, schema=output)
        for current in partitions.values():
            if current.next_offset is not None:
                store.save(
                    current.topic, current.partition, current.next_offset, step.serialize(current.state)
                )

    return run
