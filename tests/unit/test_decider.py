"""The pure coordinator, scenario by scenario.

Each test is given/when/then over the decider. Where a scenario mirrors one of
Flink's own tests (reference notes §2), the test's docstring names it.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from coordinator.core.decider import Rejection, barriers_owed, due_at, inline_limit, savepoint_name
from coordinator.core.state import MAX_QUEUED_REQUESTS, Reason
from coordinator.core.testing import (
    JOB,
    LOCATION,
    Given,
    ack,
    config,
    decline,
    given,
    job_status,
    request,
    run_commands,
    running,
    task_status,
    tick,
)
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointRequestQueued,
    CheckpointRestored,
    CheckpointTriggered,
    ExecutionState,
    JobStatus,
    SchedulerStarted,
    SchedulerStopped,
    StateHandle,
    TaskAcknowledged,
    TaskStatusRecorded,
    TriggerRejected,
)
from events.wire.validation import INLINE_BUDGET_BYTES, MAX_INLINE_THRESHOLD_BYTES

SAVEPOINT = CheckpointKind.SAVEPOINT


def handle(checkpoint_id: int, task: str, size: int = 10) -> StateHandle:
    return StateHandle(f"{LOCATION}/{JOB}/chk-{checkpoint_id}/{task}", size, "0" * 64)


def sp(checkpoint_id: int, at: int) -> str:
    """The directory name of the job's savepoint ``checkpoint_id``, triggered at ``at`` by attempt 1."""
    return savepoint_name(JOB, checkpoint_id, 1, at)


def triggered(events: list[object]) -> list[int]:
    return [e.checkpoint_id for e in events if isinstance(e, CheckpointTriggered)]


class TestScheduler:
    def test_running_starts_the_scheduler_after_a_random_delay(self) -> None:
        """RUNNING starts the scheduler; the first trigger comes after a delay in [min_pause, interval]."""
        cfg = config(interval_ms=1000, min_pause_ms=200)

        given().when(running(cfg=cfg, at=5000, jitter=0.5)).then(
            SchedulerStarted(JOB, 1, 5000, ("t0", "t1"), cfg, next_trigger_ms=5000 + 200 + 400)
        )

    @pytest.mark.parametrize(("jitter", "delay"), [(0.0, 200), (0.999999, 1000)])
    def test_the_first_delay_spans_min_pause_to_interval(self, jitter: float, delay: int) -> None:
        """The jitter's ends map to min_pause and to the base interval exactly."""
        cfg = config(interval_ms=1000, min_pause_ms=200)

        state = given(running(cfg=cfg, at=0, jitter=jitter)).state

        assert state.scheduler is not None
        assert delay == state.scheduler.next_trigger_ms

    def test_periodic_triggering(self) -> None:
        """CheckpointCoordinatorTriggeringTest.testPeriodicTriggering: ticks at a fixed rate
        trigger checkpoints with increasing ids; a stop silences them, a restart resumes."""
        commands = [running(at=0)]
        for n in range(1, 4):
            commands += [tick(n * 1000), ack(n, "t0", at=n * 1000 + 1), ack(n, "t1", at=n * 1000 + 2)]
        commands += [job_status(JobStatus.RESTARTING, at=3500), tick(4000), tick(5000)]
        commands += [running(attempt=2, at=6000), tick(6000)]

        _, events = run_commands(commands)

        assert triggered(events) == [1, 2, 3, 4]
        times = [e.timestamp_ms for e in events if isinstance(e, CheckpointTriggered)]
        assert times == [1000, 2000, 3000, 6000]

    def test_a_late_tick_skips_missed_periods(self) -> None:
        """A tick long overdue triggers once and moves the timer past now, keeping the phase."""
        state = given(running(at=0)).state

        when = given(running(at=0)).when(tick(3500))

        assert state.scheduler is not None
        assert isinstance(when.events[0], CheckpointTriggered)
        assert when.events[0].next_trigger_ms == 4000

    def test_no_periodic_checkpoints_without_an_interval(self) -> None:
        """interval_ms <= 0 turns periodic checkpoints off; manual requests still run."""
        no_interval = given(running(cfg=config(interval_ms=0), at=0))

        no_interval.when(tick(10**9)).then_nothing()
        no_interval.when(request(at=5)).then(
            CheckpointTriggered(
                job_id=JOB,
                checkpoint_id=1,
                attempt=1,
                kind=CheckpointKind.CHECKPOINT,
                timestamp_ms=5,
                location="file:///tmp/cutline-checkpoints/job-1/chk-1",
                tasks=("t0", "t1"),
                deadline_ms=10005,
                request_id="r1",
            )
        )

    def test_ticks_do_nothing_before_they_are_due(self) -> None:
        """Ticks between triggers decide nothing, and due_at says when the next one matters."""
        after_trigger = given(running(at=0), tick(1000))

        after_trigger.when(tick(1500)).then_nothing()
        assert due_at(after_trigger.state) == 2000

    def test_stop_aborts_pending_checkpoints(self) -> None:
        """Any status other than RUNNING stops the scheduler and aborts pending checkpoints
        (CHECKPOINT_COORDINATOR_SUSPEND); FAILING then asks the restart strategy (test_restart)."""
        given(running(at=0), tick(1000)).when(job_status(JobStatus.SUSPENDED, at=1200, error="boom")).then(
            CheckpointAborted(JOB, 1, 1200, Reason.CHECKPOINT_COORDINATOR_SUSPEND, "job is SUSPENDED: boom"),
            SchedulerStopped(JOB, 1, 1200, JobStatus.SUSPENDED, "boom"),
        )

    def test_stop_drops_queued_requests(self) -> None:
        """Queued requests are rejected with CHECKPOINT_COORDINATOR_SUSPEND when the scheduler stops."""
        when = given(running(at=0), tick(1000), request(at=1100)).when(
            job_status(JobStatus.CANCELED, at=1200)
        )

        when.then(
            CheckpointAborted(
                job_id=JOB,
                checkpoint_id=1,
                timestamp_ms=1200,
                reason=Reason.CHECKPOINT_COORDINATOR_SUSPEND,
                message="job is CANCELED",
            ),
            TriggerRejected(
                job_id=JOB,
                reason=Reason.CHECKPOINT_COORDINATOR_SUSPEND,
                request_id="r1",
                timestamp_ms=1200,
                message="job is CANCELED",
            ),
            SchedulerStopped(job_id=JOB, attempt=1, timestamp_ms=1200, status=JobStatus.CANCELED),
        )
        assert when.state.queue == ()

    def test_stopped_scheduler_does_not_trigger(self) -> None:
        """testStopPeriodicScheduler: a tick on a stopped scheduler triggers nothing; a manual
        request on a job that is not RUNNING is refused (NOT_ALL_REQUIRED_TASKS_RUNNING)."""
        stopped = given(running(at=0), job_status(JobStatus.FINISHED, at=10))

        stopped.when(tick(5000)).then_nothing()
        rejected = stopped.when(request(at=20)).events
        assert [e.reason for e in rejected] == [Reason.NOT_ALL_REQUIRED_TASKS_RUNNING]  # type: ignore[union-attr]

    def test_a_repeated_status_is_idempotent(self) -> None:
        """The same status of the same attempt again changes nothing."""
        given(running(at=0)).when(running(at=100)).then_nothing()
        given(running(at=0), job_status(JobStatus.FAILED, at=1)).when(
            job_status(JobStatus.FAILED, at=2)
        ).then_nothing()

    def test_a_new_attempt_aborts_the_old_attempts_checkpoints(self) -> None:
        """RUNNING with a new attempt restarts the scheduler; checkpoints of the old attempt abort."""
        when = given(running(at=0), tick(1000)).when(running(attempt=2, at=1500))

        when.then(
            CheckpointAborted(
                job_id=JOB,
                checkpoint_id=1,
                timestamp_ms=1500,
                reason=Reason.CHECKPOINT_COORDINATOR_SUSPEND,
                message="job is RESTARTING: attempt 2 started",
            ),
            SchedulerStopped(
                job_id=JOB,
                attempt=1,
                timestamp_ms=1500,
                status=JobStatus.RESTARTING,
                error="attempt 2 started",
            ),
            SchedulerStarted(
                job_id=JOB,
                attempt=2,
                timestamp_ms=1500,
                tasks=("t0", "t1"),
                config=config(),
                next_trigger_ms=1500,
            ),
        )
        assert when.state.attempt == 2
        assert dict(when.state.pending) == {}


class TestTriggerPreChecks:
    def test_trigger_tasks_not_running(self) -> None:
        """testCheckpointAbortsIfTriggerTasksAreNotExecuted: a task is not RUNNING, so the trigger
        fails with NOT_ALL_REQUIRED_TASKS_RUNNING; nothing is pending."""
        when = given(running(at=0), task_status("t1", ExecutionState.DEPLOYING)).when(tick(1000))

        when.then(
            TriggerRejected(
                JOB,
                Reason.NOT_ALL_REQUIRED_TASKS_RUNNING,
                timestamp_ms=1000,
                periodic=True,
                message="not all tasks are RUNNING: t1 is DEPLOYING",
                next_trigger_ms=2000,
            )
        )
        assert dict(when.state.pending) == {}

    def test_trigger_tasks_finished(self) -> None:
        """testCheckpointAbortsIfTriggerTasksAreFinished: FINISHED tasks cannot checkpoint
        (cutline does not checkpoint after tasks finish)."""
        when = given(running(at=0), task_status("t0", ExecutionState.FINISHED)).when(request(at=5))

        assert [e.reason for e in when.events] == [Reason.NOT_ALL_REQUIRED_TASKS_RUNNING]  # type: ignore[union-attr]

    def test_periodic_scheduling_with_inactive_tasks(self) -> None:
        """testPeriodicSchedulingWithInactiveTasks: a tick while a task is not RUNNING creates
        nothing; once it runs again, the next tick triggers."""
        commands = [running(at=0), task_status("t0", ExecutionState.INITIALIZING), tick(1000)]
        commands += [task_status("t0", ExecutionState.RUNNING, at=1500), tick(2000)]

        state, events = run_commands(commands)

        assert triggered(events) == [1]
        assert list(state.pending) == [1]

    def test_min_time_between_checkpoints(self) -> None:
        """testMinTimeBetweenCheckpointsInterval: interval 12 ms, pause 50 ms: the next checkpoint
        starts no sooner than 50 ms after the last completion."""
        cfg = config(interval_ms=12, min_pause_ms=50)
        commands = [running(cfg=cfg, at=0), tick(50), ack(1, "t0", at=60), ack(1, "t1", at=70)]
        commands += [tick(t) for t in range(71, 200)]

        _, events = run_commands(commands)

        second = [e for e in events if isinstance(e, CheckpointTriggered)][1]
        assert second.timestamp_ms >= 70 + 50

    def test_periodic_request_inside_the_pause_is_dropped_manual_runs(self) -> None:
        """CheckpointRequestDeciderTest.testCheckpointTiming: a periodic request inside the pause is
        rejected and the timer moves to the pause's end; a manual request runs at once."""
        cfg = config(interval_ms=100, min_pause_ms=1000)
        late = [tick(1000), ack(1, "t0", at=1010), ack(1, "t1", at=1900)]
        done = given(running(cfg=cfg, at=0, jitter=0.999), *late)

        done.when(tick(2000)).then(
            TriggerRejected(
                JOB,
                Reason.MINIMUM_TIME_BETWEEN_CHECKPOINTS,
                timestamp_ms=2000,
                periodic=True,
                message="min_pause: the next periodic checkpoint may start at 2900",
                next_trigger_ms=2900,
            )
        )
        done.when(request(at=2000)).then(
            CheckpointTriggered(
                job_id=JOB,
                checkpoint_id=2,
                attempt=1,
                kind=CheckpointKind.CHECKPOINT,
                timestamp_ms=2000,
                location="file:///tmp/cutline-checkpoints/job-1/chk-2",
                tasks=("t0", "t1"),
                deadline_ms=12000,
                request_id="r1",
            )
        )

    def test_min_checkpoint_pause_for_a_queued_request(self) -> None:
        """testMinCheckpointPause: a periodic request queued behind a pending checkpoint waits out
        the minimum pause after that checkpoint completes."""
        cfg = config(interval_ms=100, min_pause_ms=500)
        commands = [running(cfg=cfg, at=0, jitter=0.999), tick(500), tick(1000)]
        commands += [ack(1, "t0", at=1050), ack(1, "t1", at=1100)]

        state, events = run_commands(commands)

        assert isinstance(events[-1], TriggerRejected)
        assert events[-1].reason == Reason.MINIMUM_TIME_BETWEEN_CHECKPOINTS
        assert state.scheduler is not None and state.scheduler.next_trigger_ms == 1600
        assert triggered(given(*commands).when(tick(1600)).events) == [2]


class TestAcknowledgements:
    def test_trigger_and_confirm_simple_checkpoint(self) -> None:
        """testTriggerAndConfirmSimpleCheckpoint: when every task acknowledged, the checkpoint
        completes with one handle per task and the offsets of all tasks."""
        started = given(
            running(at=0),
            tick(1000),
            ack(1, "t0", at=1003, state=handle(1, "t0", 7), offsets={"words:0": 10}),
        )

        started.when(ack(1, "t1", at=1005, state=handle(1, "t1", 5), offsets={"words:1": 20})).then(
            TaskAcknowledged(JOB, 1, 1, "t1", 1005, handle(1, "t1", 5), {"words:1": 20}),
            CheckpointCompleted(
                JOB,
                1,
                CheckpointKind.CHECKPOINT,
                timestamp_ms=1005,
                duration_ms=5,
                handles={"t0": handle(1, "t0", 7), "t1": handle(1, "t1", 5)},
                size_bytes=12,
                offsets={"words:0": 10, "words:1": 20},
                attempt=1,
                location=f"{LOCATION}/{JOB}/chk-1",
            ),
        )

    def test_retention_keeps_the_newest(self) -> None:
        """testTriggerAndConfirmSimpleCheckpoint / CompletedCheckpointStoreTest.
        testAddCheckpointMoreThanMaxRetained: with retained=1 only the newest stays."""
        commands = [running(at=0)]
        for n in (1, 2, 3):
            commands += [tick(n * 1000), ack(n, "t0", at=n * 1000), ack(n, "t1", at=n * 1000)]

        state, _ = run_commands(commands)

        assert [c.checkpoint_id for c in state.completed] == [3]

    def test_multiple_concurrent_checkpoints(self) -> None:
        """testMultipleConcurrentCheckpoints: acks of cp1 and cp2 interleave; cp1 completes first,
        then cp2; two are retained."""
        cfg = config(max_concurrent=2, retained=2)
        commands = [running(cfg=cfg, at=0), tick(1000), tick(2000)]
        commands += [
            ack(1, "t0", at=2100),
            ack(2, "t0", at=2200),
            ack(1, "t1", at=2300),
            ack(2, "t1", at=2400),
        ]

        state, events = run_commands(commands)

        completions = [e.checkpoint_id for e in events if isinstance(e, CheckpointCompleted)]
        assert completions == [1, 2]
        assert [c.checkpoint_id for c in state.completed] == [1, 2]

    def test_successful_checkpoint_subsumes_unsuccessful(self) -> None:
        """testSuccessfulCheckpointSubsumesUnsuccessful: cp2 completes while cp1 is half acknowledged;
        cp1 is aborted as CHECKPOINT_SUBSUMED, and a late ack of cp1 changes nothing."""
        cfg = config(max_concurrent=2)
        half = given(
            running(cfg=cfg, at=0), tick(1000), tick(2000), ack(1, "t0", at=2100), ack(2, "t0", at=2200)
        )

        when = half.when(ack(2, "t1", at=2300))

        when.then(
            TaskAcknowledged(job_id=JOB, checkpoint_id=2, attempt=1, task_id="t1", timestamp_ms=2300),
            CheckpointCompleted(
                job_id=JOB,
                checkpoint_id=2,
                kind=CheckpointKind.CHECKPOINT,
                timestamp_ms=2300,
                duration_ms=300,
                handles={},
                size_bytes=0,
                offsets={},
                attempt=1,
                location="file:///tmp/cutline-checkpoints/job-1/chk-2",
            ),
            CheckpointAborted(
                job_id=JOB,
                checkpoint_id=1,
                timestamp_ms=2300,
                reason=Reason.CHECKPOINT_SUBSUMED,
                message="subsumed by checkpoint 2",
            ),
        )
        aborted = when.events[-1]
        assert isinstance(aborted, CheckpointAborted)
        assert (
            aborted.checkpoint_id,
            aborted.reason,
            aborted.counts_as_failure,
        ) == (1, Reason.CHECKPOINT_SUBSUMED, False)
        Given(when.state).when(ack(1, "t1", at=2400)).then_nothing()

    def test_duplicate_ack_is_ignored(self) -> None:
        """testTriggerAndDeclineCheckpointSimple: a duplicate ack keeps the checkpoint at 1 of 2."""
        when = given(running(at=0), tick(1000), ack(1, "t1", at=1001)).when(ack(1, "t1", at=1002))

        when.then_nothing()
        assert list(when.state.pending[1].acks) == ["t1"]

    def test_messages_for_non_existing_checkpoints(self) -> None:
        """testHandleMessagesForNonExistingCheckpoints: acks for another job, an unknown checkpoint or
        an unknown task are refused and change nothing."""
        pending = given(running(at=0), tick(1000))

        pending.when(ack(1, "t0", job_id="other-job")).then_rejected(Rejection.UNKNOWN_JOB)
        given(job_id="other-job").when(ack(1, "t0", job_id="other-job")).then_rejected(Rejection.UNKNOWN_JOB)
        pending.when(ack(7, "t0", at=1001)).then_rejected(Rejection.UNKNOWN_CHECKPOINT)
        pending.when(ack(1, "t9", at=1001)).then_rejected(Rejection.UNKNOWN_TASK)

    @pytest.mark.parametrize("checkpoint_id", [0, -1, -(2**63)])
    def test_non_positive_ids_are_refused(self, checkpoint_id: int) -> None:
        """Checkpoint ids start at 1: zero and negative ids are refused."""
        given(running(at=0), tick(1000)).when(ack(checkpoint_id, "t0")).then_rejected(Rejection.INVALID_ID)

    def test_ack_from_an_older_attempt_is_refused(self) -> None:
        """An ack from an older job attempt is refused (STALE_ATTEMPT), one from the future too."""
        restarted = given(running(at=0), tick(1000), running(attempt=2, at=1500), tick(2000))

        restarted.when(ack(2, "t0", attempt=1, at=2001)).then_rejected(Rejection.STALE_ATTEMPT)
        restarted.when(ack(2, "t0", attempt=3, at=2001)).then_rejected(Rejection.UNKNOWN_ATTEMPT)
        restarted.when(ack(2, "t0", attempt=2, at=2001)).then(
            TaskAcknowledged(job_id=JOB, checkpoint_id=2, attempt=2, task_id="t0", timestamp_ms=2001)
        )

    @pytest.mark.parametrize(
        "uri",
        [
            f"{LOCATION}/{JOB}/chk-1/../chk-0/t0",
            f"{LOCATION}/{JOB}/chk-2/t0",
            f"{LOCATION}/{JOB}/chk-1",
            "file:///etc/passwd",
            f"s3://bucket/{JOB}/chk-1/t0",
            f"{LOCATION}/{JOB}/chk-10/t0",
        ],
    )
    def test_state_outside_the_checkpoint_location_is_refused(self, uri: str) -> None:
        """A state handle whose URI escapes the barrier's location is refused."""
        given(running(at=0), tick(1000)).when(ack(1, "t0", state=StateHandle(uri, 1, "x"))).then_rejected(
            Rejection.STATE_OUTSIDE_LOCATION
        )

    @pytest.mark.parametrize(
        "uri",
        [
            "file://[x",
            f"{LOCATION}/{JOB}/chk-1/%2e%2e/chk-0/t0",
            f"{LOCATION}/{JOB}/chk-1/%252e%252e/t0",
            f"{LOCATION}/{JOB}/chk-1/a%2fb",
            f"{LOCATION.replace('file:', 'FILE:')}/{JOB}/chk-1/t0",
            f"{LOCATION.replace('file://', 'file:')}/{JOB}/chk-1/t0",
            f"{LOCATION.replace('file://', 'file://host')}/{JOB}/chk-1/t0",
        ],
    )
    def test_state_uris_that_are_not_canonical_are_refused(self, uri: str) -> None:
        """A state URI that does not parse by events.wire.validation's rules cannot be inside the location."""
        refused = given(running(at=0), tick(1000)).when(ack(1, "t0", state=StateHandle(uri, 1, "x")))

        assert "is not a storage URI" in refused.then_rejected(Rejection.STATE_OUTSIDE_LOCATION).message

    def test_a_negative_state_size_is_refused(self) -> None:
        """A state handle's size must not be negative (it is summed into the checkpoint's size)."""
        given(running(at=0), tick(1000)).when(ack(1, "t0", state=handle(1, "t0", size=-1))).then_rejected(
            Rejection.INVALID_STATE_HANDLE
        )

    @pytest.mark.parametrize(
        "offsets",
        [
            {"words:0": -1},
            {"words": 3},
            {":1": 3},
            {"words:x": 1},
            {"t:²": 1},
            {"t:-1": 1},
            {"t:007": 1},
            {f"t:{2**31}": 1},
            {f"t{i}:0": 1 for i in range(100_001)},
        ],
    )
    def test_malformed_offsets_are_refused(self, offsets: dict[str, int]) -> None:
        """Offsets must map 'topic:partition' to a non-negative next offset."""
        given(running(at=0), tick(1000)).when(ack(1, "t0", offsets=offsets)).then_rejected(
            Rejection.INVALID_OFFSETS
        )


class TestDeclinesAndFailures:
    def test_trigger_and_decline_checkpoint_simple(self) -> None:
        """testTriggerAndDeclineCheckpointSimple: a decline aborts the checkpoint
        (CHECKPOINT_DECLINED); with tolerable_failures=0 the job fails exactly once; repeated
        declines are no-ops."""
        half = given(running(at=0), tick(1000), ack(1, "t1", at=1001))

        declined = half.when(decline(1, "t0", at=1002))

        declined.then(
            CheckpointAborted(
                JOB,
                1,
                1002,
                Reason.CHECKPOINT_DECLINED,
                "task t0 declined (TASK_CHECKPOINT_FAILURE): disk full",
                task_id="t0",
                counts_as_failure=True,
            ),
            CheckpointFailureThresholdExceeded(
                JOB, 1, 1002, failures=1, tolerable=0, reason="CHECKPOINT_DECLINED"
            ),
        )
        assert (dict(declined.state.pending), declined.state.completed) == ({}, ())
        Given(declined.state).when(decline(1, "t0", at=1003)).then_nothing()
        Given(declined.state).when(decline(1, "t1", at=1003)).then_nothing()

    def test_trigger_and_decline_checkpoint_complex(self) -> None:
        """testTriggerAndDeclineCheckpointComplex: with cp1 and cp2 pending, declining cp1 aborts
        only cp1."""
        cfg = config(max_concurrent=2, tolerable_failures=5)
        when = given(running(cfg=cfg, at=0), tick(1000), tick(2000)).when(decline(1, "t0", at=2001))

        when.then(
            CheckpointAborted(
                job_id=JOB,
                checkpoint_id=1,
                timestamp_ms=2001,
                reason=Reason.CHECKPOINT_DECLINED,
                message="task t0 declined (TASK_CHECKPOINT_FAILURE): disk full",
                task_id="t0",
                counts_as_failure=True,
            )
        )
        assert list(when.state.pending) == [2]

    def test_checkpoint_timeout_isolated(self) -> None:
        """testCheckpointTimeoutIsolated: a half-acknowledged checkpoint expires at its deadline
        (CHECKPOINT_EXPIRED) and nothing completes."""
        cfg = config(timeout_ms=500, tolerable_failures=1)
        half = given(running(cfg=cfg, at=0, jitter=0.999), tick(1000), ack(1, "t0", at=1100))

        half.when(tick(1499)).then_nothing()
        half.when(tick(1500)).then(
            CheckpointAborted(
                JOB,
                1,
                1500,
                Reason.CHECKPOINT_EXPIRED,
                "not acknowledged by t1 before its deadline",
                counts_as_failure=True,
            )
        )

    def test_expired_checkpoint_exceeds_tolerable_failure_number(self) -> None:
        """testExpiredCheckpointExceedsTolerableFailureNumber: with tolerable 0 one expiry fails
        the job."""
        cfg = config(timeout_ms=500)
        when = given(running(cfg=cfg, at=0, jitter=0.999), tick(1000)).when(tick(1500))

        when.then(
            CheckpointAborted(
                job_id=JOB,
                checkpoint_id=1,
                timestamp_ms=1500,
                reason=Reason.CHECKPOINT_EXPIRED,
                message="not acknowledged by t0, t1 before its deadline",
                counts_as_failure=True,
            ),
            CheckpointFailureThresholdExceeded(
                job_id=JOB,
                checkpoint_id=1,
                timestamp_ms=1500,
                failures=1,
                tolerable=0,
                reason=Reason.CHECKPOINT_EXPIRED,
            ),
        )

    def test_abort_cancels_the_timeout(self) -> None:
        """PendingCheckpointTest.testSetCanceller: an aborted checkpoint never expires later."""
        cfg = config(timeout_ms=500, interval_ms=100_000, tolerable_failures=9)
        declined = given(running(cfg=cfg, at=0), tick(0), decline(1, "t0", at=10))

        declined.when(tick(600)).then_nothing()

    def test_continuous_failure(self) -> None:
        """CheckpointFailureManagerTest.testContinuousFailure (tolerable 2): declines of 1, 2, a task
        failure on 3 (not counted), a decline of 4: exactly one job failure."""
        cfg = config(tolerable_failures=2)
        commands = [running(cfg=cfg, at=0)]
        commands += [tick(1000), decline(1, "t0", at=1001), tick(2000), decline(2, "t0", at=2001)]
        commands += [tick(3000), task_status("t1", ExecutionState.FAILED, at=3001)]
        commands += [task_status("t1", ExecutionState.RUNNING, at=3500)]
        commands += [tick(4000), decline(4, "t0", at=4001)]

        _, events = run_commands(commands)

        failures = [e for e in events if isinstance(e, CheckpointFailureThresholdExceeded)]
        assert [(e.checkpoint_id, e.failures) for e in failures] == [(4, 3)]
        task_failure = [e for e in events if isinstance(e, CheckpointAborted) and e.checkpoint_id == 3]
        assert [(e.reason, e.counts_as_failure) for e in task_failure] == [(Reason.TASK_FAILURE, False)]

    def test_break_continuous_failure(self) -> None:
        """CheckpointFailureManagerTest.testBreakContinuousFailure: a success resets the count."""
        cfg = config(tolerable_failures=1)
        commands = [running(cfg=cfg, at=0), tick(1000), decline(1, "t0", at=1001)]
        commands += [tick(2000), ack(2, "t0", at=2001), ack(2, "t1", at=2002)]
        commands += [tick(3000), decline(3, "t0", at=3001)]

        state, events = run_commands(commands)

        assert not any(isinstance(e, CheckpointFailureThresholdExceeded) for e in events)
        assert state.failures == 1

    def test_ignores_past_checkpoints(self) -> None:
        """CheckpointFailureManagerTest.testIgnoresPastCheckpoints: a checkpoint older than the last
        success never counts (here it is subsumed, which is not a counted reason)."""
        cfg = config(max_concurrent=2, tolerable_failures=0)
        commands = [running(cfg=cfg, at=0), tick(1000), tick(2000), ack(2, "t0"), ack(2, "t1")]

        state, events = run_commands(commands)

        assert state.failures == 0
        assert not any(isinstance(e, CheckpointFailureThresholdExceeded) for e in events)

    def test_failed_task_aborts_what_it_has_not_acknowledged(self) -> None:
        """A FAILED task aborts (TASK_FAILURE) every pending checkpoint it has not acknowledged."""
        cfg = config(max_concurrent=2)
        when = given(running(cfg=cfg, at=0), tick(1000), ack(1, "t0", at=1001), tick(2000)).when(
            task_status("t0", ExecutionState.FAILED, at=2001)
        )

        when.then(
            TaskStatusRecorded(
                job_id=JOB, task_id="t0", attempt=1, status=ExecutionState.FAILED, timestamp_ms=2001
            ),
            CheckpointAborted(
                job_id=JOB,
                checkpoint_id=2,
                timestamp_ms=2001,
                reason=Reason.TASK_FAILURE,
                message="task t0 is FAILED",
                task_id="t0",
            ),
        )
        assert list(when.state.pending) == [1]


class TestConcurrency:
    @pytest.mark.parametrize("max_concurrent", [1, 2, 5])
    def test_max_concurrent_attempts(self, max_concurrent: int) -> None:
        """testMaxConcurrentAttempts1/2/5: N ticks give N checkpoints; further ticks trigger nothing
        (one periodic request waits); completing cp1 lets exactly one more start."""
        cfg = config(max_concurrent=max_concurrent)
        ticks = [tick(1000 * n) for n in range(1, max_concurrent + 4)]
        full = given(running(cfg=cfg, at=0), *ticks)

        assert list(range(1, max_concurrent + 1)) == sorted(full.state.pending)
        assert len(full.state.queue) == 1
        after = full.when(ack(1, "t0", at=10**5)).state
        completed = Given(after).when(ack(1, "t1", at=10**5))
        assert [max_concurrent + 1] == triggered(completed.events)

    @pytest.mark.parametrize("extra_ticks", [1, 2, 3, 4])
    def test_one_periodic_request_waits_however_many_ticks_pass(self, extra_ticks: int) -> None:
        """While max_concurrent checkpoints are pending, exactly one periodic request waits (the
        newest), and the timer keeps moving."""
        ticks = [tick(1000 * n) for n in range(1, extra_ticks + 2)]

        state = given(running(at=0), *ticks).state

        assert [(True, 1000 * (extra_ticks + 1))] == [(q.periodic, q.timestamp_ms) for q in state.queue]
        assert state.scheduler is not None
        assert 1000 * (extra_ticks + 2) == state.scheduler.next_trigger_ms

    def test_max_concurrent_attempts_with_subsumption(self) -> None:
        """testMaxConcurrentAttemptsWithSubsumption: with {1, 2} pending and max 2, cp2 completes and
        subsumes cp1; the next ticks create {3, 4}."""
        cfg = config(max_concurrent=2)
        commands = [running(cfg=cfg, at=0), tick(1000), tick(2000), ack(2, "t0"), ack(2, "t1")]
        commands += [tick(3000), tick(4000)]

        state, _ = run_commands(commands)

        assert sorted(state.pending) == [3, 4]

    def test_trigger_before_previous_one_completed(self) -> None:
        """testTriggerCheckpointBeforePreviousOneCompleted: a manual request while one checkpoint is
        pending is queued, then runs when it completes."""
        queued = given(running(at=0), tick(1000)).when(request(request_id="m1", at=1100))

        queued.then(CheckpointRequestQueued(JOB, CheckpointKind.CHECKPOINT, False, 1100, "m1"))
        after = Given(queued.state).when(ack(1, "t0", at=1200)).state
        runs = Given(after).when(ack(1, "t1", at=1300))
        assert triggered(runs.events) == [2]
        assert runs.events[-1].request_id == "m1"  # type: ignore[union-attr]

    def test_manual_requests_go_before_the_periodic_one(self) -> None:
        """CheckpointRequestDeciderTest (prioritized): queued manual requests run before the queued
        periodic one."""
        commands = [running(at=0), tick(1000), tick(2000), request(request_id="m1", at=2100)]
        commands += [ack(1, "t0", at=2200), ack(1, "t1", at=2300)]

        state, events = run_commands(commands)

        assert state.pending[2].triggered.request_id == "m1"
        assert [q.periodic for q in state.queue] == [True]

    def test_queue_size_limit(self) -> None:
        """CheckpointRequestDeciderTest.testQueueSizeLimit: past 1000 queued requests a new one is
        refused with TOO_MANY_CHECKPOINT_REQUESTS."""
        commands = [running(at=0), tick(1000)]
        commands += [request(request_id=f"m{i}", at=1001) for i in range(MAX_QUEUED_REQUESTS)]
        full = given(*commands)

        when = full.when(request(request_id="one-too-many", at=1002))

        assert [e.reason for e in when.events] == [Reason.TOO_MANY_CHECKPOINT_REQUESTS]  # type: ignore[union-attr]


class TestSavepoints:
    def test_trigger_and_confirm_simple_savepoint(self) -> None:
        """testTriggerAndConfirmSimpleSavepoint: a savepoint goes to its target, completes, is not
        retained among checkpoints and is remembered as the latest savepoint."""
        commands = [running(cfg=config(interval_ms=0), at=0)]
        commands += [
            request(SAVEPOINT, target="file:///savepoints", at=10, savepoint_roots=("file:///savepoints",))
        ]
        location = f"file:///savepoints/{sp(1, 10)}"
        saved = StateHandle(f"{location}/t0", 3, "x")
        commands += [ack(1, "t0", at=20, state=saved), ack(1, "t1", at=30)]

        state, events = run_commands(commands)

        assert location == state.latest_savepoint.location if state.latest_savepoint else None
        assert state.completed == ()
        assert {"t0": saved} == state.latest_savepoint.handles if state.latest_savepoint else None

    def test_savepoints_are_not_subsumed(self) -> None:
        """testSavepointsAreNotSubsumed: sp1, cp2, cp3 pending; cp3 completes and subsumes cp2 while
        sp1 stays pending; sp1 completing subsumes nothing."""
        cfg = config(max_concurrent=2)
        commands = [running(cfg=cfg, at=0), request(SAVEPOINT, at=10), tick(1000), tick(2000)]
        commands += [ack(3, "t0", at=2100)]
        pending = given(*commands)

        when = pending.when(ack(3, "t1", at=2200))

        aborted = [e.checkpoint_id for e in when.events if isinstance(e, CheckpointAborted)]
        assert aborted == [2]
        assert list(when.state.pending) == [1]
        sp_done = Given(when.state).when(ack(1, "t0", at=2300)).state
        last = Given(sp_done).when(ack(1, "t1", at=2400))
        last.then(
            TaskAcknowledged(job_id=JOB, checkpoint_id=1, attempt=1, task_id="t1", timestamp_ms=2400),
            CheckpointCompleted(
                job_id=JOB,
                checkpoint_id=1,
                kind=CheckpointKind.SAVEPOINT,
                timestamp_ms=2400,
                duration_ms=2390,
                handles={},
                size_bytes=0,
                offsets={},
                attempt=1,
                location=f"file:///tmp/cutline-checkpoints/job-1/{sp(1, 10)}",
            ),
        )

    def test_concurrent_savepoints_skip_pause_and_max_concurrent(self) -> None:
        """testConcurrentSavepoints / testMinDelayBetweenSavepoints: with max 1 and a huge pause,
        back-to-back savepoints all trigger and all complete."""
        cfg = config(max_concurrent=1, min_pause_ms=10**9, interval_ms=0)
        commands = [running(cfg=cfg, at=0)]
        commands += [request(SAVEPOINT, request_id=f"s{i}", at=i) for i in range(1, 4)]
        commands += [ack(i, t, at=100 + i) for i in range(1, 4) for t in ("t0", "t1")]

        _, events = run_commands(commands)

        assert [e.checkpoint_id for e in events if isinstance(e, CheckpointCompleted)] == [1, 2, 3]

    def test_savepoint_does_not_wait_for_queued_checkpoints(self) -> None:
        """testSavepointScheduledInUnalignedMode: with periodic requests waiting behind cp1, a
        savepoint request still runs at once."""
        waiting = given(running(at=0), tick(1000), tick(2000), tick(3000))

        waiting.when(request(SAVEPOINT, at=3100)).then(
            CheckpointTriggered(
                job_id=JOB,
                checkpoint_id=2,
                attempt=1,
                kind=CheckpointKind.SAVEPOINT,
                timestamp_ms=3100,
                location=f"file:///tmp/cutline-checkpoints/job-1/{sp(2, 3100)}",
                tasks=("t0", "t1"),
                deadline_ms=13100,
                request_id="r1",
            )
        )

    def test_savepoint_failures_are_not_counted(self) -> None:
        """A declined savepoint aborts but never counts towards tolerable_failures."""
        when = given(running(at=0), request(SAVEPOINT, at=10)).when(decline(1, "t0", at=20))

        when.then(
            CheckpointAborted(
                job_id=JOB,
                checkpoint_id=1,
                timestamp_ms=20,
                reason=Reason.CHECKPOINT_DECLINED,
                message="task t0 declined (TASK_CHECKPOINT_FAILURE): disk full",
                task_id="t0",
            )
        )
        assert when.state.failures == 0


class TestIdsAndRestore:
    def test_ids_are_shared_by_checkpoints_and_savepoints(self) -> None:
        """CheckpointIDCounterTestBase.testSerialIncrementAndGet: one counter, starting at 1, for
        checkpoints and savepoints alike."""
        commands = [running(cfg=config(max_concurrent=3), at=0), tick(1000)]
        commands += [request(SAVEPOINT, at=1001), request(at=1002)]

        _, events = run_commands(commands)

        assert triggered(events) == [1, 2, 3]

    def test_restore_moves_the_counter_past_the_restored_checkpoint(self) -> None:
        """testCheckpointStatsTrackerRestoreCallback / restoreSavepoint: restoring checkpoint 42
        records it and the next id is 43."""
        when = given().when(running(restored_from=42, at=0))

        when.then(
            CheckpointRestored(job_id=JOB, checkpoint_id=42, attempt=1, timestamp_ms=0),
            SchedulerStarted(
                job_id=JOB, attempt=1, timestamp_ms=0, tasks=("t0", "t1"), config=config(), next_trigger_ms=0
            ),
        )
        assert when.state.next_checkpoint_id == 43
        assert when.state.restored.checkpoint_id == 42 if when.state.restored else None

    def test_restoring_an_older_checkpoint_never_reuses_ids(self) -> None:
        """Restoring checkpoint 1 after checkpoint 3 was triggered keeps ids above 3."""
        commands = [running(at=0, cfg=config(max_concurrent=3)), tick(1000), tick(2000), tick(3000)]
        commands += [running(attempt=2, restored_from=1, at=3500), tick(4000)]

        _, events = run_commands(commands)

        assert triggered(events) == [1, 2, 3, 4]


class TestBadInput:
    def test_unknown_job(self) -> None:
        """Acks, declines, task statuses and requests of a job never reported are refused."""
        unknown = given()

        unknown.when(ack(1, "t0")).then_rejected(Rejection.UNKNOWN_JOB)
        unknown.when(decline(1, "t0")).then_rejected(Rejection.UNKNOWN_JOB)
        unknown.when(request()).then_rejected(Rejection.UNKNOWN_JOB)
        unknown.when(task_status("t0", ExecutionState.FAILED)).then_rejected(Rejection.UNKNOWN_JOB)
        unknown.when(tick(10**6)).then_nothing()

    @pytest.mark.parametrize(
        ("cfg", "tasks"),
        [
            (config(timeout_ms=0), ("t0",)),
            (config(max_concurrent=0), ("t0",)),
            (config(retained=0), ("t0",)),
            (config(min_pause_ms=-1), ("t0",)),
            (config(tolerable_failures=-1), ("t0",)),
            (config(location=""), ("t0",)),
            (config(location="/tmp/plain/path"), ("t0",)),
            (config(location="file:/tmp/x"), ("t0",)),
            (config(location="file:///tmp/%2e%2e/etc"), ("t0",)),
            (config(location="file:///"), ("t0",)),
            (config(interval_ms=2**62), ("t0",)),
            (config(timeout_ms=2**62), ("t0",)),
            (config(min_pause_ms=2**62), ("t0",)),
            (config(), ()),
            (config(), ("t0", "t0")),
            (config(), tuple(f"t{i}" for i in range(100_001))),
        ],
    )
    def test_invalid_running_status(self, cfg: object, tasks: tuple[str, ...]) -> None:
        """A RUNNING status with an unusable config or task list is refused."""
        given().when(running(cfg=cfg, tasks=tasks)).then_rejected(Rejection.INVALID_CONFIG)

    @pytest.mark.parametrize("job_id", ["..", ".", "a/b", "../../etc", "a%2fb", "a%41", "a?b", "a\\b", ""])
    def test_a_job_id_that_cannot_name_its_directory(self, job_id: str) -> None:
        """Checkpoints go to <location>/<job_id>/chk-N: a job id that is not one plain name is refused."""
        given(job_id=job_id).when(running(job_id=job_id)).then_rejected(Rejection.INVALID_CONFIG)

    @pytest.mark.parametrize("restored", [0, -1, 2**62 + 1, 2**63 - 1])
    def test_a_restored_id_out_of_range(self, restored: int) -> None:
        """A restored checkpoint id must be positive and leave room for the ids after it."""
        given().when(running(restored_from=restored)).then_rejected(Rejection.INVALID_CONFIG)

    @pytest.mark.parametrize(("checkpoint_id", "reason"), [(-5, "start at 1"), (2**63 - 1, "end at")])
    def test_negative_and_huge_checkpoint_ids(self, checkpoint_id: int, reason: str) -> None:
        """Acks and declines of a negative or absurdly large checkpoint id are INVALID_ID."""
        started = given(running(at=0), tick(1000))

        for command in (ack(checkpoint_id, "t0"), decline(checkpoint_id, "t0")):
            assert reason in started.when(command).then_rejected(Rejection.INVALID_ID).message

    def test_too_many_metrics(self) -> None:
        """An ack may carry at most 100,000 metrics."""
        command = ack(1, "t0")
        hostile = replace(command, ack=replace(command.ack, metrics={f"m{i}": i for i in range(100_001)}))

        given(running(at=0), tick(1000)).when(hostile).then_rejected(Rejection.INVALID_METRICS)

    def test_running_without_config(self) -> None:
        """A RUNNING status must carry its config."""
        command = job_status(JobStatus.RUNNING, cfg=None)
        command = replace(command, changed=replace(command.changed, config=None))
        given().when(command).then_rejected(Rejection.INVALID_CONFIG)

    def test_status_of_an_older_attempt(self) -> None:
        """A status report from an older attempt is refused and does not stop the current one."""
        given(running(attempt=3)).when(job_status(JobStatus.FAILED, attempt=2)).then_rejected(
            Rejection.STALE_ATTEMPT
        )

    def test_rejections_change_nothing(self) -> None:
        """A refused input leaves the state exactly as it was."""
        before = given(running(at=0), tick(1000))

        when = before.when(ack(99, "t0"))

        assert before.state == when.state


class TestTaskSet:
    def test_the_task_set_follows_the_tasks(self) -> None:
        """The state keeps its tasks as a set too, and each pending checkpoint the set of its own."""
        state = given(running(tasks=("t0", "t1", "t2"), at=0), tick(1000)).state

        assert frozenset({"t0", "t1", "t2"}) == state.task_ids == state.pending[1].task_ids

    def test_a_new_attempt_has_the_set_of_its_own_tasks(self) -> None:
        """A RUNNING status of a new attempt with other tasks replaces the set; the old tasks are refused."""
        when = given(running(tasks=("a", "b"), at=0)).when(running(tasks=("x",), attempt=2, at=5))

        assert frozenset({"x"}) == when.state.task_ids
        given(running(tasks=("a", "b"), at=0), running(tasks=("x",), attempt=2, at=5), tick(1000)).when(
            ack(1, "a", attempt=2)
        ).then_rejected(Rejection.UNKNOWN_TASK)


class TestLateTasks:
    """A task may start after its job's RUNNING: once it reports RUNNING it is owed the barriers of
    the checkpoints pending since before (the shell sends them again; issue 51)."""

    def test_a_running_task_is_owed_the_pending_checkpoints_it_has_not_acknowledged(self) -> None:
        job = given(
            running(cfg=config(max_concurrent=2), at=0), tick(1000), ack(1, "t0", at=1001), tick(2000)
        )

        assert [1, 2] == [t.checkpoint_id for t in barriers_owed(job.state, "t1")]
        assert [2] == [t.checkpoint_id for t in barriers_owed(job.state, "t0")]

    def test_its_running_status_decides_nothing_else(self) -> None:
        """A RUNNING report of a task already taken to be running journals nothing."""
        given(running(at=0), tick(1000)).when(
            task_status("t1", ExecutionState.RUNNING, at=1500)
        ).then_nothing()

    def test_a_task_running_before_its_job_is_no_error(self) -> None:
        """Reported before the driver's RUNNING (of a new job, or of the next attempt): nothing is
        decided and nothing is refused; the task sees every barrier of its attempt anyway."""
        given().when(task_status("t1", ExecutionState.RUNNING, at=5)).then_nothing()
        given(running(at=0)).when(task_status("t1", ExecutionState.RUNNING, attempt=2, at=5)).then_nothing()

    def test_a_running_task_the_job_does_not_have_is_refused(self) -> None:
        """A wrong task id surfaces as soon as the task starts, not as a checkpoint that never completes."""
        given(running(at=0)).when(task_status("t9", ExecutionState.RUNNING, at=5)).then_rejected(
            Rejection.UNKNOWN_TASK
        )


class TestSavepointTargets:
    """Savepoints go only where the coordinator allows (--savepoint-root; docs/security.md)."""

    started = staticmethod(lambda: given(running(cfg=config(interval_ms=0, location=ROOTED), at=0)))

    def test_a_target_beside_the_checkpoints_is_allowed_by_default(self) -> None:
        """Without roots, a target below the checkpoint location's parent triggers the savepoint."""
        when = self.started().when(request(SAVEPOINT, target="file:///data/savepoints/", at=5))

        when.then(
            CheckpointTriggered(
                job_id=JOB,
                checkpoint_id=1,
                attempt=1,
                kind=CheckpointKind.SAVEPOINT,
                timestamp_ms=5,
                location=f"file:///data/savepoints/{sp(1, 5)}",
                tasks=("t0", "t1"),
                deadline_ms=10005,
                request_id="r1",
            )
        )
        assert f"file:///data/savepoints/{sp(1, 5)}" == when.events[0].location  # type: ignore[union-attr]

    @pytest.mark.parametrize(
        "target", ["file:///etc", "file:///datax/sp", "s3://data/savepoints", "file:///tmp/x"]
    )
    def test_anything_else_is_refused_by_default(self, target: str) -> None:
        """Without roots, a target outside the checkpoint location's parent is a journaled TriggerRejected."""
        (rejected,) = self.started().when(request(SAVEPOINT, target=target, at=5)).events

        assert isinstance(rejected, TriggerRejected)
        assert (Reason.SAVEPOINT_TARGET_NOT_ALLOWED, "r1") == (rejected.reason, rejected.request_id)
        assert "--savepoint-root" in rejected.message and "file:///data" in rejected.message

    @pytest.mark.parametrize(
        "target",
        [
            "file:///data/savepoints/../../etc",
            "file:///data/%2e%2e/etc",
            "FILE:///data/sp",
            "file:/data/sp",
            "x",
        ],
    )
    def test_targets_that_are_not_canonical_are_refused(self, target: str) -> None:
        """A target that does not parse is refused whatever the roots."""
        (rejected,) = self.started().when(request(SAVEPOINT, target=target, at=5)).events

        assert isinstance(rejected, TriggerRejected)
        assert "not a storage URI" in rejected.message

    def test_configured_roots_replace_the_default(self) -> None:
        """With roots, targets inside any root are allowed and the checkpoint location's parent is not."""
        roots = ("file:///backups", "s3://bucket/savepoints")
        started = self.started()

        started.when(request(SAVEPOINT, target="s3://bucket/savepoints/a", savepoint_roots=roots)).then(
            CheckpointTriggered(
                job_id=JOB,
                checkpoint_id=1,
                attempt=1,
                kind=CheckpointKind.SAVEPOINT,
                timestamp_ms=0,
                location=f"s3://bucket/savepoints/a/{sp(1, 0)}",
                tasks=("t0", "t1"),
                deadline_ms=10000,
                request_id="r1",
            )
        )
        started.when(request(SAVEPOINT, target="file:///backups", savepoint_roots=roots)).then(
            CheckpointTriggered(
                job_id=JOB,
                checkpoint_id=1,
                attempt=1,
                kind=CheckpointKind.SAVEPOINT,
                timestamp_ms=0,
                location=f"file:///backups/{sp(1, 0)}",
                tasks=("t0", "t1"),
                deadline_ms=10000,
                request_id="r1",
            )
        )
        (rejected,) = started.when(
            request(SAVEPOINT, target="file:///data/savepoints", savepoint_roots=roots)
        ).events
        assert isinstance(rejected, TriggerRejected)
        assert "file:///backups, s3://bucket/savepoints" in rejected.message

    def test_a_savepoint_without_target_goes_below_the_checkpoint_location(self) -> None:
        """No target: the savepoint goes below <location>/<job>/, whatever the roots."""
        when = self.started().when(request(SAVEPOINT, savepoint_roots=("file:///backups",)))

        when.then(
            CheckpointTriggered(
                job_id=JOB,
                checkpoint_id=1,
                attempt=1,
                kind=CheckpointKind.SAVEPOINT,
                timestamp_ms=0,
                location=f"file:///data/checkpoints/job-1/{sp(1, 0)}",
                tasks=("t0", "t1"),
                deadline_ms=10000,
                request_id="r1",
            )
        )
        assert f"{ROOTED}/{JOB}/{sp(1, 0)}" == when.events[0].location  # type: ignore[union-attr]

    def test_a_location_right_below_the_root_allows_only_itself(self) -> None:
        """A file: location one level below / allows savepoints only inside itself by default."""
        started = given(running(cfg=config(interval_ms=0, location="file:///ckpt"), at=0))

        started.when(request(SAVEPOINT, target="file:///ckpt/sp")).then(
            CheckpointTriggered(
                job_id=JOB,
                checkpoint_id=1,
                attempt=1,
                kind=CheckpointKind.SAVEPOINT,
                timestamp_ms=0,
                location=f"file:///ckpt/sp/{sp(1, 0)}",
                tasks=("t0", "t1"),
                deadline_ms=10000,
                request_id="r1",
            )
        )
        started.when(request(SAVEPOINT, target="file:///etc")).then(
            TriggerRejected(
                job_id=JOB,
                reason=Reason.SAVEPOINT_TARGET_NOT_ALLOWED,
                request_id="r1",
                kind=CheckpointKind.SAVEPOINT,
                message="savepoint target 'file:///etc' is outside file:///ckpt, where savepoints go when "
                "the coordinator has no --savepoint-root (the parent of the checkpoint location); "
                "start the coordinator with --savepoint-root to allow other directories",
            )
        )


ROOTED = "file:///data/checkpoints"


def inline_handle(checkpoint_id: int, task: str, data: bytes) -> StateHandle:
    """The handle of a snapshot sent inline in the ack, as a participant builds it."""
    return StateHandle(
        f"{LOCATION}/{JOB}/chk-{checkpoint_id}/{task}", len(data), hashlib.sha256(data).hexdigest(), data
    )


class TestInlineState:
    """Small state rides in the ack (Flink's ``state.storage.fs.memory-threshold``): the trigger says
    how much each task may send inline, and the decider checks what it gets."""

    def test_the_trigger_and_its_limit_follow_the_jobs_threshold(self) -> None:
        """Each task may send up to the threshold inline; two tasks share no budget pressure here."""
        started = given(running(cfg=config(inline_threshold_bytes=20_480), at=0))

        (event,) = started.when(tick(1000)).events

        assert isinstance(event, CheckpointTriggered)
        assert 20_480 == event.inline_limit_bytes

    def test_without_a_threshold_nothing_may_be_inline(self) -> None:
        """The default threshold is 0: every snapshot is a file, as before."""
        (event,) = given(running(at=0)).when(tick(1000)).events

        assert isinstance(event, CheckpointTriggered)
        assert 0 == event.inline_limit_bytes

    @pytest.mark.parametrize(
        ("threshold", "tasks", "limit"),
        [(20_480, 2, 20_480), (20_480, 100, 5_242), (1_048_576, 1, 524_288), (100, 100_000, 5), (0, 8, 0)],
    )
    def test_the_limit_shares_the_budget_among_the_tasks(
        self, threshold: int, tasks: int, limit: int
    ) -> None:
        """Every task's inline state together stays within 512 KiB, so the completion stays one record."""
        assert limit == inline_limit(threshold, tasks)
        assert tasks * inline_limit(threshold, tasks) <= INLINE_BUDGET_BYTES

    def test_inline_state_is_journaled_and_completes_with_the_checkpoint(self) -> None:
        """The inline bytes travel into the TaskAcknowledged and the completion's handles: the
        journal holds everything a restore needs."""
        cfg = config(inline_threshold_bytes=64)
        small = inline_handle(1, "t0", b"counts: the=3")
        half = given(running(cfg=cfg, at=0), tick(1000), ack(1, "t0", at=1002, state=small))

        done = half.when(ack(1, "t1", at=1004, state=handle(1, "t1", 5)))

        completed = done.events[-1]
        assert isinstance(completed, CheckpointCompleted)
        assert b"counts: the=3" == completed.handles["t0"].inline
        assert completed.handles["t1"].inline is None
        assert 13 + 5 == completed.size_bytes

    @pytest.mark.parametrize("size", [65, 1_000])
    def test_inline_state_above_the_limit_is_refused(self, size: int) -> None:
        """A participant that ignores its barrier's limit would grow the completion past one record."""
        started = given(running(cfg=config(inline_threshold_bytes=64), at=0), tick(1000))

        refused = started.when(ack(1, "t0", state=inline_handle(1, "t0", b"x" * size)))

        message = refused.then_rejected(Rejection.INVALID_STATE_HANDLE).message
        assert "at most 64 bytes inline" in message and "write the snapshot to its uri" in message

    @pytest.mark.parametrize("data", [b"x", b""])
    def test_inline_state_is_refused_when_the_checkpoint_allows_none(self, data: bytes) -> None:
        """Not even an empty snapshot rides inline when the limit is 0 (the threshold is off)."""
        refused = given(running(at=0), tick(1000)).when(ack(1, "t0", state=inline_handle(1, "t0", data)))

        assert "allows no inline state" in refused.then_rejected(Rejection.INVALID_STATE_HANDLE).message

    @pytest.mark.parametrize(
        ("size", "digest", "problem"),
        [(5, None, "size_bytes says 5"), (3, "ab" * 32, "but its handle says abab")],
    )
    def test_inline_bytes_must_match_their_handle(self, size: int, digest: str | None, problem: str) -> None:
        """Size and sha256 are checked once, here: every reader of the journal restores trusted bytes."""
        good = inline_handle(1, "t0", b"abc")
        bad = replace(good, size_bytes=size, sha256=digest or good.sha256)
        started = given(running(cfg=config(inline_threshold_bytes=64), at=0), tick(1000))

        refused = started.when(ack(1, "t0", state=bad))

        assert problem in refused.then_rejected(Rejection.INVALID_STATE_HANDLE).message

    @pytest.mark.parametrize("threshold", [-1, MAX_INLINE_THRESHOLD_BYTES + 1])
    def test_a_threshold_out_of_range_is_refused(self, threshold: int) -> None:
        refused = given().when(running(cfg=config(inline_threshold_bytes=threshold), at=0))

        assert "inline_threshold_bytes" in refused.then_rejected(Rejection.INVALID_CONFIG).message
