"""The records of the wire protocol (docs/design.md, "Wire protocol"), one frozen dataclass per Avro record.

Class and field names match ``schemas/cutline.<Name>.avsc`` exactly; the codec
(:mod:`events.wire.codec`) maps between the two. Input records are what jobs, tasks
and operators send; journal records are what the coordinator decided. Past
tense throughout: every record states a fact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeAlias

from events.wire.codegen import fast_init


class JobStatus(StrEnum):
    """Flink's ``JobStatus``."""

    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELED = "CANCELED"
    FINISHED = "FINISHED"
    RESTARTING = "RESTARTING"
    SUSPENDED = "SUSPENDED"
    INITIALIZING = "INITIALIZING"
    RECONCILING = "RECONCILING"


class ExecutionState(StrEnum):
    """Flink's ``ExecutionState`` of one task."""

    CREATED = "CREATED"
    SCHEDULED = "SCHEDULED"
    DEPLOYING = "DEPLOYING"
    INITIALIZING = "INITIALIZING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"
    FAILED = "FAILED"
    RECONCILING = "RECONCILING"


class CheckpointKind(StrEnum):
    """A checkpoint (periodic or manual) or a savepoint."""

    CHECKPOINT = "CHECKPOINT"
    SAVEPOINT = "SAVEPOINT"


class RestartStrategyKind(StrEnum):
    """Flink's ``restart-strategy.type`` (the symbol is Flink's name in capitals, ``-`` as ``_``)."""

    NONE = "NONE"
    FIXED_DELAY = "FIXED_DELAY"
    EXPONENTIAL_DELAY = "EXPONENTIAL_DELAY"
    FAILURE_RATE = "FAILURE_RATE"

    @property
    def flink_name(self) -> str:
        """``none``, ``fixed-delay``, ``exponential-delay`` or ``failure-rate``."""
        return self.value.lower().replace("_", "-")


UNLIMITED_ATTEMPTS = 2**31 - 1
"""Flink's ``Integer.MAX_VALUE``: attempts that never run out."""


@dataclass(frozen=True, slots=True)
class RestartStrategy:
    """How a failed job is restarted, after Flink's ``restart-strategy.*`` options.

    ``kind`` picks the strategy; each reads its own fields: ``fixed-delay`` restarts
    ``attempts`` times after ``delay_ms``; ``exponential-delay`` waits ``initial_backoff_ms``,
    then ``backoff_multiplier`` times longer after each failure up to ``max_backoff_ms`` (±
    ``jitter_factor``), back to the initial backoff after ``reset_backoff_threshold_ms``
    without a failure, and gives up after ``attempts_before_reset_backoff`` restarts in a row;
    ``failure-rate`` restarts after ``delay_ms`` unless more than
    ``max_failures_per_interval`` failures fall in ``failure_rate_interval_ms``; ``none``
    never restarts. The defaults are Flink's.
    """

    kind: RestartStrategyKind = RestartStrategyKind.EXPONENTIAL_DELAY
    attempts: int = 1
    delay_ms: int = 1_000
    initial_backoff_ms: int = 1_000
    max_backoff_ms: int = 60_000
    backoff_multiplier: float = 1.5
    reset_backoff_threshold_ms: int = 3_600_000
    jitter_factor: float = 0.1
    attempts_before_reset_backoff: int = UNLIMITED_ATTEMPTS
    max_failures_per_interval: int = 1
    failure_rate_interval_ms: int = 60_000


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """A job's checkpointing configuration, after Flink's ``execution.checkpointing.*``.

    ``interval_ms <= 0`` turns periodic checkpoints off (manual checkpoints and
    savepoints still work). ``location`` is the storage root URI.
    """

    interval_ms: int
    location: str
    timeout_ms: int = 600_000
    min_pause_ms: int = 0
    max_concurrent: int = 1
    tolerable_failures: int = 0
    retained: int = 1
    heartbeat_interval_ms: int = 10_000
    """How often the job's driver sends a ``JobHeartbeat`` (Flink's heartbeat.interval)."""
    heartbeat_timeout_ms: int = 50_000
    """No heartbeat for this long after the first one: the job is FAILING (heartbeat.timeout)."""
    restart_strategy: RestartStrategy = RestartStrategy()
    inline_threshold_bytes: int = 0
    """Snapshots up to this size ride inside the ack instead of a file of their own (Flink's
    ``state.storage.fs.memory-threshold``); 0 writes every snapshot to a file."""

    @property
    def base_interval_ms(self) -> int:
        """Flink's ``baseInterval = max(interval, minPause)``."""
        return max(self.interval_ms, self.min_pause_ms)


@dataclass(frozen=True, slots=True)
class StateHandle:
    """Where one task's snapshot of one checkpoint was written, and its digest.

    ``inline`` holds the snapshot's bytes themselves when it was small enough to travel in the ack
    (Flink's ``ByteStreamStateHandle``); then nothing was written at ``uri``, which only names it.
    """

    uri: str
    size_bytes: int
    sha256: str
    inline: bytes | None = None


# ---------------------------------------------------------------- input records


@dataclass(frozen=True, slots=True)
class JobStatusChanged:
    """A job driver reports its job's status.

    RUNNING carries the tasks that must acknowledge every checkpoint and the
    config; ``attempt`` grows on every restart. A RUNNING attempt that restored
    state names the checkpoint it restored from.
    """

    job_id: str
    status: JobStatus
    timestamp_ms: int
    attempt: int
    tasks: tuple[str, ...] = ()
    config: CheckpointConfig | None = None
    error: str | None = None
    restored_checkpoint_id: int | None = None
    restored_location: str | None = None


@dataclass(frozen=True, slots=True)
class TaskStatusChanged:
    """One task changed its execution state (FAILED aborts what it has not acknowledged)."""

    job_id: str
    task_id: str
    attempt: int
    status: ExecutionState
    timestamp_ms: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CheckpointRequested:
    """An operator asks for a manual checkpoint or a savepoint (to ``target``)."""

    job_id: str
    kind: CheckpointKind
    timestamp_ms: int
    request_id: str
    target: str | None = None


@dataclass(frozen=True, slots=True)
class JobStopRequested:
    """An operator asks to stop the job with a savepoint into ``target`` (Flink's ``flink stop``).

    The coordinator triggers a savepoint whose barrier tells the tasks to read nothing after its
    cut; when it completes the job stops (FINISHED), when it fails the job keeps running. With
    ``drain`` the tasks treat the cut as the end of their input (Flink's ``--drain``).
    """

    job_id: str
    timestamp_ms: int
    request_id: str
    target: str | None = None
    drain: bool = False


@dataclass(frozen=True, slots=True)
class JobCancelRequested:
    """An operator asks to cancel the job (Flink's ``flink cancel``): no savepoint; the job's
    driver stops and reports CANCELED."""

    job_id: str
    timestamp_ms: int
    request_id: str


@dataclass(frozen=True, slots=True)
class CheckpointBarrier:
    """Tells every task of a job to snapshot for checkpoint ``checkpoint_id`` into ``location``."""

    job_id: str
    checkpoint_id: int
    attempt: int
    kind: CheckpointKind
    timestamp_ms: int
    location: str
    inline_limit_bytes: int = 0
    """A snapshot up to this size may ride inline in the ack (``StateHandle.inline``); 0: none."""
    stop: bool = False
    """A stop-with-savepoint (Flink's synchronous savepoint): the tasks read nothing after this cut;
    when it completes the job stops and reports FINISHED, when it fails the job keeps running."""
    drain: bool = False
    """With ``stop``: the tasks treat the cut as the end of their input (Flink's ``--drain``)."""


@dataclass(frozen=True, slots=True)
class CheckpointAcknowledged:
    """A task committed its snapshot; ``offsets`` maps ``topic:partition`` to the next offset."""

    job_id: str
    checkpoint_id: int
    attempt: int
    task_id: str
    timestamp_ms: int
    state: StateHandle | None = None
    offsets: Mapping[str, int] = field(default_factory=dict)
    metrics: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CheckpointDeclined:
    """A task could not snapshot a checkpoint; the checkpoint aborts (CHECKPOINT_DECLINED)."""

    job_id: str
    checkpoint_id: int
    attempt: int
    task_id: str
    timestamp_ms: int
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class JobHeartbeat:
    """The driver of attempt ``attempt`` is alive (sent every ``heartbeat_interval_ms`` on job-status)."""

    job_id: str
    attempt: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class LatencyMeasured:
    """A latency marker of the job's source reached one operator subtask (Flink's ``LatencyMarker``
    as its ``LatencyStats`` record it): the latency is ``timestamp_ms - marked_time_ms``.

    Tasks send it on the acks topic; the coordinator folds it into the job's latency histograms
    (:mod:`events.task.latency`) and journals nothing.
    """

    job_id: str
    attempt: int
    timestamp_ms: int
    marked_time_ms: int
    source_id: str
    source_subtask_index: int
    operator_id: str
    operator_subtask_index: int


InputRecord: TypeAlias = (
    JobStatusChanged
    | TaskStatusChanged
    | CheckpointRequested
    | JobStopRequested
    | JobCancelRequested
    | CheckpointAcknowledged
    | CheckpointDeclined
    | JobHeartbeat
    | LatencyMeasured
)
"""What the coordinator reads from its input topics."""

# -------------------------------------------------------------- journal records


@dataclass(frozen=True, slots=True)
class SchedulerStarted:
    """The job is RUNNING with ``tasks``: periodic checkpoints start at ``next_trigger_ms``."""

    job_id: str
    attempt: int
    timestamp_ms: int
    tasks: tuple[str, ...]
    config: CheckpointConfig
    next_trigger_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SchedulerStopped:
    """The job left RUNNING (``status``) or restarted: no more periodic triggers, queue dropped."""

    job_id: str
    attempt: int
    timestamp_ms: int
    status: JobStatus
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TaskStatusRecorded:
    """An accepted task status change of the current attempt."""

    job_id: str
    task_id: str
    attempt: int
    status: ExecutionState
    timestamp_ms: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CheckpointRequestQueued:
    """A trigger request waits: ``max_concurrent`` checkpoints are pending."""

    job_id: str
    kind: CheckpointKind
    periodic: bool
    timestamp_ms: int
    request_id: str | None = None
    target: str | None = None
    next_trigger_ms: int | None = None


@dataclass(frozen=True, slots=True)
class CheckpointTriggered:
    """Checkpoint ``checkpoint_id`` is pending until every task in ``tasks`` acknowledges it."""

    job_id: str
    checkpoint_id: int
    attempt: int
    kind: CheckpointKind
    timestamp_ms: int
    location: str
    tasks: tuple[str, ...]
    deadline_ms: int
    periodic: bool = False
    request_id: str | None = None
    next_trigger_ms: int | None = None
    inline_limit_bytes: int = 0
    """The largest snapshot a task may send inline for this checkpoint (its barrier says so)."""
    stop: bool = False
    """A stop-with-savepoint (Flink's synchronous savepoint): the tasks read nothing after this cut;
    when it completes the job stops and reports FINISHED, when it fails the job keeps running."""
    drain: bool = False
    """With ``stop``: the tasks treat the cut as the end of their input (Flink's ``--drain``)."""


@fast_init
@dataclass(frozen=True, slots=True)
class TaskAcknowledged:
    """An accepted acknowledgement of a pending checkpoint."""

    job_id: str
    checkpoint_id: int
    attempt: int
    task_id: str
    timestamp_ms: int
    state: StateHandle | None = None
    offsets: Mapping[str, int] = field(default_factory=dict)
    metrics: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CheckpointCompleted:
    """Every task acknowledged: the checkpoint is durable and tasks may commit ``offsets``."""

    job_id: str
    checkpoint_id: int
    kind: CheckpointKind
    timestamp_ms: int
    duration_ms: int
    handles: Mapping[str, StateHandle]
    size_bytes: int
    offsets: Mapping[str, int]
    attempt: int = 0
    location: str = ""
    metadata: StateHandle | None = None
    """Set when the completion did not fit in one journal record (docs/design.md, "Record sizes"): its handles
    and offsets are in this metadata object (``<location>/_metadata``, the full completion as one
    Avro single-object frame), and ``handles`` and ``offsets`` here are empty. Readers resolve it
    with :func:`events.task.completion_metadata.resolve_completion`."""

    @property
    def by_reference(self) -> bool:
        """Whether the handles and offsets are in the metadata object rather than here."""
        return self.metadata is not None


@dataclass(frozen=True, slots=True)
class CheckpointAborted:
    """A pending checkpoint ended without completing, for ``reason`` (a Flink failure reason)."""

    job_id: str
    checkpoint_id: int
    timestamp_ms: int
    reason: str
    message: str
    task_id: str | None = None
    counts_as_failure: bool = False


@dataclass(frozen=True, slots=True)
class TriggerRejected:
    """A trigger request was refused before it used a checkpoint id."""

    job_id: str
    reason: str
    request_id: str | None = None
    timestamp_ms: int = 0
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    periodic: bool = False
    message: str = ""
    next_trigger_ms: int | None = None


@dataclass(frozen=True, slots=True)
class CheckpointFailureThresholdExceeded:
    """More than ``tolerable`` checkpoints failed in a row; the job driver fails the job."""

    job_id: str
    checkpoint_id: int
    timestamp_ms: int
    failures: int
    tolerable: int
    reason: str


@dataclass(frozen=True, slots=True)
class CheckpointRestored:
    """The job restored from ``checkpoint_id``; ids continue after it."""

    job_id: str
    checkpoint_id: int
    attempt: int
    timestamp_ms: int
    location: str | None = None


@dataclass(frozen=True, slots=True)
class JobHeartbeatRecorded:
    """A heartbeat of the current attempt: without another by ``deadline_ms`` the job is FAILING."""

    job_id: str
    attempt: int
    timestamp_ms: int
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class JobRestartScheduled:
    """The restart strategy restarts the failed job: attempt ``attempt`` starts after ``delay_ms``.

    It restores ``restore_checkpoint_id`` at ``restore_location`` (None: no completed checkpoint,
    it starts empty). ``restarts`` and ``backoff_ms`` are the strategy's count and current backoff
    after this failure; ``failure`` says what failed.
    """

    job_id: str
    attempt: int
    timestamp_ms: int
    delay_ms: int
    failure: str
    restarts: int
    backoff_ms: int = 0
    restore_checkpoint_id: int | None = None
    restore_location: str | None = None

    @property
    def restart_at_ms(self) -> int:
        return self.timestamp_ms + self.delay_ms


@dataclass(frozen=True, slots=True)
class JobFailedPermanently:
    """The restart strategy gives up: the job is FAILED and nothing restarts it."""

    job_id: str
    attempt: int
    timestamp_ms: int
    reason: str
    failure: str


JournalEvent: TypeAlias = (
    SchedulerStarted
    | SchedulerStopped
    | TaskStatusRecorded
    | CheckpointRequestQueued
    | CheckpointTriggered
    | TaskAcknowledged
    | CheckpointCompleted
    | CheckpointAborted
    | TriggerRejected
    | CheckpointFailureThresholdExceeded
    | CheckpointRestored
    | JobHeartbeatRecorded
    | JobRestartScheduled
    | JobFailedPermanently
)
"""Everything the coordinator appends to its journal; folding these gives its state."""

JOURNAL_RECORDS: tuple[type[JournalEvent], ...] = (
    SchedulerStarted,
    SchedulerStopped,
    TaskStatusRecorded,
    CheckpointRequestQueued,
    CheckpointTriggered,
    TaskAcknowledged,
    CheckpointCompleted,
    CheckpointAborted,
    TriggerRejected,
    CheckpointFailureThresholdExceeded,
    CheckpointRestored,
    JobHeartbeatRecorded,
    JobRestartScheduled,
    JobFailedPermanently,
)


@dataclass(frozen=True, slots=True)
class CoordinatorClaimed:
    """A coordinator worker took over journal ``partition`` with ``epoch``
    (docs/design.md, "Ownership and fencing").

    Not a job's event (no ``job_id``): it fences the partition. Every later record of the
    partition whose ``cutline.epoch`` header is lower than ``epoch`` is void; a claim whose
    epoch is not higher than the partition's current one is void itself.
    """

    partition: int
    epoch: int
    worker_id: str
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An input the coordinator could not decode or accept, kept whole with the reason."""

    topic: str
    partition: int
    offset: int
    reason: str
    message: str
    timestamp_ms: int
    key: bytes | None = None
    value: bytes | None = None
    job_id: str | None = None


Record: TypeAlias = InputRecord | CheckpointBarrier | JournalEvent | DeadLetter | CoordinatorClaimed
"""Every record type that travels on a cutline topic."""

RECORD_TYPES: tuple[type[Record], ...] = (
    JobStatusChanged,
    TaskStatusChanged,
    CheckpointRequested,
    CheckpointAcknowledged,
    CheckpointDeclined,
    JobHeartbeat,
    CheckpointBarrier,
    *JOURNAL_RECORDS,
    DeadLetter,
    CoordinatorClaimed,
    JobStopRequested,
    JobCancelRequested,
    LatencyMeasured,
)
