"""A job on Spark's own kafka connector, without Spark: the barrier source's offsets, the ``source``
task's answer read from Spark's offset log, and the connector options a checkpointed job accepts
(docs/spark.md, "Checkpoints on Spark's own kafka connector")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from spark_tasks.barrier_source import BarrierOffset, holds, is_barrier_offset, next_end
from spark_tasks.connector_cuts import LoggedBatch, SourceAck, parse_logged_batch, source_ack
from spark_tasks.connector_source import ConnectorOptionRefused, connector_options

BARRIER = {
    "attempt": 1,
    "epoch": 0,
    "id": 7,
    "kind": "CHECKPOINT",
    "location": "file:///c/7",
    "timestamp_ms": 5,
}
STOP = {**BARRIER, "id": 8, "kind": "SAVEPOINT", "stop": True, "drain": False}
FIRST = {("words", 0): 0, ("words", 1): 0}


def logged(
    batch_id: int, offsets: dict[tuple[str, int], int], folded: int, barrier: dict[str, Any] | None
) -> LoggedBatch:
    return LoggedBatch(batch_id, offsets, BarrierOffset(folded, barrier))


class TestBarrierOffsets:
    def test_a_pending_barrier_is_folded_into_the_next_end_once(self) -> None:
        """The oldest pending barrier ends the next batch, one more folded than at its start."""
        start = BarrierOffset(3)

        end = next_end(start, BARRIER)

        assert BarrierOffset(4, BARRIER) == end
        assert {"__cutline_barrier__": BARRIER, "__cutline_barriers__": 4} == end.to_json()

    def test_without_a_barrier_the_end_is_the_start_so_no_batch_runs_for_it(self) -> None:
        """With nothing pending the source answers its start itself, barrier included."""
        start = BarrierOffset(4, BARRIER)

        assert start is next_end(start, None)

    def test_its_offset_reads_back_and_tells_its_log_line_from_the_kafka_sources(self) -> None:
        """Spark hands the offset back as parsed JSON; its log line is told apart by its key."""
        offset = BarrierOffset(2, STOP)

        assert offset == BarrierOffset.from_json(json.dumps(offset.to_json()))
        assert is_barrier_offset(json.dumps(offset.to_json()))
        assert not is_barrier_offset('{"words":{"0":5}}')

    def test_a_malformed_offset_says_what_it_must_be(self) -> None:
        """Anything but a count of folded barriers is refused, naming the key."""
        with pytest.raises(ValueError, match="__cutline_barriers__"):
            BarrierOffset.from_json({"words": {"0": 1}})

    def test_after_a_stop_barrier_the_next_batch_holds_until_another_barrier(self) -> None:
        """A stop barrier's batch is the job's last unless its savepoint fails (a newer barrier)."""
        assert holds(BarrierOffset(5, STOP), None)
        assert not holds(BarrierOffset(5, STOP), BARRIER)
        assert not holds(BarrierOffset(5, BARRIER), None)


class TestSourceAck:
    def test_a_checkpoint_barrier_is_acked_with_its_batch_start_the_previous_batch_end(self) -> None:
        """The cut is the start of the barrier's batch on every partition: the end of the batch before."""
        previous = logged(4, {("words", 0): 10, ("words", 1): 12}, 1, None)
        batch = logged(5, {("words", 0): 15, ("words", 1): 20}, 2, BARRIER)

        ack = source_ack(batch, previous, FIRST)

        assert SourceAck(5, BARRIER, {("words", 0): 10, ("words", 1): 12}, after_commit=False) == ack

    def test_a_barrier_in_the_first_batch_is_acked_at_the_query_start(self) -> None:
        """The first batch starts at the exact offsets the job gave the connector."""
        batch = logged(0, {("words", 0): 3, ("words", 1): 4}, 1, BARRIER)

        assert SourceAck(0, BARRIER, FIRST, after_commit=False) == source_ack(batch, None, FIRST)

    def test_a_stop_barrier_is_acked_with_its_batch_end_after_the_commit(self) -> None:
        """A stop's snapshots are taken after its batch's records: the cut is that batch's end."""
        previous = logged(4, {("words", 0): 10, ("words", 1): 12}, 1, BARRIER)
        batch = logged(5, {("words", 0): 15, ("words", 1): 20}, 2, STOP)

        ack = source_ack(batch, previous, FIRST)

        assert SourceAck(5, STOP, {("words", 0): 15, ("words", 1): 20}, after_commit=True) == ack

    def test_a_batch_whose_barrier_source_did_not_move_answers_nothing(self) -> None:
        """A batch's start carries the last barrier: it is not a new one."""
        previous = logged(4, {("words", 0): 10}, 2, BARRIER)
        batch = logged(5, {("words", 0): 15}, 2, BARRIER)

        assert source_ack(batch, previous, FIRST) is None
        assert source_ack(logged(0, {("words", 0): 1}, 0, None), None, FIRST) is None


class TestParseLoggedBatch:
    def test_the_kafka_line_and_the_barrier_line_in_either_order(self) -> None:
        """Spark's log: the version, the batch's metadata, one line per source."""
        text = "\n".join(
            ["v1", '{"batchWatermarkMs":0}', '{"__cutline_barriers__": 1}', '{"w":{"0":5,"1":6}}']
        )

        assert logged(3, {("w", 0): 5, ("w", 1): 6}, 1, None) == parse_logged_batch(3, text)

    def test_a_log_of_another_query_is_refused(self) -> None:
        """A query without the barrier source (or with two Kafka sources) is not a connector job's."""
        with pytest.raises(ValueError, match="one kafka and one cutline-barriers"):
            parse_logged_batch(0, 'v1\n{}\n{"w":{"0":5}}')


class TestConnectorOptions:
    def options(self, user: dict[str, str], restored: int | None = None) -> dict[str, str]:
        return connector_options(
            user, bootstrap="b:9092", topics=("words",), group="wc", starting=FIRST, restored=restored
        )

    def test_the_job_subscribes_its_topics_from_the_exact_offsets(self) -> None:
        """Spark's own options pass; subscribe and startingOffsets are the job's."""
        options = self.options({"maxOffsetsPerTrigger": "100", "startingOffsets": "earliest"})

        assert {
            "maxOffsetsPerTrigger": "100",
            "kafka.bootstrap.servers": "b:9092",
            "subscribe": "words",
            "startingOffsets": '{"words":{"0":0,"1":0}}',
        } == options

    @pytest.mark.parametrize(
        ("option", "advice"),
        [
            ("subscribePattern", "list the topics there"),
            ("assign", "list the topics there"),
            ("startingTimestamp", "use startingOffsets"),
            ("startingOffsetsByTimestamp", "use startingOffsets"),
        ],
    )
    def test_options_a_checkpoint_cannot_follow_are_refused_with_what_to_do(
        self, option: str, advice: str
    ) -> None:
        """The job's checkpoints name every partition of its topics and where its first batch starts."""
        with pytest.raises(ConnectorOptionRefused, match=advice):
            self.options({option: "x"})

    def test_another_subscription_is_refused(self) -> None:
        """subscribe may only repeat the job's topics."""
        assert "words" == self.options({"subscribe": "words"})["subscribe"]
        with pytest.raises(ConnectorOptionRefused, match="leave subscribe out"):
            self.options({"subscribe": "words,other"})

    def test_offsets_asked_for_on_a_restore_are_refused(self) -> None:
        """A restore starts at the checkpoint's offsets; a word like earliest is for a fresh start."""
        assert self.options({"startingOffsets": "earliest"}, restored=4)
        with pytest.raises(ConnectorOptionRefused, match="restores checkpoint 4"):
            self.options({"startingOffsets": '{"words":{"0":5,"1":5}}'}, restored=4)

    def test_the_jobs_own_consumer_group_is_refused_to_spark(self) -> None:
        """The group where the job commits completed checkpoints' offsets is not Spark's."""
        assert "other" == self.options({"kafka.group.id": "other"})["kafka.group.id"]
        with pytest.raises(ConnectorOptionRefused, match="the job's consumer group"):
            self.options({"kafka.group.id": "wc"})
