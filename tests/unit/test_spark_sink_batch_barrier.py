"""Which barrier a micro-batch opens for the exactly-once Kafka sink, and where its cut is, read from
Spark's offset log: the one thing in which ``cutline-kafka`` and Spark's own ``kafka`` connector differ
for the sink (docs/exactly-once.md, "The Spark sink")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from spark_tasks.barrier_source import BarrierOffset
from spark_tasks.kafka_sink import BarrierBatch, batch_barrier

CHECKPOINT = {
    "attempt": 1,
    "epoch": 0,
    "id": 7,
    "kind": "CHECKPOINT",
    "location": "file:///c/7",
    "timestamp_ms": 5,
}
STOP = {**CHECKPOINT, "id": 8, "kind": "SAVEPOINT", "stop": True, "drain": True}
METADATA = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'


def cutline_kafka_batch(end: dict[str, Any]) -> str:
    """A batch of a query whose one source is ``cutline-kafka``, as Spark logs it."""
    return "\n".join(["v1", METADATA, json.dumps(end)])


def connector_batch(kafka_end: dict[str, Any], barriers: BarrierOffset) -> str:
    """A batch of a query on the connector: the Kafka source's line, then the barrier source's."""
    return "\n".join(["v1", METADATA, json.dumps(kafka_end), json.dumps(barriers.to_json())])


class TestOnCutlineKafka:
    def test_a_barrier_folded_into_the_sources_end_opens_the_batch_at_its_start(self) -> None:
        """Given cutline-kafka's end offset holding a barrier, the batch opens it, its cut the start."""
        logged = cutline_kafka_batch({"words": {"0": 12}, "__cutline_barrier__": CHECKPOINT})

        assert BarrierBatch(CHECKPOINT) == batch_barrier(3, logged, None, on_connector=False)

    def test_a_stops_cut_is_the_batch_start_too(self) -> None:
        """Given a stop barrier on cutline-kafka (its batch has no records), the cut is the start."""
        logged = cutline_kafka_batch({"words": {"0": 12}, "__cutline_barrier__": STOP})

        assert BarrierBatch(STOP, cut_at_end=False) == batch_barrier(3, logged, None, on_connector=False)

    def test_a_batch_of_records_only_opens_nothing(self) -> None:
        """Given an end offset with no barrier, the batch opens none."""
        assert batch_barrier(3, cutline_kafka_batch({"words": {"0": 12}}), None, on_connector=False) is None

    def test_an_offset_log_of_another_query_says_what_it_expected(self) -> None:
        """Given a log with two sources where one was expected, a clear error names them."""
        logged = "\n".join(["v1", METADATA, '{"a":{"0":1}}', '{"b":{"0":1}}'])

        with pytest.raises(ValueError, match="exactly one source"):
            batch_barrier(3, logged, None, on_connector=False)


class TestOnTheConnector:
    def test_a_barrier_folded_anew_opens_the_batch_at_its_start(self) -> None:
        """Given the barrier source counting one more barrier than the batch before, the batch opens
        it, and a checkpoint's cut is its start."""
        previous = connector_batch({"words": {"0": 10}}, BarrierOffset(2))
        logged = connector_batch({"words": {"0": 12}}, BarrierOffset(3, CHECKPOINT))

        assert BarrierBatch(CHECKPOINT) == batch_barrier(5, logged, previous, on_connector=True)

    def test_the_last_barrier_carried_into_a_batch_of_records_only_opens_nothing(self) -> None:
        """Given a batch the Kafka source alone made run, its barrier source's end is its start, the
        barrier before included: no new barrier, nothing opened."""
        previous = connector_batch({"words": {"0": 10}}, BarrierOffset(3, CHECKPOINT))
        logged = connector_batch({"words": {"0": 12}}, BarrierOffset(3, CHECKPOINT))

        assert batch_barrier(6, logged, previous, on_connector=True) is None

    def test_a_stops_cut_is_the_batch_end(self) -> None:
        """Given a stop barrier folded anew, its cut is the batch's end: the batch's rows go before it."""
        previous = connector_batch({"words": {"0": 10}}, BarrierOffset(3, CHECKPOINT))
        logged = connector_batch({"words": {"0": 12}}, BarrierOffset(4, STOP))

        assert BarrierBatch(STOP, cut_at_end=True) == batch_barrier(6, logged, previous, on_connector=True)

    def test_the_querys_first_batch_counts_from_no_barrier(self) -> None:
        """Given the first batch (no batch before), a barrier it folds is new."""
        logged = connector_batch({"words": {"0": 0}}, BarrierOffset(1, CHECKPOINT))

        assert BarrierBatch(CHECKPOINT) == batch_barrier(0, logged, None, on_connector=True)

    def test_a_batch_without_the_barrier_source_says_what_it_expected(self) -> None:
        """Given cutline-kafka's log read as the connector's, a clear error names the sources."""
        logged = cutline_kafka_batch({"words": {"0": 12}})

        with pytest.raises(ValueError, match="cutline-barriers"):
            batch_barrier(0, logged, None, on_connector=True)
