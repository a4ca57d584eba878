"""The checkpoint timeline plot of ``cutline replay --plot``."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from coordinator.cli import app
from coordinator.core.testing import ack, decline, run_commands, running, tick
from coordinator.replay.plot import CheckpointOutcomes, write_plot
from events.wire.records import CheckpointKind


def outcomes_of_a_small_job() -> CheckpointOutcomes:
    _, events = run_commands(
        [
            running(at=0),
            tick(1000),
            ack(1, "t0", at=1010),
            ack(1, "t1", at=1030),
            tick(2000),
            decline(2, "t0", at=2005),
        ]
    )
    outcomes = CheckpointOutcomes()
    for event in events:
        outcomes.add(event)  # type: ignore[arg-type]
    return outcomes


class TestOutcomes:
    def test_one_point_per_ended_checkpoint(self) -> None:
        """A completed and a declined checkpoint give two points with their durations and reasons."""
        points = [
            (o.checkpoint_id, o.kind, o.triggered_ms, o.duration_ms, o.completed, o.reason)
            for o in outcomes_of_a_small_job().outcomes
        ]

        assert [
            (1, CheckpointKind.CHECKPOINT, 1000, 30, True, None),
            (2, CheckpointKind.CHECKPOINT, 2000, 5, False, "CHECKPOINT_DECLINED"),
        ] == points


class TestPlotFiles:
    @pytest.mark.parametrize("suffix", [".png", ".svg", ".html"])
    def test_writes_each_format(self, tmp_path: Path, suffix: str) -> None:
        """PNG, SVG and HTML files are written and start like files of their kind."""
        path = tmp_path / f"timeline{suffix}"

        write_plot(outcomes_of_a_small_job().outcomes, path)

        head = path.read_bytes()[:64]
        expected = {".png": b"\x89PNG", ".svg": b"<?xml", ".html": b"<!doctype html>"}[suffix]
        assert head.startswith(expected)

    def test_replay_plot_option(self, tmp_path: Path) -> None:
        """`replay --plot F.png` writes the plot and says how many checkpoints it drew."""
        journal, png = tmp_path / "j.avro", tmp_path / "t.png"
        runner = CliRunner()
        assert 0 == runner.invoke(app, ["journal-demo", "--out", str(journal), "--events", "2000"]).exit_code

        result = runner.invoke(app, ["replay", "-f", str(journal), "--quiet", "--plot", str(png)])

        assert 0 == result.exit_code, result.output
        assert "plotted" in result.output
        assert png.stat().st_size > 10_000

    def test_unknown_format(self, tmp_path: Path) -> None:
        """An unknown file type is refused before any work, with the formats it can write."""
        result = CliRunner().invoke(app, ["replay", "-f", str(tmp_path / "x.avro"), "--plot", "t.pdf"])

        assert 2 == result.exit_code
        assert ".png, .svg or .html" in result.output
