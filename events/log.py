"""Read a whole topic from the beginning to its current end, as plain messages with positions.

Built on :func:`events.kafka.read_to_end` (one partition, ended by the high
watermark a fetch reports, because the embedded broker's ListOffsets(latest)
is wrong: DESIGN §6), one partition after another.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import Consumer, KafkaException

from events.kafka import consumer_config, partition_count
from events.kafka import read_to_end as read_partition_to_end


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
    """The partition numbers of ``topic``; ``KafkaException`` saying what to do if it is missing."""
    try:
        return list(range(partition_count(consumer, topic, timeout)))
    except LookupError as exc:
        raise KafkaException(f"{exc} (`cutline topics create` creates cutline's topics)") from exc


def read_to_end(
    bootstrap: str, topic: str, partitions: Iterable[int] | None = None, *, timeout: float = 60.0
) -> Iterator[LogMessage]:
    """Every message of ``topic`` (or of ``partitions``) up to its end as of now, partition by
    partition, in offset order within each."""
    consumer = Consumer(consumer_config(bootstrap))
    try:
        chosen = sorted(partitions) if partitions is not None else partitions_of(consumer, topic)
        for partition in chosen:
            for message in read_partition_to_end(consumer, topic, partition, timeout=timeout):
                yield LogMessage(
                    topic=topic,
                    partition=partition,
                    offset=cast(int, message.offset()),
                    timestamp_ms=message.timestamp()[1],
                    key=message.key(),
                    value=message.value(),
                    headers=_headers(message.headers()),
                )
    finally:
        consumer.close()


def _headers(raw: Any) -> dict[str, bytes]:
    items = raw.items() if isinstance(raw, dict) else raw or []
    return {str(k): v for k, v in items if isinstance(v, bytes)}
