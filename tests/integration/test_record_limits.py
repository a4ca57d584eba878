"""Sizes against a real broker (docs/design.md, "Record sizes"): no record over its topic's max.message.bytes.

The embedded broker enforces no limit, so the topics are created with Apache Kafka's default
(1,048,588 bytes, as ``cutline topics create`` makes them), the coordinator reads it at start, and
each test reads every topic back and checks that no record exceeds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from support import eventually

from coordinator.service.app import Settings, ensure_topics
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import max_message_bytes
from events.kafka.clients import producer_config
from events.kafka.log import read_to_end
from events.task.completion_metadata import resolve_completion
from events.task.participant import JobDriver
from events.wire.codec import decode, encode
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointKind,
    CheckpointRequested,
    CheckpointTriggered,
    DeadLetter,
    JobCancelRequested,
    JobStatus,
    Record,
    SchedulerStopped,
)
from events.wire.sizes import DEFAULT_MAX_MESSAGE_BYTES, record_size
from events.wire.topics import Topics

LIMIT = DEFAULT_MAX_MESSAGE_BYTES


@pytest.fixture(name="settings")
def _settings(bootstrap: str, topic_prefix: str) -> Settings:
    settings = Settings(bootstrap, topic_prefix, partitions=1)  # every job in one partition
    ensure_topics(settings)
    return settings


@pytest.fixture(name="coordinator")
def _coordinator(settings: Settings) -> Iterator[CoordinatorProcess]:
    process = CoordinatorProcess(settings.bootstrap, settings.prefix)
    process.start()
    yield process
    process.stop()


def _records(bootstrap: str, topic: str) -> list[Record]:
    return [decode(m.value) for m in read_to_end(bootstrap, topic) if m.value]


def _wait_for(what: Callable[[], object], timeout: float, process: CoordinatorProcess) -> object:
    try:
        return eventually(what, timeout=timeout, interval=0.2)
    except AssertionError as error:
        raise AssertionError(f"{error}; coordinator log:\n{process.tail()}") from None


def _assert_every_record_fits(settings: Settings) -> None:
    """Every record of every topic the coordinator and its inputs use is within its topic's limit."""
    topics = settings.topics
    names = [*topics.all, settings.topics.ticks]
    limits = max_message_bytes(settings.bootstrap, names)
    assert {LIMIT} == set(limits.values()), limits
    for name in names:
        for message in read_to_end(settings.bootstrap, name):
            size = record_size(message.key, message.value, message.headers.items())
            assert size <= limits[name], f"a record of {size} bytes in {name}"


def _completions(bootstrap: str, topics: Topics, job: str) -> list[CheckpointCompleted]:
    return [
        r
        for r in _records(bootstrap, topics.checkpoints)
        if isinstance(r, CheckpointCompleted) and r.job_id == job
    ]


def _trigger(bootstrap: str, topics: Topics, job: str) -> CheckpointTriggered | None:
    for record in _records(bootstrap, topics.checkpoints):
        if isinstance(record, CheckpointTriggered) and record.job_id == job:
            return record
    return None


@pytest.mark.slow
def test_a_600_kb_task_id_is_a_bounded_dead_letter_and_the_partition_goes_on(
    settings: Settings, coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    """An ack whose task id is 600 KB ends as one dead letter within the topic's limit (its preview
    cut), and a later checkpoint of another job in the same partition completes."""
    bootstrap, topics = settings.bootstrap, settings.topics
    config = CheckpointConfig(interval_ms=300, location=tmp_path.as_uri())
    first = JobDriver(bootstrap, "first", topics)
    first.running(("a",), config, attempt=1, heartbeats=False)
    _wait_for(lambda: _trigger(bootstrap, topics, "first"), 20, coordinator)
    producer = Producer(producer_config(bootstrap))
    huge = CheckpointAcknowledged("first", 1, 1, "x" * 600_000, int(time.time() * 1000), None, {}, {})
    producer.produce(topics.acks, key=b"first", value=encode(huge))
    producer.flush(10)

    second = JobDriver(bootstrap, "second", topics)
    second.running(("b",), config, attempt=1, heartbeats=False)
    triggered = _wait_for(lambda: _trigger(bootstrap, topics, "second"), 20, coordinator)
    assert isinstance(triggered, CheckpointTriggered)
    ack = CheckpointAcknowledged(
        "second", triggered.checkpoint_id, 1, "b", int(time.time() * 1000), None, {"in:0": 5}, {}
    )
    producer.produce(topics.acks, key=b"second", value=encode(ack))
    producer.flush(10)

    _wait_for(lambda: _completions(bootstrap, topics, "second"), 20, coordinator)
    (letter,) = [r for r in _records(bootstrap, topics.dead_letters) if isinstance(r, DeadLetter)]
    assert letter.reason in ("UNKNOWN_TASK", "UNKNOWN_CHECKPOINT")
    assert letter.value is not None and len(letter.value) < len(encode(huge))
    assert "cut" in letter.message and len(letter.message) < 10_000
    _assert_every_record_fits(settings)


@pytest.mark.slow
def test_a_job_of_100000_tasks_completes_its_checkpoints(
    settings: Settings, coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    """100,000 tasks at Apache Kafka's default limit: the trigger fits, every ack is journaled, and
    the completion (1.3 MB of offsets) is journaled by reference to its metadata object."""
    bootstrap, topics = settings.bootstrap, settings.topics
    tasks = tuple(f"{i:05d}" for i in range(100_000))
    config = CheckpointConfig(interval_ms=500, location=tmp_path.as_uri(), timeout_ms=120_000)
    JobDriver(bootstrap, "big", topics).running(tasks, config, attempt=1, heartbeats=False)
    triggered = _wait_for(lambda: _trigger(bootstrap, topics, "big"), 30, coordinator)
    assert isinstance(triggered, CheckpointTriggered) and 100_000 == len(triggered.tasks)

    producer = Producer(
        producer_config(bootstrap, {"linger.ms": 20, "queue.buffering.max.messages": 200_000})
    )
    now = int(time.time() * 1000)
    for i, task in enumerate(tasks):
        ack = CheckpointAcknowledged("big", triggered.checkpoint_id, 1, task, now, None, {f"in:{i}": i}, {})
        producer.produce(topics.acks, key=b"big", value=encode(ack))
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(30)

    found = _wait_for(lambda: _completions(bootstrap, topics, "big"), 60, coordinator)
    assert isinstance(found, list)
    (completed,) = found
    assert completed.metadata is not None and not completed.offsets
    full = resolve_completion(completed)
    assert {f"in:{i}": i for i in range(100_000)} == dict(full.offsets)
    assert [] == [r for r in _records(bootstrap, topics.dead_letters) if isinstance(r, DeadLetter)]
    _assert_every_record_fits(settings)


def _ack_every_trigger(bootstrap: str, topics: Topics, job: str, tasks: tuple[str, ...]) -> int:
    """Ack every checkpoint of ``job`` triggered so far, by every task; the completions so far."""
    producer = Producer(producer_config(bootstrap))
    now = int(time.time() * 1000)
    for record in _records(bootstrap, topics.checkpoints):
        if isinstance(record, CheckpointTriggered) and record.job_id == job:
            for task in tasks:
                ack = CheckpointAcknowledged(job, record.checkpoint_id, 1, task, now, None, {}, {})
                producer.produce(topics.acks, key=job.encode(), value=encode(ack))
    producer.flush(10)
    return len(_completions(bootstrap, topics, job))


@pytest.mark.slow
def test_a_1_mb_request_id_leaves_the_job_checkpointing_and_cancellable(
    settings: Settings, coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    """A request whose ``request_id`` is 1,048,310 bytes, sent while checkpoint 1 is pending: it is an
    INVALID_REQUEST dead letter, checkpoints go on completing, and a cancel stops the job. (Before the
    bounds the request fitted its topic and queued, but the trigger it became was 40 bytes over the
    journal's limit: every decision that would start it, the completing ack, every tick, the cancel,
    was refused, and the job made no checkpoint again.)"""
    bootstrap, topics, job, tasks = settings.bootstrap, settings.topics, "wedge", ("a", "b")
    config = CheckpointConfig(interval_ms=300, location=tmp_path.as_uri(), max_concurrent=1)
    driver = JobDriver(bootstrap, job, topics, producer_extra={"message.max.bytes": 2_000_000})
    driver.running(tasks, config, attempt=1, heartbeats=False)
    _wait_for(lambda: _trigger(bootstrap, topics, job), 20, coordinator)
    now = int(time.time() * 1000)
    driver.request(CheckpointRequested(job, CheckpointKind.CHECKPOINT, now, request_id="r" * 1_048_310))
    letter = _wait_for(
        lambda: [r for r in _records(bootstrap, topics.dead_letters) if isinstance(r, DeadLetter)],
        20,
        coordinator,
    )
    assert isinstance(letter, list) and ["INVALID_REQUEST"] == [d.reason for d in letter]

    _wait_for(lambda: _ack_every_trigger(bootstrap, topics, job, tasks) >= 3, 30, coordinator)
    driver.request(JobCancelRequested(job, int(time.time() * 1000), request_id="cancel-1"))

    def canceling() -> bool:
        stops = [r for r in _records(bootstrap, topics.checkpoints) if isinstance(r, SchedulerStopped)]
        return any(s.job_id == job and s.status is JobStatus.CANCELLING for s in stops)

    _wait_for(canceling, 20, coordinator)
    _assert_every_record_fits(settings)
