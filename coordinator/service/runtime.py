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
from coordinator.state import JobState, initial_state
from coordinator.stats import CheckpointStats, track
from events.codec import Codec, DecodeError, default_codec
from events.records import (
    CheckpointAcknowledged,
    CheckpointBarrier,
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

    def __init__(self, topics: Topics, codec: Codec | None = None, rng: random.Random | None = None) -> None:
        self.topics = topics
        self.codec = codec or default_codec()
        self.rng = rng or random.Random()
        self.states: dict[str, JobState] = {}
        self.stats: dict[str, CheckpointStats] = {}
        self.positions: dict[tuple[str, int], int] = {}
        self._kinds = {getattr(topics, name): kinds for name, kinds in ACCEPTED.items()}

    # ------------------------------------------------------------- recovery

    def recover(self, journal: Iterable[tuple[JournalEvent, str | bytes | None]]) -> int:
        """Fold the journal (event, cause header) into states, statistics and input positions."""
        count = 0
        for event, cause in journal:
            self._apply(event)
            position = parse_cause(cause)
            if position is not None:
                topic, partition, offset = position
                tp = (topic, partition)
                self.positions[tp] = max(self.positions.get(tp, -1), offset)
            count += 1
        return count

    def already_decided(self, topic: str, partition: int, offset: int) -> bool:
        """Did the journal already record this input's decision (a redelivery after a crash)?"""
        return offset <= self.positions.get((topic, partition), -1)

    def resume(self, now_ms: int) -> list[Outgoing]:
        """Barriers of every pending checkpoint again, for tasks that missed them in a crash."""
        return [
            self._barrier(pending.triggered, now_ms)
            for state in self.states.values()
            for _, pending in sorted(state.pending.items())
        ]

    # ---------------------------------------------------------------- input

    def handle(
        self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None, now_ms: int
    ) -> Outcome:
        """Decode, check and decide one input message."""

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
        command = self._command(record, now_ms)
        outcome = self.decide(command, cause=f"{topic}:{partition}:{offset}")
        if outcome.rejected is not None:
            return dead(outcome.rejected.reason.value, outcome.rejected.message, job_id)
        return outcome

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

    def tick(self, job_id: str, now_ms: int) -> Outcome:
        """Let time pass for one job."""
        return self.decide(Tick(job_id, now_ms), cause=None)

    def due(self, now_ms: int) -> list[str]:
        """Jobs for which a tick at ``now_ms`` can change something."""
        return [
            job_id
            for job_id, state in self.states.items()
            if (at := due_at(state)) is not None and at <= now_ms
        ]

    def decide(self, command: Command, cause: str | None) -> Outcome:
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
        headers = ((CAUSE_HEADER, cause.encode()),) if cause else ()
        barriers: list[Outgoing] = []
        for event, after in steps:
            assert not isinstance(event, InputRejected)
            self.stats[job_id] = track(self.stats.get(job_id), state, event)
            self.states[job_id] = state = after  # what _apply(event) would leave, without a second evolve
            outcome.journal.append(event)
            outcome.messages.append(
                Outgoing(self.topics.checkpoints, job_id.encode(), self.codec.encode(event), headers)
            )
            if isinstance(event, CheckpointTriggered):
                barriers.append(self._barrier(event, event.timestamp_ms))
        outcome.messages.extend(barriers)
        return outcome

    def _apply(self, event: JournalEvent) -> None:
        job_id = event.job_id
        state = self.states.get(job_id) or initial_state(job_id)
        self.states[job_id] = evolve(state, event)
        self.stats[job_id] = track(self.stats.get(job_id), state, event)

    def _barrier(self, triggered: CheckpointTriggered, now_ms: int) -> Outgoing:
        barrier = CheckpointBarrier(
            job_id=triggered.job_id,
            checkpoint_id=triggered.checkpoint_id,
            attempt=triggered.attempt,
            kind=triggered.kind,
            timestamp_ms=now_ms,
            location=triggered.location,
        )
        return Outgoing(self.topics.barriers, triggered.job_id.encode(), self.codec.encode(barrier))
