"""The source's Arrow batches, without Spark: they hold exactly what PySpark would have made of the
rows (spark_tasks.kafka_source.reading.record_batch and barrier_batch)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Message
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

from spark_tasks.kafka_source.reader import KafkaSource
from spark_tasks.kafka_source.reading import (
    KafkaInputPartition,
    barrier_batch,
    kafka_schema,
    record_batch,
    record_row,
)

BARRIER = {
    "attempt": 1,
    "id": 3,
    "kind": "CHECKPOINT",
    "location": "file:///c",
    "timestamp_ms": 1_700_000_000_123,
}


def _messages() -> list[Message]:
    return [
        Message(
            topic="words",
            partition=2,
            offset=10,
            key=b"k",
            value=b"one two",
            timestamp=(1, 1_700_000_000_001),
        ),
        Message(
            topic="words",
            partition=2,
            offset=11,
            key=None,
            value=b"three",
            timestamp=(2, 1_700_000_000_002),
            headers=[("trace", b"x"), ("n", b"1")],
        ),
        Message(topic="words", partition=2, offset=13, key=b"", value=None, timestamp=(0, -1)),
    ]


def _as_pyspark_would(rows: list[tuple[Any, ...]], include_headers: bool, barriers: bool) -> pa.RecordBatch:
    """PySpark's own conversion of the rows a reader yields as tuples."""
    schema = kafka_schema(include_headers, barriers=barriers)
    batches = list(records_to_arrow_batches(iter(rows), 10_000, schema, KafkaSource({})))
    assert len(batches) == 1
    return batches[0]


@pytest.mark.parametrize("include_headers", [False, True])
@pytest.mark.parametrize("barriers", [False, True])
def test_a_record_batch_holds_what_pyspark_makes_of_the_rows(include_headers: bool, barriers: bool) -> None:
    schema = to_arrow_schema(kafka_schema(include_headers, barriers=barriers), timezone="UTC")
    messages = _messages()

    batch = record_batch(messages, schema, include_headers)

    rows = [record_row(m, include_headers) + ((None,) if barriers else ()) for m in messages]
    assert batch.equals(_as_pyspark_would(rows, include_headers, barriers))
    assert batch.schema.equals(schema)


@pytest.mark.parametrize("include_headers", [False, True])
def test_the_barrier_row_sits_at_the_start_offset_with_the_barrier_json(include_headers: bool) -> None:
    schema = to_arrow_schema(kafka_schema(include_headers, barriers=True), timezone="UTC")
    text = json.dumps(BARRIER, sort_keys=True, separators=(",", ":"))
    split = KafkaInputPartition("words", 2, 10, 14, barrier=text)

    batch = barrier_batch(split, schema, include_headers)

    row = batch.to_pylist()[0]
    assert (row["topic"], row["partition"], row["offset"], row["timestampType"]) == ("words", 2, 10, -1)
    assert (row["key"], row["value"], row["cutline_barrier"]) == (None, None, text)
    assert int(row["timestamp"].timestamp() * 1000) == BARRIER["timestamp_ms"]
    assert batch.schema.equals(schema)
