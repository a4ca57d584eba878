"""A keyed job on Spark's own kafka connector through three driver SIGKILLs and a rescale 4 → 2 → 8
(docs/spark.md, "Checkpoints on Spark's own kafka connector"), with a real broker, a real coordinator
process and a real Spark. The drivers are child processes, as in test_connector_job.py.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from connector_jobs import STARTS_S, completions, driver, spark_starting_offsets
from connector_session import ConnectorDriver
from wordfeed import Input, every, wait

from coordinator.service.supervisor import CoordinatorProcess
from spark_tasks.connector_cuts import SOURCE_TASK
from spark_tasks.keyed import keyed_task_id
from spark_tasks.wordcount import final_counts, read_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
"""Four driver starts on a loaded 2-core machine, each up to :data:`STARTS_S`."""

SHUFFLES = (4, 2, 8, 8)
"""The shuffle partitions of each attempt: killed at 4, restored with 2, killed, restored with 8,
killed, restored with 8 again."""


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module."""
    return f"t{uuid.uuid4().hex[:8]}."


def start_attempt(
    given: Input, bootstrap: str, prefix: str, tmp_path: Path, attempt: int, shuffle: int
) -> ConnectorDriver:
    """Start attempt ``attempt`` with ``shuffle`` shuffle partitions and wait until it RUNS: one task
    per shuffle partition and the source; after the first, the previous attempt's latest checkpoint
    restored and the connector starting at exactly its offsets."""
    running = driver(given, bootstrap, prefix, tmp_path, attempt, "--keyed", str(shuffle))
    wait(lambda: bool(running.seen("running")), f"attempt {attempt} RUNNING", STARTS_S)
    assert [keyed_task_id(i) for i in range(shuffle)] + [SOURCE_TASK] == running.seen("running")[0]["tasks"]
    if attempt > 1:
        latest = completions(bootstrap, prefix, given.job_id, attempt - 1)[-1]
        assert latest.checkpoint_id == running.seen("restored")[0]["checkpoint_id"]
        spark = tmp_path / "work" / f"attempt-{attempt}" / "spark"
        assert dict(latest.offsets) == spark_starting_offsets(spark)
    return running


def kill_after_two_checkpoints(running: ConnectorDriver, attempt: int) -> None:
    wait(lambda: len(running.seen("completed")) >= 2, f"2 checkpoints of attempt {attempt}", 120)
    running.kill()


def test_connector_keyed_job_is_exact_through_three_driver_kills_and_a_rescale_4_2_8(
    bootstrap: str, topic_prefix: str, coordinator: CoordinatorProcess, tmp_path: Path, given: Input
) -> None:
    """Given the keyed word count on the connector while words keep coming, each attempt is SIGKILLed
    after two checkpoints of its own, three times, and the next restores the latest with another
    number of shuffle partitions (4, then 2, then 8): each restores the previous attempt's latest
    checkpoint, its connector starting at exactly its offsets; the last counts every word once."""
    words, out = given.words, tmp_path / "out"
    words.produce(40)
    producing = threading.Event()
    feeder = threading.Thread(target=every, args=(0.3, producing, lambda: words.produce(2)), daemon=True)
    feeder.start()
    drivers: list[ConnectorDriver] = []
    try:
        for attempt, shuffle in enumerate(SHUFFLES[:-1], start=1):
            drivers.append(start_attempt(given, bootstrap, topic_prefix, tmp_path, attempt, shuffle))
            kill_after_two_checkpoints(drivers[-1], attempt)
        last = start_attempt(given, bootstrap, topic_prefix, tmp_path, len(SHUFFLES), SHUFFLES[-1])
        drivers.append(last)
        producing.set()
        feeder.join(10)
        wait(lambda: final_counts(out) == dict(words.produced), "every word counted at the end", 180)
        assert 0 == last.stop()
    finally:
        producing.set()
        for running in drivers:
            running.stop(30)
    assert read_counts(out) == words.produced
