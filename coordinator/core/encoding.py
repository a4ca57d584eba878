"""A decision as what the shell publishes: journal records, barriers and ``_metadata`` objects.

:meth:`Encoder.encode` turns the decider's steps into the records of one input's outcome and the
state they leave, or refuses the input when a record would not fit its topic
(docs/design.md, "Record sizes"). Pure: it encodes and measures, and reads or writes nothing.

A completion too large for the journal goes by reference (Flink's ``_metadata``,
:mod:`events.wire.metadata`): its full record is a :class:`MetadataObject` of the outcome, which
the worker writes before the journal batch, and the journal carries the reference. The state is
the fold of what is journaled, so the steps after such a completion are evolved from it; the
others keep the decider's states. Whether the object would be written through a symbolic link
out of its checkpoint's directory was asked before deciding (:mod:`coordinator.core.links`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from coordinator.core.admission import journal_budget, too_large
from coordinator.core.checks import InputRejected, Rejection
from coordinator.core.commands import AcknowledgeCheckpoint, ChangeTaskStatus, Command
from coordinator.core.decider import Decision, barriers_owed, evolve
from coordinator.core.state import JobState
from coordinator.core.stats import CheckpointStats, track
from events.wire.codec import Codec
from events.wire.codegen import fast_init
from events.wire.fencing import epoch_header
from events.wire.metadata import by_reference, metadata_uri
from events.wire.records import (
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointTriggered,
    ExecutionState,
    JournalEvent,
    TaskAcknowledged,
)
from events.wire.sizes import TopicLimits, record_size
from events.wire.topics import Topics
from events.wire.vocabulary import CAUSE_HEADER

__all__ = ["Encoded", "Encoder", "MetadataObject", "Outgoing"]

Headers = tuple[tuple[str, bytes], ...]


@fast_init
@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish."""

    topic: str
    key: bytes
    value: bytes
    headers: Headers = ()


@dataclass(frozen=True, slots=True)
class MetadataObject:
    """A completion's full record (one Avro frame), to be written at ``uri`` before the journal
    record that refers to it."""

    uri: str
    frame: bytes


@dataclass(slots=True)
class Encoded:
    """One decision, encoded: its journal events (as journaled) and messages (journal first, then
    barriers), the metadata objects they refer to, and the job's state and statistics after it."""

    after: JobState
    stats: CheckpointStats | None
    journal: list[JournalEvent] = field(default_factory=list)
    messages: list[Outgoing] = field(default_factory=list)
    metadata: list[MetadataObject] = field(default_factory=list)


@functools.lru_cache(maxsize=64)
def _epoch_header(epoch: int) -> tuple[str, bytes]:
    """:func:`events.wire.fencing.epoch_header`, remembered: a worker writes under a few epochs only."""
    return epoch_header(epoch)


class Encoder:
    """Encodes decisions for ``topics`` with ``codec``, within the topics' ``limits``."""

    def __init__(self, topics: Topics, codec: Codec, limits: TopicLimits) -> None:
        self.topics, self.codec, self.limits = topics, codec, limits

    def encode(
        self,
        command: Command,
        state: JobState,
        stats: CheckpointStats | None,
        steps: Sequence[tuple[Decision, JobState]],
        epoch: int,
        cause: str | None,
        frame: bytes | None = None,
        links: Mapping[str, str] | None = None,
    ) -> Encoded | InputRejected:
        """The outcome of ``steps`` (decided from ``state`` for ``command``), under ``epoch``, caused by
        the input at ``cause``; ``frame``: the input the command was decoded from (an ack's journal
        record is made from it, :meth:`Codec.acknowledged`); ``links``: the file system's answers
        asked before deciding. An input whose records would not fit is refused (RECORD_TOO_LARGE)."""
        job_id = command.job_id
        headers = (_epoch_header(epoch), (CAUSE_HEADER, cause.encode())) if cause else (_epoch_header(epoch),)
        ack = command.ack if frame is not None and type(command) is AcknowledgeCheckpoint else None
        journal_topic, key = self.topics.checkpoints, job_id.encode()
        budget = journal_budget(command, self.limits.of(journal_topic))
        encoded = Encoded(state, stats)
        barriers: list[Outgoing] = []
        by_ref = False  # a completion went to its metadata object: later states are evolved from it
        for decided, next_state in steps:
            assert not isinstance(decided, InputRejected)
            event: JournalEvent = decided
            value = None
            if ack is not None and frame is not None and type(event) is TaskAcknowledged:
                value = self.codec.acknowledged(frame, ack, event, journal_topic)
            if value is None:
                value = self.codec.encode(event, journal_topic)
            if len(value) + len(key) + 1024 > budget and (size := record_size(key, value, headers)) > budget:
                fitted = self._by_reference(job_id, event, size, budget, key, headers, links or {})
                if isinstance(fitted, InputRejected):
                    return fitted
                event, value, written = fitted
                encoded.metadata.append(written)
                by_ref = True
            encoded.stats = track(encoded.stats, encoded.after, event)
            encoded.after = evolve(encoded.after, event) if by_ref else next_state
            encoded.journal.append(event)
            encoded.messages.append(Outgoing(journal_topic, key, value, headers))
            if isinstance(event, CheckpointTriggered):
                barrier = self.barrier(event, event.timestamp_ms, epoch)
                over = self.limits.over(barrier.topic, barrier.key, barrier.value, barrier.headers)
                if over is not None:
                    limit = self.limits.of(barrier.topic)
                    return _too_large(job_id, too_large("CheckpointBarrier", barrier.topic, over, limit))
                barriers.append(barrier)
        encoded.messages.extend(barriers)
        if type(command) is ChangeTaskStatus and command.changed.status is ExecutionState.RUNNING:
            # a task that started after some barriers were sent: it gets them again
            owed = barriers_owed(encoded.after, command.changed.task_id)
            encoded.messages.extend(self.barrier(t, command.now_ms, epoch) for t in owed)
        return encoded

    def _by_reference(
        self,
        job_id: str,
        event: JournalEvent,
        size: int,
        budget: int,
        key: bytes,
        headers: Headers,
        links: Mapping[str, str],
    ) -> tuple[CheckpointCompleted, bytes, MetadataObject] | InputRejected:
        """A journal record over the journal's limit: a completion goes by reference to its metadata
        object; anything else, a reference that does not fit either, or an object that would be
        written through a symbolic link out of its checkpoint's directory, is refused whole."""
        journal_topic = self.topics.checkpoints
        if type(event) is not CheckpointCompleted or event.metadata is not None:
            return _too_large(job_id, too_large(type(event).__name__, journal_topic, size, budget))
        resolved = links.get(metadata_uri(event.location))
        if resolved is not None:  # as for state handles: the coordinator writes no file through a link
            return InputRejected(
                job_id,
                Rejection.STATE_OUTSIDE_LOCATION,
                f"the metadata object of checkpoint {event.checkpoint_id} would be written to "
                f"{resolved!r} through a symbolic link, outside its location {event.location!r}: "
                "nothing was journaled",
            )
        frame = self.codec.encode(event)
        journaled = by_reference(event, frame)
        assert journaled.metadata is not None
        value = self.codec.encode(journaled, journal_topic)
        size = record_size(key, value, headers)
        if size > budget:
            return _too_large(job_id, too_large(type(event).__name__, journal_topic, size, budget))
        return journaled, value, MetadataObject(journaled.metadata.uri, frame)

    def barrier(self, triggered: CheckpointTriggered, now_ms: int, epoch: int = 0) -> Outgoing:
        """The barrier of ``triggered``, sent at ``now_ms`` under ``epoch``."""
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
        topic = self.topics.barriers
        return Outgoing(
            topic, triggered.job_id.encode(), self.codec.encode(barrier, topic), (_epoch_header(epoch),)
        )


def _too_large(job_id: str, message: str) -> InputRejected:
    """A decision that would not fit its topic: refused, nothing journaled, no state changed."""
    return InputRejected(job_id, Rejection.RECORD_TOO_LARGE, message)
