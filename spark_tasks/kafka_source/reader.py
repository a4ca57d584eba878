"""A Kafka source for Spark Structured Streaming on PySpark's Python Data Source API.

The official Spark Kafka connector (``spark-sql-kafka-0-10``) cannot be installed
here (docs/design.md, "Tasks and Spark"), so this source reads Kafka with confluent-kafka from Python. It
speaks the built-in source's language, so a job can switch between the two by
changing one word::

    spark.dataSource.register(KafkaSource)
    df = (
        spark.readStream.format("cutline-kafka")  # or "kafka" where the jar is on the classpath
        .option("kafka.bootstrap.servers", "127.0.0.1:9092")
        .option("subscribe", "words")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 10_000)
        .load()
    )

**Options** (names as in Spark's Kafka source; keys are case-insensitive):

- ``kafka.bootstrap.servers`` (required) and any other ``kafka.*`` option: passed,
  without the prefix, to librdkafka (so librdkafka's property names, e.g.
  ``kafka.fetch.wait.max.ms``, ``kafka.security.protocol``, ``kafka.isolation.level``).
  Java-client-only settings that Spark also rejects (``auto.offset.reset``,
  ``enable.auto.commit``, ``key.deserializer``, ``value.deserializer``,
  ``interceptor.classes``) raise an error.
- ``subscribe`` (required): comma-separated topic names. ``subscribePattern`` and
  ``assign`` are not supported.
- ``startingOffsets``: ``latest`` (default, as in Spark), ``earliest``, or JSON such as
  ``{"topic":{"0":23,"1":-2}}`` naming every partition of every subscribed topic
  (-2 = earliest, -1 = latest). Only used when a query starts without a checkpoint.
- ``maxOffsetsPerTrigger``: cap on the offsets of one micro-batch, split across
  partitions in proportion to their backlog exactly as Spark does (a partition with
  a backlog gets at least one offset, so a batch can exceed the cap when more
  partitions than the cap hold data). ``Trigger.AvailableNow`` honours it too.
- ``failOnDataLoss`` (default true): fail when a start offset has been deleted by
  retention (otherwise skip to the earliest available offset) or a partition's end
  went backwards.
- ``includeHeaders`` (default false): add the ``headers`` column.
- ``kafkaConsumer.pollTimeoutMs`` (default 120000): how long a task waits without
  progress before it fails.
- ``cutline.job`` (default unset): take part in barrier alignment (docs/design.md, "Tasks and Spark") for this
  job id: barriers of the job, read from its partition of ``<cutline.topicPrefix>barriers``
  (prefix default ``cutline.``) on ``cutline.bootstrap`` (default
  ``kafka.bootstrap.servers``; ``cutline.attempt``, default 0, ignores barriers of
  older attempts), are folded into a batch's end offset under
  ``__cutline_barrier__`` and emitted in-band as one row per Kafka partition before
  its records of the batch (at the batch's start offset: the checkpoint's cut), in
  the extra nullable string column ``cutline_barrier`` (docs/spark.md, "Barrier
  alignment"). ``cutline.barrierFetchWaitMs`` (default 500, Kafka's default
  ``fetch.max.wait.ms``) is the driver's barrier consumer's fetch wait: lower it for
  barriers sooner on a broker that, like the embedded one, answers a waiting fetch
  only after about half of it.
- ``cutline.latencyIntervalMs`` (default 0: off, as Flink's ``latencyTrackingInterval``; needs
  ``cutline.job``): emit a latency marker at most this often. A due marker is folded into the
  next batch that runs anyway (it never makes a batch of its own) under ``__cutline_marker__``,
  and emitted as one row per Kafka partition of the batch, after the barrier row and before the
  records, in the extra nullable string column ``cutline_marker`` (docs/spark.md, "Latency
  markers").

**Columns** (as the built-in source): ``key`` binary, ``value`` binary, ``topic``
string, ``partition`` int, ``offset`` long, ``timestamp`` timestamp,
``timestampType`` int (0 CreateTime, 1 LogAppendTime, -1 none: the Java client's
ids, not librdkafka's), and with ``includeHeaders`` ``headers``
``array<struct<key: string, value: binary>>`` (null when a record has none).

**Offsets** are ``{"topic": {"partition": next_offset}}``, the same JSON as the
built-in source writes to ``offsets/N``: string keys only (Spark hands offsets back
through ``json.loads``, so an int key would come back as a string) and a fixed
order, topics sorted, partitions in numeric order, because Spark compares offsets
by their JSON text. :func:`to_offsets` and :func:`from_offsets` convert.

**Where each part runs.** ``initialOffset``/``latestOffset``/``partitions``/``commit``
run in one long-lived Python worker on the driver; the reader keeps one
:class:`OffsetProbe` consumer there. ``read`` runs in Python workers on executors and
creates its own consumer per call (the reader object is pickled to them, so the
probe is not part of its pickled state).

**The end of a partition** is never taken from ListOffsets "latest", which the
embedded broker answers with the base offset of the last batch + 1
(docs/embedded-broker.md). :func:`end_offsets` starts a fetch at that value and
takes the end from the partition-EOF event, i.e. the high watermark of a fetch
response, which is right on both Tansu and Apache Kafka.

**Differences from the built-in source**, all documented in docs/spark.md: no
``assign``/``subscribePattern``/``startingTimestamp``/``endingOffsets``/
``minOffsetsPerTrigger``, no batch (``spark.read``) reader, no consumer cache or
``kafkaConsumer.*`` options besides the poll timeout, rows go through Python (slower),
gaps inside a range (compaction, transaction markers) are skipped silently, and
``maxOffsetsPerTrigger`` needs Spark >= 4.2 for the ReadLimit API (on 4.0/4.1 the
cap is applied from the last offsets this reader saw).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
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

from events.kafka.client_config import client_properties
from events.kafka.clients import find_ends, watermark_offsets
from events.kafka.feed import JobFeed
from events.task.latency import LatencyMarker, MarkerSchedule
from events.wire.codec import WireSettings, codec_for
from events.wire.records import CheckpointBarrier, CheckpointKind
from spark_tasks.workers import freeze_worker_heap

try:  # Spark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    ReadLimit = object  # type: ignore[misc,assignment]

    class ReadAllAvailable:  # type: ignore[no-redef]
        """Stand-in so the reader imports on Spark 4.0/4.1."""

    @dataclass
    class ReadMaxRows:  # type: ignore[no-redef]
        """Stand-in so the reader imports on Spark 4.0/4.1."""

        max_rows: int

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in so the reader imports on Spark 4.0/4.1."""


__all__ = [
    "BARRIER_COLUMN",
    "BARRIER_KEY",
    "FORMAT",
    "BarrierFeed",
    "EARLIEST",
    "LATEST",
    "MARKER_COLUMN",
    "MARKER_KEY",
    "SOURCE_ID",
    "KafkaInputPartition",
    "KafkaSource",
    "KafkaSourceOptions",
    "KafkaStreamReader",
    "OffsetProbe",
    "TopicPartitionKey",
    "end_offsets",
    "from_offsets",
    "barrier_json",
    "barrier_of",
    "kafka_schema",
    "marker_of",
    "rate_limit",
    "read_chunks",
    "to_offsets",
]

log = logging.getLogger(__name__)

FORMAT = "cutline-kafka"
"""The name to pass to ``spark.readStream.format(...)`` after ``spark.dataSource.register``."""

EARLIEST = -2
"""``startingOffsets`` JSON value for "the earliest offset" (as in Spark)."""
LATEST = -1
"""``startingOffsets`` JSON value for "the end of the partition" (as in Spark)."""

DEFAULT_FETCH_WAIT_MAX_MS = 10
"""The embedded broker answers a parked fetch after about half of ``fetch.wait.max.ms``."""
DEFAULT_POLL_TIMEOUT_MS = 120_000
"""Spark's default ``kafkaConsumer.pollTimeoutMs`` (``spark.network.timeout``)."""
BACKGROUND_FETCH_WAIT_MAX_MS = 500
"""Fetch wait of the consumers that only watch (barriers on the driver, the journal): Kafka's own
default. A barrier then reaches the driver up to half of it later on the embedded broker (at once
on Kafka, which answers a waiting fetch when data arrives); a shorter wait keeps the broker busy
answering the two watchers all the time (docs/benchmarks.md)."""

# Kafka settings Spark's source rejects because the source manages them itself.
_FORBIDDEN_KAFKA_OPTIONS = {
    "auto.offset.reset": "use startingOffsets",
    "enable.auto.commit": "the source never commits to Kafka",
    "key.deserializer": "keys are always binary",
    "value.deserializer": "values are always binary",
    "interceptor.classes": "not supported",
}
_UNSUPPORTED_OPTIONS = (
    "assign",
    "subscribepattern",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy",
    "endingoffsets",
    "endingtimestamp",
    "endingoffsetsbytimestamp",
    "minoffsetspertrigger",
    "maxtriggerdelay",
    "maxrecordsperpartition",
    "minpartitions",
)

# librdkafka's timestamp types (0 none, 1 create, 2 log append) -> the Java client's ids.
_TIMESTAMP_TYPE = {0: -1, 1: 0, 2: 1}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

BARRIER_KEY = "__cutline_barrier__"
"""Top-level key of an end offset that carries a folded checkpoint barrier
(docs/design.md, "Tasks and Spark")."""
BARRIER_COLUMN = "cutline_barrier"
"""The extra column with ``cutline.job``: the barrier's JSON on barrier rows, null otherwise."""
MARKER_KEY = "__cutline_marker__"
"""Top-level key of an end offset that carries a latency marker: ``{"marked_ms": ...}``."""
MARKER_COLUMN = "cutline_marker"
"""The extra column with ``cutline.latencyIntervalMs``: the marker's JSON
(:meth:`events.task.latency.LatencyMarker.to_json`) on marker rows, null otherwise."""
SOURCE_ID = FORMAT
"""The ``source_id`` of the markers this source emits (a job has one source)."""
DEFAULT_TOPIC_PREFIX = "cutline."

TopicPartitionKey = tuple[str, int]
"""``(topic, partition)``: the key of every offset map in this module."""


# --------------------------------------------------------------------------- offsets


def _sort_key(tp: TopicPartitionKey) -> tuple[str, int]:
    return tp[0], tp[1]


def to_offsets(
    mapping: Mapping[TopicPartitionKey, int],
    barrier: Mapping[str, Any] | None = None,
    marker_ms: int | None = None,
) -> dict[str, dict[str, Any]]:
    """``{(topic, partition): offset}`` as Spark offset JSON: ``{"topic": {"0": offset}}``.

    Keys are strings; topics are sorted and partitions are in numeric order, so equal
    maps always give equal JSON (Spark compares offsets by their JSON text). A folded
    ``barrier`` goes first, under :data:`BARRIER_KEY`, with its keys sorted; then a folded
    latency marker's time, under :data:`MARKER_KEY`.
    """
    out: dict[str, dict[str, Any]] = {}
    if barrier is not None:
        out[BARRIER_KEY] = {k: barrier[k] for k in sorted(barrier)}
    if marker_ms is not None:
        out[MARKER_KEY] = {"marked_ms": marker_ms}
    for topic, partition in sorted(mapping, key=_sort_key):
        offset = mapping[(topic, partition)]
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise TypeError(f"offset of {topic}[{partition}] must be an int, got {offset!r}")
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise TypeError(f"partition of {topic} must be a non-negative int, got {partition!r}")
        out.setdefault(str(topic), {})[str(partition)] = offset
    return out


def from_offsets(offsets: Mapping[str, Any] | str) -> dict[TopicPartitionKey, int]:
    """Spark offset JSON (a dict as Spark passes it, or its text) as ``{(topic, partition): offset}``.

    Raises ``ValueError`` for anything but ``{"topic": {"<digits>": int}}``.
    """
    parsed: Any = json.loads(offsets) if isinstance(offsets, str) else offsets
    if not isinstance(parsed, Mapping):
        raise ValueError(f"offsets must be a JSON object of topics, got {parsed!r}")
    out: dict[TopicPartitionKey, int] = {}
    for topic, partitions in parsed.items():
        if topic in (BARRIER_KEY, MARKER_KEY):
            continue
        if not isinstance(topic, str) or not isinstance(partitions, Mapping):
            raise ValueError(f"offsets of topic {topic!r} must be an object, got {partitions!r}")
        for key, offset in partitions.items():
            if not isinstance(key, str) or not key.isdecimal():
                raise ValueError(f"partition key of {topic!r} must be a decimal string, got {key!r}")
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise ValueError(f"offset of {topic}[{key}] must be an int, got {offset!r}")
            out[(topic, int(key))] = offset
    return out


def barrier_of(offsets: Mapping[str, Any] | str | None) -> dict[str, Any] | None:
    """The barrier folded into Spark offset JSON, or None."""
    if offsets is None:
        return None
    parsed: Any = json.loads(offsets) if isinstance(offsets, str) else offsets
    barrier = parsed.get(BARRIER_KEY) if isinstance(parsed, Mapping) else None
    if barrier is None:
        return None
    if not isinstance(barrier, Mapping):
        raise ValueError(f"{BARRIER_KEY} must be an object, got {barrier!r}")
    return {k: barrier[k] for k in sorted(barrier)}


def marker_of(offsets: Mapping[str, Any] | str | None) -> int | None:
    """The time of the latency marker folded into Spark offset JSON, or None."""
    if offsets is None:
        return None
    parsed: Any = json.loads(offsets) if isinstance(offsets, str) else offsets
    marker = parsed.get(MARKER_KEY) if isinstance(parsed, Mapping) else None
    marked = marker.get("marked_ms") if isinstance(marker, Mapping) else None
    return marked if isinstance(marked, int) and not isinstance(marked, bool) else None


def barrier_json(barrier: Mapping[str, Any]) -> str:
    """The ``cutline_barrier`` column's text: the barrier entry as compact JSON, keys sorted."""
    return json.dumps(dict(barrier), sort_keys=True, separators=(",", ":"))


def _barrier_entry(barrier: CheckpointBarrier, epoch: int = 0) -> dict[str, Any]:
    """A barrier as the batch's end offset holds it; ``epoch`` is the coordinator epoch that sent it
    (the tasks name it on their acks, docs/design.md, "Ownership and fencing")."""
    entry = {
        "attempt": barrier.attempt,
        "epoch": epoch,
        "id": barrier.checkpoint_id,
        "kind": str(getattr(barrier.kind, "value", barrier.kind)),
        "location": barrier.location,
        "timestamp_ms": barrier.timestamp_ms,
    }
    if barrier.stop:  # only then, so that every other barrier's offset JSON stays as it was
        entry.update(stop=True, drain=barrier.drain)
    return entry


def entry_barrier(job_id: str, entry: Mapping[str, Any]) -> CheckpointBarrier:
    """The barrier of job ``job_id`` that a barrier entry (``cutline_barrier``'s JSON) holds: the
    inverse of :func:`_barrier_entry` (its epoch stays in ``entry["epoch"]``)."""
    return CheckpointBarrier(
        job_id=job_id,
        checkpoint_id=int(entry["id"]),
        attempt=int(entry["attempt"]),
        kind=CheckpointKind(entry.get("kind", CheckpointKind.CHECKPOINT.value)),
        timestamp_ms=int(entry.get("timestamp_ms", 0)),
        location=str(entry["location"]),
    )


def _entry_key(entry: Mapping[str, Any]) -> tuple[int, int, int]:
    """A barrier's identity in the feed: a newer coordinator epoch may send an id again."""
    return int(entry["id"]), int(entry["attempt"]), int(entry.get("epoch", 0))


def rate_limit(
    limit: int,
    start: Mapping[TopicPartitionKey, int],
    end: Mapping[TopicPartitionKey, int],
) -> dict[TopicPartitionKey, int]:
    """``end`` capped so that about ``limit`` offsets are read in all, as Spark's Kafka source does.

    Each partition gets ``limit * backlog / total_backlog`` offsets, rounded down, but
    at least 1 when it has a backlog ("don't completely starve small partitions"), and
    never past its ``end``. Partitions missing from ``start`` are taken to start at 0,
    so the caller passes their earliest offsets in ``start``.
    """
    if limit <= 0:
        raise ValueError(f"maxOffsetsPerTrigger must be positive, got {limit}")
    sizes = {tp: e - start.get(tp, 0) for tp, e in end.items() if e - start.get(tp, 0) > 0}
    total = sum(sizes.values())
    if total < 1:
        return dict(end)
    capped: dict[TopicPartitionKey, int] = {}
    for tp, e in end.items():
        size = sizes.get(tp)
        if size is None:
            capped[tp] = e
            continue
        prorate = limit * (size / total)
        step = int(-(-prorate // 1)) if prorate < 1 else int(prorate)
        capped[tp] = min(e, start.get(tp, 0) + step)
    return capped


# --------------------------------------------------------------------------- options


def _as_bool(name: str, value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ValueError(f"option {name} must be true or false, got {value!r}")


def _as_positive_int(name: str, value: Any) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"option {name} must be a positive integer, got {value!r}") from None
    if number <= 0:
        raise ValueError(f"option {name} must be a positive integer, got {value!r}")
    return number


@dataclass(frozen=True)
class KafkaSourceOptions:
    """The parsed options of one :class:`KafkaSource`."""

    bootstrap: str
    topics: tuple[str, ...]
    starting_offsets: str = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    kafka: Mapping[str, str] = field(default_factory=dict)
    job: str | None = None
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    cutline_bootstrap: str | None = None
    attempt: int = 0
    """``cutline.attempt``: barriers of older attempts of the job are ignored."""
    barrier_fetch_wait_ms: int = BACKGROUND_FETCH_WAIT_MAX_MS
    """``cutline.barrierFetchWaitMs``: ``fetch.wait.max.ms`` of the driver's barrier consumer."""
    wire: WireSettings = WireSettings()
    """``cutline.wireFormat`` and ``cutline.schemaRegistryUrl``: how barriers are framed."""
    latency_interval_ms: int = 0
    """``cutline.latencyIntervalMs``: emit a latency marker at most this often; 0: never."""
    pause_file: str | None = None
    """``cutline.pauseFile``: while this file exists (on the driver's machine), plan no new batch:
    the job's driver creates it to stop between batches, not in the middle of one."""

    @property
    def markers(self) -> bool:
        """Does the source emit latency markers (and the ``cutline_marker`` column)?"""
        return self.job is not None and self.latency_interval_ms > 0

    @property
    def barriers_topic(self) -> str:
        return f"{self.topic_prefix}barriers"

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> KafkaSourceOptions:
        """Validate Spark-style options (case-insensitive keys) and return them parsed."""
        opts = {str(k).lower(): v for k, v in options.items()}
        for name in _UNSUPPORTED_OPTIONS:
            if name in opts:
                raise ValueError(f"option {name!r} of Spark's Kafka source is not supported by {FORMAT}")
        kafka = {k[len("kafka.") :]: str(v) for k, v in opts.items() if k.startswith("kafka.")}
        for name, why in _FORBIDDEN_KAFKA_OPTIONS.items():
            if name in kafka:
                raise ValueError(f"Kafka option 'kafka.{name}' is not supported: {why}")
        bootstrap = kafka.get("bootstrap.servers", "").strip()
        if not bootstrap:
            raise ValueError("option 'kafka.bootstrap.servers' is required")
        topics = tuple(
            dict.fromkeys(t.strip() for t in str(opts.get("subscribe", "")).split(",") if t.strip())
        )
        if not topics:
            raise ValueError("option 'subscribe' (comma-separated topics) is required")
        for reserved in (BARRIER_KEY, MARKER_KEY):
            if reserved in topics:
                raise ValueError(f"topic name {reserved!r} is reserved by {FORMAT}")
        job = str(opts.get("cutline.job", "")).strip() or None
        latency_interval = str(opts.get("cutline.latencyintervalms", "0")).strip()
        if latency_interval != "0":
            _as_positive_int("cutline.latencyIntervalMs", latency_interval)
            if job is None:
                raise ValueError("option 'cutline.latencyIntervalMs' needs 'cutline.job'")
        starting = str(opts.get("startingoffsets", "latest")).strip()
        if starting.lower() in ("earliest", "latest"):
            starting = starting.lower()
        else:
            try:
                requested = from_offsets(starting)
            except ValueError as exc:
                raise ValueError(
                    f"startingOffsets must be earliest, latest or JSON like "
                    f'{{"topic":{{"0":23,"1":-2}}}}, got {starting!r}: {exc}'
                ) from None
            extra = sorted({t for t, _ in requested} - set(topics))
            if extra:
                raise ValueError(f"startingOffsets names topics that are not subscribed: {extra}")
            bad = {f"{t}[{p}]": o for (t, p), o in requested.items() if o < EARLIEST}
            if bad:
                raise ValueError(f"startingOffsets must be >= 0, -1 (latest) or -2 (earliest): {bad}")
        max_offsets = opts.get("maxoffsetspertrigger")
        return cls(
            bootstrap=bootstrap,
            topics=topics,
            starting_offsets=starting,
            max_offsets_per_trigger=(
                None if max_offsets is None else _as_positive_int("maxOffsetsPerTrigger", max_offsets)
            ),
            fail_on_data_loss=_as_bool("failOnDataLoss", opts.get("failondataloss", "true")),
            include_headers=_as_bool("includeHeaders", opts.get("includeheaders", "false")),
            poll_timeout_ms=_as_positive_int(
                "kafkaConsumer.pollTimeoutMs",
                opts.get("kafkaconsumer.polltimeoutms", DEFAULT_POLL_TIMEOUT_MS),
            ),
            kafka=kafka,
            job=job,
            topic_prefix=str(opts.get("cutline.topicprefix", DEFAULT_TOPIC_PREFIX)),
            cutline_bootstrap=str(opts.get("cutline.bootstrap", "")).strip() or None,
            attempt=_as_positive_int("cutline.attempt", opts["cutline.attempt"])
            if "cutline.attempt" in opts
            else 0,
            barrier_fetch_wait_ms=_as_positive_int(
                "cutline.barrierFetchWaitMs",
                opts.get("cutline.barrierfetchwaitms", BACKGROUND_FETCH_WAIT_MAX_MS),
            ),
            wire=WireSettings(
                str(opts.get("cutline.schemaregistryurl", "")).strip() or None,
                str(opts.get("cutline.wireformat", "single-object")).strip(),
            ),
            latency_interval_ms=int(latency_interval),
            pause_file=str(opts.get("cutline.pausefile", "")).strip() or None,
        )

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka config of a consumer of this source: the user's ``kafka.*`` options, then ours.

        It never commits, never joins a group (only ``assign()``), reports the end of a
        partition, and fails instead of jumping when an offset is out of range.
        """
        config: dict[str, Any] = {
            "group.id": f"cutline-kafka-source-{uuid.uuid4().hex}",
            "fetch.wait.max.ms": DEFAULT_FETCH_WAIT_MAX_MS,
            "logger": log,
            **client_properties(),  # CUTLINE_KAFKA_*: inherited by local Spark's Python workers
            **self.kafka,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        }
        config.update(overrides)
        return config


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


# --------------------------------------------------------------------------- end offsets


def _available(consumer: Consumer, num_messages: int, timeout: float) -> list[Message]:
    """Up to ``num_messages`` messages that are there now, waiting up to ``timeout`` s only for the first.

    (``Consumer.consume`` waits its whole timeout unless ``num_messages`` arrive.)
    """
    messages: list[Message] = consumer.consume(num_messages=num_messages, timeout=0)
    if messages:
        return messages
    first = consumer.poll(timeout)
    return [] if first is None else [first]


class OffsetProbe:
    """A consumer that finds the partitions of topics and where each partition starts and ends.

    The end comes from a fetch, not from ListOffsets "latest" (wrong on the embedded
    broker): the probe assigns each partition at the ListOffsets answer, which is at or
    before the real end on any broker, reads (and drops) what follows, and takes the
    offset of the partition-EOF event, which is the fetch response's high watermark.
    The consumer is created on first use and unassigned between calls, so an idle probe
    sends no fetches. Not thread-safe.
    """

    def __init__(
        self,
        bootstrap: str,
        config: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self._config = {**(config or {}), "bootstrap.servers": bootstrap}
        self._timeout = timeout
        self._consumer: Consumer | None = None

    @classmethod
    def for_options(cls, options: KafkaSourceOptions, timeout: float = 30.0) -> OffsetProbe:
        return cls(options.bootstrap, options.consumer_config(), timeout)

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            config: dict[str, Any] = {
                "group.id": f"cutline-offset-probe-{uuid.uuid4().hex}",
                "fetch.wait.max.ms": DEFAULT_FETCH_WAIT_MAX_MS,
                "logger": log,
                # CUTLINE_KAFKA_*: a CheckpointedJob's probe is given no config, and a secured
                # cluster's listener refuses a client without its security settings
                **client_properties(),
                **self._config,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                # the tail of one batch is all a probe reads; keep its buffers small
                "queued.max.messages.kbytes": 1024,
            }
            self._consumer = Consumer(config)
        return self._consumer

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def __enter__(self) -> OffsetProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def partitions(self, topics: Iterable[str]) -> list[TopicPartitionKey]:
        """Every partition of ``topics`` that exist now (a missing topic has none yet)."""
        found: list[TopicPartitionKey] = []
        for topic in topics:
            metadata = self.consumer.list_topics(topic, timeout=self._timeout)
            info = metadata.topics.get(topic)
            if info is None or info.error is not None:
                code = info.error.code() if info is not None and info.error is not None else None
                if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, None):
                    log.info("topic %s does not exist (yet)", topic)
                    continue
                raise KafkaException(info.error)
            found.extend((topic, p) for p in info.partitions)
        return sorted(found, key=_sort_key)

    def earliest(self, tps: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """The log start offset of each partition (ListOffsets "earliest", right on every broker; asked
        again while Apache Kafka has not yet led a partition created a moment ago)."""
        out: dict[TopicPartitionKey, int] = {}
        for topic, partition in tps:
            low, _ = watermark_offsets(self.consumer, TopicPartition(topic, partition), timeout=self._timeout)
            out[(topic, partition)] = low
        return out

    def latest(self, tps: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """The end offset (high watermark) of each partition, read from a fetch response."""
        wanted = sorted(set(tps), key=_sort_key)
        if not wanted:
            return {}
        return find_ends(self.consumer, wanted, self._timeout)


def end_offsets(
    bootstrap: str,
    topic_partitions: Iterable[TopicPartitionKey],
    *,
    config: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
) -> dict[TopicPartitionKey, int]:
    """The real end offset of each ``(topic, partition)``, with a short-lived consumer.

    Unlike ``get_watermark_offsets(cached=False)`` (ListOffsets "latest"), this is right
    on the embedded broker too; see :class:`OffsetProbe`.
    """
    with OffsetProbe(bootstrap, config, timeout) as probe:
        return probe.latest(topic_partitions)


# --------------------------------------------------------------------------- barriers


class BarrierFeed:
    """The checkpoint barriers of one job, read on the driver from its partition of the barriers topic.

    A :class:`events.kafka.feed.JobFeed` from the partition's current end (the high watermark of a
    fetch, not ListOffsets "latest", short on the embedded broker): everything below that
    end is ignored, so after a restart barriers already folded into checkpointed offsets
    are not seen again (and barriers sent while the query was down are missed).
    Barriers of other jobs, undecodable records and re-sent barriers are dropped.
    Not thread-safe.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        job_id: str,
        config: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
        *,
        min_attempt: int = 0,
        fetch_wait_ms: int = BACKGROUND_FETCH_WAIT_MAX_MS,
        wire: WireSettings | None = None,
    ) -> None:
        self.topic = topic
        self.job_id = job_id
        self.min_attempt = min_attempt
        self._pending: list[dict[str, Any]] = []
        self._seen: set[tuple[int, int, int]] = set()
        # From the partition's real end; the fence learns the coordinator epoch from the barriers
        # (docs/design.md, "Ownership and fencing"): a superseded epoch's barriers are a zombie's, and
        # void. The feed's consumer
        # is polled once per trigger, and a fetch every 5-10 ms would cost the driver and the
        # broker CPU all the time (see BACKGROUND_FETCH_WAIT_MAX_MS).
        extra = {k: v for k, v in (config or {}).items() if k != "bootstrap.servers"}
        self._feed = JobFeed(
            bootstrap,
            job_id,
            (topic,),
            config={**extra, "fetch.wait.max.ms": fetch_wait_ms},
            kinds=(CheckpointBarrier.__name__,),
            timeout=timeout,
            codec=codec_for(wire or WireSettings()),
        )
        self.partition = self._feed.partitions[topic]
        self.start = self._feed.starts[(topic, self.partition)]
        log.info("%s: barriers of job %s from %s[%d]@%d", FORMAT, job_id, topic, self.partition, self.start)

    def poll(self) -> None:
        """Queue the barriers of this job that have arrived (never blocks)."""
        for entry in self._feed.poll(0):
            record = entry.record
            if not isinstance(record, CheckpointBarrier):
                continue
            if record.attempt < self.min_attempt:
                # A checkpoint of a crashed attempt, triggered before the coordinator
                # heard of this one: its ack would only be refused (STALE_ATTEMPT).
                log.info("%s ignores barrier %d of attempt %d", FORMAT, record.checkpoint_id, record.attempt)
                continue
            self.offer(_barrier_entry(record, entry.epoch))

    def offer(self, entry: Mapping[str, Any]) -> None:
        """Queue ``entry`` unless a barrier with its id and attempt was queued before."""
        key = _entry_key(entry)
        if key in self._seen:
            log.info("%s ignores re-sent barrier %s of job %s", FORMAT, key, self.job_id)
            return
        self._seen.add(key)
        self._pending.append(dict(entry))

    def mark_folded(self, entry: Mapping[str, Any]) -> None:
        """``entry`` is already in a checkpointed offset: never fold it again."""
        key = _entry_key(entry)
        self._seen.add(key)
        self._pending = [b for b in self._pending if _entry_key(b) != key]

    def peek(self) -> dict[str, Any] | None:
        """The oldest pending barrier, without taking it."""
        return self._pending[0] if self._pending else None

    def take(self) -> dict[str, Any] | None:
        """Take the oldest pending barrier."""
        return self._pending.pop(0) if self._pending else None

    def close(self) -> None:
        self._feed.close()


# --------------------------------------------------------------------------- reading


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


def _row(message: Message, include_headers: bool) -> tuple[Any, ...]:
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
    stamp_us = int(json.loads(barrier)["timestamp_ms"]) * 1000
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


# --------------------------------------------------------------------------- Spark API


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch reader: plans one Spark task per Kafka partition with new records."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._probe: OffsetProbe | None = None
        self._available_now: dict[TopicPartitionKey, int] | None = None
        self._latest: dict[TopicPartitionKey, int] | None = None
        self._initial: dict[TopicPartitionKey, int] | None = None
        self._last_end: dict[TopicPartitionKey, int] | None = None
        self._last_barrier: dict[str, Any] | None = None
        self._stopped = False
        """A stop-with-savepoint barrier was folded: no new offsets until a newer barrier comes (its
        savepoint failed, the scheduler resumed) or the query stops (it completed)."""
        self._last_marker: int | None = None
        self._markers = MarkerSchedule(options.latency_interval_ms if options.markers else 0)
        # With cutline.job: the barriers that arrive from now on
        # (barrier alignment, docs/design.md, "Tasks and Spark").
        # Made at the first initialOffset/latestOffset, which only the query's source runner
        # calls: Spark also builds this reader in a planning worker for the first batch, where
        # a feed (a consumer, and a round trip to find the partition's end) would delay that batch.
        self._barriers: BarrierFeed | None = None

    def _barrier_feed(self) -> BarrierFeed | None:
        """The job's :class:`BarrierFeed` (made on first use), or None without ``cutline.job``."""
        options = self.options
        if self._barriers is None and options.job is not None:
            bootstrap = options.cutline_bootstrap or options.bootstrap
            extra = dict(options.kafka) if options.cutline_bootstrap in (None, options.bootstrap) else {}
            extra.pop("bootstrap.servers", None)
            self._barriers = BarrierFeed(
                bootstrap,
                options.barriers_topic,
                options.job,
                extra,
                min_attempt=options.attempt,
                fetch_wait_ms=options.barrier_fetch_wait_ms,
                wire=options.wire,
            )
        return self._barriers

    # The reader is pickled to the executors (read() runs there); the consumers stay behind.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_probe"] = None
        state["_barriers"] = None
        return state

    @property
    def probe(self) -> OffsetProbe:
        if self._probe is None:
            self._probe = OffsetProbe.for_options(self.options)
        return self._probe

    def _current_end(self) -> dict[TopicPartitionKey, int]:
        probe = self.probe
        return probe.latest(probe.partitions(self.options.topics))

    def initialOffset(self) -> dict[str, dict[str, int]]:
        # Spark 4.3 calls this twice for the first batch (to plan it and again to run it);
        # "latest" must resolve once, or records produced in between would fall in no batch.
        if self._initial is None:
            self._barrier_feed()  # from now on: before the first batch can be planned
            self._initial = self._resolve_starting_offsets()
            self._last_end = dict(self._initial)
            log.info("%s initial offsets (%s): %s", FORMAT, self.options.starting_offsets, self._initial)
        return to_offsets(self._initial)

    def _resolve_starting_offsets(self) -> dict[TopicPartitionKey, int]:
        probe = self.probe
        tps = probe.partitions(self.options.topics)
        starting = self.options.starting_offsets
        if starting == "earliest":
            offsets = probe.earliest(tps)
        elif starting == "latest":
            offsets = probe.latest(tps)
        else:
            requested = from_offsets(starting)
            missing = sorted(set(tps) - set(requested), key=_sort_key)
            unknown = sorted(set(requested) - set(tps), key=_sort_key)
            if missing or unknown:
                raise ValueError(
                    "startingOffsets must name every partition of the subscribed topics "
                    f"(-1 latest, -2 earliest): missing {missing}, not in the topics {unknown}"
                )
            earliest = probe.earliest(tp for tp, o in requested.items() if o == EARLIEST)
            latest = probe.latest(tp for tp, o in requested.items() if o == LATEST)
            offsets = {tp: earliest.get(tp, latest.get(tp, o)) for tp, o in requested.items()}
        return offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._current_end()
        log.info("%s Trigger.AvailableNow reads up to %s", FORMAT, self._available_now)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, dict[str, int]]:
        if start is None:  # Spark 4.0/4.1 call latestOffset() with no start and no limit
            begin = dict(self._last_end or {})
            begin_barrier, begin_marker = self._last_barrier, self._last_marker
            limit = self.getDefaultReadLimit() if begin else ReadAllAvailable()
        else:
            begin = from_offsets(start)
            begin_barrier, begin_marker = barrier_of(start), marker_of(start)
        if begin and self.options.pause_file is not None and os.path.exists(self.options.pause_file):
            # Paused: answer the start itself, so no batch runs; a barrier stays in its feed.
            return to_offsets(begin, begin_barrier, begin_marker)
        feed = self._barrier_feed()
        if feed is not None:
            if begin_barrier is not None:
                feed.mark_folded(begin_barrier)  # e.g. after a restart: folded into batch start
            feed.poll()  # before the ends: records produced before a barrier fall in its batch
        latest = dict(self._available_now) if self._available_now is not None else self._current_end()
        self._latest = dict(latest)
        end = dict(begin)
        new = [tp for tp in latest if tp not in begin]
        known = self.probe.earliest(new) if new else {}
        for tp, offset in latest.items():
            floor = begin.get(tp, known.get(tp, 0))
            if offset < floor:
                message = f"{tp[0]}[{tp[1]}]: end offset {offset} is below the committed offset {floor}"
                if self.options.fail_on_data_loss:
                    raise DataLossError(message + " (the partition lost records); set failOnDataLoss=false")
                log.warning("%s; keeping %d", message, floor)
                offset = floor
            end[tp] = offset
        if isinstance(limit, ReadMaxRows):
            end = {**end, **rate_limit(limit.max_rows, {**known, **begin}, end)}
        elif limit is not None and not isinstance(limit, ReadAllAvailable):
            raise ValueError(f"{FORMAT} supports maxOffsetsPerTrigger (ReadMaxRows) only, got {limit!r}")
        if self._stopped_at_barrier(feed):
            end = dict(begin)  # read nothing after the stop savepoint's cut
        barrier = feed.take() if feed is not None else None
        if barrier is not None and barrier.get("stop"):
            # The barrier batch holds no records: its cut (the batch's start) is the end of the
            # output, and the sink's last file ends exactly at the savepoint's offsets.
            end, self._stopped = dict(begin), True
            log.info("%s stops reading at %s for stop-with-savepoint %s", FORMAT, end, barrier["id"])
        marker = None
        if barrier is None and end == begin:
            # Nothing new: answer the start itself (with its barrier and marker, if it has them),
            # so no batch runs. A barrier is folded into exactly one batch's end offset.
            barrier, marker = begin_barrier, begin_marker
        else:
            if barrier is not None:
                log.info("%s folds barrier %s into the batch ending at %s", FORMAT, barrier, end)
            marker = self._due_marker()
        self._last_end = end
        self._last_barrier, self._last_marker = barrier, marker
        return to_offsets(end, barrier, marker)

    def _due_marker(self) -> int | None:
        """The time of a latency marker for the batch being planned, if one is due (else None)."""
        now = time.time_ns() // 1_000_000
        if not self._markers.due(now):
            return None
        self._markers = self._markers.emitted(now)
        return now

    def _stopped_at_barrier(self, feed: BarrierFeed | None) -> bool:
        """Still stopped at a stop-with-savepoint's cut? A newer barrier ends it: the savepoint failed
        and the coordinator's scheduler resumed (docs/spark.md, "Stop with a savepoint")."""
        newer = feed.peek() if self._stopped and feed is not None else None
        if newer is not None and not newer.get("stop"):
            log.info("%s reads on: the stop-with-savepoint failed", FORMAT)
            self._stopped = False
        return self._stopped

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None if self._latest is None else to_offsets(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaInputPartition]:
        """One task per partition with new records; with a barrier in ``end``, one per partition."""
        begin, until = from_offsets(start), from_offsets(end)
        barrier = barrier_of(end) if self.options.job is not None else None
        if barrier is not None and barrier == barrier_of(start):
            barrier = None  # not a new barrier (latestOffset never answers this way; be safe)
        text = None if barrier is None else barrier_json(barrier)
        marked = marker_of(end) if self.options.markers else None
        if marked is not None and marked == marker_of(start):
            marked = None
        new = [tp for tp in until if tp not in begin]
        earliest = self.probe.earliest(new) if new else {}
        splits = []
        for subtask, tp in enumerate(sorted(until, key=_sort_key)):
            first = begin.get(tp, earliest.get(tp, 0))
            if until[tp] > first or text is not None:
                # the source's subtask index of a partition: its place among the job's partitions
                marker = None if marked is None else LatencyMarker(marked, SOURCE_ID, subtask).to_json()
                splits.append(KafkaInputPartition(tp[0], tp[1], first, max(first, until[tp]), text, marker))
        return splits

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's records as Arrow batches (:func:`record_batch`); with ``cutline.job``, the
        batch's barrier row first.

        The barrier goes first, with the partition's *start* offset of the batch: the cut
        of a checkpoint is the start of its barrier's batch, i.e. the end of the batch
        before, whose output Spark has already committed to the sink (micro-batches run
        one after another). A snapshot taken at the barrier therefore never covers a
        record whose output could still be lost, and restoring it replays the batch.
        """
        if not isinstance(partition, KafkaInputPartition):
            raise TypeError(f"{FORMAT} cannot read {partition!r}")
        from pyspark.sql.pandas.types import to_arrow_schema

        freeze_worker_heap()

        include_headers = self.options.include_headers
        options = self.options
        schema = to_arrow_schema(
            kafka_schema(include_headers, barriers=options.job is not None, markers=options.markers),
            timezone="UTC",
        )
        if self.options.job is not None and partition.barrier is not None:
            yield barrier_batch(partition, schema, include_headers)
        if self.options.markers and partition.marker is not None:
            yield marker_batch(partition, schema, include_headers)
        for chunk in read_chunks(self.options, partition):
            yield record_batch(chunk, schema, include_headers)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has finished the batches up to ``end``; like Spark's source, nothing goes to Kafka."""
        log.debug("%s committed %s", FORMAT, end)

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None
        if self._barriers is not None:
            self._barriers.close()
            self._barriers = None


class KafkaSource(DataSource):
    """``spark.readStream.format("cutline-kafka")``: Spark's Kafka source on confluent-kafka."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        options = KafkaSourceOptions.parse(self.options)
        return kafka_schema(
            options.include_headers, barriers=options.job is not None, markers=options.markers
        )

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(KafkaSourceOptions.parse(self.options))
