"""The one Kafka edge of job readers against a real broker: real ends, following, reading whole."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from events.dev.broker import create_topics
from events.kafka.clients import (
    commit_offsets,
    consumer_config,
    deliver,
    find_ends,
    job_partition,
    produce_record,
    producer_config,
)
from events.kafka.feed import JobFeed, read_job_partition
from events.wire.codec import encode
from events.wire.fencing import epoch_header
from events.wire.records import CheckpointBarrier, CheckpointKind, CoordinatorClaimed
from events.wire.topics import Topics

JOB = "job-feed"


def barrier(checkpoint_id: int, job_id: str = JOB) -> CheckpointBarrier:
    return CheckpointBarrier(job_id, checkpoint_id, 1, CheckpointKind.CHECKPOINT, 1_000, "file:///c")


def produce(bootstrap: str, topic: str, *records: CheckpointBarrier, epoch: int | None = None) -> None:
    """One flush: the records travel in as few batches as the producer makes."""
    producer = Producer(producer_config(bootstrap, {"linger.ms": 20}))
    headers = () if epoch is None else (epoch_header(epoch),)
    for record in records:
        produce_record(producer, topic, record, headers=headers)
    assert 0 == producer.flush(10)


def test_the_end_is_where_a_fetch_says_even_after_a_batch_and_on_a_reused_consumer(
    bootstrap: str, topic_prefix: str
) -> None:
    """ListOffsets "latest" is short by up to a batch on the embedded broker; find_ends is not,
    and a second call on the same consumer sees what was written in between."""
    topic = Topics(topic_prefix).barriers
    create_topics(bootstrap, [topic])
    consumer = Consumer(consumer_config(bootstrap, extra={"enable.partition.eof": True}))
    try:
        partition = job_partition(consumer, topic, JOB)
        produce(bootstrap, topic, *(barrier(i) for i in range(1, 101)))
        assert {(topic, partition): 100} == find_ends(consumer, [(topic, partition)], 10)

        produce(bootstrap, topic, *(barrier(i) for i in range(101, 151)))
        assert {(topic, partition): 150} == find_ends(consumer, [(topic, partition)], 10)
    finally:
        consumer.close()


def test_a_feed_from_the_end_hands_out_only_what_comes_after_it_of_its_job(
    bootstrap: str, topic_prefix: str
) -> None:
    topics = Topics(topic_prefix)
    create_topics(bootstrap, [topics.barriers])
    produce(bootstrap, topics.barriers, *(barrier(i) for i in range(1, 51)))  # before: never seen

    with JobFeed(bootstrap, JOB, (topics.barriers,), timeout=10) as feed:
        produce(bootstrap, topics.barriers, barrier(51), barrier(52, "job-other"), barrier(53))
        got = []
        for _ in range(100):
            got += feed.poll(0.1)
            if len(got) >= 2:
                break

    assert {(topics.barriers, feed.partitions[topics.barriers]): 50} == feed.starts
    assert [(51, 50), (53, 51)] == [  # job-other's barrier went to its own partition
        (r.record.checkpoint_id, r.offset) for r in got if isinstance(r.record, CheckpointBarrier)
    ]


def test_a_whole_journal_read_applies_the_claims_of_the_journal(bootstrap: str, topic_prefix: str) -> None:
    """Epoch 1 writes 1 and 2, epoch 2 claims, the epoch-1 zombie writes 3, epoch 2 writes 4: the
    read has 1, 2 and 4."""
    topic = Topics(topic_prefix).checkpoints
    create_topics(bootstrap, [topic])
    probe = Consumer(consumer_config(bootstrap))
    partition = job_partition(probe, topic, JOB)
    probe.close()
    produce(bootstrap, topic, barrier(1), barrier(2), epoch=1)
    claimer = Producer(producer_config(bootstrap))
    claimer.produce(topic, encode(CoordinatorClaimed(partition, 2, "w2", 1)), partition=partition)
    assert 0 == claimer.flush(10)
    produce(bootstrap, topic, barrier(3), epoch=1)
    produce(bootstrap, topic, barrier(4), epoch=2)

    read = list(read_job_partition(bootstrap, JOB, topic, claims_topic=topic, timeout=10))

    assert [(1, 1), (2, 1), (4, 2)] == [
        (r.record.checkpoint_id, r.epoch) for r in read if isinstance(r.record, CheckpointBarrier)
    ]


def test_deliver_waits_for_the_broker_and_says_when_it_never_had_the_record(
    bootstrap: str, topic_prefix: str
) -> None:
    topic = Topics(topic_prefix).acks
    create_topics(bootstrap, [topic])
    deliver(Producer(producer_config(bootstrap)), topic, barrier(1), timeout=10)
    assert [1] == [
        r.record.checkpoint_id for r in read_job_partition(bootstrap, JOB, topic, timeout=10) if r.record
    ]

    nowhere = Producer(producer_config("127.0.0.1:9", {"message.timeout.ms": 300}))
    with pytest.raises((TimeoutError, KafkaException)):
        deliver(nowhere, topic, barrier(2), timeout=1)


def test_commit_offsets_commits_to_the_group_and_waits_for_it(bootstrap: str, topic_prefix: str) -> None:
    topic = Topics(topic_prefix).acks
    create_topics(bootstrap, [topic], partitions=2)
    consumer = Consumer(consumer_config(bootstrap, f"{topic_prefix}group"))
    try:
        assert commit_offsets(consumer, [TopicPartition(topic, 1, 0)]) is None
        assert 0 == consumer.committed([TopicPartition(topic, 1)], timeout=10)[0].offset
        assert commit_offsets(consumer, []) is None
    finally:
        consumer.close()
