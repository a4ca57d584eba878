"""Named invariants over a journal: what must hold for any sequence the coordinator decides.

The Hypothesis tests check every decided sequence with :func:`violations`, and
``cutline replay --verify`` checks a recorded journal the same way. Each rule
is one small predicate over the job's state *before* an event (as folding the
journal so far gives it) and the event itself; it returns a sentence when the
event breaks the rule, else ``None``. The end-of-journal rule looks at the
state after the last event. Checking costs one ``evolve`` per event plus
constant work (a pending checkpoint's tasks at most), so it keeps up with a
replay of millions of events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from coordinator.core.checks import inline_problem
from coordinator.core.decider import evolve
from coordinator.core.state import (
    COUNTED_REASONS,
    JobState,
    PendingCheckpoint,
    Reason,
    initial_state,
)
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointTriggered,
    JobStatus,
    JournalEvent,
    SchedulerStarted,
    SchedulerStopped,
    TaskAcknowledged,
)

__all__ = ["END_RULE", "Violation", "first_violation", "violations"]


@dataclass(frozen=True, slots=True)
class Violation:
    """One event of a journal that breaks one rule.

    ``index`` is the event's 0-based position in the checked sequence; ``rule``
    is a short stable name (e.g. ``"ids-strictly-increase"``) that tools may
    match on; ``message`` is a sentence naming the checkpoint or task.
    """

    index: int
    job_id: str
    rule: str
    message: str


class _Job:
    """What checking one job needs: its folded state and facts the state forgets."""

    __slots__ = ("last_triggered", "open", "state")

    def __init__(self, state: JobState) -> None:
        self.state = state
        self.last_triggered = max(state.last_completed_id, max(state.pending, default=0))
        self.open: dict[int, int] = {}  # checkpoint id -> index of its CheckpointTriggered


def _pending(state: JobState, checkpoint_id: int) -> PendingCheckpoint | None:
    return state.pending.get(checkpoint_id)


# ------------------------------------------------------------------ triggers


def _ids_strictly_increase(job: _Job, event: CheckpointTriggered) -> str | None:
    """Each checkpoint id of a job is greater than the one triggered before it."""
    if event.checkpoint_id > job.last_triggered:
        return None
    return f"checkpoint {event.checkpoint_id} was triggered after checkpoint {job.last_triggered}"


def _ids_never_reused(job: _Job, event: CheckpointTriggered) -> str | None:
    """A trigger uses an id at or past the counter (which restores move past the restored id)."""
    state = job.state
    if event.checkpoint_id >= state.next_checkpoint_id or event.checkpoint_id <= job.last_triggered:
        return None  # at or below the last trigger: reported as ids-strictly-increase
    return f"checkpoint {event.checkpoint_id} reuses an id: the next free id was {state.next_checkpoint_id}"


def _max_concurrent(job: _Job, event: CheckpointTriggered) -> str | None:
    """A checkpoint (not a savepoint) triggers only while fewer than max_concurrent are pending."""
    state = job.state
    if event.kind is CheckpointKind.SAVEPOINT:
        return None
    limit = state.config.max_concurrent if state.config else 1
    pending = state.pending_checkpoints
    if pending < limit:
        return None
    return f"checkpoint {event.checkpoint_id} was triggered with {pending} pending (max_concurrent {limit})"


def _trigger_in_started_attempt(job: _Job, event: CheckpointTriggered) -> str | None:
    """A checkpoint is triggered only in the attempt the journal started last and has not stopped:
    that attempt's ``SchedulerStarted`` comes first (its driver waits for it: events/task/ledger.py)."""
    state = job.state
    if state.status is JobStatus.RUNNING and event.attempt == state.attempt:
        return None
    return (
        f"checkpoint {event.checkpoint_id} of attempt {event.attempt} was triggered while the job is "
        f"{state.status} in attempt {state.attempt}"
    )


# ---------------------------------------------------------------------- acks


def _ack_only_pending(job: _Job, event: TaskAcknowledged) -> str | None:
    """An accepted acknowledgement is for a pending checkpoint."""
    state = job.state
    if event.checkpoint_id in state.pending:
        return None
    return f"task {event.task_id} acknowledged checkpoint {event.checkpoint_id}, which is not pending"


def _ack_from_required_task(job: _Job, event: TaskAcknowledged) -> str | None:
    """Only a task the checkpoint was triggered for acknowledges it."""
    state = job.state
    pending = _pending(state, event.checkpoint_id)
    if pending is None or event.task_id in pending.task_ids:
        return None
    return f"task {event.task_id} acknowledged checkpoint {event.checkpoint_id} but is not one of its tasks"


def _ack_not_duplicate(job: _Job, event: TaskAcknowledged) -> str | None:
    """A task's acknowledgement of a checkpoint is recorded once."""
    state = job.state
    pending = _pending(state, event.checkpoint_id)
    if pending is None or event.task_id not in pending.acks:
        return None
    return f"task {event.task_id} acknowledged checkpoint {event.checkpoint_id} twice"


def _ack_of_trigger_attempt(job: _Job, event: TaskAcknowledged) -> str | None:
    """An acknowledgement comes from the job attempt that triggered the checkpoint."""
    state = job.state
    pending = _pending(state, event.checkpoint_id)
    if pending is None or event.attempt == pending.triggered.attempt:
        return None
    return (
        f"task {event.task_id} of attempt {event.attempt} acknowledged checkpoint "
        f"{event.checkpoint_id} of attempt {pending.triggered.attempt}"
    )


def _ack_inline_state_fits(job: _Job, event: TaskAcknowledged) -> str | None:
    """Inline state is no larger than its checkpoint allows and matches its handle's size and sha256."""
    if event.state is None or event.state.inline is None:
        return None
    pending = _pending(job.state, event.checkpoint_id)
    if pending is None:
        return None
    problem = inline_problem(event.state, pending.triggered.inline_limit_bytes)
    if problem is None:
        return None
    return f"task {event.task_id}'s acknowledgement of checkpoint {event.checkpoint_id}: {problem}"


# --------------------------------------------------------------- completions


def _complete_only_pending(job: _Job, event: CheckpointCompleted) -> str | None:
    """Only a pending checkpoint completes."""
    state = job.state
    if event.checkpoint_id in state.pending:
        return None
    return f"checkpoint {event.checkpoint_id} completed but was not pending"


def _complete_after_every_ack(job: _Job, event: CheckpointCompleted) -> str | None:
    """A checkpoint completes only once every task of the current attempt acknowledged it."""
    state = job.state
    pending = _pending(state, event.checkpoint_id)
    if pending is None:
        return None
    triggered = pending.triggered
    if triggered.attempt != state.attempt:
        return (
            f"checkpoint {event.checkpoint_id} of attempt {triggered.attempt} completed "
            f"during attempt {state.attempt}"
        )
    missing = [t for t in triggered.tasks if t not in pending.acks]
    if missing:
        who = ", ".join(missing)
        return f"checkpoint {event.checkpoint_id} completed without acknowledgements from {who}"
    stale = sorted(t for t, a in pending.acks.items() if a.attempt != triggered.attempt)
    if stale:
        return (
            f"checkpoint {event.checkpoint_id} completed with acknowledgements from {', '.join(stale)} "
            f"of another attempt than {triggered.attempt}"
        )
    return None


def _complete_with_acknowledged_state(job: _Job, event: CheckpointCompleted) -> str | None:
    """A completion's state handles are exactly those its tasks acknowledged (inline bytes too)."""
    pending = _pending(job.state, event.checkpoint_id)
    if pending is None or event.metadata is not None:
        return None  # by reference: the handles are in its metadata object, checked by its sha256
    acknowledged = {t: a.state for t, a in pending.acks.items() if a.state is not None}
    if dict(event.handles) == acknowledged:
        return None
    differ = sorted(
        t for t in set(acknowledged) | set(event.handles) if acknowledged.get(t) != event.handles.get(t)
    )
    return (
        f"checkpoint {event.checkpoint_id} completed with state handles its tasks did not acknowledge: "
        + ", ".join(differ)
    )


# -------------------------------------------------------------------- aborts


def _abort_only_pending(job: _Job, event: CheckpointAborted) -> str | None:
    """Only a pending checkpoint aborts."""
    state = job.state
    if event.checkpoint_id in state.pending:
        return None
    return f"checkpoint {event.checkpoint_id} aborted ({event.reason}) but was not pending"


def _savepoint_never_subsumed(job: _Job, event: CheckpointAborted) -> str | None:
    """A savepoint is never aborted as CHECKPOINT_SUBSUMED."""
    state = job.state
    pending = _pending(state, event.checkpoint_id)
    if event.reason != Reason.CHECKPOINT_SUBSUMED or pending is None or not pending.is_savepoint:
        return None
    return f"savepoint {event.checkpoint_id} was aborted as {Reason.CHECKPOINT_SUBSUMED}"


def _failure_counted_by_rules(job: _Job, event: CheckpointAborted) -> str | None:
    """Only a counted reason of a checkpoint (not savepoint) newer than the last success counts."""
    state = job.state
    if not event.counts_as_failure:
        return None
    pending = _pending(state, event.checkpoint_id)
    if event.reason not in COUNTED_REASONS:
        why = f"{event.reason} is not a counted reason"
    elif pending is not None and pending.is_savepoint:
        why = "it is a savepoint"
    elif event.checkpoint_id <= state.last_completed_id:
        why = f"checkpoint {state.last_completed_id} completed after it"
    else:
        return None
    return f"checkpoint {event.checkpoint_id} was counted as a failure, but {why}"


def _threshold_only_when_exceeded(job: _Job, event: CheckpointFailureThresholdExceeded) -> str | None:
    """The failure threshold is exceeded only when more than tolerable_failures failures are counted."""
    state = job.state
    tolerable = state.config.tolerable_failures if state.config else 0
    if state.failures > tolerable:
        return None
    return (
        f"the failure threshold was exceeded at checkpoint {event.checkpoint_id} "
        f"with {state.failures} counted failures (tolerable {tolerable})"
    )


# ----------------------------------------------------------------- scheduler


def _scheduler_change_after_aborts(job: _Job, event: SchedulerStarted | SchedulerStopped) -> str | None:
    """The scheduler starts or stops only after every pending checkpoint was aborted."""
    state = job.state
    if not state.pending:
        return None
    ids = ", ".join(str(i) for i in sorted(state.pending))
    verb = "started" if isinstance(event, SchedulerStarted) else "stopped"
    return f"the scheduler {verb} (attempt {event.attempt}) with checkpoints {ids} still pending"


def _trigger_ends_resolved(state: JobState, checkpoint_id: int) -> str | None:
    """A triggered checkpoint ends completed, aborted, or pending in the RUNNING attempt that triggered it."""
    pending = _pending(state, checkpoint_id)
    if pending is None:
        return f"checkpoint {checkpoint_id} is neither completed, aborted nor pending"
    if state.status is not JobStatus.RUNNING or pending.triggered.attempt != state.attempt:
        return (
            f"checkpoint {checkpoint_id} of attempt {pending.triggered.attempt} is still pending "
            f"while the job is {state.status} in attempt {state.attempt}"
        )
    return None


# --------------------------------------------------------------------- check


_Rule: TypeAlias = Callable[[_Job, Any], "str | None"]
"""A predicate over a job (its state before the event) and one event: how the event breaks it, or None."""

_RULES: dict[type[JournalEvent], tuple[tuple[str, _Rule], ...]] = {
    CheckpointTriggered: (
        ("ids-strictly-increase", _ids_strictly_increase),
        ("ids-never-reused", _ids_never_reused),
        ("max-concurrent", _max_concurrent),
        ("trigger-in-started-attempt", _trigger_in_started_attempt),
    ),
    TaskAcknowledged: (
        ("ack-only-pending", _ack_only_pending),
        ("ack-from-required-task", _ack_from_required_task),
        ("ack-not-duplicate", _ack_not_duplicate),
        ("ack-of-trigger-attempt", _ack_of_trigger_attempt),
        ("ack-inline-state-fits", _ack_inline_state_fits),
    ),
    CheckpointCompleted: (
        ("complete-only-pending", _complete_only_pending),
        ("complete-after-every-ack", _complete_after_every_ack),
        ("complete-with-acknowledged-state", _complete_with_acknowledged_state),
    ),
    CheckpointAborted: (
        ("abort-only-pending", _abort_only_pending),
        ("savepoint-never-subsumed", _savepoint_never_subsumed),
        ("failure-counted-by-rules", _failure_counted_by_rules),
    ),
    CheckpointFailureThresholdExceeded: (("threshold-only-when-exceeded", _threshold_only_when_exceeded),),
    SchedulerStarted: (("scheduler-change-after-aborts", _scheduler_change_after_aborts),),
    SchedulerStopped: (("scheduler-change-after-aborts", _scheduler_change_after_aborts),),
}
"""The rules about each event type, by stable name, in the order they are checked."""

END_RULE = "trigger-ends-resolved"
"""The rule checked once the journal ends (see ``_trigger_ends_resolved``)."""


def _track(job: _Job, index: int, event: JournalEvent) -> None:
    """Remember what the end-of-journal rule and the id rule need, then evolve the state."""
    if isinstance(event, CheckpointTriggered):
        job.last_triggered = max(job.last_triggered, event.checkpoint_id)
        job.open[event.checkpoint_id] = index
    elif isinstance(event, CheckpointCompleted | CheckpointAborted):
        job.open.pop(event.checkpoint_id, None)
    job.state = evolve(job.state, event)


def violations(
    events: Iterable[JournalEvent],
    states: Mapping[str, JobState] | None = None,
    *,
    folded: dict[str, JobState] | None = None,
) -> Iterator[Violation]:
    """Every rule the journal ``events`` break, folding them per job from ``states`` (or nothing).

    Violations of one event come in rule order, events in journal order; those
    of the end-of-journal rule (every trigger completed, aborted or still
    pending) follow the last event, in the order of their triggers. Once the
    events are through, ``folded`` (if given) holds each job's state after them,
    so that a replay that checks need not fold the events a second time.
    """
    jobs: dict[str, _Job] = {}
    for index, event in enumerate(events):
        job = jobs.get(event.job_id)
        if job is None:
            start = states.get(event.job_id) if states is not None else None
            job = jobs[event.job_id] = _Job(start if start is not None else initial_state(event.job_id))
        for rule, check in _RULES.get(type(event), ()):
            message = check(job, event)
            if message is not None:
                yield Violation(index, event.job_id, rule, message)
        _track(job, index, event)
    if folded is not None:
        folded.update((job_id, job.state) for job_id, job in jobs.items())
    unresolved: list[Violation] = []
    for job_id, job in jobs.items():
        for checkpoint_id, index in job.open.items():
            message = _trigger_ends_resolved(job.state, checkpoint_id)
            if message is not None:
                unresolved.append(Violation(index, job_id, END_RULE, message))
    yield from sorted(unresolved, key=lambda v: v.index)


def first_violation(
    events: Iterable[JournalEvent], states: Mapping[str, JobState] | None = None
) -> Violation | None:
    """The first rule the journal breaks, or None when it keeps every rule."""
    return next(violations(events, states), None)
