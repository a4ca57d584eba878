"""``cutline status``: what it prints of a job's statistics and configuration (the coordinator's
``/jobs/JOB/checkpoints`` and ``/checkpoints/config`` views)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console

from coordinator.core.stats import CheckpointStats, checkpoints_json, config_json
from coordinator.replay.timeline import config_lines, render_status, setting_text
from events.wire.records import CheckpointConfig

CONFIG = CheckpointConfig(1000, "file:///data/checkpoints", timeout_ms=600_000, min_pause_ms=0, retained=2)


def printed(stats: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(render_status("orders", stats, config))
    return console.export_text()


def test_a_job_with_nothing_completed_says_so_instead_of_zero_durations() -> None:
    """Flink's summary of no checkpoint is all zeros; status says there is none yet."""
    text = printed(checkpoints_json(CheckpointStats(total=1, in_progress=1)), config_json(CONFIG))

    assert "no completed checkpoint yet" in text
    assert "min 0 ms" not in text


def test_durations_are_summarized_once_a_checkpoint_completed() -> None:
    stats = CheckpointStats(total=2, completed=2, durations=(40, 60), sizes=(10, 10))

    text = printed(checkpoints_json(stats), config_json(CONFIG))

    assert "min 40 ms p50 60 ms p99 60 ms max 60 ms" in text
    assert "no completed checkpoint yet" not in text


def test_the_configuration_shows_durations_with_their_unit() -> None:
    """interval, timeout and min_pause are milliseconds; counts and the location stay as they are."""
    lines = dict(config_lines(config_json(CONFIG)))

    assert ("1000 ms", "600000 ms", "0 ms") == (lines["interval"], lines["timeout"], lines["min_pause"])
    assert ("2", "file:///data/checkpoints") == (lines["num_retained"], lines["checkpoint_storage"])


def test_an_interval_of_zero_reads_as_periodic_checkpoints_off() -> None:
    assert "off (no periodic checkpoints)" == setting_text("interval", 0)


def test_a_coordinator_that_sends_shown_values_is_shown_with_them() -> None:
    """The configuration view may carry ``shown``: each setting's label and value with its unit, as
    the dashboard shows them; status prints those rows instead of the raw keys."""
    config = {
        **config_json(CONFIG),
        "shown": [
            {"key": "interval", "label": "Checkpoint interval", "value": 1000, "shown": "1 s"},
            {"key": "timeout", "label": "Checkpoint timeout", "value": 600_000, "shown": "10 min"},
        ],
    }

    assert [("Checkpoint interval", "1 s"), ("Checkpoint timeout", "10 min")] == config_lines(config)
    assert "'key'" not in printed(checkpoints_json(None), config)
