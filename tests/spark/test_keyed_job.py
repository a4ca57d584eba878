"""Keyed Spark jobs (spark_tasks/keyed.py, docs/design.md, "Tasks and Spark"): the word count keyed by word
across a
shuffle, with a real local Spark, a real broker and a real coordinator process.

4 input partitions feed 8 shuffle partitions; each shuffle partition keeps the counts of its key
groups, snapshots them incrementally at every barrier and acks once. The output rows are the final
counts: no summing outside Spark."""

from __future__ import annotations

import json
import os
import re
import threading
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from connector_jobs import latency_histograms
from support import eventually
from wordfeed import PARTITIONS, Input, every, wait

from coordinator.service.supervisor import CoordinatorProcess
from events.task.participant import JobDriver, local_path
from events.wire.records import CheckpointCompleted, CheckpointConfig, CheckpointKind, TaskAcknowledged
from events.wire.topics import Topics
from spark_tasks.job import CheckpointedJob, JobSettings, RestoreRefused
from spark_tasks.keyed import MAX_CHAIN, key_group_range, keyed_task_id, read_manifest
from spark_tasks.sink import CutFileSink
from spark_tasks.wordcount import KEYED_WORD_COUNT, final_counts, read_counts

SHUFFLE = 8


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module's tests."""
    return f"t{uuid.uuid4().hex[:8]}."


def _settings(
    bootstrap: str,
    prefix: str,
    topic: str,
    tmp_path: Path,
    job_id: str,
    partitions: int | None,
    **kwargs: Any,
) -> JobSettings:
    return JobSettings(
        job_id=job_id,
        bootstrap=bootstrap,
        topics=(topic,),
        # Tolerant of a checkpoint that expires (a busy machine can hold a first batch, with its
        # Python workers' start, past the timeout): these tests are about state, not failures.
        config=CheckpointConfig(
            interval_ms=1000,
            location=(tmp_path / "checkpoints").as_uri(),
            timeout_ms=30_000,
            tolerable_failures=10,
        ),
        work_dir=tmp_path / "work" / job_id,
        topic_prefix=prefix,
        keyed_partitions=partitions,
        **kwargs,
    )


def _start(job: CheckpointedJob, out: Path) -> Any:
    counts = job.stream_keyed(KEYED_WORD_COUNT)
    sink = CutFileSink(job, out)
    return job.start(counts.writeStream.foreachBatch(sink).trigger(processingTime="200 milliseconds"))


def _assert_exact(produced: Counter[str], out: Path) -> None:
    """The sink's raw rows: the last count of each word is the word's count in the whole input, and
    what the rows added sums to it too (a row written twice or lost would show)."""
    assert final_counts(out) == dict(produced)
    assert read_counts(out) == produced


def _pieces(completed: CheckpointCompleted) -> set[str]:
    """The pieces a checkpoint's manifests list (its chains)."""
    return {piece.uri for handle in completed.handles.values() for piece in read_manifest(handle).pieces}


def _offsets(completed: CheckpointCompleted) -> list[tuple[int, int]]:
    """``(partition, offset)`` of each input partition the checkpoint has an offset of."""
    return sorted((int(key.rsplit(":", 1)[1]), offset) for key, offset in completed.offsets.items())


def _journal(bootstrap: str, prefix: str, job_id: str, *kinds: type) -> list[Any]:
    return JobDriver(bootstrap, job_id, Topics(prefix)).journal(kinds)


def test_a_keyed_word_count_acks_once_per_shuffle_partition_and_rescales_from_a_savepoint(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """Given 4 input partitions and 8 shuffle partitions checkpointing every second, every
    checkpoint has one ack and one manifest per shuffle partition, the cut's offsets of every input
    partition, and snapshots after the first are deltas; the rows are the exact final counts. A
    savepoint of it restores into 3 and into 16 shuffle partitions, and both count on exactly."""
    words, job_id = given.words, given.job_id
    out = tmp_path / "out"
    words.produce(200)
    with CheckpointedJob(
        spark, _settings(bootstrap, topic_prefix, given.topic, tmp_path, job_id, SHUFFLE)
    ) as job:
        assert job.tasks == [keyed_task_id(i) for i in range(SHUFFLE)]
        _start(job, out)
        job.wait_for_running(60)
        stop = threading.Event()
        feeder = threading.Thread(target=lambda: every(0.1, stop, lambda: words.produce(20)))
        feeder.start()
        try:
            job.wait_for_completed(3, timeout=90)
        finally:
            stop.set()
            feeder.join()
        wait(lambda: final_counts(out) == dict(words.produced), "every word counted", 60)
        job.wait_for_completed(4, timeout=30)
        savepoint = job.savepoint(tmp_path / "savepoints")
        job.stop()
        assert job.query.exception() is None
    _assert_exact(words.produced, out)
    assert [] == job.ignored
    completed = [c for c in job.completed if c.kind is CheckpointKind.CHECKPOINT]
    acks = _journal(bootstrap, topic_prefix, job_id, TaskAcknowledged)
    topic = given.topic
    for checkpoint in completed:
        assert sorted(checkpoint.handles) == sorted(job.tasks)
        assert sorted(checkpoint.offsets) == [f"{topic}:{p}" for p in range(PARTITIONS)]
        answered = [a.task_id for a in acks if a.checkpoint_id == checkpoint.checkpoint_id]
        assert sorted(set(answered)) == sorted(job.tasks)
    # each manifest covers its partition's key groups; after a full snapshot the next are deltas on
    # it, until a chain reaches MAX_CHAIN pieces and the next snapshot is a full one again
    last = completed[-1]
    savepoints = {c.checkpoint_id for c in job.completed if c.kind is CheckpointKind.SAVEPOINT}
    chains, expected = {}, {}
    for task, handle in last.handles.items():
        manifest = read_manifest(handle)
        assert manifest.key_groups == key_group_range(int(task.split("-")[1]), SHUFFLE)
        chains[task] = [piece.kind for piece in manifest.pieces]
        snapshots = {
            a.checkpoint_id
            for a in acks
            if a.task_id == task
            and a.checkpoint_id <= last.checkpoint_id
            and a.checkpoint_id not in savepoints
        }
        expected[task] = ["full"] + ["delta"] * ((len(snapshots) - 1) % MAX_CHAIN)
    assert expected == chains
    # retention: every piece the latest checkpoint's chains need is still there; every other piece
    # of an older, discarded checkpoint is gone (the job's journal thread ended with the job)
    needed = _pieces(last)
    assert all(local_path(uri).is_file() for uri in needed)
    for piece in (tmp_path / "checkpoints" / job_id).glob("chk-*/*"):
        if piece.suffix in (".full", ".delta") and piece.parent.name != f"chk-{last.checkpoint_id}":
            in_flight = int(piece.parent.name.removeprefix("chk-")) > last.checkpoint_id
            assert in_flight or piece.as_uri() in needed, f"{piece} should have been discarded"

    # what a restore refuses (spark_tasks/restore.py), before any query starts: the savepoint's keyed
    # state in a job without keys, and in another keyed step; allowed, the state stays behind
    flat = _settings(
        bootstrap, topic_prefix, given.topic, tmp_path, f"{job_id}-flat", None, restore=savepoint.location,
        restore_from_job=job_id,
    )  # fmt: skip
    with pytest.raises(RestoreRefused, match="keyed state of tasks keyed-0, keyed-1"):
        CheckpointedJob(spark, flat)
    with CheckpointedJob(spark, replace(flat, allow_non_restored_state=True)) as allowed:
        assert json.loads(allowed.starting_offsets) == {topic: {str(p): o for p, o in _offsets(savepoint)}}
    other = _settings(
        bootstrap, topic_prefix, given.topic, tmp_path, f"{job_id}-other", 3, restore=savepoint.location,
        restore_from_job=job_id,
    )  # fmt: skip
    with (
        CheckpointedJob(spark, other) as changed,
        pytest.raises(RestoreRefused, match="uid 'word-count', key function spark_tasks.wordcount.words_of"),
    ):
        changed.stream_keyed(replace(KEYED_WORD_COUNT, uid="totals"))

    # rescale: the savepoint restores into 3 and into 16 shuffle partitions
    counted_at_savepoint = Counter(words.produced)
    words.produce(120)
    for partitions in (3, 16):
        rescaled_out = tmp_path / f"out-{partitions}"
        settings = _settings(
            bootstrap,
            topic_prefix,
            given.topic,
            tmp_path,
            f"{job_id}-p{partitions}",
            partitions,
            restore=savepoint.location,
            restore_from_job=job_id,
        )
        with CheckpointedJob(spark, settings) as rescaled:
            assert (
                rescaled.restored is not None and rescaled.restored.checkpoint_id == savepoint.checkpoint_id
            )
            _start(rescaled, rescaled_out)
            wait(
                lambda out=rescaled_out: final_counts(out) == dict(words.produced),
                f"counts with {partitions}",
                90,
            )
            rescaled.stop()
        # the restored counts carry on: what this job added is what came after the savepoint
        assert read_counts(rescaled_out) == words.produced - counted_at_savepoint
        assert final_counts(rescaled_out) == dict(words.produced)


AWS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")


def test_a_keyed_job_checkpoints_to_s3_keeps_its_state_there_and_restores_from_it(
    spark: Any,
    s3: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """Given the keyed word count with its checkpoints and its state store on S3 (moto's server),
    checkpoints complete there; the next attempt restores the latest of them from S3, writes
    ``_metadata`` and applies retention there, and its raw output holds every word exactly once."""
    words, job_id = given.words, given.job_id
    # Python workers take their environment from the SparkContext (they are not this process's
    # children): moto's endpoint and keys go there.
    environment = spark.sparkContext.environment
    saved = {name: environment.get(name) for name in AWS}
    environment.update({name: os.environ[name] for name in AWS})
    bucket = "s3://cutline-checkpoints"
    # 4 shuffle partitions, not 8: every S3 request goes through moto's server (slow), and the
    # point here is the storage, not the shuffle
    settings = _settings(
        bootstrap, topic_prefix, given.topic, tmp_path, job_id, 4, state_location=f"{bucket}/state"
    )
    settings = replace(settings, config=replace(settings.config, location=f"{bucket}/checkpoints"))
    out = tmp_path / "out"
    try:
        words.produce(100)
        with CheckpointedJob(spark, settings) as first:
            _start(first, out)
            first.wait_for_running(60)
            words.produce(100)
            first.wait_for_completed(2, timeout=90)
            words.produce(100)
            first.stop()
        latest = [
            c for c in JobDriver(bootstrap, job_id, Topics(topic_prefix)).completions() if c.attempt == 1
        ][-1]
        assert all(h.uri.startswith(f"{bucket}/checkpoints/{job_id}/") for h in latest.handles.values())
        assert s3.find("cutline-checkpoints/state"), "the state store is on S3"

        with CheckpointedJob(spark, settings) as second:
            assert second.restored is not None
            assert (second.restored.checkpoint_id, second.attempt) == (latest.checkpoint_id, 2)
            _start(second, out)
            second.wait_for_running(60)
            words.produce(100)
            wait(
                lambda: final_counts(out) == dict(words.produced), "every word counted after the restore", 90
            )
            second.wait_for_completed(3, timeout=60)
            second.stop()
    finally:
        for name, value in saved.items():
            if value is None:
                environment.pop(name, None)
            else:
                environment[name] = value
    _assert_exact(words.produced, out)
    # _metadata in each checkpoint the driver completed, on S3; retention (retained=1) deleted the
    # manifests of the older ones there, as it does on a file system
    root = f"cutline-checkpoints/checkpoints/{job_id}"
    ids = [c.checkpoint_id for c in second.completed]  # all of them: the journal thread has ended
    assert s3.exists(f"{root}/chk-{ids[-1]}/_metadata")
    manifests = [p for p in s3.find(root) if re.search(r"/keyed-\d+\.a2-[0-9a-f]+\.cut-\d+$", p)]
    for old in ids[:-2]:
        assert not [p for p in manifests if f"/chk-{old}/" in p], f"checkpoint {old} was not discarded"


def test_latency_markers_reach_every_keyed_task_and_the_sink_and_never_user_code(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """Given a keyed word count with latency markers every 200 ms, the coordinator's /metrics has
    Flink's latency histograms (granularity operator) for the map side of every input partition,
    every shuffle partition and the sink, with plausible figures: the sink's latency covers most of
    a micro-batch's execution, and no operator's exceeds what the slowest batch took (plus 1 s).
    User code never sees a marker: the counts are exact (a marker row, with no value, would break
    key_by)."""
    import json
    import urllib.request

    words, job_id = given.words, given.job_id
    out = tmp_path / "out"
    shuffle = 4
    settings = _settings(
        bootstrap, topic_prefix, given.topic, tmp_path, job_id, shuffle, latency_interval_ms=200
    )
    expected = {
        *((f"{p}", "route") for p in range(PARTITIONS)),
        *((f"{i}", "keyed") for i in range(shuffle)),
        ("0", "sink"),
    }

    def seen() -> set[tuple[str, str]]:
        return {(subtask, op) for _, op, subtask in latency_histograms(coordinator.url, job_id)}

    # every batch's progress kept (Spark keeps the last 100): the slowest may be an early one
    retention = "spark.sql.streaming.numRecentProgressUpdates"
    spark.conf.set(retention, "100000")
    try:
        with CheckpointedJob(spark, settings) as job:
            query = _start(job, out)
            job.wait_for_running(60)
            stop = threading.Event()
            feeder = threading.Thread(target=lambda: every(0.05, stop, lambda: words.produce(8)))
            feeder.start()
            try:
                what = "latency of every operator subtask at /metrics"
                eventually(seen, lambda got: got == expected, timeout=120, what=what)
            finally:
                stop.set()
                feeder.join()
            wait(lambda: final_counts(out) == dict(words.produced), "every word counted", 60)
            job.stop()
            assert job.query.exception() is None
    finally:
        spark.conf.unset(retention)
    # taken once the query stopped: a batch's sink measures its marker before Spark reports the
    # batch's progress, so the progress of the batches still running then would be missing
    progress = [p for p in query.recentProgress if "addBatch" in p["durationMs"]]  # batches that ran
    _assert_exact(words.produced, out)

    histograms = latency_histograms(coordinator.url, job_id)
    assert {source for source, _, _ in histograms} == {"cutline-kafka"}
    # a marker is stamped when its batch is planned: by the sink it has waited at least for the
    # batch's execution (here longer than the 200 ms trigger interval), never longer than a batch took
    trigger = max(p["durationMs"]["triggerExecution"] for p in progress)
    means = {(op, subtask): total / count for (_, op, subtask), (count, total) in histograms.items()}
    assert all(0 <= mean <= trigger + 1_000 for mean in means.values()), (means, trigger)
    with urllib.request.urlopen(f"{coordinator.url}/jobs/{job_id}/latency", timeout=10) as response:
        shown = json.load(response)
    operators = {row["operator_id"]: row for row in shown["operators"]}
    assert ["route", "keyed", "sink"] == list(operators)
    sink = operators["sink"]
    assert sink["p50"] >= 200, sink
    assert sink["max"] <= trigger + 1_000, (sink, trigger)
    # each marker's latency grows along its path; the operators' medians are over different markers
    assert operators["route"]["min"] <= operators["keyed"]["min"] <= sink["min"], operators
