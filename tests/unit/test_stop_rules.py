"""Stop with a savepoint and cancel (Flink's ``flink stop`` and ``flink cancel``), decided by the
pure coordinator: given/when/then with exact events."""

from __future__ import annotations

from coordinator.core.decider import due_at, savepoint_name
from coordinator.core.state import Reason
from coordinator.core.testing import (
    JOB,
    ack,
    cancel,
    config,
    decline,
    given,
    job_status,
    request,
    running,
    stop,
    tick,
)
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointKind,
    CheckpointTriggered,
    JobStatus,
    SchedulerStarted,
    SchedulerStopped,
    TriggerRejected,
)

SAVEPOINTS = "file:///tmp/savepoints"
SAVEPOINT = CheckpointKind.SAVEPOINT


def stop_trigger(checkpoint_id: int, at: int, *, drain: bool = False) -> CheckpointTriggered:
    return CheckpointTriggered(
        job_id=JOB,
        checkpoint_id=checkpoint_id,
        attempt=1,
        kind=SAVEPOINT,
        timestamp_ms=at,
        location=f"{SAVEPOINTS}/{savepoint_name(JOB, checkpoint_id, 1, at)}",
        tasks=("t0", "t1"),
        deadline_ms=at + 10_000,
        request_id="stop-1",
        stop=True,
        drain=drain,
    )


def stopping(at: int = 10) -> tuple:  # type: ignore[type-arg]
    """A running job (first periodic trigger at 0 + interval) asked to stop into SAVEPOINTS at ``at``."""
    return (running(at=0, jitter=0.999), stop(target=SAVEPOINTS, at=at, savepoint_roots=(SAVEPOINTS,)))


class TestStop:
    def test_a_stop_triggers_a_savepoint_that_says_stop(self) -> None:
        """The savepoint goes to the target, with stop (and drain, if asked) on its trigger."""
        given(running(at=0)).when(
            stop(target=SAVEPOINTS, drain=True, at=10, savepoint_roots=(SAVEPOINTS,))
        ).then(stop_trigger(1, 10, drain=True))

    def test_a_stop_aborts_pending_checkpoints_first(self) -> None:
        """As Flink stops its scheduler: pending checkpoints abort (SUSPEND), so that only the
        savepoint's data is committed."""
        message = "the job is stopping with a savepoint (request stop-1)"

        given(running(at=0, jitter=0.0), tick(0)).when(
            stop(target=SAVEPOINTS, at=10, savepoint_roots=(SAVEPOINTS,))
        ).then(
            CheckpointAborted(JOB, 1, 10, Reason.CHECKPOINT_COORDINATOR_SUSPEND, message),
            stop_trigger(2, 10),
        )

    def test_no_periodic_checkpoint_while_stopping(self) -> None:
        """The periodic trigger is due, but the scheduler waits for the stop; due_at forgets it."""
        stopped = given(*stopping())

        stopped.when(tick(5_000)).then_nothing()
        assert 10 + 10_000 == due_at(stopped.state)  # the savepoint's deadline only

    def test_nothing_is_triggered_after_the_stop_savepoint_completes(self) -> None:
        """After completion the job only waits for its driver: ticks and requests trigger nothing."""
        completed = given(*stopping(), ack(1, "t0", at=20), ack(1, "t1", at=30))
        assert completed.state.latest_savepoint is not None

        completed.when(tick(60_000)).then_nothing()
        completed.when(request(at=40)).then(
            TriggerRejected(
                JOB,
                Reason.JOB_STOPPING,
                "r1",
                40,
                CheckpointKind.CHECKPOINT,
                message="the job is stopping with savepoint 1 (cutline stop)",
            )
        )

    def test_a_second_stop_is_refused(self) -> None:
        given(*stopping()).when(stop(request_id="stop-2", at=20)).then(
            TriggerRejected(
                JOB,
                Reason.JOB_STOPPING,
                "stop-2",
                20,
                SAVEPOINT,
                message="the job is stopping with savepoint 1 (cutline stop)",
            )
        )

    def test_the_driver_reporting_finished_ends_the_stop(self) -> None:
        done = given(*stopping(), ack(1, "t0", at=20), ack(1, "t1", at=30)).when(
            job_status(JobStatus.FINISHED, at=40)
        )

        done.then(SchedulerStopped(JOB, 1, 40, JobStatus.FINISHED))
        assert (JobStatus.FINISHED, None) == (done.state.status, done.state.stop)

    def test_a_declined_stop_savepoint_leaves_the_job_running_and_checkpointing(self) -> None:
        """Flink: a failed stop-with-savepoint keeps the job running; the scheduler resumes, and
        the overdue periodic trigger fires at the next tick."""
        failed = given(*stopping(), decline(1, "t0", at=20, reason="TASK_CHECKPOINT_FAILURE"))
        assert (JobStatus.RUNNING, None) == (failed.state.status, failed.state.stop)

        failed.when(tick(2_000)).then_types(CheckpointTriggered)

    def test_an_expired_stop_savepoint_leaves_the_job_running(self) -> None:
        expired = given(*stopping()).when(tick(10_010))

        expired.then_types(CheckpointAborted, CheckpointTriggered)
        assert isinstance(expired.events[0], CheckpointAborted)
        assert Reason.CHECKPOINT_EXPIRED == expired.events[0].reason
        assert (JobStatus.RUNNING, None, False) == (
            expired.state.status,
            expired.state.stop,
            expired.events[1].stop if isinstance(expired.events[1], CheckpointTriggered) else None,
        )

    def test_a_stop_outside_the_savepoint_roots_is_refused(self) -> None:
        rejected = given(running(at=0)).when(stop(target="file:///elsewhere", at=10)).events

        assert [Reason.SAVEPOINT_TARGET_NOT_ALLOWED] == [getattr(e, "reason", None) for e in rejected]

    def test_a_stop_of_a_job_that_is_not_running_is_refused(self) -> None:
        given(running(at=0), job_status(JobStatus.FAILING, at=5)).when(stop(at=10)).then_types(
            TriggerRejected
        )

    def test_the_stop_savepoint_completes_like_any_savepoint(self) -> None:
        completed = given(*stopping(), ack(1, "t0", at=20)).when(ack(1, "t1", at=30))

        completed.then_types(type(completed.events[0]), CheckpointCompleted)
        assert completed.state.stop is not None


class TestCancel:
    def test_a_cancel_stops_the_scheduler_and_the_job_is_cancelling(self) -> None:
        given(running(at=0, jitter=0.0), tick(0)).when(cancel(at=10)).then(
            CheckpointAborted(
                JOB,
                1,
                10,
                Reason.CHECKPOINT_COORDINATOR_SUSPEND,
                "job is CANCELLING: cancel requested (request cancel-1)",
            ),
            SchedulerStopped(JOB, 1, 10, JobStatus.CANCELLING, "cancel requested (request cancel-1)"),
        )

    def test_a_cancel_during_a_stop_aborts_the_stop_savepoint(self) -> None:
        canceled = given(*stopping()).when(cancel(at=20))

        canceled.then_types(CheckpointAborted, SchedulerStopped)
        assert (JobStatus.CANCELLING, None) == (canceled.state.status, canceled.state.stop)

    def test_the_driver_reporting_canceled_ends_it(self) -> None:
        given(running(at=0), cancel(at=10)).when(job_status(JobStatus.CANCELED, at=20)).then(
            SchedulerStopped(JOB, 1, 20, JobStatus.CANCELED)
        )

    def test_a_failure_while_cancelling_ends_canceled_and_restarts_nothing(self) -> None:
        """Flink: a job that fails while it is canceled ends CANCELED, no restart strategy runs."""
        given(running(at=0), cancel(at=10)).when(job_status(JobStatus.FAILING, at=20, error="killed")).then(
            SchedulerStopped(JOB, 1, 20, JobStatus.CANCELED, "killed")
        )

    def test_a_failure_of_the_attempt_that_ended_canceled_restarts_nothing(self) -> None:
        """The FAILING report that ended it CANCELED, delivered again (or a late one): still CANCELED."""
        failed = job_status(JobStatus.FAILING, at=20, error="killed")
        given(running(at=0), cancel(at=10), failed).when(failed).then_nothing()
        given(running(at=0), cancel(at=10), job_status(JobStatus.CANCELED, at=20)).when(
            job_status(JobStatus.FAILING, at=30, error="late")
        ).then_nothing()

    def test_a_late_running_report_of_the_canceled_attempt_starts_nothing(self) -> None:
        given(running(at=0), cancel(at=10)).when(running(at=20)).then_nothing()

    def test_an_attempt_reported_running_while_cancelling_is_told_to_stop(self) -> None:
        """Cancel wins (issue 53): an attempt that starts before the canceled one reported CANCELED (a
        restart racing the cancel) starts nothing; the stop names it, so that its driver stops it."""
        given(running(at=0), cancel(at=10)).when(running(attempt=2, at=20)).then(
            SchedulerStopped(JOB, 2, 20, JobStatus.CANCELLING, "attempt 2 started after the job was canceled")
        )

    def test_a_cancel_in_the_restart_delay_wins_over_the_restart(self) -> None:
        """Failed, with attempt 2 scheduled, then canceled: attempt 2's RUNNING starts nothing, its
        CANCELED ends the job, and a run started after that is a new run."""
        failed = (running(at=0), job_status(JobStatus.FAILING, at=5, error="boom"))
        restarting = given(*failed)
        assert JobStatus.RESTARTING is restarting.state.status

        canceled = given(*failed, cancel(at=10), running(attempt=2, at=20))
        assert JobStatus.CANCELLING is canceled.state.status and canceled.state.scheduler is None
        ended = canceled.when(job_status(JobStatus.CANCELED, attempt=2, at=30))
        ended.then(SchedulerStopped(JOB, 2, 30, JobStatus.CANCELED))
        given(
            *failed,
            cancel(at=10),
            running(attempt=2, at=20),
            job_status(JobStatus.CANCELED, attempt=2, at=30),
        ).when(running(attempt=3, at=40)).then_types(SchedulerStarted)

    def test_a_new_attempt_after_the_canceled_one_reported_canceled_runs(self) -> None:
        """A job started again under the same id once the cancel ended is a new run."""
        given(running(at=0), cancel(at=10), job_status(JobStatus.CANCELED, at=15)).when(
            running(attempt=2, at=20)
        ).then_types(SchedulerStarted)

    def test_a_repeated_cancel_and_a_cancel_of_an_ended_job_change_nothing(self) -> None:
        given(running(at=0), cancel(at=10)).when(cancel(request_id="cancel-2", at=20)).then_nothing()
        given(running(at=0), job_status(JobStatus.FINISHED, at=5)).when(cancel(at=10)).then_nothing()

    def test_a_cancel_of_an_unknown_job_is_refused(self) -> None:
        given().when(cancel(at=10)).then_types(type(given().when(request(at=10)).events[0]))


def test_a_stop_savepoint_keeps_its_stop_through_a_config_with_periodic_checkpoints_off() -> None:
    """With periodic checkpoints off nothing is ever due but the savepoint's deadline."""
    state = given(running(cfg=config(interval_ms=0), at=0), stop(at=10)).state

    assert (10 + 10_000, 1) == (due_at(state), state.stop.checkpoint_id if state.stop else None)
