"""On Spark's own kafka connector the driver answers a barrier batch's cut (its ``source`` task's ack)
only once every gate says yes: an exactly-once Kafka sink's output before the cut must be staged first
(docs/exactly-once.md, "On Spark's kafka connector"). A real offset log on disk and the follower's
thread; no Spark, no broker."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_tasks.barrier_source import BarrierOffset
from spark_tasks.connector_cuts import CutFollower, SourceAck

BARRIER = {
    "attempt": 1,
    "epoch": 0,
    "id": 7,
    "kind": "CHECKPOINT",
    "location": "file:///c/7",
    "timestamp_ms": 5,
}
FIRST = {("words", 0): 3}


def log_batch(
    spark_checkpoint: Path, batch_id: int, kafka_end: dict[str, Any], barriers: BarrierOffset
) -> None:
    offsets = spark_checkpoint / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    lines = ["v1", "{}", json.dumps(kafka_end), json.dumps(barriers.to_json())]
    (offsets / str(batch_id)).write_text("\n".join(lines))


class TestCutGate:
    def test_the_cut_is_answered_only_once_the_gate_opens(self, tmp_path: Path) -> None:
        """Given a barrier batch in the offset log and a closed gate, no ack goes; once the gate
        opens, the ack goes with the batch's start."""
        log_batch(tmp_path, 0, {"words": {"0": 9}}, BarrierOffset(1, BARRIER))
        staged = threading.Event()
        asked: list[Mapping[str, Any]] = []
        sent: list[SourceAck] = []

        def gate(entry: Mapping[str, Any]) -> bool:
            asked.append(entry)
            return staged.is_set()

        follower = CutFollower(tmp_path, FIRST, list(FIRST), sent.append, interval=0.01, ready=gate)
        try:
            _wait_for(lambda: len(asked) >= 3)
            assert sent == []  # the gate was asked, again and again, and said no
            staged.set()
            _wait_for(lambda: bool(sent))
        finally:
            follower.close()

        assert [SourceAck(0, BARRIER, FIRST, after_commit=False)] == sent
        assert BARRIER == asked[-1]

    def test_without_a_gate_the_cut_is_answered_at_once(self, tmp_path: Path) -> None:
        """Given no gate (no exactly-once sink in the job), the ack goes as soon as the batch is logged."""
        log_batch(tmp_path, 0, {"words": {"0": 9}}, BarrierOffset(1, BARRIER))
        sent: list[SourceAck] = []

        follower = CutFollower(tmp_path, FIRST, list(FIRST), sent.append, interval=0.01)
        try:
            _wait_for(lambda: bool(sent))
        finally:
            follower.close()

        assert [SourceAck(0, BARRIER, FIRST, after_commit=False)] == sent


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("timed out")
