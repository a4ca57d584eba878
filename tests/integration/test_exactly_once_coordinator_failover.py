"""Exactly-once output across a coordinator failover in the middle of a checkpoint, on Apache Kafka
(docs/exactly-once.md, "Every crash point, tested"): two ``cutline coordinator`` workers in one
group; a one-task participant copies its input to an output topic through an ExactlyOnceSink
(exactly_once_app.py) under their checkpoints. The worker that decides the job's partition is
SIGKILLed when the task's ack of a checkpoint reaches it, before it decides (``ack``), or once it
decided the completion, before the completion is written (``completion``). The other worker takes
the partition over and completes or expires that checkpoint; either way a read_committed reader sees
every input's copy exactly once, and no staged file is left.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from dying_worker import DyingWorker, owner_of
from support import create_protocol_topics, eventually, on_apache_kafka
from test_exactly_once_sink import Child, launch

from coordinator.service.supervisor import stop_all
from events.dev.broker import create_topics
from events.kafka.clients import consumer_config, producer_config, read_partition_to_end
from events.task.participant import JobDriver
from events.wire.records import CheckpointAborted, CheckpointCompleted, CheckpointConfig
from events.wire.topics import Topics

pytestmark = pytest.mark.skipif(
    not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
)

JOB = "copy"
TASK = "task-0"
SESSION_TIMEOUT = float(os.environ["CUTLINE_SESSION_TIMEOUT"])


class FailoverJob:
    """Two coordinator workers, the job's driver and its one participant, and what it copies."""

    def __init__(self, bootstrap: str, prefix: str, root: Path, variant: str = "") -> None:
        self.bootstrap = bootstrap
        self.topics: Topics = create_protocol_topics(bootstrap, prefix)
        self.input, self.output = f"{prefix}words", f"{prefix}copies"
        create_topics(bootstrap, [self.input, self.output], partitions=1)
        self.workers = [DyingWorker(bootstrap, prefix) for _ in range(2)]
        try:
            for worker in self.workers:
                worker.launch()
            for worker in self.workers:
                worker.wait_ready(timeout=90)
        except BaseException:
            stop_all(self.workers)
            raise
        self.producer = Producer(producer_config(bootstrap))
        self.sent = 0
        settings = {
            "bootstrap": bootstrap,
            "prefix": prefix,
            "job": JOB,
            "task": TASK,
            "attempt": 1,
            "input": self.input,
            "output": self.output,
            "variant": variant,
            # resnapshot: the checkpoint whose barrier comes again, written by the owner before it dies
            "resent": [str(worker.died) for worker in self.workers],
        }
        self.settings = settings
        self.child: Child = launch(settings)
        self.child.said("ready")
        self.driver = JobDriver(bootstrap, JOB, self.topics)
        # checkpoints every 0.5 s; one the failover leaves pending expires after 20 s
        self.config = CheckpointConfig(
            interval_ms=500, timeout_ms=20_000, tolerable_failures=10, location=root.as_uri()
        )
        self.driver.running((TASK,), self.config, attempt=1)
        self.root = root

    def restart(self) -> Child:
        """The participant of attempt 2, restored from the latest completed checkpoint, and the
        driver's RUNNING for it."""
        latest = self.driver.latest_completed()
        assert latest is not None
        self.child = launch({**self.settings, "attempt": 2, "restored": latest.checkpoint_id})
        self.child.said("ready")
        self.driver.running((TASK,), self.config, 2, latest.checkpoint_id, latest.location)
        return self.child

    def words(self, count: int) -> None:
        for _ in range(count):
            self.producer.produce(self.input, f"w{self.sent}".encode())
            self.sent += 1
        assert self.producer.flush(10) == 0
        self.child.said(f"processed {self.sent}")

    def output_values(self, isolation: str = "read_committed") -> Counter[str]:
        consumer = Consumer(consumer_config(self.bootstrap, extra={"isolation.level": isolation}))
        try:
            return Counter(
                (m.value() or b"").decode() for m in read_partition_to_end(consumer, self.output, 0)
            )
        finally:
            consumer.close()

    def every_copy_committed(self) -> Counter[str]:
        every = {f"w{i}" for i in range(self.sent)}
        seen: Counter[str] = eventually(
            self.output_values, lambda seen: set(seen) >= every, timeout=90, what="every copy committed"
        )
        return seen

    def owner(self) -> DyingWorker:
        return owner_of(self.workers, JOB, timeout=60)

    def decisions(self, checkpoint_id: int) -> list[CheckpointCompleted | CheckpointAborted]:
        """The journal's completions and aborts of ``checkpoint_id``."""
        kinds = (CheckpointCompleted, CheckpointAborted)
        return [
            e for e in self.driver.journal(kinds) if isinstance(e, kinds) and e.checkpoint_id == checkpoint_id
        ]

    def close(self) -> None:
        if self.child.process.poll() is None:
            self.child.kill()
        self.driver.close()
        stop_all(self.workers)


@pytest.fixture
def job(bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[FailoverJob]:
    running = FailoverJob(bootstrap, topic_prefix, tmp_path / "checkpoints")
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def broken_job(bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[FailoverJob]:
    """The job with a participant that snapshots a barrier sent again (exactly_once_app.py's
    ``resnapshot``): broken on purpose."""
    running = FailoverJob(bootstrap, topic_prefix, tmp_path / "checkpoints", variant="resnapshot")
    try:
        yield running
    finally:
        running.close()


def owner_killed_mid_checkpoint(job: FailoverJob, point: str = "ack") -> tuple[DyingWorker, int]:
    """Ten words committed, ten more read; the worker deciding the job's partition SIGKILLed at
    ``point`` of the first checkpoint whose staged output holds some of those ten (asked before they
    are sent: no checkpoint takes them unseen): it and the checkpoint's id."""
    job.words(10)
    job.every_copy_committed()
    victim = job.owner()
    victim.ask(point, JOB, job.sent)
    job.words(10)
    died = eventually(victim.death, timeout=60, what=f"the owner to die at {point}")
    assert died is not None
    eventually(lambda: victim._process is not None and victim._process.poll() is not None, what="it gone")
    return victim, died


@pytest.mark.parametrize("point", ["ack", "completion"], ids=["ack-arrived", "completion-decided"])
def test_exactly_once_when_the_coordinator_fails_over_mid_checkpoint(job: FailoverJob, point: str) -> None:
    # given: the job checkpoints under two workers, its first words committed
    # when: the worker deciding the job's partition dies at ``point`` of a checkpoint whose staged
    # output holds the words read since the last commit
    victim, died = owner_killed_mid_checkpoint(job, point)
    # then: the other worker takes the partition over and completes that checkpoint, or expires it
    # (its output then goes with the next completion)
    survivor = job.owner()
    assert survivor is not victim
    decided = eventually(
        lambda: job.decisions(died),
        timeout=SESSION_TIMEOUT + 60,
        what=f"checkpoint {died} completed or aborted after the failover",
    )
    assert len(decided) == 1, f"checkpoint {died} decided twice: {decided}"
    # and the sink commits the output of every word read so far, once, and goes on doing so
    job.words(10)
    seen = job.every_copy_committed()
    assert seen == Counter({f"w{i}": 1 for i in range(job.sent)}), f"not exactly once: {seen}"
    # deleted after the commit that made the output visible
    eventually(lambda: not list(job.root.glob(f"**/chk-{died}/*.out")), what="its staged file deleted")
    # no process died with a transaction open; a transaction sent ahead may have been aborted (its
    # checkpoint expired, or it waited past half of transaction.timeout.ms) and its records committed
    # from the staged copy: an aborted copy at most once beside the committed one
    extra = job.output_values("read_uncommitted") - seen
    assert set(extra.values()) <= {1}, f"aborted more than once: {extra}"


def test_exactly_once_when_the_participant_dies_too_during_the_coordinator_failover(job: FailoverJob) -> None:
    # given: the owner died when the participant's ack of checkpoint N reached it (N's output staged)
    _, died = owner_killed_mid_checkpoint(job)
    # when: the participant is SIGKILLed too, before the other worker takes the partition over
    first = job.child
    first.kill()
    # then: the other worker decides N without it (the ack is in the acks topic: completed; or expired)
    decided = eventually(lambda: job.decisions(died), timeout=SESSION_TIMEOUT + 60, what=f"{died} decided")
    # and attempt 2, restored from the latest completed checkpoint, commits N's output (with any
    # earlier one the participant had not committed yet) if N completed, or deletes it and reads N's
    # input again
    second = job.restart()
    recovered = next(line for line in second.lines if line.startswith("recovered "))
    lists = re.fullmatch(r"recovered commit=(\[.*\]) delete=(\[.*\])", recovered)
    assert lists is not None, recovered
    commit, delete = (json.loads(found) for found in lists.groups())
    assert died in (commit if isinstance(decided[0], CheckpointCompleted) else delete), recovered
    job.words(10)
    seen = job.every_copy_committed()
    assert seen == Counter({f"w{i}": 1 for i in range(job.sent)}), f"not exactly once: {seen}"
    # the transaction it had sent ahead (N's records) was aborted: each of those copies is there once
    # more, uncommitted, and nothing else
    extra = job.output_values("read_uncommitted") - seen
    assert set(extra.values()) <= {1}, f"aborted more than one transaction sent ahead: {extra}"
    assert first.lines.count(f"step staged {died}") == 1


def test_a_participant_that_snapshots_a_barrier_sent_again_loses_output_in_a_failover(
    broken_job: FailoverJob,
) -> None:
    job = broken_job
    # given: a participant that takes a new cut for a barrier sent again (instead of its first answer)
    # when: the owner dies when its ack arrives; the new owner sends the pending checkpoint's barrier
    # again, and the participant stages what it read since (nothing) over that checkpoint's output
    victim, died = owner_killed_mid_checkpoint(job)
    lost = {f"w{i}" for i in range(10, victim.reached())}  # the words its staged output held
    # then: once later words are committed, that checkpoint's words are nowhere: the test above fails
    job.words(10)
    seen = eventually(job.output_values, lambda seen: f"w{job.sent - 1}" in seen, timeout=90, what="w29")
    said = "\n".join(line for line in job.child.lines if not line.startswith("processed"))
    assert lost and lost.isdisjoint(seen), f"checkpoint {died}'s output was committed: {seen}\n{said}"
