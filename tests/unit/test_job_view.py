"""What the dashboard's job page shows: the job's status line, the Summary and Configuration tabs."""

from __future__ import annotations

import pytest

from coordinator.core.decider import evolve
from coordinator.core.state import JobState, initial_state
from coordinator.core.stats import CheckpointStats, track, with_progress
from coordinator.core.testing import JOB, ack, config, job_status, run_commands, running, tick
from coordinator.service.job_view import config_rows, describe_restart_strategy, job_json, summary_json
from coordinator.service.units import UNLIMITED, format_bytes, format_count, format_duration
from events.wire.records import JobStatus, RestartStrategy, RestartStrategyKind


def folded(*commands: object) -> tuple[JobState, CheckpointStats | None]:
    _, events = run_commands(commands)  # type: ignore[arg-type]
    state: JobState = initial_state(JOB)
    stats: CheckpointStats | None = None
    for event in events:
        stats = track(stats, state, event)  # type: ignore[arg-type]
        state = evolve(state, event)
    return state, with_progress(stats, state)


def completed(n: int, duration: int, *, at: int) -> list[object]:
    """Checkpoint ``n`` triggered at ``at`` and completed ``duration`` ms later."""
    return [tick(at), ack(n, "t0", at=at), ack(n, "t1", at=at + duration)]


class TestUnits:
    @pytest.mark.parametrize(
        ("ms", "shown"),
        [
            (0, "0 ms"),
            (300, "300 ms"),
            (1_000, "1 s"),
            (1_500, "1.5 s"),
            (45_000, "45 s"),
            (60_000, "1 min"),
            (90_000, "1 min 30 s"),
            (600_000, "10 min"),
            (3_600_000, "1 h"),
            (3_900_000, "1 h 5 min"),
            (90_000_000, "1 d 1 h"),
        ],
    )
    def test_a_duration_reads_in_its_two_largest_units(self, ms: int, shown: str) -> None:
        assert shown == format_duration(ms)

    def test_sizes_are_binary_multiples(self) -> None:
        assert ["512 B", "1.5 KiB", "4.0 MiB"] == [format_bytes(n) for n in (512, 1536, 4 * 1024 * 1024)]

    def test_flinks_integer_max_value_reads_unlimited(self) -> None:
        assert ("unlimited", "1,000", "3") == (format_count(UNLIMITED), format_count(1000), format_count(3))
        assert 2147483647 == UNLIMITED


class TestJob:
    def test_the_status_line_has_status_attempt_restarts_tasks_and_the_latest_ack(self) -> None:
        """A running job of two tasks whose checkpoint 2 has one ack so far: its latest ack is that one."""
        state, stats = folded(running(at=0), *completed(1, 20, at=1000), tick(2000), ack(2, "t1", at=2007))

        body = job_json(JOB, state, stats)

        assert {
            "id": JOB,
            "status": "RUNNING",
            "attempt": 1,
            "restarts": 0,
            "tasks": 2,
            "tasks_not_running": {},
            "pending_checkpoints": [2],
            "stopping": False,
            "restart": None,
            "latest_ack_timestamp": 2007,
            "latest_completed_id": 1,
        } == body

    def test_the_latest_ack_of_a_job_with_nothing_pending_is_its_latest_completed_checkpoints(self) -> None:
        state, stats = folded(running(at=0), *completed(1, 20, at=1000))

        assert 1020 == job_json(JOB, state, stats)["latest_ack_timestamp"]

    def test_a_job_without_acks_has_no_latest_ack(self) -> None:
        state, stats = folded(running(at=0))

        assert job_json(JOB, state, stats)["latest_ack_timestamp"] is None
        assert job_json(JOB, state, stats)["latest_completed_id"] is None

    def test_a_failed_job_shows_the_restart_its_strategy_scheduled(self) -> None:
        strategy = RestartStrategy(RestartStrategyKind.FIXED_DELAY, attempts=3, delay_ms=2_000)
        state, stats = folded(
            running(cfg=config(restart_strategy=strategy), at=0), job_status(JobStatus.FAILING, at=5_000)
        )

        body = job_json(JOB, state, stats)

        assert "RESTARTING" == body["status"]
        assert {
            "attempt": 2,
            "at": 7_000,
            "delay": 2_000,
            "restore_checkpoint_id": None,
            "overdue": None,
        } == {k: v for k, v in body["restart"].items() if k != "failure"}

    def test_a_restart_no_driver_carries_out_is_named_with_what_to_do(self) -> None:
        """A participant app run without `cutline run` died: its job stayed RESTARTING for ever and
        nothing said so (issue 51). 30 s past due, the status line says it."""
        strategy = RestartStrategy(RestartStrategyKind.FIXED_DELAY, attempts=3, delay_ms=2_000)
        state, stats = folded(
            running(cfg=config(restart_strategy=strategy), at=0), job_status(JobStatus.FAILING, at=5_000)
        )

        on_time = job_json(JOB, state, stats, now_ms=7_000 + 29_999)["restart"]["overdue"]
        late = job_json(JOB, state, stats, now_ms=7_000 + 45_000)["restart"]["overdue"]

        assert on_time is None
        assert late.startswith("attempt 2 was due 45 s ago and no driver has started it")
        assert f"cutline run --job {JOB}" in late


class TestSummary:
    def test_min_average_max_and_percentiles_of_duration_and_size_each_with_its_unit(self) -> None:
        commands: list[object] = [running(at=0)]
        for n, duration in enumerate([10, 20, 30, 1500], start=1):
            commands += completed(n, duration, at=n * 10_000)

        body = summary_json(folded(*commands)[1])

        assert 4 == body["count"]
        rows = {row["statistic"]: row for row in body["rows"]}
        assert ["min", "avg", "max", "p50", "p90", "p95", "p99", "p999"] == list(rows)
        assert ["minimum", "average", "maximum"] == [row["label"] for row in body["rows"][:3]]
        assert (10, 390, 1500) == (
            rows["min"]["end_to_end_duration"],
            rows["avg"]["end_to_end_duration"],
            rows["max"]["end_to_end_duration"],
        )
        assert ("10 ms", "390 ms", "1.5 s") == (
            rows["min"]["shown"]["end_to_end_duration"],
            rows["avg"]["shown"]["end_to_end_duration"],
            rows["max"]["shown"]["end_to_end_duration"],
        )
        assert "0 B" == rows["max"]["shown"]["checkpointed_size"]

    def test_nothing_completed_has_no_rows_rather_than_zeros(self) -> None:
        """Never "min 0 ms ... max 0 ms" for a job that completed nothing."""
        assert {"count": 0, "window": 1000, "rows": []} == summary_json(folded(running(at=0))[1])
        assert [] == summary_json(None)["rows"]


class TestConfig:
    def test_each_setting_is_shown_with_its_unit(self) -> None:
        rows = config_rows(config(interval_ms=300, timeout_ms=600_000, min_pause_ms=1_500, max_concurrent=2))

        shown = {row["key"]: row["shown"] for row in rows}
        assert {
            "interval": "300 ms",
            "timeout": "10 min",
            "min_pause": "1.5 s",
            "max_concurrent": "2",
            "tolerable_failed_checkpoints": "0",
            "num_retained": "1",
            "heartbeat_interval": "10 s",
            "heartbeat_timeout": "50 s",
            "inline_threshold": "off (every snapshot to a file)",
        }.items() <= shown.items()
        assert {"interval": 300, "timeout": 600_000} == {
            row["key"]: row["value"] for row in rows if row["key"] in ("interval", "timeout")
        }

    def test_flinks_integer_max_value_is_shown_as_unlimited(self) -> None:
        rows = config_rows(config(tolerable_failures=UNLIMITED, max_concurrent=UNLIMITED))

        shown = {row["key"]: row["shown"] for row in rows}
        assert ("unlimited", "unlimited") == (shown["tolerable_failed_checkpoints"], shown["max_concurrent"])
        assert "2147483647" not in " ".join(row["shown"] for row in rows)

    def test_no_interval_means_manual_checkpoints_only(self) -> None:
        shown = {row["key"]: row["shown"] for row in config_rows(config(interval_ms=0))}

        assert shown["interval"].startswith("off")

    def test_a_job_without_a_configuration_has_no_rows(self) -> None:
        assert [] == config_rows(None)

    @pytest.mark.parametrize(
        ("strategy", "shown"),
        [
            (RestartStrategy(RestartStrategyKind.NONE), "none: a failed job is not restarted"),
            (
                RestartStrategy(RestartStrategyKind.FIXED_DELAY, attempts=3, delay_ms=2_000),
                "fixed-delay: 3 attempts, 2 s apart",
            ),
            (
                RestartStrategy(RestartStrategyKind.FAILURE_RATE),
                "failure-rate: at most 1 failure in 1 min, restarts 1 s apart",
            ),
            (
                RestartStrategy(),
                "exponential-delay: backoff 1 s to 1 min, x1.5 after each failure (jitter 0.1), back to "
                "the initial after 1 h without one; unlimited restarts in a row",
            ),
        ],
    )
    def test_the_restart_strategy_reads_as_flink_names_it(
        self, strategy: RestartStrategy, shown: str
    ) -> None:
        assert shown == describe_restart_strategy(strategy)
