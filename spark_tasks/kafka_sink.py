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
  the batches before it wrote into ``<location>/driver.<uid>.out``, before it runs, so before its tasks ack:
  a completed checkpoint's output is on durable storage. If the barrier's tasks have already
  snapshotted (something in ``foreachBatch`` ran the batch before the sink: :func:`staged_late_problem`),
  it stages all the same and fails the query with :class:`OutputStagedLate`;
- **the barrier of a batch** (:func:`batch_barrier`, pure) is the one thing the two sources differ
  in: ``cutline-kafka`` folds it into its own end offset; on Spark's ``kafka`` connector the
  ``cutline-barriers`` source's line of the batch holds it, and a stop-with-savepoint's cut is the
  batch's end there (docs/spark.md), so its own rows are staged too, after it ran and before it
  commits (the driver acks that cut only once the batch committed). On the connector the driver also
  acks a cut only once its output is staged (:meth:`ExactlyOnceKafkaSink.staged_for`, a gate of the
  job's ``CutFollower``): a per-partition job's driver snapshots its partitions at the cut as soon as
  Spark logs the batch, before ``foreachBatch`` runs;
- **the committer** (a thread in the driver): it follows the job's journal and, when a checkpoint
  of the attempt completes, commits the staged files up to it in one transaction with the commit
  marker (a completion whose own file is not staged yet waits for it); when the job is canceled it
  deletes what is staged and not completed. At start it recovers first
  (:meth:`~events.task.exactly_once.ExactlyOnceSink.recover`): it fences the transactional id and
  commits again what a dead driver's completed checkpoints staged.

The sink is one task, ``driver``: its transactional id is ``<prefix>-<job>-<uid>-driver``, the same
in every attempt and at any parallelism.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
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
from spark_tasks.barrier_source import is_barrier_offset
from spark_tasks.connector_cuts import parse_logged_batch
from spark_tasks.kafka_source import barrier_of, entry_barrier
from spark_tasks.keyed import batch_id_known

if TYPE_CHECKING:
    from spark_tasks.job import CheckpointedJob

__all__ = [
    "KAFKA_COLUMNS",
    "SINK_TASK",
    "BarrierBatch",
    "ExactlyOnceKafkaSink",
    "OutputLost",
    "OutputStagedLate",
    "StagedBatches",
    "batch_barrier",
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


@dataclass(frozen=True)
class BarrierBatch:
    """A micro-batch that a barrier opens: the barrier's entry, and where the checkpoint's cut is."""

    entry: Mapping[str, Any]
    """The barrier entry (:mod:`events.wire.barrier_entry`)."""
    cut_at_end: bool = False
    """The cut is the batch's end, not its start: the batch's own rows are output before it (a
    stop-with-savepoint on the connector, whose batch has the records that came)."""


def batch_barrier(
    batch_id: int, logged: str, previous: str | None, *, on_connector: bool
) -> BarrierBatch | None:
    """The barrier that batch ``batch_id`` of Spark's offset log opens, or None. Pure.

    ``logged`` is the batch's text in ``<checkpoint>/offsets`` and ``previous`` the batch before's
    (None for the query's first). On ``cutline-kafka`` (the query's one source) the barrier is in the
    source's end offset; on the connector it is in the ``cutline-barriers`` source's, whose end offset
    goes on carrying the last barrier into batches the Kafka source alone made run, so only a barrier
    it counts beyond ``previous``'s is new. A stop barrier's cut is a connector batch's end
    (:func:`~spark_tasks.connector_cuts.source_ack`). Raises ``ValueError`` on another offset log."""
    if on_connector:
        batch = parse_logged_batch(batch_id, logged).barriers
        before = 0 if previous is None else parse_logged_batch(batch_id - 1, previous).barriers.folded
        if batch.barrier is None or batch.folded <= before:
            return None
        return BarrierBatch(batch.barrier, cut_at_end=batch.stops)
    lines = logged.splitlines()
    # "v1", the batch metadata, then one line per source ("-" for a source without offsets)
    sources = [line for line in lines[2:] if line.strip() not in ("", "-") and not is_barrier_offset(line)]
    if len(lines) < 3 or len(sources) != 1:
        raise ValueError(
            f"batch {batch_id}: expected Spark's offset log with exactly one source (the job's "
            f"cutline-kafka), found {len(sources)}"
        )
    entry = barrier_of(sources[0])
    return None if entry is None else BarrierBatch(entry)


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
        *,
        on_connector: bool = False,
    ) -> None:
        self.buffer = buffer
        self.attempt = attempt
        self.spark_checkpoint = spark_checkpoint
        self.topic = topic
        self.batch_property = batch_property
        self.step = step
        self.on_connector = on_connector
        """The query reads with Spark's ``kafka`` connector (:func:`batch_barrier`)."""
        self.next_batch = 0
        self.last_staged = 0

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        if batch_id != self.next_batch:
            raise OutputLost(
                f"sink {self.buffer.uid}: batch {batch_id} after {self.next_batch - 1}: the rows of the "
                "batches between are not kept here; the attempt must restart from its last checkpoint"
            )
        columns = batch_df.columns  # a schema round trip to the JVM each time it is asked
        if batch_id == 0:
            problem = columns_problem(columns, self.topic)
            if problem is not None:
                raise ValueError(f"sink {self.buffer.uid}: {problem}")
        opened = self._opened_barrier(batch_id)
        barrier, cut_at_end = (None, False) if opened is None else opened
        # listed before the batch runs: a task's snapshot there already means something ran it first
        snapshots = (
            () if barrier is None else task_snapshots(storage.list_names(barrier.location), self.attempt)
        )
        if barrier is not None and not cut_at_end:
            self._stage(barrier, snapshots)  # the rows before the cut, before the batch's tasks ack
        with batch_id_known(batch_df, batch_id, self.batch_property):
            table = batch_df.select(*[c for c in KAFKA_COLUMNS if c in columns]).toArrow()
        rows = self.buffer.extend(output_columns(table, self.topic))
        if barrier is not None and cut_at_end:
            self._stage(barrier, snapshots)  # the batch's rows too, before it commits (then the cut's ack)
        self.next_batch = batch_id + 1
        if self.step is not None and barrier is not None:
            self.step("acked", self.last_staged)  # the barrier batch ran: its tasks acked
        elif self.step is not None and rows:
            self.step("buffered", self.last_staged)  # rows in memory only, for the next barrier

    def _opened_barrier(self, batch_id: int) -> tuple[CheckpointBarrier, bool] | None:
        """The barrier of this attempt that batch ``batch_id`` opens and that is not staged yet, and
        whether its cut is the batch's end; None if there is none (or another attempt's, or one a newer
        coordinator sent again: its cut was earlier)."""
        offsets = self.spark_checkpoint / "offsets"
        try:
            logged = (offsets / str(batch_id)).read_text()
            previous = (offsets / str(batch_id - 1)).read_text() if self.on_connector and batch_id else None
        except OSError as exc:
            raise RuntimeError(
                f"cannot read batch {batch_id}'s offsets in Spark's offset log: {exc}"
            ) from exc
        opened = batch_barrier(batch_id, logged, previous, on_connector=self.on_connector)
        if opened is None:
            return None
        barrier = entry_barrier(self.buffer.job_id, opened.entry)
        if barrier.attempt != self.attempt or barrier.checkpoint_id <= self.last_staged:
            return None
        return barrier, opened.cut_at_end

    def _stage(self, barrier: CheckpointBarrier, snapshots: Sequence[str]) -> None:
        """Stage the rows kept so far for ``barrier`` (late or not: the output before the cut goes
        on durable storage), then fail the query if its tasks had snapshotted first."""
        self.buffer.stage(barrier)
        self.last_staged = barrier.checkpoint_id
        if self.step is not None:
            self.step("staged", barrier.checkpoint_id)
        problem = staged_late_problem(self.buffer.uid, barrier, snapshots)
        if problem is not None:
            raise OutputStagedLate(problem)


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
            on_connector=job.on_connector,
        )
        if job.on_connector:  # the driver acks a cut only once the output before it is staged
            job.cut_gates.append(self.staged_for)
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

    def staged_for(self, entry: Mapping[str, Any]) -> bool:
        """Whether the output before the cut of the barrier ``entry`` is staged (another attempt's
        barrier: as if): the gate of the driver's acks on the connector."""
        barrier = entry_barrier(self.job_id, entry)
        if barrier.attempt != self.attempt:
            return True
        return storage.exists(storage.join(barrier.location, staged_name(SINK_TASK, self.committer.uid)))

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
        return location is None or storage.exists(
            storage.join(location, staged_name(SINK_TASK, self.committer.uid))
        )

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
