"""What an operator meets running Python participant jobs, against a real broker and coordinator: an
input topic that does not exist is said at start, savepoints are listed on disk and shown, and the
checkpoint directories the job discards go away.

One coordinator serves the module; each test runs a job of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from support import TEST_PARTITIONS, eventually

from coordinator.service.app import Settings, ensure_topics
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import create_topics
from events.task.participant import METADATA_FILE, JobDriver, MissingTopics, Participant, require_topics
from events.wire.records import (
    CheckpointAborted,
    CheckpointBarrier,
    CheckpointConfig,
    CheckpointKind,
    JobStatus,
)
from events.wire.topics import Topics


@pytest.fixture(scope="module", name="topics")
def _topics(bootstrap: str) -> Iterator[Topics]:
    topics = Topics(f"ops-{uuid4().hex[:8]}.")
    ensure_topics(Settings(bootstrap, topics.prefix, partitions=TEST_PARTITIONS))
    with CoordinatorProcess(bootstrap, topics.prefix):
        yield topics


def cutline(
    bootstrap: str, topics: Topics, *args: str, kafka: bool = True
) -> subprocess.CompletedProcess[str]:
    """A cutline command as a user runs it (``kafka``: with the module's broker and topics)."""
    command = [sys.executable, "-m", "coordinator.cli", *args]
    if kafka:
        command += ["--bootstrap", bootstrap, "--topic-prefix", topics.prefix]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=90, env={**os.environ, "COLUMNS": "250"}
    )


def table_rows(text: str) -> list[list[str]]:
    """The cells of every row of the tables rich printed in ``text``."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines() if "│" in line]


class Job:
    """A job of ``tasks`` participants (each in its own thread, state ``b"state-<task>"``), RUNNING
    with ``config``; a task whose snapshot of a checkpoint id in ``decline`` raises declines it."""

    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        config: CheckpointConfig,
        tasks: int = 2,
        decline: frozenset[int] = frozenset(),
    ) -> None:
        self.id = f"job-{uuid4().hex[:8]}"
        self.decline = decline
        self.driver = JobDriver(bootstrap, self.id, topics)
        self.tasks = [
            Participant(
                bootstrap,
                self.id,
                f"task-{i}",
                1,
                topics,
                snapshot=lambda barrier, i=i: self.snapshot(i, barrier),
                offsets=lambda i=i: {f"in:{i}": 7},
            )
            for i in range(tasks)
        ]
        for task in self.tasks:
            task.run_in_thread()
        self.driver.running([f"task-{i}" for i in range(tasks)], config, attempt=1)

    def snapshot(self, index: int, barrier: CheckpointBarrier) -> bytes:
        if index == len(self.tasks) - 1 and barrier.checkpoint_id in self.decline:
            raise OSError(f"task-{index} declines checkpoint {barrier.checkpoint_id} on purpose")
        return f"state-{index}".encode()

    def completed(self) -> int:
        """Checkpoints every task saw complete."""
        return min(len(task.stats.completed) for task in self.tasks)

    def close(self) -> None:
        for task in self.tasks:
            task.close()
        self.driver.close()


MakeJob = Callable[..., Job]
"""``make_job(config, decline=...)``: a job of two tasks on the module's coordinator."""


@pytest.fixture(name="make_job")
def _make_job(bootstrap: str, topics: Topics) -> Iterator[MakeJob]:
    jobs: list[Job] = []

    def make(config: CheckpointConfig, decline: frozenset[int] = frozenset()) -> Job:
        jobs.append(Job(bootstrap, topics, config, decline=decline))
        return jobs[-1]

    yield make
    for job in jobs:
        job.close()


# ------------------------------------------------------------- the input topic


def test_require_topics_names_a_missing_topic_and_what_to_do(bootstrap: str) -> None:
    missing = f"words-{uuid4().hex[:8]}"

    with pytest.raises(MissingTopics) as raised:
        require_topics(bootstrap, [missing])

    assert str(raised.value) == (
        f"topic {missing} does not exist at {bootstrap}: create it (cutline topics create creates "
        "only cutline's topics) or check the name"
    )


def test_require_topics_passes_existing_topics_and_partitions_and_names_a_missing_partition(
    bootstrap: str,
) -> None:
    words = f"words-{uuid4().hex[:8]}"
    create_topics(bootstrap, [words], partitions=2)

    require_topics(bootstrap, [words, f"{words}:0", f"{words}:1"])
    with pytest.raises(MissingTopics, match=f"topic {words} has 2 partitions at .*, no partition 2"):
        require_topics(bootstrap, [f"{words}:2"])


def test_the_example_app_on_a_missing_topic_fails_at_once_saying_what_to_do(bootstrap: str) -> None:
    """No participant starts and no empty checkpoint completes: the app exits 2 with one line."""
    missing = f"words-{uuid4().hex[:8]}"
    command = [sys.executable, "-m", "events.dev.example_app", "--bootstrap", bootstrap]
    command += ["--job", f"wc-{uuid4().hex[:6]}", "--task", "t0"]
    command += ["--topic", missing, "--partition", "0", "--driver"]

    done = subprocess.run(command, capture_output=True, text=True, timeout=60)

    assert 2 == done.returncode, done.stdout + done.stderr
    assert f"topic {missing} does not exist at {bootstrap}: create it" in done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------ savepoints


def test_a_participant_savepoint_is_listed_on_disk_shown_and_disposed(
    bootstrap: str, topics: Topics, make_job: MakeJob, tmp_path: Path
) -> None:
    """The job's tasks write the savepoint's ``_metadata`` beside their snapshots once it completes,
    so ``savepoints list`` finds it on disk, ``show`` prints its tasks' state, and ``dispose`` works."""
    job = make_job(CheckpointConfig(200, (tmp_path / "checkpoints").as_uri(), timeout_ms=10_000))
    eventually(job.completed, what="a completed checkpoint")

    triggered = cutline(bootstrap, topics, "trigger", job.id, "--savepoint", str(tmp_path / "savepoints"))

    assert 0 == triggered.returncode, triggered.stdout + triggered.stderr
    [savepoint] = [c for c in job.driver.completions() if c.kind is CheckpointKind.SAVEPOINT]
    directory = Path(savepoint.location.removeprefix("file://"))
    eventually(lambda: (directory / METADATA_FILE).is_file(), what="the savepoint's _metadata")

    listed = cutline(bootstrap, topics, "savepoints", "list", job.id, "--json")
    assert 0 == listed.returncode, listed.stdout + listed.stderr
    [row] = [json.loads(line) for line in listed.stdout.splitlines()]
    expected = (savepoint.checkpoint_id, savepoint.location, True, True, 2)
    assert expected == (row["checkpoint_id"], row["location"], row["on_disk"], row["metadata"], row["tasks"])

    shown = cutline(bootstrap, topics, "savepoints", "show", str(directory), kafka=False)
    assert 0 == shown.returncode, shown.stdout + shown.stderr
    assert f"savepoint {savepoint.checkpoint_id} of job {job.id}" in shown.stdout
    rows = table_rows(shown.stdout)
    assert [["in:0", "7"], ["in:1", "7"]] == [row for row in rows if row[0].startswith("in:")]
    present = {row[0]: row[-1] for row in rows if row[0].startswith("task-")}
    assert {"task-0": "yes", "task-1": "yes"} == present, shown.stdout  # there, at its size

    disposed = cutline(
        bootstrap, topics, "savepoints", "dispose", str(directory), "--savepoint-root", str(tmp_path)
    )
    assert 0 == disposed.returncode, disposed.stdout + disposed.stderr
    assert not directory.exists()


# ----------------------------------------------------- checkpoint directories


def test_with_one_retained_only_the_latest_checkpoint_s_directory_is_left(
    make_job: MakeJob, tmp_path: Path
) -> None:
    """A checkpoint every 100 ms, ``retained`` 1, a checkpoint one task declines, and a cancel that
    aborts the one pending: the tasks delete their snapshots of every discarded and aborted
    checkpoint, and the last task to go removes the emptied directory."""
    root = tmp_path / "checkpoints"
    config = CheckpointConfig(100, root.as_uri(), timeout_ms=10_000, tolerable_failures=100, retained=1)
    job = make_job(config, decline=frozenset({3}))
    eventually(lambda: job.completed() >= 6, timeout=60, what="six completed checkpoints")

    job.driver.status(JobStatus.CANCELED)

    latest = max(c.checkpoint_id for c in job.driver.completions())
    directory = root / job.id
    eventually(
        lambda: sorted(p.name for p in directory.iterdir()),
        lambda names: names == [f"chk-{latest}"],
        what=f"only chk-{latest} in {directory}",
    )
    assert ["task-0", "task-1"] == sorted(p.name for p in (directory / f"chk-{latest}").iterdir())
    assert 3 in {a.checkpoint_id for a in job.driver.journal((CheckpointAborted,))}  # the declined one
