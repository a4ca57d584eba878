"""``cutline stop`` and ``cutline cancel`` against a real broker and coordinator, with a Python
``Participant`` job: the stop savepoint completes and the job ends FINISHED; a stop savepoint that a
task declines leaves the job running and the command exits 1; a cancel ends it CANCELED.

One coordinator serves the module; each test runs its own job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import create_protocol_topics

from coordinator.service.supervisor import CoordinatorProcess
from events.task.participant import JobDriver, Participant
from events.wire.records import CheckpointBarrier, CheckpointCompleted, CheckpointConfig, JobStatus
from events.wire.topics import Topics


@pytest.fixture(scope="module", name="topics")
def _topics(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topics]:
    topics = Topics(f"stop-{os.getpid()}-{time.monotonic_ns()}.")
    create_protocol_topics(bootstrap, topics.prefix)
    with CoordinatorProcess(bootstrap, topics.prefix):
        yield topics


def eventually(condition: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


class Job:
    """One task (a ``Participant`` in its own thread) and the job's driver, RUNNING with periodic
    checkpoints every 200 ms; the task's snapshot raises while ``fail`` is set (a decline)."""

    def __init__(self, bootstrap: str, topics: Topics, job_id: str, root: Path) -> None:
        self.fail: OSError | None = None
        self.stops: list[tuple[JobStatus, bool]] = []
        self.driver = JobDriver(bootstrap, job_id, topics)
        self.task = Participant(
            bootstrap, job_id, "t0", 1, topics, self.snapshot, lambda: {"in:0": 7}, on_stop=self.stopped
        )
        self.task.run_in_thread()
        config = CheckpointConfig(200, (root / "checkpoints").as_uri(), timeout_ms=5_000)
        self.driver.running(["t0"], config, attempt=1)
        eventually(lambda: self.task.stats.completed)  # the coordinator runs it and it checkpoints

    def snapshot(self, barrier: CheckpointBarrier) -> bytes:
        if self.fail is not None and barrier.stop:
            raise self.fail
        return b"state"

    def stopped(self, status: JobStatus, drain: bool) -> None:
        """The app's stop callback: it ends the job as the participant says."""
        self.stops.append((status, drain))
        self.driver.status(status)

    def close(self) -> None:
        self.task.close()
        self.driver.close()


@pytest.fixture(name="job")
def _job(bootstrap: str, topics: Topics, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Job]:
    job = Job(bootstrap, topics, request.node.name.replace("_", "-")[:40], tmp_path)
    yield job
    job.close()


def cutline(bootstrap: str, topics: Topics, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "coordinator.cli", *args, "--bootstrap", bootstrap]
    command += ["--topic-prefix", topics.prefix, "--timeout", "30"]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"}
    )


def test_stop_with_a_savepoint_ends_the_job_finished(
    bootstrap: str, topics: Topics, job: Job, tmp_path: Path
) -> None:
    """The savepoint completes into the directory, the task's stop callback runs (draining), the
    job ends FINISHED, and the command exits 0."""
    savepoints = tmp_path / "savepoints"

    done = cutline(bootstrap, topics, "stop", job.driver.job_id, "--savepoint", str(savepoints), "--drain")

    assert 0 == done.returncode, done.stdout + done.stderr
    assert [(JobStatus.FINISHED, True)] == job.stops
    completed = [c for c in job.driver.completions() if c.location.startswith(savepoints.as_uri())]
    assert [completed[0].checkpoint_id] == [c.checkpoint_id for c in completed]
    assert f"savepoint {completed[0].checkpoint_id} completed" in done.stdout
    assert f"job {job.driver.job_id} is FINISHED" in done.stdout


def test_a_stop_whose_savepoint_fails_leaves_the_job_running(
    bootstrap: str, topics: Topics, job: Job, tmp_path: Path
) -> None:
    """The task declines the stop savepoint: the command says why and exits 1; the job keeps
    running and checkpointing, and nothing told the task to stop."""
    job.fail = OSError("disk full")

    done = cutline(bootstrap, topics, "stop", job.driver.job_id, "--savepoint", str(tmp_path / "sp"))

    assert 1 == done.returncode, done.stdout + done.stderr
    assert "failed (CHECKPOINT_DECLINED)" in done.stdout and "the job keeps running" in done.stdout
    failed_at = max(job.task.stats.declined)
    eventually(lambda: max(job.task.stats.completed) > failed_at)  # periodic checkpoints resumed
    assert ([], None, None) == (job.stops, job.task.stopped, job.task.stopping)


def test_cancel_ends_the_job_canceled(bootstrap: str, topics: Topics, job: Job) -> None:
    done = cutline(bootstrap, topics, "cancel", job.driver.job_id)

    assert 0 == done.returncode, done.stdout + done.stderr
    assert [(JobStatus.CANCELED, False)] == job.stops
    assert f"job {job.driver.job_id} is CANCELED" in done.stdout
    assert not [
        c for c in job.driver.completions() if isinstance(c, CheckpointCompleted) and c.kind == "SAVEPOINT"
    ]
