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
from typing import TypeAlias, TypeVar, assert_never

from coordinator.core import checks
from coordinator.core.checks import InputRejected, Rejection, inline_problem, storage_uri
from coordinator.core.commands import (
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
from coordinator.core.restart import (
    GiveUpRestarting,
    RestartAfterDelay,
    RestartHistory,
    failure_window,
    on_failure,
)
from coordinator.core.state import (
    COUNTED_REASONS,
    MAX_PENDING_SAVEPOINTS,
    MAX_QUEUED_REQUESTS,
    FrozenMap,
    JobState,
    PendingCheckpoint,
    Reason,
    Scheduler,
    frozen_map,
    initial_state,
)
from events.wire.codegen import replacer
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointRequested,
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
from events.wire.sizes import bounded, excerpt
from events.wire.validation import (
    INLINE_BUDGET_BYTES,
    StorageUri,
)

__all__ = [
    "Decision",
    "InputRejected",
    "Rejection",
    "barriers_owed",
    "decide",
    "decide_steps",
    "due_at",
    "evolve",
    "fold",
    "fold_jobs",
    "initial_state",
    "inline_limit",
    "inline_problem",
    "savepoint_location",
    "savepoint_name",
    "savepoint_roots",
    "trusted_roots",
]


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
                pending=state.pending.set(event.checkpoint_id, _pending(state, event)),
                next_checkpoint_id=max(state.next_checkpoint_id, event.checkpoint_id + 1),
                queue=_dequeued(state.queue, event.periodic, event.request_id),
                scheduler=_moved(state.scheduler, event.next_trigger_ms),
                stop=event if event.stop else state.stop,
            )
        case CheckpointCompleted():
            return _completed(state, event)
        case CheckpointRequestQueued():
            waiting = [q for q in state.queue if not (event.periodic and q.periodic)]
            queue = tuple(sorted((*waiting, event), key=_priority))
            scheduler = _moved(state.scheduler, event.next_trigger_ms)
            return _replace_state(state, queue=queue, scheduler=scheduler)
        case CheckpointAborted():
            pending = _without(state.pending, event.checkpoint_id)
            failures = state.failures + 1 if event.counts_as_failure else state.failures
            stop = state.stop
            if stop is not None and stop.checkpoint_id == event.checkpoint_id:
                stop = None  # the stop-with-savepoint failed: the job keeps running
            return _replace_state(state, pending=pending, failures=failures, stop=stop)
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
        case _:
            return _evolve_job(state, event)


_JobEvent: TypeAlias = (
    SchedulerStarted
    | SchedulerStopped
    | TaskStatusRecorded
    | JobHeartbeatRecorded
    | JobRestartScheduled
    | JobFailedPermanently
    | InputRejected
)


def _evolve_job(state: JobState, event: _JobEvent) -> JobState:
    """``evolve`` of the job's and its tasks' lifecycle (the checkpoints' events are in ``evolve``)."""
    match event:
        case SchedulerStarted():
            return _replace_state(
                state,
                status=JobStatus.RUNNING,
                attempt=event.attempt,
                tasks=event.tasks,
                task_ids=frozenset(event.tasks),
                config=event.config,
                tasks_not_running=frozen_map(),
                scheduler=Scheduler(event.next_trigger_ms),
                queue=(),
                heartbeat_deadline_ms=None,
                restart=None,
                stop=None,
            )
        case SchedulerStopped():
            return _replace_state(
                state,
                status=event.status,
                attempt=event.attempt,
                scheduler=None,
                queue=(),
                heartbeat_deadline_ms=None,
                stop=None,
            )
        case TaskStatusRecorded():
            if event.status is ExecutionState.RUNNING:
                not_running = _without(state.tasks_not_running, event.task_id)
            else:
                not_running = state.tasks_not_running.set(event.task_id, event.status)
            return _replace_state(state, tasks_not_running=not_running)
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


def _pending(state: JobState, triggered: CheckpointTriggered) -> PendingCheckpoint:
    """The new pending checkpoint, sharing the state's task set when it has the state's tasks."""
    same = triggered.tasks == state.tasks
    return PendingCheckpoint(triggered, task_ids=state.task_ids if same else frozenset(triggered.tasks))


def _completed(state: JobState, event: CheckpointCompleted) -> JobState:
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
    if state.status is JobStatus.FAILING:
        times.append(0)  # the restart decision a cut-short write lost: at once (see _tick)
    if state.status is JobStatus.RUNNING and state.heartbeat_deadline_ms is not None:
        times.append(state.heartbeat_deadline_ms)
    scheduler = state.scheduler
    if scheduler is not None and scheduler.next_trigger_ms is not None and state.stop is None:
        times.append(scheduler.next_trigger_ms)
    return min(times, default=None)


# ----------------------------------------------------------------------- decide


class _Deciding:
    """Collects a command's decisions and the state after each, so later rules see earlier facts.

    Every rule records what it decides here and returns nothing: a refusal of the input is one
    :class:`InputRejected` (from :mod:`coordinator.core.checks`), a no-op records nothing.
    """

    __slots__ = ("events", "state", "states")

    def __init__(self, state: JobState) -> None:
        self.state = state
        self.events: list[Decision] = []
        self.states: list[JobState] = []  # the state after each event

    def emit(self, event: Decision) -> None:
        self.events.append(event)
        self.state = evolve(self.state, event)
        self.states.append(self.state)

    def refused(self, refusal: InputRejected | None) -> bool:
        """Record ``refusal``, if the checks made one: then the rule decides nothing else."""
        if refusal is None:
            return False
        self.emit(refusal)
        return True


def decide(state: JobState, command: Command) -> list[Decision]:
    """The events that ``command`` leads to in ``state``, in order.

    Each event is evolved into an interim state before the next rule runs, so
    ``fold(decide(s, c), s)`` is the state after the command. An idempotent
    repeat (a duplicate ack, a late ack, a repeated decline) gives ``[]``; an
    unacceptable input gives one :class:`InputRejected`.
    """
    d = _Deciding(state)
    _decide(d, command)
    return d.events


def decide_steps(state: JobState, command: Command) -> list[tuple[Decision, JobState]]:
    """``decide``, each decision paired with the state after it (``fold`` of the decisions so far).

    ``decide`` evolves every decision into an interim state anyway; the shell takes those states
    instead of evolving each decision a second time.
    """
    d = _Deciding(state)
    _decide(d, command)
    return list(zip(d.events, d.states, strict=True))


def _decide(d: _Deciding, command: Command) -> None:
    if d.refused(checks.job_of(d.state, command.job_id)):
        return
    match command:
        case ChangeJobStatus():
            _change_job_status(d, command)
        case ChangeTaskStatus():
            _change_task_status(d, command)
        case RequestCheckpoint():
            _request_checkpoint(d, command)
        case StopJob():
            _stop_with_savepoint(d, command)
        case CancelJob():
            _cancel(d, command)
        case AcknowledgeCheckpoint():
            _acknowledge(d, command)
        case DeclineCheckpoint():
            _decline(d, command)
        case RecordHeartbeat():
            _record_heartbeat(d, command)
        case Tick():
            _tick(d, command)
        case _:
            assert_never(command)


def _change_job_status(d: _Deciding, command: ChangeJobStatus) -> None:
    changed, now, state = command.changed, command.now_ms, d.state
    if d.refused(checks.job_status(state, changed)):
        return
    error = _quoted(changed.error)
    if changed.status is JobStatus.RUNNING:
        if state.status is JobStatus.CANCELLING and changed.attempt <= state.attempt:
            return  # a late report of the attempt being canceled starts nothing again
        if state.status is JobStatus.CANCELLING:
            # Cancel wins over a restart (Flink cancels a job in its restart delay for good): an
            # attempt started after the cancel starts nothing, and is told to stop and report CANCELED.
            late = f"attempt {changed.attempt} started after the job was canceled"
            _stop(d, now, JobStatus.CANCELLING, late, attempt=changed.attempt)
            return
        if state.status is not JobStatus.RUNNING or changed.attempt != state.attempt:
            _start(d, command)
        return
    if changed.status is state.status and changed.attempt == state.attempt:
        return
    if state.status is JobStatus.CANCELED and changed.attempt <= state.attempt:
        return  # a late or redelivered report of a canceled attempt (FAILING, say) restarts nothing
    if changed.status is JobStatus.FAILING and state.status is JobStatus.CANCELLING:
        # Flink: a job that fails while it is being canceled ends CANCELED; nothing restarts it.
        _stop(d, now, JobStatus.CANCELED, error, attempt=changed.attempt)
        return
    if changed.status is JobStatus.FAILING:
        if changed.attempt == state.attempt and state.status in FAILED_OR_RESTARTING:
            return  # that attempt's failure was decided already (a heartbeat expired, say)
        _fail(d, now, error or f"attempt {changed.attempt} reported FAILING", command.jitter,
              Reason.CHECKPOINT_COORDINATOR_SUSPEND, attempt=changed.attempt)  # fmt: skip
        return
    _stop(d, now, changed.status, error, attempt=changed.attempt)


def _start(d: _Deciding, command: ChangeJobStatus) -> None:
    """A new attempt runs: stop the old one's scheduler, note what it restored, start the scheduler."""
    changed, now = command.changed, command.now_ms
    assert changed.config is not None  # checks.job_status admits no RUNNING status without one
    if d.state.scheduler is not None:
        _stop(d, now, JobStatus.RESTARTING, f"attempt {changed.attempt} started")
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


def _first_trigger(config: CheckpointConfig, now: int, jitter: float) -> int | None:
    """Flink: the first tick after a random delay in ``[min_pause, base_interval]``."""
    if config.interval_ms <= 0:
        return None
    low, high = config.min_pause_ms, config.base_interval_ms
    jitter = min(max(jitter, 0.0), 1.0)
    return now + min(high, low + int(jitter * (high - low + 1)))


def _stop(
    d: _Deciding,
    now: int,
    status: JobStatus,
    error: str | None,
    attempt: int | None = None,
    reason: Reason = Reason.CHECKPOINT_COORDINATOR_SUSPEND,
) -> None:
    """Stop the scheduler: abort pending checkpoints (``reason``) and queued requests (SUSPEND)."""
    state = d.state
    message = f"job is {status}" + (f": {error}" if error else "")
    _abort_pending_and_queued(d, now, message, reason)
    d.emit(
        SchedulerStopped(
            job_id=state.job_id,
            attempt=state.attempt if attempt is None else attempt,
            timestamp_ms=now,
            status=status,
            error=error,
        )
    )


def _abort_pending_and_queued(
    d: _Deciding, now: int, message: str, reason: Reason = Reason.CHECKPOINT_COORDINATOR_SUSPEND
) -> None:
    """Flink's ``abortPendingAndQueuedCheckpoints``: every pending checkpoint (``reason``) and every
    queued request (SUSPEND)."""
    state = d.state
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


FAILED_OR_RESTARTING = frozenset({JobStatus.FAILING, JobStatus.RESTARTING, JobStatus.FAILED})


def _fail(
    d: _Deciding, now: int, failure: str, jitter: float, reason: Reason, attempt: int | None = None
) -> None:
    """The job failed: stop it (FAILING), then the restart strategy restarts it or gives up."""
    _stop(d, now, JobStatus.FAILING, failure, attempt=attempt, reason=reason)
    _restart_or_give_up(d, now, failure, jitter)


def _restart_or_give_up(d: _Deciding, now: int, failure: str, jitter: float) -> None:
    """The restart strategy's decision on the FAILING job: a restart, or giving up for good."""
    state = d.state
    history = RestartHistory(state.restarts, state.backoff_ms, state.last_failure_ms, state.failure_times)
    if state.config is None:
        never_ran = "the job never ran with a configuration (no restart strategy)"
        restart_plan: RestartAfterDelay | GiveUpRestarting = GiveUpRestarting(never_ran)
    else:
        restart_plan = on_failure(state.config.restart_strategy, history, now, jitter)
    if isinstance(restart_plan, GiveUpRestarting):
        d.emit(JobFailedPermanently(state.job_id, state.attempt, now, restart_plan.reason, failure))
        return
    # Flink restores the latest completed checkpoint, or what the attempt itself started from.
    restore = state.latest_completed or state.restored
    d.emit(
        JobRestartScheduled(
            job_id=state.job_id,
            attempt=state.attempt + 1,
            timestamp_ms=now,
            delay_ms=restart_plan.delay_ms,
            failure=failure,
            restarts=restart_plan.restarts,
            backoff_ms=restart_plan.backoff_ms,
            restore_checkpoint_id=None if restore is None else restore.checkpoint_id,
            restore_location=None if restore is None else restore.location or None,
        )
    )


def _record_heartbeat(d: _Deciding, command: RecordHeartbeat) -> None:
    state = d.state
    if d.refused(checks.heartbeat(state, command.heartbeat)):
        return
    if state.status is not JobStatus.RUNNING or state.config is None:
        return  # late: the attempt failed or stopped already
    deadline = command.now_ms + state.config.heartbeat_timeout_ms
    d.emit(JobHeartbeatRecorded(state.job_id, state.attempt, command.now_ms, deadline))


def _change_task_status(d: _Deciding, command: ChangeTaskStatus) -> None:
    changed, now, state = command.changed, command.now_ms, d.state
    if changed.status is ExecutionState.RUNNING and (not state.known or changed.attempt > state.attempt):
        return  # a task that started before its job's RUNNING: every barrier of the attempt reaches it
    if d.refused(checks.task_input(state, changed.attempt, changed.task_id)):
        return
    recorded = state.tasks_not_running.get(changed.task_id, ExecutionState.RUNNING)
    if changed.status is recorded:
        return
    d.emit(
        TaskStatusRecorded(
            job_id=changed.job_id,
            task_id=changed.task_id,
            attempt=changed.attempt,
            status=changed.status,
            timestamp_ms=now,
            error=_quoted(changed.error),
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
                        + (f": {_quoted(changed.error)}" if changed.error else ""),
                        task_id=changed.task_id,
                    )
                )
        _poll_queue(d, now)


def barriers_owed(state: JobState, task_id: str) -> list[CheckpointTriggered]:
    """The pending checkpoints ``task_id`` has not acknowledged, oldest first.

    A task that reports RUNNING (a participant reports it once it listens for barriers) may have
    started after they were triggered and never seen their barriers: the shell sends it those again
    (Flink deploys a task before it triggers; here tasks may start after their job's RUNNING). A
    task that saw them answers the same again, and a duplicate ack changes nothing.
    """
    return [
        pending.triggered
        for _, pending in sorted(state.pending.items())
        if task_id in pending.task_ids and task_id not in pending.acks
    ]


def _request_checkpoint(d: _Deciding, command: RequestCheckpoint) -> None:
    request, now, state = command.request, command.now_ms, d.state
    savepoint = request.kind is CheckpointKind.SAVEPOINT
    if d.refused(
        checks.known_job(state)
        or checks.request_fields(state, request.request_id, request.target, savepoint=savepoint)
    ):
        return
    if state.stop is not None:
        d.emit(_rejected_request(command, Reason.JOB_STOPPING, _stopping(state.stop)))
        return
    if not state.all_tasks_running:
        d.emit(_rejected_request(command, Reason.NOT_ALL_REQUIRED_TASKS_RUNNING, _not_running(state)))
        return
    if savepoint and request.target is not None:
        problem = _target_problem(state, request.target, command.savepoint_roots)
        if problem is not None:
            d.emit(_rejected_request(command, Reason.SAVEPOINT_TARGET_NOT_ALLOWED, problem))
            return
    if savepoint and state.pending_savepoints >= MAX_PENDING_SAVEPOINTS:
        message = f"{MAX_PENDING_SAVEPOINTS} savepoints are pending already: wait for one to complete"
        d.emit(_rejected_request(command, Reason.TOO_MANY_CHECKPOINT_REQUESTS, message))
        return
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
        return
    if savepoint and _linked_savepoint(d, command, request.target):
        return
    _trigger(d, now, request.kind, periodic=False, request_id=request.request_id, target=request.target)


def savepoint_roots(location: str, configured: tuple[str, ...]) -> tuple[StorageUri, ...]:
    """Where savepoints of a job with checkpoint ``location`` may go.

    The roots the coordinator was given (``cutline coordinator --savepoint-root``); without any,
    the parent of the checkpoint location, so ``.../checkpoints`` and ``.../savepoints`` side by
    side work out of the box (Flink's usual ``state.checkpoints.dir`` and ``state.savepoints.dir``),
    but a savepoint cannot be pointed at any other directory the tasks can write to. A ``file:``
    location right below ``/`` has no such parent: then only the location itself.
    """
    if configured:
        return tuple(r for r in map(storage_uri, configured) if not isinstance(r, str))
    root = storage_uri(location)
    if isinstance(root, str):
        return ()
    parent = root.parent
    if parent is None or (parent.scheme == "file" and not parent.segments):
        return (root,)
    return (parent,)


@functools.lru_cache(maxsize=1024)
def trusted_roots(location: str, configured: tuple[str, ...]) -> tuple[str, ...]:
    """The directories a job's checkpoints and savepoints may be written below: its savepoint roots
    and its checkpoint location (where checkpoints, and savepoints without a target, go)."""
    return (*(str(r) for r in savepoint_roots(location, configured)), location)


def savepoint_location(state: JobState, target: str | None, now: int) -> str:
    """Where a savepoint the job triggers at ``now`` (for ``target``) goes: its next id's directory."""
    return _location(state, state.next_checkpoint_id, CheckpointKind.SAVEPOINT, target, now)


def _linked_savepoint(d: _Deciding, command: RequestCheckpoint | StopJob, target: str | None) -> bool:
    """Refuse a savepoint whose location the file system showed to lead out of its roots."""
    if not command.links:
        return False
    state = d.state
    location = savepoint_location(state, target, command.now_ms)
    roots = trusted_roots(state.config.location if state.config else "", command.savepoint_roots)
    return d.refused(checks.linked_savepoint(state, location, roots, command.links))


def _target_problem(state: JobState, target: str, configured: tuple[str, ...]) -> str | None:
    parsed = storage_uri(target)
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


def _rejected_request(command: RequestCheckpoint | StopJob, reason: Reason, message: str) -> TriggerRejected:
    request = command.request
    return TriggerRejected(
        job_id=command.job_id,
        reason=reason,
        request_id=request.request_id,
        timestamp_ms=command.now_ms,
        kind=request.kind if isinstance(request, CheckpointRequested) else CheckpointKind.SAVEPOINT,
        message=message,
    )


def _stopping(stop: CheckpointTriggered) -> str:
    return f"the job is stopping with savepoint {stop.checkpoint_id} (cutline stop)"


def _stop_with_savepoint(d: _Deciding, command: StopJob) -> None:
    """Flink's stop-with-savepoint: stop the scheduler (pending checkpoints and queued requests are
    aborted, so that only the savepoint's data is committed), then trigger a savepoint whose barrier
    tells the tasks to read nothing after its cut. Its completion leaves the job to its driver, which
    stops and reports FINISHED; its abort resumes the scheduler (``evolve`` clears ``stop``)."""
    request, now, state = command.request, command.now_ms, d.state
    if d.refused(
        checks.known_job(state)
        or checks.request_fields(state, request.request_id, request.target, savepoint=True)
    ):
        return
    if state.stop is not None:
        d.emit(_rejected_request(command, Reason.JOB_STOPPING, _stopping(state.stop)))
        return
    if not state.all_tasks_running:
        d.emit(_rejected_request(command, Reason.NOT_ALL_REQUIRED_TASKS_RUNNING, _not_running(state)))
        return
    if request.target is not None:
        problem = _target_problem(state, request.target, command.savepoint_roots)
        if problem is not None:
            d.emit(_rejected_request(command, Reason.SAVEPOINT_TARGET_NOT_ALLOWED, problem))
            return
    if _linked_savepoint(d, command, request.target):
        return
    message = f"the job is stopping with a savepoint (request {excerpt(request.request_id)})"
    _abort_pending_and_queued(d, now, message)
    _trigger(
        d,
        now,
        CheckpointKind.SAVEPOINT,
        periodic=False,
        request_id=request.request_id,
        target=request.target,
        stop=True,
        drain=request.drain,
    )


def _cancel(d: _Deciding, command: CancelJob) -> None:
    """Flink's cancel: the scheduler stops (pending checkpoints abort) and the job is CANCELLING until
    its driver, which reads this in the journal, stops and reports CANCELED."""
    state = d.state
    if d.refused(
        checks.known_job(state)
        or checks.request_fields(state, command.request.request_id, None, savepoint=False)
    ):
        return
    if state.status in ENDED_OR_CANCELLING:
        return  # nothing left to cancel, or a repeated request
    _stop(
        d,
        command.now_ms,
        JobStatus.CANCELLING,
        f"cancel requested (request {excerpt(command.request.request_id)})",
    )


ENDED_OR_CANCELLING = frozenset(
    {JobStatus.CANCELLING, JobStatus.CANCELED, JobStatus.FINISHED, JobStatus.FAILED}
)


def _not_running(state: JobState) -> str:
    if state.status is not JobStatus.RUNNING:
        return f"job is {state.status}"
    tasks = [f"{excerpt(t, NAMED_TASK_CHARS)} is {s}" for t, s in sorted(state.tasks_not_running.items())]
    return f"not all tasks are RUNNING: {_first_of(tasks, 'tasks are not RUNNING')}"


MAX_QUOTED_MESSAGE_CHARS = 4096
"""Characters of a task's own message (a decline's, a failure's) that a decision quotes."""

NAMED_TASKS = 10
"""Most tasks a decision's message names; the rest are counted (a job may have 100,000 tasks, and a
tick-decided record that named them all would not fit the journal: nothing could expire then)."""

NAMED_TASK_CHARS = 200
"""Characters of one task id in a message (ids may be far longer)."""


def _quoted(message: str | None) -> str | None:
    """A task's or driver's own message as a decision quotes it: cut to
    :data:`MAX_QUOTED_MESSAGE_CHARS`, so that the decision fits the journal and the status is never
    refused for its length (every queued request's abort quotes it again)."""
    return None if message is None else bounded(message, MAX_QUOTED_MESSAGE_CHARS)


def _first_of(names: list[str], what: str) -> str:
    """``names`` joined, or the first :data:`NAMED_TASKS` of them and how many there are."""
    if len(names) <= NAMED_TASKS:
        return ", ".join(names)
    return f"{len(names)} {what}, the first {NAMED_TASKS}: " + ", ".join(names[:NAMED_TASKS])


def _max_concurrent(state: JobState) -> int:
    return state.config.max_concurrent if state.config else 1


def _trigger(
    d: _Deciding,
    now: int,
    kind: CheckpointKind,
    *,
    periodic: bool,
    request_id: str | None,
    target: str | None,
    next_trigger_ms: int | None = None,
    stop: bool = False,
    drain: bool = False,
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
            location=_location(state, checkpoint_id, kind, target, now),
            tasks=state.tasks,
            deadline_ms=now + state.config.timeout_ms,
            periodic=periodic,
            request_id=request_id,
            next_trigger_ms=next_trigger_ms,
            inline_limit_bytes=inline_limit(state.config.inline_threshold_bytes, len(state.tasks)),
            stop=stop,
            drain=drain,
        )
    )


def inline_limit(threshold: int, tasks: int) -> int:
    """The largest snapshot one of ``tasks`` may send inline: the job's threshold, cut down so that
    every task's inline state together stays within :data:`INLINE_BUDGET_BYTES` (the completion
    record carries all of it, and must stay one Kafka record)."""
    return min(threshold, INLINE_BUDGET_BYTES // max(1, tasks))


def _location(state: JobState, checkpoint_id: int, kind: CheckpointKind, target: str | None, now: int) -> str:
    assert state.config is not None
    if kind is CheckpointKind.SAVEPOINT:
        name = savepoint_name(state.job_id, checkpoint_id, state.attempt, now)
        parsed = storage_uri(target) if target else None
        if isinstance(parsed, StorageUri):  # checked by _target_problem when it was requested
            return f"{str(parsed).rstrip('/')}/{name}"
        return f"{state.config.location.rstrip('/')}/{state.job_id}/{name}"
    return f"{state.config.location.rstrip('/')}/{state.job_id}/chk-{checkpoint_id}"


SAVEPOINT_JOB_CHARS = 40
"""Characters of the job id a savepoint's directory name keeps (the digest tells jobs apart)."""


def savepoint_name(job_id: str, checkpoint_id: int, attempt: int, now: int) -> str:
    """A savepoint's directory: ``savepoint-<job>-<id>-<12 hex digits>``, Flink's
    ``savepoint-<jobid>-<random>`` with the checkpoint id for people. Savepoints of different jobs
    (or of one job id run twice) in one target never share a directory: the digest covers the whole
    job id, the attempt and the time. Deterministic, so that replay derives the same name; the job
    part keeps only characters safe in any file system and URI."""
    job = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in job_id)
    digest = hashlib.sha256(f"{job_id}\x00{checkpoint_id}\x00{attempt}\x00{now}".encode()).hexdigest()
    return f"savepoint-{job[:SAVEPOINT_JOB_CHARS]}-{checkpoint_id}-{digest[:12]}"


def _poll_queue(d: _Deciding, now: int) -> None:
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


def _tick(d: _Deciding, command: Tick) -> None:
    now, state = command.now_ms, d.state
    if state.status is JobStatus.FAILING:
        # Only a decision whose journal write was cut short leaves a job FAILING (the strategy's
        # decision always follows the stop): the tick derives what was lost.
        _restart_or_give_up(
            d, now, f"attempt {state.attempt} failed (its restart decided again)", command.jitter
        )
        return
    _complete_the_acknowledged(d, now)
    state = d.state
    deadline = state.heartbeat_deadline_ms
    if state.status is JobStatus.RUNNING and deadline is not None and now >= deadline:
        timeout = state.config.heartbeat_timeout_ms if state.config else 0
        failure = f"no heartbeat of attempt {state.attempt} for {timeout} ms (heartbeat_timeout_ms)"
        _fail(d, now, failure, command.jitter, Reason.TASK_FAILURE)
        return
    expired = sorted(cid for cid, p in d.state.pending.items() if p.triggered.deadline_ms <= now)
    for checkpoint_id in expired:
        _abort(
            d,
            now,
            checkpoint_id,
            Reason.CHECKPOINT_EXPIRED,
            f"not acknowledged by {_missing(d.state.pending[checkpoint_id])} before its deadline",
        )
    _poll_queue(d, now)  # after expiries, or after a write that lost the trigger of a queued request
    scheduler, state = d.state.scheduler, d.state
    if scheduler is None or scheduler.next_trigger_ms is None or now < scheduler.next_trigger_ms:
        return
    if state.stop is not None:
        return  # Flink stops the scheduler for a stop-with-savepoint; it resumes if that fails
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
        return
    resume_at = _pause_ends(state)
    if resume_at is not None and resume_at > now:
        d.emit(_rejected_periodic(state, now, Reason.MINIMUM_TIME_BETWEEN_CHECKPOINTS, resume_at))
        return
    if not state.all_tasks_running:
        d.emit(
            _rejected_periodic(
                state, now, Reason.NOT_ALL_REQUIRED_TASKS_RUNNING, next_trigger, _not_running(state)
            )
        )
        return
    _trigger(
        d,
        now,
        CheckpointKind.CHECKPOINT,
        periodic=True,
        request_id=None,
        target=None,
        next_trigger_ms=next_trigger,
    )


def _complete_the_acknowledged(d: _Deciding, now: int) -> None:
    """Complete every pending checkpoint that every task acknowledged. The last ack completes it in
    the same decision, so only a journal write cut short between the two leaves one: each tick
    derives the completion again rather than letting the checkpoint expire (act once: the
    acknowledgements are in the journal)."""
    for checkpoint_id in sorted(d.state.pending):
        pending = d.state.pending.get(checkpoint_id)
        if pending is not None and pending.fully_acknowledged:
            _complete(d, now, pending)


def _missing(pending: PendingCheckpoint) -> str:
    missing = [excerpt(t, NAMED_TASK_CHARS) for t in pending.triggered.tasks if t not in pending.acks]
    return _first_of(missing, "tasks") or "nobody"


def _abort(
    d: _Deciding,
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


def _acknowledge(d: _Deciding, command: AcknowledgeCheckpoint) -> None:
    ack, now = command.ack, command.now_ms
    if d.refused(checks.acknowledgement(d.state, ack)):
        return
    pending = d.state.pending.get(ack.checkpoint_id)
    if pending is None:
        return  # late: the checkpoint completed or aborted already (Flink logs and discards)
    if ack.task_id in pending.acks:
        return  # duplicate: a retried task or a re-run batch acknowledged twice
    if command.links and d.refused(
        checks.linked_handle(d.state, ack.state, pending.triggered.location, command.links)
    ):
        return
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
    acknowledged = d.state.pending[ack.checkpoint_id]
    if acknowledged.fully_acknowledged:
        _complete(d, now, acknowledged)


def _complete(d: _Deciding, now: int, pending: PendingCheckpoint) -> None:
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


def _decline(d: _Deciding, command: DeclineCheckpoint) -> None:
    decline, now = command.decline, command.now_ms
    if d.refused(checks.declination(d.state, decline)):
        return
    if decline.checkpoint_id not in d.state.pending:
        return  # already aborted or completed: repeated declines are no-ops
    _abort(
        d,
        now,
        decline.checkpoint_id,
        Reason.CHECKPOINT_DECLINED,
        f"task {excerpt(decline.task_id)} declined ({excerpt(decline.reason)}): "
        + bounded(decline.message, MAX_QUOTED_MESSAGE_CHARS),
        task_id=decline.task_id,
    )
    _poll_queue(d, now)
