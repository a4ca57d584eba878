"""Spark Connect (docs/spark.md, "Spark Connect"): the keyed word count under ``CheckpointedJob``
through a Connect session (``SparkSession.builder.remote``) on a Connect server started from the
installed PySpark, with a real broker and a real coordinator process. No classic session starts in
this module: the job's status comes from the Connect client's listener, with no JVM in this process.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from connect_server import ConnectServer
from wordfeed import PARTITIONS, Input, wait

from coordinator.service.supervisor import CoordinatorProcess
from events.task.participant import JobDriver
from events.wire.records import CheckpointConfig, JobStatus, SchedulerStarted, SchedulerStopped
from events.wire.topics import Topics
from spark_tasks.job import CheckpointedJob, JobSettings
from spark_tasks.keyed import keyed_task_id
from spark_tasks.session import is_connect_session
from spark_tasks.sink import CutFileSink
from spark_tasks.wordcount import KEYED_WORD_COUNT, final_counts, read_counts

SHUFFLE = 2
"""Shuffle partitions: the cut across a shuffle, at the least cost on 2 cores."""


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module."""
    return f"t{uuid.uuid4().hex[:8]}."


def _start(job: CheckpointedJob, out: Path) -> Any:
    counts = job.stream_keyed(KEYED_WORD_COUNT)
    sink = CutFileSink(job, out)  # pickled to the server, which runs foreachBatch functions
    return job.start(counts.writeStream.foreachBatch(sink).trigger(processingTime="200 milliseconds"))


def test_a_keyed_word_count_checkpoints_and_restores_exactly_through_spark_connect(
    connect_server: ConnectServer,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    connect_spark: Any,
    tmp_path: Path,
    given: Input,
) -> None:
    """Given the keyed word count over 4 input partitions and 2 shuffle partitions on a Spark
    Connect session, the job is RUNNING, its checkpoints complete with one manifest per shuffle
    partition and the offsets of every input partition, and its raw output is the exact count. The
    next attempt, through Connect too, restores the latest checkpoint and counts on exactly; each
    attempt ends CANCELED."""
    words, job_id = given.words, given.job_id
    assert is_connect_session(connect_spark)
    settings = JobSettings(
        job_id=job_id,
        bootstrap=bootstrap,
        topics=(given.topic,),
        config=CheckpointConfig(
            interval_ms=1000, location=(tmp_path / "checkpoints").as_uri(), timeout_ms=10_000
        ),
        work_dir=tmp_path / "work",
        topic_prefix=topic_prefix,
        keyed_partitions=SHUFFLE,
    )
    out = tmp_path / "out"
    words.produce(100)
    with CheckpointedJob(connect_spark, settings) as first:
        _start(first, out)
        first.wait_for_running(60)
        words.produce(100)
        first.wait_for_completed(2, timeout=90)
        wait(lambda: final_counts(out) == dict(words.produced), "every word counted", 60)
        words.produce(50)  # read, or not, before the stop: the restore replays what the cut misses
        first.stop()
        assert first.query.exception() is None
    assert [] == first.ignored
    latest = first.completed[-1]  # the journal thread has ended: every completion is there
    assert sorted(latest.handles) == [keyed_task_id(i) for i in range(SHUFFLE)]
    assert sorted(latest.offsets) == [f"{given.topic}:{p}" for p in range(PARTITIONS)]

    with CheckpointedJob(connect_spark, settings) as second:
        assert second.restored is not None
        assert (second.restored.checkpoint_id, second.attempt) == (latest.checkpoint_id, 2)
        _start(second, out)
        second.wait_for_running(60)
        words.produce(50)
        wait(lambda: final_counts(out) == dict(words.produced), "every word counted after the restore", 90)
        second.stop()
        assert second.query.exception() is None
    # the raw rows: the last count of each word is its count in the whole input, and what the rows
    # added sums to it (a row the restore wrote twice, or lost, would show)
    assert final_counts(out) == dict(words.produced)
    assert read_counts(out) == words.produced
    journal = JobDriver(bootstrap, job_id, Topics(topic_prefix)).journal((SchedulerStarted, SchedulerStopped))
    assert [(1, None), (1, JobStatus.CANCELED), (2, None), (2, JobStatus.CANCELED)] == [
        (e.attempt, getattr(e, "status", None)) for e in journal
    ]
