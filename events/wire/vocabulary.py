"""The wire vocabulary: every header name and every reason code cutline puts on Kafka, each defined once.

Topic names are in :mod:`events.wire.topics` (:class:`~events.wire.topics.Topics`); the bytes of a record are
in :mod:`events.wire.codec` and docs/wire-format.md. This module holds the remaining words a reader of
the topics meets: the Kafka headers, the reasons of dead letters, and the reasons tasks decline with.

The reasons the decider refuses an input with, :class:`Rejection`, are here too, so the wire's
vocabulary is complete in ``events`` and ``events`` imports nothing of ``coordinator``
(tests/unit/test_layers.py); ``coordinator.core.checks`` and ``coordinator.core.decider`` use them.

Pure: the standard library only (tests/unit/test_layers.py).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = [
    "CAUSE_HEADER",
    "EPOCH_HEADER",
    "GENERATION_HEADER",
    "SNAPSHOT_OFFSET_HEADER",
    "SNAPSHOT_PARTITIONS_HEADER",
    "DeadLetterReason",
    "DeclineReason",
    "Rejection",
]

# Headers ------------------------------------------------------------------------------------------

EPOCH_HEADER: Final = "cutline.epoch"
"""Kafka header of every journal and barrier record: the writer's claim epoch, ASCII decimal
(docs/design.md, "The fencing rule"); an ack or decline copies its barrier's."""

CAUSE_HEADER: Final = "cutline-cause"
"""Journal message header naming the input that caused the event: ``topic:partition:offset``. Only
on events decided from an input: those of a tick (periodic triggers, expiries) have none.

Spelled with a hyphen, unlike the other headers: journals already written carry it so."""

GENERATION_HEADER: Final = "cutline.generation"
"""Header of a ``CoordinatorClaimed``: the consumer-group generation its worker claimed for
(ASCII decimal). A claim without it is of an unknown generation."""

SNAPSHOT_OFFSET_HEADER: Final = "cutline.journal-offset"
"""Header of a fold snapshot (the coordinator's snapshots topic): the last journal offset it covers
(ASCII decimal)."""

SNAPSHOT_PARTITIONS_HEADER: Final = "cutline.partitions"
"""Header of a fold snapshot: the partition count its writer worked jobs' partitions out with. A
snapshot holds the jobs that hash to its partition under that count, so under another count it may
lack some."""


# Reasons ------------------------------------------------------------------------------------------


class DeadLetterReason(StrEnum):
    """Why the coordinator's shell sent an input to the dead-letter topic, before or around the
    decider. The decider's own refusals are :class:`Rejection` (re-exported here)."""

    # A frame that is not a record (events.wire.codec's DecodeError and its kinds)
    UNDECODABLE = "UNDECODABLE"
    TRUNCATED_FRAME = "TRUNCATED_FRAME"
    BAD_MAGIC = "BAD_MAGIC"
    UNKNOWN_SCHEMA = "UNKNOWN_SCHEMA"
    BODY_MISMATCH = "BODY_MISMATCH"
    UNKNOWN_SCHEMA_ID = "UNKNOWN_SCHEMA_ID"
    """A Confluent-framed value whose schema id the registry does not know, or whose schema is not
    one of cutline's."""

    # A record in the wrong place
    EMPTY_MESSAGE = "EMPTY_MESSAGE"
    """The message has no value (a tombstone?)."""
    WRONG_TOPIC = "WRONG_TOPIC"
    """A record type the topic does not carry."""
    MISSING_KEY = "MISSING_KEY"
    KEY_MISMATCH = "KEY_MISMATCH"
    """The message key is not the record's ``job_id``."""
    WRONG_PARTITION = "WRONG_PARTITION"
    """An input in another partition than its job's (a producer that does not hash keys with
    murmur2): the worker that owns the job would never see it."""

    # Fencing
    STALE_EPOCH = "STALE_EPOCH"
    """An ack or decline answering a barrier of a superseded coordinator epoch."""
    VOID_EPOCH = "VOID_EPOCH"
    """An ack or decline whose ``cutline.epoch`` headers are doubled or malformed: void under the
    fencing rule, it answers no barrier anyone can name."""

    # A latency measurement (events.task.latency.measurement_problem)
    INVALID_LATENCY = "INVALID_LATENCY"
    """A ``LatencyMeasured`` with an id over its bound or a negative subtask index."""

    INTERNAL_ERROR = "INTERNAL_ERROR"
    """An input whose handling raised: a bug, or input no check foresaw."""


class DeclineReason(StrEnum):
    """Reasons a task declines a checkpoint with (``CheckpointDeclined.reason``), Flink's names."""

    TASK_CHECKPOINT_FAILURE = "TASK_CHECKPOINT_FAILURE"
    IO_EXCEPTION = "IO_EXCEPTION"


class Rejection(StrEnum):
    """Why an input was refused and sent to the dead-letter topic."""

    UNKNOWN_JOB = "UNKNOWN_JOB"
    STALE_ATTEMPT = "STALE_ATTEMPT"
    UNKNOWN_ATTEMPT = "UNKNOWN_ATTEMPT"
    UNKNOWN_TASK = "UNKNOWN_TASK"
    INVALID_ID = "INVALID_ID"
    UNKNOWN_CHECKPOINT = "UNKNOWN_CHECKPOINT"
    INVALID_OFFSETS = "INVALID_OFFSETS"
    STATE_OUTSIDE_LOCATION = "STATE_OUTSIDE_LOCATION"
    INVALID_STATE_HANDLE = "INVALID_STATE_HANDLE"
    INVALID_METRICS = "INVALID_METRICS"
    SAVEPOINT_TARGET_NOT_ALLOWED = "SAVEPOINT_TARGET_NOT_ALLOWED"
    """Only the shell's symbolic-link check uses it; the decider's own refusal is a journaled
    ``TriggerRejected`` with the same name."""
    INVALID_CONFIG = "INVALID_CONFIG"
    INVALID_STATUS = "INVALID_STATUS"
    INVALID_REQUEST = "INVALID_REQUEST"
    """A checkpoint, stop or cancel request with a field over its bound (docs/wire-format.md,
    "Bounds") or a target on a plain checkpoint."""
    RECORD_TOO_LARGE = "RECORD_TOO_LARGE"
    """Only the shell uses it: the input's decision would write a record over its topic's
    ``max.message.bytes`` (docs/design.md, "Record sizes"); nothing of it is journaled."""
