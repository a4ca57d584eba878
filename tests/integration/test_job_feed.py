"""The one Kafka edge of job readers against a real broker: real ends, following, reading whole."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from events.dev.broker import create_topics
from events.kafka.clients import (
    commit_offsets,
    consumer_config,
    deliver,
    earliest_offsets,
    find_ends,
    job_partition,
    latest_offsets,
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


def test_the_ends_of_many_partitions_empty_ones_included_come_from_one_offsets_request_and_a_fetch(
    bootstrap: str, topic_prefix: str
) -> None:
    """One ListOffsets for every partition (:func:`latest_offsets`, :func:`earliest_offsets`) says
    what each partition's own does (its "latest" short by a batch on the embedded broker, both);
    find_ends then reads each from one record before that (an empty one from its start) to its end,
    twice on the same consumer."""
    topic = f"{topic_prefix}ends"
    create_topics(bootstrap, [topic], partitions=4)
    producer = Producer(producer_config(bootstrap))
    ends = {(topic, 0): 0, (topic, 1): 1, (topic, 2): 7, (topic, 3): 30}
    for (_, partition), count in ends.items():
        for index in range(count):
            producer.produce(topic, str(index).encode(), partition=partition)
    assert 0 == producer.flush(10)
    consumer = Consumer(consumer_config(bootstrap, extra={"enable.partition.eof": True}))
    try:
        each = {tp: consumer.get_watermark_offsets(TopicPartition(*tp), 10, cached=False) for tp in ends}
        assert {tp: high for tp, (_, high) in each.items()} == latest_offsets(consumer, list(ends), 10)
        assert {tp: low for tp, (low, _) in each.items()} == earliest_offsets(consumer, list(ends), 10)
        assert ends == find_ends(consumer, list(ends), 10)
        producer.produce(topic, b"more", partition=0)
        assert 0 == producer.flush(10)
        assert {**ends, (topic, 0): 1} == find_ends(consumer, list(ends), 10)
    finally:
        consumer.close()


class EndlessWriter:
    """A thread that writes 1 KB records to partition 0 of ``topic``, one record a batch, as fast as
    it can, until stopped: ``acked`` of them acknowledged, ``queued`` at least as many as handed to
    the producer."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.acked = self.queued = 0
        self._stop = threading.Event()
        self._producer = Producer(producer_config(bootstrap, {"linger.ms": 0, "batch.size": 1100}))
        self._topic = topic
        self._thread = threading.Thread(target=self._write, daemon=True)
        self._thread.start()

    def _on_delivery(self, error: object, _: object) -> None:
        if error is None:
            self.acked += 1

    def _write(self) -> None:
        while not self._stop.is_set():
            # counted before the hand-over, so that a record the broker has is always counted
            self.queued += 1
            try:
                self._producer.produce(self._topic, b"x" * 1024, partition=0, on_delivery=self._on_delivery)
            except BufferError:
                self.queued -= 1
            self._producer.poll(0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._producer.flush(10)


def test_the_end_is_found_while_a_producer_keeps_writing_faster_than_the_consumer_reads(
    bootstrap: str, topic_prefix: str
) -> None:
    """Given a producer that never stops writing, and a consumer that fetches one record a request
    (it never catches up with the partition's end), find_ends answers with the watermark of its
    first fetch: at or after the end when it was called, at or before what had been written when
    it returned. (Reading on to the partition's EOF, it would chase the producer until its
    timeout.)"""
    topic = f"{topic_prefix}endless"
    create_topics(bootstrap, [topic], partitions=1)
    small_fetches = {
        "enable.partition.eof": True,
        "max.partition.fetch.bytes": 1,
        "fetch.max.bytes": 1000,
        "message.max.bytes": 1000,
    }
    consumer = Consumer(consumer_config(bootstrap, extra=small_fetches))
    writer = EndlessWriter(bootstrap, topic)
    try:
        deadline = time.monotonic() + 30
        while writer.acked < 1000 and time.monotonic() < deadline:  # the partition has grown
            time.sleep(0.01)
        written_before = writer.acked
        ends = find_ends(consumer, [(topic, 0)], 10)
        queued_after = writer.queued
    finally:
        writer.stop()
        consumer.close()

    assert written_before <= ends[(topic, 0)] <= queued_after, (written_before, ends, queued_after)


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
