"""Exactly-once output of a Spark job to Kafka (docs/exactly-once.md, "The Spark sink"): the word count
writes ``key`` (the word) and ``value`` (the row, with the input partition and offset it counts)
through an ExactlyOnceKafkaSink, on a real local Spark, Apache Kafka and a coordinator process.

A ``read_committed`` reader must see every input word counted once: the ``added`` of its rows sum
to what was produced, and no (partition, offset, word) is there twice. A driver SIGKILLed after a
checkpoint completed and before its output was committed has it committed by the next driver; a
sink that does not read its marker duplicates output there, so the test can fail. Drivers SIGKILLed
before a barrier, after the snapshot and after the ack leave nothing, a file to delete, and a file
to commit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from support import eventually, on_apache_kafka
from wordfeed import Input, every, wait

from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import create_topics
from events.kafka.clients import consumer_config, read_partition_to_end
from events.task.exactly_once import transactional_id
from events.wire.records import CheckpointConfig, CheckpointKind, JobStopRequested
from spark_tasks.job import CheckpointedJob, JobSettings
from spark_tasks.kafka_sink import SINK_TASK, ExactlyOnceKafkaSink

pytestmark = pytest.mark.skipif(
    not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
)

APP = Path(__file__).with_name("kafka_sink_app.py")
STARTS_S = 300.0
"""How long a child driver may take to start its Spark and run a first checkpoint on busy cores."""


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module's tests."""
    return f"t{uuid.uuid4().hex[:8]}."


@dataclass(frozen=True)
class Output:
    """The rows a reader of the output topic sees: (partition, offset, word) → each ``added``."""

    rows: list[dict[str, Any]]

    @property
    def counted(self) -> Counter[str]:
        counted: Counter[str] = Counter()
        for row in self.rows:
            counted[row["word"]] += row["added"]
        return counted

    @property
    def twice(self) -> set[tuple[int, int, str]]:
        keys = Counter((r["partition"], r["offset"], r["word"]) for r in self.rows)
        return {key for key, n in keys.items() if n > 1}


def read_output(bootstrap: str, topic: str, isolation: str = "read_committed") -> Output:
    consumer = Consumer(consumer_config(bootstrap, extra={"isolation.level": isolation}))
    try:
        return Output([json.loads(m.value() or b"") for m in read_partition_to_end(consumer, topic, 0)])
    finally:
        consumer.close()


def every_word_counted(bootstrap: str, topic: str, produced: Counter[str]) -> Output:
    """What a read_committed reader sees once every produced word is counted (at least once)."""
    seen: Output = eventually(
        lambda: read_output(bootstrap, topic),
        lambda seen: all(seen.counted[w] >= n for w, n in produced.items()),
        timeout=180,
        what="every word's count committed",
    )
    return seen


@dataclass
class Driver:
    """A child Spark driver (tests/spark/kafka_sink_app.py) in its own process group, and what it said."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def said(self, prefix: str, timeout: float = STARTS_S) -> str:
        def heard() -> str | None:
            assert self.process.poll() is None, f"the driver exited {self.process.returncode}"
            return next((line for line in self.lines if line.startswith(prefix)), None)

        found: str = eventually(heard, timeout=timeout, interval=0.2, what=f"the driver to say {prefix!r}")
        return found

    def committed(self) -> list[int]:
        """The checkpoints whose output its sink committed, in order (its ``step committed`` lines)."""
        return [int(line.rsplit(" ", 1)[1]) for line in self.lines if line.startswith("step committed ")]

    def kill(self) -> None:
        """SIGKILL the driver with its JVM and Python workers."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


class Drivers:
    """Starts child drivers of one job, and kills what is left of them."""

    def __init__(self, bootstrap: str, prefix: str, given: Input, tmp_path: Path) -> None:
        self.settings = {
            "bootstrap": bootstrap,
            "prefix": prefix,
            "job": given.job_id,
            "input": given.topic,
            "output": f"{given.topic}-counts",
            "work_dir": str(tmp_path / "work"),
            "location": (tmp_path / "checkpoints").as_uri(),
        }
        create_topics(bootstrap, [self.output], partitions=1)
        self.logs = tmp_path
        self.started: list[Driver] = []

    @property
    def output(self) -> str:
        return self.settings["output"]

    def start(self, crash: tuple[str, int] | None = None, variant: str = "") -> Driver:
        settings = {**self.settings, "crash": crash, "variant": variant}
        with (self.logs / f"driver-{len(self.started)}.log").open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, str(APP)],
                env={**os.environ, "KAFKA_SINK_APP": json.dumps(settings), "PYTHONUNBUFFERED": "1"},
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        driver = Driver(process)
        assert process.stdout is not None
        stdout = process.stdout
        threading.Thread(
            target=lambda: driver.lines.extend(line.strip() for line in stdout), daemon=True
        ).start()
        self.started.append(driver)
        return driver

    def close(self) -> None:
        for driver in self.started:
            driver.kill()

    def __enter__(self) -> Drivers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture(name="drivers")
def _drivers(bootstrap: str, topic_prefix: str, given: Input, tmp_path: Path) -> Iterator[Drivers]:
    """Child drivers of the test's job (``given``); the sink's other test modules import it."""
    with Drivers(bootstrap, topic_prefix, given, tmp_path) as started:
        yield started


class Feeder:
    """Produces 5 lines of words every 0.2 s in a thread, until the block ends."""

    def __init__(self, given: Input) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=every, args=(0.2, self._stop, lambda: given.words.produce(5)))

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _killed_at(drivers: Drivers, given: Input, crash: str) -> int:
    """Attempt 1 runs with input arriving until it stops at ``crash`` of its second checkpoint or a
    later one, and is SIGKILLed there; the checkpoint it stopped at."""
    given.words.produce(40)
    first = drivers.start(crash=(crash, 2))
    with Feeder(given):
        stopped = first.said(f"stopped at {crash} ")
    first.kill()
    return int(stopped.rsplit(" ", 1)[1])


@dataclass(frozen=True)
class Recovery:
    """What a driver's recovery did with the staged output it found (its ``recovered`` line)."""

    commit: list[int]
    delete: list[int]

    @classmethod
    def said_by(cls, driver: Driver) -> Recovery:
        line = driver.said("recovered ")
        found = re.fullmatch(r"recovered commit=\[([\d, ]*)\] delete=\[([\d, ]*)\]", line)
        assert found is not None, line
        commit, delete = ([int(n) for n in group.split(",") if n.strip()] for group in found.groups())
        return cls(commit, delete)


def _resumed(drivers: Drivers, given: Input, variant: str = "") -> list[int]:
    """Attempt 2 restores the latest completed checkpoint and reads on, with more input: the
    checkpoints its recovery committed again."""
    second = drivers.start(variant=variant)
    recovery = Recovery.said_by(second)
    with Feeder(given):
        second.said("step committed ")
    return recovery.commit


@pytest.mark.parametrize(
    "crash",
    [
        pytest.param("committing", id="before-the-commit"),
        pytest.param("open", id="during-the-commit"),  # its records and marker at the broker, not committed
    ],
)
def test_exactly_once_when_the_driver_is_killed_after_the_completion(
    bootstrap: str, coordinator: CoordinatorProcess, given: Input, drivers: Drivers, crash: str
) -> None:
    # given: the driver SIGKILLed once checkpoint N completed, before its transaction or during it
    checkpoint_id = _killed_at(drivers, given, crash)
    # when: the next driver restores N and recovers
    committed = _resumed(drivers, given)
    # then: it commits N's staged output (and any later one's that completed before the kill), and
    # every word is counted exactly once
    assert committed[:1] == [checkpoint_id]
    seen = every_word_counted(bootstrap, drivers.output, given.words.produced)
    assert seen.twice == set(), f"rows committed twice: {sorted(seen.twice)[:5]}"
    assert seen.counted == given.words.produced
    if crash == "open":  # the dead driver's transaction was aborted: read_uncommitted sees N's rows twice
        assert read_output(bootstrap, drivers.output, "read_uncommitted").twice != set()


def _killed_again(drivers: Drivers, given: Input, crash: str) -> tuple[Recovery, int]:
    """The next driver recovers, runs with input arriving until it stops at ``crash`` (of its first
    checkpoint at which it can), and is SIGKILLed there: its recovery and the checkpoint it stopped at."""
    driver = drivers.start(crash=(crash, 1))
    recovery = Recovery.said_by(driver)
    with Feeder(given):
        stopped = driver.said(f"stopped at {crash} ")
    driver.kill()
    checkpoint_id = int(stopped.rsplit(" ", 1)[1])
    assert f"step committed {checkpoint_id}" not in driver.lines, "the crash point was passed"
    return recovery, checkpoint_id


@pytest.mark.timeout(600)  # four Spark drivers start in turn (about 90 s each on busy shared cores)
def test_exactly_once_when_the_driver_is_killed_before_the_completion(
    bootstrap: str, coordinator: CoordinatorProcess, given: Input, drivers: Drivers
) -> None:
    """Three drivers of one job, each SIGKILLed at a crash point before a checkpoint completed; the
    next driver's recovery shows what that point left, and a fourth driver runs to a commit."""
    # given: driver 1 killed before a barrier, its rows since checkpoint N (committed) only in memory
    given.words.produce(40)
    _killed_at(drivers, given, "buffered")
    # when: driver 2 recovers, then is killed after its snapshot (N2 staged) and before its tasks ack
    before_the_barrier, staged = _killed_again(drivers, given, "staged")
    # then: nothing was staged after N: nothing to commit again (the rows are read again)
    assert before_the_barrier.commit == []
    # when: driver 3 recovers, then is killed after its tasks acked N3, before its sink committed it
    before_the_ack, acked = _killed_again(drivers, given, "acked")
    # then: N2 never completed (its tasks never acked): its staged output is deleted, unsent
    assert staged in before_the_ack.delete and staged not in before_the_ack.commit
    # when: driver 4 recovers and runs to a commit
    before_the_completion = _resumed(drivers, given)
    # then: the journal completed N3 (before or after the kill: driver 3 committed nothing after it
    # started): its staged output is committed by driver 4
    assert before_the_completion[:1] == [acked]
    # and a read_committed reader sees every word counted exactly once
    seen = every_word_counted(bootstrap, drivers.output, given.words.produced)
    assert seen.twice == set(), f"rows committed twice: {sorted(seen.twice)[:5]}"
    assert seen.counted == given.words.produced
    # and read_uncommitted sees more only if a killed driver's commit (of an earlier checkpoint) was
    # open when it stopped: then its aborted rows, copies of committed ones
    aborted = _aborted_rows(bootstrap, drivers.output, seen)
    assert set(aborted) <= set(map(json.dumps, seen.rows))
    assert bool(aborted) == any(_left_open(driver) for driver in drivers.started[:-1])


def _aborted_rows(bootstrap: str, topic: str, committed: Output) -> Counter[str]:
    """The rows a read_uncommitted reader sees beyond the committed ones."""
    uncommitted = read_output(bootstrap, topic, "read_uncommitted")
    return Counter(map(json.dumps, uncommitted.rows)) - Counter(map(json.dumps, committed.rows))


def _left_open(driver: Driver) -> bool:
    """Whether the driver was killed with a commit's transaction open (records at the broker)."""
    opened = {line.rsplit(" ", 1)[1] for line in driver.lines if line.startswith("step open ")}
    done = {line.rsplit(" ", 1)[1] for line in driver.lines if line.startswith("step committed ")}
    return bool(opened - done)


def test_a_spark_sink_that_ignores_its_marker_duplicates_output(
    bootstrap: str, coordinator: CoordinatorProcess, given: Input, drivers: Drivers
) -> None:
    # given: the driver SIGKILLed after N's output was committed, before its staged file was deleted
    checkpoint_id = _killed_at(drivers, given, "committed")
    # when: the next driver recovers without reading the marker
    committed = _resumed(drivers, given, variant="no-marker")
    # then: it commits N's output again, and a read_committed reader sees it twice
    assert committed[:1] == [checkpoint_id]
    seen = every_word_counted(bootstrap, drivers.output, given.words.produced)
    assert seen.twice != set()
    assert seen.counted != given.words.produced


def _settings(bootstrap: str, prefix: str, given: Input, tmp_path: Path, timeout_ms: int) -> JobSettings:
    return JobSettings(
        job_id=given.job_id,
        bootstrap=bootstrap,
        topics=(given.topic,),
        config=CheckpointConfig(
            interval_ms=1000,
            timeout_ms=timeout_ms,
            tolerable_failures=1000,  # the expiries while the test holds a batch never fail the job
            location=(tmp_path / "checkpoints").as_uri(),
        ),
        work_dir=tmp_path / "work",
        topic_prefix=prefix,
    )


def _start(job: CheckpointedJob, sink: ExactlyOnceKafkaSink) -> None:
    from pyspark.sql.functions import col, struct, to_json

    from spark_tasks.wordcount import WORD_COUNT

    rows = struct("topic", "partition", "offset", "word", "added", "count")
    out = job.stream(WORD_COUNT).select(col("word").alias("key"), to_json(rows).alias("value"))
    job.start(out.writeStream.foreachBatch(sink).trigger(processingTime="200 milliseconds"))


def test_an_aborted_checkpoints_output_stays_invisible_and_the_transactional_id_survives_a_restart(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    given: Input,
    tmp_path: Path,
) -> None:
    output = f"{given.topic}-counts"
    create_topics(bootstrap, [output], partitions=1)
    held: list[int] = []
    release = threading.Event()

    def hold_the_first_barrier_batch(step: str, checkpoint_id: int) -> None:
        """Its batch waits before it runs: its tasks cannot ack, and the checkpoint expires."""
        if step == "staged" and not held:
            held.append(checkpoint_id)
            release.wait(120)

    # given: attempt 1, whose first checkpoint expires with its output staged
    given.words.produce(40)
    settings = _settings(bootstrap, topic_prefix, given, tmp_path, timeout_ms=3000)
    with CheckpointedJob(spark, settings) as job:
        sink = ExactlyOnceKafkaSink(job, topic=output, step=hold_the_first_barrier_batch)
        try:
            _start(job, sink)
            wait(lambda: bool(held), "the first barrier batch", 180)
            aborted = held[0]
            wait(lambda: any(a.checkpoint_id == aborted for a in job.aborted), "the checkpoint expired", 60)
            # then: nothing of its output is visible, nor even sent
            assert read_output(bootstrap, output).rows == []
            assert read_output(bootstrap, output, "read_uncommitted").rows == []
            assert list((tmp_path / "checkpoints" / given.job_id / f"chk-{aborted}").glob("driver.*.out"))
            release.set()
            # when: the next checkpoint completes, its commit takes the expired one's output too
            with Feeder(given):
                wait(lambda: sink.committed != [], "a commit", 120)
            assert sink.committed[0] == aborted
            job.stop()
        finally:
            release.set()
            sink.close()
    first_id = sink.transactional_id

    # when: attempt 2 restores, with more input
    with CheckpointedJob(spark, settings) as job:
        assert job.attempt == 2
        with ExactlyOnceKafkaSink(job, topic=output) as sink:
            # then: the same transactional id
            assert sink.transactional_id == first_id
            assert first_id == transactional_id(topic_prefix.rstrip("."), given.job_id, "kafka", SINK_TASK)
            _start(job, sink)
            with Feeder(given):
                wait(lambda: sink.committed != [], "a commit of attempt 2", 120)
            seen = every_word_counted(bootstrap, output, given.words.produced)
            job.stop()
    # and every word is counted once across the expiry and the restart
    assert seen.twice == set()
    assert seen.counted == given.words.produced


@pytest.mark.parametrize("drain", [pytest.param(False, id="stop"), pytest.param(True, id="stop-drain")])
def test_a_stop_with_a_savepoint_commits_the_output_up_to_its_cut(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    given: Input,
    tmp_path: Path,
    drain: bool,
) -> None:
    output = f"{given.topic}-counts"
    create_topics(bootstrap, [output], partitions=1)
    given.words.produce(40)
    # given: the job running, words arriving
    settings = _settings(bootstrap, topic_prefix, given, tmp_path, 20_000)
    with CheckpointedJob(spark, settings) as job, ExactlyOnceKafkaSink(job, topic=output) as sink:
        _start(job, sink)
        with Feeder(given):
            wait(lambda: sink.committed != [], "a first commit", 180)
            # when: cutline stop (with --drain or without)
            stop = JobStopRequested(
                given.job_id, int(time.time() * 1000), uuid.uuid4().hex, (tmp_path / "sp").as_uri(), drain
            )
            job.driver.request(stop)
            assert job.await_termination(60)
    # then: the savepoint's output is committed (by the time the sink is closed): the words of every
    # input record before its cut are counted once, and nothing after it
    (savepoint,) = [c for c in job.completed if c.kind is CheckpointKind.SAVEPOINT]
    assert sink.committed[-1] == savepoint.checkpoint_id
    # and the sink, called first, staged it before its tasks snapshotted (no OutputStagedLate) and
    # before the completion (the committer waited for no file)
    assert sink.staged_late == []
    seen = read_output(bootstrap, output)
    assert seen.twice == set()
    cut = {int(tp.rsplit(":", 1)[1]): offset for tp, offset in savepoint.offsets.items()}
    assert all(row["offset"] < cut[row["partition"]] for row in seen.rows)
    counted: Counter[tuple[int, str]] = Counter()
    for row in seen.rows:
        counted[(row["partition"], row["word"])] += row["added"]
    assert counted == words_before(bootstrap, given.topic, cut)


def words_before(bootstrap: str, topic: str, cut: dict[int, int]) -> Counter[tuple[int, str]]:
    """The words of the input records before ``cut``, by partition."""
    consumer = Consumer(consumer_config(bootstrap))
    try:
        return Counter(
            (partition, word)
            for partition, end in cut.items()
            for msg in read_partition_to_end(consumer, topic, partition)
            if (msg.offset() or 0) < end
            for word in (msg.value() or b"").decode().split()
        )
    finally:
        consumer.close()
