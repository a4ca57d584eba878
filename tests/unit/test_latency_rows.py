"""Latency markers as rows, without Spark (spark_tasks/kafka_source/, spark_tasks/latency.py,
spark_tasks/keyed.py): the offsets carry them, the source's batches hold them, and the map side
measures them and copies them to every shuffle partition without a pair for user code."""

from __future__ import annotations

import json
import pickle

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from events.task.latency import LatencyMarker
from spark_tasks.kafka_source.offsets import (
    BARRIER_KEY,
    MARKER_KEY,
    barrier_of,
    from_offsets,
    marker_of,
    to_offsets,
)
from spark_tasks.kafka_source.options import KafkaSourceOptions
from spark_tasks.kafka_source.reading import (
    MARKER_COLUMN,
    KafkaInputPartition,
    barrier_batch,
    kafka_schema,
    marker_batch,
)
from spark_tasks.keyed import SHUFFLE_SCHEMA, KeyedStep, route_step
from spark_tasks.latency import ROUTE, Measurements

MARKER = LatencyMarker(1_700_000_000_500, "cutline-kafka", 2)
BARRIER = {"attempt": 1, "id": 3, "kind": "CHECKPOINT", "location": "file:///c", "timestamp_ms": 1}
SCHEMA = to_arrow_schema(kafka_schema(barriers=True, markers=True), timezone="UTC")


def test_an_end_offset_carries_the_marker_after_the_barrier_and_the_offsets_stay_the_same() -> None:
    """The marker's time rides the end offset under __cutline_marker__, after a barrier; reading the
    offsets skips both."""
    offsets = to_offsets({("words", 0): 7}, BARRIER, 1_700_000_000_500)

    assert [BARRIER_KEY, MARKER_KEY, "words"] == list(offsets)
    assert {("words", 0): 7} == from_offsets(json.dumps(offsets))
    assert (1_700_000_000_500, BARRIER) == (marker_of(json.dumps(offsets)), barrier_of(offsets))
    assert marker_of(to_offsets({("words", 0): 7})) is None


def test_markers_are_off_by_default_and_need_a_job() -> None:
    """cutline.latencyIntervalMs is 0 unless set, and only a job's source may emit markers."""
    base = {"kafka.bootstrap.servers": "b:9092", "subscribe": "words"}

    assert not KafkaSourceOptions.parse({**base, "cutline.job": "j"}).markers
    assert KafkaSourceOptions.parse({**base, "cutline.job": "j", "cutline.latencyIntervalMs": 1000}).markers
    try:
        KafkaSourceOptions.parse({**base, "cutline.latencyIntervalMs": 1000})
    except ValueError as exc:
        assert "needs 'cutline.job'" in str(exc)
    else:
        raise AssertionError("markers without a job were accepted")


def test_the_marker_row_follows_the_barrier_row_at_the_start_offset() -> None:
    """With markers on, a barrier row's marker cell is null and the marker row's barrier cell is null;
    the marker row sits at the batch's start offset, stamped with the marker's time."""
    split = KafkaInputPartition(
        "words", 2, 10, 14, barrier=json.dumps(BARRIER, sort_keys=True), marker=MARKER.to_json()
    )

    barrier, marker = (
        b.to_pylist()[0] for b in (barrier_batch(split, SCHEMA, False), marker_batch(split, SCHEMA, False))
    )

    assert (barrier["cutline_barrier"] is not None, barrier[MARKER_COLUMN]) == (True, None)
    assert (marker["cutline_barrier"], marker[MARKER_COLUMN]) == (None, MARKER.to_json())
    assert (marker["offset"], marker["key"], marker["value"]) == (10, None, None)
    assert int(marker["timestamp"].timestamp() * 1000) == MARKER.marked_time_ms


def test_the_map_side_measures_a_marker_and_copies_it_to_every_shuffle_partition() -> None:
    """Given a batch of a marker row and one record, route sends the pair to its partition and the
    marker to all 3, and never hands the marker to key_by (which would choke on its null value)."""
    seen = []
    step = KeyedStep(
        key_by=lambda record: seen.append(record.value) or [(record.value.decode(), 1)],
        update=lambda key, state, values: (None, []),
        output_schema="word string",
    )
    split = KafkaInputPartition("words", 2, 10, 11, marker=MARKER.to_json())
    rows = pa.RecordBatch.from_pylist(
        [
            marker_batch(split, SCHEMA, False).to_pylist()[0],
            {"key": None, "value": b"tree", "topic": "words", "partition": 2, "offset": 10,
             "timestamp": None, "timestampType": 0, "cutline_barrier": None, MARKER_COLUMN: None},
        ],
        schema=SCHEMA,
    )  # fmt: skip

    out = pa.Table.from_batches(list(route_step(step, 3)([rows]))).to_pylist()

    assert [b"tree"] == seen
    markers = [row for row in out if row[MARKER_COLUMN] is not None]
    assert [0, 1, 2] == sorted(row["cutline_target"] for row in markers)
    assert {MARKER.to_json()} == {row[MARKER_COLUMN] for row in markers}
    assert all(row["key"] is None and row["cutline_barrier"] is None for row in markers)
    pairs = [row for row in out if row[MARKER_COLUMN] is None]
    assert [("tree", 1)] == [(row["key"], pickle.loads(row["value"])) for row in pairs]
    assert "cutline_marker string" in SHUFFLE_SCHEMA


def test_measurements_name_the_operator_and_the_source_subtask() -> None:
    """A marker row measured by an operator of the source's task takes the source subtask's index;
    a keyed task names its own; an unreadable cell is skipped."""
    routed, keyed = Measurements("wc", 2, ROUTE), Measurements("wc", 2, "keyed", 5)

    for taken in (routed, keyed):
        taken.marker(MARKER.to_json())
        taken.marker("not a marker")

    assert [(ROUTE, 2, 2, "cutline-kafka")] == [
        (m.operator_id, m.operator_subtask_index, m.source_subtask_index, m.source_id) for m in routed.taken
    ]
    assert [("keyed", 5, 2)] == [
        (m.operator_id, m.operator_subtask_index, m.source_subtask_index) for m in keyed.taken
    ]
    assert all(m.timestamp_ms >= MARKER.marked_time_ms and m.attempt == 2 for m in routed.taken + keyed.taken)
