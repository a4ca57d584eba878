"""Read a topic's partitions from the beginning to their current end.

Hand-written because the embedded broker answers ListOffsets(latest) with the
base offset of the last record batch plus one, not the log end (DESIGN §6), so
``get_watermark_offsets(cached=False)`` cannot tell where a partition ends.
The high watermark that comes with every fetch response is right, so this
reader keeps fetching until its position reaches the watermark of a recent
fetch on every partition.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition


@dataclass(frozen=True, slots=True)
class LogMessage:
    """One message of a topic, with its position and headers."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


def partitions_of(consumer: Consumer, topic: str, timeout: float = 10.0) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=timeout)
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise KafkaException(f"topic {topic!r} does not exist (run `cutline topics create`)")
    return sorted(info.partitions)


def read_to_end(
    bootstrap: str,
    topic: str,
    partitions: Iterable[int] | None = None,
    *,
    timeout: float = 60.0,
    idle: float = 0.2,
) -> Iterator[LogMessage]:
    """Every message of ``topic`` (or of ``partitions``) up to the end as of now, in order per
    partition. Raises ``TimeoutError`` if the end is not reached within ``timeout`` seconds."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"cutline-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        chosen = sorted(partitions) if partitions is not None else partitions_of(consumer, topic)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in chosen])
        position = dict.fromkeys(chosen, 0)
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        last_message = time.monotonic()
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{topic}: the end of partitions {sorted(set(chosen) - at_end)} not reached"
                )
            message = consumer.poll(0.05)
            if message is None:
                if len(at_end) == len(chosen) and time.monotonic() - last_message >= idle:
                    if _confirmed(consumer, topic, position):
                        return
                    at_end.clear()
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(cast(int, message.partition()))
                    continue
                raise KafkaException(error)
            last_message = time.monotonic()
            partition, offset = cast(int, message.partition()), cast(int, message.offset())
            at_end.discard(partition)
            position[partition] = offset + 1
            yield LogMessage(
                topic=topic,
                partition=partition,
                offset=offset,
                timestamp_ms=message.timestamp()[1],
                key=message.key(),
                value=message.value(),
                headers=_headers(message.headers()),
            )
    finally:
        consumer.close()


def _confirmed(consumer: Consumer, topic: str, position: dict[int, int]) -> bool:
    """Every partition's position has reached the high watermark of its latest fetch."""
    for partition, offset in position.items():
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        if high is not None and high > offset:
            return False
    return True


def _headers(raw: Any) -> dict[str, bytes]:
    items = raw.items() if isinstance(raw, dict) else raw or []
    return {str(k): v for k, v in items if isinstance(v, bytes)}
