"""Checkpoints on Spark's own kafka connector (docs/spark.md, "Checkpoints on Spark's own kafka
connector"): the keyed word count reading ``format("kafka")`` (``JobSettings(source="kafka")``),
with a real broker, a real coordinator process and a real Spark.

The drivers are child processes (``connector_session.py job``): the connector's jars reach a driver
only when its JVM starts, and this process's JVM, if any, has none. This module never starts the
shared ``spark`` session.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from connector_session import ConnectorDriver
from wordfeed import PARTITIONS, Input, every, wait

from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.clients import consumer_config
from events.task.participant import JobDriver
from events.wire.records import CheckpointCompleted
from events.wire.topics import Topics
from spark_tasks.connector_cuts import SOURCE_TASK, read_logged_batch
from spark_tasks.keyed import keyed_task_id
from spark_tasks.wordcount import final_counts, read_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
"""Two driver starts on a loaded 2-core machine, each up to :data:`STARTS_S`."""

SHUFFLE = 2
STARTS_S = 300.0
"""How long a driver may take to start Spark and run its first batch: 30 s on an idle 2-core
machine, minutes when other processes keep its cores busy."""


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module."""
    return f"t{uuid.uuid4().hex[:8]}."


def driver(given: Input, bootstrap: str, prefix: str, tmp_path: Path, n: int, *extra: str) -> ConnectorDriver:
    args = [
        "--bootstrap", bootstrap, "--job", given.job_id, "--topic", given.topic, "--topic-prefix", prefix,
        "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
        "--location", (tmp_path / "checkpoints").as_uri(), "--keyed", str(SHUFFLE), "--interval-ms", "1000",
        "--conf", "spark.sql.streaming.minBatchesToRetain=100000",  # every batch's offsets stay to compare
        *extra,
    ]  # fmt: skip
    return ConnectorDriver(args, tmp_path / f"driver-{n}.log").start()


def completions(bootstrap: str, prefix: str, job_id: str, attempt: int) -> list[CheckpointCompleted]:
    """The completed checkpoints of the job's ``attempt``, in the journal's order."""
    return [c for c in JobDriver(bootstrap, job_id, Topics(prefix)).completions() if c.attempt == attempt]


def committed(bootstrap: str, group: str, topic: str) -> dict[str, int]:
    """The consumer group's committed offsets, as a checkpoint names them."""
    consumer = Consumer(consumer_config(bootstrap, group))
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    finally:
        consumer.close()
    return {f"{tp.topic}:{tp.partition}": tp.offset for tp in found if tp.offset >= 0}


def batch_ends(spark_checkpoint: Path) -> list[dict[str, int]]:
    """The Kafka source's end offsets of every micro-batch in Spark's offset log, as a checkpoint
    names offsets."""
    ends = []
    for batch_id in sorted(int(p.name) for p in (spark_checkpoint / "offsets").iterdir() if p.name.isdigit()):
        batch = read_logged_batch(spark_checkpoint, batch_id)
        assert batch is not None
        ends.append({f"{t}:{p}": offset for (t, p), offset in batch.offsets.items()})
    return ends


def spark_starting_offsets(spark_checkpoint: Path) -> dict[str, int]:
    """Where the Kafka source's first batch started: the initial offsets the connector writes to its
    metadata log (``sources/0/0``: a zero byte, ``v1``, then the JSON)."""
    text = (spark_checkpoint / "sources" / "0" / "0").read_bytes().lstrip(b"\0").decode()
    offsets: Mapping[str, Mapping[str, int]] = json.loads(text.split("\n", 1)[1])
    return {f"{topic}:{p}": offset for topic, parts in offsets.items() for p, offset in parts.items()}


def test_connector_keyed_job_cuts_at_batch_ends_commits_its_group_and_restores_exactly_after_a_kill(
    bootstrap: str, topic_prefix: str, coordinator: CoordinatorProcess, tmp_path: Path, given: Input
) -> None:
    """Given the keyed word count on Spark's kafka connector over 4 input partitions and 2 shuffle
    partitions, checkpointing every second while words keep coming: each checkpoint's cut is the end
    of one micro-batch on all 4 partitions at once (Spark's offset log), acked by the driver's source
    task beside one manifest per shuffle partition, and the job's consumer group holds the latest
    completed cut. When its driver is SIGKILLed, the next attempt's connector starts exactly at the
    restored checkpoint's offsets, and the raw output counts every word exactly once."""
    words, job_id, out = given.words, given.job_id, tmp_path / "out"
    words.produce(60)
    first = driver(given, bootstrap, topic_prefix, tmp_path, 1)
    second: ConnectorDriver | None = None
    producing = threading.Event()
    feeder = threading.Thread(target=every, args=(0.2, producing, lambda: words.produce(3)), daemon=True)
    try:
        wait(lambda: bool(first.seen("running")), "the first attempt RUNNING", STARTS_S)
        assert [keyed_task_id(i) for i in range(SHUFFLE)] + [SOURCE_TASK] == first.seen("running")[0]["tasks"]
        feeder.start()
        wait(lambda: len(first.seen("completed")) >= 3, "3 checkpoints of the first attempt", 120)
        producing.set()
        feeder.join(10)
        own = completions(bootstrap, topic_prefix, job_id, 1)
        ends = batch_ends(tmp_path / "work" / "attempt-1" / "spark")
        starts = [{f"{given.topic}:{p}": 0 for p in range(PARTITIONS)}, *ends]
        for completed in own:
            assert sorted(completed.handles) == [keyed_task_id(i) for i in range(SHUFFLE)]
            assert dict(completed.offsets) in starts, (
                f"checkpoint {completed.checkpoint_id} is no batch's end"
            )
        wait(
            lambda: (
                committed(bootstrap, job_id, given.topic)
                == dict(completions(bootstrap, topic_prefix, job_id, 1)[-1].offsets)
            ),
            "the group's offsets: the latest completed cut",
            30,
        )

        first.kill()
        words.produce(40)
        second = driver(given, bootstrap, topic_prefix, tmp_path, 2)
        wait(lambda: bool(second.seen("running")), "the second attempt RUNNING", STARTS_S)
        restored = second.seen("restored")[0]
        latest = completions(bootstrap, topic_prefix, job_id, 1)[-1]
        assert latest.checkpoint_id == restored["checkpoint_id"]
        assert dict(latest.offsets) == spark_starting_offsets(tmp_path / "work" / "attempt-2" / "spark")
        words.produce(40)
        wait(lambda: final_counts(out) == dict(words.produced), "every word counted after the restore", 120)
        assert 0 == second.stop()
    finally:
        producing.set()
        for running in (first, second):
            if running is not None:
                running.stop(30)
    # the raw rows: what they added sums to each word's count in the input, so a row written twice
    # (the restore replaying before its cut) or lost (after it) shows
    assert read_counts(out) == words.produced
