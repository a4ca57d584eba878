"""Restart strategies (docs/design.md, "Job lifecycle"): what one failure of a job leads to. Pure.

The rules are those of Flink's ``RestartBackoffTimeStrategy`` implementations
(``NoRestart``, ``FixedDelay``, ``ExponentialDelay``, ``FailureRate``), turned
inside out: Flink's strategies are objects with a clock and a random generator
that count failures; here the count lives in the job's state (folded from
``JobRestartScheduled``), the time and the jitter come with the command, and
the answer is a value the decider journals.
"""

from __future__ import annotations

from dataclasses import dataclass

from events.wire.records import RestartStrategy, RestartStrategyKind

__all__ = [
    "GiveUpRestarting",
    "RestartAfterDelay",
    "RestartHistory",
    "failure_window",
    "on_failure",
    "strategy_problem",
]


@dataclass(frozen=True, slots=True)
class RestartHistory:
    """What a strategy remembers of earlier failures of the job (all attempts)."""

    restarts: int = 0
    """fixed-delay: restarts so far; exponential-delay: restarts since the backoff was last reset."""
    backoff_ms: int = 0
    """exponential-delay: the backoff before jitter; 0 before the first failure."""
    last_failure_ms: int | None = None
    failure_times: tuple[int, ...] = ()
    """failure-rate: the latest failures, oldest first (at most ``max_failures_per_interval + 1``)."""


@dataclass(frozen=True, slots=True)
class RestartAfterDelay:
    """Restart after ``delay_ms``; ``restarts`` and ``backoff_ms`` are the strategy's after it."""

    delay_ms: int
    restarts: int
    backoff_ms: int = 0


@dataclass(frozen=True, slots=True)
class GiveUpRestarting:
    """The strategy gives up: the job fails for good, because of ``reason``."""

    reason: str


def on_failure(
    strategy: RestartStrategy, history: RestartHistory, now_ms: int, jitter: float
) -> RestartAfterDelay | GiveUpRestarting:
    """What the job's failure at ``now_ms`` leads to. ``jitter`` in ``[0, 1]`` picks the
    exponential-delay jitter in ``[-offset, +offset]`` (Flink draws it from a random generator)."""
    match strategy.kind:
        case RestartStrategyKind.NONE:
            return GiveUpRestarting("the restart strategy is none (restart-strategy.type: none)")
        case RestartStrategyKind.FIXED_DELAY:
            restarts = history.restarts + 1
            if restarts > strategy.attempts:
                return GiveUpRestarting(
                    f"fixed-delay: all {strategy.attempts} restart attempts are used "
                    "(restart-strategy.fixed-delay.attempts)"
                )
            return RestartAfterDelay(strategy.delay_ms, restarts)
        case RestartStrategyKind.FAILURE_RATE:
            most, interval = strategy.max_failures_per_interval, strategy.failure_rate_interval_ms
            window = failure_window(strategy, history.failure_times, now_ms)
            if len(window) > most and now_ms - window[0] <= interval:
                return GiveUpRestarting(
                    f"failure-rate: {len(window)} failures within {interval} ms, at most {most} tolerated "
                    "(restart-strategy.failure-rate.max-failures-per-interval)"
                )
            return RestartAfterDelay(strategy.delay_ms, history.restarts + 1)
        case RestartStrategyKind.EXPONENTIAL_DELAY:
            return _exponential(strategy, history, now_ms, jitter)


def _exponential(
    strategy: RestartStrategy, history: RestartHistory, now_ms: int, jitter: float
) -> RestartAfterDelay | GiveUpRestarting:
    quiet = None if history.last_failure_ms is None else now_ms - history.last_failure_ms
    if quiet is None or quiet >= strategy.reset_backoff_threshold_ms + history.backoff_ms:
        backoff, restarts = strategy.initial_backoff_ms, 1  # the first failure, or a long quiet spell
    else:
        backoff = history.backoff_ms
        if backoff < strategy.max_backoff_ms:
            backoff = int(backoff * strategy.backoff_multiplier)
        backoff = max(strategy.initial_backoff_ms, min(backoff, strategy.max_backoff_ms))
        restarts = history.restarts + 1
    if restarts > strategy.attempts_before_reset_backoff:
        return GiveUpRestarting(
            f"exponential-delay: {strategy.attempts_before_reset_backoff} restarts in a row without "
            f"{strategy.reset_backoff_threshold_ms} ms free of failures "
            "(restart-strategy.exponential-delay.attempts-before-reset-backoff)"
        )
    offset = int(backoff * strategy.jitter_factor)
    jittered = backoff + min(offset, int(min(max(jitter, 0.0), 1.0) * (2 * offset + 1)) - offset)
    return RestartAfterDelay(max(0, min(jittered, strategy.max_backoff_ms)), restarts, backoff)


def failure_window(strategy: RestartStrategy, failure_times: tuple[int, ...], now_ms: int) -> tuple[int, ...]:
    """The failures failure-rate looks at after one at ``now_ms``: the latest
    ``max_failures_per_interval + 1`` (Flink's bounded queue of failure timestamps)."""
    return (*failure_times, now_ms)[-(max(strategy.max_failures_per_interval, 0) + 1) :]


def strategy_problem(strategy: RestartStrategy) -> str | None:
    """Why ``strategy`` is not a usable configuration (Flink's precondition messages), or None."""
    if strategy.attempts < 0:
        return f"restart_strategy.attempts must not be negative, got {strategy.attempts}"
    if strategy.delay_ms < 0:
        return f"restart_strategy.delay_ms must not be negative, got {strategy.delay_ms}"
    if strategy.kind is RestartStrategyKind.EXPONENTIAL_DELAY:
        if not 1 <= strategy.initial_backoff_ms <= strategy.max_backoff_ms:
            return (
                "restart_strategy needs 1 <= initial_backoff_ms <= max_backoff_ms, got "
                f"{strategy.initial_backoff_ms} and {strategy.max_backoff_ms}"
            )
        if not strategy.backoff_multiplier > 1:
            multiplier = strategy.backoff_multiplier
            return f"restart_strategy.backoff_multiplier must be greater than 1, got {multiplier}"
        if strategy.reset_backoff_threshold_ms < 1:
            return "restart_strategy.reset_backoff_threshold_ms must be at least 1"
        if not 0 <= strategy.jitter_factor <= 1:
            return f"restart_strategy.jitter_factor must be in [0, 1], got {strategy.jitter_factor}"
        if strategy.attempts_before_reset_backoff < 1:
            return "restart_strategy.attempts_before_reset_backoff must be at least 1"
    if strategy.kind is RestartStrategyKind.FAILURE_RATE:
        if strategy.max_failures_per_interval < 1:
            return "restart_strategy.max_failures_per_interval must be at least 1"
        if strategy.failure_rate_interval_ms < 1:
            return "restart_strategy.failure_rate_interval_ms must be at least 1"
    return None
