"""One way to address the cluster (issue 51): `cutline status` and `cutline list` find a coordinator
worker from the Kafka cluster alone (`--bootstrap`), as every other command does.

Each worker's Kafka client id names the port of its views, and the coordinator group's description
gives each member's host: so `--bootstrap` (or $CUTLINE_BOOTSTRAP) is enough; `--url` still wins.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from support import broker_kind, create_protocol_topics, eventually

from coordinator.service.group_view import views_url, web_client_id
from coordinator.service.supervisor import CoordinatorProcess
from events.task.participant import JobDriver
from events.wire.records import CheckpointConfig

CUTLINE = str(Path(sys.executable).parent / "cutline")
JOB = "found-by-bootstrap"


@pytest.fixture(name="worker", scope="module")
def _worker(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    prefix = f"disc{uuid4().hex[:6]}."
    topics = create_protocol_topics(bootstrap, prefix)
    tmp = tmp_path_factory.mktemp("discovery")
    with CoordinatorProcess(bootstrap, prefix, log_path=tmp / "coordinator.log") as coordinator:
        with JobDriver(bootstrap, JOB, topics) as driver:
            config = CheckpointConfig(interval_ms=0, location=(tmp / "chk").as_uri())
            driver.running(("t0",), config, attempt=1, heartbeats=False)
        eventually(lambda: coordinator.get(f"/jobs/{JOB}").get("status") == "RUNNING", what="the job RUNNING")
        yield coordinator


def _cutline(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUTLINE_URL", "CUTLINE_BOOTSTRAP")}
    return subprocess.run([CUTLINE, *args], capture_output=True, text=True, timeout=60, env=env)


def _found(result: subprocess.CompletedProcess[str]) -> None:
    """Found on Apache Kafka; on Tansu, which describes a group without its members (a deviation,
    docs/embedded-broker.md), refused with what to do instead."""
    if broker_kind() == "tansu":
        assert 2 == result.returncode and "the embedded Tansu broker" in result.stderr
        return
    assert 0 == result.returncode, result.stderr
    assert JOB in result.stdout


def test_status_finds_a_worker_from_the_cluster_alone(bootstrap: str, worker: CoordinatorProcess) -> None:
    _found(_cutline("status", JOB, "--bootstrap", bootstrap, "--topic-prefix", worker.prefix))


def test_list_finds_a_worker_from_the_cluster_alone(bootstrap: str, worker: CoordinatorProcess) -> None:
    _found(_cutline("list", "--json", "--bootstrap", bootstrap, "--topic-prefix", worker.prefix))


def test_a_prefix_no_worker_runs_says_what_to_do(bootstrap: str, worker: CoordinatorProcess) -> None:
    result = _cutline("list", "--bootstrap", bootstrap, "--topic-prefix", "nobody.")

    assert 2 == result.returncode
    assert "no coordinator worker of prefix 'nobody.'" in result.stderr and "--url" in result.stderr


def test_a_members_client_id_and_host_give_its_views() -> None:
    assert "http://10.0.0.7:6066" == views_url(web_client_id(6066), "/10.0.0.7")
    assert "http://[::1]:7000" == views_url(web_client_id(7000), "/::1")
    assert views_url("rdkafka", "/10.0.0.7") is None
    assert views_url("cutline-web-99999", "/10.0.0.7") is None
