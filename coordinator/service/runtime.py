"""The coordinator's shell logic without the transport: bytes in, messages out.

``Coordinator`` turns one input message (topic, partition, offset, key, value) into its
:class:`Outcome` in one straight pass (docs/coordinator.md, "The runtime's pass"):

1. decode: the bytes, the topic, the key, the partition and the answered epoch are checked;
2. ask: what the file system must say about the ``file:`` paths the decision could accept or
   write (:mod:`coordinator.core.links`, through the :class:`~coordinator.service.ports.FileChecks` port),
   handed to the decider as data;
3. decide: :func:`coordinator.core.decider.decide_steps`, pure;
4. encode: journal records, barriers and ``_metadata`` objects (:mod:`coordinator.core.encoding`, pure;
   a record that would not fit its topic refuses the input), then the fold takes the result
   (:class:`coordinator.core.fold_state.FoldState`).

Nothing after ``decide`` reads or writes a file: the worker writes the outcome's metadata objects
before its journal records, then publishes (journal first, then barriers and dead letters). The
fold holds the per-job states (always equal to folding the journal), statistics and input
positions, so a restarted service skips inputs it has already decided.

Epochs (docs/design.md, "Ownership and fencing"): every journal record and barrier carries the epoch
the caller decides under in ``cutline.epoch``; an ack or decline answering a barrier of an older,
superseded epoch is refused with ``STALE_EPOCH``, one whose epoch header is doubled or malformed
with ``VOID_EPOCH`` (:func:`events.wire.fencing.header_epoch`).

Bad input is never fatal (docs/design.md, "The checkpoint decider"): whatever goes wrong for one
message (it cannot be decoded, the decider refuses it, or a step raises) ends in one dead letter
with the reason; the job's state stays what it was before that message. Ticks are guarded the same.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import cast

from coordinator.core.checks import stale_answer
from coordinator.core.commands import Command, Tick
from coordinator.core.decider import InputRejected, Rejection, decide_steps
from coordinator.core.encoding import Encoder, MetadataObject, Outgoing
from coordinator.core.fold_state import FoldState, parse_cause
from coordinator.core.inbox import ACCEPTED, command_for, dead_letter, envelope_problem
from coordinator.core.links import Below, questions, with_links
from coordinator.core.snapshot import PartitionSnapshot
from coordinator.core.state import JobState, initial_state
from coordinator.core.stats import CheckpointStats
from coordinator.service.file_view import SCAN_AFTER, FileChecks, LocalFiles
from coordinator.service.throttled_log import ThrottledLog
from events.kafka.clients import job_key, partition_for
from events.task.latency import (
    MAX_HISTOGRAMS,
    Granularity,
    LatencyHistograms,
    measurement_problem,
    record_latency,
)
from events.wire.codec import Codec, DecodeError, default_codec
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointDeclined,
    CheckpointTriggered,
    InputRecord,
    JournalEvent,
    LatencyMeasured,
)
from events.wire.sizes import TopicLimits, bounded, excerpt
from events.wire.topics import Topics
from events.wire.validation import parse_uri
from events.wire.vocabulary import DeadLetterReason

__all__ = ["ACCEPTED", "Coordinator", "MetadataObject", "Outcome", "Outgoing", "parse_cause"]

log = logging.getLogger("cutline.coordinator")

MAX_REMEMBERED_HOMES = 100_000
"""Job ids whose partition :meth:`Coordinator.partition_of` remembers (then it starts again)."""


@dataclass(slots=True)
class Outcome:
    """What one input led to: the journal events, the messages to publish (journal first), the
    metadata objects the worker writes before them, or the refusal (then a dead letter)."""

    job_id: str | None = None
    journal: list[JournalEvent] = field(default_factory=list)
    messages: list[Outgoing] = field(default_factory=list)
    rejected: InputRejected | None = None
    metadata: list[MetadataObject] = field(default_factory=list)

    @property
    def has_barriers(self) -> bool:
        """Barriers go out only after the journal holds their trigger durably."""
        return any(isinstance(e, CheckpointTriggered) for e in self.journal)


class Coordinator:
    """Decides every input and keeps what the journal says (:attr:`fold`, whose ``states``,
    ``stats``, ``positions`` and ``trigger_epochs`` it shows as its own).

    ``now_ms`` always comes from the caller (the service's clock); ``rng`` only draws the
    first-trigger jitter, which the journal then records; ``files`` answers the file system's
    questions (:class:`~coordinator.service.file_view.LocalFiles`: the host's).
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
        files: FileChecks | None = None,
    ) -> None:
        for root in savepoint_roots:
            parse_uri(root)  # InvalidUri (a ValueError) at start-up, not at the first request
        self.topics, self.codec = topics, codec or default_codec()
        self.rng = rng or random.Random()
        self.partitions = partitions
        """Partition count of the protocol topics (for :meth:`partition_of`); None: not known."""
        self.savepoint_roots = savepoint_roots
        self.limits = limits or TopicLimits()
        """The ``max.message.bytes`` of the topics written to: no decision whose records would not
        fit is admitted (docs/design.md, "Record sizes")."""
        self.encoder = Encoder(topics, self.codec, self.limits)
        self.files: FileChecks = files or LocalFiles()
        self.fold = FoldState(self.partition_of)
        self.states, self.stats, self.positions = self.fold.states, self.fold.stats, self.fold.positions
        self.trigger_epochs = self.fold.trigger_epochs
        self._kinds = {getattr(topics, name): kinds for name, kinds in ACCEPTED.items()}
        self.inputs_decided: Counter[str] = Counter()
        """Input messages handled (decided or dead-lettered), by topic: for metrics."""
        self.dead_letters: Counter[str] = Counter()
        """Dead letters made, by reason: for metrics."""
        self.dead_letter_log = ThrottledLog(log, "dead letters")
        """One log line per dead-letter reason per 10 s, then how many it stood for."""
        self._homes: dict[str, int] = {}
        """job -> :meth:`partition_of` (murmur2 in Python costs microseconds; every input asks)."""
        self.latency_granularity = latency_granularity
        self.latency: dict[str, LatencyHistograms] = {}
        """job -> its latency histograms (:mod:`events.task.latency`): metrics, never journaled, so a
        worker that takes a job over starts them afresh (as Flink's on a restart)."""
        self.latency_log = ThrottledLog(log, "latency measurements dropped")

    def batch(self, scan_after: int = SCAN_AFTER) -> AbstractContextManager[object]:
        """Decide the inputs handled inside this block as one batch: the file system is asked
        through one view (:meth:`LocalFiles.batch`), so the link checks hold as of the batch."""
        return self.files.batch(scan_after)

    # --------------------------------------------------------- the fold (FoldState)

    def recover(self, journal: Iterable[tuple[JournalEvent, str | bytes | None]], epoch: int = 0) -> int:
        """Fold the journal (event, cause header) into states, statistics and input positions."""
        count = 0
        for event, cause in journal:
            self.fold.apply(event, cause, epoch)
            count += 1
        return count

    def apply(self, event: JournalEvent, cause: str | bytes | None, epoch: int) -> None:
        self.fold.apply(event, cause, epoch)

    def already_decided(self, topic: str, partition: int, offset: int) -> bool:
        return self.fold.already_decided(topic, partition, offset)

    def jobs_of(self, partition: int) -> list[str]:
        return self.fold.jobs_of(partition)

    def drop_partition(self, partition: int) -> None:
        """Forget ``partition``: its fold and its jobs' latency histograms."""
        for job_id in self.fold.jobs_of(partition):
            self.latency.pop(job_id, None)
        self.fold.drop_partition(partition)

    def merge(self, other: Coordinator, partition: int) -> None:
        """Take ``partition``'s fold from ``other`` (a recovery's); the latency histograms stay."""
        self.fold.merge(other.fold, partition)

    def snapshot(self, partition: int, epoch: int, journal_offset: int, now_ms: int) -> PartitionSnapshot:
        return self.fold.snapshot(partition, epoch, journal_offset, now_ms)

    def load(self, snapshot: PartitionSnapshot) -> None:
        self.fold.load(snapshot)

    def due(self, now_ms: int) -> list[str]:
        return self.fold.due(now_ms)

    def next_due_at(self) -> int | None:
        return self.fold.next_due_at()

    def checkpoint_stats(self, job_id: str) -> CheckpointStats | None:
        return self.fold.checkpoint_stats(job_id)

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

    def resume(self, now_ms: int, partition: int | None = None, epoch: int = 0) -> list[Outgoing]:
        """Barriers of every pending checkpoint (of ``partition``'s jobs) again, for tasks that
        missed them in a crash; they carry ``epoch``, the resender's."""
        jobs = self.states if partition is None else self.jobs_of(partition)
        return [
            self.encoder.barrier(pending.triggered, now_ms, epoch)
            for job_id in jobs
            for _, pending in sorted(self.states[job_id].pending.items())
        ]

    # ---------------------------------------------------------------------- input

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
        Never raises: anything unexpected becomes a dead letter (``INTERNAL_ERROR``)."""
        self.inputs_decided[topic] += 1

        def dead(reason: str, message: str, job_id: str | None = None) -> Outcome:
            return self._dead(topic, partition, offset, key, value, now_ms, reason, message, job_id)

        try:
            checked = self._decoded(topic, partition, key, value, headers, epoch)
            if isinstance(checked, tuple):
                return dead(*checked)
            if isinstance(checked, LatencyMeasured):
                return self._measured(checked, dead, now_ms)
            command = command_for(checked, now_ms, self.rng.random, self.savepoint_roots)
            outcome = self._decide(
                command, f"{topic}:{partition}:{offset}", epoch, (topic, partition, offset), value
            )
            if outcome.rejected is not None:
                return dead(outcome.rejected.reason.value, outcome.rejected.message, checked.job_id)
            return outcome
        except Exception as exc:
            log.exception("input %s[%d]@%d could not be handled", topic, partition, offset)
            try:
                return dead(DeadLetterReason.INTERNAL_ERROR, _describe(exc))
            except Exception:  # pragma: no cover - a dead letter of plain bytes and ASCII always encodes
                log.exception("no dead letter for %s[%d]@%d either", topic, partition, offset)
                reason = DeadLetterReason.INTERNAL_ERROR
                return self._dead(topic, partition, offset, None, None, now_ms, reason, "see the log")

    def _decoded(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes | None]] | None,
        epoch: int,
    ) -> InputRecord | tuple[str, str] | tuple[str, str, str]:
        """The input record, or why it is a dead letter (reason, message[, job id])."""
        if value is None:
            return DeadLetterReason.EMPTY_MESSAGE, "the message has no value (a tombstone?)"
        try:
            record = self.codec.decode(value)
        except DecodeError as exc:
            return exc.reason, str(exc)
        accepted = self._kinds.get(topic, ())
        problem = envelope_problem(
            topic, accepted, record, key, partition, self.partitions, self.partition_of
        )
        if problem is not None:
            return (*problem, cast(InputRecord, record).job_id) if isinstance(record, accepted) else problem
        record = cast(InputRecord, record)
        if isinstance(record, (CheckpointAcknowledged, CheckpointDeclined)) and headers:
            triggered = self.trigger_epochs.get((record.job_id, record.checkpoint_id))
            stale = stale_answer(record, headers, epoch, triggered, self.states.get(record.job_id))
            if stale is not None:
                return (*stale, record.job_id)
        return record

    def _measured(self, record: LatencyMeasured, dead: Callable[..., Outcome], now_ms: int) -> Outcome:
        """Fold a latency measurement into its job's histograms: nothing to decide or journal."""
        if record.job_id not in self.states:
            message = f"a latency measurement of job {excerpt(record.job_id)!r}, which never ran"
            return dead(Rejection.UNKNOWN_JOB.value, message, record.job_id)
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
        to = self.topics.dead_letters
        at = (topic, partition, offset)
        letter = dead_letter(at, key, value, now_ms, reason, message, job_id, self.limits.of(to))
        return Outcome(
            job_id=job_id, messages=[Outgoing(to, letter.key or b"", self.codec.encode(letter, to))]
        )

    def tick(self, job_id: str, now_ms: int, epoch: int = 0) -> Outcome:
        """Let time pass for one job. Never raises: a failure or a refusal becomes a dead letter (on
        the ticks topic) and leaves the job's state as it was; the next tick tries again."""
        key = job_id.encode("utf-8", "backslashreplace")
        try:
            outcome = self._decide(Tick(job_id, now_ms, jitter=self.rng.random()), None, epoch, None)
            if outcome.rejected is None:
                return outcome
            reason, message = outcome.rejected.reason.value, outcome.rejected.message
        except Exception as exc:
            log.exception("tick of job %r at %d could not be handled", excerpt(job_id), now_ms)
            reason, message = DeadLetterReason.INTERNAL_ERROR, _describe(exc)
        return self._dead(self.topics.ticks, -1, -1, key, None, now_ms, reason, message, job_id)

    def decide(self, command: Command, cause: str | None, epoch: int = 0) -> Outcome:
        """Decide ``command``, fold the result in, and build the messages to publish. A refused
        input yields an outcome with only ``rejected`` set. All or nothing: the fold changes only
        once every message is built, so an exception leaves it as it was."""
        return self._decide(command, cause, epoch, parse_cause(cause))

    def _decide(
        self,
        command: Command,
        cause: str | None,
        epoch: int,
        position: tuple[str, int, int] | None,
        frame: bytes | None = None,
    ) -> Outcome:
        """The straight pass: ask the file system, decide, encode, keep (``frame``: the input)."""
        job_id = command.job_id
        state = self.states.get(job_id) or initial_state(job_id)
        links = self._links(state, command)
        steps = decide_steps(state, with_links(command, links))
        if steps and isinstance(steps[0][0], InputRejected):
            return Outcome(job_id=job_id, rejected=steps[0][0])
        encoded = self.encoder.encode(
            command, state, self.stats.get(job_id), steps, epoch, cause, frame, links
        )
        if isinstance(encoded, InputRejected):
            return Outcome(job_id=job_id, rejected=encoded)
        if encoded.journal:
            assert encoded.stats is not None
            self.fold.keep(job_id, encoded.after, encoded.stats, encoded.journal, epoch)
        self.fold.advance(position)
        return Outcome(job_id, encoded.journal, encoded.messages, None, encoded.metadata)

    def _links(self, state: JobState, command: Command) -> dict[str, str]:
        """Each ``file:`` path the decision could accept or write that leads out through a symbolic
        link, with its real path: the file system's answers, asked before deciding."""
        found = {}
        for question in questions(state, command, self.savepoint_roots):
            if isinstance(question, Below):
                resolved = self.files.linked_out(question.uri, question.location, question.roots)
            else:
                resolved = self.files.resolved_outside(question.uri, question.roots)
            if resolved is not None:
                found[question.uri] = resolved
        return found


def _describe(exc: BaseException) -> str:
    """An exception as a dead letter's message: its class and (the start of) its message."""
    text = str(exc)
    if len(text) > 2000:
        text = text[:2000] + "..."
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {text}"
