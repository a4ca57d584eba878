"""Per-partition state and latency markers of a job on Spark's own kafka connector, without Spark:
the driver's snapshots at a cut from the offset-keyed state store, the barrier source's markers and
rows, and the connector options a per-partition job refuses (docs/spark.md, "Checkpoints on Spark's
own kafka connector")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from events.task.latency import LatencyMarker
from events.task.reply import Answer
from events.wire.records import CheckpointAcknowledged, CheckpointDeclined
from spark_tasks.barrier_source import (
    MARKER_SOURCE_ID,
    BarrierOffset,
    BarrierSourceOptions,
    batch_rows,
    next_end,
)
from spark_tasks.connector_cuts import PartitionSnapshots, SourceAck
from spark_tasks.connector_source import ConnectorOptionRefused, connector_options
from spark_tasks.state import PartitionStateStore
from spark_tasks.tasks import TaskSettings

BARRIER = {"attempt": 1, "epoch": 0, "id": 7, "kind": "CHECKPOINT", "timestamp_ms": 5}


class TestLatencyMarkersInTheBarrierOffset:
    def test_a_due_marker_makes_the_end_differ_from_the_start_without_folding_a_barrier(self) -> None:
        """A marker alone ends a batch at the same count of folded barriers, the old barrier dropped."""
        start = BarrierOffset(3, BARRIER)

        end = next_end(start, None, marker_ms=1000)

        assert BarrierOffset(3, None, 1000) == end
        assert {"__cutline_barriers__": 3, "__cutline_marker__": {"marked_ms": 1000}} == end.to_json()

    def test_a_marker_rides_with_a_barrier_and_reads_back(self) -> None:
        """Both fold into one end, keys sorted, and Spark's JSON of it reads back the same."""
        end = next_end(BarrierOffset(3), BARRIER, marker_ms=1000)

        assert BarrierOffset(4, BARRIER, 1000) == end
        assert end == BarrierOffset.from_json(json.dumps(end.to_json()))
        assert ["__cutline_barrier__", "__cutline_barriers__", "__cutline_marker__"] == list(end.to_json())

    def test_with_nothing_due_the_end_is_the_start(self) -> None:
        """No barrier and no marker: no batch runs for this source."""
        start = BarrierOffset(3, None, 1000)

        assert start is next_end(start, None, None)

    def test_after_a_stop_barrier_a_due_marker_makes_no_batch(self) -> None:
        """The stop's batch is the job's last: only a new barrier (a failed savepoint) moves on."""
        start = BarrierOffset(4, {**BARRIER, "stop": True})

        assert start is next_end(start, None, marker_ms=1000)
        assert BarrierOffset(5, BARRIER, 1000) == next_end(start, BARRIER, marker_ms=1000)


class TestBatchRows:
    def test_a_new_barrier_and_marker_are_one_task_the_marker_from_source_subtask_0(self) -> None:
        """The barrier row and the marker row go out together, the marker the connector's."""
        rows = batch_rows(BarrierOffset(3), BarrierOffset(4, BARRIER, 1000))

        assert rows is not None
        assert json.loads(rows.barrier or "") == BARRIER
        assert LatencyMarker(1000, MARKER_SOURCE_ID, 0) == LatencyMarker.from_json(rows.marker or "")

    def test_a_per_partition_job_gets_no_barrier_row(self) -> None:
        """Without barrier rows a barrier batch has no task of this source unless a marker is new."""
        assert batch_rows(BarrierOffset(3), BarrierOffset(4, BARRIER), barrier_rows=False) is None
        rows = batch_rows(BarrierOffset(3), BarrierOffset(4, BARRIER, 9), barrier_rows=False)
        assert rows is not None and rows.barrier is None and rows.marker is not None

    def test_an_old_barrier_or_marker_is_not_emitted_again(self) -> None:
        """An end that repeats its start's barrier count and marker carries nothing new."""
        assert batch_rows(BarrierOffset(4, BARRIER, 9), BarrierOffset(4, BARRIER, 9)) is None


class TestBarrierSourceOptions:
    def test_markers_and_barrier_rows_are_options(self) -> None:
        """The job turns barrier rows off for a per-partition job and markers on by interval."""
        options = BarrierSourceOptions.parse(
            {"cutline.job": "j", "cutline.bootstrap": "b", "cutline.barrierRows": "false",
             "cutline.latencyIntervalMs": "200"}
        )  # fmt: skip

        assert (False, 200, True) == (options.barrier_rows, options.latency_interval_ms, options.markers)

    @pytest.mark.parametrize(
        ("name", "value", "says"),
        [("cutline.barrierRows", "no", "true or false"), ("cutline.latencyIntervalMs", "-1", "0 or more")],
    )
    def test_a_bad_value_says_what_it_must_be(self, name: str, value: str, says: str) -> None:
        with pytest.raises(ValueError, match=says):
            BarrierSourceOptions.parse({"cutline.job": "j", "cutline.bootstrap": "b", name: value})


class TestPerPartitionConnectorOptions:
    @pytest.mark.parametrize("option", ["minPartitions", "maxRecordsPerPartition"])
    def test_options_that_split_a_partition_over_tasks_are_refused_with_what_to_do(self, option: str) -> None:
        """A per-partition state is folded in one task per partition; a keyed job may split."""

        def options(per_partition: bool) -> dict[str, str]:
            return connector_options(
                {option: "8"}, bootstrap="b", topics=("words",), group="wc", starting={}, restored=None,
                per_partition=per_partition,
            )  # fmt: skip

        assert option in options(per_partition=False)
        with pytest.raises(ConnectorOptionRefused, match="make the job keyed"):
            options(per_partition=True)


class TestPartitionSnapshots:
    def snapshots(self, tmp_path: Path) -> tuple[PartitionSnapshots, list[Answer | str]]:
        """The driver's snapshots, what they send in order, and ``"flushed"`` where they wait."""
        sent: list[Answer | str] = []
        settings = TaskSettings("wc", "b", str(tmp_path / "state"), run_id="r1")
        store = PartitionStateStore(tmp_path / "state")
        return PartitionSnapshots(
            store, settings, lambda _, a: sent.append(a), lambda _: sent.append("flushed")
        ), sent

    def ack(self, tmp_path: Path, offsets: dict[tuple[str, int], int]) -> SourceAck:
        barrier = {**BARRIER, "location": (tmp_path / "chk-7").as_uri()}
        return SourceAck(3, barrier, offsets, after_commit=False)

    def test_each_partition_acks_the_state_version_at_or_below_its_cut(self, tmp_path: Path) -> None:
        """Given versions at 0, 4 and 9 (9 is the next batch's, already running), the cut at 6 snapshots
        the version at 4: the state after every record below 6 once the batch before committed; a
        version at the cut itself (the last task ended there) is the one."""
        snapshots, sent = self.snapshots(tmp_path)
        for offset in (0, 4, 9):
            snapshots.store.save("words", 0, offset, f"v{offset}".encode())
        snapshots.store.save("words", 1, 0, b"v0")
        snapshots.store.save("words", 1, 2, b"v2")

        snapshots(self.ack(tmp_path, {("words", 0): 6, ("words", 1): 2}))

        assert "flushed" == sent[-1]  # one wait for all the partitions' acks, after them
        acks = [
            a.reply for a in sent if isinstance(a, Answer) and isinstance(a.reply, CheckpointAcknowledged)
        ]
        assert 3 == len(sent) == len(acks) + 1
        assert ["words-0", "words-1"] == [a.task_id for a in acks]
        assert [{"words:0": 6}, {"words:1": 2}] == [dict(a.offsets) for a in acks]
        assert b"v4" == (tmp_path / "chk-7" / "words-0.a1-r1.cut-6").read_bytes()
        assert b"v2" == (tmp_path / "chk-7" / "words-1.a1-r1.cut-2").read_bytes()

    def test_a_partition_without_a_version_declines_saying_why(self, tmp_path: Path) -> None:
        """No version at or below the cut (pruned or deleted): a decline, never empty state."""
        snapshots, sent = self.snapshots(tmp_path)
        snapshots.store.save("words", 0, 9, b"v9")

        snapshots(self.ack(tmp_path, {("words", 0): 6}))

        (declined,) = [a.reply for a in sent if isinstance(a, Answer)]
        assert isinstance(declined, CheckpointDeclined)
        assert "no state of words[0] at or below offset 6" in declined.message

    def test_a_lost_partition_declines(self, tmp_path: Path) -> None:
        """A tombstone below the cut: the partition's state cannot be trusted."""
        snapshots, sent = self.snapshots(tmp_path)
        snapshots.store.save("words", 0, 0, b"v0")
        snapshots.store.lost("words", 0, 3, "gone")

        snapshots(self.ack(tmp_path, {("words", 0): 6}))

        (declined,) = [a.reply for a in sent if isinstance(a, Answer)]
        assert isinstance(declined, CheckpointDeclined)
        assert "gone" in declined.message
