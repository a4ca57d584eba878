"""What a task of the ``cutline-kafka`` source reads: the source's columns, one Kafka partition's
records of a batch, as Arrow batches, and the barrier and latency-marker rows that go before them.

Runs in Python workers on executors: each :func:`read_chunks` call has its own consumer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from events.kafka.clients import watermark_offsets
from events.task.latency import LatencyMarker
from events.wire.barrier_entry import parse_barrier_json
from spark_tasks.kafka_source.options import KafkaSourceOptions

__all__ = [
    "BARRIER_COLUMN",
    "MARKER_COLUMN",
    "DataLossError",
    "KafkaInputPartition",
    "barrier_batch",
    "kafka_schema",
    "marker_batch",
    "read_chunks",
    "record_batch",
    "record_row",
]

log = logging.getLogger(__name__)

BARRIER_COLUMN = "cutline_barrier"
"""The extra column with ``cutline.job``: the barrier entry's JSON on barrier rows
(:func:`events.wire.barrier_entry.barrier_json`), null otherwise."""
MARKER_COLUMN = "cutline_marker"
"""The extra column with ``cutline.latencyIntervalMs``: the marker's JSON
(:meth:`events.task.latency.LatencyMarker.to_json`) on marker rows, null otherwise."""

# librdkafka's timestamp types (0 none, 1 create, 2 log append) -> the Java client's ids.
_TIMESTAMP_TYPE = {0: -1, 1: 0, 2: 1}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def kafka_schema(include_headers: bool = False, barriers: bool = False, markers: bool = False) -> StructType:
    """The columns of Spark's built-in Kafka source (and ``cutline_barrier`` with ``barriers``, then
    ``cutline_marker`` with ``markers``)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    if barriers:
        fields.append(StructField(BARRIER_COLUMN, StringType()))
    if markers:
        fields.append(StructField(MARKER_COLUMN, StringType()))
    return StructType(fields)


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """One Spark task: the offsets ``[start, end)`` of one Kafka partition."""

    topic: str
    partition: int
    start: int
    end: int
    barrier: str | None = None
    """The JSON of the barrier folded into this batch: emitted before the first record, at ``start``."""
    marker: str | None = None
    """The JSON of this partition's latency marker (:class:`events.task.latency.LatencyMarker`): emitted
    after the barrier, before the first record."""


def record_row(message: Message, include_headers: bool) -> tuple[Any, ...]:
    """One record as a row of the source's columns, value by value: what :func:`record_batch` makes of
    a whole chunk at once (and what the tests compare it with)."""
    ts_type, ts_ms = message.timestamp()
    row: tuple[Any, ...] = (
        message.key(),
        message.value(),
        message.topic(),
        message.partition(),
        message.offset(),
        _EPOCH + timedelta(milliseconds=ts_ms),
        _TIMESTAMP_TYPE.get(ts_type, -1),
    )
    if include_headers:
        headers = message.headers()
        row += ([(str(k), v) for k, v in cast(list[tuple[str, bytes]], headers)] if headers else None,)
    return row


class DataLossError(RuntimeError):
    """Offsets the query needs are gone (``failOnDataLoss=true``)."""


def _available(consumer: Consumer, num_messages: int, timeout: float) -> list[Message]:
    """Up to ``num_messages`` messages that are there now, waiting up to ``timeout`` s only for the first.

    (``Consumer.consume`` waits its whole timeout unless ``num_messages`` arrive.)
    """
    messages: list[Message] = consumer.consume(num_messages=num_messages, timeout=0)
    if messages:
        return messages
    first = consumer.poll(timeout)
    return [] if first is None else [first]


def read_chunks(options: KafkaSourceOptions, split: KafkaInputPartition) -> Iterator[list[Message]]:
    """Every record of ``split`` with ``start <= offset < end``, in offset order, in chunks as consumed.

    Missing offsets (compaction, transaction markers) are skipped: the read stops at the
    first record at or past ``end``, or when the partition's end is at or past ``end``.
    A start offset below the log start is data loss: an error, or with
    ``failOnDataLoss=false`` a jump to the log start.
    """
    if split.end <= split.start:
        return
    consumer = Consumer(options.consumer_config())
    where = f"{split.topic}[{split.partition}]"
    timeout = options.poll_timeout_ms / 1000
    try:
        consumer.assign([TopicPartition(split.topic, split.partition, split.start)])
        next_offset = split.start
        last_progress = time.monotonic()
        done = False
        while not done:
            batch = _available(consumer, 10_000, 0.1)
            if not batch and time.monotonic() - last_progress > timeout:
                raise TimeoutError(
                    f"{where}: no record at or after offset {next_offset} (reading up to {split.end}) "
                    f"within kafkaConsumer.pollTimeoutMs={options.poll_timeout_ms}"
                )
            chunk: list[Message] = []
            for message in batch:
                error = message.error()
                if error is not None:
                    code = error.code()
                    if code == KafkaError._PARTITION_EOF:
                        if cast(int, message.offset()) >= split.end:
                            done = True
                            break
                        continue  # the end is not readable yet (e.g. an open transaction)
                    if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        next_offset = _after_data_loss(consumer, options, split, next_offset, str(error))
                        done = next_offset >= split.end
                        last_progress = time.monotonic()
                        break
                    if error.fatal():
                        raise KafkaException(error)
                    log.warning("reading %s: %s", where, error)
                    continue
                offset = cast(int, message.offset())
                if offset >= split.end:
                    done = True
                    break
                if offset < next_offset:
                    continue
                next_offset = offset + 1
                last_progress = time.monotonic()
                chunk.append(message)
                if next_offset >= split.end:
                    done = True
                    break
            if chunk:
                yield chunk
    finally:
        consumer.close()


def record_batch(messages: list[Message], schema: pa.Schema, include_headers: bool) -> pa.RecordBatch:
    """``messages`` as one Arrow record batch of the source's columns (``schema``, the Arrow form of
    :func:`kafka_schema`; a ``cutline_barrier`` column, if the schema has one, is all null).

    Why the reader yields Arrow batches and not tuples: PySpark turns each tuple a Python data
    source yields into Arrow value by value, through a Python converter per column
    (``plan_data_source_read.records_to_arrow_batches``); for these small records that was most
    of the source's cost, and one more column (``cutline_barrier``) cost one more call per row.
    """
    n = len(messages)
    stamps = [m.timestamp() for m in messages]
    arrays: list[pa.Array] = [
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.array([m.topic() for m in messages], pa.string()),
        pa.array([m.partition() for m in messages], pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64()),
        pa.array([ms * 1000 for _, ms in stamps], pa.int64()).cast(schema.field("timestamp").type),
        pa.array([_TIMESTAMP_TYPE.get(t, -1) for t, _ in stamps], pa.int32()),
    ]
    if include_headers:
        arrays.append(
            pa.array(
                [_headers(m) for m in messages],
                schema.field("headers").type,
            )
        )
    while len(arrays) < len(schema):  # cutline_barrier, cutline_marker
        arrays.append(pa.nulls(n, pa.string()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _headers(message: Message) -> list[dict[str, Any]] | None:
    headers = cast(list[tuple[str, bytes]] | None, message.headers())
    return [{"key": str(k), "value": v} for k, v in headers] if headers else None


def barrier_batch(split: KafkaInputPartition, schema: pa.Schema, include_headers: bool) -> pa.RecordBatch:
    """The one-row batch of ``split``'s barrier: at the batch's start offset, ``cutline_barrier`` set."""
    barrier = split.barrier
    if barrier is None:
        raise ValueError(f"{split.topic}[{split.partition}] has no barrier")
    stamp_us = int(parse_barrier_json(barrier).get("timestamp_ms", 0)) * 1000
    return _control_batch(split, schema, include_headers, stamp_us, barrier, None)


def marker_batch(split: KafkaInputPartition, schema: pa.Schema, include_headers: bool) -> pa.RecordBatch:
    """The one-row batch of ``split``'s latency marker: at the batch's start offset, ``cutline_marker``
    set, stamped with the marker's time."""
    if split.marker is None:
        raise ValueError(f"{split.topic}[{split.partition}] has no latency marker")
    stamp_us = LatencyMarker.from_json(split.marker).marked_time_ms * 1000
    return _control_batch(split, schema, include_headers, stamp_us, None, split.marker)


def _control_batch(
    split: KafkaInputPartition,
    schema: pa.Schema,
    include_headers: bool,
    stamp_us: int,
    barrier: str | None,
    marker: str | None,
) -> pa.RecordBatch:
    """One row that is no record (null key and value, seq -1) at the split's start offset: a barrier
    or a latency marker. The ``cutline_marker`` column exists only when the source emits markers."""
    arrays: list[pa.Array] = [
        pa.nulls(1, pa.binary()),
        pa.nulls(1, pa.binary()),
        pa.array([split.topic], pa.string()),
        pa.array([split.partition], pa.int32()),
        pa.array([split.start], pa.int64()),
        pa.array([stamp_us], pa.int64()).cast(schema.field("timestamp").type),
        pa.array([-1], pa.int32()),
    ]
    if include_headers:
        arrays.append(pa.nulls(1, schema.field("headers").type))
    arrays.append(pa.array([barrier], pa.string()))
    if len(arrays) < len(schema):
        arrays.append(pa.array([marker], pa.string()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _after_data_loss(
    consumer: Consumer, options: KafkaSourceOptions, split: KafkaInputPartition, offset: int, error: str
) -> int:
    """Handle a start offset that the broker no longer has; return where reading goes on."""
    low, _ = watermark_offsets(consumer, TopicPartition(split.topic, split.partition))
    message = (
        f"{split.topic}[{split.partition}]: offset {offset} is not available any more "
        f"(log starts at {low}): records {offset}..{min(low, split.end) - 1} were lost ({error})"
    )
    if options.fail_on_data_loss:
        raise DataLossError(message + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)
    resume = max(int(low), offset)
    if resume < split.end:
        consumer.assign([TopicPartition(split.topic, split.partition, resume)])
    return resume
