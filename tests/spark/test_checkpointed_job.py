"""Spark jobs that checkpoint with cutline (DESIGN §5): a real local Spark, a real broker and a
real coordinator process. The job is the word count of spark_tasks/wordcount.py."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from coordinator.supervisor import CoordinatorProcess
from events.broker import create_topics
from events.kafka import consumer_config, producer_config
from events.participant import JobDriver
from events.records import (
    CheckpointConfig,
    JobStatus,
    SchedulerStarted,
    SchedulerStopped,
    TaskAcknowledged,
)
from events.topics import Topics
from spark_tasks.job import CheckpointedJob, JobSettings
from spark_tasks.wordcount import WORD_COUNT, read_counts, write_batch

PARTITIONS = 4
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


@pytest.fixture
def coordinator(bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[CoordinatorProcess]:
    with CoordinatorProcess(bootstrap, topic_prefix, log_path=tmp_path / "coordinator" / "log") as process:
        yield process


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _every(seconds: float, stop: threading.Event, action: Callable[[], None]) -> None:
    while not stop.wait(seconds):
        action()


class Words:
    """Produces lines of words to the input topic and counts what it produced."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.produced: Counter[str] = Counter()
        self._producer = Producer(producer_config(bootstrap, {"linger.ms": 5}))
        self._n = 0

    def produce(self, lines: int) -> None:
        for _ in range(lines):
            words = [WORDS[(self._n * 7 + i) % len(WORDS)] for i in range(1 + self._n % 3)]
            self._producer.produce(self.topic, value=" ".join(words).encode(), partition=self._n % PARTITIONS)
            self.produced.update(words)
            self._n += 1
        assert 0 == self._producer.flush(30)


def _settings(bootstrap: str, prefix: str, tmp_path: Path, job_id: str, **config: Any) -> JobSettings:
    return JobSettings(
        job_id=job_id,
        bootstrap=bootstrap,
        topics=(prefix + "words",),
        config=CheckpointConfig(
            interval_ms=config.pop("interval_ms", 1000),
            location=config.pop("location", (tmp_path / "checkpoints").as_uri()),
            timeout_ms=config.pop("timeout_ms", 10_000),
            **config,
        ),
        work_dir=tmp_path / "work" / job_id,
        topic_prefix=prefix,
    )


def _start(spark: Any, job: CheckpointedJob, out: Path) -> Any:
    counts = job.stream(WORD_COUNT)
    sink = write_batch(out, job.attempt)
    return job.start(counts.writeStream.foreachBatch(sink).trigger(processingTime="200 milliseconds"))


def _journal(bootstrap: str, prefix: str, job_id: str, *kinds: type) -> list[Any]:
    return JobDriver(bootstrap, job_id, Topics(prefix)).journal(kinds)


def test_word_count_checkpoints_every_second_with_one_ack_per_partition(
    spark: Any, bootstrap: str, topic_prefix: str, coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    topic = topic_prefix + "words"
    create_topics(bootstrap, [topic], partitions=PARTITIONS)
    words = Words(bootstrap, topic)
    job_id = "wc-" + topic_prefix.rstrip(".")
    out = tmp_path / "out"
    words.produce(200)

    with CheckpointedJob(spark, _settings(bootstrap, topic_prefix, tmp_path, job_id)) as job:
        assert job.restored is None and job.attempt == 1
        assert job.tasks == [f"{topic}-{p}" for p in range(PARTITIONS)]
        _start(spark, job, out)
        job.wait_for_running(60)
        stop = threading.Event()
        feeder = threading.Thread(target=lambda: _every(0.1, stop, lambda: words.produce(20)))
        feeder.start()
        try:
            job.wait_for_completed(3, timeout=60)
        finally:
            stop.set()
            feeder.join()
        _wait(lambda: read_counts(out) == words.produced, "every word counted")
        completed = job.wait_for_completed(4, timeout=30)
        job.stop()
        assert job.query.exception() is None

    # every checkpoint: one handle and one ack per partition, offsets of every partition
    acks = _journal(bootstrap, topic_prefix, job_id, TaskAcknowledged)
    for checkpoint in completed:
        assert sorted(checkpoint.handles) == job.tasks
        assert sorted(checkpoint.offsets) == [f"{topic}:{p}" for p in range(PARTITIONS)]
        mine = [a.task_id for a in acks if a.checkpoint_id == checkpoint.checkpoint_id]
        assert sorted(mine) == job.tasks
    ids = [c.checkpoint_id for c in completed]
    assert ids == sorted(set(ids))
    # the consumer group's committed offsets are the last completed checkpoint's
    last = completed[-1]
    consumer = Consumer(consumer_config(bootstrap, job_id))
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    finally:
        consumer.close()
    assert {f"{tp.topic}:{tp.partition}": tp.offset for tp in committed} == dict(last.offsets)
    # the listener's job status: RUNNING with one task per partition and the config, then CANCELED
    [started] = _journal(bootstrap, topic_prefix, job_id, SchedulerStarted)
    assert (started.attempt, list(started.tasks), started.config) == (1, job.tasks, job.settings.config)
    stopped = _journal(bootstrap, topic_prefix, job_id, SchedulerStopped)
    assert [(s.attempt, s.status) for s in stopped] == [(1, JobStatus.CANCELED)]
