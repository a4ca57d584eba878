"""Exactly-once output of a checkpointed Spark job to Kafka (docs/exactly-once.md, "The Spark sink").

``ExactlyOnceKafkaSink(job, topic=...)`` is a ``foreachBatch`` function, used as
:class:`~spark_tasks.sink.CutFileSink` is; its DataFrame has the ``kafka`` format's columns::

    sink = ExactlyOnceKafkaSink(job, topic="word-counts", uid="counts")
    out = counts.select(col("word").alias("key"), to_json(struct("*")).alias("value"))
    job.start(out.writeStream.foreachBatch(sink).trigger(processingTime="1 second"))
    job.await_termination()
    sink.close()

``value`` (binary or string, required), ``key`` (binary or string), ``topic`` (string; the
``topic`` argument, when given, is used instead, as Spark's), ``partition`` (int) and ``headers``
(``array<struct<key: string, value: binary>>``); other columns are not written.

It is the participant sink of :mod:`events.task.exactly_once` split in two halves:

- **the batches** (:class:`StagedBatches`, what Spark calls, in the driver or, on Spark Connect, in a
  Python process of the server, which pickles it): each micro-batch's rows are kept in memory; a
  batch that begins with a barrier (the checkpoint's cut is at its start offsets) first stages what
  the batches before it wrote into ``<location>/driver.out``, before it runs, so before its tasks ack:
  a completed checkpoint's output is on durable storage. If the barrier's tasks have already
  snapshotted (something in ``foreachBatch`` ran the batch before the sink: :func:`staged_late_problem`),
  it stages all the same and fails the query with :class:`OutputStagedLate`;
- **the committer** (a thread in the driver): it follows the job's journal and, when a checkpoint
  of the attempt completes, commits the staged files up to it in one transaction with the commit
  marker (a completion whose own file is not staged yet waits for it); when the job is canceled it
  deletes what is staged and not completed. At start it recovers first
  (:meth:`~events.task.exactly_once.ExactlyOnceSink.recover`): it fences the transactional id and
  commits again what a dead driver's completed checkpoints staged.

It reads the ``cutline-kafka`` source's barriers: a job on Spark's own ``kafka`` connector is refused.

The sink is one task, ``driver``: its transactional id is ``<prefix>-<job>-<uid>-driver``, the same
in every attempt and at any parallelism.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException

from events.kafka.feed import JobFeed
from events.task import storage
from events.task.exactly_once import (
    ANY_PARTITION,
    DEFAULT_MAX_BUFFERED_BYTES,
    ExactlyOnceSink,
    OutputBuffer,
    OutputColumns,
    OutputRecord,
    Recovered,
    RecoveryPlan,
    Step,
    staged_name,
)
from events.wire.records import (
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointKind,
    CheckpointTriggered,
    JobStatus,
    SchedulerStopped,
)
from spark_tasks.kafka_source import barrier_of, entry_barrier
from spark_tasks.keyed import batch_id_known
from spark_tasks.sink import _offset_line

if TYPE_CHECKING:
    from spark_tasks.job import CheckpointedJob

__all__ = [
    "KAFKA_COLUMNS",
    "SINK_TASK",
    "ExactlyOnceKafkaSink",
    "OutputLost",
    "OutputStagedLate",
    "StagedBatches",
    "columns_problem",
    "output_record",
    "staged_late_problem",
    "task_snapshots",
]

log = logging.getLogger(__name__)

SINK_TASK = "driver"
"""The sink's one task: its output is written where ``foreachBatch`` runs."""
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "headers")
"""The columns of Spark's ``kafka`` format that the sink writes."""
FOLLOW_WAIT_S = 0.2


class OutputLost(RuntimeError):
    """The batches' half lost the rows it kept (Spark ran it afresh in the middle of a query)."""


class OutputStagedLate(RuntimeError):
    """Something in ``foreachBatch`` ran a barrier batch before the sink was called: the checkpoint's
    tasks acked before its output was staged. The output is staged (and committed once), the query
    fails: call the sink first."""


_SNAPSHOT = re.compile(r"\.a(?P<attempt>\d+)(?:-[^.]+)?\.cut-\d+")
"""A Spark task's snapshot (or keyed manifest, or piece) in a checkpoint's location:
``<task>.a<attempt>[-<run>].cut-<cut>[...]`` (:func:`spark_tasks.tasks.snapshot_name`)."""


def task_snapshots(names: Iterable[str], attempt: int) -> tuple[str, ...]:
    """The files among ``names`` (of a checkpoint's location) that tasks of ``attempt`` wrote at the
    barrier, before they acked: snapshots, keyed manifests and pieces. Pure."""
    return tuple(
        sorted(
            name
            for name in names
            if (found := _SNAPSHOT.search(name)) is not None and int(found["attempt"]) == attempt
        )
    )


def _kind(barrier: CheckpointBarrier) -> str:
    if barrier.stop:
        return "stop-with-savepoint" + (" --drain" if barrier.drain else "")
    return "savepoint" if barrier.kind is CheckpointKind.SAVEPOINT else "checkpoint"


def staged_late_problem(uid: str, barrier: CheckpointBarrier, snapshots: Sequence[str]) -> str | None:
    """Why staging the output before ``barrier``'s cut is too late, or None. Pure.

    Called first in ``foreachBatch``, the sink stages before the barrier batch runs: no task of the
    attempt has snapshotted for the barrier yet, whatever its kind (a periodic checkpoint, a
    savepoint, a stop-with-savepoint with or without ``--drain``: their tasks all snapshot and ack
    while the batch runs). ``snapshots`` (:func:`task_snapshots`) already in its location mean that
    something ran the batch first: the checkpoint may complete, and a driver that died then would
    lose the output of the input before the cut (the restore does not read it again)."""
    if not snapshots:
        return None
    shown = ", ".join(snapshots[:3]) + (", ..." if len(snapshots) > 3 else "")
    return (
        f"sink {uid}: the tasks of {_kind(barrier)} {barrier.checkpoint_id} snapshotted ({shown}) before "
        "the sink staged the output before its cut: something in foreachBatch ran the batch (an action "
        "such as collect(), count() or a write) before the sink. The output is staged and is committed "
        "once with the checkpoint; the query stops so that a driver that dies in that window cannot lose "
        "it. Call sink(batch_df, batch_id) first in foreachBatch, before anything else runs the batch "
        "(persist() the batch to use it again after)"
    )


def columns_problem(columns: Sequence[str], topic: str | None) -> str | None:
    """What is wrong with a DataFrame's columns for the sink, or None. Pure."""
    if "value" not in columns:
        return f"the DataFrame has no 'value' column (it has {list(columns)}): the kafka format needs one"
    if topic is None and "topic" not in columns:
        return "the DataFrame has no 'topic' column: add one or give the sink a topic"
    return None


def _bytes(value: Any, column: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"column {column!r} must be binary or string, got {type(value).__name__}")


def output_record(row: Mapping[str, Any], topic: str | None) -> OutputRecord:
    """One row of the ``kafka`` format's columns as a record to send (``topic``, if given, instead of
    the row's). Pure."""
    headers = tuple((str(h["key"]), _bytes(h["value"], "headers") or b"") for h in row.get("headers") or ())
    partition = row.get("partition")
    return OutputRecord(
        topic or str(row["topic"]),
        _bytes(row["value"], "value"),
        _bytes(row.get("key"), "key"),
        None if partition is None else int(partition),
        headers,
    )


def _binary_column(table: Any, name: str) -> list[bytes | None]:
    """Column ``name`` of an Arrow table as bytes (a string column encoded, as Spark's kafka sink does)."""
    import pyarrow as pa

    column = table.column(name)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    elif not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise TypeError(f"column {name!r} must be binary or string, got {column.type}")
    values: list[bytes | None] = column.to_pylist()
    return values


def output_columns(table: Any, topic: str | None) -> OutputColumns:
    """An Arrow table of the ``kafka`` format's columns (a batch's ``toArrow()``) as records to send
    (``topic``, if given, instead of the rows'): column by column, no Python object per row."""
    count, names = table.num_rows, set(table.column_names)
    topics = [topic] * count if topic else [str(t) for t in table.column("topic").to_pylist()]
    partitions = [ANY_PARTITION] * count
    if "partition" in names:
        partitions = [ANY_PARTITION if p is None else int(p) for p in table.column("partition").to_pylist()]
    headers: dict[int, tuple[tuple[str, bytes], ...]] = {}
    if "headers" in names:
        for index, found in enumerate(table.column("headers").to_pylist()):
            if found:
                headers[index] = tuple((str(h["key"]), h["value"] or b"") for h in found)
    keys = _binary_column(table, "key") if "key" in names else [None] * count
    return OutputColumns(topics, _binary_column(table, "value"), keys, partitions, headers)


class StagedBatches:
    """The ``foreachBatch`` half: keeps each batch's rows, stages them at the next barrier. Pickles."""

    def __init__(
        self,
        buffer: OutputBuffer,
        attempt: int,
        spark_checkpoint: Path,
        topic: str | None,
        batch_property: str | None,
        step: Step | None = None,
    ) -> None:
        self.buffer = buffer
        self.attempt = attempt
        self.spark_checkpoint = spark_checkpoint
        self.topic = topic
        self.batch_property = batch_property
        self.step = step
        self.next_batch = 0
        self.last_staged = 0

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        if batch_id != self.next_batch:
            raise OutputLost(
                f"sink {self.buffer.uid}: batch {batch_id} after {self.next_batch - 1}: the rows of the "
                "batches between are not kept here; the attempt must restart from its last checkpoint"
            )
        if batch_id == 0:
            problem = columns_problem(batch_df.columns, self.topic)
            if problem is not None:
                raise ValueError(f"sink {self.buffer.uid}: {problem}")
        staged = self._stage_at_barrier(batch_id)
        with batch_id_known(batch_df, batch_id, self.batch_property):
            table = batch_df.select(*[c for c in KAFKA_COLUMNS if c in batch_df.columns]).toArrow()
        rows = self.buffer.extend(output_columns(table, self.topic))
        self.next_batch = batch_id + 1
        if self.step is not None and staged:
            self.step("acked", self.last_staged)  # the barrier batch ran: its tasks acked
        elif self.step is not None and rows:
            self.step("buffered", self.last_staged)  # rows in memory only, for the next barrier

    def _stage_at_barrier(self, batch_id: int) -> bool:
        """Stage the rows of the batches before this one if a barrier of this attempt opens it (its
        cut is the batch's start, and its tasks ack while the batch runs); whether it did."""
        entry = barrier_of(_offset_line(self.spark_checkpoint, batch_id))
        if entry is None:
            return False
        barrier = entry_barrier(self.buffer.job_id, entry)
        if barrier.attempt != self.attempt or barrier.checkpoint_id <= self.last_staged:
            return False  # another attempt's, or sent again by a newer coordinator: its cut was earlier
        snapshots = task_snapshots(storage.list_names(barrier.location), self.attempt)
        self.buffer.stage(barrier)  # late or not: the output before the cut is on durable storage
        self.last_staged = barrier.checkpoint_id
        if self.step is not None:
            self.step("staged", barrier.checkpoint_id)
        problem = staged_late_problem(self.buffer.uid, barrier, snapshots)
        if problem is not None:
            raise OutputStagedLate(problem)
        return True


class ExactlyOnceKafkaSink:
    """A checkpointed job's exactly-once Kafka output (see the module docstring).

    Create it for each job attempt, after the :class:`~spark_tasks.job.CheckpointedJob` and before
    its query starts (it recovers first), and :meth:`close` it after the query ended: a stop
    savepoint's output is committed by then. (With :meth:`CheckpointedJob.run`, whose
    ``make_writer`` is called for every attempt, close the previous attempt's sink there: the new
    one fences its producer, but its journal consumer stays open until closed.) ``step`` is called
    at each step of a commit, after each staging (``staged``: before the barrier batch's tasks ack),
    after a barrier batch ran (``acked``) and after another batch's rows were kept (``buffered``):
    tests stop a driver there; ``recovery``
    replaces the recovery plan (tests only).
    """

    def __init__(
        self,
        job: CheckpointedJob,
        *,
        topic: str | None = None,
        uid: str = "kafka",
        transactional_id_prefix: str | None = None,
        producer_extra: Mapping[str, Any] | None = None,
        consumer_extra: Mapping[str, Any] | None = None,
        max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES,
        timeout: float = 30.0,
        step: Step | None = None,
        recovery: Callable[..., RecoveryPlan] | None = None,
    ) -> None:
        settings = job.settings
        if job.on_connector:
            raise ValueError(
                f"sink {uid} of job {settings.job_id}: the ExactlyOnceKafkaSink reads the barriers of the "
                "cutline-kafka source, and this job reads with Spark's own kafka connector: its output "
                "would never be staged. Run the job with source='cutline-kafka' (the default)"
            )
        self.job_id, self.attempt = settings.job_id, job.attempt
        self.committer = ExactlyOnceSink(
            settings.bootstrap,
            settings.job_id,
            SINK_TASK,
            job.topics,
            uid=uid,
            transactional_id_prefix=transactional_id_prefix,
            max_buffered_bytes=max_buffered_bytes,
            producer_extra=producer_extra,
            consumer_extra=consumer_extra,
            timeout=timeout,
            step=step,
        )
        self.transactional_id = self.committer.transactional_id
        # Follow the journal from its end now, before recovery reads it: no record falls between.
        self._feed = JobFeed(
            settings.bootstrap,
            settings.job_id,
            (job.topics.checkpoints,),
            claims_topic=job.topics.checkpoints,
            config=dict(consumer_extra or {}),
            timeout=timeout,
        )
        restored = job.restored
        # A job that restores nothing reads its input again: no staged output of before is due.
        self.recovered: Recovered = self.committer.recover(
            0 if restored is None else restored.checkpoint_id, plan=recovery
        )
        self.batches = StagedBatches(
            OutputBuffer(settings.job_id, uid, SINK_TASK, max_buffered_bytes),
            job.attempt,
            job.work_dir / "spark",
            topic,
            job.batch_property,
            step,
        )
        self._locations: dict[int, str] = {}
        self._waiting: CheckpointCompleted | None = None
        """A completion of the attempt whose own staged file was not there yet (the sink ran late)."""
        self.staged_late: list[int] = []
        """Checkpoints whose output was staged after the committer saw their completion."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.failure: BaseException | None = None
        """What ended the committer early (a newer driver's sink fenced it), if anything."""
        self._thread: threading.Thread | None = threading.Thread(
            target=self._follow, name=f"cutline-kafka-sink-{settings.job_id}", daemon=True
        )
        self._thread.start()

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        self.batches(batch_df, batch_id)

    def __getstate__(self) -> dict[str, Any]:
        """Spark Connect pickles the ``foreachBatch`` function: only its batches' half goes."""
        return {"batches": self.batches}

    @property
    def waiting_for(self) -> int | None:
        """The completed checkpoint whose staged file the committer waits for (the sink ran late), if any."""
        waiting = self._waiting
        return None if waiting is None else waiting.checkpoint_id

    @property
    def committed(self) -> list[int]:
        """Checkpoints whose output this attempt's sink committed (recovery's included), in order."""
        return list(self.committer.committed)

    # ------------------------------------------------------------ the committer

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                self.catch_up(FOLLOW_WAIT_S)
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.fatal() or error.code() == KafkaError._FENCED:
                    log.error(
                        "sink %s of job %s stops committing: %s", self.transactional_id, self.job_id, exc
                    )
                    self.failure = exc
                    return
                log.warning(
                    "sink %s of job %s: %s; it commits with the next completion",
                    self.transactional_id,
                    self.job_id,
                    exc,
                )

    def catch_up(self, wait: float = 0.0) -> int:
        """Act on the journal records that arrived (waiting up to ``wait`` s for the first): commit
        on a completion, delete on a cancel. The number of records."""
        with self._lock:
            entries = self._feed.poll(wait)
            for entry in entries:
                self._on_record(entry.record)
            if self._waiting is not None and self._staged(self._waiting.checkpoint_id):
                self._commit_through(self._waiting)
            return len(entries)

    def _on_record(self, record: object) -> None:
        if isinstance(record, CheckpointTriggered) and record.attempt == self.attempt:
            self._locations[record.checkpoint_id] = record.location
        elif isinstance(record, CheckpointCompleted) and record.attempt == self.attempt:
            if record.location:
                self._locations.setdefault(record.checkpoint_id, record.location)
            if self._staged(record.checkpoint_id):
                self._commit_through(record)
            else:  # staged late (the sink ran after its batch): it and the files before it wait for it
                self._waiting = record
        elif (
            isinstance(record, SchedulerStopped)
            and record.attempt == self.attempt
            and record.status is JobStatus.CANCELLING
        ):
            if self._waiting is not None and self._staged(self._waiting.checkpoint_id):
                self._commit_through(self._waiting)  # completed: a cancel deletes only what did not
            self.committer.abort(self._locations)

    def _staged(self, checkpoint_id: int) -> bool:
        """Whether the sink's file for ``checkpoint_id`` is staged (at an unknown location: as if)."""
        location = self._locations.get(checkpoint_id)
        return location is None or storage.exists(storage.join(location, staged_name(SINK_TASK)))

    def _commit_through(self, completed: CheckpointCompleted) -> None:
        """Commit the staged files up to ``completed`` (after the marker) in one transaction."""
        waited = self._waiting is not None and self._waiting.checkpoint_id == completed.checkpoint_id
        self.committer.commit_staged(completed, self._locations)
        self._locations = {k: v for k, v in self._locations.items() if k > completed.checkpoint_id}
        self._waiting = None
        if waited:
            self.staged_late.append(completed.checkpoint_id)
            log.error(
                "sink %s of job %s: checkpoint %d completed before its output was staged (the sink was "
                "called after something ran its batch); committed now. Call the sink first in foreachBatch",
                self.transactional_id,
                self.job_id,
                completed.checkpoint_id,
            )

    def close(self, settle: float = 1.0) -> None:
        """Stop committing, once the journal has been read to its end (a poll of ``settle`` s brings
        nothing): a stop savepoint's output is committed, a cancel's staged output deleted."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        try:
            if self.failure is None:
                while self.catch_up(settle):
                    pass
        finally:
            self._feed.close()
            self.committer.close()

    def __enter__(self) -> ExactlyOnceKafkaSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
