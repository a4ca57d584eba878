"""The main job, as a user runs it: ``cutline demo``, on its default broker, the embedded Tansu (or on
``CUTLINE_BOOTSTRAP``'s cluster where that is set), reading with its default source, Spark's own kafka
connector where its jars resolve; and ``cutline demo --broker kafka`` on Apache Kafka, on the same
default source, where its Kafka output's exactly-once line is what a ``read_committed`` consumer
proves."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import TEST_FETCH_WAIT_MS


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.tansu
@pytest.mark.timeout(720)
def test_demo_survives_a_crash_exactly_once_on_the_connector_where_it_resolves(tmp_path: object) -> None:
    """`cutline demo --duration 20` says which source it reads with (Spark's kafka connector where
    its jars resolve, as on the suite's machines) and SIGKILLs its Spark driver; the coordinator fails
    the attempt, the restart strategy schedules the next, `cutline run` starts it, it restores from a
    checkpoint, and the demo exits 0 with the exactly-once line of its summary.

    About a minute on an idle 2-core machine; two Spark starts make it several when the machine is
    busy (the demo gives each 300 s), hence the long timeout.
    """
    environment = {k: v for k, v in os.environ.items() if k != "CUTLINE_BOOTSTRAP"}
    bootstrap = os.environ.get("CUTLINE_BOOTSTRAP")
    args = ["--bootstrap", bootstrap] if bootstrap else []
    if not bootstrap:  # the suite's fetch wait is Apache Kafka's 500 ms: Tansu's is shorter
        environment["CUTLINE_FETCH_WAIT_MS"] = TEST_FETCH_WAIT_MS

    stdout, stderr = _demo(args, environment)

    _assert_the_story(stdout, stderr)
    on_connector = "source: Spark's kafka connector " in stdout
    assert on_connector or "source: cutline-kafka (Spark's kafka connector is not available: " in stdout
    if bootstrap:
        assert "exactly-once to Kafka: OK for a read_committed consumer" in stdout
    else:  # Tansu shows aborted transactions to read_committed consumers: the line says what it cannot show
        assert (
            "exactly-once to Kafka: OK as a read_committed consumer sees it" in stdout
            or "exactly-once to Kafka: not shown on Tansu" in stdout
        ), stdout[-3000:]


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(720)
def test_demo_on_apache_kafka_writes_its_counts_to_kafka_exactly_once() -> None:
    """`cutline demo --broker kafka --duration 20`: the same story on Apache Kafka, on the default source
    (Spark's kafka connector where its jars resolve), and a read_committed consumer of the job's Kafka
    output sees every word counted once across the crash."""
    environment = {k: v for k, v in os.environ.items() if k != "CUTLINE_BOOTSTRAP"}
    # the suite's 3 s worker session is below the group.min.session.timeout.ms (6 s) of the demo's broker
    environment["CUTLINE_SESSION_TIMEOUT"] = "6"

    stdout, stderr = _demo(["--broker", "kafka"], environment)

    _assert_the_story(stdout, stderr)
    assert "source: Spark's kafka connector " in stdout or "source: cutline-kafka (" in stdout
    assert "exactly-once to Kafka: OK for a read_committed consumer" in stdout


def _demo(args: list[str], environment: dict[str, str]) -> tuple[str, str]:
    """`cutline demo --duration 20 ARGS`: its output, once it exited 0."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "coordinator.cli", "demo", "--duration", "20", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**environment, "COLUMNS": "160"},
    )
    try:
        stdout, stderr = demo.communicate(timeout=660)
    except subprocess.TimeoutExpired:
        demo.terminate()  # SIGTERM: the demo stops its Spark driver, coordinator and broker
        try:
            stdout, stderr = demo.communicate(timeout=50)
        finally:
            demo.kill()
        pytest.fail("cutline demo did not end within 660 s:\n" + stdout[-3000:] + stderr[-3000:])

    assert 0 == demo.returncode, stdout[-3000:] + stderr[-3000:]
    return stdout, stderr


def _assert_the_story(stdout: str, stderr: str) -> None:
    """The crash, the restart the journal decided, the restore, the stop, and the file output's
    exactly-once line."""
    assert "exactly-once: OK" in stdout
    assert "every word's final count is right" in stdout  # the keyed job's rows are the final counts
    assert "shuffled by word into 8 keyed tasks" in stdout
    assert "SIGKILL of the job" in stdout
    assert "the restart strategy decided: attempt 2" in stdout  # carried out by `cutline run`
    assert "FAILING (attempt 1) → RESTARTING (attempt 2" in stdout
    assert "restored from checkpoint" in stdout
    # it ends as a user ends a job for an upgrade: `cutline stop` with a savepoint, FINISHED
    assert "the job is FINISHED with" in stdout and "(`cutline run` exit 0)" in stdout
    assert "checkpoints failed" not in stdout  # the aborts the crash and the stop cause are named
    assert "ERROR" not in stdout + stderr
