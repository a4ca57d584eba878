"""The coordinator's shell logic without the transport: bytes in, messages out.

``Coordinator`` turns one input message (topic, partition, offset, key, value)
into the messages the service must publish, in order: journal events first,
then barriers, then dead letters. It owns the per-job states (always equal to
folding the journal), the checkpoint statistics, and the input positions the
journal already reflects, so a restarted service skips inputs it has already
decided (the journal is written before input offsets are committed; after a
crash in between, the input comes again and is recognised by its position).

The Faust app (:mod:`coordinator.service.app`) is a thin loop around this class; the
tests and the benchmarks drive it directly too.

Epochs (docs/design.md, "Ownership and fencing"): the caller says under which claim epoch it decides; every
journal record and barrier it gets back carries that epoch in the
``cutline.epoch`` header. The runtime remembers the epoch of each pending
checkpoint's trigger, so an ack or decline that answers a barrier of an older,
superseded epoch (a zombie's) is refused with ``STALE_EPOCH`` instead of counting,
and one whose epoch header is doubled or malformed (void, as every reader reads it:
:func:`events.wire.fencing.header_epoch`) with VOID_EPOCH.

Bad input is never fatal (docs/design.md, "The checkpoint decider"): every input is decided inside its own
guard.
Whatever goes wrong for one message (it cannot be decoded, the decider refuses
it, or decoding, deciding or encoding raises) ends in one dead letter with the
reason; the per-job state stays what it was before that message, and the rest
of the batch is decided as usual. Ticks are guarded the same way.

Two checks need the file system, so they live here rather than in the pure
decider, and run after ``decide`` and before anything is stored: a ``file:``
state handle must still be inside its checkpoint location once symbolic links
below the operator's root are resolved (:func:`_linked_out`), and a ``file:``
savepoint's location inside its savepoint root (``realpath``). A refusal is a
dead letter (``STATE_OUTSIDE_LOCATION``, ``SAVEPOINT_TARGET_NOT_ALLOWED``) and
nothing is journaled, so replaying the journal still reproduces the state.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, cast

from coordinator.admission import journal_budget, preview, too_large
from coordinator.commands import (
    AcknowledgeCheckpoint,
    CancelJob,
    ChangeJobStatus,
    ChangeTaskStatus,
    Command,
    DeclineCheckpoint,
    RecordHeartbeat,
    RequestCheckpoint,
    StopJob,
    Tick,
)
from coordinator.decider import (
    Decision,
    InputRejected,
    Rejection,
    barriers_owed,
    decide_steps,
    due_at,
    evolve,
    savepoint_roots,
)
from coordinator.service.file_view import SCAN_AFTER, BatchFileView, is_link
from coordinator.service.throttled_log import ThrottledLog
from coordinator.snapshot import PartitionSnapshot, trigger_key
from coordinator.state import JobState, initial_state
from coordinator.stats import CheckpointStats, track, with_progress
from events.kafka.clients import job_key, partition_for
from events.task.latency import (
    MAX_HISTOGRAMS,
    Granularity,
    LatencyHistograms,
    measurement_problem,
    record_latency,
)
from events.wire.codec import Codec, DecodeError, default_codec
from events.wire.codegen import fast_init
from events.wire.fencing import VOID_EPOCH, epoch_header, epoch_problem, header_epoch
from events.wire.metadata import metadata_uri, write_completion_metadata
from events.wire.records import (
    CheckpointAborted,
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointDeclined,
    CheckpointKind,
    CheckpointRequested,
    CheckpointTriggered,
    DeadLetter,
    ExecutionState,
    InputRecord,
    JobCancelRequested,
    JobHeartbeat,
    JobStatusChanged,
    JobStopRequested,
    JournalEvent,
    LatencyMeasured,
    Record,
    TaskAcknowledged,
    TaskStatusChanged,
)
from events.wire.sizes import TopicLimits, bounded, excerpt, record_size
from events.wire.topics import Topics
from events.wire.validation import InvalidUri, StorageUri, parse_below, parse_uri
from events.wire.vocabulary import CAUSE_HEADER, DeadLetterReason

log = logging.getLogger("cutline.coordinator")

MAX_REMEMBERED_HOMES = 100_000
"""Job ids whose partition :meth:`Coordinator.partition_of` remembers (then it starts again)."""

ACCEPTED: Mapping[str, tuple[type[Record], ...]] = {
    "job_status": (JobStatusChanged, TaskStatusChanged, JobHeartbeat),
    "requests": (CheckpointRequested, JobStopRequested, JobCancelRequested),
    "acks": (CheckpointAcknowledged, LatencyMeasured),
    "declines": (CheckpointDeclined,),
}
"""Which records each input topic may carry."""

MAX_DEAD_LETTER_VALUE = 512 * 1024
"""A dead letter keeps at most this many bytes of the input's value (and says so), so that it
still fits in a Kafka message next to the key and the reason."""


@fast_init
@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish."""

    topic: str
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(slots=True)
class Outcome:
    """What one input led to."""

    job_id: str | None = None
    journal: list[JournalEvent] = field(default_factory=list)
    messages: list[Outgoing] = field(default_factory=list)
    rejected: InputRejected | None = None

    @property
    def has_barriers(self) -> bool:
        """Barriers go out only after the journal holds their trigger durably."""
        return any(isinstance(e, CheckpointTriggered) for e in self.journal)


def parse_cause(value: bytes | str | None) -> tuple[str, int, int] | None:
    """``topic:partition:offset`` back into its parts (None when absent or malformed)."""
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    topic, _, rest = text.rpartition(":")
    topic, _, partition = topic.rpartition(":")
    try:
        return topic, int(partition), int(rest)
    except ValueError:
        return None


class Coordinator:
    """Decides every input and keeps what the journal says.

    ``now_ms`` always comes from the caller (the service's clock); ``rng`` only
    draws the first-trigger jitter, which the journal then records.
    """

    def __init__(
        self,
        topics: Topics,
        codec: Codec | None = None,
        rng: random.Random | None = None,
        partitions: int | None = None,
        *,
        savepoint_roots: tuple[str, ...] = (),
        limits: TopicLimits | None = None,
        latency_granularity: Granularity = Granularity.OPERATOR,
    ) -> None:
        for root in savepoint_roots:
            parse_uri(root)  # InvalidUri (a ValueError) at start-up, not at the first request
        self.topics = topics
        self.codec = codec or default_codec()
        self.rng = rng or random.Random()
        self.partitions = partitions
        """Partition count of the protocol topics (for :meth:`partition_of`); None: not known."""
        self.savepoint_roots = savepoint_roots
        self.limits = limits or TopicLimits()
        """The ``max.message.bytes`` of the topics this coordinator writes to
        (docs/design.md, "Record sizes"):
        no decision whose records would not fit is admitted."""
        self.states: dict[str, JobState] = {}
        self.stats: dict[str, CheckpointStats] = {}
        self.positions: dict[tuple[str, int], int] = {}
        self.trigger_epochs: dict[tuple[str, int], int] = {}
        """(job, checkpoint id) of each pending checkpoint -> the epoch its trigger was journaled in."""
        self._kinds = {getattr(topics, name): kinds for name, kinds in ACCEPTED.items()}
        self.inputs_decided: Counter[str] = Counter()
        """Input messages handled (decided or dead-lettered), by topic: for metrics."""
        self.dead_letters: Counter[str] = Counter()
        """Dead letters made, by reason: for metrics."""
        self.dead_letter_log = ThrottledLog(log, "dead letters")
        """One log line per dead-letter reason per 10 s, then how many it stood for (a flood of
        hostile input must not flood the log: every letter is on its topic and in the metrics)."""
        self._files: BatchFileView | None = None
        """The file system as seen by the batch being decided (:meth:`batch`); None: ask it per ack."""
        self._due_at: dict[str, int | None] = {}
        """job -> ``due_at`` of its current state, where known: see :meth:`due`. Every change of
        a state goes through :meth:`_set_state`, which forgets it unless the change keeps it."""
        self._homes: dict[str, int] = {}
        """job -> :meth:`partition_of` (murmur2 in Python costs microseconds; every input asks)."""
        self.latency_granularity = latency_granularity
        self.latency: dict[str, LatencyHistograms] = {}
        """job -> its latency histograms (:mod:`events.task.latency`): metrics, never journaled, so a
        worker that takes a job over starts them afresh (as Flink's on a restart)."""
        self.latency_log = ThrottledLog(log, "latency measurements dropped")
        """One line per job per 10 s about measurements past its histogram bound, then their count."""

    @contextlib.contextmanager
    def batch(self, scan_after: int = SCAN_AFTER) -> Iterator[BatchFileView]:
        """Decide the inputs handled inside this block as one batch: the symbolic-link check asks
        one :class:`BatchFileView` (each checkpoint directory listed once for the batch, not
        ``lstat`` per name and ack), so it holds as of the batch."""
        self._files = files = BatchFileView(scan_after)
        try:
            yield files
        finally:
            self._files = None

    # ------------------------------------------------------------- recovery

    def recover(self, journal: Iterable[tuple[JournalEvent, str | bytes | None]], epoch: int = 0) -> int:
        """Fold the journal (event, cause header) into states, statistics and input positions."""
        count = 0
        for event, cause in journal:
            self.apply(event, cause, epoch)
            count += 1
        return count

    def apply(self, event: JournalEvent, cause: str | bytes | None, epoch: int) -> None:
        """Fold one valid journal event (of ``epoch``, with its cause header) in."""
        self._apply(event)
        self._track_epoch(event, epoch)
        position = parse_cause(cause)
        if position is not None:
            topic, partition, offset = position
            tp = (topic, partition)
            self.positions[tp] = max(self.positions.get(tp, -1), offset)

    def _track_epoch(self, event: JournalEvent, epoch: int) -> None:
        if isinstance(event, CheckpointTriggered):
            self.trigger_epochs[(event.job_id, event.checkpoint_id)] = epoch
        elif isinstance(event, (CheckpointCompleted, CheckpointAborted)):
            self.trigger_epochs.pop((event.job_id, event.checkpoint_id), None)

    def already_decided(self, topic: str, partition: int, offset: int) -> bool:
        """Did the journal already record this input's decision (a redelivery after a crash)?"""
        return offset <= self.positions.get((topic, partition), -1)

    def partition_of(self, job_id: str) -> int:
        """The partition number of ``job_id`` in every protocol topic."""
        home = self._homes.get(job_id)
        if home is not None:
            return home
        if self.partitions is None:
            raise RuntimeError("the partition count is not known (Coordinator(partitions=...))")
        if len(self._homes) >= MAX_REMEMBERED_HOMES:
            self._homes.clear()  # job ids from hostile input must not grow it without bound
        home = self._homes[job_id] = partition_for(job_key(job_id), self.partitions)
        return home

    def jobs_of(self, partition: int) -> list[str]:
        """The jobs held here whose events live in ``partition``."""
        return [job_id for job_id in self.states if self.partition_of(job_id) == partition]

    def drop_partition(self, partition: int) -> None:
        """Forget everything of ``partition``: its jobs, their statistics and epochs, and the
        positions of its inputs (it was revoked, or is about to be recovered again)."""
        jobs = set(self.jobs_of(partition))
        for job_id in jobs:
            self.states.pop(job_id, None)
            self._due_at.pop(job_id, None)
            self.stats.pop(job_id, None)
            self.latency.pop(job_id, None)
        for key in [k for k in self.trigger_epochs if k[0] in jobs]:
            del self.trigger_epochs[key]
        for tp in [tp for tp in self.positions if tp[1] == partition]:
            del self.positions[tp]

    def merge(self, other: Coordinator, partition: int) -> None:
        """Take ``partition``'s jobs, statistics, epochs and input positions from ``other`` (a fold
        of that partition made elsewhere), replacing what this one had of it (the latency
        histograms, which no fold holds, stay)."""
        latency = {j: self.latency[j] for j in self.jobs_of(partition) if j in self.latency}
        self.drop_partition(partition)
        self.latency.update(latency)
        for job_id in other.jobs_of(partition):
            self._set_state(job_id, other.states[job_id])
            if job_id in other.stats:
                self.stats[job_id] = other.stats[job_id]
        jobs = set(other.jobs_of(partition))
        self.trigger_epochs.update({k: v for k, v in other.trigger_epochs.items() if k[0] in jobs})
        self.positions.update({tp: o for tp, o in other.positions.items() if tp[1] == partition})

    def snapshot(self, partition: int, epoch: int, journal_offset: int, now_ms: int) -> PartitionSnapshot:
        """What this coordinator holds of ``partition``, as a fold snapshot covering the journal up to
        ``journal_offset`` (the caller's last write there)."""
        jobs = set(self.jobs_of(partition))
        return PartitionSnapshot(
            partition=partition,
            epoch=epoch,
            journal_offset=journal_offset,
            positions={f"{t}:{p}": o for (t, p), o in self.positions.items() if p == partition},
            trigger_epochs={trigger_key(j, c): e for (j, c), e in self.trigger_epochs.items() if j in jobs},
            states={j: self.states[j] for j in sorted(jobs)},
            stats={j: self.stats[j] for j in sorted(jobs) if j in self.stats},
            timestamp_ms=now_ms,
        )

    def load(self, snapshot: PartitionSnapshot) -> None:
        """Take a snapshot's jobs, statistics, epochs and positions (replacing the partition's)."""
        self.drop_partition(snapshot.partition)
        self.states.update(snapshot.states)
        self.stats.update(snapshot.stats)
        for key, epoch in snapshot.trigger_epochs.items():
            job_id, _, checkpoint_id = key.rpartition("\x00")
            self.trigger_epochs[(job_id, int(checkpoint_id))] = epoch
        for key, offset in snapshot.positions.items():
            topic, _, partition = key.rpartition(":")
            self.positions[(topic, int(partition))] = offset

    def resume(self, now_ms: int, partition: int | None = None, epoch: int = 0) -> list[Outgoing]:
        """Barriers of every pending checkpoint (of ``partition``'s jobs) again, for tasks that
        missed them in a crash; they carry ``epoch``, the resender's."""
        jobs = self.states if partition is None else self.jobs_of(partition)
        return [
            self._barrier(pending.triggered, now_ms, epoch)
            for job_id in jobs
            for _, pending in sorted(self.states[job_id].pending.items())
        ]

    # ---------------------------------------------------------------- input

    def handle(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        now_ms: int,
        headers: Iterable[tuple[str, bytes | None]] | None = None,
        epoch: int = 0,
    ) -> Outcome:
        """Decode, check and decide one input message, as the owner of its partition in ``epoch``.

        An ack or decline with a ``cutline.epoch`` header answers a barrier of that epoch. Never
        raises: anything unexpected becomes a dead letter (``INTERNAL_ERROR``) and leaves every state
        as it was."""
        self.inputs_decided[topic] += 1
        try:
            return self._handle(topic, partition, offset, key, value, now_ms, headers, epoch)
        except Exception as exc:
            log.exception("input %s[%d]@%d could not be handled", topic, partition, offset)
            message = _describe(exc)
            try:
                return self._dead(
                    topic, partition, offset, key, value, now_ms, DeadLetterReason.INTERNAL_ERROR, message
                )
            except Exception:  # pragma: no cover - a dead letter of plain bytes and ASCII always encodes
                log.exception("no dead letter for %s[%d]@%d either", topic, partition, offset)
                return self._dead(
                    topic,
                    partition,
                    offset,
                    None,
                    None,
                    now_ms,
                    DeadLetterReason.INTERNAL_ERROR,
                    "see the log",
                )

    def _handle(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        now_ms: int,
        headers: Iterable[tuple[str, bytes | None]] | None,
        epoch: int,
    ) -> Outcome:
        def dead(reason: str, message: str, job_id: str | None = None) -> Outcome:
            return self._dead(topic, partition, offset, key, value, now_ms, reason, message, job_id)

        if value is None:
            return dead(DeadLetterReason.EMPTY_MESSAGE, "the message has no value (a tombstone?)")
        try:
            record = self.codec.decode(value)
        except DecodeError as exc:
            return dead(exc.reason, str(exc))
        accepted = self._kinds.get(topic, ())
        if not isinstance(record, accepted):
            names = ", ".join(k.__name__ for k in accepted) or "nothing"
            return dead(
                DeadLetterReason.WRONG_TOPIC,
                f"{type(record).__name__} does not belong on {topic} (it takes {names})",
            )
        # Every kind a topic accepts (ACCEPTED) is an input record: a cast, not a second isinstance.
        job_id = cast(InputRecord, record).job_id
        if key is None:
            return dead(
                DeadLetterReason.MISSING_KEY,
                f"the message has no key; key every message by its job id ({job_id!r}), so that it "
                "reaches the partition, and the coordinator worker, that owns the job",
                job_id,
            )
        if key != job_id.encode():
            return dead(
                DeadLetterReason.KEY_MISMATCH,
                f"message key {key!r} is not the record's job id {job_id!r}; key every message by job_id",
                job_id,
            )
        if self.partitions is not None and partition >= 0 and partition != self.partition_of(job_id):
            return dead(
                DeadLetterReason.WRONG_PARTITION,
                f"a {type(record).__name__} of job {job_id!r} arrived in partition {partition}, but the "
                f"job's partition is {self.partition_of(job_id)} of {self.partitions}: its key hashed with "
                "murmur2, as Java's client and Faust hash it, so that every event of a job reaches the "
                'worker that owns it. Produce with a murmur2 partitioner (confluent-kafka: "partitioner": '
                '"murmur2_random", as events.kafka.clients.producer_config sets it)',
                job_id,
            )
        if isinstance(record, LatencyMeasured):
            return self._measured(record, dead, now_ms)
        if isinstance(record, (CheckpointAcknowledged, CheckpointDeclined)) and headers:
            stale = self._stale_answer(record, headers, epoch)
            if stale is not None:
                return dead(*stale, job_id)
        command = self._command(record, now_ms)
        cause = f"{topic}:{partition}:{offset}"
        outcome = self._decide(command, cause, epoch, (topic, partition, offset), value)
        if outcome.rejected is not None:
            return dead(outcome.rejected.reason.value, outcome.rejected.message, job_id)
        return outcome

    def _measured(self, record: LatencyMeasured, dead: Callable[..., Outcome], now_ms: int) -> Outcome:
        """Fold a latency measurement into its job's histograms: nothing to decide or journal."""
        if record.job_id not in self.states:
            return dead(
                Rejection.UNKNOWN_JOB.value,
                f"a latency measurement of job {excerpt(record.job_id)!r}, which never ran",
                record.job_id,
            )
        problem = measurement_problem(record)
        if problem is not None:
            return dead(DeadLetterReason.INVALID_LATENCY, problem, record.job_id)
        histograms = self.latency.get(record.job_id) or LatencyHistograms(self.latency_granularity)
        self.latency[record.job_id] = recorded = record_latency(histograms, record)
        if recorded.dropped > histograms.dropped:
            line = "latency measurement of job %r dropped: it has %d histograms, the most a job keeps"
            job = excerpt(record.job_id)
            self.latency_log.warning(job, now_ms, line, job, MAX_HISTOGRAMS)
        return Outcome(job_id=record.job_id)

    def _stale_answer(
        self,
        record: CheckpointAcknowledged | CheckpointDeclined,
        headers: Iterable[tuple[str, bytes | None]],
        epoch: int,
    ) -> tuple[str, str] | None:
        """The dead-letter reason and message of an ack or decline that answers a superseded
        barrier, or whose epoch is void (None: it answers a valid one, or cannot tell)."""
        answered = header_epoch(headers)  # as every reader reads a record's epoch
        if answered is None:
            return None  # a writer that does not echo epochs: the decider's checks apply
        triggered = self.trigger_epochs.get((record.job_id, record.checkpoint_id))
        if triggered is not None and answered >= triggered:
            return None  # the usual answer, to the barrier of the epoch that triggered it
        what = "ack" if isinstance(record, CheckpointAcknowledged) else "decline"
        if answered == VOID_EPOCH:
            return DeadLetterReason.VOID_EPOCH, (
                f"the {what} of checkpoint {record.checkpoint_id} has {epoch_problem(headers)}: "
                "it is void (docs/design.md, Ownership and fencing); "
                "answer with the one epoch header of the barrier"
            )
        if triggered is not None:
            return DeadLetterReason.STALE_EPOCH, (
                f"the {what} of checkpoint {record.checkpoint_id} answers a barrier of coordinator epoch "
                f"{answered}, but the checkpoint was triggered in epoch {triggered}: that barrier came "
                "from a superseded coordinator (its trigger is void); answer the current barrier"
            )
        state = self.states.get(record.job_id)
        never_triggered = state is None or record.checkpoint_id >= state.next_checkpoint_id
        if answered < epoch and never_triggered:
            # An id the valid journal has not reached: only a void trigger can have sent that
            # barrier. A late or repeated answer to a valid checkpoint that is over (completed,
            # aborted, answered again after a resent barrier) is the decider's to reject.
            return DeadLetterReason.STALE_EPOCH, (
                f"the {what} of checkpoint {record.checkpoint_id} answers a barrier of coordinator epoch "
                f"{answered}; the journal's epoch is {epoch} and has no such pending checkpoint "
                "(the barrier came from a superseded coordinator)"
            )
        return None

    def _dead(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        now_ms: int,
        reason: str,
        message: str,
        job_id: str | None = None,
    ) -> Outcome:
        line = "dead letter from %s[%d]@%d: %s: %s"
        self.dead_letter_log.warning(reason, now_ms, line, topic, partition, offset, reason, bounded(message))
        self.dead_letters[reason] += 1
        # Bounded so that the letter fits the dead-letter topic's max.message.bytes: its message may
        # quote the input (a 600 KB task id), its key and value are the input's.
        kept = preview(
            message, key, value, job_id, self.limits.of(self.topics.dead_letters), MAX_DEAD_LETTER_VALUE
        )
        letter = DeadLetter(
            topic=topic,
            partition=partition,
            offset=offset,
            reason=reason,
            message=kept.message.encode("utf-8", "backslashreplace").decode("utf-8"),
            timestamp_ms=now_ms,
            key=kept.key,
            value=kept.value,
            job_id=kept.job_id.encode("utf-8", "backslashreplace").decode("utf-8")
            if kept.job_id
            else kept.job_id,
        )
        out = Outgoing(
            self.topics.dead_letters, letter.key or b"", self.codec.encode(letter, self.topics.dead_letters)
        )
        return Outcome(job_id=job_id, messages=[out])

    def _command(self, record: Record, now_ms: int) -> Command:
        match record:
            case CheckpointAcknowledged():  # first: nearly every input is an ack
                return AcknowledgeCheckpoint(record, now_ms)
            case JobStatusChanged():
                return ChangeJobStatus(record, now_ms, jitter=self.rng.random())
            case TaskStatusChanged():
                return ChangeTaskStatus(record, now_ms)
            case CheckpointRequested():
                return RequestCheckpoint(record, now_ms, self.savepoint_roots)
            case JobStopRequested():
                return StopJob(record, now_ms, self.savepoint_roots)
            case JobCancelRequested():
                return CancelJob(record, now_ms)
            case CheckpointDeclined():
                return DeclineCheckpoint(record, now_ms)
            case JobHeartbeat():
                return RecordHeartbeat(record, now_ms)
        raise TypeError(f"no command for {type(record).__name__}")  # pragma: no cover

    def tick(self, job_id: str, now_ms: int, epoch: int = 0) -> Outcome:
        """Let time pass for one job. Never raises: a failure becomes a dead letter (``INTERNAL_ERROR``,
        on the ticks topic) and leaves the job's state as it was; the next tick tries again."""
        try:
            outcome = self._decide(Tick(job_id, now_ms, jitter=self.rng.random()), None, epoch, None)
            if outcome.rejected is not None:  # a decision that would not fit (RUNNING's headroom
                # makes that rare): nothing journaled, the job's state is as it was
                ticks = self.topics.ticks
                return self._dead(
                    ticks,
                    -1,
                    -1,
                    job_id.encode("utf-8", "backslashreplace"),
                    None,
                    now_ms,
                    outcome.rejected.reason.value,
                    outcome.rejected.message,
                    job_id,
                )
            return outcome
        except Exception as exc:
            log.exception("tick of job %r at %d could not be handled", excerpt(job_id), now_ms)
            ticks = self.topics.ticks
            key = job_id.encode("utf-8", "backslashreplace")
            return self._dead(
                ticks, -1, -1, key, None, now_ms, DeadLetterReason.INTERNAL_ERROR, _describe(exc), job_id
            )

    def due(self, now_ms: int) -> list[str]:
        """Jobs for which a tick at ``now_ms`` can change something.

        ``due_at`` walks every pending checkpoint, and the shell asks every 10 ms: with hundreds
        pending, that walk is repeated work in an ack flood. So each job's answer
        is remembered with the state it was worked out for, and an acknowledgement (which moves no
        deadline: ``due_at`` of the state after a ``TaskAcknowledged`` is that of the state
        before, ``tests/property/test_decider_properties.py``) carries it on to the new state
        (:meth:`_keep`). Any other change of the state forgets it (:meth:`_set_state`), and it is
        worked out again."""
        return [job_id for job_id, at in self._due_times() if at is not None and at <= now_ms]

    def next_due_at(self) -> int | None:
        """The earliest time (ms) at which a tick can change something for a job, as :meth:`due`
        works it out; None: no job has anything due until its state changes."""
        return min((at for _, at in self._due_times() if at is not None), default=None)

    def _due_times(self) -> list[tuple[str, int | None]]:
        remembered = self._due_at
        if len(remembered) > len(self.states):
            for job_id in remembered.keys() - self.states.keys():
                del remembered[job_id]
        times = []
        for job_id, state in self.states.items():
            if job_id in remembered:
                at = remembered[job_id]
            else:
                at = remembered[job_id] = due_at(state)
            times.append((job_id, at))
        return times

    def decide(self, command: Command, cause: str | None, epoch: int = 0) -> Outcome:
        """Decide ``command``, fold the result in, and build the messages to publish.

        A refused input yields an outcome with only ``rejected`` set (the caller
        turns it into a dead letter, with the original bytes). All or nothing: the
        state and the statistics change only once every message is built, so an
        exception leaves them as they were.
        """
        return self._decide(command, cause, epoch, parse_cause(cause))

    def _decide(
        self,
        command: Command,
        cause: str | None,
        epoch: int,
        position: tuple[str, int, int] | None,
        frame: bytes | None = None,
    ) -> Outcome:
        """:meth:`decide`, with ``cause`` already parsed into ``position``; ``frame``: the input the
        command was decoded from (an ack's journal record is made from it, :meth:`Codec.acknowledged`)."""
        job_id = command.job_id
        state = self.states.get(job_id) or initial_state(job_id)
        steps = decide_steps(state, command)
        if steps and isinstance(steps[0][0], InputRejected):
            return Outcome(job_id=job_id, rejected=steps[0][0])
        problem = self._outside_after_links(state, [event for event, _ in steps])
        if problem is not None:
            return Outcome(job_id=job_id, rejected=problem)
        outcome = Outcome(job_id=job_id)
        headers = (_epoch_header(epoch), (CAUSE_HEADER, cause.encode())) if cause else (_epoch_header(epoch),)
        barriers: list[Outgoing] = []
        stats, after = self.stats.get(job_id), state
        ack = command.ack if frame is not None and type(command) is AcknowledgeCheckpoint else None
        journal_topic, key = self.topics.checkpoints, job_id.encode()
        budget = journal_budget(command, self.limits.of(journal_topic))
        refolded = False  # a completion went to its metadata object: later states are evolved anew
        for event, next_state in steps:
            assert not isinstance(event, InputRejected)
            value = None
            if ack is not None and frame is not None and type(event) is TaskAcknowledged:
                value = self.codec.acknowledged(frame, ack, event, journal_topic)
            if value is None:
                value = self.codec.encode(event, journal_topic)
            if len(value) + len(key) + 1024 > budget and (size := record_size(key, value, headers)) > budget:
                fitted = self._by_reference(job_id, event, size, budget, key, headers)
                if isinstance(fitted, Outcome):
                    return fitted
                event, value = fitted  # noqa: PLW2901
                refolded = True
            if refolded:
                next_state = evolve(after, event)  # noqa: PLW2901 (the interim state held the inline one)
            stats = track(stats, after, event)
            after = next_state  # what _apply(event) would leave, without a second evolve
            outcome.journal.append(event)
            outcome.messages.append(Outgoing(journal_topic, key, value, headers))
            if isinstance(event, CheckpointTriggered):
                barrier = self._barrier(event, event.timestamp_ms, epoch)
                over = self.limits.over(barrier.topic, barrier.key, barrier.value, barrier.headers)
                if over is not None:
                    return self._too_large(
                        job_id,
                        too_large("CheckpointBarrier", barrier.topic, over, self.limits.of(barrier.topic)),
                    )
                barriers.append(barrier)
        outcome.messages.extend(barriers)
        if type(command) is ChangeTaskStatus and command.changed.status is ExecutionState.RUNNING:
            # a task that started after some barriers were sent: it gets them again
            owed = barriers_owed(after, command.changed.task_id)
            outcome.messages.extend(self._barrier(t, command.now_ms, epoch) for t in owed)
        if steps:
            assert stats is not None
            self._keep(job_id, after, stats, outcome.journal, epoch)
        if position is not None:
            tp, offset = position[:2], position[2]
            if offset > self.positions.get(tp, -1):
                self.positions[tp] = offset
        return outcome

    def _by_reference(
        self,
        job_id: str,
        event: JournalEvent,
        size: int,
        budget: int,
        key: bytes,
        headers: tuple[tuple[str, bytes], ...],
    ) -> tuple[JournalEvent, bytes] | Outcome:
        """A journal record over the journal's limit: a completion goes by reference to its metadata
        object (Flink's ``_metadata``); anything else, or a reference that does not fit either, is
        refused whole."""
        journal_topic = self.topics.checkpoints
        if type(event) is not CheckpointCompleted or event.metadata is not None:
            return self._too_large(job_id, too_large(type(event).__name__, journal_topic, size, budget))
        state = self.states.get(job_id)
        roots = _trusted_roots(state.config.location if state and state.config else "", self.savepoint_roots)
        resolved = _linked_out(metadata_uri(event.location), event.location, roots)
        if resolved is not None:  # as for state handles: the coordinator writes no file through a link
            return Outcome(
                job_id=job_id,
                rejected=InputRejected(
                    job_id,
                    Rejection.STATE_OUTSIDE_LOCATION,
                    f"the metadata object of checkpoint {event.checkpoint_id} would be written to "
                    f"{resolved!r} through a symbolic link, outside its location {event.location!r}: "
                    "nothing was journaled",
                ),
            )
        try:
            event = write_completion_metadata(event, self.codec)
        except Exception as exc:  # the checkpoint stays pending: it expires, not half-written
            log.exception("no metadata object for checkpoint %d of %r", event.checkpoint_id, excerpt(job_id))
            return self._too_large(
                job_id,
                f"its decision completes checkpoint {event.checkpoint_id} with a completion of "
                f"{size} bytes, over the journal's {budget}, and its metadata object could not "
                f"be written ({_describe(exc)}): nothing was journaled",
            )
        value = self.codec.encode(event, journal_topic)
        size = record_size(key, value, headers)
        if size > budget:
            return self._too_large(job_id, too_large(type(event).__name__, journal_topic, size, budget))
        return event, value

    def _keep(
        self,
        job_id: str,
        after: JobState,
        stats: CheckpointStats,
        journal: list[JournalEvent],
        epoch: int,
    ) -> None:
        """Take a decision's state, statistics, deadline memo and trigger epochs."""
        self.stats[job_id] = stats
        if len(journal) == 1 and type(journal[0]) is TaskAcknowledged:
            # The usual ack: it moves no deadline (see due()) and triggers or ends nothing.
            self._set_state(job_id, after, keeps_deadline=True)
            return
        self._set_state(job_id, after, keeps_deadline=all(type(e) is TaskAcknowledged for e in journal))
        for event in journal:
            self._track_epoch(event, epoch)

    def _set_state(self, job_id: str, state: JobState, *, keeps_deadline: bool = False) -> None:
        """The one way a job's state changes: forgets its remembered ``due_at`` unless the change
        is known to move no deadline (acknowledgements only)."""
        self.states[job_id] = state
        if not keeps_deadline:
            self._due_at.pop(job_id, None)

    @staticmethod
    def _too_large(job_id: str, message: str) -> Outcome:
        """A decision that would not fit its topic: refused, nothing journaled, no state changed."""
        return Outcome(job_id=job_id, rejected=InputRejected(job_id, Rejection.RECORD_TOO_LARGE, message))

    def _outside_after_links(self, before: JobState, decisions: list[Decision]) -> InputRejected | None:
        """The decider checked URIs as strings; here ``file:`` paths are resolved through symbolic
        links: an accepted state handle's file must stay inside its checkpoint location, a triggered
        savepoint inside its savepoint root. Inline state has no file to follow."""
        roots = _trusted_roots(before.config.location if before.config else "", self.savepoint_roots)
        for event in decisions:
            if isinstance(event, TaskAcknowledged) and event.state is not None and event.state.inline is None:
                pending = before.pending.get(event.checkpoint_id)
                if pending is None:
                    continue
                where = pending.triggered.location
                resolved = _linked_out(event.state.uri, where, roots, self._files)
                if resolved is not None:
                    return InputRejected(
                        event.job_id,
                        Rejection.STATE_OUTSIDE_LOCATION,
                        f"state {event.state.uri!r} resolves to {resolved!r} through a symbolic link, "
                        f"outside checkpoint location {where!r}",
                    )
            elif isinstance(event, CheckpointTriggered) and event.kind is CheckpointKind.SAVEPOINT:
                resolved = _resolved_outside(event.location, roots)
                if resolved is not None:
                    return InputRejected(
                        event.job_id,
                        Rejection.SAVEPOINT_TARGET_NOT_ALLOWED,
                        f"savepoint location {event.location!r} resolves to {resolved!r} through a "
                        f"symbolic link, outside the savepoint roots {roots}",
                    )
        return None

    def checkpoint_stats(self, job_id: str) -> CheckpointStats | None:
        """The job's statistics as the views show them: in-progress checkpoints with their acks."""
        return with_progress(self.stats.get(job_id), self.states.get(job_id))

    def _apply(self, event: JournalEvent) -> None:
        job_id = event.job_id
        state = self.states.get(job_id) or initial_state(job_id)
        self._set_state(job_id, evolve(state, event))
        self.stats[job_id] = track(self.stats.get(job_id), state, event)

    def _barrier(self, triggered: CheckpointTriggered, now_ms: int, epoch: int = 0) -> Outgoing:
        barrier = CheckpointBarrier(
            job_id=triggered.job_id,
            checkpoint_id=triggered.checkpoint_id,
            attempt=triggered.attempt,
            kind=triggered.kind,
            timestamp_ms=now_ms,
            location=triggered.location,
            inline_limit_bytes=triggered.inline_limit_bytes,
            stop=triggered.stop,
            drain=triggered.drain,
        )
        return Outgoing(
            self.topics.barriers,
            triggered.job_id.encode(),
            self.codec.encode(barrier, self.topics.barriers),
            (_epoch_header(epoch),),
        )


@functools.lru_cache(maxsize=64)
def _epoch_header(epoch: int) -> tuple[str, bytes]:
    """:func:`events.wire.fencing.epoch_header`, remembered: a worker writes under a few epochs only."""
    return epoch_header(epoch)


def _describe(exc: BaseException) -> str:
    """An exception as a dead letter's message: its class and (the start of) its message."""
    text = str(exc)
    if len(text) > 2000:
        text = text[:2000] + "..."
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {text}"


@functools.lru_cache(maxsize=1024)
def _trusted_roots(location: str, configured: tuple[str, ...]) -> tuple[str, ...]:
    """The directories a job's checkpoints and savepoints may be written below: its savepoint roots
    and its checkpoint location (where checkpoints, and savepoints without a target, go)."""
    return (*(str(r) for r in savepoint_roots(location, configured)), location)


@functools.lru_cache(maxsize=1024)
def _file_location(uri: str) -> StorageUri | None:
    """``_file_uri`` remembered: locations and roots are the same for many acks."""
    return _file_uri(uri)


def _file_uri(uri: str) -> StorageUri | None:
    try:
        parsed = parse_uri(uri)
    except InvalidUri:
        return None  # the decider has judged it
    return parsed if parsed.scheme == "file" else None


ROOT_TTL = 1.0
"""Seconds a root's real path is remembered: one ``realpath`` per ack (the handle's) instead of two.
Roots are the operator's directories; a link changed above them is seen within this time."""

_REAL_ROOTS: dict[str, tuple[float, str]] = {}


def _real_root(path: str) -> str:
    now = time.monotonic()
    hit = _REAL_ROOTS.get(path)
    if hit is not None and now - hit[0] < ROOT_TTL:
        return hit[1]
    real = os.path.realpath(path)
    if len(_REAL_ROOTS) >= 1024:
        _REAL_ROOTS.clear()
    _REAL_ROOTS[path] = (now, real)
    return real


def _below(path: str, root: str, *, strict: bool = True) -> bool:
    return path.startswith(root.rstrip("/") + "/") or (not strict and path == root)


def _resolved_outside(uri: str, roots: Iterable[str]) -> str | None:
    """For a ``file:`` URI: its real path when that is not in (or equal to) the real path of any of
    ``roots``; None when it is, or when ``uri`` is not a ``file:`` URI. Reads the file system."""
    target = _file_uri(uri)
    if target is None:
        return None
    real = os.path.realpath(target.path)
    for root in filter(None, map(_file_location, roots)):
        if _below(real, _real_root(root.path), strict=False):
            return None
    return real


def _linked_out(
    uri: str, location: str, roots: tuple[str, ...], files: BatchFileView | None = None
) -> str | None:
    """For a ``file:`` state handle of a checkpoint at ``location``: its real path when that is not
    below the checkpoint's real directory; None when it is (or when either is not a ``file:`` URI).

    The checkpoint's real directory is the real path of the root it was triggered under (the
    job's checkpoint location or a savepoint root: chosen by the operator) followed by the rest of
    ``location`` as written: links between the root and the checkpoint's directory (a ``chk-7``
    that is a link to ``/etc``) count as leaving it, links inside it to files inside it do not.
    Only the path below the root is walked (``lstat`` per name, until a name does not exist):
    what is not there cannot lead anywhere, and what the coordinator may not see, it cannot check.
    With ``files`` (the batch's view), names are asked of it instead of ``lstat`` one by one, and
    the names from the root down to the checkpoint's directory, the same for each of its acks,
    are walked once per batch (:meth:`BatchFileView.walk`).
    """
    if files is not None and not location.endswith("/"):
        cut = len(location)
        name = uri[cut + 1 :]
        if uri.startswith(location) and uri[cut : cut + 1] == "/" and _is_plain_name(name):
            # The usual handle, one plain name in the checkpoint's directory: that directory is
            # worked out once per batch, and only the name is asked. A link goes the long way below.
            directory = _checkpoint_directory(location, roots, files)
            if directory is None:
                return None  # not a file: location, or its directory is not there
            if directory is not False and not files.is_link(directory + "/" + name):
                return None
    anchored = _anchored(location, roots)
    handle = _file_handle(uri, location) if anchored is not None else None
    if handle is None or anchored is None:
        return None
    where, anchor = anchored
    n = len(anchor.segments)
    root = _real_root(anchor.path)
    base, below = root, handle.segments[n:]
    if handle.segments[:n] != anchor.segments:  # pragma: no cover - the decider made sure the
        base, below = "/", handle.segments  # handle is below the location; resolve it all anyway
    # ``path + "/" + name`` is os.path.join's answer here (names are plain, ``path`` ends in none).
    path = base.rstrip("/")
    ask = is_link
    first = 0
    if files is not None:
        ask = files.is_link
        depth = len(where.segments) - n  # names from the root down to the checkpoint's directory
        if base is root and 0 < depth < len(below) and handle.segments[: n + depth] == where.segments:
            walked = files.walk(path, below[:depth])
            if walked is None:
                return None  # not there: nothing below it is either
            if walked:  # no link on the way: only the names below the checkpoint's directory are left
                path, first = path + "/" + "/".join(below[:depth]), depth
    for name in below[first:]:
        path = path + "/" + name
        linked = ask(path)
        if linked is None:
            return None
        if not linked:
            continue
        directory = os.path.join(root, *where.segments[n:])
        real = os.path.realpath(os.path.join(base, *below))
        return None if _below(real, directory) else real
    return None


_PLAIN_NAME = re.compile(r"[^/%\\?#\x00-\x1f\x7f]+")
"""A path segment :func:`events.wire.validation.parse_uri` keeps as written (no escape, no separator,
no character it refuses); ``.`` and ``..`` are plain by this pattern and are excluded apart."""


def _is_plain_name(name: str) -> bool:
    return name not in (".", "..") and _PLAIN_NAME.fullmatch(name) is not None


def _checkpoint_directory(
    location: str, roots: tuple[str, ...], files: BatchFileView
) -> str | Literal[False] | None:
    """The path of ``location``'s directory below the real path of its root (as :func:`_linked_out`
    builds it), when no name on the way from the root is a link; None when ``location`` is not a
    ``file:`` URI or a name on the way is not there; False when one is a link. Once per batch."""
    key = (location, roots)
    if key in files.checkpoint_directories:
        return files.checkpoint_directories[key]
    anchored = _anchored(location, roots)
    answer: str | Literal[False] | None = None
    if anchored is not None:
        where, anchor = anchored
        root = _real_root(anchor.path).rstrip("/")
        names = where.segments[len(anchor.segments) :]
        walked = files.walk(root, names) if names else True
        answer = "/".join((root, *names)) if walked else (None if walked is None else False)
    files.checkpoint_directories[key] = answer
    return answer


def _file_handle(uri: str, location: str) -> StorageUri | None:
    """A state handle's ``file:`` URI parsed (:func:`events.wire.validation.parse_below` its checkpoint
    location, as the decider parsed it); None when it is not a ``file:`` URI or does not parse."""
    try:
        parsed = parse_below(uri, location)
    except InvalidUri:
        return None  # the decider has judged it
    return parsed if parsed.scheme == "file" else None


@functools.lru_cache(maxsize=1024)
def _anchored(location: str, roots: tuple[str, ...]) -> tuple[StorageUri, StorageUri] | None:
    """A ``file:`` checkpoint location and the deepest of ``roots`` it is in (itself when in none);
    None when it is not a ``file:`` URI. Pure: remembered per checkpoint, not worked out per ack."""
    where = _file_location(location)
    if where is None:
        return None
    anchors = [r for r in filter(None, map(_file_location, roots)) if where.within(r, strict=False)]
    return where, max(anchors, key=lambda r: len(r.segments), default=where)
