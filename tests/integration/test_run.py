"""``cutline run`` against a real broker and a real coordinator process: restarts as the journal decides.

The driver under supervision is a small script (written per test) that reports the
job RUNNING with the participant library's ``JobDriver`` and then fails, hangs or
finishes, as its attempt number says. The module's tests share one coordinator; each
supervises a job of its own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from confluent_kafka import Producer
from support import create_protocol_topics, eventually

from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import create_topics
from events.kafka.clients import producer_config
from events.kafka.feed import read_job_partition
from events.wire.records import (
    CheckpointCompleted,
    CheckpointRestored,
    JobFailedPermanently,
    JobRestartScheduled,
    JobStatus,
    JournalEvent,
    SchedulerStarted,
    SchedulerStopped,
)
from events.wire.topics import Topics

DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from events.task.participant import JobDriver
    from events.wire.records import CheckpointConfig, JobStatus
    from events.wire.topics import Topics

    mode, location, log = sys.argv[1:4]
    attempt = int(os.environ["CUTLINE_ATTEMPT"])
    strategy = os.environ.get("CUTLINE_RESTART_STRATEGY", "")
    with open(log, "a") as out:
        out.write(f"{attempt} {os.environ['CUTLINE_RESTORE']!r} {strategy}\\n")
    config = CheckpointConfig(0, location, heartbeat_interval_ms=200, heartbeat_timeout_ms=1_500)
    topics = Topics(os.environ["CUTLINE_TOPIC_PREFIX"])
    driver = JobDriver(os.environ["CUTLINE_BOOTSTRAP"], os.environ["CUTLINE_JOB"], topics)
    if mode == "fail":
        driver.running(["t0"], config, attempt)
        time.sleep(0.3)
        sys.exit(3)
    if mode == "hang-once" and attempt == 1:
        driver.running(["t0"], config, attempt, heartbeats=False)
        for _ in range(3):
            driver.heartbeat()
            time.sleep(0.2)
        time.sleep(600)  # alive, silent: only the missing heartbeats tell
    driver.running(["t0"], config, attempt)
    if mode == "forever":
        time.sleep(600)
    time.sleep(0.5)
    driver.status(JobStatus.FINISHED)
    driver.close()
    """
)


@pytest.fixture(name="topics", scope="module")
def _topics(bootstrap: str) -> Iterator[Topics]:
    """The topics of the coordinator the module's tests share."""
    topics = Topics(f"t{uuid4().hex[:8]}.")
    create_protocol_topics(bootstrap, topics.prefix)
    with CoordinatorProcess(bootstrap, topics.prefix):
        yield topics


@pytest.fixture(name="job")
def _job() -> str:
    """The test's own job id."""
    return f"supervised-{uuid4().hex[:6]}"


def supervise(
    bootstrap: str, topics: Topics, job: str, tmp_path: Path, mode: str, *options: str
) -> subprocess.Popen[str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    location = (tmp_path / "checkpoints").as_uri()
    command = [
        sys.executable, "-m", "coordinator.cli", "run", "--job", job, "--bootstrap", bootstrap,
        "--topic-prefix", topics.prefix, *options, "--",
        sys.executable, str(script), mode, location, str(tmp_path / "attempts.log"),
    ]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def journal(bootstrap: str, topics: Topics, job: str) -> list[JournalEvent]:
    topic = topics.checkpoints
    return [r.record for r in read_job_partition(bootstrap, job, topic, claims_topic=topic) if r.record]  # type: ignore[misc]


def attempts(tmp_path: Path) -> list[str]:
    return (tmp_path / "attempts.log").read_text().splitlines()


@pytest.mark.slow
def test_a_driver_that_always_fails_is_restarted_as_often_as_the_strategy_says_then_given_up(
    bootstrap: str, topics: Topics, job: str, tmp_path: Path
) -> None:
    run = supervise(
        bootstrap, topics, job, tmp_path, "fail", "--restart-strategy", "fixed-delay", "--attempts", "3",
        "--delay-ms", "300",
    )  # fmt: skip
    output, _ = run.communicate(timeout=120)

    assert 1 == run.returncode, output
    assert "failed for good" in output and "fixed-delay: all 3 restart attempts are used" in output
    assert ["1", "2", "3", "4"] == [line.split()[0] for line in attempts(tmp_path)]
    assert all('"kind": "FIXED_DELAY"' in line for line in attempts(tmp_path))
    events = journal(bootstrap, topics, job)
    restarts = [e for e in events if isinstance(e, JobRestartScheduled)]
    assert [2, 3, 4] == [r.attempt for r in restarts]
    assert all(r.delay_ms == 300 and "exited with code 3" in r.failure for r in restarts)
    (failed,) = [e for e in events if isinstance(e, JobFailedPermanently)]
    assert 4 == failed.attempt


def test_a_driver_whose_heartbeats_stop_is_failed_by_the_coordinator_and_restarted(
    bootstrap: str, topics: Topics, job: str, tmp_path: Path
) -> None:
    """Attempt 1 stays alive but silent: the coordinator fails it after the heartbeat timeout,
    the supervisor stops it and starts attempt 2, which finishes."""
    run = supervise(
        bootstrap,
        topics,
        job,
        tmp_path,
        "hang-once",
        "--restart-strategy",
        "fixed-delay",
        "--delay-ms",
        "100",
    )
    output, _ = run.communicate(timeout=120)

    assert 0 == run.returncode, output
    assert ["1", "2"] == [line.split()[0] for line in attempts(tmp_path)]
    events = journal(bootstrap, topics, job)
    stopped = [e for e in events if isinstance(e, SchedulerStopped)]
    assert JobStatus.FAILING is stopped[0].status and "no heartbeat of attempt 1" in str(stopped[0].error)
    (restart,) = [e for e in events if isinstance(e, JobRestartScheduled)]
    assert 2 == restart.attempt and "no heartbeat" in restart.failure
    assert [1, 2] == [e.attempt for e in events if isinstance(e, SchedulerStarted)]
    assert JobStatus.FINISHED is stopped[-1].status


def test_sigterm_cancels_the_job(bootstrap: str, topics: Topics, job: str, tmp_path: Path) -> None:
    run = supervise(bootstrap, topics, job, tmp_path, "forever")
    eventually(
        lambda: any(isinstance(e, SchedulerStarted) for e in journal(bootstrap, topics, job)),
        timeout=60,
        interval=0.3,
        what="the driver to run (SchedulerStarted)",
    )

    run.send_signal(signal.SIGTERM)
    output, _ = run.communicate(timeout=60)

    assert 130 == run.returncode, output
    stopped = [e for e in journal(bootstrap, topics, job) if isinstance(e, SchedulerStopped)]
    assert [JobStatus.CANCELED] == [e.status for e in stopped]


@pytest.mark.slow
@pytest.mark.parametrize("inline_threshold", [0, 20_480], ids=["files", "inline"])
def test_a_sigkilled_driver_is_restarted_from_its_latest_checkpoint_and_counts_stay_exact(
    bootstrap: str, topics: Topics, job: str, tmp_path: Path, inline_threshold: int
) -> None:
    """The example word count (one task, a checkpoint every 200 ms) under cutline run: SIGKILL its
    driver after two completed checkpoints while words keep coming; the strategy restarts it, the
    new attempt restores the latest completed checkpoint, and its final counts equal the words
    produced, each once. With an inline threshold its snapshots ride in the acks: no file is
    written, and the restore reads the state from the journal's completion."""
    words_topic = f"{topics.prefix}words-{job}"
    create_topics(bootstrap, [words_topic], partitions=1)
    out = tmp_path / "counts.json"
    command = [
        sys.executable, "-m", "coordinator.cli", "run", "--job", job, "--bootstrap", bootstrap,
        "--topic-prefix", topics.prefix, "--restart-strategy", "fixed-delay", "--delay-ms", "500", "--",
        sys.executable, "-m", "events.dev.example_app", "--bootstrap", bootstrap, "--job", job,
        "--task", "t0",
        "--topic", words_topic, "--partition", "0", "--prefix", topics.prefix, "--driver",
        "--location", (tmp_path / "checkpoints").as_uri(), "--interval-ms", "200", "--idle-exit", "6",
        "--output", str(out), "--inline-threshold-bytes", str(inline_threshold),
    ]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(run.stdout or ()), daemon=True)
    reader.start()
    produced: Counter[str] = Counter()
    producer = Producer(producer_config(bootstrap))

    def produce(n: int) -> None:
        for i in range(n):
            line = f"w{i % 7} w{i % 3} shared"
            produced.update(line.split())
            producer.produce(words_topic, line.encode())
        producer.flush(10)

    def two_completed() -> bool:
        if sum(isinstance(e, CheckpointCompleted) for e in journal(bootstrap, topics, job)) >= 2:
            return True
        produce(50)  # words keep coming
        raise AssertionError("output:\n" + "".join(lines))

    eventually(two_completed, timeout=90, interval=0.2, what="two completed checkpoints")
    (pid,) = [int(m.group(1)) for line in lines if (m := re.search(r"attempt 1 of job .* \(pid (\d+)", line))]
    os.kill(pid, signal.SIGKILL)
    produce(300)  # while nobody counts
    run.wait(120)
    reader.join(5)
    output = "".join(lines)

    assert 0 == run.returncode, output
    events = journal(bootstrap, topics, job)
    (restart,) = [e for e in events if isinstance(e, JobRestartScheduled)]
    latest_before = [
        e.checkpoint_id for e in events if isinstance(e, CheckpointCompleted) and e.attempt == 1
    ][-1]
    assert 2 == restart.attempt and latest_before == restart.restore_checkpoint_id
    assert "exited with code -9" in restart.failure
    (restored,) = [e for e in events if isinstance(e, CheckpointRestored)]
    assert (2, latest_before) == (restored.attempt, restored.checkpoint_id)
    assert dict(produced) == json.loads(out.read_text())
    (restored_from,) = [
        e for e in events if isinstance(e, CheckpointCompleted) and e.checkpoint_id == latest_before
    ]
    files = [p for p in (tmp_path / "checkpoints").rglob("*") if p.is_file()]
    if inline_threshold:
        assert restored_from.handles["t0"].inline is not None
        assert [] == files
    else:
        assert restored_from.handles["t0"].inline is None
        assert files
