"""The exactly-once sink's committing thread (docs/exactly-once.md, "The design", step 3), on Apache
Kafka: ``complete`` hands a commit over and returns, the app sends and stages on while it runs, the
commits keep their order one at a time, and a commit that fails leaves its output and the output
queued behind it to the next completion, so no marker passes output not committed yet.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from support import on_apache_kafka

from events.dev.broker import create_topics
from events.kafka.clients import consumer_config, read_partition_to_end
from events.task.exactly_once import ExactlyOnceSink
from events.wire.records import CheckpointBarrier, CheckpointCompleted, CheckpointKind
from events.wire.topics import Topics

pytestmark = pytest.mark.skipif(
    not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
)

JOB = "committing-thread"


class Held:
    """A sink's ``step``: holds the committing thread at ``committing`` of one checkpoint until
    released, then raises ``fail`` there (if given) instead of going on."""

    def __init__(self, checkpoint_id: int, fail: KafkaException | None = None) -> None:
        self.checkpoint_id, self.fail = checkpoint_id, fail
        self.reached, self.release = threading.Event(), threading.Event()
        self.steps: list[tuple[str, int]] = []

    def __call__(self, name: str, checkpoint_id: int) -> None:
        self.steps.append((name, checkpoint_id))
        if (name, checkpoint_id) == ("committing", self.checkpoint_id):
            self.reached.set()
            assert self.release.wait(60), "the test never released the commit"
            if self.fail is not None:
                fail, self.fail = self.fail, None
                raise fail


class Checkpoints:
    """Plays the coordinator for one sink: a barrier (the sink stages) and the completion."""

    def __init__(self, sink: ExactlyOnceSink, root: Path) -> None:
        self.sink, self.root = sink, root

    def stage(self, checkpoint_id: int) -> None:
        location = (self.root / f"chk-{checkpoint_id}").as_uri()
        barrier = CheckpointBarrier(JOB, checkpoint_id, 1, CheckpointKind.CHECKPOINT, 0, location)
        self.sink.stage(barrier)

    def complete(self, checkpoint_id: int) -> None:
        location = (self.root / f"chk-{checkpoint_id}").as_uri()
        kind = CheckpointKind.CHECKPOINT
        self.sink.complete(CheckpointCompleted(JOB, checkpoint_id, kind, 0, 0, {}, 0, {}, 1, location))


def committed_values(bootstrap: str, topic: str) -> list[bytes]:
    """What a read_committed reader of ``topic`` (one partition) sees, in order."""
    consumer = Consumer(consumer_config(bootstrap, extra={"isolation.level": "read_committed"}))
    try:
        return [m.value() or b"" for m in read_partition_to_end(consumer, topic, 0)]
    finally:
        consumer.close()


def visible_for(bootstrap: str, topic: str, seconds: float) -> list[bytes]:
    """What a read_committed reader of ``topic`` (one partition) gets in ``seconds``: reading to the
    end would wait for a transaction still open (sent ahead, not committed) to end."""
    consumer = Consumer(consumer_config(bootstrap, extra={"isolation.level": "read_committed"}))
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline, seen = time.monotonic() + seconds, []
        while time.monotonic() < deadline:
            seen += [m.value() or b"" for m in consumer.consume(100, 0.1) if m.error() is None]
        return seen
    finally:
        consumer.close()


@pytest.fixture
def output(bootstrap: str) -> str:
    topic = f"eo-thread-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], partitions=1)
    return topic


@pytest.fixture
def sink_with() -> Iterator[list[ExactlyOnceSink]]:
    made: list[ExactlyOnceSink] = []
    yield made
    for sink in made:
        sink.close()


def make_sink(bootstrap: str, prefix: str, held: Held, made: list[ExactlyOnceSink]) -> ExactlyOnceSink:
    """A sink recovered as a task's first attempt (the job's topics made, its journal empty)."""
    topics = Topics(prefix)
    create_topics(bootstrap, [*topics.all], partitions=2)
    sink = ExactlyOnceSink(bootstrap, JOB, "task-0", topics, uid=uuid.uuid4().hex[:6], step=held)
    made.append(sink)
    sink.recover(None)
    return sink


def test_sends_go_on_while_a_commit_runs_and_the_commits_keep_their_order(
    bootstrap: str, topic_prefix: str, output: str, tmp_path: Path, sink_with: list[ExactlyOnceSink]
) -> None:
    # given: checkpoint 1's commit held on the committing thread
    held = Held(1)
    sink = make_sink(bootstrap, topic_prefix, held, sink_with)
    checkpoints = Checkpoints(sink, tmp_path)
    sink.send(output, b"a")
    checkpoints.stage(1)
    checkpoints.complete(1)  # returns: the commit is the thread's
    assert held.reached.wait(30)
    # when: the app sends, stages and completes checkpoint 2 meanwhile
    sink.send(output, b"b")
    checkpoints.stage(2)
    checkpoints.complete(2)
    assert [] == visible_for(bootstrap, output, 2.0)  # nothing visible before 1's commit
    held.release.set()
    sink.wait_for_commits()
    # then: 1 and then 2, one transaction each, in order
    assert [b"a", b"b"] == committed_values(bootstrap, output)
    assert [1, 2] == sink.committed
    assert 2 == (sink.marker.checkpoint_id if sink.marker else None)
    assert [("committing", 1), ("committed", 1), ("committing", 2), ("committed", 2)] == [
        s for s in held.steps if s[0] in ("committing", "committed")
    ]


def test_a_failed_commit_leaves_its_output_and_the_queued_output_to_the_next_completion(
    bootstrap: str, topic_prefix: str, output: str, tmp_path: Path, sink_with: list[ExactlyOnceSink]
) -> None:
    # given: checkpoint 1's commit fails (a retriable error) once checkpoint 2's is queued behind it
    held = Held(1, fail=KafkaException(KafkaError(KafkaError._TIMED_OUT, "injected", retriable=True)))
    sink = make_sink(bootstrap, topic_prefix, held, sink_with)
    checkpoints = Checkpoints(sink, tmp_path)
    sink.send(output, b"a")
    checkpoints.stage(1)
    checkpoints.complete(1)
    assert held.reached.wait(30)
    sink.send(output, b"b")
    checkpoints.stage(2)
    checkpoints.complete(2)
    held.release.set()
    sink.wait_for_commits()
    assert [] == committed_values(bootstrap, output)
    assert [] == sink.committed
    # when: checkpoint 3 completes
    sink.send(output, b"c")
    checkpoints.stage(3)
    checkpoints.complete(3)
    sink.wait_for_commits()
    # then: 1, 2 and 3 in one transaction under marker 3, each record once, in order
    assert [b"a", b"b", b"c"] == committed_values(bootstrap, output)
    assert [1, 2, 3] == sink.committed
    assert 3 == (sink.marker.checkpoint_id if sink.marker else None)
    assert not list(tmp_path.glob("chk-*/*.out"))  # the staged files go once committed
