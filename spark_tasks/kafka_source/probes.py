"""What the ``cutline-kafka`` source asks Kafka on the driver: where partitions start and end
(:class:`OffsetProbe`) and which barriers of its job have arrived (:class:`BarrierFeed`).

Both are consumers of the driver's long-lived Python worker that runs ``latestOffset`` and
``partitions``; the reader keeps them out of its pickled state, so no executor opens one.

**The end of a partition** is never taken from ListOffsets "latest", which the
embedded broker answers with the base offset of the last batch + 1
(docs/embedded-broker.md). :func:`end_offsets` starts a fetch at that value and
takes the end from the fetch responses' high watermark, which is right on both Tansu
and Apache Kafka (:func:`events.kafka.clients.find_ends`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from events.kafka.client_config import client_properties
from events.kafka.clients import earliest_offsets, find_ends, topic_metadata
from events.kafka.feed import JobFeed
from events.kafka.refusals import AccessRefused, explain
from events.wire.barrier_entry import barrier_entry, entry_key
from events.wire.codec import codec_for
from events.wire.records import CheckpointBarrier
from events.wire.wire_settings import WireSettings
from spark_tasks.kafka_source.offsets import TopicPartitionKey, partition_order
from spark_tasks.kafka_source.options import (
    BACKGROUND_FETCH_WAIT_MAX_MS,
    DEFAULT_FETCH_WAIT_MAX_MS,
    FORMAT,
    KafkaSourceOptions,
)

__all__ = ["PROBE_FETCH_QUEUE_BACKOFF_MS", "BarrierFeed", "OffsetProbe", "end_offsets"]

log = logging.getLogger(__name__)

PROBE_FETCH_QUEUE_BACKOFF_MS = 10
"""``fetch.queue.backoff.ms`` of a probe: how long librdkafka waits to fetch again once the probe's
small queue is full (librdkafka's own default is 1,000 ms, which librdkafka's docs say to lower
for low queue thresholds)."""


class OffsetProbe:
    """A consumer that finds the partitions of topics and where each partition starts and ends.

    The end comes from a fetch, not from ListOffsets "latest" (wrong on the embedded
    broker): the probe assigns each partition at the ListOffsets answer, which is at or
    before the real end on any broker, reads (and drops) what follows up to the high
    watermark of its first fetch response (:func:`events.kafka.clients.find_ends`).
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
                # ... and fetch again as soon as the probe has taken them: at librdkafka's default
                # (1 s) a probe that must read on to a watermark through a burst of records waits
                # a second for every 1 MB it reads (a batch's latestOffset took 3-28 s)
                "fetch.queue.backoff.ms": PROBE_FETCH_QUEUE_BACKOFF_MS,
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
            metadata = topic_metadata(self.consumer, topic, self._timeout)
            info = metadata.topics.get(topic)
            if info is None or info.error is not None:
                code = info.error.code() if info is not None and info.error is not None else None
                if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, None):
                    log.info("topic %s does not exist (yet)", topic)
                    continue
                refused = explain(info.error, "Read", topic)  # the ACL it lacks, not "missing"
                raise KafkaException(info.error) if refused is None else AccessRefused(refused)
            found.extend((topic, p) for p in info.partitions)
        return sorted(found, key=partition_order)

    def earliest(self, tps: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """The log start offset of each partition (ListOffsets "earliest", right on every broker, one
        request for all; asked again while Apache Kafka has not yet led a partition created a moment
        ago)."""
        return earliest_offsets(self.consumer, sorted(set(tps), key=partition_order), self._timeout)

    def latest(self, tps: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """The end offset (high watermark) of each partition, read from a fetch response."""
        wanted = sorted(set(tps), key=partition_order)
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
            self.offer(barrier_entry(record, entry.epoch))

    def offer(self, entry: Mapping[str, Any]) -> None:
        """Queue ``entry`` unless a barrier with its id and attempt was queued before."""
        key = entry_key(entry)
        if key in self._seen:
            log.info("%s ignores re-sent barrier %s of job %s", FORMAT, key, self.job_id)
            return
        self._seen.add(key)
        self._pending.append(dict(entry))

    def mark_folded(self, entry: Mapping[str, Any]) -> None:
        """``entry`` is already in a checkpointed offset: never fold it again."""
        key = entry_key(entry)
        self._seen.add(key)
        self._pending = [b for b in self._pending if entry_key(b) != key]

    def peek(self) -> dict[str, Any] | None:
        """The oldest pending barrier, without taking it."""
        return self._pending[0] if self._pending else None

    def take(self) -> dict[str, Any] | None:
        """Take the oldest pending barrier."""
        return self._pending.pop(0) if self._pending else None

    def close(self) -> None:
        self._feed.close()
