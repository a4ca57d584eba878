"""Spark jobs that checkpoint with cutline (docs/design.md, "Tasks and Spark"): a real local Spark, a real
broker and a
real coordinator process. The job is the word count of spark_tasks/wordcount.py."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from wordfeed import PARTITIONS, Input
from wordfeed import every as _every
from wordfeed import wait as _wait

from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.clients import (
    consumer_config,
    job_partition,
    produce_record,
    producer_config,
    read_partition_to_end,
)
from events.task.participant import JobDriver, local_path
from events.wire.codec import decode
from events.wire.fencing import Fence, epoch_header
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointRequested,
    CheckpointRestored,
    CheckpointTriggered,
    CoordinatorClaimed,
    JobCancelRequested,
    JobRestartScheduled,
    JobStatus,
    JobStopRequested,
    Record,
    RestartStrategy,
    RestartStrategyKind,
    SchedulerStarted,
    SchedulerStopped,
    StateHandle,
    TaskAcknowledged,
)
from events.wire.topics import Topics
from spark_tasks.job import (
    METADATA_FILE,
    CheckpointedJob,
    CheckpointFailuresExceeded,
    JobSettings,
    RestoreRefused,
)
from spark_tasks.sink import ROLLED_BACK_DIR, CutFileSink, read_rows
from spark_tasks.state import StatefulStep
from spark_tasks.tasks import snapshot_name
from spark_tasks.wordcount import (
    OUTPUT_SCHEMA,
    WORD_COUNT,
    count_words,
    read_counts,
    records_read,
    run_wordcount,
)


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module's tests."""
    return f"t{uuid.uuid4().hex[:8]}."


def _settings(
    bootstrap: str, prefix: str, topic: str, tmp_path: Path, job_id: str, **config: Any
) -> JobSettings:
    return JobSettings(
        job_id=job_id,
        bootstrap=bootstrap,
        topics=(topic,),
        config=CheckpointConfig(
            interval_ms=config.pop("interval_ms", 1000),
            location=config.pop("location", (tmp_path / "checkpoints").as_uri()),
            timeout_ms=config.pop("timeout_ms", 10_000),
            **config,
        ),
        work_dir=tmp_path / "work" / job_id,
        topic_prefix=prefix,
    )


def _start(spark: Any, job: CheckpointedJob, out: Path, step: StatefulStep[Any] = WORD_COUNT) -> Any:
    counts = job.stream(step)
    sink = CutFileSink(job, out)
    return job.start(counts.writeStream.foreachBatch(sink).trigger(processingTime="200 milliseconds"))


def _assert_exactly_once(produced: Counter[str], *outs: Path) -> None:
    """The sinks' raw rows hold every word once: what they added sums to what was produced, no row is
    there twice, and each partition's count of a word grows by exactly what each of its rows added."""
    rows = [row for out in outs for row in read_rows(out)]
    assert produced == read_counts(*outs)
    keys = [(r["topic"], r["partition"], r["word"], r["offset"]) for r in rows]
    assert len(keys) == len(set(keys)), "a row is in the output twice"
    counts: dict[tuple[str, int, str], int] = {}
    for row in sorted(rows, key=lambda r: (r["topic"], r["partition"], r["word"], r["offset"])):
        key = (row["topic"], row["partition"], row["word"])
        assert counts.get(key, 0) + row["added"] == row["count"], row
        counts[key] = row["count"]


def _journal(bootstrap: str, prefix: str, job_id: str, *kinds: type) -> list[Any]:
    return JobDriver(bootstrap, job_id, Topics(prefix)).journal(kinds)


def test_word_count_checkpoints_every_second_with_one_ack_per_partition(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    topic, words, job_id = given.topic, given.words, given.job_id
    out = tmp_path / "out"
    words.produce(200)

    with CheckpointedJob(spark, _settings(bootstrap, topic_prefix, given.topic, tmp_path, job_id)) as job:
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
        job.wait_for_completed(4, timeout=30)
        job.stop()
        assert job.query.exception() is None
    _assert_exactly_once(words.produced, out)
    assert [] == job.ignored
    # after close: the journal thread has ended, so every checkpoint whose offsets it committed is
    # here (it commits before it records); one may have completed after wait_for_completed returned
    completed = list(job.completed)

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


def _block_location(tmp_path: Path, job_id: str) -> Path:
    """A file where the job's checkpoint directory must go: every snapshot write fails."""
    blocker = tmp_path / "checkpoints" / job_id
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")
    return blocker


def test_an_unwritable_location_declines_and_the_query_keeps_running_until_it_is_fixed(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    words, job_id = given.words, given.job_id
    out = tmp_path / "out"
    blocker = _block_location(tmp_path, job_id)
    settings = _settings(
        bootstrap, topic_prefix, given.topic, tmp_path, job_id, interval_ms=500, tolerable_failures=100
    )

    with CheckpointedJob(spark, settings) as job:
        _start(spark, job, out)
        job.wait_for_running(60)
        words.produce(40)
        _wait(lambda: len(job.aborted) >= 2, "two declined checkpoints")
        # the query keeps running and counting
        words.produce(40)
        _wait(lambda: read_counts(out) == words.produced, "every word counted despite the declines")
        assert job.query.isActive and job.completed == []
        blocker.unlink()
        first = job.wait_for_completed(1, timeout=30)[0]
        job.stop()

    declined = [a for a in job.aborted if a.reason == "CHECKPOINT_DECLINED"]
    assert len(declined) >= 2 and all(a.counts_as_failure for a in declined)
    assert declined == job.aborted[: len(declined)]
    assert "NotADirectoryError" in declined[0].message, declined[0].message
    assert first.checkpoint_id > max(a.checkpoint_id for a in declined)
    assert sorted(first.handles) == job.tasks


def test_too_many_checkpoint_failures_stop_the_query_with_a_clear_error(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    given.words.produce(20)
    job_id = given.job_id
    _block_location(tmp_path, job_id)
    settings = _settings(
        bootstrap, topic_prefix, given.topic, tmp_path, job_id, interval_ms=300, tolerable_failures=1
    )

    with CheckpointedJob(spark, settings) as job:
        _start(spark, job, tmp_path / "out")
        with pytest.raises(CheckpointFailuresExceeded, match="2 checkpoint failures in a row") as raised:
            job.await_termination(90)
        assert not job.query.isActive

    assert f"cutline status {job_id}" in str(raised.value)
    stopped = _journal(bootstrap, topic_prefix, job_id, SchedulerStopped)
    assert [s.status for s in stopped][-1] is JobStatus.FAILING
    assert "checkpoint failures" in (stopped[-1].error or "")
    (restart,) = _journal(bootstrap, topic_prefix, job_id, JobRestartScheduled)  # the default strategy
    assert 2 == restart.attempt and "checkpoint failures in a row" in restart.failure


def test_a_changed_job_restarts_from_a_savepoint(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    words = given.words
    old, new = given.job_id, "wc2-" + given.job_id
    words.produce(100)
    no_periodic = {"interval_ms": 0}

    with CheckpointedJob(
        spark, _settings(bootstrap, topic_prefix, given.topic, tmp_path, old, **no_periodic)
    ) as job:
        _start(spark, job, tmp_path / "out-old")
        job.wait_for_running(60)
        _wait(lambda: read_counts(tmp_path / "out-old") == words.produced, "the first words counted")
        savepoint = job.savepoint(tmp_path / "savepoints", timeout=30)
        job.stop()
    assert savepoint.kind == "SAVEPOINT" and sorted(savepoint.handles) == job.tasks
    saved = Counter(read_counts(tmp_path / "out-old"))
    words.produce(100)

    # the changed job: another job id, and its step also reports each word's length
    def count_with_length(state: dict[str, int], records: Any) -> tuple[dict[str, int], list[Any]]:
        state, rows = WORD_COUNT.update(state, records)
        return state, [(*row, len(row[0])) for row in rows]

    changed = StatefulStep(
        update=count_with_length, output_schema=OUTPUT_SCHEMA + ", length int", initial=dict
    )
    settings = replace(
        _settings(bootstrap, topic_prefix, given.topic, tmp_path, new, **no_periodic),
        restore=savepoint.location,
    )
    # another job's savepoint restores only when the user names that job (a shared directory must
    # never hand a job another job's offsets and state)
    with pytest.raises(RestoreRefused, match=f"(?s)belongs to job '{re.escape(old)}'.*restore_from_job"):
        CheckpointedJob(spark, settings)
    settings = replace(settings, restore_from_job=old)
    out = tmp_path / "out-new"
    with CheckpointedJob(spark, settings) as job:
        assert job.restored == savepoint
        _start(spark, job, out, changed)
        _wait(
            lambda: read_counts(tmp_path / "out-old", out) == words.produced, "the new words counted on top"
        )
        job.stop()

    # the new job's rows continue the savepoint's counts, each word once across both outputs
    assert saved == read_counts(tmp_path / "out-old")
    _assert_exactly_once(words.produced, tmp_path / "out-old", out)
    assert {
        r["length"] == len(r["word"])
        for f in out.glob("*.jsonl")
        for r in map(json.loads, f.read_text().splitlines())
    } == {True}


def test_the_word_count_reads_a_backlog_in_capped_batches_and_stops_when_idle_while_checkpointing(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """Given a backlog of 600 lines and a cap of 100 offsets per micro-batch, no batch reads more
    than 100 records (a stop waits for at most one such batch); once the backlog is read,
    ``idle_stop`` ends the job by itself although checkpoints keep coming every 200 ms: their
    batches of barrier rows are not input."""
    words = given.words
    words.produce(600)
    settings = replace(
        _settings(bootstrap, topic_prefix, given.topic, tmp_path, given.job_id, interval_ms=200),
        source_options={"maxOffsetsPerTrigger": 100},
    )
    stop = threading.Event()
    guard = threading.Timer(180, stop.set)  # never needed when idle_stop works
    guard.start()
    events: list[tuple[str, dict[str, Any]]] = []
    try:
        job = run_wordcount(
            spark,
            settings,
            tmp_path / "out",
            stop=stop,
            idle_stop=3.0,
            on_event=lambda event, **fields: events.append((event, fields)),
        )
    finally:
        guard.cancel()

    assert not stop.is_set(), f"idle_stop never ended the job: {events[-8:]}"
    assert job.query.exception() is None
    assert words.produced == read_counts(tmp_path / "out")
    read = [records_read(progress) for progress in job.query.recentProgress]
    assert 0 < max(read) <= 100
    last_input = max(i for i, records in enumerate(read) if records)
    barrier_only = [p for p in job.query.recentProgress[last_input + 1 :] if p["numInputRows"] > 0]
    assert barrier_only, "a checkpoint's barrier batch came while the job was idle, and did not end it"


def _journal_epoch(bootstrap: str, prefix: str, job_id: str) -> int:
    """The current coordinator epoch of ``job_id``'s journal partition (its latest valid claim)."""
    topic = Topics(prefix).checkpoints
    consumer = Consumer(consumer_config(bootstrap))
    try:
        fence = Fence()
        for msg in read_partition_to_end(consumer, topic, job_partition(consumer, topic, job_id), 30):
            if msg.value() and isinstance(claim := decode(msg.value()), CoordinatorClaimed):
                _, fence = fence.claim(claim.epoch)
        return fence.epoch
    finally:
        consumer.close()


def _forge(bootstrap: str, prefix: str, *records: Record, epoch: int | None = None) -> None:
    """Append ``records`` to the journal as the coordinator would: keyed by the job id, under
    ``epoch`` (None: no epoch header, so void once the partition has been claimed)."""
    producer = Producer(producer_config(bootstrap))
    headers = () if epoch is None else (epoch_header(epoch),)
    for record in records:
        produce_record(producer, Topics(prefix).checkpoints, record, headers=headers)
    assert 0 == producer.flush(10)


def _checkpoint_now(job: CheckpointedJob, count: int) -> CheckpointCompleted:
    """Ask for a checkpoint of ``job`` and wait until it is the ``count``-th completed one."""
    job.driver.request(
        CheckpointRequested(
            job_id=job.settings.job_id,
            kind=CheckpointKind.CHECKPOINT,
            timestamp_ms=int(time.time() * 1000),
            request_id=uuid.uuid4().hex,
        )
    )
    return job.wait_for_completed(count, timeout=30)[-1]


def test_forged_journal_records_never_cost_the_latest_checkpoint_and_it_restores(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """With retained=1, a second completion and an abort of the latest checkpoint, stale threshold
    events, a checkpoint outside the checkpoint location and offsets keyed 'topic:²' are ignored (the
    query runs on, nothing outside the location is written or deleted); a restore from the latest
    completed checkpoint then counts every word once."""
    topic, words, job_id = given.topic, given.words, given.job_id
    out, outside = tmp_path / "out", tmp_path / "outside"
    settings = _settings(bootstrap, topic_prefix, given.topic, tmp_path, job_id, interval_ms=0, retained=1)
    words.produce(60)

    with CheckpointedJob(spark, settings) as job:
        _start(spark, job, out)
        job.wait_for_running(120)  # the first micro-batch starts the Python workers: slow on a busy machine
        _wait(lambda: read_counts(out) == words.produced, "the first words counted")
        first = _checkpoint_now(job, 1)
        words.produce(60)
        _wait(lambda: read_counts(out) == words.produced, "more words counted")
        latest = _checkpoint_now(job, 2)
        _wait(lambda: not local_path(first.location).exists(), "checkpoint 1 deleted: retained=1")
        directory = local_path(latest.location)
        kept = sorted(p.name for p in directory.iterdir())
        assert METADATA_FILE in kept and len(kept) == 1 + PARTITIONS
        # a file outside the checkpoint location, named like this run's snapshots
        bait = outside / snapshot_name(job.tasks[0], job.attempt, job.run_id, 5)
        outside.mkdir()
        bait.write_bytes(b"not cutline's")
        now = int(time.time() * 1000)
        handles = {task: StateHandle((outside / task).as_uri(), 1, "00" * 32) for task in job.tasks}
        inside = (tmp_path / "checkpoints" / job_id / "chk-97").as_uri()

        # a superseded writer's abort of the latest checkpoint (no epoch header): void, not even read
        void = CheckpointAborted(job_id, latest.checkpoint_id, now, "CHECKPOINT_EXPIRED", "void", None, True)
        _forge(bootstrap, topic_prefix, void)
        # a buggy writer of the current epoch: every record passes the fence, the ledger checks it
        _forge(
            bootstrap,
            topic_prefix,
            latest,  # a second completion of the latest checkpoint
            CheckpointAborted(job_id, latest.checkpoint_id, now, "CHECKPOINT_EXPIRED", "forged", None, True),
            CheckpointFailureThresholdExceeded(job_id, latest.checkpoint_id, now, 9, 0, "CHECKPOINT_EXPIRED"),
            CheckpointFailureThresholdExceeded(job_id, 98, now, 9, 0, "CHECKPOINT_EXPIRED"),
            CheckpointTriggered(
                job_id,
                99,
                job.attempt,
                CheckpointKind.CHECKPOINT,
                now,
                outside.as_uri(),
                tuple(job.tasks),
                now,
            ),
            CheckpointCompleted(
                job_id,
                99,
                CheckpointKind.CHECKPOINT,
                now,
                1,
                handles,
                4,
                dict(latest.offsets),
                attempt=job.attempt,
                location=outside.as_uri(),
            ),
            CheckpointAborted(job_id, 99, now, "CHECKPOINT_DECLINED", "forged"),
            CheckpointTriggered(
                job_id, 97, job.attempt, CheckpointKind.CHECKPOINT, now, inside, tuple(job.tasks), now
            ),
            CheckpointCompleted(
                job_id,
                97,
                CheckpointKind.CHECKPOINT,
                now,
                1,
                {},
                0,
                {f"{topic}:²": 1},
                attempt=job.attempt,
                location=inside,
            ),
            epoch=_journal_epoch(bootstrap, topic_prefix, job_id),
        )
        _wait(lambda: len(job.ignored) >= 7, "the forged records ignored", 30)
        time.sleep(0.5)  # anything after them would show up now
        words.produce(60)
        _wait(lambda: read_counts(out) == words.produced, "the query counts on")
        assert job.query.isActive and job.failure is None
        job.stop()

    reasons = [(type(r).__name__, getattr(r, "checkpoint_id", None), why) for r, why in job.ignored]
    assert [
        ("CheckpointCompleted", latest.checkpoint_id, "it completed already (a duplicate record)"),
        ("CheckpointAborted", latest.checkpoint_id, "it completed already; a completed checkpoint is never "
         "discarded by an abort"),
        ("CheckpointFailureThresholdExceeded", latest.checkpoint_id, "that checkpoint completed"),
        ("CheckpointFailureThresholdExceeded", 98, "not a checkpoint of this attempt"),
        ("CheckpointTriggered", 99, f"location {outside.as_uri()} is outside the checkpoint location "
         f"{settings.config.location}"),
        ("CheckpointCompleted", 99, "this attempt never saw it triggered"),
        ("CheckpointCompleted", 97, f"malformed offsets: offsets key '{topic}:²': partition '²' is not a "
         "non-negative decimal number (ASCII digits 0-9 only)"),
    ] == reasons  # fmt: skip
    assert [first, latest] == job.completed
    assert kept == sorted(p.name for p in directory.iterdir())  # the latest checkpoint is whole
    assert [bait] == list(outside.iterdir())  # nothing written or deleted outside the location
    consumer = Consumer(consumer_config(bootstrap, job_id))
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    finally:
        consumer.close()
    assert dict(latest.offsets) == {f"{tp.topic}:{tp.partition}": tp.offset for tp in committed}

    # the restore: checkpoint 99's completion is in the journal, but its snapshots are not there
    with CheckpointedJob(spark, settings) as restored:
        assert (latest, 2) == (restored.restored, restored.attempt)
        _start(spark, restored, out)
        _wait(lambda: read_counts(out) >= words.produced, "every word counted after the restore")
        restored.stop()
    # the first attempt's output after checkpoint 2 was rolled back, then written again
    assert list((out / ROLLED_BACK_DIR / "attempt-2").glob("*.jsonl"))
    _assert_exactly_once(words.produced, out)


def _booming(
    bootstrap: str, prefix: str, given: Input, tmp_path: Path, *, delay_ms: int, once: bool
) -> tuple[JobSettings, Callable[[CheckpointedJob], Any]]:
    """A word count whose task raises on the word "boom" (``once``: only the first time any task sees
    it), with a fixed-delay strategy of 2 attempts ``delay_ms`` apart; its settings and its writer
    (a :class:`CutFileSink` into ``tmp_path / "out"``)."""
    flag = tmp_path / "boomed"

    def count_or_boom(state: dict[str, int], records: Any) -> tuple[dict[str, int], list[Any]]:
        if not (once and flag.exists()) and any(b"boom" in (r.value or b"") for r in records):
            flag.touch()
            raise RuntimeError("boom: a task failure injected by the test")
        return count_words(state, records)

    step = StatefulStep(update=count_or_boom, output_schema=WORD_COUNT.output_schema, initial=dict)
    strategy = RestartStrategy(RestartStrategyKind.FIXED_DELAY, attempts=2, delay_ms=delay_ms)
    settings = _settings(
        bootstrap, prefix, given.topic, tmp_path, given.job_id, interval_ms=500, restart_strategy=strategy
    )

    def writer(job: CheckpointedJob) -> Any:
        sink = CutFileSink(job, tmp_path / "out")
        return job.stream(step).writeStream.foreachBatch(sink).trigger(processingTime="200 milliseconds")

    return settings, writer


def test_a_query_that_fails_is_restarted_in_the_same_driver_and_counts_stay_exact(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """A task raises once (the word "boom", the first time any task sees it): Spark fails the query,
    the job reports FAILING, the fixed-delay strategy schedules attempt 2, and ``run`` starts it in
    this SparkSession from the latest completed checkpoint. The sink's raw output then holds every
    word exactly once."""
    words, job_id, out = given.words, given.job_id, tmp_path / "out"
    settings, writer = _booming(bootstrap, topic_prefix, given, tmp_path, delay_ms=500, once=True)

    with CheckpointedJob(spark, settings) as job:
        runner = threading.Thread(target=job.run, args=(writer,), daemon=True)
        runner.start()
        words.produce(40)
        job.wait_for_running(120)
        job.wait_for_completed(1, timeout=60)
        words._producer.produce(given.topic, value=b"boom", partition=0)
        words.produced.update(["boom"])
        words.produce(40)
        _wait(lambda: job.attempt == 2 and job.running, "attempt 2 running in the same driver", 120)
        words.produce(40)
        _wait(lambda: read_counts(out) == words.produced, "every word counted once", 90)
        job.stop()
        runner.join(60)
        assert not runner.is_alive()

    (restart,) = _journal(bootstrap, topic_prefix, job_id, JobRestartScheduled)
    assert 2 == restart.attempt and "boom" in restart.failure
    (restored,) = _journal(bootstrap, topic_prefix, job_id, CheckpointRestored)
    assert (2, restart.restore_checkpoint_id) == (restored.attempt, restored.checkpoint_id)
    _assert_exactly_once(words.produced, out)


def test_a_cancel_in_the_restart_delay_wins_and_no_next_attempt_starts(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """The query fails and the strategy schedules attempt 2 in 30 s; ``cutline cancel`` (its request)
    comes in that delay. ``run`` returns at once without starting attempt 2, and the job ends
    CANCELED (issue 53: before, the next attempt started anyway and the coordinator ran it)."""
    words, job_id = given.words, given.job_id
    settings, writer = _booming(bootstrap, topic_prefix, given, tmp_path, delay_ms=30_000, once=False)

    with CheckpointedJob(spark, settings) as job:
        runner = threading.Thread(target=job.run, args=(writer,), daemon=True)
        runner.start()
        job.wait_for_running(120)
        words._producer.produce(given.topic, value=b"boom", partition=0)
        words._producer.flush(10)
        _wait(
            lambda: bool(_journal(bootstrap, topic_prefix, job_id, JobRestartScheduled)),
            "attempt 2 scheduled",
            60,
        )
        job.driver.request(JobCancelRequested(job_id, int(time.time() * 1000), "cancel-in-delay"))
        runner.join(20)
        assert not runner.is_alive(), "run() still waits out the restart delay"

    def stops() -> list[JobStatus]:
        return [s.status for s in _journal(bootstrap, topic_prefix, job_id, SchedulerStopped)]

    _wait(lambda: JobStatus.CANCELED in stops(), "the job CANCELED", 20)
    assert [1] == [s.attempt for s in _journal(bootstrap, topic_prefix, job_id, SchedulerStarted)]
    assert 1 == job.attempt


def test_stop_with_a_savepoint_ends_the_output_at_its_cut_and_the_restore_rolls_nothing_back(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """``cutline stop`` (its request) while words keep arriving: the query stops FINISHED, the sink's
    last file ends at the savepoint's offsets, and the job restored from it starts its output right
    there with nothing rolled back; every word counted once across both."""
    words, old, new = given.words, given.job_id, "wc2-" + given.job_id
    words.produce(50)
    producing = threading.Event()
    feeder = threading.Thread(target=lambda: _every(0.05, producing, lambda: words.produce(5)), daemon=True)
    with CheckpointedJob(spark, _settings(bootstrap, topic_prefix, given.topic, tmp_path, old)) as job:
        _start(spark, job, tmp_path / "out-old")
        job.wait_for_running(60)
        _wait(lambda: read_counts(tmp_path / "out-old") == words.produced, "the first words counted")
        feeder.start()
        stop = JobStopRequested(old, int(time.time() * 1000), uuid.uuid4().hex, (tmp_path / "sp").as_uri())
        job.driver.request(stop)
        assert job.await_termination(60)
    producing.set()
    feeder.join(10)
    (savepoint,) = [c for c in job.completed if c.kind is CheckpointKind.SAVEPOINT]
    ended = _journal(bootstrap, topic_prefix, old, SchedulerStopped)
    assert JobStatus.FINISHED in [e.status for e in ended]
    cuts = [json.loads(p.read_text()) for p in (tmp_path / "out-old" / "_cuts").glob("*.json")]
    assert dict(savepoint.offsets) == max(cuts, key=lambda c: sum(c["end"].values()))["end"]

    settings = replace(
        _settings(bootstrap, topic_prefix, given.topic, tmp_path, new),
        restore=savepoint.location,
        restore_from_job=old,
    )
    out = tmp_path / "out-new"
    with CheckpointedJob(spark, settings) as job:
        sink = CutFileSink(job, out)
        assert [] == sink.rolled_back
        job.start(
            job.stream(WORD_COUNT).writeStream.foreachBatch(sink).trigger(processingTime="200 milliseconds")
        )
        _wait(lambda: read_counts(tmp_path / "out-old", out) == words.produced, "the rest counted")
        job.stop()
    first = min((json.loads(p.read_text()) for p in (out / "_cuts").glob("*.json")), key=lambda c: c["batch"])
    assert dict(savepoint.offsets) == first["start"]
    assert not (tmp_path / "out-old" / ROLLED_BACK_DIR).exists()
    _assert_exactly_once(words.produced, tmp_path / "out-old", out)


def test_a_driver_of_an_attempt_the_coordinator_never_ran_leaves_no_offsets_to_the_next(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Given a driver whose query read the input and then ended before the coordinator journaled its
    start (here: no coordinator on its topic prefix, as for a crash in its first batches), when the
    next driver begins the same attempt number in the same work directory, then its query starts
    from the restored offsets (none: the earliest), not from the Spark checkpoint left there, and
    every word is counted: Spark would resume after the first driver's batches, whose records are
    in no restored state. The first driver said that no coordinator ran its attempt (after 1 s here,
    30 by default), naming the topic prefix to check."""
    from events.dev.broker import create_topics

    words, job_id = given.words, given.job_id
    words.produce(100)
    unrun = f"t{uuid.uuid4().hex[:8]}."
    create_topics(bootstrap, Topics(unrun).all)
    settings = replace(_settings(bootstrap, unrun, given.topic, tmp_path, job_id), unscheduled_warning_s=1.0)
    with CheckpointedJob(spark, settings) as first:
        _start(spark, first, tmp_path / "first-out")
        commits = first.work_dir / "spark" / "commits"
        _wait(lambda: commits.is_dir() and any(commits.iterdir()), "the first driver's first batch")
        warned = f"job {job_id} attempt 1: no coordinator has run it"
        _wait(lambda: any(r.getMessage().startswith(warned) for r in caplog.records), "the driver's warning")
    assert first.attempt == 1
    [warning] = [r.getMessage() for r in caplog.records if r.getMessage().startswith(warned)]
    assert f"with topic prefix {unrun!r}?" in warning

    out = tmp_path / "out"
    with CheckpointedJob(spark, _settings(bootstrap, topic_prefix, given.topic, tmp_path, job_id)) as job:
        assert job.attempt == 1 and job.work_dir == first.work_dir
        _start(spark, job, out)
        job.wait_for_running(60)
        words.produce(20)
        _wait(lambda: read_counts(out) == words.produced, "every word counted", 60)
        job.stop()
    _assert_exactly_once(words.produced, out)
    assert [p.name for p in job.work_dir.glob("spark-before-*")] == [f"spark-before-{job.run_id}"]
