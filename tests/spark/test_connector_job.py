"""Checkpoints on Spark's own kafka connector (docs/spark.md, "Checkpoints on Spark's own kafka
connector"): the keyed word count reading ``format("kafka")`` (``JobSettings(source="kafka")``),
with a real broker, a real coordinator process and a real Spark.

The drivers are child processes (``connector_session.py job``): the connector's jars reach a driver
only when its JVM starts, and this process's JVM, if any, has none. This module never starts the
shared ``spark`` session.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from connector_jobs import (
    SHUFFLE,
    STARTS_S,
    batch_ends,
    committed,
    completions,
    driver,
    spark_starting_offsets,
)
from connector_session import ConnectorDriver
from wordfeed import PARTITIONS, Input, every, wait

from coordinator.service.supervisor import CoordinatorProcess
from spark_tasks.connector_cuts import SOURCE_TASK
from spark_tasks.keyed import keyed_task_id
from spark_tasks.wordcount import final_counts, read_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
"""Two driver starts on a loaded 2-core machine, each up to :data:`STARTS_S`."""


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module."""
    return f"t{uuid.uuid4().hex[:8]}."


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
