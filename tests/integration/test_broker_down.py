"""A dead broker must not look healthy (issue 51).

A coordinator worker keeps its jobs in memory, so with its broker gone every view still answers,
and used to answer as if all were well: ``/ready`` 200 with every partition DECIDING, the dashboard
RUNNING with a green dot, ``cutline doctor`` "coordinator: ok" under "broker: fail". Here a worker
runs on a broker of its own (:func:`support.local_broker`: Apache Kafka, or Tansu with
``CUTLINE_TEST_BROKER=tansu``), which the test kills (SIGKILL) or freezes (SIGSTOP).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from playwright.sync_api import sync_playwright
from support import TEST_PARTITIONS, LocalBroker, eventually, local_broker

from coordinator.service.app import Settings, ensure_topics
from coordinator.service.doctor import CheckStatus, diagnose
from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.clients import consumer_config, job_key, partition_for
from events.task.participant import JobDriver
from events.wire.records import CheckpointConfig
from events.wire.topics import Topics

CHROMIUM = Path("/usr/bin/chromium")
PREFIX = "alone."
JOB = "payments"
HOUR_MS = 3_600_000


@dataclass
class Alone:
    """A coordinator worker and the one broker it has."""

    broker: LocalBroker
    coordinator: CoordinatorProcess

    def ready(self) -> tuple[int, Any]:
        """``/ready``'s status and body. A request that gets no answer within 5 s (a worker starved of
        the CPU on a loaded machine) is an ``AssertionError``: :func:`support.eventually` asks again,
        and says so if it never answers."""
        try:
            with urllib.request.urlopen(self.coordinator.url + "/ready", timeout=5) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)
        except (urllib.error.URLError, TimeoutError) as error:
            raise AssertionError(f"/ready did not answer: {error}") from error

    def signal_broker(self, signum: int) -> None:
        for pid in self.broker.pids:
            os.kill(pid, signum)


@pytest.fixture(name="alone")
def _alone(tmp_path: Path) -> Iterator[Alone]:
    with local_broker() as broker:
        coordinator = CoordinatorProcess(broker.bootstrap, PREFIX, log_path=tmp_path / "coordinator.log")
        try:
            yield _running(broker, coordinator, tmp_path)
        finally:
            coordinator.kill_all()  # a worker whose broker is dead: no goodbye to send
            for pid in broker.pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)  # a frozen broker stops as any other
    if broker.directory is not None:  # a killed broker's logs are kept: this one was killed on purpose
        shutil.rmtree(broker.directory, ignore_errors=True)


def _running(broker: LocalBroker, coordinator: CoordinatorProcess, tmp_path: Path) -> Alone:
    """The worker started on its topics, with one RUNNING job."""
    ensure_topics(Settings(broker.bootstrap, PREFIX, partitions=TEST_PARTITIONS))
    coordinator.start()
    driver = JobDriver(broker.bootstrap, JOB, Topics(PREFIX))
    config = CheckpointConfig(interval_ms=HOUR_MS, timeout_ms=HOUR_MS, location=f"file://{tmp_path}/chk")
    driver.running(["task-0"], config, attempt=1, heartbeats=False)
    driver.close()
    eventually(lambda: coordinator.get(f"/jobs/{JOB}").get("status") == "RUNNING", what="the job RUNNING")
    # The worker shows a status as soon as it decides it; killed before its journal write is acknowledged,
    # the broker would fail that write 30 s later, and the worker would recover the partition and forget
    # the job (the page a slow test then opens lists none). The group commits the job's status record only
    # once that write is acknowledged, so the broker dies with the job journaled.
    eventually(lambda: _status_committed(broker.bootstrap) == 1, what="the job's status record committed")
    return Alone(broker, coordinator)


def _status_committed(bootstrap: str) -> int:
    """The coordinators' group's committed offset of the job's ``job-status`` partition."""
    topics = Topics(PREFIX)
    partition = TopicPartition(topics.job_status, partition_for(job_key(JOB), TEST_PARTITIONS))
    group = Consumer(consumer_config(bootstrap, extra={"group.id": f"{PREFIX}coordinator"}))
    try:
        [committed] = group.committed([partition], timeout=10)
        return int(committed.offset)
    finally:
        group.close()


def test_a_worker_whose_broker_was_killed_is_not_ready_and_says_why(alone: Alone, tmp_path: Path) -> None:
    status, ready = eventually(alone.ready, lambda answer: answer[1]["broker"]["reachable"], what="a probe")
    assert (200, True) == (status, ready["ready"])

    alone.signal_broker(signal.SIGKILL)

    status, ready = eventually(alone.ready, lambda answer: answer[0] == 503, timeout=30, what="/ready 503")
    assert (False, False) == (ready["ready"], ready["broker"]["reachable"])
    assert ready["problems"][0].startswith(f"the broker at {alone.broker.bootstrap} is unreachable"), ready
    assert ready["broker"]["error"]
    overview = alone.coordinator.get("/overview")
    assert (False, False) == (overview["ready"], overview["broker"]["reachable"])
    assert overview["problems"][0].startswith(f"the broker at {alone.broker.bootstrap} is unreachable")
    metrics = urllib.request.urlopen(alone.coordinator.url + "/metrics", timeout=5).read().decode()
    assert "cutline_coordinator_broker_reachable 0.0" in metrics

    checks = {check.name: check for check in diagnose(alone.broker.bootstrap, PREFIX, alone.coordinator.url)}
    assert CheckStatus.FAIL == checks["broker"].verdict
    assert CheckStatus.FAIL == checks["coordinator"].verdict, checks["coordinator"]
    assert f"cannot reach its broker {alone.broker.bootstrap}" in checks["coordinator"].found

    if not CHROMIUM.exists():
        pytest.skip(
            reason="Debian's chromium is not installed here (.ci/run installs it: apt-get install chromium)"
        )
    shots = Path(os.environ.get("CUTLINE_SCREENSHOT_DIR", tmp_path))
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 600})
            page.goto(alone.coordinator.url + "/")
            page.locator("#banner.down").wait_for(timeout=10_000)
            assert "live down" == page.locator("#live").get_attribute("class")
            banner = page.locator("#banner").inner_text()
            assert banner.startswith("Broker unreachable.")
            assert f"cannot reach the broker at {alone.broker.bootstrap}" in banner
            # the job is as the worker last knew it, and the page says that that was before the outage
            shown = page.locator(f'#jobs tr[data-job="{JOB}"] td:nth-child(2) [class^="status-"]')
            assert "RUNNING" == shown.inner_text()
            assert "shown as they were then" in banner
            page.screenshot(path=str(shots / "broker-unreachable.png"), full_page=True)
        finally:
            browser.close()


@pytest.mark.slow
def test_a_worker_whose_broker_answers_again_is_ready_again(alone: Alone) -> None:
    """A broker frozen (SIGSTOP) until the worker notices, then resumed: /ready answers 200 again
    once the broker answers and the worker decides its partitions (after a rebalance, if the group
    timed it out meanwhile)."""
    eventually(
        alone.ready, lambda answer: answer[0] == 200 and answer[1]["broker"]["reachable"], what="ready"
    )

    alone.signal_broker(signal.SIGSTOP)
    eventually(alone.ready, lambda answer: answer[0] == 503, timeout=30, what="/ready 503")
    alone.signal_broker(signal.SIGCONT)

    status, ready = eventually(alone.ready, lambda answer: answer[0] == 200, timeout=60, what="/ready 200")
    assert (True, True, []) == (ready["ready"], ready["broker"]["reachable"], ready["problems"])


def test_a_starting_worker_answers_503_until_it_has_recovered(tmp_path: Path) -> None:
    """From its first answer on, a worker that has not recovered (no assignment yet, a partition not
    decided) says 503 with the reason; the first 200 comes with ``recovered: true``."""
    seen: list[tuple[int, bool, list[str]]] = []

    def ready_now(worker: CoordinatorProcess) -> tuple[int, bool, list[str]] | None:
        try:
            with urllib.request.urlopen(worker.url + "/ready", timeout=5) as response:
                status, body = response.status, json.load(response)
        except urllib.error.HTTPError as error:
            status, body = error.code, json.load(error)
        except (urllib.error.URLError, ConnectionError):
            return None  # not listening yet
        seen.append((status, body["recovered"], body["problems"]))
        return seen[-1]

    with local_broker() as broker:
        ensure_topics(Settings(broker.bootstrap, PREFIX, partitions=TEST_PARTITIONS))
        worker = CoordinatorProcess(broker.bootstrap, PREFIX, log_path=tmp_path / "coordinator.log").launch()
        try:
            eventually(
                lambda: ready_now(worker), lambda answer: answer is not None and answer[0] == 200, timeout=60
            )
        finally:
            worker.stop()

    assert (200, True, []) == seen[-1]
    starting = [answer for answer in seen if not answer[1]]
    assert starting, "the worker answered before it had recovered (a first join takes seconds)"
    assert all(status == 503 and problems for status, _, problems in starting), starting
