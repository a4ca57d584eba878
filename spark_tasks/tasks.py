"""The executor side of a checkpointed Spark job: fold records, snapshot at barriers, ack.

:func:`partition_step` builds the function a job passes to ``DataFrame.mapInArrow``
over the ``cutline-kafka`` source. Spark runs it once per task, i.e. per Kafka
partition of a micro-batch (the source makes one task per partition, and
``mapInArrow`` keeps partitions as they are). For each partition it:

1. loads the partition's state from the :class:`PartitionStateStore`: the newest
   version at or below the first row's offset (a re-run of the batch starts from
   the same version, since versions are keyed by offset);
2. on a barrier row (the first row of a barrier batch, at the batch's start
   offset): copies that version atomically to
   ``<location>/<topic>-<partition>.a<attempt>-<run>.cut-<offset>`` (see
   :func:`snapshot_name`) and sends the answer :func:`events.task.reply.answer` makes of it:
   ``CheckpointAcknowledged`` with the handle and the offset, from this task, or, if the snapshot
   cannot be written, ``CheckpointDeclined``, and the batch goes on;
3. folds the records through the step's ``update`` and yields its output rows;
4. saves the version at the end of the partition's records.

**Snapshots are bound to their cut.** A snapshot's file name holds the checkpoint's
attempt, the job run (:attr:`TaskSettings.run_id`) and the cut (the offset it is
the state at); the location holds the checkpoint id. So a task re-uses a file only
when it is a whole snapshot (atomic rename) of exactly the same cut of the same run:
a retried task or a re-run batch hashes it and acknowledges it again, and the
coordinator ignores an ack it already has (docs/design.md, "The checkpoint decider"). Files of another run or
attempt that happen to share a checkpoint id (a journal that was reset, a reused
location) are never paired with this cut's offsets.

**Missing state is an error.** The job writes a first version of every partition
it knows before its query starts (the restored snapshot, or the initial state at
offset 0; :attr:`TaskSettings.seeded`). A task that finds no version at or below
its first row (an executor that cannot see ``work_dir``, a deleted store) does not
start from empty state: it declines the partition's barrier
(``TASK_CHECKPOINT_FAILURE``, with the reason), skips the partition's records and
leaves a tombstone (:meth:`PartitionStateStore.lost`), so every later checkpoint is
declined too and the job fails by the coordinator's failure rules
(``tolerable_failures``). The restore then replays from the last completed
checkpoint, which is older than the loss.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa

from events.clock import now_ms
from events.task.participant import (
    local_path,
    snapshot_uri,
    write_atomic,
)
from events.task.reply import Failed, SnapshotOutcome, Snapshotted, answer, failure
from events.wire.barrier_entry import entry_barrier, parse_barrier_json
from events.wire.codec import process_wire
from events.wire.records import CheckpointBarrier
from events.wire.topics import Topics
from events.wire.vocabulary import DeclineReason
from events.wire.wire_settings import WireSettings
from spark_tasks.kafka_source.reading import BARRIER_COLUMN
from spark_tasks.latency import STEP, Measurements
from spark_tasks.replies import await_replies, send_reply
from spark_tasks.state import KafkaRecord, PartitionStateStore, StatefulStep, StateLost, task_id
from spark_tasks.workers import freeze_worker_heap

__all__ = [
    "TaskSettings",
    "await_replies",
    "partition_step",
    "send_reply",
    "snapshot_files",
    "snapshot_name",
    "snapshot_names",
    "write_partition_snapshot",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskSettings:
    """What every task of a job needs; pickled into the executors with the step.

    ``run_id`` names the job run (one :class:`~spark_tasks.job.CheckpointedJob`) in
    snapshot file names. ``seeded`` holds the task ids whose state the job wrote
    before the query started: for them a missing state version is an error (a
    decline), never empty state. Other partitions (added to a topic later, or a
    query without a job) start from ``step.initial()``.
    """

    job_id: str
    bootstrap: str
    state_dir: str
    topic_prefix: str = Topics().prefix
    producer_extra: Mapping[str, Any] = field(default_factory=dict)
    run_id: str = ""
    seeded: frozenset[str] = frozenset()
    wire: WireSettings = field(default_factory=process_wire)
    """The framing of the replies: the driver's (an executor is not configured by anyone else)."""
    attempt: int = 0
    """The job attempt the tasks run in (their latency measurements name it)."""

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)


_SNAPSHOT_SAFE = ":@=+,"
"""Characters :func:`events.task.participant.snapshot_uri` keeps in a file name."""


def snapshot_name(task: str, attempt: int, run_id: str, cut: int) -> str:
    """The name of ``task``'s snapshot at offset ``cut`` in a checkpoint's location.

    ``<task>.a<attempt>-<run_id>.cut-<cut>`` (``.a<attempt>.cut-<cut>`` without a run id):
    the location names the checkpoint id, the name the attempt, the run and the cut.
    """
    run = f"-{run_id}" if run_id else ""
    return f"{task}.a{attempt}{run}.cut-{cut}"


def snapshot_files(directory: Path, tasks: Iterable[str], attempt: int, run_id: str) -> list[Path]:
    """The snapshot files in ``directory`` that tasks of this run and attempt wrote (any cut)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [directory / name for name in snapshot_names(names, tasks, attempt, run_id)]


def snapshot_names(names: Iterable[str], tasks: Iterable[str], attempt: int, run_id: str) -> list[str]:
    """The file names among ``names`` that are snapshots of ``tasks`` in this run and attempt."""
    prefixes = tuple(
        quote(snapshot_name(task, attempt, run_id, 0)[:-1], safe=_SNAPSHOT_SAFE) for task in tasks
    )
    return sorted(
        name
        for name in names
        for prefix in prefixes
        if name.startswith(prefix) and _is_decimal(name[len(prefix) :])
    )


def _is_decimal(text: str) -> bool:
    return bool(text) and set(text) <= set("0123456789")


def write_partition_snapshot(
    settings: TaskSettings, barrier: CheckpointBarrier, topic: str, partition: int, cut: int, data: bytes
) -> SnapshotOutcome:
    """Write ``data`` (the state at offset ``cut``) under the barrier's location; what came of it.

    A retried task or a re-run batch finds this run's snapshot of this very cut and takes its bytes."""
    task = task_id(topic, partition)
    started = time.perf_counter()
    try:
        uri = snapshot_uri(barrier.location, snapshot_name(task, barrier.attempt, settings.run_id, cut))
        path = local_path(uri)
        if path.is_file():
            data = path.read_bytes()
        else:
            write_atomic(path, data)
    except Exception as exc:
        log.warning("task %s declines checkpoint %d: %r", task, barrier.checkpoint_id, exc)
        return failure(exc)
    metrics = {"write_ms": round((time.perf_counter() - started) * 1000), "bytes": len(data)}
    return Snapshotted(uri, data, {f"{topic}:{partition}": cut}, metrics)


class _Partition:
    """One partition's state while a task folds its rows."""

    def __init__(
        self,
        step: StatefulStep[Any],
        store: PartitionStateStore,
        settings: TaskSettings,
        topic: str,
        partition: int,
        first: int,
    ) -> None:
        self.topic, self.partition = topic, partition
        self.data: bytes | None = None
        self.state: Any = None
        self.missing: str | None = None
        """Why this partition has no state (its records are skipped), or None."""
        self.next_offset: int | None = None
        """One past the last record folded (or skipped) by this task; None before the first."""
        try:
            loaded = store.load(topic, partition, first)
        except StateLost as lost:
            self.missing = str(lost)
            return
        if loaded is not None:
            self.data = loaded[1]
            self.state = step.deserialize(loaded[1])
        elif task_id(topic, partition) in settings.seeded:
            self.missing = (
                f"no state of {topic}[{partition}] at or below offset {first} in {store.root} on "
                f"{socket.gethostname()}: the job wrote it before the query started, so this executor "
                "cannot see it. JobSettings.work_dir must be on storage every executor sees"
            )
        else:
            self.state = step.initial()

    def snapshot_bytes(self, step: StatefulStep[Any]) -> bytes:
        return self.data if self.data is not None else step.serialize(self.state)


def partition_step(
    step: StatefulStep[Any], settings: TaskSettings, output: pa.Schema
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of a checkpointed job (see the module docstring).

    ``output`` is the Arrow schema of ``step.output_schema``.
    """

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_worker_heap()
        store = PartitionStateStore(settings.state_dir)
        partitions: dict[tuple[str, int], _Partition] = {}
        latency = Measurements(settings.job_id, settings.attempt, STEP)
        for rows in batches:
            batch, _ = latency.take_markers(rows)  # latency markers: measured, never folded
            records: dict[tuple[str, int], list[KafkaRecord]] = {}
            columns = batch.to_pydict()
            barriers = columns.get(BARRIER_COLUMN) or [None] * batch.num_rows
            for i in range(batch.num_rows):
                topic, partition, offset = columns["topic"][i], columns["partition"][i], columns["offset"][i]
                key = (topic, partition)
                current = partitions.get(key)
                if current is None:
                    current = partitions[key] = _Partition(step, store, settings, topic, partition, offset)
                    if current.missing is not None:
                        log.error("task %s skips its records: %s", task_id(topic, partition), current.missing)
                barrier = barriers[i]
                if barrier is not None:
                    if current.next_offset is not None or key in records:
                        raise RuntimeError(
                            f"barrier row of {topic}[{partition}] after its records: the source must "
                            "emit a batch's barrier first (spark_tasks.kafka_source.reader)"
                        )
                    entry = parse_barrier_json(barrier)
                    checkpoint = entry_barrier(settings.job_id, entry)
                    outcome = (
                        Failed(DeclineReason.TASK_CHECKPOINT_FAILURE, current.missing)
                        if current.missing is not None
                        else write_partition_snapshot(
                            settings, checkpoint, topic, partition, offset, current.snapshot_bytes(step)
                        )
                    )
                    task = task_id(topic, partition)
                    send_reply(settings, answer(checkpoint, entry.get("epoch"), task, outcome, now_ms()))
                    continue
                if current.missing is not None:
                    current.next_offset = offset + 1
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
            if current.next_offset is None:
                continue
            if current.missing is not None:
                store.lost(current.topic, current.partition, current.next_offset, current.missing)
            else:
                store.save(
                    current.topic, current.partition, current.next_offset, step.serialize(current.state)
                )
        latency.send(settings)

    return run
