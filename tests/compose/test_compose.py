"""The compose stack (Apache Kafka in KRaft mode, two coordinator workers, the Spark job, Prometheus).

Needs a Docker engine; skipped, with the reason, where none runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

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
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and completed_checkpoints("wordcount") < 3:
        time.sleep(2)
    assert completed_checkpoints("wordcount") >= 3

    query = "http://127.0.0.1:9090/api/v1/query?query=cutline_job_numberOfCompletedCheckpoints"
    scraped = 0.0
    while time.monotonic() < deadline and scraped < 3:
        with urllib.request.urlopen(query, timeout=5) as response:
            results = json.load(response)["data"]["result"]
        scraped = max(
            (float(r["value"][1]) for r in results if r["metric"].get("job_id") == "wordcount"), default=0
        )
        time.sleep(2)
    assert scraped >= 3
