"""``python -m spark_tasks.wordcount`` on Spark's own kafka connector, as the demo runs it: it says which
source it reads with, and ``--idle-stop`` stops it once its input is read, though every checkpoint
still makes a micro-batch (of the ``cutline-barriers`` source's row alone), with a real broker, a
real coordinator process and a real Spark.

The driver is a child process: the connector's jars reach a driver only when its JVM starts.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from connector_jobs import SHUFFLE, STARTS_S
from wordfeed import Input, wait

from coordinator.service.supervisor import CoordinatorProcess
from spark_tasks.wordcount import SparkDriver, read_counts

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(600)]

IDLE_STOP_S = 8


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module."""
    return f"t{uuid.uuid4().hex[:8]}."


def test_the_word_count_on_the_connector_says_so_and_stops_when_its_input_is_read(
    bootstrap: str, topic_prefix: str, coordinator: CoordinatorProcess, tmp_path: Path, given: Input
) -> None:
    """Given 60 lines of words in a 4-partition topic, when the keyed word count runs with no
    ``--source`` where the connector's jars resolve, a checkpoint every second and ``--idle-stop 8``:
    its first line says it reads with Spark's kafka connector; it reads the words, goes on completing
    checkpoints on batches of barrier rows alone, and stops FINISHED (exit 0) 8 s after the last
    record, its output counting every word once. (With the barrier source's rows taken for records,
    every checkpoint reset the idle clock and it never stopped.)"""
    given.words.produce(60)
    out = tmp_path / "out"
    logs = tmp_path / "logs"
    logs.mkdir()
    driver = SparkDriver(
        [
            *("--bootstrap", bootstrap, "--job", given.job_id, "--topic", given.topic),
            *("--topic-prefix", topic_prefix, "--work-dir", str(tmp_path / "work"), "--out", str(out)),
            *("--location", (tmp_path / "checkpoints").as_uri(), "--keyed", str(SHUFFLE)),
            *("--interval-ms", "1000", "--idle-stop", str(IDLE_STOP_S)),
        ],
        logs,
    )
    driver.start()
    try:
        wait(lambda: bool(driver.seen("running")), "the word count RUNNING", STARTS_S)
        wait(lambda: read_counts(out) == given.words.produced, "every word counted", 120)
        wait(
            lambda: driver.returncode is not None, f"the word count stopped by --idle-stop {IDLE_STOP_S}", 120
        )
    finally:
        driver.stop(10)

    assert 0 == driver.returncode, driver.tail()
    source = driver.seen("source")
    assert ["kafka"] == [event["source"] for event in source]
    assert source[0]["line"].startswith("source: Spark's kafka connector ")
    completed = driver.seen("completed")
    idle_checkpoints = [c for c in completed if c["offsets"] == completed[-1]["offsets"]]
    assert len(idle_checkpoints) >= 2, completed  # barrier batches after the input was read
    assert 1 == len(driver.seen("stopped"))
    assert given.words.produced == read_counts(out)
