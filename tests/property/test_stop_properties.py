"""Stop with a savepoint, as invariants over random runs of one job: once its stop savepoint has
completed nothing is triggered any more, and a stop savepoint that fails leaves the job RUNNING."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.commands import Command
from coordinator.core.decider import Decision, decide, fold
from coordinator.core.state import JobState, initial_state
from coordinator.core.testing import JOB, ack, cancel, decline, request, running, stop, tick
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointKind,
    CheckpointTriggered,
    JobStatus,
    SchedulerStopped,
)

TASKS = ("t0", "t1")
ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["tick", "ack", "decline", "request", "savepoint", "stop", "cancel"]),
        st.integers(0, 3_000),  # time passing before it
        st.integers(0, 1),  # which task
    ),
    max_size=40,
)


def command(action: str, now: int, task: str, state: JobState) -> Command:
    """The command ``action`` means in ``state`` (an ack or decline answers the oldest pending)."""
    pending = min(state.pending, default=max(1, state.next_checkpoint_id - 1))
    match action:
        case "ack":
            return ack(pending, task, at=now)
        case "decline":
            return decline(pending, task, at=now)
        case "request":
            return request(request_id=f"r{now}", at=now)
        case "savepoint":
            return request(CheckpointKind.SAVEPOINT, request_id=f"s{now}", at=now)
        case "stop":
            return stop(request_id=f"stop{now}", at=now)
        case "cancel":
            return cancel(at=now)
    return tick(now)


def play(actions: list[tuple[str, int, int]]) -> list[tuple[list[Decision], JobState]]:
    """Every command's decisions and the state after them, from a job RUNNING at 0."""
    state, now, steps = initial_state(JOB), 0, []
    for command_ in [running(tasks=TASKS, at=0)]:
        events = decide(state, command_)
        state = fold(events, state)
    for action, wait, task in actions:
        now += wait
        events = decide(state, command(action, now, TASKS[task], state))
        state = fold(events, state)
        steps.append((events, state))
    return steps


@settings(max_examples=300, deadline=None)
@given(ACTIONS)
def test_nothing_is_triggered_after_a_stop_savepoint_completes(actions: list[tuple[str, int, int]]) -> None:
    stops: set[int] = set()
    stopped = False
    for events, _ in play(actions):
        for event in events:
            if isinstance(event, CheckpointTriggered):
                assert not stopped, f"checkpoint {event.checkpoint_id} triggered after the stop savepoint"
                if event.stop:
                    stops.add(event.checkpoint_id)
            elif isinstance(event, CheckpointCompleted) and event.checkpoint_id in stops:
                stopped = True


@settings(max_examples=300, deadline=None)
@given(ACTIONS)
def test_a_failed_stop_savepoint_leaves_the_job_running(actions: list[tuple[str, int, int]]) -> None:
    stops: set[int] = set()
    for events, state in play(actions):
        stops |= {e.checkpoint_id for e in events if isinstance(e, CheckpointTriggered) and e.stop}
        failed = [e for e in events if isinstance(e, CheckpointAborted) and e.checkpoint_id in stops]
        if failed and not any(isinstance(e, SchedulerStopped) for e in events):
            assert (JobStatus.RUNNING, None) == (state.status, state.stop), failed
