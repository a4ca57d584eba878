"""The Spark driver's journal follower (spark_tasks/journal_follower.py) against a real broker: it reads
the job's journal partition from its end, fenced by the journal's claims like every journal reader, and
commits a completion's offsets to the job's group. No Spark runs."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from events.dev.broker import create_topics
from events.kafka.clients import consumer_config, job_partition, produce_record, producer_config
from events.wire.codec import encode
from events.wire.fencing import epoch_header
from events.wire.records import CheckpointAborted, CoordinatorClaimed, Record
from events.wire.topics import Topics
from spark_tasks.journal_follower import JournalFollower

JOB = "journal-follower"


def aborted(checkpoint_id: int) -> CheckpointAborted:
    return CheckpointAborted(JOB, checkpoint_id, 1_000, "CHECKPOINT_EXPIRED", "expired before every ack")


def write(bootstrap: str, topic: str, record: CheckpointAborted, epoch: int) -> None:
    producer = Producer(producer_config(bootstrap))
    produce_record(producer, topic, record, headers=(epoch_header(epoch),))
    assert 0 == producer.flush(10)


def test_a_zombie_coordinators_record_after_a_newer_claim_never_reaches_the_job(
    bootstrap: str, topic_prefix: str
) -> None:
    """Given a follower of the job's journal, when epoch 1 writes checkpoint 1's abort, epoch 2 claims
    the partition, the epoch-1 zombie writes 2's and epoch 2 writes 3's, then the job is told of 1 and
    3 only, and the follower's fence is at epoch 2."""
    topic = Topics(topic_prefix).checkpoints
    create_topics(bootstrap, [topic])
    probe = Consumer(consumer_config(bootstrap))
    partition = job_partition(probe, topic, JOB)
    probe.close()
    seen: list[Record] = []
    three = threading.Event()

    def on_record(record: Record) -> None:
        seen.append(record)
        if isinstance(record, CheckpointAborted) and record.checkpoint_id == 3:
            three.set()

    follower = JournalFollower(bootstrap, JOB, topic, f"{topic_prefix}{JOB}", on_record, timeout=10)
    try:
        write(bootstrap, topic, aborted(1), epoch=1)
        claimer = Producer(producer_config(bootstrap))
        claimer.produce(topic, encode(CoordinatorClaimed(partition, 2, "w2", 1)), partition=partition)
        assert 0 == claimer.flush(10)
        write(bootstrap, topic, aborted(2), epoch=1)
        write(bootstrap, topic, aborted(3), epoch=2)

        assert three.wait(30), f"the job was told only of {seen}"
        time.sleep(0.3)  # anything after 3 would have come by now
    finally:
        follower.close()

    assert [1, 3] == [r.checkpoint_id for r in seen if isinstance(r, CheckpointAborted)]
    assert 2 == follower.fence.epoch


def test_a_completions_offsets_are_committed_to_the_jobs_group(bootstrap: str, topic_prefix: str) -> None:
    """Given a follower, when it commits checkpoint 7's offsets, then the job's group holds them."""
    topics = Topics(topic_prefix)
    words = f"{topic_prefix}words"
    create_topics(bootstrap, [topics.checkpoints])
    create_topics(bootstrap, [words], partitions=2)
    group = f"{topic_prefix}{JOB}-group"
    follower = JournalFollower(bootstrap, JOB, topics.checkpoints, group, lambda record: None, timeout=10)
    try:
        follower.commit(7, [(words, 0, 40), (words, 1, 60)])
    finally:
        follower.close()

    reader = Consumer(consumer_config(bootstrap, group))
    try:
        committed = reader.committed([TopicPartition(words, 0), TopicPartition(words, 1)], timeout=10)
    finally:
        reader.close()
    assert [40, 60] == [tp.offset for tp in committed]
