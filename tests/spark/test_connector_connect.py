"""A keyed and a per-partition job on Spark's own kafka connector through Spark Connect (docs/spark.md,
"Checkpoints on Spark's own kafka connector"): the Connect server (one for the module) has the
connector's jars, the job's driver is a Connect client, with a real broker and a real coordinator.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from connect_server import ConnectServer
from connector_jobs import (
    STARTS_S,
    completions,
    driver,
    last_cut_end,
    latency_histograms,
    partition_driver,
    running_totals_that_break,
    stop_with_savepoint,
)
from wordfeed import PARTITIONS, Input, wait

from coordinator.service.supervisor import CoordinatorProcess
from spark_tasks.connector import kafka_connector
from spark_tasks.connector_cuts import SOURCE_TASK
from spark_tasks.keyed import keyed_task_id
from spark_tasks.wordcount import final_counts, read_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


class ConnectorConnectServer(ConnectServer):
    """A Spark Connect server whose JVM starts with the connector's jars."""

    def command(self) -> list[str]:
        return [*super().command(), "--conf", f"spark.jars={kafka_connector().spark_jars}"]


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module."""
    return f"t{uuid.uuid4().hex[:8]}."


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """Launched before the coordinator starts, so that the two start together."""
    server = ConnectorConnectServer(tmp_path_factory.mktemp("connect-server")).launch()
    try:
        yield server
    finally:
        server.stop()


def test_connector_keyed_job_checkpoints_and_stops_with_a_savepoint_through_spark_connect(
    connect_server: ConnectServer,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """Given the keyed word count on the connector with its driver on a Spark Connect session: it is
    RUNNING with the source task, its checkpoints complete with one manifest per shuffle partition
    and a cut of every input partition, it counts every word once, and a stop with a savepoint ends
    it FINISHED with its output ending at the savepoint's offsets."""
    words, job_id, out = given.words, given.job_id, tmp_path / "out"
    words.produce(60)
    connect_server.wait_ready()
    running = driver(given, bootstrap, topic_prefix, tmp_path, 1, "--remote", connect_server.url)
    try:
        wait(lambda: bool(running.seen("running")), "the job RUNNING through Spark Connect", STARTS_S)
        assert [keyed_task_id(0), keyed_task_id(1), SOURCE_TASK] == running.seen("running")[0]["tasks"]
        words.produce(30)
        wait(lambda: len(running.seen("completed")) >= 2, "2 checkpoints", 120)
        latest = completions(bootstrap, topic_prefix, job_id, 1)[-1]
        assert [keyed_task_id(0), keyed_task_id(1)] == sorted(latest.handles)
        assert [f"{given.topic}:{p}" for p in range(4)] == sorted(latest.offsets)
        wait(lambda: final_counts(out) == dict(words.produced), "every word counted", 120)
        savepoint = stop_with_savepoint(running, bootstrap, topic_prefix, job_id, 1, tmp_path / "sp")
    finally:
        running.stop(30)
    assert dict(savepoint.offsets) == last_cut_end(out)
    assert read_counts(out) == words.produced


def test_connector_per_partition_job_checkpoints_and_stops_with_a_savepoint_through_spark_connect(
    connect_server: ConnectServer,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """Given the per-partition word count on the connector with latency markers and its driver on a
    Spark Connect session: it RUNS with one task per Kafka partition, its checkpoints complete with a
    snapshot of each, the step and the sink report latencies, it counts every word once with every
    partition's count running on, and a stop with a savepoint ends it FINISHED with its output ending
    at the savepoint's offsets."""
    words, job_id, out = given.words, given.job_id, tmp_path / "out"
    tasks = [f"{given.topic}-{p}" for p in range(PARTITIONS)]
    words.produce(60)
    connect_server.wait_ready()
    running = partition_driver(
        given, bootstrap, topic_prefix, tmp_path, 1, "--remote", connect_server.url, latency_ms=300
    )
    try:
        wait(lambda: bool(running.seen("running")), "the job RUNNING through Spark Connect", STARTS_S)
        assert tasks == running.seen("running")[0]["tasks"]
        words.produce(30)
        wait(lambda: len(running.seen("completed")) >= 2, "2 checkpoints", 120)
        latest = completions(bootstrap, topic_prefix, job_id, 1)[-1]
        assert tasks == sorted(latest.handles)
        assert [f"{given.topic}:{p}" for p in range(PARTITIONS)] == sorted(latest.offsets)
        wait(
            lambda: (
                {("kafka", "step", "0"), ("kafka", "sink", "0")}
                <= set(latency_histograms(coordinator.url, job_id))
            ),
            "the step's and the sink's latencies at /metrics",
            60,
        )
        wait(
            lambda: sum(read_counts(out).values()) >= sum(words.produced.values()), "every word counted", 120
        )
        savepoint = stop_with_savepoint(running, bootstrap, topic_prefix, job_id, 1, tmp_path / "sp")
    finally:
        running.stop(30)
    assert tasks == sorted(savepoint.handles)
    assert dict(savepoint.offsets) == last_cut_end(out)
    assert read_counts(out) == words.produced
    assert [] == running_totals_that_break(out)
