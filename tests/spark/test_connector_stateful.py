"""Per-partition state on Spark's own kafka connector (docs/spark.md, "Checkpoints on Spark's own
kafka connector"): the word count's ``StatefulStep`` (one state per Kafka partition, no shuffle)
reading ``format("kafka")``, through a driver SIGKILL, a restore, a stop with a savepoint restored on
``cutline-kafka`` and that job's stop savepoint restored on the connector again, with a real broker,
a real coordinator process and a real Spark.

The drivers are child processes (``connector_session.py job``), as in test_connector_job.py.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from connector_jobs import (
    STARTS_S,
    batch_ends,
    committed,
    completions,
    last_cut_end,
    latency_histograms,
    partition_driver,
    running_totals_that_break,
    spark_starting_offsets,
    stop_with_savepoint,
)
from connector_session import ConnectorDriver
from wordfeed import PARTITIONS, Input, every, wait

from coordinator.service.supervisor import CoordinatorProcess
from spark_tasks.wordcount import read_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
"""Four driver starts on a loaded 2-core machine, each up to :data:`STARTS_S`."""


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module."""
    return f"t{uuid.uuid4().hex[:8]}."


def all_counted(out: Path, given: Input) -> bool:
    """Has the output counted as many words as were produced (each word's ``added`` summed)?"""
    return sum(read_counts(out).values()) >= sum(given.words.produced.values())


def test_connector_per_partition_job_is_exact_across_a_kill_and_savepoints_into_cutline_kafka_and_back(
    bootstrap: str, topic_prefix: str, coordinator: CoordinatorProcess, tmp_path: Path, given: Input
) -> None:
    """Given the per-partition word count on the connector over 4 partitions with latency markers,
    words arriving all the time: it RUNS with one task per Kafka partition, every checkpoint holds a
    snapshot of each partition's state at a cut that is one batch end of Spark's offset log on all
    partitions, the group holds the latest cut, and the step and the sink report latencies. When the
    driver is SIGKILLed, the next attempt's connector starts at exactly the restored offsets; its stop
    savepoint restores into the same job on cutline-kafka with nothing rolled back, whose own stop
    savepoint restores into the connector again at exactly its offsets. Every word is counted once,
    and every partition's count carries on from its restored state."""
    words, job_id, out = given.words, given.job_id, tmp_path / "out"
    tasks = [f"{given.topic}-{p}" for p in range(PARTITIONS)]
    words.produce(60)
    producing = threading.Event()
    feeder = threading.Thread(target=every, args=(0.2, producing, lambda: words.produce(3)), daemon=True)
    drivers: list[ConnectorDriver] = []
    try:
        drivers.append(partition_driver(given, bootstrap, topic_prefix, tmp_path, 1, latency_ms=300))
        wait(lambda: bool(drivers[0].seen("running")), "the first attempt RUNNING", STARTS_S)
        assert tasks == drivers[0].seen("running")[0]["tasks"]
        feeder.start()
        wait(lambda: len(drivers[0].seen("completed")) >= 3, "3 checkpoints of the first attempt", 120)
        own = completions(bootstrap, topic_prefix, job_id, 1)
        starts = [
            {f"{given.topic}:{p}": 0 for p in range(PARTITIONS)},
            *batch_ends(tmp_path / "work" / "attempt-1" / "spark"),
        ]
        for completed in own:
            assert tasks == sorted(completed.handles)
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
        wait(
            lambda: (
                {(s, op, i) for s, op, i in latency_histograms(coordinator.url, job_id)}
                >= {("kafka", "step", "0"), ("kafka", "sink", "0")}
            ),
            "the step's and the sink's latencies at /metrics",
            60,
        )

        drivers[0].kill()
        words.produce(40)
        drivers.append(partition_driver(given, bootstrap, topic_prefix, tmp_path, 2))
        wait(lambda: bool(drivers[1].seen("running")), "the second attempt RUNNING", STARTS_S)
        latest = completions(bootstrap, topic_prefix, job_id, 1)[-1]
        assert latest.checkpoint_id == drivers[1].seen("restored")[0]["checkpoint_id"]
        assert dict(latest.offsets) == spark_starting_offsets(tmp_path / "work" / "attempt-2" / "spark")
        wait(lambda: bool(drivers[1].seen("completed")), "a checkpoint of the second attempt", 120)
        savepoint = stop_with_savepoint(drivers[1], bootstrap, topic_prefix, job_id, 2, tmp_path / "sp")
        producing.set()
        feeder.join(10)
        assert tasks == sorted(savepoint.handles)
        assert dict(savepoint.offsets) == last_cut_end(out)

        words.produce(40)
        restore = ["--source", "cutline-kafka", "--restore", savepoint.location]
        drivers.append(partition_driver(given, bootstrap, topic_prefix, tmp_path, 3, *restore))
        wait(lambda: bool(drivers[2].seen("running")), "the cutline-kafka attempt RUNNING", STARTS_S)
        assert 0 == drivers[2].seen("restored")[0]["rolled_back"]
        wait(lambda: all_counted(out, given), "every word counted on cutline-kafka", 120)
        on_python = stop_with_savepoint(drivers[2], bootstrap, topic_prefix, job_id, 3, tmp_path / "sp2")

        words.produce(40)
        drivers.append(
            partition_driver(given, bootstrap, topic_prefix, tmp_path, 4, "--restore", on_python.location)
        )
        wait(lambda: bool(drivers[3].seen("running")), "the connector's attempt RUNNING again", STARTS_S)
        assert 0 == drivers[3].seen("restored")[0]["rolled_back"]
        assert dict(on_python.offsets) == spark_starting_offsets(tmp_path / "work" / "attempt-4" / "spark")
        wait(lambda: all_counted(out, given), "every word counted on the connector again", 120)
        assert 0 == drivers[3].stop()
    finally:
        producing.set()
        for running in drivers:
            running.stop(30)
    assert read_counts(out) == words.produced
    assert [] == running_totals_that_break(out)
