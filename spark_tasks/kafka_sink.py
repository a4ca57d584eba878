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
  a completed checkpoint's output is on durable storage;
- **the committer** (a thread in the driver): it follows the job's journal and, when a checkpoint
  of the attempt completes, commits the staged files up to it in one transaction with the commit
  marker; when the job is canceled it deletes what is staged and not completed. At start it
  recovers first (:meth:`~events.task.exactly_once.ExactlyOnceSink.recover`): it fences the
  transactional id and commits again what a dead driver's completed checkpoints staged.

The sink is one task, ``driver``: its transactional id is ``<prefix>-<job>-<uid>-driver``, the same
in every attempt and at any parallelism.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException

from events.kafka.feed import JobFeed
from events.task.exactly_once import (
    DEFAULT_MAX_BUFFERED_BYTES,
    ExactlyOnceSink,
    OutputBuffer,
    OutputRecord,
    Recovered,
    RecoveryPlan,
    Step,
)
from events.wire.records import CheckpointCompleted, CheckpointTriggered, JobStatus, SchedulerStopped
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
    "StagedBatches",
    "columns_problem",
    "output_record",
]

log = logging.getLogger(__name__)

SINK_TASK = "driver"
"""The sink's one task: its output is written where ``foreachBatch`` runs."""
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "headers")
"""The columns of Spark's ``kafka`` format that the sink writes."""
FOLLOW_WAIT_S = 0.2


class OutputLost(RuntimeError):
    """The batches' half lost the rows it kept (Spark ran it afresh in the middle of a query)."""


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
            rows = batch_df.select(*[c for c in KAFKA_COLUMNS if c in batch_df.columns]).collect()
        for row in rows:
            self.buffer.add(output_record(row.asDict(recursive=True), self.topic))
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
        self.buffer.stage(barrier)
        self.last_staged = barrier.checkpoint_id
        if self.step is not None:
            self.step("staged", barrier.checkpoint_id)
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
            return len(entries)

    def _on_record(self, record: object) -> None:
        if isinstance(record, CheckpointTriggered) and record.attempt == self.attempt:
            self._locations[record.checkpoint_id] = record.location
        elif isinstance(record, CheckpointCompleted) and record.attempt == self.attempt:
            if record.location:
                self._locations.setdefault(record.checkpoint_id, record.location)
            self.committer.commit_staged(record, self._locations)
            self._locations = {k: v for k, v in self._locations.items() if k > record.checkpoint_id}
        elif (
            isinstance(record, SchedulerStopped)
            and record.attempt == self.attempt
            and record.status is JobStatus.CANCELLING
        ):
            self.committer.abort(self._locations)

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
