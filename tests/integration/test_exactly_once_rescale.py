"""Exactly-once output of participants rescaled to fewer tasks, on Apache Kafka (docs/exactly-once.md,
"Recovery"): four tasks copy their input partitions to an output topic through ExactlyOnceSinks
(exactly_once_app.py), one is SIGKILLed after checkpoint 2 completed and before (or during) its
commit, and the job restores checkpoint 2 with two tasks. Their recoveries take over the removed
tasks: a read_committed reader sees every input's copy exactly once. Without the takeover the dead
task's output is missing, so the test can fail.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support import eventually, on_apache_kafka
from test_exactly_once_sink import Child, launch

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
from events.wire.codec import decode
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointDeclined,
    CheckpointKind,
    CheckpointTriggered,
    Record,
)
from events.wire.topics import Topics

pytestmark = pytest.mark.skipif(
    not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
)

JOB = "copy"
PARTITIONS = 2
BEFORE = [f"task-{i}" for i in range(4)]
AFTER = BEFORE[:2]
WORDS = 5
"""Words per input partition between two checkpoints."""


class RescaledJob:
    """Four tasks, one input partition each, and the coordinator's part, played by the test."""

    def __init__(self, bootstrap: str, prefix: str, root: Path) -> None:
        self.bootstrap = bootstrap
        self.topics = Topics(prefix)
        self.input, self.output = f"{prefix}words", f"{prefix}copies"
        self.root = root
        create_topics(bootstrap, [*self.topics.all], partitions=PARTITIONS)
        create_topics(bootstrap, [self.input], partitions=len(BEFORE))
        create_topics(bootstrap, [self.output], partitions=1)
        self.producer = Producer(producer_config(bootstrap))
        self.acks = Consumer(consumer_config(bootstrap))
        partition = partition_for(job_key(JOB), PARTITIONS)
        self.acks.assign([TopicPartition(t, partition, 0) for t in (self.topics.acks, self.topics.declines)])
        self.received: dict[tuple[int, str], CheckpointAcknowledged] = {}
        self.children: dict[str, Child] = {}
        self.sent: list[str] = []

    def words(self) -> None:
        """``WORDS`` more words on each task's partition; each task has read them."""
        for partition in range(len(BEFORE)):
            for _ in range(WORDS):
                word = f"p{partition}-w{len(self.sent)}"
                self.producer.produce(self.input, word.encode(), partition=partition)
                self.sent.append(word)
        assert self.producer.flush(10) == 0
        for child in self.children.values():
            if child.process.poll() is None:
                child.said(f"processed {len(self.sent) // len(BEFORE)}")

    def start(
        self,
        task: str,
        attempt: int,
        tasks: list[str] | None,
        restored: int | None = None,
        crash: tuple[str, int] | None = None,
        transaction_timeout_ms: int | None = None,
    ) -> Child:
        settings = {
            "bootstrap": self.bootstrap,
            "prefix": self.topics.prefix,
            "job": JOB,
            "task": task,
            "partition": BEFORE.index(task),
            "tasks": tasks,
            "attempt": attempt,
            "input": self.input,
            "output": self.output,
            "restored": restored,
            "crash": crash,
        }
        if transaction_timeout_ms is not None:  # the sink's commit timeout may not exceed it
            settings |= {
                "transaction_timeout_ms": transaction_timeout_ms,
                "timeout_s": transaction_timeout_ms / 1000,
            }
        child = launch(settings)
        self.children[task] = child
        child.said("ready")
        return child

    def send(self, topic: str, record: Record) -> None:
        produce_record(self.producer, topic, record)
        assert self.producer.flush(10) == 0

    def checkpoint(self, checkpoint_id: int, attempt: int, tasks: list[str]) -> None:
        """Checkpoint ``checkpoint_id`` triggered for ``tasks``, acked by each, completed."""
        location = (self.root / f"chk-{checkpoint_id}").as_uri()
        kind = CheckpointKind.CHECKPOINT
        trigger = CheckpointTriggered(JOB, checkpoint_id, attempt, kind, 1, location, tuple(tasks), 2**40)
        self.send(self.topics.checkpoints, trigger)
        self.send(self.topics.barriers, CheckpointBarrier(JOB, checkpoint_id, attempt, kind, 1, location))
        acks = [eventually(lambda t=t: self._ack(checkpoint_id, t), what=f"{t}'s ack") for t in tasks]
        handles = {ack.task_id: ack.state for ack in acks if ack.state is not None}
        offsets = {k: v for ack in acks for k, v in ack.offsets.items()}
        size = sum(h.size_bytes for h in handles.values())
        completed = CheckpointCompleted(
            JOB, checkpoint_id, kind, 2, 1, handles, size, offsets, attempt, location
        )
        self.send(self.topics.checkpoints, completed)

    def _ack(self, checkpoint_id: int, task: str) -> CheckpointAcknowledged | None:
        for msg in consume_available(self.acks, 100, 0.05):
            record = decode(msg.value() or b"")
            if isinstance(record, CheckpointAcknowledged):
                self.received[(record.checkpoint_id, record.task_id)] = record
            elif isinstance(record, CheckpointDeclined):
                pytest.fail(f"{record.task_id} declined checkpoint {record.checkpoint_id}: {record.message}")
        return self.received.get((checkpoint_id, task))

    def committed(self, task: str, checkpoint_id: int) -> None:
        """Wait until ``task`` committed ``checkpoint_id`` and deleted its staged file: the sink says
        "committed" before it deletes, and a kill in between leaves the file to the next recovery."""
        self.children[task].said(f"step committed {checkpoint_id}")
        staged = self.root / f"chk-{checkpoint_id}"
        eventually(lambda: not list(staged.glob(f"{task}.*.out")), what=f"{task}'s staged file deleted")

    def output_values(self, isolation: str = "read_committed") -> Counter[str]:
        consumer = Consumer(consumer_config(self.bootstrap, extra={"isolation.level": isolation}))
        try:
            return Counter(
                (m.value() or b"").decode() for m in read_partition_to_end(consumer, self.output, 0)
            )
        finally:
            consumer.close()

    def close(self) -> None:
        for child in self.children.values():
            if child.process.poll() is None:
                child.kill()
        self.acks.close()


@pytest.fixture
def job(bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[RescaledJob]:
    running = RescaledJob(bootstrap, topic_prefix, tmp_path / "checkpoints")
    try:
        yield running
    finally:
        running.close()


def four_tasks_then_task_3_dies_after_the_completion(
    job: RescaledJob, crash: str, task_3_transaction_timeout_ms: int | None = None
) -> None:
    """Attempt 1: four tasks; checkpoint 1 committed; checkpoint 2 completed, task-3 SIGKILLed at
    ``crash`` of its commit while the others commit; then every process of the attempt dies."""
    for task in BEFORE:
        if task == "task-3":
            job.start(task, 1, BEFORE, crash=(crash, 2), transaction_timeout_ms=task_3_transaction_timeout_ms)
        else:
            job.start(task, attempt=1, tasks=BEFORE)
    job.words()
    job.checkpoint(1, 1, BEFORE)
    job.words()
    job.checkpoint(2, 1, BEFORE)
    for task in BEFORE[:3]:
        job.committed(task, 2)
    job.children["task-3"].said(f"stopped at {crash} 2")
    for child in job.children.values():
        child.kill()


def task_3s_output_of_checkpoint_2(job: RescaledJob) -> set[str]:
    """The words task-3 read between checkpoints 1 and 2."""
    return {word for word in job.sent[len(BEFORE) * WORDS :] if word.startswith("p3-")}


@pytest.mark.parametrize("crash", ["committing", "open"], ids=["before-the-commit", "during-the-commit"])
def test_exactly_once_transactional_output_survives_a_rescale_from_4_to_2_tasks(
    job: RescaledJob, crash: str
) -> None:
    # given: task-3 died after checkpoint 2 completed, its output not committed
    four_tasks_then_task_3_dies_after_the_completion(job, crash)
    # when: the job restores checkpoint 2 with two tasks
    for task in AFTER:
        job.start(task, attempt=2, tasks=AFTER, restored=2).said("recovered commit=[] delete=[]")
    # then: every word's copy is committed once
    every = set(job.sent)
    seen = eventually(job.output_values, lambda seen: set(seen) >= every, what="every copy committed")
    assert seen == Counter(every), f"not exactly once: {seen - Counter(every)}"
    # task-1 took over task-3 (fenced its transactional id, committed its checkpoint 2), task-0 task-2
    job.children["task-1"].said("took over task-3 commit=[2] delete=[]")
    job.children["task-0"].said("took over task-2 commit=[] delete=[]")
    assert sorted(job.root.glob("*/*.out")) == [], "staged files left after their output was committed"
    if crash == "open":  # the dead transaction was aborted: its copies are there twice, uncommitted
        twice = {word for word, n in job.output_values("read_uncommitted").items() if n == 2}
        assert twice == task_3s_output_of_checkpoint_2(job)


def test_without_the_takeover_a_rescale_loses_the_dead_tasks_output(job: RescaledJob) -> None:
    # given: task-3 died after checkpoint 2 completed, before its commit, its transaction sent ahead
    # left open (the broker aborts it after its transaction.timeout.ms: 6 s here)
    four_tasks_then_task_3_dies_after_the_completion(job, "committing", task_3_transaction_timeout_ms=6000)
    # when: the two tasks of the restore recover only their own task ids (no task list)
    for task in AFTER:
        job.start(task, attempt=2, tasks=None, restored=2).said("recovered commit=[] delete=[]")
    # then: task-3's words of checkpoint 2 are nowhere a read_committed reader looks (once the broker
    # aborted that transaction, the reader gets past it)
    lost = task_3s_output_of_checkpoint_2(job)
    assert len(lost) == WORDS
    assert not lost & set(job.output_values()), "the dead task's output was committed without a takeover"
    assert set(job.output_values()) == set(job.sent) - lost
