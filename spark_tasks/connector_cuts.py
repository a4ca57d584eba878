"""The ``source`` task of a job on Spark's own ``kafka`` connector: the driver acknowledges each
checkpoint with the Kafka offsets of its cut, read from Spark's offset log (docs/spark.md,
"Checkpoints on Spark's own kafka connector").

With ``cutline-kafka`` every input partition's barrier row carries its cut offset to the tasks. The
JVM connector's batches carry no barrier rows, and its offsets are Spark's: a batch's start on every
partition is the previous batch's end in ``<checkpoint>/offsets/N-1``, the line of the Kafka source
there; the ``cutline-barriers`` source's line in ``offsets/N`` says which barrier batch ``N`` folded.

- :func:`read_logged_batch` reads one batch of the log (I/O, no decision);
- :func:`source_ack` decides what the ``source`` task answers for it (pure): for a checkpoint or
  savepoint barrier, the batch's start, the cut the keyed tasks snapshot at; for a stop-with-savepoint
  barrier, the batch's end, once the batch has committed (the keyed tasks snapshot after its records,
  and nothing runs after it: :mod:`spark_tasks.barrier_source`);
- :class:`CutFollower` is the driver's thread that carries it out, with the sending injected;
- :class:`PartitionSnapshots` answers for a per-partition job's tasks instead: their barrier rows
  would be a task of their own in the union, never beside a partition's records, so the driver takes
  each partition's snapshot at the cut from the state store the tasks keep by offset
  (:mod:`spark_tasks.state`): the version at or below the cut is the state after every record below
  it once the batch before has committed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from events.clock import now_ms
from events.task.reply import Answer, Failed, SnapshotOutcome, answer
from events.wire.barrier_entry import entry_barrier
from events.wire.records import CheckpointBarrier
from events.wire.vocabulary import DeclineReason
from spark_tasks.barrier_source import BarrierOffset, is_barrier_offset
from spark_tasks.kafka_source import TopicPartitionKey, from_offsets
from spark_tasks.replies import await_replies, send_reply
from spark_tasks.state import PartitionStateStore, StateLost, task_id
from spark_tasks.tasks import TaskSettings, write_partition_snapshot

__all__ = [
    "SOURCE_TASK",
    "CutFollower",
    "LoggedBatch",
    "PartitionSnapshots",
    "SourceAck",
    "logged_marker",
    "new_marker",
    "parse_logged_batch",
    "read_logged_batch",
    "source_ack",
]

log = logging.getLogger(__name__)

SOURCE_TASK = "source"
"""The task id of the driver's acks (the cut's offsets, no state) in a job on the connector."""


@dataclass(frozen=True)
class LoggedBatch:
    """One micro-batch in Spark's offset log: the Kafka source's end offsets and the barrier source's."""

    batch_id: int
    offsets: Mapping[TopicPartitionKey, int]
    barriers: BarrierOffset


@dataclass(frozen=True)
class SourceAck:
    """What the ``source`` task answers to the barrier batch ``batch_id`` folded: the cut's offsets,
    once the batch has committed if ``after_commit``."""

    batch_id: int
    barrier: Mapping[str, Any]
    offsets: Mapping[TopicPartitionKey, int]
    after_commit: bool


def parse_logged_batch(batch_id: int, text: str) -> LoggedBatch:
    """A batch of Spark's offset log (``v1``, the batch's metadata, one line per source: ``-`` for
    none): the Kafka source's line and the barrier source's. Raises ``ValueError`` otherwise."""
    lines = text.splitlines()
    sources = [line for line in lines[2:] if line.strip() not in ("", "-")]
    barriers = [line for line in sources if is_barrier_offset(line)]
    kafka = [line for line in sources if not is_barrier_offset(line)]
    if len(lines) < 3 or len(barriers) != 1 or len(kafka) != 1:
        raise ValueError(
            f"batch {batch_id}: expected one kafka and one cutline-barriers source in Spark's offset log, "
            f"found {len(kafka)} and {len(barriers)}"
        )
    return LoggedBatch(batch_id, from_offsets(kafka[0]), BarrierOffset.from_json(barriers[0]))


def read_logged_batch(spark_checkpoint: Path, batch_id: int) -> LoggedBatch | None:
    """Batch ``batch_id`` of the query's offset log (None while Spark has not written it: it writes
    each batch's file at once, by a rename)."""
    try:
        text = (spark_checkpoint / "offsets" / str(batch_id)).read_text()
    except FileNotFoundError:
        return None
    return parse_logged_batch(batch_id, text)


def new_marker(batch: LoggedBatch, previous: LoggedBatch | None) -> int | None:
    """The time of the latency marker ``batch`` carries anew: a batch the Kafka source alone made
    run ends the barrier source where it started, with the marker of the batch before."""
    marked = batch.barriers.marker_ms
    return None if previous is not None and marked == previous.barriers.marker_ms else marked


def logged_marker(spark_checkpoint: Path, batch_id: int) -> int | None:
    """The time of the latency marker new in batch ``batch_id`` of the query's offset log, or None."""
    batch = read_logged_batch(spark_checkpoint, batch_id)
    previous = read_logged_batch(spark_checkpoint, batch_id - 1) if batch_id > 0 else None
    return None if batch is None else new_marker(batch, previous)


def is_committed(spark_checkpoint: Path, batch_id: int) -> bool:
    """Has batch ``batch_id`` committed (its sink's output written)?"""
    return (spark_checkpoint / "commits" / str(batch_id)).exists()


def source_ack(
    batch: LoggedBatch, previous: LoggedBatch | None, first: Mapping[TopicPartitionKey, int]
) -> SourceAck | None:
    """The ``source`` task's answer for ``batch`` (``previous`` is the batch before it, None for the
    query's first, which starts at ``first``): None unless the batch folded a new barrier."""
    barrier = batch.barriers.barrier
    folded_before = 0 if previous is None else previous.barriers.folded
    if barrier is None or batch.barriers.folded <= folded_before:
        return None
    if batch.barriers.stops:
        return SourceAck(batch.batch_id, barrier, batch.offsets, after_commit=True)
    start = first if previous is None else previous.offsets
    return SourceAck(batch.batch_id, barrier, start, after_commit=False)


class CutFollower:
    """Follows a query's offset log in a daemon thread and hands each :class:`SourceAck` to ``send``
    (a stop's once its batch has committed); ``partitions`` are the job's (the ack names only them).
    ``ready`` (the barrier entry -> bool), when given, must say yes before an ack goes: an
    exactly-once Kafka sink's output before the cut is staged (``ExactlyOnceKafkaSink.staged_for``)."""

    def __init__(
        self,
        spark_checkpoint: Path,
        first: Mapping[TopicPartitionKey, int],
        partitions: Sequence[TopicPartitionKey],
        send: Callable[[SourceAck], None],
        *,
        interval: float = 0.05,
        name: str = "cutline-cuts",
        ready: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> None:
        self.spark_checkpoint = spark_checkpoint
        self.ready = ready
        self.first = dict(first)
        self.partitions = frozenset(partitions)
        self.send = send
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        previous: LoggedBatch | None = None
        batch_id = 0
        while not self._stop.is_set():
            try:
                batch = read_logged_batch(self.spark_checkpoint, batch_id)
            except (OSError, ValueError) as exc:
                log.warning("cannot read batch %d of %s: %s", batch_id, self.spark_checkpoint, exc)
                batch = None
            if batch is None:
                self._stop.wait(self.interval)
                continue
            ack = source_ack(batch, previous, self.first)
            if ack is not None and self._answer(ack) is False:
                return
            previous, batch_id = batch, batch_id + 1

    def _answer(self, ack: SourceAck) -> bool:
        """Send ``ack`` (a stop's once its batch committed, any once ``ready``); False if the follower
        was closed first."""
        while not self._may_answer(ack):
            if self._stop.wait(self.interval):
                return False
        own = {tp: offset for tp, offset in ack.offsets.items() if tp in self.partitions}
        try:
            self.send(SourceAck(ack.batch_id, ack.barrier, own, ack.after_commit))
        except Exception:  # the checkpoint then expires on the coordinator; the next one may do
            log.exception("the source's ack of batch %d", ack.batch_id)
        return True

    def _may_answer(self, ack: SourceAck) -> bool:
        if ack.after_commit and not is_committed(self.spark_checkpoint, ack.batch_id):
            return False
        try:
            return self.ready is None or self.ready(ack.barrier)
        except OSError as exc:  # the location cannot be read now: ask again
            log.warning("batch %d: %s", ack.batch_id, exc)
            return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


class PartitionSnapshots:
    """The answers of a per-partition job's tasks on the connector, one per partition of a
    :class:`SourceAck`: the state version at or below the cut copied to the checkpoint's location
    (:func:`~spark_tasks.tasks.write_partition_snapshot`, named as a task names it) and acked as task
    ``<topic>-<partition>``, or declined when the store has no version there. ``send`` hands an answer
    over without waiting and ``flush`` waits for them all (injected), so that many partitions' acks
    take one round trip to the broker, not one each."""

    def __init__(
        self,
        store: PartitionStateStore,
        settings: TaskSettings,
        send: Callable[[TaskSettings, Answer], None] | None = None,
        flush: Callable[[TaskSettings], None] = await_replies,
    ) -> None:
        self.store = store
        self.settings = settings
        self.send = send or _hand_over
        self.flush = flush

    def __call__(self, ack: SourceAck) -> None:
        checkpoint = entry_barrier(self.settings.job_id, ack.barrier)
        for (topic, partition), cut in sorted(ack.offsets.items()):
            outcome = self._snapshot(checkpoint, topic, partition, cut)
            task = task_id(topic, partition)
            self.send(self.settings, answer(checkpoint, ack.barrier.get("epoch"), task, outcome, now_ms()))
        self.flush(self.settings)

    def _snapshot(
        self, checkpoint: CheckpointBarrier, topic: str, partition: int, cut: int
    ) -> SnapshotOutcome:
        try:
            loaded = self.store.load(topic, partition, cut)
        except (StateLost, OSError) as exc:
            return Failed(DeclineReason.TASK_CHECKPOINT_FAILURE, f"{type(exc).__name__}: {exc}")
        if loaded is None:
            return Failed(
                DeclineReason.TASK_CHECKPOINT_FAILURE,
                f"no state of {topic}[{partition}] at or below offset {cut} in {self.store.root}: the "
                "driver fell more than 8 batches behind its tasks (spark_tasks.state.VERSIONS_KEPT), or "
                "the store was deleted; the next checkpoint may do",
            )
        return write_partition_snapshot(self.settings, checkpoint, topic, partition, cut, loaded[1])


def _hand_over(settings: TaskSettings, answered: Answer) -> None:
    send_reply(settings, answered, wait=False)
