"""The exactly-once sink sends ahead (docs/exactly-once.md, "Sending ahead"), on Apache Kafka: records
go into an open transaction as they are sent and are at the broker once the barrier is staged, so
the completion only commits (nothing is sent twice), also those sent while the last commit ran; a
transaction sent ahead whose completion is
slow to come is aborted by the sink before ``transaction.timeout.ms`` (the broker's abort would
fence the producer for good), and the completion commits the staged copy instead; a transaction sent
ahead in the milliseconds after a commit can be aborted at once without fencing the producer; the
records after a barrier staged while a commit ran wait for that checkpoint's commit (which would
abort them) before they go ahead.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from support import on_apache_kafka

from events.dev.broker import create_topics
from events.kafka.clients import consumer_config, read_partition_to_end
from events.task.exactly_once import ExactlyOnceSink
from events.wire.records import CheckpointBarrier, CheckpointCompleted, CheckpointKind
from events.wire.topics import Topics

pytestmark = pytest.mark.skipif(
    not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
)

JOB = "send-ahead"


def values(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    """What a reader of ``topic`` (one partition) sees to its end at ``isolation``; read_committed
    waits for a transaction still open to end."""
    consumer = Consumer(consumer_config(bootstrap, extra={"isolation.level": isolation}))
    try:
        return [m.value() or b"" for m in read_partition_to_end(consumer, topic, 0, timeout=90)]
    finally:
        consumer.close()


def barrier(checkpoint_id: int, root: Path) -> CheckpointBarrier:
    location = (root / f"chk-{checkpoint_id}").as_uri()
    return CheckpointBarrier(JOB, checkpoint_id, 1, CheckpointKind.CHECKPOINT, 0, location)


def completion(checkpoint_id: int, root: Path) -> CheckpointCompleted:
    location = (root / f"chk-{checkpoint_id}").as_uri()
    kind = CheckpointKind.CHECKPOINT
    return CheckpointCompleted(JOB, checkpoint_id, kind, 0, 0, {}, 0, {}, 1, location)


@pytest.fixture(name="output")
def _output(bootstrap: str) -> str:
    """A fresh output topic of one partition."""
    topic = f"eo-ahead-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], partitions=1)
    return topic


@pytest.fixture(name="sinks")
def _sinks() -> Iterator[list[ExactlyOnceSink]]:
    """The sinks a test makes (:func:`recovered_sink`), closed after it."""
    made: list[ExactlyOnceSink] = []
    yield made
    for sink in made:
        sink.close()


def recovered_sink(
    bootstrap: str, prefix: str, made: list[ExactlyOnceSink], **options: object
) -> ExactlyOnceSink:
    topics = Topics(prefix)
    create_topics(bootstrap, [*topics.all], partitions=2)
    sink = ExactlyOnceSink(bootstrap, JOB, "task-0", topics, uid=uuid.uuid4().hex[:6], **options)  # type: ignore[arg-type]
    made.append(sink)
    sink.recover(None)
    return sink


def holding_commit_1(
    bootstrap: str, prefix: str, output: str, root: Path, made: list[ExactlyOnceSink]
) -> tuple[ExactlyOnceSink, threading.Event]:
    """A sink that sent ``a``, staged it at checkpoint 1's barrier and is committing it, held at the
    commit's last step (the producer taken) until the event returned is set."""
    committing, release = threading.Event(), threading.Event()

    def step(name: str, checkpoint_id: int) -> None:
        if (name, checkpoint_id) == ("committed", 1):
            committing.set()
            release.wait(60)

    sink = recovered_sink(bootstrap, prefix, made, step=step)
    sink.send(output, b"a")
    sink.stage(barrier(1, root))
    sink.complete(completion(1, root))
    assert committing.wait(60), "checkpoint 1's commit never reached its last step"
    return sink, release


def test_records_sent_ahead_are_at_the_broker_at_the_barrier_and_committed_once(
    bootstrap: str, topic_prefix: str, output: str, tmp_path: Path, sinks: list[ExactlyOnceSink]
) -> None:
    # given: a sink that sent two records and staged them at checkpoint 1's barrier
    sink = recovered_sink(bootstrap, topic_prefix, sinks)
    sink.send(output, b"a")
    sink.send(output, b"b")
    sink.stage(barrier(1, tmp_path))
    # then: they are at the broker, in a transaction not committed
    assert [b"a", b"b"] == values(bootstrap, output, "read_uncommitted")
    # when: the journal completes checkpoint 1
    sink.complete(completion(1, tmp_path))
    sink.wait_for_commits()
    # then: that transaction is committed as it was: each record visible once, none sent twice
    assert [b"a", b"b"] == values(bootstrap, output, "read_committed")
    assert [b"a", b"b"] == values(bootstrap, output, "read_uncommitted")
    assert [1] == sink.committed
    assert not list(tmp_path.glob("chk-*/*.out"))


def test_records_sent_while_a_commit_runs_go_ahead_when_it_ends_and_are_at_the_broker_at_the_barrier(
    bootstrap: str, topic_prefix: str, output: str, tmp_path: Path, sinks: list[ExactlyOnceSink]
) -> None:
    # given: checkpoint 1's commit held at its last step, and two records sent meanwhile (each send
    # finds the producer taken by the commit: they stay in memory)
    sink, release = holding_commit_1(bootstrap, topic_prefix, output, tmp_path, sinks)
    sink.send(output, b"b")
    sink.send(output, b"c")
    # when: the commit ends, and checkpoint 2's barrier comes before any other record
    release.set()
    sink.wait_for_commits()
    sink.stage(barrier(2, tmp_path))
    # then: they went ahead when the commit ended: at the broker at the barrier, not committed
    assert [b"a", b"b", b"c"] == values(bootstrap, output, "read_uncommitted")
    # and checkpoint 2's completion commits that transaction as it is: nothing sent twice
    sink.complete(completion(2, tmp_path))
    sink.wait_for_commits()
    assert [b"a", b"b", b"c"] == values(bootstrap, output, "read_committed")
    assert [b"a", b"b", b"c"] == values(bootstrap, output, "read_uncommitted")
    assert [1, 2] == sink.committed


def test_records_after_a_barrier_staged_during_a_commit_wait_for_its_commit_and_are_sent_once(
    bootstrap: str, topic_prefix: str, output: str, tmp_path: Path, sinks: list[ExactlyOnceSink]
) -> None:
    # given: checkpoint 1's commit held at its last step; meanwhile b is sent and staged at
    # checkpoint 2's barrier (the producer taken: not sent ahead), then c is sent
    sink, release = holding_commit_1(bootstrap, topic_prefix, output, tmp_path, sinks)
    sink.send(output, b"b")
    sink.stage(barrier(2, tmp_path))
    sink.send(output, b"c")
    # when: the commit ends, and checkpoint 2 completes
    release.set()
    sink.wait_for_commits()
    sink.complete(completion(2, tmp_path))
    sink.wait_for_commits()
    # and c goes ahead once 2 is committed, and checkpoint 3's completion commits it as it is
    sink.stage(barrier(3, tmp_path))
    sink.complete(completion(3, tmp_path))
    sink.wait_for_commits()
    # then: each record committed once, and none sent twice: c did not go ahead before 2's commit,
    # which sends 2's staged copy and would have aborted it (read_uncommitted shows aborted records)
    assert [b"a", b"b", b"c"] == values(bootstrap, output, "read_committed")
    assert [b"a", b"b", b"c"] == values(bootstrap, output, "read_uncommitted")
    assert [1, 2, 3] == sink.committed


def test_a_transaction_sent_ahead_past_half_its_timeout_is_aborted_and_the_staged_copy_committed(
    bootstrap: str, topic_prefix: str, output: str, tmp_path: Path, sinks: list[ExactlyOnceSink]
) -> None:
    # given: a sink whose transactions time out after 5 s, with a record staged at checkpoint 1
    sink = recovered_sink(
        bootstrap, topic_prefix, sinks, timeout=5.0, producer_extra={"transaction.timeout.ms": 5000}
    )
    sink.send(output, b"a")
    sink.stage(barrier(1, tmp_path))
    # when: the completion is slow: the sink aborts the transaction after 2.5 s (read_committed reads
    # to the end once it ended), and the journal completes checkpoint 1 after that
    assert [] == values(bootstrap, output, "read_committed")
    sink.complete(completion(1, tmp_path))
    sink.wait_for_commits()
    # then: the staged copy is committed (the producer not fenced): visible once; read_uncommitted
    # sees the aborted one too
    assert [b"a"] == values(bootstrap, output, "read_committed")
    assert [b"a", b"a"] == values(bootstrap, output, "read_uncommitted")
    assert [1] == sink.committed


def test_a_transaction_sent_ahead_just_after_a_commit_and_canceled_at_once_leaves_the_producer_usable(
    bootstrap: str, topic_prefix: str, output: str, tmp_path: Path, sinks: list[ExactlyOnceSink]
) -> None:
    # given: a sink that commits checkpoint k, then at once sends a record (it goes ahead: a new
    # transaction, its partition asked for while the coordinator still ends k's), and a cancel
    # aborts that transaction 0-4 ms later; forty times (librdkafka sends that abort even for a
    # partition the coordinator refused, and the coordinator's INVALID_TXN_STATE fences the producer)
    sink = recovered_sink(bootstrap, topic_prefix, sinks)
    rounds = 40
    for k in range(1, rounds + 1):
        sink.send(output, str(k).encode())
        sink.stage(barrier(k, tmp_path))
        sink.complete(completion(k, tmp_path))
        sink.wait_for_commits()
        sink.send(output, b"canceled")
        time.sleep((k % 5) / 1000)
        # when: the cancel aborts the transaction sent ahead
        sink.abort()
    # then: every abort was accepted: the producer still commits, each checkpoint's record once
    assert sink.failure is None
    assert list(range(1, rounds + 1)) == sink.committed
    assert [str(k).encode() for k in range(1, rounds + 1)] == values(bootstrap, output, "read_committed")
