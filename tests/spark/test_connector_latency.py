"""Latency markers on Spark's own kafka connector (docs/spark.md, "Latency markers"): the
``cutline-barriers`` source folds them into a batch's end and emits their row, which goes through
the union and the shuffle as the records do, with a real broker, a real coordinator process and a
real Spark. The driver is a child process (``connector_marked_driver.py``), as in
test_connector_job.py.
"""

from __future__ import annotations

import json
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest
from connector_jobs import STARTS_S, driver, latency_histograms
from connector_session import ConnectorDriver
from wordfeed import Input, every, wait

from coordinator.service.supervisor import CoordinatorProcess
from spark_tasks.wordcount import final_counts, read_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
"""One driver start on a loaded 2-core machine, up to :data:`STARTS_S`."""

SHUFFLE = 2


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module."""
    return f"t{uuid.uuid4().hex[:8]}."


def test_connector_latency_markers_cross_the_union_and_the_shuffle_and_never_reach_user_code(
    bootstrap: str, topic_prefix: str, coordinator: CoordinatorProcess, tmp_path: Path, given: Input
) -> None:
    """Given the keyed word count on the connector with 2 shuffle partitions and latency markers
    every 300 ms while words keep coming, the coordinator's /metrics has the connector's latencies
    for the map side (the marker's one source subtask), every shuffle partition and the sink, and no
    other source; the fastest latency grows along the path (route, keyed, sink). User code never sees a
    marker: every word is counted exactly once (a marker row, with no value, would break key_by)."""
    words, job_id, out = given.words, given.job_id, tmp_path / "out"
    expected = {
        ("kafka", "route", "0"),
        *(("kafka", "keyed", f"{i}") for i in range(SHUFFLE)),
        ("kafka", "sink", "0"),
    }
    words.produce(40)
    producing = threading.Event()
    feeder = threading.Thread(target=every, args=(0.1, producing, lambda: words.produce(4)), daemon=True)
    running: ConnectorDriver | None = None
    try:
        running = driver(given, bootstrap, topic_prefix, tmp_path, 1, "--keyed", str(SHUFFLE), latency_ms=300)
        wait(lambda: bool(running.seen("running")), "the job RUNNING", STARTS_S)
        feeder.start()
        wait(
            lambda: set(latency_histograms(coordinator.url, job_id)) == expected,
            "latency of every operator subtask at /metrics",
            180,
        )
        producing.set()
        feeder.join(10)
        wait(lambda: final_counts(out) == dict(words.produced), "every word counted", 120)
        assert 0 == running.stop()
    finally:
        producing.set()
        if running is not None:
            running.stop(30)
    assert read_counts(out) == words.produced
    histograms = latency_histograms(coordinator.url, job_id)
    assert all(count > 0 and total >= 0 for count, total in histograms.values()), histograms
    with urllib.request.urlopen(f"{coordinator.url}/jobs/{job_id}/latency", timeout=10) as response:
        shown = json.load(response)
    operators = {row["operator_id"]: row for row in shown["operators"]}
    assert {"route", "keyed", "sink"} == set(operators)  # in the order their first measurement came
    # a marker's latency only grows along its path, but the operators measured different markers
    # (two shuffle partitions each; a marker measured at keyed whose batch had not reached the sink):
    # their medians need not be ordered, the fastest marker's latencies must be
    assert operators["route"]["min"] <= operators["keyed"]["min"] <= operators["sink"]["min"], operators
