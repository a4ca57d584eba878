"""The compose stack (Apache Kafka in KRaft mode, the coordinator, the example job).

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


def test_checkpoints_complete_on_apache_kafka(stack: None) -> None:
    """On Apache Kafka the example job's checkpoints complete and the coordinator reports them."""
    deadline = time.monotonic() + 120
    completed = 0
    while time.monotonic() < deadline and completed < 3:
        try:
            with urllib.request.urlopen(
                "http://127.0.0.1:6066/jobs/wordcount/checkpoints", timeout=5
            ) as response:
                completed = json.load(response)["counts"]["completed"]
        except OSError:
            pass
        time.sleep(1)
    assert completed >= 3
