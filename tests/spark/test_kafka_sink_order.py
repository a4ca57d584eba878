"""A Spark exactly-once Kafka sink called after something ran its batch (docs/exactly-once.md, "The
Spark sink"), on a real local Spark, Apache Kafka and a coordinator process.

``foreachBatch`` must call the sink first: it stages the output before a barrier's cut before the
barrier batch runs and its tasks ack. A function that runs the batch first (``collect()``) lets the
tasks snapshot and ack, and the checkpoint may complete, before that output is staged. The sink
finds the barrier's task snapshots already in the checkpoint's location: it stages all the same and
fails the query with ``OutputStagedLate``, saying to call it first; the committer, if it saw the
completion before the file, waits for the file and commits it once. A ``read_committed`` reader sees
every word counted exactly once after a second attempt that calls the sink first.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from support import on_apache_kafka
from test_kafka_sink import Feeder, _settings, every_word_counted
from wordfeed import Input, wait

from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import create_topics
from spark_tasks.job import CheckpointedJob
from spark_tasks.kafka_sink import ExactlyOnceKafkaSink
from spark_tasks.kafka_source import barrier_of, entry_barrier
from spark_tasks.sink import _offset_line

pytestmark = pytest.mark.skipif(
    not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
)


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module's tests."""
    return f"t{uuid.uuid4().hex[:8]}."


class CollectFirst:
    """A misused ``foreachBatch``: it runs the batch (``collect()``: a barrier batch's tasks snapshot
    and ack) and only then calls the sink. With ``after_completion`` it also waits, at the first barrier
    batch, until the sink's committer has seen that checkpoint complete without its output."""

    def __init__(self, job: CheckpointedJob, sink: ExactlyOnceKafkaSink, *, after_completion: bool) -> None:
        self.job, self.sink, self.after_completion = job, sink, after_completion
        self.barrier_id: int | None = None

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        batch_df.collect()
        entry = barrier_of(_offset_line(self.job.work_dir / "spark", batch_id))
        barrier = None if entry is None else entry_barrier(self.job.settings.job_id, entry)
        if barrier is not None and barrier.attempt == self.job.attempt and self.barrier_id is None:
            self.barrier_id = barrier.checkpoint_id
            if self.after_completion:
                wait(lambda: self.sink.waiting_for == barrier.checkpoint_id, "the committer's wait", 60)
        self.sink(batch_df, batch_id)


def _start(job: CheckpointedJob, function: Any) -> None:
    from pyspark.sql.functions import col, struct, to_json

    from spark_tasks.wordcount import WORD_COUNT

    rows = struct("topic", "partition", "offset", "word", "added", "count")
    out = job.stream(WORD_COUNT).select(col("word").alias("key"), to_json(rows).alias("value"))
    job.start(out.writeStream.foreachBatch(function).trigger(processingTime="200 milliseconds"))


def _failure_of(job: CheckpointedJob, timeout: float) -> BaseException | None:
    """What ended the query within ``timeout`` s (None: it had not failed by then)."""
    try:
        job.await_termination(timeout)
    except Exception as exc:
        return exc
    return None


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "after_completion",
    [
        pytest.param(False, id="sink-right-after-the-batch"),
        pytest.param(True, id="sink-after-the-completion"),
    ],
)
def test_exactly_once_a_sink_called_after_its_batch_ran_fails_the_query_and_loses_nothing(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    given: Input,
    tmp_path: Path,
    after_completion: bool,
) -> None:
    output = f"{given.topic}-counts"
    create_topics(bootstrap, [output], partitions=1)
    settings = _settings(bootstrap, topic_prefix, given, tmp_path, 20_000)
    given.words.produce(40)
    # given: attempt 1's foreachBatch runs the batch before it calls the sink
    with CheckpointedJob(spark, settings) as job:
        sink = ExactlyOnceKafkaSink(job, topic=output)
        misused = CollectFirst(job, sink, after_completion=after_completion)
        try:
            _start(job, misused)
            # when: a barrier batch reaches the sink after its tasks snapshotted
            with Feeder(given):
                failure = _failure_of(job, 300)
        finally:
            sink.close()
    first = sink

    # when: attempt 2 restores and calls the sink first, with more input
    with CheckpointedJob(spark, settings) as job:
        assert job.attempt == 2
        with ExactlyOnceKafkaSink(job, topic=output) as sink:
            _start(job, sink)
            with Feeder(given):
                wait(lambda: sink.committed != [], "a commit of attempt 2", 180)
            seen = every_word_counted(bootstrap, output, given.words.produced)
            job.stop()
    # then: nothing of the late checkpoint was lost or sent twice
    assert seen.twice == set(), f"rows committed twice: {sorted(seen.twice)[:5]}"
    assert seen.counted == given.words.produced
    # and attempt 1's query failed at its first barrier batch, saying what to do
    assert failure is not None, "the misused sink did not fail the query"
    assert "OutputStagedLate" in str(failure)
    assert "Call sink(batch_df, batch_id) first in foreachBatch" in str(failure)
    late = misused.barrier_id
    assert late is not None
    if after_completion:  # and the committer, which saw the completion first, committed the late file
        assert late in first.committed
        assert first.staged_late == [late]
    assert sink.staged_late == []  # attempt 2 calls the sink first
