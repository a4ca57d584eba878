"""The options of the ``cutline-kafka`` source: their names, defaults and checks (the list is in
:mod:`spark_tasks.kafka_source`), and the consumer configuration they make."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from events.kafka.client_config import client_properties
from events.wire.wire_settings import WireSettings
from spark_tasks.kafka_source.offsets import BARRIER_KEY, EARLIEST, MARKER_KEY, from_offsets

__all__ = [
    "BACKGROUND_FETCH_WAIT_MAX_MS",
    "DEFAULT_FETCH_WAIT_MAX_MS",
    "DEFAULT_POLL_TIMEOUT_MS",
    "DEFAULT_TOPIC_PREFIX",
    "FORMAT",
    "SOURCE_ID",
    "KafkaSourceOptions",
]

log = logging.getLogger(__name__)

FORMAT = "cutline-kafka"
"""The name to pass to ``spark.readStream.format(...)`` after ``spark.dataSource.register``."""
SOURCE_ID = FORMAT
"""The ``source_id`` of the latency markers this source emits (a job has one source)."""
DEFAULT_TOPIC_PREFIX = "cutline."

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
