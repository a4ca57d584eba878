"""Spark Connect (docs/spark.md, "Spark Connect"): the keyed word count under ``CheckpointedJob``
through a Connect session (``SparkSession.builder.remote``) on a Connect server started from the
installed PySpark, with a real broker and a real coordinator process.

The job's driver is ``python -m spark_tasks.wordcount --remote``, a child process: this process
never holds a Connect session, so the classic ``spark`` fixture of the other modules is untouched.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from connect_server import ConnectServer
from wordfeed import PARTITIONS, Input, wait

from coordinator.service.supervisor import CoordinatorProcess
from events.task.participant import JobDriver
from events.wire.records import CheckpointCompleted, JobStatus, SchedulerStarted, SchedulerStopped
from events.wire.topics import Topics
from spark_tasks.job import job_query_id
from spark_tasks.keyed import keyed_task_id
from spark_tasks.wordcount import SparkDriver, final_counts, read_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
"""Its waits add up to 750 s at most (two driver starts on a loaded machine), over the default 300."""

SHUFFLE = 2
"""Shuffle partitions: the cut across a shuffle, at the least cost on 2 cores."""

STARTS_S = 180.0
"""How long a driver may take to start its query and run a first batch through the server (the
server's Python workers start cold): 15-30 s on an idle 2-core machine, more when it is busy."""


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module."""
    return f"t{uuid.uuid4().hex[:8]}."


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A Spark Connect server for this module, launched without waiting for it: the tests list it
    before ``coordinator``, so the two start together, and wait for it (``wait_ready``) after."""
    server = ConnectServer(tmp_path_factory.mktemp("connect-server")).launch()
    try:
        yield server
    finally:
        server.stop()


def _driver(
    given: Input, bootstrap: str, prefix: str, tmp_path: Path, server: ConnectServer, n: int
) -> SparkDriver:
    args = [
        "--bootstrap", bootstrap, "--job", given.job_id, "--topic", given.topic, "--topic-prefix", prefix,
        "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
        "--location", (tmp_path / "checkpoints").as_uri(), "--keyed", str(SHUFFLE), "--interval-ms", "1000",
        "--remote", server.url,
    ]  # fmt: skip
    logs = tmp_path / f"driver-{n}"
    logs.mkdir()
    return SparkDriver(args, logs)


def _journal(bootstrap: str, prefix: str, job_id: str, *kinds: type) -> list[Any]:
    return JobDriver(bootstrap, job_id, Topics(prefix)).journal(kinds)


def _running(driver: SparkDriver) -> bool:
    """Is the driver's job RUNNING? Raises with its log's tail if the driver exited."""
    if driver.returncode is not None:
        raise RuntimeError(f"the driver exited with {driver.returncode}:\n{driver.tail(40)}")
    return bool(driver.seen("running"))


def test_a_keyed_word_count_checkpoints_and_restores_exactly_through_spark_connect_after_a_crash(
    connect_server: ConnectServer,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """Given the keyed word count over 4 input partitions and 2 shuffle partitions, its driver on a
    Spark Connect session: the job is RUNNING, its checkpoints complete with one manifest per
    shuffle partition and the offsets of every input partition, and its raw output is the exact
    count. Its driver is SIGKILLed: its query runs on in the server and counts what comes next. The
    next attempt, started at once through Connect too, stops that query before it restores the
    latest checkpoint (the job's query id), and counts on exactly; it ends CANCELED."""
    words, job_id, out = given.words, given.job_id, tmp_path / "out"
    connect_server.wait_ready()
    first = _driver(given, bootstrap, topic_prefix, tmp_path, connect_server, 1)
    second: SparkDriver | None = None
    try:
        words.produce(100)
        first.start()
        wait(lambda: _running(first), "the first attempt RUNNING", STARTS_S)
        assert first.seen("running")[0]["tasks"] == [keyed_task_id(i) for i in range(SHUFFLE)]
        words.produce(100)
        wait(lambda: len(first.seen("completed")) >= 2, "2 checkpoints of the first attempt", 60)
        wait(lambda: final_counts(out) == dict(words.produced), "every word counted", 60)
        before_crash = _journal(bootstrap, topic_prefix, job_id, CheckpointCompleted)[-1]
        assert sorted(before_crash.handles) == [keyed_task_id(i) for i in range(SHUFFLE)]
        assert sorted(before_crash.offsets) == [f"{given.topic}:{p}" for p in range(PARTITIONS)]
        first.kill()  # SIGKILL: no stop reaches the server
        words.produce(50)
        wait(lambda: final_counts(out) == dict(words.produced), "the crashed driver's query counting on", 60)

        second = _driver(given, bootstrap, topic_prefix, tmp_path, connect_server, 2)
        second.start()
        wait(lambda: _running(second), "the second attempt RUNNING", STARTS_S)
        restored = second.seen("restored")[0]
        completed = _journal(bootstrap, topic_prefix, job_id, CheckpointCompleted)
        assert restored["attempt"] == 2
        assert restored["checkpoint_id"] in [c.checkpoint_id for c in completed if c.attempt == 1]
        assert restored["checkpoint_id"] >= before_crash.checkpoint_id
        words.produce(50)
        wait(lambda: final_counts(out) == dict(words.produced), "every word counted after the restore", 90)
        assert 0 == second.stop()
    finally:
        for driver in (first, second):
            if driver is not None:
                driver.stop(grace=5)
    # the raw rows: the last count of each word is its count in the whole input, and what the rows
    # added sums to it (a row the restore wrote twice, or the crashed driver's query wrote after the
    # restore's rollback, or lost, would show)
    assert read_counts(out) == words.produced
    journal = _journal(bootstrap, topic_prefix, job_id, SchedulerStarted, SchedulerStopped)
    statuses = [(e.attempt, getattr(e, "status", None)) for e in journal]
    assert [attempt for attempt, status in statuses if status is None] == [1, 2]
    assert statuses[-1] == (2, JobStatus.CANCELED)
    # the queries ran on the server, and the second driver's claim of the job's query id stopped the
    # first's query there
    log = connect_server.log_path.read_text(errors="replace")
    assert log.count(f"Stopping existing streaming query [id={job_query_id(job_id, topic_prefix)}") == 1
