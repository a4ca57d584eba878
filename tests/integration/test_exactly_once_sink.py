"""Exactly-once output of a participant, on Apache Kafka (docs/exactly-once.md): a one-task job copies
its input topic to an output topic through an ExactlyOnceSink, in a child process
(exactly_once_app.py) that each test SIGKILLs at one crash point of checkpoint 2; the test plays the
coordinator (barriers, journal). After the restart, a read_committed reader sees every input's
output exactly once; a read_uncommitted reader sees what an aborted transaction left, and a sink
that does not read its marker duplicates, so the tests can fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from support import eventually, on_apache_kafka

from events.dev.broker import create_topics
from events.kafka.clients import (
    consume_available,
    consumer_config,
    job_key,
    partition_for,
    produce_record,
    producer_config,
    read_partition_to_end,
)
from events.task.exactly_once import staged_name
from events.wire.codec import decode
from events.wire.records import (
    CheckpointAborted,
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointDeclined,
    CheckpointKind,
    CheckpointTriggered,
    JobStatus,
    Record,
    SchedulerStopped,
)
from events.wire.topics import Topics

pytestmark = pytest.mark.skipif(
    not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
)

APP = Path(__file__).with_name("exactly_once_app.py")
JOB = "copy"
TASK = "task-0"
PARTITIONS = 2


@dataclass
class Child:
    """The participant's process and what it said."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def said(self, line: str, timeout: float = 60) -> None:
        def heard() -> bool:
            assert self.process.poll() is None, f"the app exited {self.process.returncode}: {self.lines[-5:]}"
            assert line in self.lines, f"its last lines: {self.lines[-6:]}"
            return True

        try:
            eventually(heard, timeout=timeout, what=f"the app to say {line!r}")
        except AssertionError:
            if self.process.poll() is None:  # every thread's stack on its stderr, in the test's report
                self.process.send_signal(signal.SIGUSR1)
                time.sleep(1)
            raise

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


def launch(settings: dict[str, object]) -> Child:
    """Start the participant app with ``settings``, its stdout lines collected into the child."""
    process = subprocess.Popen(
        [sys.executable, str(APP)],
        env={**os.environ, "EXACTLY_ONCE_APP": json.dumps(settings)},
        stdout=subprocess.PIPE,
        text=True,
    )
    child = Child(process)
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: child.lines.extend(line.strip() for line in stdout), daemon=True).start()
    return child


class Job:
    """The topics, the input, the child processes, and the coordinator's part, played by the test."""

    def __init__(self, bootstrap: str, prefix: str, root: Path) -> None:
        self.bootstrap = bootstrap
        self.topics = Topics(prefix)
        self.input, self.output = f"{prefix}words", f"{prefix}copies"
        self.root = root
        create_topics(bootstrap, [*self.topics.all], partitions=PARTITIONS)
        create_topics(bootstrap, [self.input, self.output], partitions=1)
        self.producer = Producer(producer_config(bootstrap))
        self.acks = Consumer(consumer_config(bootstrap))
        partition = partition_for(job_key(JOB), PARTITIONS)
        self.acks.assign([TopicPartition(t, partition, 0) for t in (self.topics.acks, self.topics.declines)])
        self.received: dict[int, CheckpointAcknowledged] = {}
        self.children: list[Child] = []
        self.sent = 0

    # the input
    def words(self, count: int) -> None:
        for _ in range(count):
            self.producer.produce(self.input, f"w{self.sent}".encode())
            self.sent += 1
        assert self.producer.flush(10) == 0

    # the participant
    def start(
        self,
        attempt: int,
        restored: int | None = None,
        crash: tuple[str, int] | None = None,
        variant: str = "",
    ) -> Child:
        settings = {
            "bootstrap": self.bootstrap,
            "prefix": self.topics.prefix,
            "job": JOB,
            "task": TASK,
            "attempt": attempt,
            "input": self.input,
            "output": self.output,
            "restored": restored,
            "crash": crash,
            "variant": variant,
        }
        child = launch(settings)
        self.children.append(child)
        child.said("ready")
        return child

    # the coordinator's part
    def location(self, checkpoint_id: int) -> str:
        return (self.root / f"chk-{checkpoint_id}").as_uri()

    def send(self, topic: str, record: Record) -> None:
        produce_record(self.producer, topic, record)
        assert self.producer.flush(10) == 0

    def barrier(
        self, checkpoint_id: int, attempt: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT, **stop: bool
    ) -> CheckpointAcknowledged:
        """Checkpoint ``checkpoint_id`` triggered (a stop-with-savepoint with ``stop=True``), its
        barrier sent; the task's ack."""
        location = self.location(checkpoint_id)
        trigger = CheckpointTriggered(JOB, checkpoint_id, attempt, kind, 1, location, (TASK,), 2**40, **stop)
        self.send(self.topics.checkpoints, trigger)
        self.send(self.topics.barriers, CheckpointBarrier(JOB, checkpoint_id, attempt, kind, 1, location))
        return eventually(lambda: self._ack(checkpoint_id), what=f"the ack of checkpoint {checkpoint_id}")

    def _ack(self, checkpoint_id: int) -> CheckpointAcknowledged | None:
        for msg in consume_available(self.acks, 100, 0.05):
            record = decode(msg.value() or b"")
            if isinstance(record, CheckpointAcknowledged):
                self.received[record.checkpoint_id] = record
            elif isinstance(record, CheckpointDeclined):
                pytest.fail(f"the task declined checkpoint {record.checkpoint_id}: {record.message}")
        return self.received.get(checkpoint_id)

    def complete(self, ack: CheckpointAcknowledged, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> None:
        assert ack.state is not None
        completed = CheckpointCompleted(
            JOB,
            ack.checkpoint_id,
            kind,
            2,
            1,
            {TASK: ack.state},
            ack.state.size_bytes,
            dict(ack.offsets),
            ack.attempt,
            self.location(ack.checkpoint_id),
        )
        self.send(self.topics.checkpoints, completed)

    def abort(self, checkpoint_id: int) -> None:
        self.send(self.topics.checkpoints, CheckpointAborted(JOB, checkpoint_id, 2, "EXPIRED", "timed out"))

    def checkpoint(self, child: Child, checkpoint_id: int, attempt: int) -> None:
        """A checkpoint that completes, and its output committed."""
        self.complete(self.barrier(checkpoint_id, attempt))
        child.said(f"step committed {checkpoint_id}")

    # the readers
    def output_values(self, isolation: str = "read_committed") -> Counter[str]:
        consumer = Consumer(consumer_config(self.bootstrap, extra={"isolation.level": isolation}))
        try:
            return Counter(
                (m.value() or b"").decode() for m in read_partition_to_end(consumer, self.output, 0)
            )
        finally:
            consumer.close()

    def visible_now(self, seconds: float = 3.0) -> Counter[str]:
        """What a read_committed reader gets in ``seconds``: reading to the end would wait for a
        transaction a killed attempt left open (sent ahead) until the next attempt fences it."""
        consumer = Consumer(consumer_config(self.bootstrap, extra={"isolation.level": "read_committed"}))
        try:
            consumer.assign([TopicPartition(self.output, 0, OFFSET_BEGINNING)])
            seen: Counter[str] = Counter()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                seen.update(
                    (m.value() or b"").decode() for m in consumer.consume(100, 0.1) if m.error() is None
                )
            return seen
        finally:
            consumer.close()

    def staged_files(self) -> list[Path]:
        return sorted(self.root.glob(f"*/{staged_name(TASK, 'copy')}"))

    def close(self) -> None:
        for child in self.children:
            if child.process.poll() is None:
                child.kill()
        self.acks.close()


@pytest.fixture
def job(bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[Job]:
    running = Job(bootstrap, topic_prefix, tmp_path / "checkpoints")
    try:
        yield running
    finally:
        running.close()


def first_attempt(job: Job, crash: tuple[str, int] | None = None) -> Child:
    """Attempt 1: ten words and checkpoint 1 committed, then ten more words, all read."""
    child = job.start(attempt=1, crash=crash)
    job.words(10)
    child.said("processed 10")
    job.checkpoint(child, 1, attempt=1)
    job.words(10)
    child.said("processed 20")
    return child


def second_attempt(job: Job, restored: int, variant: str = "") -> Child:
    """Attempt 2 restores ``restored``, reads ten more words, and checkpoint 3 commits its output."""
    child = job.start(attempt=2, restored=restored, variant=variant)
    job.words(10)
    child.said("processed 30")
    job.checkpoint(child, 3, attempt=2)
    return child


def exactly_once(job: Job) -> Counter[str]:
    """What a read_committed reader sees, once every word's copy is there."""
    every = {f"w{i}" for i in range(job.sent)}
    return eventually(job.output_values, lambda seen: set(seen) >= every, what="every copy committed")


def assert_exactly_once(job: Job) -> None:
    seen = exactly_once(job)
    assert seen == Counter({f"w{i}": 1 for i in range(job.sent)}), f"not exactly once: {seen}"
    # the sink deletes a checkpoint's staged file after its commit made the output visible
    eventually(lambda: job.staged_files() == [], what="the staged files deleted once their output committed")


# ------------------------------------------------------------------ crash points


def test_exactly_once_when_killed_before_the_barrier(job: Job) -> None:
    child = first_attempt(job)
    child.kill()  # w10..w19 were sent to the sink, never staged
    second_attempt(job, restored=1)
    assert_exactly_once(job)


def test_exactly_once_when_killed_after_the_ack_before_the_completion(job: Job) -> None:
    child = first_attempt(job)
    ack = job.barrier(2, attempt=1)
    child.kill()
    job.complete(ack)  # every task had acked: the journal completes it after the task died
    second_attempt(job, restored=2)  # its recovery commits checkpoint 2's staged output
    assert_exactly_once(job)


def test_exactly_once_when_the_checkpoint_expires_after_the_ack(job: Job) -> None:
    child = first_attempt(job)
    job.barrier(2, attempt=1)
    child.kill()
    job.abort(2)
    assert job.visible_now() == Counter({f"w{i}": 1 for i in range(10)}), "an aborted checkpoint's output"
    second = second_attempt(job, restored=1)  # its recovery deletes 2's staged output: w10.. are read again
    assert "recovered commit=[] delete=[2]" in second.lines
    assert_exactly_once(job)


def test_exactly_once_when_killed_after_the_completion_before_the_commit(job: Job) -> None:
    child = first_attempt(job, crash=("committing", 2))
    job.complete(job.barrier(2, attempt=1))
    child.said("stopped at committing 2")
    child.kill()
    second = second_attempt(job, restored=2)
    assert "recovered commit=[2] delete=[]" in second.lines
    assert_exactly_once(job)


def test_exactly_once_when_killed_during_the_commit(job: Job) -> None:
    child = first_attempt(job, crash=("open", 2))
    job.complete(job.barrier(2, attempt=1))
    child.said("stopped at open 2")  # w10..w19 and the marker are at the broker, not committed
    child.kill()
    second = second_attempt(job, restored=2)  # fences the dead producer, aborts, commits again
    assert "recovered commit=[2] delete=[]" in second.lines
    assert_exactly_once(job)
    uncommitted = job.output_values("read_uncommitted")
    assert {word for word, n in uncommitted.items() if n == 2} == {f"w{i}" for i in range(10, 20)}


def test_exactly_once_when_killed_after_the_commit_before_the_staged_file_is_deleted(job: Job) -> None:
    child = first_attempt(job, crash=("committed", 2))
    job.complete(job.barrier(2, attempt=1))
    child.said("stopped at committed 2")
    child.kill()
    assert [p.parent.name for p in job.staged_files()] == ["chk-2"]
    second = second_attempt(job, restored=2)
    assert "recovered commit=[] delete=[2]" in second.lines  # the marker says 2 is committed
    assert_exactly_once(job)


def test_a_sink_that_ignores_its_marker_duplicates_output(job: Job) -> None:
    child = first_attempt(job, crash=("committed", 2))
    job.complete(job.barrier(2, attempt=1))
    child.said("stopped at committed 2")
    child.kill()
    second_attempt(job, restored=2, variant="no-marker")
    seen = exactly_once(job)
    assert {word for word, n in seen.items() if n == 2} == {f"w{i}" for i in range(10, 20)}


# ------------------------------------------------------------------ while running


def test_an_aborted_checkpoints_output_is_committed_with_the_next_completed_one(job: Job) -> None:
    child = first_attempt(job)
    job.barrier(2, attempt=1)
    job.abort(2)  # another task declined it, say: the job runs on
    job.words(10)
    child.said("processed 30")
    # (2's transaction sent ahead stays open until 3's completion: read what is visible meanwhile)
    assert job.visible_now() == Counter({f"w{i}": 1 for i in range(10)})
    job.checkpoint(child, 3, attempt=1)  # 3's cut covers 2's input too
    assert_exactly_once(job)


# ------------------------------------------------------------------ stop and cancel


@pytest.mark.parametrize("drain", [False, True])
def test_a_stop_with_a_savepoint_commits_the_last_output(job: Job, drain: bool) -> None:
    # given: w10..w19 read after checkpoint 1
    child = first_attempt(job)
    # when: cutline stop (--drain): a stop savepoint that completes
    savepoint = CheckpointKind.SAVEPOINT
    job.complete(job.barrier(2, attempt=1, kind=savepoint, stop=True, drain=drain), kind=savepoint)
    # then: the job is FINISHED with the savepoint's output committed
    child.said("job FINISHED committed=[1, 2] aborted=[]")
    assert_exactly_once(job)


def test_a_cancel_aborts_the_pending_output(job: Job) -> None:
    # given: checkpoint 2 acked (w10..w19 staged), not completed, and w20..w29 read after its barrier
    child = first_attempt(job)
    # w10..w19 are at the broker before the barrier, sent ahead (those read while checkpoint 1's commit
    # ran go ahead when it ends)
    sent_ahead = Counter({f"w{i}": 1 for i in range(20)})
    eventually(lambda: job.output_values("read_uncommitted") == sent_ahead, what="w10..w19 sent ahead")
    job.barrier(2, attempt=1)
    job.words(10)
    child.said("processed 30")
    # when: cutline cancel (the scheduler stops CANCELLING)
    job.send(job.topics.checkpoints, SchedulerStopped(JOB, 1, 3, JobStatus.CANCELLING))
    # then: the staged output is deleted unsent, and nothing after checkpoint 1 is visible
    child.said("job CANCELED committed=[1] aborted=[2]")
    assert job.staged_files() == []
    assert job.output_values() == Counter({f"w{i}": 1 for i in range(10)})  # no transaction left open
    # w10..w19 were sent ahead, and aborted; w20..w29 were kept in memory, never sent
    assert job.output_values("read_uncommitted") == sent_ahead
