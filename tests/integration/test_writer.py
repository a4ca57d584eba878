"""The coordinator's writes through librdkafka, against a real broker."""

from __future__ import annotations

import asyncio

from confluent_kafka import Consumer

from coordinator.service.runtime import Outgoing
from coordinator.service.writer import Writer, Written
from events.dev.broker import create_topics, max_message_bytes
from events.kafka.clients import consumer_config, partition_for, read_partition_to_end
from events.wire.sizes import TopicLimits

PARTITIONS = 4


def _home(key: bytes | None) -> int:
    return partition_for(key, PARTITIONS) if key else -1


def _read(bootstrap: str, topic: str, partition: int) -> list[tuple[bytes | None, bytes | None]]:
    consumer = Consumer(consumer_config(bootstrap))
    try:
        return [(m.key(), m.value()) for m in read_partition_to_end(consumer, topic, partition, 30.0)]
    finally:
        consumer.close()


def test_writes_land_in_order_where_their_job_lives_and_report_the_last_offsets(
    bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}journal"
    create_topics(bootstrap, [topic], partitions=PARTITIONS)
    jobs = [b"job-a", b"job-b", b"job-c"]
    messages = [
        Outgoing(topic, job, b"%s-%d" % (job, n), (("cutline.epoch", b"1"),))
        for n in range(50)
        for job in jobs
    ]
    writer = Writer(bootstrap, idempotent=False, home=_home)

    async def write() -> tuple[Written, Written]:
        first = await writer.write(messages[:75])
        second = await writer.write(messages[75:])
        return first, second

    try:
        first, second = asyncio.run(write())
    finally:
        writer.close()

    assert {} == first.failed == second.failed
    for job in jobs:
        partition = _home(job)
        records = _read(bootstrap, topic, partition)
        written = [value for key, value in records if key == job]
        assert [b"%s-%d" % (job, n) for n in range(50)] == written
        assert len(records) - 1 == second.last_offsets[(topic, partition)]


def test_a_record_the_producer_refuses_fails_the_partition_of_its_job_and_the_rest_still_land(
    bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}journal"
    create_topics(bootstrap, [topic], partitions=PARTITIONS)
    too_large = b"x" * 2_000_000  # above the topic's max.message.bytes (1,048,588 unless told)
    messages = [
        Outgoing(topic, b"job-a", b"first", ()),
        Outgoing(topic, b"job-b", too_large, ()),
        Outgoing(topic, b"job-a", b"second", ()),
    ]
    writer = Writer(bootstrap, idempotent=False, home=_home)

    async def write() -> Written:
        return await writer.write(messages)

    try:
        written = asyncio.run(write())
    finally:
        writer.close()

    assert [(topic, _home(b"job-b"))] == list(written.failed)
    assert "max.message.bytes" in written.failed[(topic, _home(b"job-b"))]
    assert [(b"job-a", b"first"), (b"job-a", b"second")] == [
        record for record in _read(bootstrap, topic, _home(b"job-a")) if record[0] == b"job-a"
    ]


def test_a_record_over_its_topics_own_limit_is_never_sent(bootstrap: str, topic_prefix: str) -> None:
    """The writer takes each topic's max.message.bytes: a record over it fails and is not produced
    (the embedded broker enforces no limit, so only the writer can keep it)."""
    topic = f"{topic_prefix}small"
    create_topics(bootstrap, [topic], partitions=PARTITIONS, config={"max.message.bytes": "10000"})
    limits = TopicLimits(max_message_bytes(bootstrap, [topic]))
    messages = [Outgoing(topic, b"job-a", b"x" * 9_000, ()), Outgoing(topic, b"job-b", b"y" * 11_000, ())]
    writer = Writer(bootstrap, idempotent=False, home=_home, limits=limits)

    async def write() -> Written:
        return await writer.write(messages)

    try:
        written = asyncio.run(write())
    finally:
        writer.close()

    assert 10_000 == limits.of(topic)
    assert [(topic, _home(b"job-b"))] == list(written.failed)
    landed = [r for p in range(PARTITIONS) for r in _read(bootstrap, topic, p)]
    assert [(b"job-a", b"x" * 9_000)] == landed


def test_an_empty_write_is_answered_at_once(bootstrap: str) -> None:
    writer = Writer(bootstrap, idempotent=False, home=_home)

    async def write() -> Written:
        return await asyncio.wait_for(writer.write([]), 1.0)

    try:
        written = asyncio.run(write())
    finally:
        writer.close()

    assert written.failed == {} and written.last_offsets == {}
