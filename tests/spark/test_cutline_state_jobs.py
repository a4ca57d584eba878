"""A real keyed job's state, read back and written (issue 50): the keyed word count with a real local
Spark, a real broker and a real coordinator process.

Read: what ``spark.read.format("cutline-state")`` gives at each of the job's checkpoints is a recount
of the input up to the checkpoint's offsets, read back from the broker, across incremental
checkpoints (delta pieces); the diff of two checkpoints is the input between their offsets.
Write: a savepoint bootstrapped from a DataFrame of counts (a recount of the input up to chosen
offsets) restores into the job, which counts on exactly from those offsets; re-keyed for a step
with another key function it restores into that step, and without the re-keying that step refuses it.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from keyed_checkpoints import UPPER_WORD_COUNT
from wordfeed import PARTITIONS, Input, every, wait

from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.clients import consumer_config
from events.task.participant import read_checkpoint_metadata
from events.task.state_view import compare, state_rows
from events.wire.records import CheckpointConfig, CheckpointKind
from spark_tasks.job import CheckpointedJob, JobSettings, RestoreRefused
from spark_tasks.keyed import read_manifest
from spark_tasks.sink import CutFileSink
from spark_tasks.state_writer import Rekeying, transform_savepoint, write_new_savepoint
from spark_tasks.wordcount import KEYED_WORD_COUNT, final_counts, read_counts

pytestmark = pytest.mark.spark

SHUFFLE = 4


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module's tests."""
    return f"st{uuid.uuid4().hex[:8]}."


def _settings(
    given: Input, bootstrap: str, prefix: str, tmp_path: Path, job_id: str, **kwargs: Any
) -> JobSettings:
    return JobSettings(
        job_id=job_id,
        bootstrap=bootstrap,
        topics=(given.topic,),
        # every checkpoint kept (retained): the test reads them after the job; tolerant of a
        # checkpoint that expires on a busy machine (the tests are about state, not failures)
        config=CheckpointConfig(
            interval_ms=1000,
            location=(tmp_path / "checkpoints").as_uri(),
            timeout_ms=30_000,
            tolerable_failures=10,
            retained=50,
        ),
        work_dir=tmp_path / "work" / job_id,
        topic_prefix=prefix,
        keyed_partitions=SHUFFLE,
        **kwargs,
    )


def _start(job: CheckpointedJob, out: Path, step: Any = KEYED_WORD_COUNT) -> Any:
    counts = job.stream_keyed(step)
    return job.start(
        counts.writeStream.foreachBatch(CutFileSink(job, out)).trigger(processingTime="200 milliseconds")
    )


def _recount(bootstrap: str, topic: str, offsets: Mapping[str, int]) -> Counter[str]:
    """The words of the input records below ``offsets`` (``topic:partition`` → offset), read from the
    broker: what a count of the input up to a cut holds."""
    ends = {int(key.rsplit(":", 1)[1]): end for key, end in offsets.items() if end > 0}
    counted: Counter[str] = Counter()
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, partition, 0) for partition in ends])
    deadline = time.monotonic() + 60
    try:
        while ends:
            assert time.monotonic() < deadline, f"records below {offsets} not read within 60 s"
            message = consumer.poll(1.0)
            if message is None or message.error() is not None:
                continue
            partition, offset, value = message.partition(), message.offset(), message.value()
            if partition not in ends or offset is None:
                continue
            if offset < ends[partition]:
                counted.update((value or b"").decode().lower().split())
            if offset >= ends[partition] - 1:
                del ends[partition]
                consumer.pause([TopicPartition(topic, partition)])
    finally:
        consumer.close()
    return counted


def _read_state(spark: Any, location: str) -> dict[str, int]:
    rows = spark.read.format("cutline-state").option("path", location).option("uid", "word-count").load()
    return {row["key"]: int(row["state_json"]) for row in rows.collect()}


def test_cutline_state_reads_what_the_keyed_job_held_at_each_checkpoint(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """Given the keyed word count checkpointing every second while words arrive, the state read at
    each of its last checkpoints (incremental: their chains hold delta pieces) is the count of the
    input up to that checkpoint's offsets, and the diff of two consecutive ones is the count of the
    input between their offsets (keys added or grown, none removed)."""
    words, out = given.words, tmp_path / "out"
    words.produce(100)
    with CheckpointedJob(spark, _settings(given, bootstrap, topic_prefix, tmp_path, given.job_id)) as job:
        _start(job, out)
        job.wait_for_running(60)
        stop = threading.Event()
        feeder = threading.Thread(target=lambda: every(0.2, stop, lambda: words.produce(10)))
        feeder.start()
        try:
            job.wait_for_completed(4, timeout=120)
        finally:
            stop.set()
            feeder.join()
        job.stop()
    checkpoints = [c for c in job.completed if c.kind is CheckpointKind.CHECKPOINT]
    before, after = (read_checkpoint_metadata(c.location) for c in checkpoints[-2:])
    pieces = [p.kind for handle in after.handles.values() for p in read_manifest(handle).pieces]
    assert "delta" in pieces, pieces

    for completed in (before, after):
        expected = _recount(bootstrap, given.topic, completed.offsets)
        assert dict(expected) == _read_state(spark, completed.location), completed.checkpoint_id
    diff = compare(state_rows(before, "word-count"), state_rows(after, "word-count"))
    grown = Counter({c.key: int(c.after or 0) - int(c.before or 0) for c in (*diff.added, *diff.changed)})
    between = _recount(bootstrap, given.topic, after.offsets) - _recount(
        bootstrap, given.topic, before.offsets
    )
    assert (between, ()) == (grown, diff.removed)
    assert sum(between.values()) > 0, "words arrived between the two checkpoints"


def test_savepoint_writer_bootstrap_and_rekeyed_savepoints_restore_and_count_on_exactly(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """Given 120 lines in the input and a DataFrame of the counts of its first 20 records per
    partition (a history table), a savepoint written from it for 3 tasks restores into the job with
    4 shuffle partitions, which reads on from those offsets: its output adds exactly the input after
    them, its last counts are the whole input's, and its own checkpoint reads back as a recount.
    Re-keyed for the upper-cased word count, the savepoint restores into that step, which counts on
    exactly too; a transform that keeps the old key function is refused by that step, naming the
    step that wrote it."""
    from pyspark import cloudpickle

    # the new key function's module is the tests', not installed where the workers run: sent by value
    key_function_module = sys.modules[UPPER_WORD_COUNT.pairs_of.__module__]
    cloudpickle.register_pickle_by_value(key_function_module)  # type: ignore[no-untyped-call]
    words, job_id = given.words, given.job_id
    words.produce(120)
    cut = {f"{given.topic}:{p}": 20 for p in range(PARTITIONS)}
    history = _recount(bootstrap, given.topic, cut)
    table = spark.createDataFrame(sorted(history.items()), "key string, state long")

    written = write_new_savepoint(
        table, KEYED_WORD_COUNT, tmp_path / "bootstrap", job_id=job_id, offsets=cut, parallelism=3
    )
    out = tmp_path / "out"
    settings = _settings(given, bootstrap, topic_prefix, tmp_path, job_id, restore=written.location)
    with CheckpointedJob(spark, settings) as job:
        assert job.restored is not None and job.restored.location == written.location
        _start(job, out)
        job.wait_for_running(60)
        words.produce(40)
        wait(
            lambda: final_counts(out) == dict(words.produced), "every word counted on from the savepoint", 90
        )
        job.wait_for_completed(1, timeout=60)
        job.stop()
    assert read_counts(out) == words.produced - history
    assert final_counts(out) == dict(words.produced)
    # rescaled from the savepoint's 3 tasks to 4, the job's own checkpoint reads back exactly too
    rescaled = [c for c in job.completed if c.kind is CheckpointKind.CHECKPOINT][-1]
    assert SHUFFLE == len(rescaled.handles)
    assert dict(_recount(bootstrap, given.topic, rescaled.offsets)) == _read_state(spark, rescaled.location)

    kept = transform_savepoint(written.location, tmp_path / "kept", KEYED_WORD_COUNT, keep=lambda k, c: True)
    upper = replace(settings, job_id=f"{job_id}-upper", restore_from_job=job_id)
    with (
        CheckpointedJob(spark, replace(upper, restore=kept.location)) as refused,
        pytest.raises(RestoreRefused, match="uid 'word-count', key function spark_tasks.wordcount.words_of"),
    ):
        refused.stream_keyed(UPPER_WORD_COUNT)

    rekeyed = transform_savepoint(
        written.location, tmp_path / "upper", KEYED_WORD_COUNT, rekey=Rekeying(UPPER_WORD_COUNT, str.upper)
    )
    out_upper = tmp_path / "out-upper"
    with CheckpointedJob(spark, replace(upper, restore=rekeyed.location)) as job:
        _start(job, out_upper, UPPER_WORD_COUNT)
        job.wait_for_running(60)
        expected = {word.upper(): count for word, count in words.produced.items()}
        wait(lambda: final_counts(out_upper) == expected, "every word counted on, upper-cased", 90)
        job.stop()
    assert read_counts(out_upper) == Counter({w.upper(): n for w, n in (words.produced - history).items()})
