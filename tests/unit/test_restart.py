"""Heartbeats and restart strategies (docs/design.md, "Job lifecycle"), rule by rule.

The strategy tests mirror Flink's ``FixedDelayRestartBackoffTimeStrategyTest``,
``ExponentialDelayRestartBackoffTimeStrategyTest`` and
``FailureRateRestartBackoffTimeStrategyTest``: Flink's strategy objects count
failures themselves; here each failure is one pure call, and the history the
next call gets is what the journal folds into the job's state.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given as hypothesis_given
from hypothesis import settings
from hypothesis import strategies as st

from coordinator.core.decider import Rejection, due_at
from coordinator.core.restart import (
    GiveUpRestarting,
    RestartAfterDelay,
    RestartHistory,
    failure_window,
    on_failure,
    strategy_problem,
)
from coordinator.core.state import Reason
from coordinator.core.testing import (
    JOB,
    LOCATION,
    ack,
    config,
    given,
    heartbeat,
    job_status,
    running,
    tick,
)
from events.wire.records import (
    CheckpointAborted,
    CheckpointRestored,
    CheckpointTriggered,
    JobFailedPermanently,
    JobHeartbeatRecorded,
    JobRestartScheduled,
    JobStatus,
    RestartStrategy,
    RestartStrategyKind,
    SchedulerStarted,
    SchedulerStopped,
)

FIXED = RestartStrategyKind.FIXED_DELAY
EXPONENTIAL = RestartStrategyKind.EXPONENTIAL_DELAY
FAILURE_RATE = RestartStrategyKind.FAILURE_RATE


def failures(
    strategy: RestartStrategy, times: list[int], jitter: float = 0.5
) -> list[RestartAfterDelay | GiveUpRestarting]:
    """What each failure at ``times`` leads to, the history carried from one to the next as the
    decider's fold of ``JobRestartScheduled`` carries it."""
    history, out = RestartHistory(), []
    for now in times:
        decision = on_failure(strategy, history, now, jitter)
        out.append(decision)
        if isinstance(decision, GiveUpRestarting):
            break
        window = failure_window(strategy, history.failure_times, now)
        history = RestartHistory(decision.restarts, decision.backoff_ms, now, window)
    return out


def delays(decisions: list[RestartAfterDelay | GiveUpRestarting]) -> list[int | str]:
    return [d.delay_ms if isinstance(d, RestartAfterDelay) else "give up" for d in decisions]


# -------------------------------------------------------------------- strategies


class TestNoRestart:
    def test_never_restarts(self) -> None:
        (decision,) = failures(RestartStrategy(RestartStrategyKind.NONE), [0])

        assert isinstance(decision, GiveUpRestarting) and "none" in decision.reason


class TestFixedDelay:
    def test_number_of_restarts(self) -> None:
        """testNumberOfRestarts: 3 attempts allow 3 restarts; the 4th failure gives up."""
        strategy = RestartStrategy(FIXED, attempts=3, delay_ms=10)

        assert [10, 10, 10, "give up"] == delays(failures(strategy, [0, 100, 200, 300]))

    def test_failures_with_delay(self) -> None:
        """testFailuresWithDelay: every restart waits the configured delay."""
        strategy = RestartStrategy(FIXED, attempts=2, delay_ms=1_234)

        assert [1_234, 1_234] == delays(failures(strategy, [0, 10]))

    def test_the_count_survives_time(self) -> None:
        """Fixed-delay never forgets: a day between failures does not give attempts back."""
        strategy = RestartStrategy(FIXED, attempts=1)

        assert [1_000, "give up"] == delays(failures(strategy, [0, 86_400_000]))


class TestExponentialDelay:
    STRATEGY = RestartStrategy(
        EXPONENTIAL,
        initial_backoff_ms=1,
        max_backoff_ms=1_000,
        backoff_multiplier=2.0,
        reset_backoff_threshold_ms=10_000,
        jitter_factor=0.0,
    )

    def test_initial_backoff(self) -> None:
        """testInitialBackoff: the first restart waits the initial backoff."""
        assert [1] == delays(failures(self.STRATEGY, [0]))

    def test_backoff_multiplier(self) -> None:
        """testBackoffMultiplier: each failure in quick succession multiplies the backoff."""
        strategy = replace(self.STRATEGY, initial_backoff_ms=4, backoff_multiplier=2.3)

        assert [4, 9, 20, 46] == delays(failures(strategy, [0, 1, 2, 3]))

    def test_max_backoff(self) -> None:
        """testMaxBackoff: the backoff stops at its maximum."""
        strategy = replace(self.STRATEGY, initial_backoff_ms=300)

        assert [300, 600, 1_000, 1_000] == delays(failures(strategy, [0, 1, 2, 3]))

    def test_reset_backoff(self) -> None:
        """testResetBackoff: quiet for the threshold (plus the current backoff), back to the start."""
        strategy = replace(self.STRATEGY, initial_backoff_ms=5)
        quiet = 10_000 + 10  # threshold + the backoff of the second failure

        assert [5, 10, 5] == delays(failures(strategy, [0, 1, 1 + quiet]))
        assert [5, 10, 20] == delays(failures(strategy, [0, 1, quiet]))

    def test_jitter(self) -> None:
        """testJitter: the delay varies by at most jitter_factor of the backoff, either way."""
        strategy = replace(self.STRATEGY, initial_backoff_ms=100, jitter_factor=0.25)

        assert [75] == delays(failures(strategy, [0], jitter=0.0))
        assert [125] == delays(failures(strategy, [0], jitter=1.0))
        assert [100] == delays(failures(strategy, [0], jitter=0.5))

    def test_max_attempts(self) -> None:
        """testMaxAttempts: attempts_before_reset_backoff restarts in a row, then give up ..."""
        strategy = replace(self.STRATEGY, attempts_before_reset_backoff=3)

        assert [1, 2, 4, "give up"] == delays(failures(strategy, [0, 1, 2, 3]))

    def test_a_reset_gives_the_attempts_back(self) -> None:
        """... unless a quiet spell reset the backoff in between."""
        strategy = replace(self.STRATEGY, attempts_before_reset_backoff=2)

        assert [1, 2, 1, 2] == delays(failures(strategy, [0, 1, 20_000, 20_001]))


class TestFailureRate:
    STRATEGY = RestartStrategy(
        FAILURE_RATE, max_failures_per_interval=2, failure_rate_interval_ms=1_000, delay_ms=7
    )

    def test_many_failures_within_rate(self) -> None:
        """testManyFailuresWithinRate: failures spread wider than the interval always restart."""
        assert [7] * 6 == delays(failures(self.STRATEGY, [0, 600, 1_200, 1_800, 2_400, 3_000]))

    def test_failures_exceeding_rate(self) -> None:
        """testFailuresExceedingRate: a third failure within the interval gives up."""
        assert [7, 7, "give up"] == delays(failures(self.STRATEGY, [0, 10, 1_000]))

    def test_the_window_is_strict(self) -> None:
        """Flink restarts only when the oldest failure is more than the interval ago."""
        assert [7, 7, 7] == delays(failures(self.STRATEGY, [0, 10, 1_001]))


class TestConfiguration:
    def test_flink_preconditions_are_config_problems(self) -> None:
        assert strategy_problem(RestartStrategy()) is None
        assert "backoff_multiplier" in str(strategy_problem(RestartStrategy(backoff_multiplier=1.0)))
        assert "jitter_factor" in str(strategy_problem(RestartStrategy(jitter_factor=2.0)))
        assert "initial_backoff_ms" in str(strategy_problem(RestartStrategy(initial_backoff_ms=0)))
        bad_rate = RestartStrategy(FAILURE_RATE, max_failures_per_interval=0)
        assert "max_failures_per_interval" in str(strategy_problem(bad_rate))

    def test_a_running_status_with_a_bad_strategy_is_refused(self) -> None:
        cfg = config(restart_strategy=RestartStrategy(backoff_multiplier=0.5))

        given().when(running(cfg=cfg)).then_rejected(Rejection.INVALID_CONFIG)

    def test_a_heartbeat_timeout_shorter_than_the_interval_is_refused(self) -> None:
        cfg = config(heartbeat_interval_ms=10_000, heartbeat_timeout_ms=5_000)

        given().when(running(cfg=cfg)).then_rejected(Rejection.INVALID_CONFIG)


# ----------------------------------------------------------------- properties

strategies = st.builds(
    RestartStrategy,
    kind=st.sampled_from(list(RestartStrategyKind)),
    attempts=st.integers(0, 5),
    delay_ms=st.integers(0, 10_000),
    initial_backoff_ms=st.integers(1, 1_000),
    max_backoff_ms=st.integers(1_000, 100_000),
    backoff_multiplier=st.floats(1.01, 4.0),
    reset_backoff_threshold_ms=st.integers(1, 50_000),
    jitter_factor=st.floats(0.0, 1.0),
    attempts_before_reset_backoff=st.integers(1, 6),
    max_failures_per_interval=st.integers(1, 4),
    failure_rate_interval_ms=st.integers(1, 50_000),
)
gaps = st.lists(st.integers(0, 30_000), min_size=1, max_size=15)


@settings(max_examples=300, deadline=None)
@hypothesis_given(strategies, gaps, st.floats(0.0, 1.0))
def test_delays_never_exceed_the_max_backoff(
    strategy: RestartStrategy, gaps: list[int], jitter: float
) -> None:
    """Exponential-delay never waits longer than max_backoff_ms, whatever the jitter; no delay is
    negative."""
    times = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    for decision in failures(strategy, times, jitter):
        if isinstance(decision, RestartAfterDelay):
            assert 0 <= decision.delay_ms
            if strategy.kind is EXPONENTIAL:
                assert decision.delay_ms <= strategy.max_backoff_ms
                assert strategy.initial_backoff_ms <= decision.backoff_ms <= strategy.max_backoff_ms


@settings(max_examples=300, deadline=None)
@hypothesis_given(strategies, gaps)
def test_restarts_never_exceed_the_limit(strategy: RestartStrategy, gaps: list[int]) -> None:
    """Fixed-delay restarts at most ``attempts`` times; exponential-delay at most
    ``attempts_before_reset_backoff`` times in a row; none never."""
    times = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    restarts = [d for d in failures(strategy, times) if isinstance(d, RestartAfterDelay)]
    if strategy.kind is RestartStrategyKind.NONE:
        assert restarts == []
    if strategy.kind is FIXED:
        assert len(restarts) <= strategy.attempts
    if strategy.kind is EXPONENTIAL:
        assert all(r.restarts <= strategy.attempts_before_reset_backoff for r in restarts)


@settings(max_examples=300, deadline=None)
@hypothesis_given(strategies, gaps)
def test_the_failure_rate_window_is_respected(strategy: RestartStrategy, gaps: list[int]) -> None:
    """Failure-rate gives up exactly when more than ``max_failures_per_interval`` failures fall
    within ``failure_rate_interval_ms`` (counting the new one)."""
    strategy = replace(strategy, kind=FAILURE_RATE)
    times = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    decisions = failures(strategy, times)
    for i, decision in enumerate(decisions):
        recent = [t for t in times[: i + 1] if times[i] - t <= strategy.failure_rate_interval_ms]
        assert isinstance(decision, GiveUpRestarting) == (len(recent) > strategy.max_failures_per_interval)


# ------------------------------------------------------------------- the decider

ONE_RESTART = config(
    heartbeat_interval_ms=1_000,
    heartbeat_timeout_ms=5_000,
    restart_strategy=RestartStrategy(FIXED, attempts=1, delay_ms=2_000),
)


class TestHeartbeats:
    def test_a_heartbeat_of_the_running_attempt_moves_the_deadline(self) -> None:
        given(running(cfg=ONE_RESTART, at=0)).when(heartbeat(at=100)).then(
            JobHeartbeatRecorded(JOB, 1, 100, 5_100)
        )

    def test_the_deadline_arms_with_the_first_heartbeat(self) -> None:
        """A driver that never sent a heartbeat (an older client) is not watched."""
        started = given(running(cfg=ONE_RESTART, at=0))

        started.when(tick(10**9)).then_types(CheckpointTriggered)  # a periodic trigger, no failure
        assert started.state.heartbeat_deadline_ms is None

    def test_no_heartbeat_before_the_deadline_fails_the_job_and_the_strategy_restarts_it(self) -> None:
        """The pending checkpoint aborts with TASK_FAILURE, the scheduler stops (FAILING), and
        fixed-delay schedules attempt 2 after its delay, restoring the latest completed checkpoint."""
        job = given(
            running(cfg=ONE_RESTART, at=0), heartbeat(at=10), tick(1_000), ack(1, "t0", at=1_010),
            ack(1, "t1", at=1_020), tick(2_000),
        )  # fmt: skip
        failure = "no heartbeat of attempt 1 for 5000 ms (heartbeat_timeout_ms)"

        when = job.when(tick(5_010)).then(
            CheckpointAborted(JOB, 2, 5_010, Reason.TASK_FAILURE, f"job is FAILING: {failure}"),
            SchedulerStopped(JOB, 1, 5_010, JobStatus.FAILING, failure),
            JobRestartScheduled(JOB, 2, 5_010, 2_000, failure, 1, 0, 1, f"{LOCATION}/{JOB}/chk-1"),
        )
        assert JobStatus.RESTARTING is when.state.status
        assert due_at(when.state) is None  # nothing to time until attempt 2 runs

    def test_the_job_fails_for_good_when_the_strategy_gives_up(self) -> None:
        """Attempt 2 (restored) misses its heartbeats too: the one fixed-delay attempt is used."""
        job = given(
            running(cfg=ONE_RESTART, at=0), heartbeat(at=10), tick(5_010),
            running(cfg=ONE_RESTART, attempt=2, at=7_010), heartbeat(attempt=2, at=7_020),
        )  # fmt: skip

        when = job.when(tick(12_020)).then_types(SchedulerStopped, JobFailedPermanently)
        (_, failed) = when.events
        assert isinstance(failed, JobFailedPermanently) and "fixed-delay" in failed.reason
        assert JobStatus.FAILED is when.state.status

    def test_heartbeats_of_other_attempts_are_refused_and_late_ones_ignored(self) -> None:
        job = given(running(cfg=ONE_RESTART, at=0), running(cfg=ONE_RESTART, attempt=2, at=10))

        job.when(heartbeat(attempt=1, at=20)).then_rejected(Rejection.STALE_ATTEMPT)
        job.when(heartbeat(attempt=3, at=20)).then_rejected(Rejection.UNKNOWN_ATTEMPT)
        given().when(heartbeat(at=20)).then_rejected(Rejection.UNKNOWN_JOB)
        failed = given(running(cfg=ONE_RESTART, at=0), job_status(JobStatus.FAILING, at=5))
        failed.when(heartbeat(at=6)).then_nothing()

    def test_due_at_includes_the_heartbeat_deadline(self) -> None:
        cfg = replace(ONE_RESTART, interval_ms=0)

        assert 5_100 == due_at(given(running(cfg=cfg, at=0), heartbeat(at=100)).state)


class TestFailures:
    def test_a_reported_failure_goes_to_the_strategy_once(self) -> None:
        """FAILING from the driver stops the job and schedules a restart; the same attempt's
        failure reported again (or after a heartbeat expired) decides nothing more."""
        job = given(running(cfg=ONE_RESTART, at=0))

        failing = job.when(job_status(JobStatus.FAILING, at=50, error="query failed")).then(
            SchedulerStopped(JOB, 1, 50, JobStatus.FAILING, "query failed"),
            JobRestartScheduled(JOB, 2, 50, 2_000, "query failed", 1),
        )
        given(running(cfg=ONE_RESTART, at=0), job_status(JobStatus.FAILING, at=50)).when(
            job_status(JobStatus.FAILING, at=60)
        ).then_nothing()
        assert failing.state.restart is not None and 2_050 == failing.state.restart.restart_at_ms

    def test_the_next_attempt_restores_and_clears_the_scheduled_restart(self) -> None:
        job = given(running(cfg=ONE_RESTART, at=0), job_status(JobStatus.FAILING, at=50))

        when = job.when(running(cfg=ONE_RESTART, attempt=2, at=2_050, restored_from=None))
        when.then_types(SchedulerStarted)
        assert (JobStatus.RUNNING, None, 1) == (when.state.status, when.state.restart, when.state.restarts)

    def test_without_a_completed_checkpoint_the_restart_restores_what_the_attempt_restored(self) -> None:
        job = given(running(cfg=ONE_RESTART, at=0, restored_from=7))

        (*_, scheduled) = job.when(job_status(JobStatus.FAILING, at=50)).events

        assert isinstance(scheduled, JobRestartScheduled) and 7 == scheduled.restore_checkpoint_id
        assert isinstance(job.state.restored, CheckpointRestored)

    def test_a_reported_failed_status_is_final(self) -> None:
        """FAILED from the driver means it gave up itself: no strategy runs."""
        given(running(cfg=ONE_RESTART, at=0)).when(job_status(JobStatus.FAILED, at=50)).then_types(
            SchedulerStopped
        )
