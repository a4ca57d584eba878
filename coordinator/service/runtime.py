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

Epochs (DESIGN §4a): the caller says under which claim epoch it decides; every
journal record and barrier it gets back carries that epoch in the
``cutline.epoch`` header. The runtime remembers the epoch of each pending
checkpoint's trigger, so an ack or decline that answers a barrier of an older,
superseded epoch (a zombie's) is refused with STALE_EPOCH instead of counting.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from coordinator.commands import (
    AcknowledgeCheckpoint,
    ChangeJobStatus,
    ChangeTaskStatus,
    Command,
    DeclineCheckpoint,
    RequestCheckpoint,
    Tick,
)
from coordinator.decider import InputRejected, decide_steps, due_at, evolve
from coordinator.snapshot import PartitionSnapshot, trigger_key
from coordinator.state import JobState, initial_state
from coordinator.stats import CheckpointStats, track
from events.codec import Codec, DecodeError, default_codec
from events.fencing import EPOCH_HEADER, epoch_header, epoch_of
from events.kafka import job_key, partition_for
from events.records import (
    CheckpointAborted,
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointDeclined,
    CheckpointRequested,
    CheckpointTriggered,
    DeadLetter,
    JobStatusChanged,
    JournalEvent,
    Record,
    TaskStatusChanged,
)
from events.topics import Topics

log = logging.getLogger("cutline.coordinator")

STALE_EPOCH = "STALE_EPOCH"
"""Dead-letter reason of an ack or decline answering a barrier of a superseded coordinator epoch."""

CAUSE_HEADER = "cutline-cause"
"""Journal message header naming the input that caused the event: ``topic:partition:offset``."""

ACCEPTED: Mapping[str, tuple[type[Record], ...]] = {
    "job_status": (JobStatusChanged, TaskStatusChanged),
    "requests": (CheckpointRequested,),
    "acks": (CheckpointAcknowledged,),
    "declines": (CheckpointDeclined,),
}
"""Which records each input topic may carry."""


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
    ) -> None:
        self.topics = topics
        self.codec = codec or default_codec()
        self.rng = rng or random.Random()
        self.partitions = partitions
        """Partition count of the protocol topics (for :meth:`partition_of`); None: not known."""
        self.states: dict[str, JobState] = {}
        self.stats: dict[str, CheckpointStats] = {}
        self.positions: dict[tuple[str, int], int] = {}
        self.trigger_epochs: dict[tuple[str, int], int] = {}
        """(job, checkpoint id) of each pending checkpoint -> the epoch its trigger was journaled in."""
        self._kinds = {getattr(topics, name): kinds for name, kinds in ACCEPTED.items()}

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
        if self.partitions is None:
            raise RuntimeError("the partition count is not known (Coordinator(partitions=...))")
        return partition_for(job_key(job_id), self.partitions)

    def jobs_of(self, partition: int) -> list[str]:
        """The jobs held here whose events live in ``partition``."""
        return [job_id for job_id in self.states if self.partition_of(job_id) == partition]

    def drop_partition(self, partition: int) -> None:
        """Forget everything of ``partition``: its jobs, their statistics and epochs, and the
        positions of its inputs (it was revoked, or is about to be recovered again)."""
        jobs = set(self.jobs_of(partition))
        for job_id in jobs:
            self.states.pop(job_id, None)
            self.stats.pop(job_id, None)
        for key in [k for k in self.trigger_epochs if k[0] in jobs]:
            del self.trigger_epochs[key]
        for tp in [tp for tp in self.positions if tp[1] == partition]:
            del self.positions[tp]

    def merge(self, other: Coordinator, partition: int) -> None:
        """Take ``partition``'s jobs, statistics, epochs and input positions from ``other`` (a fold
        of that partition made elsewhere), replacing what this one had of it."""
        self.drop_partition(partition)
        for job_id in other.jobs_of(partition):
            self.states[job_id] = other.states[job_id]
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

        An ack or decline with a ``cutline.epoch`` header answers a barrier of that epoch."""

        def dead(reason: str, message: str, job_id: str | None = None) -> Outcome:
            log.warning("dead letter from %s[%d]@%d: %s: %s", topic, partition, offset, reason, message)
            letter = DeadLetter(
                topic=topic,
                partition=partition,
                offset=offset,
                reason=reason,
                message=message,
                timestamp_ms=now_ms,
                key=key,
                value=value,
                job_id=job_id,
            )
            out = Outgoing(self.topics.dead_letters, key or b"", self.codec.encode(letter))
            return Outcome(job_id=job_id, messages=[out])

        if value is None:
            return dead("EMPTY_MESSAGE", "the message has no value (a tombstone?)")
        try:
            record = self.codec.decode(value)
        except DecodeError as exc:
            return dead(exc.reason, str(exc))
        accepted = self._kinds.get(topic, ())
        if not isinstance(record, accepted):
            names = ", ".join(k.__name__ for k in accepted) or "nothing"
            return dead(
                "WRONG_TOPIC", f"{type(record).__name__} does not belong on {topic} (it takes {names})"
            )
        assert isinstance(
            record,
            (
                JobStatusChanged,
                TaskStatusChanged,
                CheckpointRequested,
                CheckpointAcknowledged,
                CheckpointDeclined,
            ),
        )
        job_id = record.job_id
        if key is not None and key != job_id.encode():
            return dead(
                "KEY_MISMATCH",
                f"message key {key!r} is not the record's job id {job_id!r}; key every message by job_id",
                job_id,
            )
        if isinstance(record, (CheckpointAcknowledged, CheckpointDeclined)) and headers:
            stale = self._stale_answer(record, headers, epoch)
            if stale is not None:
                return dead(STALE_EPOCH, stale, job_id)
        command = self._command(record, now_ms)
        outcome = self.decide(command, cause=f"{topic}:{partition}:{offset}", epoch=epoch)
        if outcome.rejected is not None:
            return dead(outcome.rejected.reason.value, outcome.rejected.message, job_id)
        return outcome

    def _stale_answer(
        self,
        record: CheckpointAcknowledged | CheckpointDeclined,
        headers: Iterable[tuple[str, bytes | None]],
        epoch: int,
    ) -> str | None:
        """Why an ack or decline answers a superseded barrier (None: it does not, or cannot tell)."""
        headers = list(headers)
        if not any(name == EPOCH_HEADER for name, _ in headers):
            return None  # a writer that does not echo epochs: the decider's checks apply
        answered = epoch_of(headers)
        triggered = self.trigger_epochs.get((record.job_id, record.checkpoint_id))
        what = "ack" if isinstance(record, CheckpointAcknowledged) else "decline"
        if triggered is not None and answered < triggered:
            return (
                f"the {what} of checkpoint {record.checkpoint_id} answers a barrier of coordinator epoch "
                f"{answered}, but the checkpoint was triggered in epoch {triggered}: that barrier came "
                "from a superseded coordinator (its trigger is void); answer the current barrier"
            )
        if triggered is None and answered < epoch:
            return (
                f"the {what} of checkpoint {record.checkpoint_id} answers a barrier of coordinator epoch "
                f"{answered}; the journal's epoch is {epoch} and has no such pending checkpoint "
                "(the barrier came from a superseded coordinator)"
            )
        return None

    def _command(self, record: Record, now_ms: int) -> Command:
        match record:
            case JobStatusChanged():
                return ChangeJobStatus(record, now_ms, jitter=self.rng.random())
            case TaskStatusChanged():
                return ChangeTaskStatus(record, now_ms)
            case CheckpointRequested():
                return RequestCheckpoint(record, now_ms)
            case CheckpointAcknowledged():
                return AcknowledgeCheckpoint(record, now_ms)
            case CheckpointDeclined():
                return DeclineCheckpoint(record, now_ms)
        raise TypeError(f"no command for {type(record).__name__}")  # pragma: no cover

    def tick(self, job_id: str, now_ms: int, epoch: int = 0) -> Outcome:
        """Let time pass for one job."""
        return self.decide(Tick(job_id, now_ms), cause=None, epoch=epoch)

    def due(self, now_ms: int) -> list[str]:
        """Jobs for which a tick at ``now_ms`` can change something."""
        return [
            job_id
            for job_id, state in self.states.items()
            if (at := due_at(state)) is not None and at <= now_ms
        ]

    def decide(self, command: Command, cause: str | None, epoch: int = 0) -> Outcome:
        """Decide ``command``, fold the result in, and build the messages to publish.

        A refused input yields an outcome with only ``rejected`` set (the caller
        turns it into a dead letter, with the original bytes).
        """
        job_id = command.job_id
        state = self.states.get(job_id) or initial_state(job_id)
        steps = decide_steps(state, command)
        if steps and isinstance(steps[0][0], InputRejected):
            return Outcome(job_id=job_id, rejected=steps[0][0])
        outcome = Outcome(job_id=job_id)
        headers = (epoch_header(epoch), *(((CAUSE_HEADER, cause.encode()),) if cause else ()))
        barriers: list[Outgoing] = []
        for event, after in steps:
            assert not isinstance(event, InputRejected)
            self.stats[job_id] = track(self.stats.get(job_id), state, event)
            self.states[job_id] = state = after  # what _apply(event) would leave, without a second evolve
            self._track_epoch(event, epoch)
            outcome.journal.append(event)
            outcome.messages.append(
                Outgoing(self.topics.checkpoints, job_id.encode(), self.codec.encode(event), headers)
            )
            if isinstance(event, CheckpointTriggered):
                barriers.append(self._barrier(event, event.timestamp_ms, epoch))
        if cause is not None:
            position = parse_cause(cause)
            if position is not None:
                self.positions[position[:2]] = max(self.positions.get(position[:2], -1), position[2])
        outcome.messages.extend(barriers)
        return outcome

    def _apply(self, event: JournalEvent) -> None:
        job_id = event.job_id
        state = self.states.get(job_id) or initial_state(job_id)
        self.states[job_id] = evolve(state, event)
        self.stats[job_id] = track(self.stats.get(job_id), state, event)

    def _barrier(self, triggered: CheckpointTriggered, now_ms: int, epoch: int = 0) -> Outgoing:
        barrier = CheckpointBarrier(
            job_id=triggered.job_id,
            checkpoint_id=triggered.checkpoint_id,
            attempt=triggered.attempt,
            kind=triggered.kind,
            timestamp_ms=now_ms,
            location=triggered.location,
        )
        return Outgoing(
            self.topics.barriers,
            triggered.job_id.encode(),
            self.codec.encode(barrier),
            (epoch_header(epoch),),
        )
