"""The coordinator's state of one job: what folding its journal gives.

Everything here is derived from journal events only (see ``evolve``); nothing
is read from a clock, a broker or a file.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from enum import StrEnum
from typing import Any, TypeAlias, TypeVar, cast

from immutables import Map

from events.wire.records import (
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointKind,
    CheckpointRequestQueued,
    CheckpointRestored,
    CheckpointTriggered,
    ExecutionState,
    JobRestartScheduled,
    JobStatus,
    TaskAcknowledged,
)


class Reason(StrEnum):
    """Flink's ``CheckpointFailureReason`` names that cutline uses."""

    CHECKPOINT_EXPIRED = "CHECKPOINT_EXPIRED"
    CHECKPOINT_DECLINED = "CHECKPOINT_DECLINED"
    CHECKPOINT_SUBSUMED = "CHECKPOINT_SUBSUMED"
    CHECKPOINT_COORDINATOR_SUSPEND = "CHECKPOINT_COORDINATOR_SUSPEND"
    TASK_FAILURE = "TASK_FAILURE"
    TASK_CHECKPOINT_FAILURE = "TASK_CHECKPOINT_FAILURE"
    IO_EXCEPTION = "IO_EXCEPTION"
    CHECKPOINT_ASYNC_EXCEPTION = "CHECKPOINT_ASYNC_EXCEPTION"
    FINALIZE_CHECKPOINT_FAILURE = "FINALIZE_CHECKPOINT_FAILURE"
    MINIMUM_TIME_BETWEEN_CHECKPOINTS = "MINIMUM_TIME_BETWEEN_CHECKPOINTS"
    TOO_MANY_CONCURRENT_CHECKPOINTS = "TOO_MANY_CONCURRENT_CHECKPOINTS"
    TOO_MANY_CHECKPOINT_REQUESTS = "TOO_MANY_CHECKPOINT_REQUESTS"
    NOT_ALL_REQUIRED_TASKS_RUNNING = "NOT_ALL_REQUIRED_TASKS_RUNNING"
    PERIODIC_SCHEDULER_SHUTDOWN = "PERIODIC_SCHEDULER_SHUTDOWN"
    EXCEEDED_TOLERABLE_FAILURES = "EXCEEDED_CHECKPOINT_TOLERABLE_FAILURE_THRESHOLD"
    SAVEPOINT_TARGET_NOT_ALLOWED = "SAVEPOINT_TARGET_NOT_ALLOWED"
    """Not Flink's: the target is outside the coordinator's savepoint roots (docs/security.md)."""
    JOB_STOPPING = "JOB_STOPPING"
    """Not Flink's: a stop-with-savepoint is under way, so nothing else is triggered (Flink stops its
    scheduler for it the same way)."""


COUNTED_REASONS = frozenset(
    {
        Reason.CHECKPOINT_EXPIRED,
        Reason.CHECKPOINT_DECLINED,
        Reason.TASK_CHECKPOINT_FAILURE,
        Reason.IO_EXCEPTION,
        Reason.CHECKPOINT_ASYNC_EXCEPTION,
        Reason.FINALIZE_CHECKPOINT_FAILURE,
    }
)
"""Reasons that count towards ``tolerable_failures`` (Flink's CheckpointFailureManager)."""

MAX_QUEUED_REQUESTS = 1000
"""Flink caps its request queue at 1000 entries."""

MAX_PENDING_SAVEPOINTS = 16
"""Savepoints one job may have pending at once. They skip ``max_concurrent`` (as in Flink), so
without a bound every savepoint request adds a pending checkpoint, with its acks, to the job's
state in the partition snapshot; a request past it is a journaled ``TriggerRejected``
(``TOO_MANY_CHECKPOINT_REQUESTS``)."""

MAX_CONCURRENT_CHECKPOINTS = 64
"""Largest ``max_concurrent`` a job may configure: every pending checkpoint's acks are part of the
job's state in the partition snapshot (Flink's default is 1)."""

_K = TypeVar("_K")
_V = TypeVar("_V")

FrozenMap: TypeAlias = Map
"""The state's mappings: immutable, and ``set``/``delete`` return a new map that shares all but
O(log n) of the old one (a hash array mapped trie), so recording one ack does not copy the acks
of every other task. Equal only to another ``FrozenMap`` (never to a ``dict``); iteration order
follows the keys' hashes, so code that shows or decides anything from an iteration sorts first."""


def frozen_map(items: Mapping[_K, _V] | Iterable[tuple[_K, _V]] = ()) -> FrozenMap[_K, _V]:
    """A :data:`FrozenMap` of ``items``: every mapping in a :class:`JobState` is built here."""
    return Map(items)


@dataclass(frozen=True, slots=True)
class PendingCheckpoint:
    """A triggered checkpoint and the acknowledgements it has so far."""

    triggered: CheckpointTriggered
    acks: FrozenMap[str, TaskAcknowledged] = field(default_factory=frozen_map)
    task_ids: frozenset[str] = field(kw_only=True, metadata={"derived": True})
    """``triggered.tasks`` as a set, for the membership test of every ack in O(1) (derived, as
    :attr:`JobState.task_ids`)."""

    @property
    def checkpoint_id(self) -> int:
        return self.triggered.checkpoint_id

    @property
    def is_savepoint(self) -> bool:
        return self.triggered.kind is CheckpointKind.SAVEPOINT

    @property
    def fully_acknowledged(self) -> bool:
        return len(self.acks) == len(self.triggered.tasks)


@dataclass(frozen=True, slots=True)
class Scheduler:
    """The periodic scheduler while the job runs; ``next_trigger_ms`` is None when periodic
    checkpoints are off (``interval_ms <= 0``)."""

    next_trigger_ms: int | None


@dataclass(frozen=True)  # no slots: ``replacer`` copies a wide state faster through its dict
class JobState:
    """Checkpoint state of one job.

    ``status is None`` means no job status was ever reported: the job is unknown
    and its acks, declines and requests are refused. ``scheduler is None`` means
    periodic triggering is stopped.
    """

    job_id: str
    status: JobStatus | None = None
    attempt: int = 0
    tasks: tuple[str, ...] = ()
    config: CheckpointConfig | None = None
    tasks_not_running: FrozenMap[str, ExecutionState] = field(default_factory=frozen_map)
    scheduler: Scheduler | None = None
    next_checkpoint_id: int = 1
    pending: FrozenMap[int, PendingCheckpoint] = field(default_factory=frozen_map)
    queue: tuple[CheckpointRequestQueued, ...] = ()
    completed: tuple[CheckpointCompleted, ...] = ()
    latest_savepoint: CheckpointCompleted | None = None
    last_completion_ms: int | None = None
    last_completed_id: int = 0
    failures: int = 0
    restored: CheckpointRestored | None = None
    heartbeat_deadline_ms: int | None = None
    """Without a heartbeat of the attempt by then the job is FAILING; None before its first one."""
    restarts: int = 0
    """The restart strategy's count (fixed-delay: restarts so far; exponential-delay: since its reset)."""
    backoff_ms: int = 0
    """exponential-delay: the current backoff before jitter; 0 before the first failure."""
    last_failure_ms: int | None = None
    failure_times: tuple[int, ...] = ()
    """failure-rate: the times of the latest failures (at most ``max_failures_per_interval + 1``)."""
    restart: JobRestartScheduled | None = None
    """The restart the strategy scheduled, until an attempt runs again."""
    stop: CheckpointTriggered | None = None
    """The trigger of the stop-with-savepoint under way (``cutline stop``), until it aborts (the job
    keeps running) or the job leaves RUNNING: meanwhile nothing else is triggered, and after the
    savepoint completes the job only waits for its driver to report FINISHED."""
    task_ids: frozenset[str] = field(default=frozenset(), kw_only=True, metadata={"derived": True})
    """``tasks`` as a set, set with ``tasks`` (every ack's membership test in O(1)). Derived: not
    shown by :func:`state_json` and not in a snapshot, which builds it again from ``tasks``."""

    @property
    def known(self) -> bool:
        return self.status is not None

    @property
    def latest_completed(self) -> CheckpointCompleted | None:
        """The newest retained checkpoint (savepoints excluded): what a restart restores."""
        return self.completed[-1] if self.completed else None

    @property
    def pending_savepoints(self) -> int:
        """Pending savepoints (they skip ``max_concurrent``; :data:`MAX_PENDING_SAVEPOINTS` bounds them)."""
        return sum(1 for p in self.pending.values() if p.is_savepoint)

    @property
    def pending_checkpoints(self) -> int:
        """Pending checkpoints that count towards ``max_concurrent`` (savepoints do not)."""
        return sum(1 for p in self.pending.values() if not p.is_savepoint)

    @property
    def all_tasks_running(self) -> bool:
        return self.status is JobStatus.RUNNING and not self.tasks_not_running


def pending_checkpoint(
    triggered: CheckpointTriggered, acks: FrozenMap[str, TaskAcknowledged] | None = None
) -> PendingCheckpoint:
    """A :class:`PendingCheckpoint` of ``triggered`` with its task set built from its tasks."""
    acks = frozen_map() if acks is None else acks
    return PendingCheckpoint(triggered, acks, task_ids=frozenset(triggered.tasks))


def with_tasks(tasks: tuple[str, ...]) -> dict[str, Any]:
    """The fields of a :class:`JobState` that hold its tasks: ``JobState(job_id, **with_tasks(t))``."""
    return {"tasks": tasks, "task_ids": frozenset(tasks)}


def initial_state(job_id: str) -> JobState:
    """The state of a job nothing is known about yet."""
    return JobState(job_id=job_id)


def state_json(state: JobState) -> dict[str, Any]:
    """The state as plain JSON data (for the web view and for comparing states across processes)."""
    return cast(dict[str, Any], json.loads(json.dumps(_plain(state), sort_keys=True)))


def _plain(value: Any) -> Any:
    """``dataclasses.asdict`` that also turns a :data:`FrozenMap` into a dict (``asdict`` copies
    any mapping but a dict as it is, which JSON cannot encode); bytes (inline state) become base64."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if is_dataclass(value) and not isinstance(value, type):
        shown = (f for f in fields(value) if not f.metadata.get("derived"))
        return {f.name: _plain(getattr(value, f.name)) for f in shown}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
