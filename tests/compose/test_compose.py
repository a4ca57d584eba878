"""The compose stack (Apache Kafka in KRaft mode, two coordinator workers, the Spark job, Prometheus).

Needs a Docker engine; skipped, with the reason, where none runs.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import eventually

from coordinator.service.app import Settings

COMPOSE = Path(__file__).resolve().parents[2] / "compose" / "docker-compose.yml"


def docker_engine_available() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


pytestmark = [
    pytest.mark.compose,
    pytest.mark.skipif(
        not docker_engine_available(), reason="no Docker engine runs here (compose tests need one)"
    ),
]


@pytest.fixture(scope="module")
def stack() -> Iterator[None]:
    subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "up", "--build", "-d", "--wait"], check=True, timeout=900
    )
    yield
    subprocess.run(["docker", "compose", "-f", str(COMPOSE), "down", "-v"], check=False, timeout=300)


WORKERS = ("http://127.0.0.1:6066", "http://127.0.0.1:6067")
SERVICE_OF = dict(zip(WORKERS, ("coordinator-1", "coordinator-2"), strict=True))
SESSION_TIMEOUT_S = Settings.session_timeout
"""The workers' session timeout: the compose file leaves ``cutline coordinator``'s default."""


def completed_checkpoints(job: str) -> int:
    """Completed checkpoints of ``job`` as the worker that owns it reports them (0: none owns it yet)."""
    for worker in WORKERS:
        try:
            with urllib.request.urlopen(f"{worker}/jobs/{job}/checkpoints", timeout=5) as response:
                return int(json.load(response)["counts"]["completed"])
        except OSError:
            continue
    return 0


def test_the_spark_job_checkpoints_on_apache_kafka_and_prometheus_sees_it(stack: None) -> None:
    """On Apache Kafka, with two coordinator workers, the Spark word count under `cutline run`
    completes checkpoints, and Prometheus scrapes the count from the worker that owns the job."""
    eventually(
        lambda: completed_checkpoints("wordcount"),
        lambda completed: completed >= 3,
        timeout=300,
        interval=2,
        what="3 completed checkpoints of the word count",
    )

    query = "http://127.0.0.1:9090/api/v1/query?query=cutline_job_numberOfCompletedCheckpoints"

    def scraped() -> float:
        with urllib.request.urlopen(query, timeout=5) as response:
            results = json.load(response)["data"]["result"]
        return max(
            (float(r["value"][1]) for r in results if r["metric"].get("job_id") == "wordcount"), default=0
        )

    eventually(scraped, lambda count: count >= 3, timeout=120, interval=2, what="Prometheus to scrape 3")


def job_view(worker: str, job: str) -> dict[str, Any] | None:
    """``job`` as ``worker`` reports it on /jobs?local=1; None when the worker does not own it (or is
    down)."""
    try:
        with urllib.request.urlopen(f"{worker}/jobs?local=1", timeout=5) as response:
            jobs: list[dict[str, Any]] = json.load(response)["jobs"]
    except OSError:
        return None
    return next((view for view in jobs if view["id"] == job), None)


def completed_after(worker: str, job: str, since_ms: float) -> bool:
    view = job_view(worker, job)
    return (
        view is not None
        and view["last_completed"] is not None
        and view["last_completed"]["timestamp"] > since_ms
    )


def owner_and_survivor() -> tuple[str, str]:
    """The worker that has completed checkpoints of the word count, and the other one."""
    owner = eventually(
        lambda: next((w for w in WORKERS if completed_after(w, "wordcount", 0)), None),
        timeout=300,
        interval=1,
        what="a worker to report a completed checkpoint of the word count",
    )
    return owner, next(w for w in WORKERS if w != owner)


def seconds_until_completed(worker: str, since_ms: float, since: float, limit: float) -> float:
    """Seconds from ``since`` (monotonic) until ``worker`` reports a checkpoint of the word count
    completed after ``since_ms``, or until ``limit`` seconds have passed."""
    with contextlib.suppress(AssertionError):  # the caller asserts on what it sees
        eventually(
            lambda: completed_after(worker, "wordcount", since_ms),
            timeout=max(0.0, since + limit - time.monotonic()),
            interval=0.2,
        )
    return time.monotonic() - since


def test_the_other_worker_completes_the_jobs_checkpoints_after_a_sigkill_of_its_owner(stack: None) -> None:
    """On Apache Kafka, which answers a rebalance as soon as the remaining members have rejoined
    (unlike the embedded broker, docs/embedded-broker.md), a SIGKILL of the worker that owns the
    Spark job hands the job to the other worker: a checkpoint completes there within the session
    timeout + 5 s (the issue's bound; the target in docs/design.md, "Performance targets", is + 2 s, and
    the time is printed)."""
    owner, survivor = owner_and_survivor()
    service = SERVICE_OF[owner]

    killed_ms, killed = time.time() * 1000, time.monotonic()
    subprocess.run(["docker", "compose", "-f", str(COMPOSE), "kill", "-s", "SIGKILL", service], check=True)
    try:
        bound = SESSION_TIMEOUT_S + 5
        took = seconds_until_completed(survivor, killed_ms, killed, bound + 10)
        print(f"{service} killed; {SERVICE_OF[survivor]} completed a checkpoint {took:.2f} s later")

        assert completed_after(survivor, "wordcount", killed_ms), f"{SERVICE_OF[survivor]} completed none"
        assert took <= bound, f"the job's checkpoints resumed {took:.2f} s after the kill (bound {bound} s)"
    finally:
        subprocess.run(["docker", "compose", "-f", str(COMPOSE), "start", service], check=False, timeout=300)


def test_a_worker_process_killed_in_its_container_hands_the_job_over_before_the_session_timeout(
    stack: None,
) -> None:
    """SIGKILL of the owner's worker process inside its container (as the OOM killer would), not of
    the container: its watchdog tells the group at once (coordinator/service/watchdog.py), and on
    Apache Kafka, which holds no rejoin, the other worker completes a checkpoint of the job before
    the session timeout has even passed (the time is printed)."""
    owner, survivor = owner_and_survivor()
    service = SERVICE_OF[owner]
    with urllib.request.urlopen(f"{owner}/ready", timeout=5) as response:
        worker_pid = int(json.load(response)["pid"])  # in the container's pid namespace

    killed_ms, killed = time.time() * 1000, time.monotonic()
    kill = ["python", "-c", f"import os; os.kill({worker_pid}, 9)"]
    subprocess.run(["docker", "compose", "-f", str(COMPOSE), "exec", "-T", service, *kill], check=True)
    try:
        took = seconds_until_completed(survivor, killed_ms, killed, SESSION_TIMEOUT_S + 10)
        print(f"{service}'s worker killed; {SERVICE_OF[survivor]} completed a checkpoint {took:.2f} s later")

        assert completed_after(survivor, "wordcount", killed_ms), f"{SERVICE_OF[survivor]} completed none"
        assert took < SESSION_TIMEOUT_S, f"the job's checkpoints resumed {took:.2f} s after the kill"
    finally:
        subprocess.run(
            ["docker", "compose", "-f", str(COMPOSE), "up", "-d", "--wait", service], check=False, timeout=300
        )
