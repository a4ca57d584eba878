"""What the dashboard's job page shows, built from a job's folded state and statistics. Pure.

The job's status line (``GET /jobs/<id>``: status, attempt, restarts, its tasks, the latest
acknowledgement), the Summary tab (``/jobs/<id>/checkpoints/summary``: minimum, average, maximum and
percentiles of the completed checkpoints' end-to-end duration and checkpointed size, as Flink's
checkpoint Summary) and the Configuration tab (``shown`` in ``/jobs/<id>/checkpoints/config``: each
setting with its unit, "unlimited" for Flink's ``Integer.MAX_VALUE``). The Flink-shaped views are
:mod:`coordinator.core.stats`'.
"""

from __future__ import annotations

from typing import Any

from coordinator.core.state import JobState
from coordinator.core.stats import WINDOW, CheckpointStats, summarize
from coordinator.service.units import format_bytes, format_count, format_duration
from events.wire.records import CheckpointConfig, JobStatus, RestartStrategy, RestartStrategyKind


def latest_ack_timestamp(state: JobState, stats: CheckpointStats | None) -> int | None:
    """When the coordinator last accepted an ack of the job, of any checkpoint: one pending now, or
    one the statistics show (the latest completed, savepoint or failed one, or the history)."""
    times = [ack.timestamp_ms for pending in state.pending.values() for ack in pending.acks.values()]
    if stats is not None:
        shown = (*stats.history, stats.latest_completed, stats.latest_savepoint, stats.latest_failed)
        times += [
            e.latest_ack_timestamp for e in shown if e is not None and e.latest_ack_timestamp is not None
        ]
    return max(times, default=None)


RESTART_OVERDUE_MS = 30_000
"""How long past its due time a scheduled restart may wait for a driver to start it before the job's
status line says that nothing carries its restarts out."""


def overdue_restart(state: JobState, now_ms: int) -> str | None:
    """Why a RESTARTING job has not restarted, when its restart is :data:`RESTART_OVERDUE_MS` past
    due: no driver started the attempt (a participant app run without ``cutline run`` dies, and its
    job stays RESTARTING for ever); None otherwise."""
    restart = state.restart
    if state.status is not JobStatus.RESTARTING or restart is None:
        return None
    late = now_ms - (restart.timestamp_ms + restart.delay_ms)
    if late < RESTART_OVERDUE_MS:
        return None
    return (
        f"attempt {restart.attempt} was due {late // 1000} s ago and no driver has started it: nothing "
        f"carries out this job's restarts. Run its driver under `cutline run --job {state.job_id} -- ...`, "
        f"which starts each attempt the strategy decides, or start attempt {restart.attempt} yourself"
    )


def job_json(job_id: str, state: JobState, stats: CheckpointStats | None, now_ms: int = 0) -> dict[str, Any]:
    """``GET /jobs/<id>``: the job's status line (Flink's job overview, in the journal's terms), as
    of ``now_ms`` (a restart overdue then is named: :func:`overdue_restart`)."""
    restart = state.restart
    return {
        "id": job_id,
        "status": state.status,
        "attempt": state.attempt,
        "restarts": state.restarts,
        "tasks": len(state.tasks),
        "tasks_not_running": {task: str(s) for task, s in sorted(state.tasks_not_running.items())},
        "pending_checkpoints": sorted(state.pending.keys()),
        "stopping": state.stop is not None,
        "restart": None
        if restart is None
        else {
            "attempt": restart.attempt,
            "at": restart.timestamp_ms + restart.delay_ms,
            "delay": restart.delay_ms,
            "restore_checkpoint_id": restart.restore_checkpoint_id,
            "failure": restart.failure,
            "overdue": overdue_restart(state, now_ms) if now_ms else None,
        },
        "latest_ack_timestamp": latest_ack_timestamp(state, stats),
        "latest_completed_id": state.last_completed_id or None,
    }


SUMMARY_STATISTICS = (
    ("min", "minimum"),
    ("avg", "average"),
    ("max", "maximum"),
    ("p50", "50th percentile"),
    ("p90", "90th percentile"),
    ("p95", "95th percentile"),
    ("p99", "99th percentile"),
    ("p999", "99.9th percentile"),
)
"""The Summary's rows, in order: Flink's minimum, average, maximum, then its percentiles."""


def summary_json(stats: CheckpointStats | None) -> dict[str, Any]:
    """``GET /jobs/<id>/checkpoints/summary``: per statistic, the end-to-end duration (ms) and the
    checkpointed size (bytes) of the last completed checkpoints (at most ``window``), each with
    its unit in ``shown``. No rows while none completed (never "min 0 ms")."""
    durations = stats.durations if stats else ()
    sizes = stats.sizes if stats else ()
    body: dict[str, Any] = {"count": len(durations), "window": WINDOW, "rows": []}
    if not durations:
        return body
    duration, size = summarize(durations), summarize(sizes)
    body["rows"] = [
        {
            "statistic": key,
            "label": label,
            "end_to_end_duration": duration[key],
            "checkpointed_size": size[key],
            "shown": {
                "end_to_end_duration": format_duration(duration[key]),
                "checkpointed_size": format_bytes(size[key]),
            },
        }
        for key, label in SUMMARY_STATISTICS
    ]
    return body


def _interval(ms: int) -> str:
    return format_duration(ms) if ms > 0 else "off (manual checkpoints and savepoints only)"


def _counted(n: int, thing: str) -> str:
    return f"{format_count(n)} {thing}{'' if n == 1 else 's'}"


def describe_restart_strategy(strategy: RestartStrategy) -> str:
    """The strategy as Flink names it, with the settings it reads, each with its unit."""
    s, name = strategy, strategy.kind.flink_name
    match s.kind:
        case RestartStrategyKind.NONE:
            return f"{name}: a failed job is not restarted"
        case RestartStrategyKind.FIXED_DELAY:
            return f"{name}: {_counted(s.attempts, 'attempt')}, {format_duration(s.delay_ms)} apart"
        case RestartStrategyKind.FAILURE_RATE:
            return (
                f"{name}: at most {_counted(s.max_failures_per_interval, 'failure')} in "
                f"{format_duration(s.failure_rate_interval_ms)}, restarts {format_duration(s.delay_ms)} apart"
            )
    return (
        f"{name}: backoff {format_duration(s.initial_backoff_ms)} to {format_duration(s.max_backoff_ms)}, "
        f"x{s.backoff_multiplier:g} after each failure (jitter {s.jitter_factor:g}), back to the "
        f"initial after {format_duration(s.reset_backoff_threshold_ms)} without one; "
        f"{_counted(s.attempts_before_reset_backoff, 'restart')} in a row"
    )


def config_rows(config: CheckpointConfig | None) -> list[dict[str, Any]]:
    """The Configuration tab: each setting with its Flink name, its value as configured (``value``)
    and as shown (``shown``: with its unit; "unlimited" for Flink's ``Integer.MAX_VALUE``)."""
    if config is None:
        return []
    c = config
    inline = (
        format_bytes(c.inline_threshold_bytes)
        if c.inline_threshold_bytes > 0
        else "off (every snapshot to a file)"
    )
    rows = (
        ("mode", "Checkpointing mode", "exactly_once", "exactly once"),
        ("interval", "Checkpoint interval", c.interval_ms, _interval(c.interval_ms)),
        ("timeout", "Checkpoint timeout", c.timeout_ms, format_duration(c.timeout_ms)),
        ("min_pause", "Minimum pause between checkpoints", c.min_pause_ms, format_duration(c.min_pause_ms)),
        (
            "max_concurrent",
            "Maximum concurrent checkpoints",
            c.max_concurrent,
            format_count(c.max_concurrent),
        ),
        (
            "tolerable_failed_checkpoints",
            "Tolerable failed checkpoints",
            c.tolerable_failures,
            format_count(c.tolerable_failures),
        ),
        ("num_retained", "Retained checkpoints", c.retained, format_count(c.retained)),
        ("checkpoint_storage", "Checkpoint storage", c.location, c.location),
        ("inline_threshold", "Inline state threshold", c.inline_threshold_bytes, inline),
        (
            "heartbeat_interval",
            "Heartbeat interval",
            c.heartbeat_interval_ms,
            format_duration(c.heartbeat_interval_ms),
        ),
        (
            "heartbeat_timeout",
            "Heartbeat timeout",
            c.heartbeat_timeout_ms,
            format_duration(c.heartbeat_timeout_ms),
        ),
        (
            "restart_strategy",
            "Restart strategy",
            c.restart_strategy.kind.flink_name,
            describe_restart_strategy(c.restart_strategy),
        ),
    )
    return [{"key": key, "label": label, "value": value, "shown": shown} for key, label, value, shown in rows]
