"""A decision whose journal write was cut short is derived again (issue 53).

The coordinator writes a decision's records in order; a transient failure can land the first and
lose the rest. Recovery folds what landed and skips the input, which is in the journal. Before,
that left a checkpoint every task had acknowledged without its completion (it expired), or a job
FAILING with no restart decision (its driver waited for ever). Now every tick derives what a
complete decision would have: given the journal up to the cut, when time passes, then the lost
decision follows.
"""

from __future__ import annotations

from coordinator.core.decider import decide, due_at, fold
from coordinator.core.state import JobState, initial_state
from coordinator.core.testing import JOB, ack, config, job_status, request, running, tick
from events.wire.records import (
    CheckpointCompleted,
    CheckpointTriggered,
    JobRestartScheduled,
    JobStatus,
    TaskAcknowledged,
)


def journal_cut_after(commands: list, keep: int) -> JobState:  # type: ignore[type-arg]
    """The state folded from the journal of ``commands``, of which the last decision's write
    landed only its first ``keep`` records."""
    state = initial_state(JOB)
    for command in commands[:-1]:
        state = fold(decide(state, command), state)
    landed = decide(state, commands[-1])[:keep]
    return fold(landed, state)


def test_a_completion_lost_after_the_last_ack_is_derived_on_the_next_tick() -> None:
    cut = journal_cut_after([running(at=0), tick(1000), ack(1, "t0", at=1001), ack(1, "t1", at=1002)], keep=1)
    assert cut.pending[1].fully_acknowledged and cut.last_completed_id == 0

    events = decide(cut, tick(1500))

    assert isinstance(events[0], CheckpointCompleted) and events[0].checkpoint_id == 1
    assert [] == [e for e in events if isinstance(e, TaskAcknowledged)]  # nothing acknowledged twice


def test_the_completion_is_derived_before_the_deadline_would_expire_it() -> None:
    cut = journal_cut_after([running(at=0), tick(1000), ack(1, "t0", at=1001), ack(1, "t1", at=1002)], keep=1)

    events = decide(cut, tick(1000 + 10_000))

    assert [CheckpointCompleted] == [type(e) for e in events][:1]


def test_a_restart_decision_lost_after_the_failing_stop_is_derived_at_once() -> None:
    cut = journal_cut_after([running(at=0), job_status(JobStatus.FAILING, error="boom", at=50)], keep=1)
    assert JobStatus.FAILING is cut.status and due_at(cut) is not None

    events = decide(cut, tick(due_at(cut) or 0))

    (restart,) = events
    assert isinstance(restart, JobRestartScheduled) and 2 == restart.attempt


def test_a_trigger_of_a_queued_request_lost_after_a_completion_is_derived_on_the_next_tick() -> None:
    commands = [running(cfg=config(interval_ms=0), at=0), request(request_id="r1", at=5)]
    commands += [request(request_id="r2", at=6), ack(1, "t0", at=7), ack(1, "t1", at=8)]
    cut = journal_cut_after(commands, keep=2)  # the ack and the completion, not r2's trigger
    assert [q.request_id for q in cut.queue] == ["r2"] and not cut.pending

    events = decide(cut, tick(10))

    assert [CheckpointTriggered] == [type(e) for e in events]
    assert "r2" == events[0].request_id  # type: ignore[union-attr]


def test_a_complete_decision_leaves_nothing_for_the_tick() -> None:
    """Nothing is derived twice: after the whole decision, the tick before any deadline decides nothing."""
    state = initial_state(JOB)
    for command in [
        running(cfg=config(interval_ms=0), at=0),
        request(at=5),
        ack(1, "t0", at=7),
        ack(1, "t1", at=8),
    ]:
        state = fold(decide(state, command), state)

    assert [] == decide(state, tick(10))
