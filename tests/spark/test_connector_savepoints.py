"""Stop with a savepoint on Spark's own kafka connector, and savepoints across the two sources
(docs/spark.md, "Checkpoints on Spark's own kafka connector"): the keyed word count's savepoint taken
on the connector restores into a ``cutline-kafka`` job, whose savepoint restores into the connector
again, with a real broker, a real coordinator process and a real Spark.

The drivers are child processes (``connector_session.py job``), as in test_connector_job.py.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from connector_jobs import (
    STARTS_S,
    batches_after_the_stop,
    driver,
    last_cut_end,
    spark_starting_offsets,
    stop_with_savepoint,
)
from connector_session import ConnectorDriver
from wordfeed import Input, every, wait

from coordinator.service.supervisor import CoordinatorProcess
from spark_tasks.sink import ROLLED_BACK_DIR
from spark_tasks.wordcount import final_counts, read_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
"""Three driver starts on a loaded 2-core machine, each up to :data:`STARTS_S`."""


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module."""
    return f"t{uuid.uuid4().hex[:8]}."


def test_connector_stop_with_savepoint_restores_into_cutline_kafka_and_back_with_nothing_rolled_back(
    bootstrap: str, topic_prefix: str, coordinator: CoordinatorProcess, tmp_path: Path, given: Input
) -> None:
    """Given the keyed word count on the connector while words keep coming, when it is stopped with
    a savepoint, then it ends FINISHED with its output ending exactly at the savepoint's offsets
    (the barrier source held every batch after the stop's); that savepoint restores into the same
    job on ``cutline-kafka`` with nothing rolled back, whose own stop savepoint restores into the
    connector again, which starts at exactly its offsets; every word is counted once."""
    words, job_id, out = given.words, given.job_id, tmp_path / "out"
    words.produce(60)
    producing = threading.Event()
    feeder = threading.Thread(target=every, args=(0.2, producing, lambda: words.produce(3)), daemon=True)
    drivers: list[ConnectorDriver] = []
    try:
        drivers.append(driver(given, bootstrap, topic_prefix, tmp_path, 1))
        wait(lambda: bool(drivers[0].seen("running")), "the connector's attempt RUNNING", STARTS_S)
        feeder.start()
        wait(lambda: bool(drivers[0].seen("completed")), "a checkpoint on the connector", 120)
        on_connector = stop_with_savepoint(drivers[0], bootstrap, topic_prefix, job_id, 1, tmp_path / "sp1")
        producing.set()
        feeder.join(10)
        assert dict(on_connector.offsets) == last_cut_end(out)
        # the barrier source held: Spark planned no batch after the stop's, though words kept coming
        assert [] == batches_after_the_stop(tmp_path / "work" / "attempt-1" / "spark")

        words.produce(40)
        restore = ["--restore", on_connector.location]
        drivers.append(
            driver(given, bootstrap, topic_prefix, tmp_path, 2, "--source", "cutline-kafka", *restore)
        )
        wait(lambda: bool(drivers[1].seen("running")), "the cutline-kafka attempt RUNNING", STARTS_S)
        assert {"checkpoint_id": on_connector.checkpoint_id, "rolled_back": 0} == {
            k: drivers[1].seen("restored")[0][k] for k in ("checkpoint_id", "rolled_back")
        }
        wait(lambda: final_counts(out) == dict(words.produced), "every word counted on cutline-kafka", 120)
        on_python = stop_with_savepoint(drivers[1], bootstrap, topic_prefix, job_id, 2, tmp_path / "sp2")
        assert dict(on_python.offsets) == last_cut_end(out)

        words.produce(40)
        drivers.append(driver(given, bootstrap, topic_prefix, tmp_path, 3, "--restore", on_python.location))
        wait(lambda: bool(drivers[2].seen("running")), "the connector's attempt RUNNING again", STARTS_S)
        assert 0 == drivers[2].seen("restored")[0]["rolled_back"]
        assert dict(on_python.offsets) == spark_starting_offsets(tmp_path / "work" / "attempt-3" / "spark")
        wait(
            lambda: final_counts(out) == dict(words.produced),
            "every word counted on the connector again",
            120,
        )
        assert 0 == drivers[2].stop()
    finally:
        producing.set()
        for running in drivers:
            running.stop(30)
    assert not (out / ROLLED_BACK_DIR).exists()
    assert read_counts(out) == words.produced
