"""The pure checkpoint coordinator: ``decide`` what happens, ``evolve`` the state, ``fold`` a journal.

No clock, broker, file or random generator is touched here: commands bring the
time and the jitter, events carry every decided fact (ids, deadlines, timer
moves), so folding the journal reproduces the coordinator's state exactly.
The rules are Flink's ``CheckpointCoordinator``'s (docs/design.md, "The checkpoint decider").
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias, TypeVar, assert_never

from coordinator.commands import (
    AcknowledgeCheckpoint,
    ChangeJobStatus,
    ChangeTaskStatus,
    Command,
    DeclineCheckpoint,
    RecordHeartbeat,
    RequestCheckpoint,
    Tick,
)
from coordinator.restart import (
    GiveUp,
    Restart,
    RestartHistory,
    failure_window,
    on_failure,
    strategy_problem,
)
from coordinator.state import (
    COUNTED_REASONS,
    MAX_QUEUED_REQUESTS,
    FrozenMap,
    JobState,
    PendingCheckpoint,
    Reason,
    Scheduler,
    frozen_map,
    initial_state,
    replacer,
    task_set,
)
from events.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointRequestQueued,
    CheckpointRestored,
    CheckpointTriggered,
    ExecutionState,
    JobFailedPermanently,
    JobHeartbeatRecorded,
    JobRestartScheduled,
    JobStatus,
    JournalEvent,
    RestartStrategy,
    SchedulerStarted,
    SchedulerStopped,
    StateHandle,
    TaskAcknowledged,
    TaskStatusRecorded,
    TriggerRejected,
)
from events.sizes import excerpt
from events.validation import (
    INLINE_BUDGET_BYTES,
    MAX_CHECKPOINT_ID,
    MAX_DURATION_MS,
    MAX_INLINE_THRESHOLD_BYTES,
    MAX_MAP_ENTRIES,
    MAX_TASKS,
    InvalidUri,
    StorageUri,
    parse_below,
    parse_offsets_key,
    parse_uri,
)

__all__ = [
    "Decision",
    "InputRejected",
    "Rejection",
    "decide",
    "decide_steps",
    "due_at",
    "evolve",
    "fold",
    "fold_jobs",
    "initial_state",
    "inline_limit",
    "inline_problem",
    "savepoint_roots",
]


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
    RECORD_TOO_LARGE = "RECORD_TOO_LARGE"
    """Only the shell uses it: the input's decision would write a record over its topic's
    ``max.message.bytes`` (docs/design.md, "Record sizes"); nothing of it is journaled."""


@dataclass(frozen=True, slots=True)
class InputRejected:
    """The command's input was not acceptable; the shell sends it to dead letters.

    Not a journal event: it changes nothing, and ``evolve`` ignores it.
    """

    job_id: str
    reason: Rejection
    message: str


Decision: TypeAlias = JournalEvent | InputRejected
"""What ``decide`` returns a list of."""

_K = TypeVar("_K")
_V = TypeVar("_V")

TERMINATING_TASK_STATES = frozenset(
    {ExecutionState.FAILED, ExecutionState.CANCELED, ExecutionState.CANCELING}
)


# ----------------------------------------------------------------------- evolve

_replace_state = replacer(JobState)
_replace_pending = replacer(PendingCheckpoint)


def evolve(state: JobState, event: Decision) -> JobState:
    """The state after ``event``. Total: any event in any state gives a state, never an error."""
    match event:
        # The three most frequent events first: match tries its cases in order.
        case TaskAcknowledged():
            # O(log n) in the tasks and the pending checkpoints: the maps are persistent.
            current = state.pending.get(event.checkpoint_id)
            if current is None:
                return state
            acked = _replace_pending(current, acks=current.acks.set(event.task_id, event))
            return _replace_state(state, pending=state.pending.set(event.checkpoint_id, acked))
        case CheckpointTriggered():
            return _replace_state(
                state,
                pending=state.pending.set(event.checkpoint_id, PendingCheckpoint(event)),
                next_checkpoint_id=max(state.next_checkpoint_id, event.checkpoint_id + 1),
                queue=_dequeued(state.queue, event.periodic, event.request_id),
                scheduler=_moved(state.scheduler, event.next_trigger_ms),
            )
        case CheckpointCompleted():
            pending = _without(state.pending, event.checkpoint_id)
            if event.kind is CheckpointKind.SAVEPOINT:
                return _replace_state(
                    state,
                    pending=pending,
                    latest_savepoint=event,
                    last_completion_ms=event.timestamp_ms,
                    last_completed_id=max(state.last_completed_id, event.checkpoint_id),
                    failures=0,
                )
            retained = state.config.retained if state.config else 1
            return _replace_state(
                state,
                pending=pending,
                completed=(*state.completed, event)[-max(1, retained) :],
                last_completion_ms=event.timestamp_ms,
                last_completed_id=max(state.last_completed_id, event.checkpoint_id),
                failures=0,
            )
        case SchedulerStarted():
            return _replace_state(
                state,
                status=JobStatus.RUNNING,
                attempt=event.attempt,
                tasks=event.tasks,
                config=event.config,
                tasks_not_running=frozen_map(),
                scheduler=Scheduler(event.next_trigger_ms),
                queue=(),
                heartbeat_deadline_ms=None,
                restart=None,
            )
        case SchedulerStopped():
            return _replace_state(
                state,
                status=event.status,
                attempt=event.attempt,
                scheduler=None,
                queue=(),
                heartbeat_deadline_ms=None,
            )
        case TaskStatusRecorded():
            if event.status is ExecutionState.RUNNING:
                not_running = _without(state.tasks_not_running, event.task_id)
            else:
                not_running = state.tasks_not_running.set(event.task_id, event.status)
            return _replace_state(state, tasks_not_running=not_running)
        case CheckpointRequestQueued():
            waiting = [q for q in state.queue if not (event.periodic and q.periodic)]
            queue = tuple(sorted((*waiting, event), key=_priority))
            scheduler = _moved(state.scheduler, event.next_trigger_ms)
            return _replace_state(state, queue=queue, scheduler=scheduler)
        case CheckpointAborted():
            pending = _without(state.pending, event.checkpoint_id)
            failures = state.failures + 1 if event.counts_as_failure else state.failures
            return _replace_state(state, pending=pending, failures=failures)
        case TriggerRejected():
            return _replace_state(
                state,
                queue=_dequeued(state.queue, event.periodic, event.request_id),
                scheduler=_moved(state.scheduler, event.next_trigger_ms),
            )
        case CheckpointFailureThresholdExceeded():
            return _replace_state(state, failures=0)
        case CheckpointRestored():
            return _replace_state(
                state,
                restored=event,
                next_checkpoint_id=max(state.next_checkpoint_id, event.checkpoint_id + 1),
            )
        case JobHeartbeatRecorded():
            return _replace_state(state, heartbeat_deadline_ms=event.deadline_ms)
        case JobRestartScheduled():
            strategy = state.config.restart_strategy if state.config else RestartStrategy()
            return _replace_state(
                state,
                status=JobStatus.RESTARTING,
                restarts=event.restarts,
                backoff_ms=event.backoff_ms,
                last_failure_ms=event.timestamp_ms,
                failure_times=failure_window(strategy, state.failure_times, event.timestamp_ms),
                restart=event,
            )
        case JobFailedPermanently():
            return _replace_state(
                state, status=JobStatus.FAILED, last_failure_ms=event.timestamp_ms, restart=None
            )
        case InputRejected():
            return state
        case _:
            assert_never(event)


def _without(mapping: FrozenMap[_K, _V], key: _K) -> FrozenMap[_K, _V]:
    """``mapping`` less ``key``, if it has it (``FrozenMap.delete`` raises on a missing key)."""
    return mapping.delete(key) if key in mapping else mapping


def _priority(request: CheckpointRequestQueued) -> tuple[int, int]:
    """Savepoints first, then manual checkpoints, then the periodic one; older first."""
    rank = 0 if request.kind is CheckpointKind.SAVEPOINT else 2 if request.periodic else 1
    return rank, request.timestamp_ms


def _dequeued(
    queue: tuple[CheckpointRequestQueued, ...], periodic: bool, request_id: str | None
) -> tuple[CheckpointRequestQueued, ...]:
    for i, queued in enumerate(queue):
        if (periodic and queued.periodic) or (
            not periodic and request_id is not None and queued.request_id == request_id
        ):
            return queue[:i] + queue[i + 1 :]
    return queue


def _moved(scheduler: Scheduler | None, next_trigger_ms: int | None) -> Scheduler | None:
    if scheduler is None or next_trigger_ms is None:
        return scheduler
    return Scheduler(next_trigger_ms)


def fold(events: Iterable[Decision], state: JobState) -> JobState:
    """Evolve ``state`` through ``events``: startup recovery, replay and the tests all use this."""
    for event in events:
        state = evolve(state, event)
    return state


def fold_jobs(
    events: Iterable[JournalEvent], states: Mapping[str, JobState] | None = None
) -> dict[str, JobState]:
    """Fold a journal of many jobs into one state per job (the Decider pattern's ``many``)."""
    result = dict(states or {})
    for event in events:
        job_id = event.job_id
        state = result.get(job_id)
        result[job_id] = evolve(state if state is not None else initial_state(job_id), event)
    return result


def due_at(state: JobState) -> int | None:
    """The earliest time a :class:`Tick` can change anything: the shell's timer uses it."""
    times = [p.triggered.deadline_ms for p in state.pending.values()]
    if state.status is JobStatus.RUNNING and state.heartbeat_deadline_ms is not None:
        times.append(state.heartbeat_deadline_ms)
    if state.scheduler is not None and state.scheduler.next_trigger_ms is not None:
        times.append(state.scheduler.next_trigger_ms)
    return min(times, default=None)


# ----------------------------------------------------------------------- decide


class _Decision:
    """Collects events and keeps the state they lead to, so later rules see earlier facts."""

    __slots__ = ("events", "state", "states")

    def __init__(self, state: JobState) -> None:
        self.state = state
        self.events: list[Decision] = []
        self.states: list[JobState] = []  # the state after each event

    def emit(self, event: Decision) -> None:
        self.events.append(event)
        self.state = evolve(self.state, event)
        self.states.append(self.state)

    def reject(self, reason: Rejection, message: str) -> list[Decision]:
        return [InputRejected(self.state.job_id, reason, message)]


def decide(state: JobState, command: Command) -> list[Decision]:
    """The events that ``command`` leads to in ``state``, in order.

    Each event is evolved into an interim state before the next rule runs, so
    ``fold(decide(s, c), s)`` is the state after the command. An idempotent
    repeat (a duplicate ack, a late ack, a repeated decline) gives ``[]``; an
    unacceptable input gives one :class:`InputRejected`.
    """
    return _decide(_Decision(state), command)


def decide_steps(state: JobState, command: Command) -> list[tuple[Decision, JobState]]:
    """``decide``, each decision paired with the state after it (``fold`` of the decisions so far).

    ``decide`` evolves every decision into an interim state anyway; the shell takes those states
    instead of evolving each decision a second time.
    """
    d = _Decision(state)
    decisions = _decide(d, command)
    if decisions is d.events:
        return list(zip(decisions, d.states, strict=True))
    steps = []  # a refusal or nothing: no decision was evolved
    for decision in decisions:
        state = evolve(state, decision)
        steps.append((decision, state))
    return steps


def _decide(d: _Decision, command: Command) -> list[Decision]:
    state = d.state
    if command.job_id != state.job_id:
        return d.reject(
            Rejection.UNKNOWN_JOB,
            f"a command of job {excerpt(command.job_id)!r} reached job {excerpt(state.job_id)!r}",
        )
    match command:
        case ChangeJobStatus():
            return _change_job_status(d, command)
        case ChangeTaskStatus():
            return _change_task_status(d, command)
        case RequestCheckpoint():
            return _request_checkpoint(d, command)
        case AcknowledgeCheckpoint():
            return _acknowledge(d, command)
        case DeclineCheckpoint():
            return _decline(d, command)
        case RecordHeartbeat():
            return _record_heartbeat(d, command)
        case Tick():
            return _tick(d, command)
        case _:
            assert_never(command)


def _config_problem(config: CheckpointConfig | None) -> str | None:
    if config is None:
        return "a RUNNING job status must carry its checkpoint config"
    if config.timeout_ms <= 0:
        return f"timeout_ms must be positive, got {config.timeout_ms}"
    if config.min_pause_ms < 0:
        return f"min_pause_ms must not be negative, got {config.min_pause_ms}"
    if config.max_concurrent < 1:
        return f"max_concurrent must be at least 1, got {config.max_concurrent}"
    if config.tolerable_failures < 0:
        return f"tolerable_failures must not be negative, got {config.tolerable_failures}"
    if config.retained < 1:
        return f"retained must be at least 1, got {config.retained}"
    if not 0 <= config.inline_threshold_bytes <= MAX_INLINE_THRESHOLD_BYTES:
        return (
            f"inline_threshold_bytes must be between 0 and {MAX_INLINE_THRESHOLD_BYTES} "
            f"(Flink's memory threshold is at most 1 MiB too), got {config.inline_threshold_bytes}"
        )
    for name in ("interval_ms", "timeout_ms", "min_pause_ms"):
        value = getattr(config, name)
        if value > MAX_DURATION_MS:
            return f"{name} must be at most {MAX_DURATION_MS}, got {value}"
    if not 0 < config.heartbeat_interval_ms <= config.heartbeat_timeout_ms <= MAX_DURATION_MS:
        return (
            f"heartbeats need 0 < heartbeat_interval_ms <= heartbeat_timeout_ms <= {MAX_DURATION_MS}, got "
            f"{config.heartbeat_interval_ms} and {config.heartbeat_timeout_ms}"
        )
    problem = strategy_problem(config.restart_strategy)
    if problem is not None:
        return problem
    if not config.location:
        return "location (the checkpoint storage URI) must not be empty"
    root = _storage_uri(config.location)
    if isinstance(root, str):
        return f"location is not a storage URI cutline accepts: {excerpt(root)}"
    if root.scheme == "file" and not root.segments:
        return "location must not be the root of the file system"
    return None


def _job_dir_problem(job_id: str, location: str) -> str | None:
    """Does ``job_id`` name exactly one directory below ``location`` (checkpoints go to
    ``<location>/<job_id>/chk-<id>``)? A job id such as ``..`` or ``a/b`` would put them elsewhere."""
    root = _storage_uri(location)
    job_dir = _storage_uri(f"{location.rstrip('/')}/{job_id}")
    if isinstance(root, str) or isinstance(job_dir, str) or job_dir.segments != (*root.segments, job_id):
        return (
            f"job id {excerpt(job_id)!r} cannot name a directory of checkpoint location {excerpt(location)!r}"
        )
    return None


@functools.lru_cache(maxsize=1024)
def _storage_uri(uri: str) -> StorageUri | str:
    """``parse_uri``, or the reason it refused ``uri``. A memo: a location is parsed for every ack
    of its checkpoint; ``parse_uri`` is pure, so remembering it changes no decision."""
    try:
        return parse_uri(uri)
    except InvalidUri as exc:
        return str(exc)


def _change_job_status(d: _Decision, command: ChangeJobStatus) -> list[Decision]:
    changed, now, state = command.changed, command.now_ms, d.state
    if changed.attempt < 0:
        return d.reject(Rejection.INVALID_STATUS, f"attempt must not be negative: {changed.attempt}")
    if changed.attempt < state.attempt:
        return d.reject(
            Rejection.STALE_ATTEMPT,
            f"status {changed.status} of attempt {changed.attempt}; the job is at {state.attempt}",
        )
    if changed.status is JobStatus.RUNNING:
        problem = _config_problem(changed.config)
        if problem is None and not changed.tasks:
            problem = "a RUNNING job status must list the tasks that acknowledge checkpoints"
        if problem is None and len(changed.tasks) > MAX_TASKS:
            problem = f"a job may have at most {MAX_TASKS} tasks, got {len(changed.tasks)}"
        if problem is None and changed.config is not None:
            problem = _job_dir_problem(changed.job_id, changed.config.location)
        if problem is None and len(set(changed.tasks)) != len(changed.tasks):
            problem = f"task ids must be unique: {excerpt(list(changed.tasks))}"
        restored = changed.restored_checkpoint_id
        if problem is None and restored is not None and not 1 <= restored <= MAX_CHECKPOINT_ID:
            problem = f"restored_checkpoint_id must be in [1, {MAX_CHECKPOINT_ID}]: {restored}"
        if problem is not None:
            return d.reject(Rejection.INVALID_CONFIG, problem)
        if state.status is JobStatus.RUNNING and changed.attempt == state.attempt:
            return []
        if state.scheduler is not None:
            _stop(d, now, JobStatus.RESTARTING, f"attempt {changed.attempt} started")
        assert changed.config is not None
        if changed.restored_checkpoint_id is not None:
            d.emit(
                CheckpointRestored(
                    job_id=changed.job_id,
                    checkpoint_id=changed.restored_checkpoint_id,
                    attempt=changed.attempt,
                    timestamp_ms=now,
                    location=changed.restored_location,
                )
            )
        d.emit(
            SchedulerStarted(
                job_id=changed.job_id,
                attempt=changed.attempt,
                timestamp_ms=now,
                tasks=tuple(changed.tasks),
                config=changed.config,
                next_trigger_ms=_first_trigger(changed.config, now, command.jitter),
            )
        )
        return d.events
    if changed.status is state.status and changed.attempt == state.attempt:
        return []
    if changed.status is JobStatus.FAILING:
        if changed.attempt == state.attempt and state.status in FAILED_OR_RESTARTING:
            return []  # that attempt's failure was decided already (a heartbeat expired, say)
        _fail(d, now, changed.error or f"attempt {changed.attempt} reported FAILING", command.jitter,
              Reason.CHECKPOINT_COORDINATOR_SUSPEND, attempt=changed.attempt)  # fmt: skip
        return d.events
    _stop(d, now, changed.status, changed.error, attempt=changed.attempt)
    return d.events


def _first_trigger(config: CheckpointConfig, now: int, jitter: float) -> int | None:
    """Flink: the first tick after a random delay in ``[min_pause, base_interval]``."""
    if config.interval_ms <= 0:
        return None
    low, high = config.min_pause_ms, config.base_interval_ms
    jitter = min(max(jitter, 0.0), 1.0)
    return now + min(high, low + int(jitter * (high - low + 1)))


def _stop(
    d: _Decision,
    now: int,
    status: JobStatus,
    error: str | None,
    attempt: int | None = None,
    reason: Reason = Reason.CHECKPOINT_COORDINATOR_SUSPEND,
) -> None:
    """Stop the scheduler: abort pending checkpoints (``reason``) and queued requests (SUSPEND)."""
    state = d.state
    message = f"job is {status}" + (f": {error}" if error else "")
    for checkpoint_id in sorted(state.pending):
        d.emit(
            CheckpointAborted(
                job_id=state.job_id,
                checkpoint_id=checkpoint_id,
                timestamp_ms=now,
                reason=reason,
                message=message,
            )
        )
    for queued in state.queue:
        d.emit(
            TriggerRejected(
                job_id=state.job_id,
                reason=Reason.CHECKPOINT_COORDINATOR_SUSPEND,
                request_id=queued.request_id,
                timestamp_ms=now,
                kind=queued.kind,
                periodic=queued.periodic,
                message=message,
            )
        )
    d.emit(
        SchedulerStopped(
            job_id=state.job_id,
            attempt=state.attempt if attempt is None else attempt,
            timestamp_ms=now,
            status=status,
            error=error,
        )
    )


FAILED_OR_RESTARTING = frozenset({JobStatus.FAILING, JobStatus.RESTARTING, JobStatus.FAILED})


def _fail(
    d: _Decision, now: int, failure: str, jitter: float, reason: Reason, attempt: int | None = None
) -> None:
    """The job failed: stop it (FAILING), then the restart strategy restarts it or gives up."""
    _stop(d, now, JobStatus.FAILING, failure, attempt=attempt, reason=reason)
    state = d.state
    history = RestartHistory(state.restarts, state.backoff_ms, state.last_failure_ms, state.failure_times)
    if state.config is None:
        decision: Restart | GiveUp = GiveUp("the job never ran with a configuration (no restart strategy)")
    else:
        decision = on_failure(state.config.restart_strategy, history, now, jitter)
    if isinstance(decision, GiveUp):
        d.emit(JobFailedPermanently(state.job_id, state.attempt, now, decision.reason, failure))
        return
    # Flink restores the latest completed checkpoint, or what the attempt itself started from.
    restore = state.latest_completed or state.restored
    d.emit(
        JobRestartScheduled(
            job_id=state.job_id,
            attempt=state.attempt + 1,
            timestamp_ms=now,
            delay_ms=decision.delay_ms,
            failure=failure,
            restarts=decision.restarts,
            backoff_ms=decision.backoff_ms,
            restore_checkpoint_id=None if restore is None else restore.checkpoint_id,
            restore_location=None if restore is None else restore.location or None,
        )
    )


def _record_heartbeat(d: _Decision, command: RecordHeartbeat) -> list[Decision]:
    heartbeat, state = command.heartbeat, d.state
    if not state.known:
        return d.reject(
            Rejection.UNKNOWN_JOB, f"a heartbeat of job {excerpt(heartbeat.job_id)!r}, which never ran"
        )
    if heartbeat.attempt < state.attempt:
        return d.reject(
            Rejection.STALE_ATTEMPT,
            f"a heartbeat of attempt {heartbeat.attempt}; the job is at {state.attempt}",
        )
    if heartbeat.attempt > state.attempt:
        return d.reject(
            Rejection.UNKNOWN_ATTEMPT,
            f"a heartbeat of attempt {heartbeat.attempt}, which never reported RUNNING (at {state.attempt})",
        )
    if state.status is not JobStatus.RUNNING or state.config is None:
        return []  # late: the attempt failed or stopped already
    deadline = command.now_ms + state.config.heartbeat_timeout_ms
    d.emit(JobHeartbeatRecorded(state.job_id, state.attempt, command.now_ms, deadline))
    return d.events


def _change_task_status(d: _Decision, command: ChangeTaskStatus) -> list[Decision]:
    changed, now, state = command.changed, command.now_ms, d.state
    rejected = _check_task(d, changed.attempt, changed.task_id)
    if rejected:
        return rejected
    recorded = state.tasks_not_running.get(changed.task_id, ExecutionState.RUNNING)
    if changed.status is recorded:
        return []
    d.emit(
        TaskStatusRecorded(
            job_id=changed.job_id,
            task_id=changed.task_id,
            attempt=changed.attempt,
            status=changed.status,
            timestamp_ms=now,
            error=changed.error,
        )
    )
    if changed.status in TERMINATING_TASK_STATES:
        for checkpoint_id, pending in sorted(state.pending.items()):
            if changed.task_id not in pending.acks:
                d.emit(
                    CheckpointAborted(
                        job_id=state.job_id,
                        checkpoint_id=checkpoint_id,
                        timestamp_ms=now,
                        reason=Reason.TASK_FAILURE,
                        message=f"task {excerpt(changed.task_id)} is {changed.status}"
                        + (f": {changed.error}" if changed.error else ""),
                        task_id=changed.task_id,
                    )
                )
        _poll_queue(d, now)
    return d.events


def _check_task(d: _Decision, attempt: int, task_id: str) -> list[Decision]:
    """Reject input from an unknown job, another attempt or an unknown task."""
    state = d.state
    if not state.known:
        return d.reject(
            Rejection.UNKNOWN_JOB, f"no job status was ever reported for job {excerpt(state.job_id)!r}"
        )
    if attempt < state.attempt:
        return d.reject(
            Rejection.STALE_ATTEMPT, f"attempt {attempt} is older than the job's attempt {state.attempt}"
        )
    if attempt > state.attempt:
        return d.reject(
            Rejection.UNKNOWN_ATTEMPT, f"attempt {attempt} is newer than the job's attempt {state.attempt}"
        )
    if task_id not in task_set(state.tasks):
        return d.reject(
            Rejection.UNKNOWN_TASK, f"task {excerpt(task_id)!r} is not one of {excerpt(list(state.tasks))}"
        )
    return []


def _check_checkpoint_id(d: _Decision, checkpoint_id: int) -> list[Decision]:
    if checkpoint_id < 1:
        return d.reject(Rejection.INVALID_ID, f"checkpoint ids start at 1, got {checkpoint_id}")
    if checkpoint_id > MAX_CHECKPOINT_ID:
        return d.reject(
            Rejection.INVALID_ID, f"checkpoint ids end at {MAX_CHECKPOINT_ID}, got {checkpoint_id}"
        )
    if checkpoint_id >= d.state.next_checkpoint_id:
        return d.reject(
            Rejection.UNKNOWN_CHECKPOINT,
            f"checkpoint {checkpoint_id} was never triggered (the next id is {d.state.next_checkpoint_id})",
        )
    return []


def _request_checkpoint(d: _Decision, command: RequestCheckpoint) -> list[Decision]:
    request, now, state = command.request, command.now_ms, d.state
    if not state.known:
        return d.reject(
            Rejection.UNKNOWN_JOB, f"no job status was ever reported for job {excerpt(state.job_id)!r}"
        )
    savepoint = request.kind is CheckpointKind.SAVEPOINT
    if not state.all_tasks_running:
        d.emit(_rejected_request(command, Reason.NOT_ALL_REQUIRED_TASKS_RUNNING, _not_running(state)))
        return d.events
    if savepoint and request.target is not None:
        problem = _target_problem(state, request.target, command.savepoint_roots)
        if problem is not None:
            d.emit(_rejected_request(command, Reason.SAVEPOINT_TARGET_NOT_ALLOWED, problem))
            return d.events
    if not savepoint and state.pending_checkpoints >= _max_concurrent(state):
        if len(state.queue) >= MAX_QUEUED_REQUESTS:
            d.emit(_rejected_request(command, Reason.TOO_MANY_CHECKPOINT_REQUESTS, "queue is full"))
        else:
            d.emit(
                CheckpointRequestQueued(
                    job_id=state.job_id,
                    kind=request.kind,
                    periodic=False,
                    timestamp_ms=now,
                    request_id=request.request_id,
                    target=request.target,
                )
            )
        return d.events
    _trigger(d, now, request.kind, periodic=False, request_id=request.request_id, target=request.target)
    return d.events


def savepoint_roots(location: str, configured: tuple[str, ...]) -> tuple[StorageUri, ...]:
    """Where savepoints of a job with checkpoint ``location`` may go.

    The roots the coordinator was given (``cutline coordinator --savepoint-root``); without any,
    the parent of the checkpoint location, so ``.../checkpoints`` and ``.../savepoints`` side by
    side work out of the box (Flink's usual ``state.checkpoints.dir`` and ``state.savepoints.dir``),
    but a savepoint cannot be pointed at any other directory the tasks can write to. A ``file:``
    location right below ``/`` has no such parent: then only the location itself.
    """
    if configured:
        return tuple(r for r in map(_storage_uri, configured) if not isinstance(r, str))
    root = _storage_uri(location)
    if isinstance(root, str):
        return ()
    parent = root.parent
    if parent is None or (parent.scheme == "file" and not parent.segments):
        return (root,)
    return (parent,)


def _target_problem(state: JobState, target: str, configured: tuple[str, ...]) -> str | None:
    parsed = _storage_uri(target)
    if isinstance(parsed, str):
        return f"savepoint target is not a storage URI cutline accepts: {excerpt(parsed)}"
    roots = savepoint_roots(state.config.location if state.config else "", configured)
    if any(parsed.within(root, strict=False) for root in roots):
        return None
    names = ", ".join(str(r) for r in roots) or "none"
    if configured:
        return (
            f"savepoint target {excerpt(str(parsed))!r} is outside the savepoint roots ({names}); "
            "start the coordinator with another --savepoint-root to allow it"
        )
    return (
        f"savepoint target {excerpt(str(parsed))!r} is outside {names}, where savepoints go when the "
        "coordinator has no --savepoint-root (the parent of the checkpoint location); "
        "start the coordinator with --savepoint-root to allow other directories"
    )


def _rejected_request(command: RequestCheckpoint, reason: Reason, message: str) -> TriggerRejected:
    return TriggerRejected(
        job_id=command.job_id,
        reason=reason,
        request_id=command.request.request_id,
        timestamp_ms=command.now_ms,
        kind=command.request.kind,
        message=message,
    )


def _not_running(state: JobState) -> str:
    if state.status is not JobStatus.RUNNING:
        return f"job is {state.status}"
    tasks = ", ".join(f"{t} is {s}" for t, s in sorted(state.tasks_not_running.items()))
    return f"not all tasks are RUNNING: {tasks}"


def _max_concurrent(state: JobState) -> int:
    return state.config.max_concurrent if state.config else 1


def _trigger(
    d: _Decision,
    now: int,
    kind: CheckpointKind,
    *,
    periodic: bool,
    request_id: str | None,
    target: str | None,
    next_trigger_ms: int | None = None,
) -> None:
    state = d.state
    assert state.config is not None
    checkpoint_id = state.next_checkpoint_id
    d.emit(
        CheckpointTriggered(
            job_id=state.job_id,
            checkpoint_id=checkpoint_id,
            attempt=state.attempt,
            kind=kind,
            timestamp_ms=now,
            location=_location(state, checkpoint_id, kind, target),
            tasks=state.tasks,
            deadline_ms=now + state.config.timeout_ms,
            periodic=periodic,
            request_id=request_id,
            next_trigger_ms=next_trigger_ms,
            inline_limit_bytes=inline_limit(state.config.inline_threshold_bytes, len(state.tasks)),
        )
    )


def inline_limit(threshold: int, tasks: int) -> int:
    """The largest snapshot one of ``tasks`` may send inline: the job's threshold, cut down so that
    every task's inline state together stays within :data:`INLINE_BUDGET_BYTES` (the completion
    record carries all of it, and must stay one Kafka record)."""
    return min(threshold, INLINE_BUDGET_BYTES // max(1, tasks))


def _location(state: JobState, checkpoint_id: int, kind: CheckpointKind, target: str | None) -> str:
    assert state.config is not None
    if kind is CheckpointKind.SAVEPOINT:
        parsed = _storage_uri(target) if target else None
        if isinstance(parsed, StorageUri):  # checked by _target_problem when it was requested
            return f"{str(parsed).rstrip('/')}/savepoint-{checkpoint_id}"
        return f"{state.config.location.rstrip('/')}/{state.job_id}/savepoint-{checkpoint_id}"
    return f"{state.config.location.rstrip('/')}/{state.job_id}/chk-{checkpoint_id}"


def _poll_queue(d: _Decision, now: int) -> None:
    """Run queued requests while there is room (Flink re-polls after every abort or completion)."""
    while d.state.queue and d.state.pending_checkpoints < _max_concurrent(d.state):
        head = d.state.queue[0]
        state = d.state
        if head.periodic:
            resume_at = _pause_ends(state)
            if resume_at is not None and resume_at > now:
                d.emit(_rejected_periodic(state, now, Reason.MINIMUM_TIME_BETWEEN_CHECKPOINTS, resume_at))
                continue
        if not state.all_tasks_running:
            d.emit(
                TriggerRejected(
                    job_id=state.job_id,
                    reason=Reason.NOT_ALL_REQUIRED_TASKS_RUNNING,
                    request_id=head.request_id,
                    timestamp_ms=now,
                    kind=head.kind,
                    periodic=head.periodic,
                    message=_not_running(state),
                )
            )
            continue
        _trigger(d, now, head.kind, periodic=head.periodic, request_id=head.request_id, target=head.target)


def _pause_ends(state: JobState) -> int | None:
    if state.last_completion_ms is None or state.config is None:
        return None
    return state.last_completion_ms + state.config.min_pause_ms


def _rejected_periodic(
    state: JobState, now: int, reason: Reason, next_trigger_ms: int | None, message: str = ""
) -> TriggerRejected:
    if not message and reason is Reason.MINIMUM_TIME_BETWEEN_CHECKPOINTS:
        message = f"min_pause: the next periodic checkpoint may start at {next_trigger_ms}"
    return TriggerRejected(
        job_id=state.job_id,
        reason=reason,
        timestamp_ms=now,
        periodic=True,
        message=message,
        next_trigger_ms=next_trigger_ms,
    )


def _tick(d: _Decision, command: Tick) -> list[Decision]:
    now, state = command.now_ms, d.state
    deadline = state.heartbeat_deadline_ms
    if state.status is JobStatus.RUNNING and deadline is not None and now >= deadline:
        timeout = state.config.heartbeat_timeout_ms if state.config else 0
        failure = f"no heartbeat of attempt {state.attempt} for {timeout} ms (heartbeat_timeout_ms)"
        _fail(d, now, failure, command.jitter, Reason.TASK_FAILURE)
        return d.events
    expired = sorted(cid for cid, p in d.state.pending.items() if p.triggered.deadline_ms <= now)
    for checkpoint_id in expired:
        _abort(
            d,
            now,
            checkpoint_id,
            Reason.CHECKPOINT_EXPIRED,
            f"not acknowledged by {_missing(d.state.pending[checkpoint_id])} before its deadline",
        )
    if expired:
        _poll_queue(d, now)
    scheduler, state = d.state.scheduler, d.state
    if scheduler is None or scheduler.next_trigger_ms is None or now < scheduler.next_trigger_ms:
        return d.events
    assert state.config is not None
    interval = state.config.base_interval_ms
    missed = (now - scheduler.next_trigger_ms) // interval
    next_trigger = scheduler.next_trigger_ms + (missed + 1) * interval
    if state.pending_checkpoints >= _max_concurrent(state):
        # Never more than one periodic request waits: a newer one takes the older one's place.
        d.emit(
            CheckpointRequestQueued(
                job_id=state.job_id,
                kind=CheckpointKind.CHECKPOINT,
                periodic=True,
                timestamp_ms=now,
                next_trigger_ms=next_trigger,
            )
        )
        return d.events
    resume_at = _pause_ends(state)
    if resume_at is not None and resume_at > now:
        d.emit(_rejected_periodic(state, now, Reason.MINIMUM_TIME_BETWEEN_CHECKPOINTS, resume_at))
        return d.events
    if not state.all_tasks_running:
        d.emit(
            _rejected_periodic(
                state, now, Reason.NOT_ALL_REQUIRED_TASKS_RUNNING, next_trigger, _not_running(state)
            )
        )
        return d.events
    _trigger(
        d,
        now,
        CheckpointKind.CHECKPOINT,
        periodic=True,
        request_id=None,
        target=None,
        next_trigger_ms=next_trigger,
    )
    return d.events


def _missing(pending: PendingCheckpoint) -> str:
    missing = [t for t in pending.triggered.tasks if t not in pending.acks]
    return ", ".join(missing) or "nobody"


def _abort(
    d: _Decision,
    now: int,
    checkpoint_id: int,
    reason: Reason,
    message: str,
    task_id: str | None = None,
) -> None:
    """Abort a pending checkpoint; count the failure; fail the job past the threshold."""
    state = d.state
    pending = state.pending[checkpoint_id]
    counted = (
        reason in COUNTED_REASONS and not pending.is_savepoint and checkpoint_id > state.last_completed_id
    )
    d.emit(
        CheckpointAborted(
            job_id=state.job_id,
            checkpoint_id=checkpoint_id,
            timestamp_ms=now,
            reason=reason,
            message=message,
            task_id=task_id,
            counts_as_failure=counted,
        )
    )
    tolerable = state.config.tolerable_failures if state.config else 0
    if counted and d.state.failures > tolerable:
        d.emit(
            CheckpointFailureThresholdExceeded(
                job_id=state.job_id,
                checkpoint_id=checkpoint_id,
                timestamp_ms=now,
                failures=d.state.failures,
                tolerable=tolerable,
                reason=reason,
            )
        )


def _check_ack_or_decline(d: _Decision, checkpoint_id: int, attempt: int, task_id: str) -> list[Decision]:
    return _check_task(d, attempt, task_id) or _check_checkpoint_id(d, checkpoint_id)


def _acknowledge(d: _Decision, command: AcknowledgeCheckpoint) -> list[Decision]:
    ack, now = command.ack, command.now_ms
    rejected = _check_ack_or_decline(d, ack.checkpoint_id, ack.attempt, ack.task_id)
    if rejected:
        return rejected
    problem = _offsets_problem(ack.offsets)
    if problem:
        return d.reject(Rejection.INVALID_OFFSETS, problem)
    if len(ack.metrics) > MAX_MAP_ENTRIES:
        return d.reject(
            Rejection.INVALID_METRICS, f"{len(ack.metrics)} metrics; at most {MAX_MAP_ENTRIES} are accepted"
        )
    pending = d.state.pending.get(ack.checkpoint_id)
    if pending is None:
        return []  # late: the checkpoint completed or aborted already (Flink logs and discards)
    if ack.task_id not in task_set(pending.triggered.tasks):
        return d.reject(
            Rejection.UNKNOWN_TASK,
            f"task {excerpt(ack.task_id)!r} is not part of checkpoint {ack.checkpoint_id}",
        )
    if ack.state is not None:
        if ack.state.size_bytes < 0:
            size = ack.state.size_bytes
            return d.reject(Rejection.INVALID_STATE_HANDLE, f"state size_bytes must not be negative: {size}")
        problem = _outside_problem(ack.state.uri, pending.triggered.location)
        if problem:
            return d.reject(Rejection.STATE_OUTSIDE_LOCATION, problem)
        if ack.state.inline is not None:
            problem = inline_problem(ack.state, pending.triggered.inline_limit_bytes)
            if problem:
                return d.reject(Rejection.INVALID_STATE_HANDLE, problem)
    if ack.task_id in pending.acks:
        return []  # duplicate: a retried task or a re-run batch acknowledged twice
    d.emit(
        TaskAcknowledged(
            job_id=ack.job_id,
            checkpoint_id=ack.checkpoint_id,
            attempt=ack.attempt,
            task_id=ack.task_id,
            timestamp_ms=now,
            state=ack.state,
            offsets=dict(ack.offsets),
            metrics=dict(ack.metrics),
        )
    )
    completed = d.state.pending[ack.checkpoint_id]
    if completed.fully_acknowledged:
        _complete(d, now, completed)
    return d.events


def inline_problem(handle: StateHandle, limit: int) -> str | None:
    """Why the inline state of ``handle`` is not acceptable for a checkpoint that allows ``limit``
    bytes inline (None: it is). The size and digest are checked here, once, so that every reader
    of the journal can trust the bytes it restores."""
    assert handle.inline is not None
    size = len(handle.inline)
    if size > limit or limit == 0:
        allowed = "no inline state" if limit == 0 else f"at most {limit} bytes inline"
        return (
            f"inline state of {size} bytes for {excerpt(handle.uri)}: this checkpoint allows {allowed} "
            "(its barrier's inline_limit_bytes); write the snapshot to its uri and send no inline bytes"
        )
    if size != handle.size_bytes:
        uri = excerpt(handle.uri)
        return f"inline state of {size} bytes for {uri}, but its size_bytes says {handle.size_bytes}"
    digest = hashlib.sha256(handle.inline).hexdigest()
    if digest != handle.sha256.lower():
        return (
            f"inline state for {excerpt(handle.uri)} has sha256 {digest}, but its handle says {handle.sha256}"
        )
    return None


def _offsets_problem(offsets: Mapping[str, int]) -> str | None:
    if len(offsets) > MAX_MAP_ENTRIES:
        return f"{len(offsets)} offsets; at most {MAX_MAP_ENTRIES} are accepted"
    for key, offset in offsets.items():
        problem = _offsets_key_problem(key)
        if problem is not None:
            return problem
        if offset < 0:
            return f"offset {offset} for {excerpt(key)} is negative"
    return None


@functools.lru_cache(maxsize=4096, typed=True)
def _offsets_key_problem(key: str) -> str | None:
    """Why ``key`` is not an offsets key (None: it is). A memo, as ``_storage_uri``: every ack of a
    task names the same ``topic:partition`` keys again; the check is pure."""
    try:
        _, partition = parse_offsets_key(key)
    except ValueError as exc:
        return str(exc)
    if partition > MAX_PARTITION or key.rpartition(":")[2] != str(partition):
        return f"partition of offsets key {excerpt(key)!r} is not a Kafka partition number"
    return None


MAX_PARTITION = 2**31 - 1
"""Kafka's partition numbers are 32-bit."""


def _outside_problem(uri: str, location: str) -> str | None:
    """Why a state handle's ``uri`` is not strictly inside checkpoint ``location`` (None when it is).

    Both are parsed by :func:`events.validation.parse_uri`: a URI that does not parse cannot be
    shown to be inside, so it is refused the same way. Symbolic links are the shell's to resolve.
    """
    root = _storage_uri(location)
    if isinstance(root, str):
        return (
            f"checkpoint location {excerpt(location)!r} is not a storage URI cutline accepts: {excerpt(root)}"
        )
    try:
        inner = parse_below(uri, location)
    except InvalidUri as exc:
        return f"state URI is not a storage URI cutline accepts: {excerpt(exc)}"
    if not inner.within(root):
        return f"state {excerpt(uri)!r} is outside checkpoint location {excerpt(location)!r}"
    return None


def _complete(d: _Decision, now: int, pending: PendingCheckpoint) -> None:
    triggered = pending.triggered
    handles: dict[str, StateHandle] = {}
    offsets: dict[str, int] = {}
    for task_id in triggered.tasks:
        ack = pending.acks[task_id]
        if ack.state is not None:
            handles[task_id] = ack.state
        offsets.update(ack.offsets)
    d.emit(
        CheckpointCompleted(
            job_id=triggered.job_id,
            checkpoint_id=triggered.checkpoint_id,
            kind=triggered.kind,
            timestamp_ms=now,
            duration_ms=now - triggered.timestamp_ms,
            handles=handles,
            size_bytes=sum(h.size_bytes for h in handles.values()),
            offsets=dict(sorted(offsets.items())),
            attempt=triggered.attempt,
            location=triggered.location,
        )
    )
    if not pending.is_savepoint:
        for checkpoint_id, older in sorted(d.state.pending.items()):
            if checkpoint_id < triggered.checkpoint_id and not older.is_savepoint:
                d.emit(
                    CheckpointAborted(
                        job_id=triggered.job_id,
                        checkpoint_id=checkpoint_id,
                        timestamp_ms=now,
                        reason=Reason.CHECKPOINT_SUBSUMED,
                        message=f"subsumed by checkpoint {triggered.checkpoint_id}",
                    )
                )
    _poll_queue(d, now)


def _decline(d: _Decision, command: DeclineCheckpoint) -> list[Decision]:
    decline, now = command.decline, command.now_ms
    rejected = _check_ack_or_decline(d, decline.checkpoint_id, decline.attempt, decline.task_id)
    if rejected:
        return rejected
    if decline.checkpoint_id not in d.state.pending:
        return []  # already aborted or completed: repeated declines are no-ops
    _abort(
        d,
        now,
        decline.checkpoint_id,
        Reason.CHECKPOINT_DECLINED,
        f"task {excerpt(decline.task_id)} declined ({decline.reason}): {decline.message}",
        task_id=decline.task_id,
    )
    _poll_queue(d, now)
    return d.events
