"""The participant library: plain Python Kafka apps take part in checkpoints
(docs/design.md, "Tasks and Spark").

A :class:`Participant` is one task. The app calls :meth:`Participant.poll` in its
loop, between records. When a barrier of its job and attempt arrives, the
participant takes the cut right then (``snapshot(barrier)`` and ``offsets()``,
so exactly the records processed so far), writes the snapshot atomically under
the barrier's location and acknowledges it, or declines. From the journal it
learns of completions (it commits the checkpoint's offsets of its partitions to
the consumer group, deletes the snapshots of checkpoints beyond ``retained``, writes a
completed savepoint's ``_metadata`` and calls ``on_complete``) and aborts (it deletes its
snapshot); a checkpoint's directory goes with the job's last snapshot in it.

A :class:`JobDriver` publishes the job's status and finds completed checkpoints
in the journal, to restore from; :func:`load_task_snapshot` reads a task's snapshot back and
checks its digest.

What a barrier makes a participant send is :func:`events.task.reply.answer`'s; what a journal record
makes it do (commit, discard, ignore) is its :class:`events.task.ledger.JobLedger`'s, the same as for a
Spark job's driver.

A participant sees barriers and journal events written after it started. Once it
listens it reports its task RUNNING, and the coordinator sends it again the barriers
of the checkpoints pending since before it started: a participant may start after
its driver reported the job RUNNING.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import quote, urlsplit

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from events.clock import now_ms
from events.extras import MissingExtra
from events.kafka.clients import (
    MissingTopics,
    commit_offsets,
    deliver,
    produce_record,
    producer_config,
    require_topics,
)
from events.kafka.feed import FeedRecord, FeedSubscription, JobFeed, SharedJobFeed, read_job_partition
from events.task import storage
from events.task.completion_metadata import MetadataUnavailable, resolve_completion
from events.task.latency import LatencyMarker, MarkerSchedule
from events.task.ledger import (
    FOLDED_RECORDS,
    Abort,
    Complete,
    Discard,
    Ignore,
    JobLedger,
    Stop,
    completion_problem,
)
from events.task.reply import Answer, Reply, Snapshotted, answer, failure, fits_inline
from events.task.scheduler_watch import UNSCHEDULED_WARNING_S, JournalScheduled, SchedulerWatch
from events.task.storage import UnsupportedLocation, local_path, write_atomic
from events.wire.codec import DecodeError, avro_decoder, decode, default_codec
from events.wire.metadata import (
    METADATA_FILE as METADATA_FILE,  # re-exported: its home before events.wire.metadata
)
from events.wire.records import (
    CheckpointAborted,
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointKind,
    CheckpointRequested,
    ExecutionState,
    JobCancelRequested,
    JobHeartbeat,
    JobStatus,
    JobStatusChanged,
    JobStopRequested,
    LatencyMeasured,
    Record,
    RestartStrategy,
    SchedulerStarted,
    StateHandle,
    TaskStatusChanged,
)
from events.wire.sizes import excerpt
from events.wire.topics import Topics
from events.wire.validation import job_directory_problem

__all__ = [
    "JobDriver",
    "PARTICIPANT_RECORDS",
    "MissingTopics",
    "Participant",
    "ParticipantStats",
    "SnapshotCorrupted",
    "UnsupportedLocation",
    "load_task_snapshot",
    "local_path",
    "require_topics",
    "shared_feed",
    "snapshot_uri",
    "valid_completions",
    "write_atomic",
]

log = logging.getLogger(__name__)

Snapshot = Callable[[CheckpointBarrier], bytes]
Offsets = Callable[[], Mapping[str, int]]
OnComplete = Callable[[CheckpointCompleted], None]
OnStop = Callable[[JobStatus, bool], None]
"""Called once when the job stops: with FINISHED after its stop savepoint completed, or CANCELED
after a cancel; and whether the stop drains (Flink's ``--drain``: the input ends at the cut)."""
_Request = TypeVar("_Request", CheckpointRequested, JobStopRequested, JobCancelRequested)

REMEMBERED_REPLIES = 64
"""How many recent acks/declines a participant keeps to answer re-sent barriers."""

SLOW_DELIVERY_S = 1.0
"""An ack or decline the broker acknowledged later than this after ``produce()`` is logged."""


# ------------------------------------------------------------ environment

RESTART_STRATEGY_ENV = "CUTLINE_RESTART_STRATEGY"
"""``cutline run`` hands the job's driver its restart strategy here: the JSON of a RestartStrategy."""


def with_restart_strategy_from_environment(config: CheckpointConfig) -> CheckpointConfig:
    """``config`` with the restart strategy ``cutline run`` set in the environment, if any."""
    text = os.environ.get(RESTART_STRATEGY_ENV)
    if not text:
        return config
    return dataclasses.replace(config, restart_strategy=avro_decoder(RestartStrategy)(json.loads(text)))


# ------------------------------------------------------------------- storage


class SnapshotCorrupted(ValueError):
    """A snapshot's bytes do not match the size or sha256 of its state handle."""


def snapshot_uri(location: str, name: str) -> str:
    """The URI of the snapshot file ``name`` in checkpoint ``location``: ``<location>/<name>``.

    A participant names its snapshot after its task id; a Spark task after its task, attempt, run
    and cut (:func:`spark_tasks.tasks.snapshot_name`). The name stays one file name: characters that
    could leave the directory (``/``) are percent-encoded in it.
    """
    if name in ("", ".", ".."):
        raise ValueError(f"{name!r} cannot name a snapshot file")
    quoted = quote(name, safe=":@=+,")
    scheme = urlsplit(location).scheme
    tail = quote(quoted, safe=":@=+,") if scheme else quoted
    return f"{location.rstrip('/')}/{tail}"


def load_task_snapshot(handle: StateHandle) -> bytes:
    """The bytes of a task's snapshot, after checking them against the handle's size and sha256:
    the handle's inline bytes when it has them, else the file at its URI.

    Raises :class:`SnapshotCorrupted` on a mismatch, :class:`UnsupportedLocation`
    for a URI it cannot read, and OSError if the file cannot be read.
    """
    data = handle.inline if handle.inline is not None else storage.read_bytes(handle.uri)
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != handle.size_bytes or digest != handle.sha256.lower():
        raise SnapshotCorrupted(
            f"snapshot {handle.uri} is corrupt: expected {handle.size_bytes} bytes with sha256 "
            f"{handle.sha256}, found {len(data)} bytes with sha256 {digest}"
        )
    return data


# ``METADATA_FILE`` (``_metadata``) is written into a completed checkpoint's or savepoint's location
# (by a Spark job's driver, or by the coordinator for a completion too large for one journal
# record: events/wire/metadata.py): its ``CheckpointCompleted``, so that the directory alone is enough to
# restore from or to inspect.


def savepoint_metadata_directory(decision: Complete, metadata_written: bool) -> str | None:
    """Where a participant writes the ``_metadata`` of a completion, or None: a savepoint's, into the
    directory its trigger named (:attr:`Complete.metadata`: the participant saw it triggered), unless
    the coordinator wrote it already (a completion journaled by reference). Checkpoints get none from
    a participant: the journal has them, and a restore reads them there. Pure."""
    if decision.completed.kind is not CheckpointKind.SAVEPOINT or metadata_written:
        return None
    return decision.metadata


def missing_state(completed: CheckpointCompleted) -> str | None:
    """Why ``completed``'s snapshot files are not all there at their sizes (the first missing one),
    or None. Inline state is in the record itself."""
    for task, handle in sorted(completed.handles.items()):
        if handle.inline is not None:
            continue
        try:
            size = storage.size(handle.uri)
        except (OSError, ValueError, MissingExtra) as exc:
            return f"the state of {task} ({handle.uri}) cannot be read here: {type(exc).__name__}: {exc}"
        if size != handle.size_bytes:
            return f"the state of {task} ({handle.uri}) is {size} bytes, not {handle.size_bytes}"
    return None


def leftover_metadata_only(names: Iterable[str]) -> bool:
    """Whether a discarded checkpoint's directory, listed as ``names`` after a task deleted its own
    snapshot, holds nothing but its ``_metadata``: the job's last snapshot of it is gone. Pure."""
    return set(names) == {METADATA_FILE}


class MetadataProblem(LookupError):
    """A directory holds no usable checkpoint ``_metadata``."""


def read_checkpoint_metadata(location: str | Path) -> CheckpointCompleted:
    """The ``CheckpointCompleted`` in a checkpoint or savepoint directory (path, ``file:`` URI or any
    storage URI: ``s3://…``); :class:`MetadataProblem` says why there is none."""
    directory = str(location).rstrip("/") or str(location)
    path = storage.join(directory, METADATA_FILE)
    try:
        record = decode(storage.read_bytes(path))
    except FileNotFoundError:
        raise MetadataProblem(
            f"{directory} has no {METADATA_FILE}: give the directory of a completed checkpoint or "
            "savepoint (…/chk-N or …/savepoint-N), written while its job was running"
        ) from None
    except DecodeError as exc:
        raise MetadataProblem(f"{path} is not a cutline checkpoint's metadata: {exc}") from exc
    if not isinstance(record, CheckpointCompleted):
        raise MetadataProblem(f"{path} holds a {type(record).__name__}, not a CheckpointCompleted")
    problem = completion_problem(record, frozenset())
    if problem is not None:
        raise MetadataProblem(f"{path} is not a usable checkpoint: {problem}")
    return record


def valid_completions(records: Iterable[Record]) -> list[CheckpointCompleted]:
    """The completions among a job's journal ``records``, in order, without those a reader must
    ignore (:func:`completion_problem`: a second completion of an id, malformed offsets), each
    logged once."""
    valid: list[CheckpointCompleted] = []
    seen: set[int] = set()
    for record in records:
        if not isinstance(record, CheckpointCompleted):
            continue
        problem = completion_problem(record, seen)
        if problem is not None:
            log.warning(
                "job %s: ignoring a completion of checkpoint %d in the journal: %s",
                excerpt(record.job_id),
                record.checkpoint_id,
                excerpt(problem),
            )
            continue
        seen.add(record.checkpoint_id)
        valid.append(record)
    return valid


# --------------------------------------------------------------- participant

PARTICIPANT_RECORDS = frozenset({CheckpointBarrier.__name__, *(kind.__name__ for kind in FOLDED_RECORDS)})
"""The records a participant acts on: barriers and what its ledger folds. Its feed leaves the rest of
the journal undecoded: 32 tasks' ``TaskAcknowledged`` are 32 of a checkpoint's 34 journal records, and
each one decoded (by each task's feed) and handed to each thread of a shared feed held the GIL the
tasks needed to snapshot and acknowledge (docs/benchmarks.md, "Latency under load")."""


def shared_feed(
    bootstrap: str,
    job_id: str,
    topics: Topics,
    *,
    config: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
) -> SharedJobFeed:
    """The one feed the participants of ``job_id`` in one process share (``Participant(feed=...)``):
    its barriers and journal from their ends now, fenced by the journal's claims, keeping only
    :data:`PARTICIPANT_RECORDS`. The caller closes it after its participants."""
    return SharedJobFeed(
        bootstrap,
        job_id,
        (topics.barriers, topics.checkpoints),
        claims_topic=topics.checkpoints,
        config=config,
        timeout=timeout,
        kinds=PARTICIPANT_RECORDS,
    )


@dataclass
class ParticipantStats:
    """What a participant did, by checkpoint id, in order."""

    acked: list[int] = field(default_factory=list)
    declined: list[int] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    resent: list[int] = field(default_factory=list)
    """Checkpoints whose ack or decline was sent again for a duplicate barrier."""
    ignored_barriers: int = 0
    """Barriers of this job for another attempt, or older than the last one handled."""
    void_barriers: int = 0
    """Barriers of this job written under a superseded coordinator epoch
    (docs/design.md, "Ownership and fencing")."""
    commit_failures: int = 0
    undecodable: int = 0
    ignored_records: int = 0
    """Journal records of this job ignored: malformed, or contradicting what the participant knows."""
    discarded: list[int] = field(default_factory=list)
    """Completed checkpoints whose snapshot this participant deleted: beyond ``retained``."""
    slowest_delivery_ms: int = 0
    """The longest an ack or decline took from ``produce()`` to the broker's acknowledgement."""
    metadata_written: list[int] = field(default_factory=list)
    """Completed savepoints whose ``_metadata`` this participant wrote."""


class Participant:
    """One task of a job: snapshots on barriers, acks or declines, commits on completion.

    It reads the job's partition of the barriers and journal topics with its own
    consumer (assigned, no group), from their end at construction. ``snapshot``
    and ``offsets`` are called from :meth:`poll`, in the app's thread (or in the
    thread of :meth:`run_in_thread`, where they must be thread-safe).
    ``offsets`` maps ``topic:partition`` to the next offset to read. Exceptions of
    ``snapshot`` and ``offsets`` during a checkpoint become a decline (so does an
    offsets key that :func:`~events.wire.validation.parse_offsets_key` refuses); an
    exception of ``on_complete`` propagates out of :meth:`poll` (after the commit).

    ``retained`` is how many completed checkpoints' snapshots the participant
    keeps (the job's ``CheckpointConfig.retained``); None takes it from the job's
    ``SchedulerStarted`` of this attempt in the journal (1 until it is seen).
    Snapshots of older completed checkpoints and of aborted ones are deleted;
    savepoints are never deleted once complete.

    The participants of one job in one process may share a ``feed``
    (:func:`shared_feed`, one consumer for all of them; the owner closes it)
    and a ``producer`` (librdkafka's is thread-safe; each participant flushes it on close but
    the owner keeps it): a barrier then reaches all of them after one fetch instead of one
    each, and their acks can leave in one request. ``consumer_extra`` and ``start_timeout``
    then do not apply (the shared feed has its own).
    """

    def __init__(
        self,
        bootstrap: str,
        job_id: str,
        task_id: str,
        attempt: int,
        topics: Topics,
        snapshot: Snapshot,
        offsets: Offsets,
        on_complete: OnComplete | None = None,
        commit_consumer: Consumer | None = None,
        *,
        start_timeout: float = 10.0,
        producer_extra: Mapping[str, Any] | None = None,
        consumer_extra: Mapping[str, Any] | None = None,
        retained: int | None = None,
        feed: SharedJobFeed | None = None,
        producer: Producer | None = None,
        on_stop: OnStop | None = None,
    ) -> None:
        if retained is not None and retained < 1:
            raise ValueError(f"retained must be at least 1, got {retained}")
        self.job_id = job_id
        self.task_id = task_id
        self.attempt = attempt
        self.topics = topics
        self.stats = ParticipantStats()
        self.error: BaseException | None = None
        """The exception that stopped :meth:`run_in_thread`'s thread, if any."""
        self._snapshot = snapshot
        self._offsets = offsets
        self._on_complete = on_complete
        self._on_stop = on_stop
        self.stopping: CheckpointBarrier | None = None
        """The stop-with-savepoint barrier this task acknowledged, until its savepoint completes or
        fails: meanwhile the app reads no more records, so that the cut stays the end of its input."""
        self.stopped: JobStatus | None = None
        """FINISHED once its stop savepoint completed, CANCELED once the job was canceled."""
        self._commit_consumer = commit_consumer
        self._last_id = 0
        self._last_epoch = 0
        self._replies: OrderedDict[int, Reply] = OrderedDict()
        self._files: dict[int, str] = {}
        """The snapshot this participant wrote for each checkpoint (checkpoint id -> URI), until discarded."""
        self.ledger = JobLedger(job_id, attempt, retained=retained)
        """What this participant makes of its job's journal: what to commit, keep and discard."""
        self._marker_schedules: dict[tuple[str, int], MarkerSchedule] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._producer = producer or Producer(producer_config(bootstrap, producer_extra))
        # Barriers and journal from their real ends; the journal's claims and every record's
        # epoch fence out a superseded coordinator's barriers and journal records
        # (docs/design.md, "Ownership and fencing").
        self._feed: JobFeed | FeedSubscription
        if feed is not None:
            if feed.job_id != job_id:
                raise ValueError(f"the shared feed follows job {feed.job_id!r}, not {job_id!r}")
            self._feed = feed.subscribe()
        else:
            self._feed = JobFeed(
                bootstrap,
                job_id,
                (topics.barriers, topics.checkpoints),
                claims_topic=topics.checkpoints,
                config=consumer_extra,
                timeout=start_timeout,
                kinds=PARTICIPANT_RECORDS,
            )
        log.debug("participant %s/%s starts after %s", self.job_id, self.task_id, self._feed.starts)
        # Listening now, the task says it runs: the coordinator sends it again the barriers of any
        # checkpoint pending since before it started (a task started after its job's RUNNING).
        running = TaskStatusChanged(job_id, task_id, attempt, ExecutionState.RUNNING, timestamp_ms=now_ms())
        produce_record(self._producer, topics.job_status, running, on_delivery=self._delivered)

    # -------------------------------------------------------------- loop

    def poll(self, timeout: float = 0.0) -> int:
        """Handle the barriers and journal events that have arrived; the number handled.

        Waits up to ``timeout`` s for the first one (0: never blocks).
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("participant is closed")
            handled = sum(self._handle(record) for record in self._feed.poll(timeout))
            self.stats.undecodable = self._feed.records.undecodable
            self.stats.void_barriers = self._feed.records.void[self.topics.barriers]
            self._producer.poll(0)
            return handled

    @property
    def retained(self) -> int:
        """Completed checkpoints whose snapshots are kept (see the class docstring)."""
        return self.ledger.retained

    def _handle(self, feed: FeedRecord) -> int:
        record = feed.record
        if feed.topic == self.topics.barriers:
            if isinstance(record, CheckpointBarrier):
                self._on_barrier(record, feed.epoch)
                return 1
            return 0
        if isinstance(record, CheckpointCompleted | CheckpointAborted):
            self._on_journal(record)
            return 1
        # Triggers, the scheduler's start (this attempt's config.retained, unless given) and stop.
        decision = self.ledger.fold(record)
        if isinstance(decision, Stop):
            self._stop_with(decision.status, drain=decision.drain)
        return 0

    # ---------------------------------------------------------- barriers

    def _on_barrier(self, barrier: CheckpointBarrier, epoch: int = 0) -> None:
        checkpoint_id = barrier.checkpoint_id
        if barrier.attempt != self.attempt:
            self.stats.ignored_barriers += 1
            log.info(
                "task %s ignores barrier %d of attempt %d (its attempt is %d)",
                self.task_id,
                checkpoint_id,
                barrier.attempt,
                self.attempt,
            )
            return
        if checkpoint_id in self.ledger.aborted_ids:  # its abort came first: a snapshot would stay behind
            self.stats.ignored_barriers += 1
            log.info("task %s ignores barrier %d: the journal aborted it", self.task_id, checkpoint_id)
            return
        previous = self._replies.get(checkpoint_id)
        if previous is not None:  # a re-sent barrier: answer the same, never snapshot twice
            self.stats.resent.append(checkpoint_id)
            self._send(Answer(previous, epoch))
            return
        # A newer coordinator epoch may trigger ids a superseded one (a zombie) already used.
        if checkpoint_id <= self._last_id and epoch <= self._last_epoch:
            self.stats.ignored_barriers += 1
            log.info("task %s ignores stale barrier %d (last %d)", self.task_id, checkpoint_id, self._last_id)
            return
        self._last_id, self._last_epoch = checkpoint_id, epoch
        reply = self._checkpoint(barrier, epoch)
        self._replies[checkpoint_id] = reply.reply
        while len(self._replies) > REMEMBERED_REPLIES:
            self._replies.popitem(last=False)
        if isinstance(reply.reply, CheckpointAcknowledged):
            self.stats.acked.append(checkpoint_id)
            if barrier.stop:
                self.stopping = barrier
        else:
            self.stats.declined.append(checkpoint_id)
        self._send(reply)

    def _checkpoint(self, barrier: CheckpointBarrier, epoch: int) -> Answer:
        """Take the cut and write it; the answer to the barrier (an ack, or the decline saying why not).

        A snapshot written for a checkpoint that is declined all the same is deleted on its abort."""
        started = time.perf_counter()
        try:
            data = self._snapshot(barrier)
            offsets = {str(key): int(value) for key, value in self._offsets().items()}
            if not isinstance(data, bytes | bytearray | memoryview):
                raise TypeError(f"snapshot() returned {type(data).__name__}, not bytes")
            data = bytes(data)
            snapshotted = time.perf_counter()
            uri = snapshot_uri(barrier.location, self.task_id)
            inline = fits_inline(data, barrier)
            if not inline:
                storage.write_bytes(uri, data)
                self._files[barrier.checkpoint_id] = uri
            written = time.perf_counter()
        except Exception as exc:
            log.warning("task %s declines checkpoint %d: %r", self.task_id, barrier.checkpoint_id, exc)
            return answer(barrier, epoch, self.task_id, failure(exc), now_ms())
        metrics = {
            "snapshot_ms": round((snapshotted - started) * 1000),
            "write_ms": round((written - snapshotted) * 1000),
            "bytes": len(data),
            "inline_bytes": len(data) if inline else 0,
        }
        snapshot = Snapshotted(uri, data, offsets, metrics, inline=inline)
        return answer(barrier, epoch, self.task_id, snapshot, now_ms())

    def _send(self, reply: Answer) -> None:
        """Send ``reply``, naming the coordinator epoch of the barrier it answers (the coordinator
        refuses answers to a superseded coordinator's barriers)."""
        produce_record(
            self._producer,
            reply.topic(self.topics),
            reply.reply,
            on_delivery=self._delivered,
            headers=reply.headers,
        )

    def _delivered(self, error: KafkaError | None, msg: Message) -> None:
        if error is not None:
            log.error("task %s could not send to %s: %s", self.task_id, msg.topic(), error)
            return
        latency = msg.latency()  # seconds from produce() to the broker's acknowledgement
        if latency is not None:
            self.stats.slowest_delivery_ms = max(self.stats.slowest_delivery_ms, round(latency * 1000))
            if latency > SLOW_DELIVERY_S:
                log.warning(
                    "task %s: the broker acknowledged its %s %.1f s after it was produced",
                    self.task_id,
                    msg.topic(),
                    latency,
                )

    # ----------------------------------------------------------- journal

    def _ignore(self, record: CheckpointCompleted | CheckpointAborted, why: str) -> None:
        self.stats.ignored_records += 1
        log.warning(
            "task %s/%s ignores %s of checkpoint %d: %s",
            self.job_id,
            self.task_id,
            type(record).__name__,
            record.checkpoint_id,
            excerpt(why),
        )

    def _on_journal(self, record: CheckpointCompleted | CheckpointAborted) -> None:
        """Carry out what the ledger decides on a completion or an abort."""
        by_reference = isinstance(record, CheckpointCompleted) and record.by_reference
        if isinstance(record, CheckpointCompleted) and record.by_reference and record.attempt == self.attempt:
            try:  # its handles and offsets are in its metadata object (docs/design.md, "Record sizes")
                record = resolve_completion(record)
            except MetadataUnavailable as exc:
                self._ignore(record, str(exc))
                return
        decision = self.ledger.fold(record)
        if isinstance(decision, Ignore):
            self._ignore(record, decision.reason)
        elif isinstance(decision, Complete):
            self._on_completed(decision, metadata_written=by_reference)
        elif isinstance(decision, Abort):
            self._on_aborted(decision)
        elif isinstance(record, CheckpointCompleted):  # another attempt's
            log.info(
                "task %s/%s: checkpoint %d completed for attempt %d (this is attempt %d): not committed",
                self.job_id,
                self.task_id,
                record.checkpoint_id,
                record.attempt,
                self.attempt,
            )

    def _on_completed(self, decision: Complete, *, metadata_written: bool = False) -> None:
        """Commit, write a savepoint's ``_metadata`` (unless the coordinator wrote it:
        ``metadata_written``), discard, tell the app, and stop after a stop savepoint."""
        completed = decision.completed
        self.stats.completed.append(completed.checkpoint_id)
        self._commit(completed.checkpoint_id, decision.commit)
        directory = savepoint_metadata_directory(decision, metadata_written)
        if directory is not None:
            self._write_metadata(directory, completed)
        for discard in decision.discard:
            if self._discard(discard):
                self.stats.discarded.append(discard.checkpoint_id)
        if self._on_complete is not None:
            self._on_complete(completed)
        if decision.stop is not None:
            self._stop_with(decision.stop.status, drain=decision.stop.drain)

    def _write_metadata(self, directory: str, completed: CheckpointCompleted) -> None:
        """The savepoint's ``_metadata`` beside the snapshots it names, once every snapshot file is
        there at its size (the job's tasks write the same bytes; the last rename wins)."""
        problem = missing_state(completed)
        if problem is not None:
            log.warning(
                "task %s writes no %s for savepoint %d in %s: %s",
                self.task_id,
                METADATA_FILE,
                completed.checkpoint_id,
                directory,
                problem,
            )
            return
        try:
            storage.write_bytes(storage.join(directory, METADATA_FILE), default_codec().encode(completed))
        except (OSError, ValueError, MissingExtra) as exc:
            log.warning(
                "task %s could not write %s of savepoint %d: %s",
                self.task_id,
                METADATA_FILE,
                completed.checkpoint_id,
                exc,
            )
            return
        self.stats.metadata_written.append(completed.checkpoint_id)

    def _stop_with(self, status: JobStatus, *, drain: bool) -> None:
        """The job stops (its stop savepoint completed, or it was canceled): tell the app, once."""
        if self.stopped is not None:
            return
        self.stopped, self.stopping = status, None
        log.info("task %s/%s: the job stops (%s)", self.job_id, self.task_id, status)
        if self._on_stop is not None:
            self._on_stop(status, drain)

    def _commit(self, checkpoint_id: int, commit: tuple[tuple[str, int, int], ...]) -> None:
        """Commit the completed checkpoint's offsets of this task's partitions to the group."""
        if self._commit_consumer is None or not commit:
            return
        own = set(self._offsets())
        reply = self._replies.get(checkpoint_id)
        if isinstance(reply, CheckpointAcknowledged):
            own.update(reply.offsets)
        offsets = [TopicPartition(t, p, offset) for t, p, offset in commit if f"{t}:{p}" in own]
        if not offsets:
            return
        problem = commit_offsets(self._commit_consumer, offsets)
        if problem is not None:
            self.stats.commit_failures += 1
            log.warning("task %s could not commit checkpoint %d: %s", self.task_id, checkpoint_id, problem)
            return
        self.stats.committed.append(checkpoint_id)

    def _discard(self, discard: Discard, *, completed: bool = True) -> bool:
        """Delete this participant's own snapshot of the checkpoint, if it wrote one; did it?

        Then its directory, once nothing is left in it: the job's tasks share it and the last to
        discard removes it. A completed checkpoint's ``_metadata`` (the coordinator's, for a completion
        too large for the journal) goes with the last snapshot; nothing else of another writer does."""
        uri = self._files.pop(discard.checkpoint_id, None)
        if uri is None:
            return False
        directory = uri.rsplit("/", 1)[0]  # snapshot_uri: the location, then one file name
        try:
            storage.delete(uri)
            if completed and leftover_metadata_only(storage.list_names(directory)):
                storage.delete(storage.join(directory, METADATA_FILE))
            storage.remove_empty_directory(directory)
        except (OSError, MissingExtra) as exc:
            log.warning("task %s could not discard %s: %s", self.task_id, uri, exc)
        return True

    def _on_aborted(self, decision: Abort) -> None:
        checkpoint_id = decision.aborted.checkpoint_id
        if self.stopping is not None and self.stopping.checkpoint_id == checkpoint_id:
            self.stopping = None  # the stop savepoint failed: the job keeps running
        self._replies.pop(checkpoint_id, None)  # a barrier re-sent for it now counts as stale
        if decision.discard is not None and self._discard(decision.discard, completed=False):
            self.stats.aborted.append(checkpoint_id)

    # --------------------------------------------------- latency markers

    def latency_marker(self, source_id: str, subtask_index: int, interval_ms: int) -> LatencyMarker | None:
        """A latency marker of this source subtask when one is due (every ``interval_ms``, Flink's
        ``LatencyMarksEmitter``; 0: never), else None. The app sends it in-band, as its own record or
        in a record's headers (:meth:`LatencyMarker.header`), and never hands it to user code."""
        key = (source_id, subtask_index)
        schedule = self._marker_schedules.get(key) or MarkerSchedule(interval_ms)
        now = now_ms()
        if not schedule.due(now):
            return None
        self._marker_schedules[key] = schedule.emitted(now)
        return LatencyMarker(now, source_id, subtask_index)

    def mark_latency(self, marker: LatencyMarker, operator_id: str, subtask_index: int) -> LatencyMeasured:
        """``marker`` reached subtask ``subtask_index`` of ``operator_id`` now: send the measurement
        to the coordinator (the acks topic, without waiting), which folds it into the job's latency
        histograms (docs/usage.md, "Latency markers")."""
        measured = marker.measured(self.job_id, self.attempt, operator_id, subtask_index, now_ms())
        produce_record(self._producer, self.topics.acks, measured, on_delivery=self._delivered)
        return measured

    # --------------------------------------------------------- lifecycle

    def run_in_thread(self, interval: float = 0.1) -> threading.Thread:
        """Poll in a daemon thread until :meth:`close`; ``snapshot`` and ``offsets`` must be thread-safe.

        ``interval`` is the longest one look waits for a record. A barrier or a journal record ends
        the wait at once, so it bounds only how soon :meth:`close` stops the thread; a short one
        wakes an idle task's thread more often for nothing. An exception stops the thread and is
        kept in :attr:`error`.
        """
        if self._thread is not None:
            raise RuntimeError("participant already runs in a thread")

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.poll(interval)
                except BaseException as exc:
                    self.error = exc
                    log.exception("participant %s/%s stopped", self.job_id, self.task_id)
                    return

        self._thread = threading.Thread(target=loop, name=f"participant-{self.task_id}", daemon=True)
        self._thread.start()
        return self._thread

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread, deliver pending acks (up to ``timeout`` s) and close the clients; idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._lock:
            if self._closed:
                return
            self._closed = True
            remaining = self._producer.flush(timeout)
            if remaining:
                log.warning(
                    "participant %s/%s closed with %d unsent messages", self.job_id, self.task_id, remaining
                )
            self._feed.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ---------------------------------------------------------------- job driver


class JobDriver:
    """Publishes a job's status and reads its completed checkpoints from the journal.

    An attempt no coordinator runs ``unscheduled_warning_s`` after its RUNNING (no ``SchedulerStarted``
    in the journal: none runs on the topic prefix, say) gets a warning saying what to check, and a
    note when it is run after all (:mod:`events.task.scheduler_watch`; None: no watch)."""

    def __init__(
        self,
        bootstrap: str,
        job_id: str,
        topics: Topics,
        *,
        timeout: float = 10.0,
        producer_extra: Mapping[str, Any] | None = None,
        unscheduled_warning_s: float | None = UNSCHEDULED_WARNING_S,
    ) -> None:
        self.bootstrap = bootstrap
        self.job_id = job_id
        self.topics = topics
        self.timeout = timeout
        self.unscheduled_warning_s = unscheduled_warning_s
        self.attempt = 0
        """The attempt of the last RUNNING this driver published."""
        self._producer = Producer(producer_config(bootstrap, producer_extra))
        self._heartbeats: threading.Event | None = None
        """Set to stop the heartbeat thread of the running attempt."""
        self._watch: tuple[SchedulerWatch, threading.Event] | None = None
        """The running attempt's watch for its ``SchedulerStarted`` and the event that stops its
        journal reads."""

    def running(
        self,
        tasks: Sequence[str],
        config: CheckpointConfig,
        attempt: int,
        restored_checkpoint_id: int | None = None,
        restored_location: str | None = None,
        *,
        heartbeats: bool = True,
    ) -> JobStatusChanged:
        """Publish RUNNING with the tasks that must acknowledge every checkpoint; returns the event.

        Then sends a ``JobHeartbeat`` every ``config.heartbeat_interval_ms`` from a daemon thread
        until another status or :meth:`close` (``heartbeats=False``: never; the coordinator then
        does not watch this attempt). Under ``cutline run`` the restart strategy it was given
        (``CUTLINE_RESTART_STRATEGY``) replaces ``config.restart_strategy``.
        """
        problem = job_directory_problem(self.job_id, config.location)
        if problem is not None:  # the coordinator would dead-letter it, and the job never run
            raise ValueError(f"job {excerpt(self.job_id)!r} cannot run: {problem}")
        self._stop_heartbeats()
        self._stop_scheduler_watch()
        config = with_restart_strategy_from_environment(config)
        self.attempt = attempt
        event = JobStatusChanged(
            job_id=self.job_id,
            status=JobStatus.RUNNING,
            timestamp_ms=now_ms(),
            attempt=attempt,
            tasks=tuple(tasks),
            config=config,
            restored_checkpoint_id=restored_checkpoint_id,
            restored_location=restored_location,
        )
        self._publish(self.topics.job_status, event)
        if heartbeats:
            self._start_heartbeats(attempt, config.heartbeat_interval_ms)
        if self.unscheduled_warning_s is not None:
            self._watch_scheduler(attempt, self.unscheduled_warning_s)
        return event

    def _watch_scheduler(self, attempt: int, after_s: float) -> None:
        stopped = threading.Event()

        def run_in_journal() -> bool:
            found = self.journal((SchedulerStarted,))
            return any(isinstance(r, SchedulerStarted) and r.attempt == attempt for r in found)

        scheduled = JournalScheduled(run_in_journal, stopped)
        watch = SchedulerWatch(
            scheduled, self.job_id, attempt, self.topics.prefix, self.bootstrap, after_s=after_s
        )
        self._watch = watch.start(), stopped

    def _stop_scheduler_watch(self) -> None:
        if self._watch is not None:
            watch, stopped = self._watch
            watch.close()
            stopped.set()
            self._watch = None

    def heartbeat(self, attempt: int | None = None) -> JobHeartbeat:
        """Send one ``JobHeartbeat`` of ``attempt`` (default: the running one) without waiting."""
        beat = JobHeartbeat(self.job_id, self.attempt if attempt is None else attempt, now_ms())
        produce_record(self._producer, self.topics.job_status, beat, on_delivery=self._heartbeat_delivered)
        return beat

    def _heartbeat_delivered(self, error: KafkaError | None, msg: Message) -> None:
        if error is not None:
            log.warning("job %s: a heartbeat was not delivered: %s", self.job_id, error)

    def _start_heartbeats(self, attempt: int, interval_ms: int) -> None:
        stop = self._heartbeats = threading.Event()

        def beat() -> None:
            while not stop.is_set():
                try:
                    self.heartbeat(attempt)
                except Exception:  # a full queue or a closed producer: the next beat tries again
                    log.exception("job %s: heartbeat", self.job_id)
                stop.wait(interval_ms / 1000)

        threading.Thread(target=beat, name=f"cutline-heartbeat-{self.job_id}", daemon=True).start()

    def _stop_heartbeats(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.set()
            self._heartbeats = None

    def status(
        self, status: JobStatus, error: str | None = None, attempt: int | None = None
    ) -> JobStatusChanged:
        """Publish another status (FAILED, CANCELED, FINISHED, ...) of the current attempt; its
        heartbeats and its scheduler watch stop."""
        self._stop_heartbeats()
        self._stop_scheduler_watch()
        event = JobStatusChanged(
            job_id=self.job_id,
            status=status,
            timestamp_ms=now_ms(),
            attempt=self.attempt if attempt is None else attempt,
            error=error,
        )
        self._publish(self.topics.job_status, event)
        return event

    def task_status(
        self, task_id: str, status: ExecutionState, error: str | None = None
    ) -> TaskStatusChanged:
        """Publish one task's execution state (FAILED aborts what it has not acknowledged)."""
        event = TaskStatusChanged(
            job_id=self.job_id,
            task_id=task_id,
            attempt=self.attempt,
            status=status,
            timestamp_ms=now_ms(),
            error=error,
        )
        self._publish(self.topics.job_status, event)
        return event

    def request(self, request: _Request) -> _Request:
        """Ask the coordinator for a manual checkpoint or a savepoint of this job, or to stop
        (with a savepoint) or cancel it."""
        self._publish(self.topics.requests, request)
        return request

    def _publish(self, topic: str, record: Record) -> None:
        """Produce ``record`` and wait until the broker has it."""
        deliver(self._producer, topic, record, self.timeout)

    def journal(self, kinds: tuple[type[Record], ...], timeout: float | None = None) -> list[Record]:
        """This job's journal events of the given types, in journal order.

        Reads the job's journal partition from the beginning to its end, with the fencing rule
        (records of a superseded coordinator epoch are left out, docs/design.md, "Ownership and fencing");
        only frames
        of those types are decoded.
        """
        found = read_job_partition(
            self.bootstrap,
            self.job_id,
            self.topics.checkpoints,
            claims_topic=self.topics.checkpoints,
            kinds={kind.__name__ for kind in kinds},
            timeout=self.timeout if timeout is None else timeout,
        )
        return [r.record for r in found if isinstance(r.record, kinds)]

    def completions(self, timeout: float | None = None) -> list[CheckpointCompleted]:
        """Every CheckpointCompleted of this job in the journal, in journal order.

        A second completion of an id and a completion with malformed offsets are
        left out, with a log line: a restore must not pick them.
        """
        return valid_completions(self.journal((CheckpointCompleted,), timeout))

    def latest_completed(
        self, timeout: float | None = None, kind: CheckpointKind | None = CheckpointKind.CHECKPOINT
    ) -> CheckpointCompleted | None:
        """The completed checkpoint with the highest id (of ``kind``; None: any), to restore from,
        with its handles and offsets (read from its metadata object when it was journaled by
        reference: :class:`events.wire.metadata.MetadataUnavailable` when that cannot be read)."""
        candidates = [c for c in self.completions(timeout) if kind is None or c.kind == kind]
        latest = max(candidates, key=lambda c: c.checkpoint_id, default=None)
        return None if latest is None else resolve_completion(latest)

    def completed_checkpoint(
        self, checkpoint_id: int, timeout: float | None = None
    ) -> CheckpointCompleted | None:
        """The completion of checkpoint (or savepoint) ``checkpoint_id``, if the journal has it, with
        its handles and offsets (as :meth:`latest_completed`)."""
        for completed in self.completions(timeout):
            if completed.checkpoint_id == checkpoint_id:
                return resolve_completion(completed)
        return None

    def close(self, timeout: float = 5.0) -> None:
        """Stop the heartbeats and the scheduler watch, and deliver what is still queued."""
        self._stop_heartbeats()
        self._stop_scheduler_watch()
        self._producer.flush(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
