"""Commands: what the coordinator is asked to do, each with the time (and randomness) as data.

The shell wraps every input record in a command and stamps it with its own
clock, so ``decide`` never reads a clock or a random generator and folding the
journal always reproduces the same state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

from events.wire.codegen import fast_init
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointDeclined,
    CheckpointRequested,
    JobCancelRequested,
    JobHeartbeat,
    JobStatusChanged,
    JobStopRequested,
    TaskStatusChanged,
)

Links: TypeAlias = Mapping[str, str] | None
"""``links`` of an ack, a checkpoint request and a stop: the shell's answer, asked before deciding
(:mod:`coordinator.core.links`), about the ``file:`` paths the decision would accept or write: each one
that leads out of where it must stay through a symbolic link, with the real path it resolves to
(None: none does, or nothing was asked). The decider refuses on it as on any other input check, so
``decide`` stays pure."""


@dataclass(frozen=True, slots=True)
class ChangeJobStatus:
    """Apply a job status report.

    ``jitter`` in ``[0, 1)`` picks the first periodic trigger's delay in
    ``[min_pause, base_interval]`` (Flink draws it from a random generator).
    """

    changed: JobStatusChanged
    now_ms: int
    jitter: float = 0.0

    @property
    def job_id(self) -> str:
        return self.changed.job_id


@dataclass(frozen=True, slots=True)
class ChangeTaskStatus:
    """Apply one task's status report."""

    changed: TaskStatusChanged
    now_ms: int

    @property
    def job_id(self) -> str:
        return self.changed.job_id


@dataclass(frozen=True, slots=True)
class RequestCheckpoint:
    """Trigger a manual checkpoint or a savepoint.

    ``savepoint_roots`` are the storage URIs savepoint targets must lie in (the coordinator's
    ``--savepoint-root`` options); empty means the parent of the job's checkpoint location. They
    travel in the command so that ``decide`` stays pure; the decision (a trigger or a
    ``TriggerRejected``) is journaled, so replay never needs them.
    """

    request: CheckpointRequested
    now_ms: int
    savepoint_roots: tuple[str, ...] = ()
    links: Links = None

    @property
    def job_id(self) -> str:
        return self.request.job_id


@dataclass(frozen=True, slots=True)
class StopJob:
    """Stop the job with a savepoint (Flink's stop-with-savepoint): ``savepoint_roots`` as in
    :class:`RequestCheckpoint`."""

    request: JobStopRequested
    now_ms: int
    savepoint_roots: tuple[str, ...] = ()
    links: Links = None

    @property
    def job_id(self) -> str:
        return self.request.job_id


@dataclass(frozen=True, slots=True)
class CancelJob:
    """Cancel the job: its driver stops and reports CANCELED."""

    request: JobCancelRequested
    now_ms: int

    @property
    def job_id(self) -> str:
        return self.request.job_id


@fast_init
@dataclass(frozen=True, slots=True)
class AcknowledgeCheckpoint:
    """Record a task's acknowledgement (and complete the checkpoint if it was the last);
    ``links``: see :data:`Links`."""

    ack: CheckpointAcknowledged
    now_ms: int
    links: Links = None

    @property
    def job_id(self) -> str:
        return self.ack.job_id


@dataclass(frozen=True, slots=True)
class DeclineCheckpoint:
    """Abort a checkpoint a task could not snapshot."""

    decline: CheckpointDeclined
    now_ms: int

    @property
    def job_id(self) -> str:
        return self.decline.job_id


@dataclass(frozen=True, slots=True)
class RecordHeartbeat:
    """Note that the job's driver is alive: the heartbeat deadline moves on."""

    heartbeat: JobHeartbeat
    now_ms: int

    @property
    def job_id(self) -> str:
        return self.heartbeat.job_id


@dataclass(frozen=True, slots=True)
class Tick:
    """Let time pass to ``now_ms``: a missed heartbeat fails the job, overdue checkpoints expire,
    the periodic trigger fires. ``jitter`` in ``[0, 1]`` picks a restart delay's jitter."""

    job_id: str
    now_ms: int
    jitter: float = 0.0


Command: TypeAlias = (
    ChangeJobStatus
    | ChangeTaskStatus
    | RequestCheckpoint
    | StopJob
    | CancelJob
    | AcknowledgeCheckpoint
    | DeclineCheckpoint
    | RecordHeartbeat
    | Tick
)
"""Everything ``decide`` accepts."""
