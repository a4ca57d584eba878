"""bench/bench_vs_flink.py: a failed Flink anchor costs no cutline row (issue 47)."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from bench.bench_coordinator import LatencyResult
from bench.bench_vs_flink import CutlineRow, as_json, side_by_side

CPU = {"coordinator": 1.0, "broker": 1.0, "participants": 1.0, "other processes": 0.5, "wall": 10.0}


def measured_row(broker: str, durations: list[int]) -> CutlineRow:
    result = LatencyResult("faust", 8, "shared", durations, 0, 0, {}, dict(CPU))
    return CutlineRow(result, "shared", (1.0, 1.0, 1.0), 3.0, broker)


class TestAFailedAnchor:
    def test_keeps_every_cutline_row_of_the_size_with_why(self) -> None:
        """Given two measured rows and an anchor that failed, the JSON holds both rows, their
        figures, and the anchor's failure in place of Flink's figures."""
        rows = [measured_row("tansu", [10, 20, 30]), measured_row("kafka", [40, 50, 60])]

        written = as_json([(rows, "RuntimeError: the Flink anchor failed (1)")], {"command": "x"})

        assert [("tansu", 20.0), ("kafka", 50.0)] == [
            (row["broker"], row["cutline"]["p50"]) for row in written["rows"]
        ]
        assert {"failed": "RuntimeError: the Flink anchor failed (1)"} == written["rows"][0]["flink"]
        assert None is written["rows"][0]["target_met"]

    def test_prints_the_rows_and_the_failure(self) -> None:
        """Given the same, the table shows each cutline row's p50 and says the anchor failed."""
        rows = [measured_row("tansu", [11, 22, 33]), measured_row("kafka", [44, 55, 66])]
        out = StringIO()

        Console(file=out, width=300).print(side_by_side([(rows, "RuntimeError: boom")]))

        text = out.getvalue()
        assert "Tansu" in text and "Apache Kafka" in text
        assert " 22 " in text and " 55 " in text
        assert "failed: RuntimeError: boom" in text
