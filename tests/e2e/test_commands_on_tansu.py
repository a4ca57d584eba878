"""Every ``cutline`` command on the embedded Tansu broker, the demo's default (pip only).

The rest of the suite runs on Apache Kafka (tests/conftest.py); these tests keep the embedded broker
working for users who have nothing but pip. As a user would: ``cutline broker`` started on a port,
``cutline topics create``, ``cutline coordinator``, a job's driver and task under ``cutline run``,
then each command that talks to them; ``stop`` and ``cancel`` end the two jobs last. The whole
demo on Tansu is tests/e2e/test_demo.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import TEST_FETCH_WAIT_MS, eventually

from coordinator.service.job_runner import EXIT_CANCELED
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import free_port, wait_for_broker

pytestmark = [pytest.mark.tansu, pytest.mark.slow]

PREFIX = "smoke."
JOBS = ("smoke-stopped", "smoke-canceled")

DRIVER = textwrap.dedent(
    """
    import os, threading
    from events.task.participant import JobDriver, Participant
    from events.wire.records import CheckpointConfig
    from events.wire.topics import Topics

    topics = Topics(os.environ["CUTLINE_TOPIC_PREFIX"])
    bootstrap, job = os.environ["CUTLINE_BOOTSTRAP"], os.environ["CUTLINE_JOB"]
    driver = JobDriver(bootstrap, job, topics)
    ended = threading.Event()

    def stopped(status, drain):
        driver.status(status)
        ended.set()

    task = Participant(
        bootstrap, job, "t0", 1, topics, lambda barrier: b"state", lambda: {"in:0": 1}, on_stop=stopped
    )
    task.run_in_thread()
    config = CheckpointConfig(300, os.environ["CHECKPOINTS"])
    driver.running(["t0"], config, int(os.environ["CUTLINE_ATTEMPT"]))
    ended.wait()
    task.close()
    driver.close()
    """
)
"""A job's driver with its one task in-process: checkpoints every 300 ms until a stop or cancel."""


def cutline(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "CUTLINE_BOOTSTRAP"}
    return subprocess.run(
        [sys.executable, "-m", "coordinator.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**environment, "COLUMNS": "200"},
    )


@dataclass
class Installation:
    """cutline on Tansu: the broker, a coordinator, and the jobs running under ``cutline run``."""

    bootstrap: str
    coordinator: CoordinatorProcess
    runs: dict[str, subprocess.Popen[str]]
    savepoints: Path

    @property
    def kafka(self) -> tuple[str, ...]:
        return ("--bootstrap", self.bootstrap, "--topic-prefix", PREFIX)


@pytest.fixture(name="tansu", scope="module")
def _tansu() -> Iterator[str]:
    """``cutline broker --port N``: it prints its address, serves Kafka, and stops on Ctrl-C."""
    port = free_port()
    command = [sys.executable, "-m", "coordinator.cli", "broker", "--port", str(port)]
    broker = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert broker.stdout is not None
        assert f"bootstrap: 127.0.0.1:{port}" == broker.stdout.readline().strip()
        assert wait_for_broker(f"127.0.0.1:{port}", timeout=30)
        yield f"127.0.0.1:{port}"
    finally:
        broker.send_signal(signal.SIGINT)
        assert 0 == broker.wait(30)


@pytest.fixture(name="installation", scope="module")
def _installation(
    tansu: str, tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> Iterator[Installation]:
    """``cutline topics create``, ``cutline coordinator`` and two jobs under ``cutline run``, each of
    them checkpointing."""
    monkeypatch_module.setenv("CUTLINE_FETCH_WAIT_MS", TEST_FETCH_WAIT_MS)  # Tansu's, not Kafka's
    created = cutline("topics", "create", "--bootstrap", tansu, "--topic-prefix", PREFIX, "--partitions", "2")
    assert 0 == created.returncode, created.stderr
    assert 9 == created.stdout.count("created")

    root = tmp_path_factory.mktemp("tansu")
    script = root / "driver.py"
    script.write_text(DRIVER)
    environment = {**os.environ, "CHECKPOINTS": (root / "checkpoints").as_uri(), "COLUMNS": "200"}
    runs: dict[str, subprocess.Popen[str]] = {}
    with CoordinatorProcess(tansu, PREFIX) as coordinator:
        try:
            for job in JOBS:
                runs[job] = subprocess.Popen(
                    [sys.executable, "-m", "coordinator.cli", "run", "--job", job, "--bootstrap", tansu,
                     "--topic-prefix", PREFIX, "--", sys.executable, str(script)],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment,
                )  # fmt: skip
            for job in JOBS:
                eventually(
                    lambda job=job: coordinator.get(f"/jobs/{job}/checkpoints").get("counts", {}),
                    lambda counts: counts.get("completed", 0) >= 1,
                    timeout=60,
                    what=f"a completed checkpoint of {job}",
                )
            yield Installation(tansu, coordinator, runs, root / "savepoints")
        finally:
            for run in runs.values():
                if run.poll() is None:
                    run.terminate()
                    run.communicate(timeout=30)


@pytest.fixture(name="monkeypatch_module", scope="module")
def _monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


COMMANDS = {
    "status": (("status", JOBS[0], "--url", "{url}"), f"checkpoints of {JOBS[0]}"),
    "list": (("list", "--url", "{url}"), "RUNNING"),
    "trigger": (("trigger", JOBS[0], "{kafka}"), "completed at file://"),
    "trigger --savepoint": (("trigger", JOBS[0], "--savepoint", "{savepoints}", "{kafka}"), "completed at"),
    "savepoints list": (("savepoints", "list", JOBS[0], "{kafka}"), "{savepoints}"),
    "tail": (("tail", "checkpoints", "--from-beginning", "--count", "5", "{kafka}"), "CoordinatorClaimed"),
    "replay --verify": (("replay", "{kafka}", "--verify", "--quiet"), "verified:"),
    "doctor": (("doctor", "{kafka}", "--url", "{url}"), "journal retention"),
}
"""Each command as a user types it (``{kafka}`` is ``--bootstrap B --topic-prefix P``), and what its
output says when it worked. In this order: ``savepoints list`` finds the savepoint triggered before."""


@pytest.mark.parametrize("command", COMMANDS)
def test_the_command_works_on_tansu(installation: Installation, command: str) -> None:
    args, expected = COMMANDS[command]
    values = {"url": installation.coordinator.url, "savepoints": str(installation.savepoints)}
    line: list[str] = []
    for arg in args:
        line += installation.kafka if arg == "{kafka}" else [arg.format(**values)]

    result = cutline(*line)

    assert 0 == result.returncode, result.stdout + result.stderr
    assert expected.format(**values) in result.stdout, result.stdout


def test_the_doctor_of_another_prefix_than_the_coordinator_s_fails_saying_which_it_serves(
    installation: Installation,
) -> None:
    """A job on a mistyped prefix gets no checkpoint: ``cutline doctor`` with that prefix and the
    coordinator's ``--url`` fails its coordinator check, naming the prefix the coordinator serves."""
    result = cutline(
        "doctor", "--json", "--bootstrap", installation.bootstrap, "--topic-prefix", "typo.",
        "--url", installation.coordinator.url,
    )  # fmt: skip

    checks = {check["name"]: check for check in map(json.loads, result.stdout.splitlines())}
    assert 1 == result.returncode, result.stdout + result.stderr
    assert "fail" == checks["coordinator"]["verdict"]
    assert f"is the coordinator of topic prefix {PREFIX!r}, not 'typo.'" in checks["coordinator"]["found"]


@pytest.mark.parametrize(
    ("command", "job", "ended", "run_exit"),
    [("stop", JOBS[0], "FINISHED", 0), ("cancel", JOBS[1], "CANCELED", EXIT_CANCELED)],
)
def test_stop_and_cancel_end_a_job_and_its_run(
    installation: Installation, command: str, job: str, ended: str, run_exit: int
) -> None:
    """``cutline stop`` (with a savepoint) and ``cutline cancel``: the task's stop callback ends the
    job, and ``cutline run`` exits with it (0 when FINISHED, 130 when CANCELED)."""
    extra = ("--savepoint", str(installation.savepoints)) if command == "stop" else ()

    result = cutline(command, job, *extra, *installation.kafka, "--timeout", "30")

    assert 0 == result.returncode, result.stdout + result.stderr
    assert f"job {job} is {ended}" in result.stdout
    output, _ = installation.runs[job].communicate(timeout=60)
    assert run_exit == installation.runs[job].returncode, output
