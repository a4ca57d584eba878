"""A worker whose broker was replaced by a fresh, empty one says so and what to do (issue 51).

Tansu keeps everything in memory: after a restart on the same port the broker answers, with no
topic at all. Workers then reported ``recovered: true, jobs: 0`` and nothing said to create the
topics again. Now the broker probe finds the journal topic missing: ``/ready`` answers 503 naming
`cutline topics create`.
"""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support import TEST_PARTITIONS, eventually

from coordinator.service.app import Settings, ensure_topics
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import EmbeddedBroker, free_port

PREFIX = "fresh."
CRASHES_TOLERATED = 3
"""Runs of the scenario that may end in librdkafka's SIGSEGV before the test fails."""


def _ready(coordinator: CoordinatorProcess) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(coordinator.url + "/ready", timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


class KnownLibrdkafkaCrash(Exception):
    """The worker died of SIGSEGV in librdkafka 2.16 on the fresh Tansu broker's fetch hints
    (docs/embedded-broker.md, librdkafka issue #5280): not the behaviour under test."""


def _a_worker_whose_broker_is_replaced(tmp_path: Path) -> tuple[int, Any]:
    """What ``/ready`` says once a worker's broker was replaced by a fresh one on the same port."""
    port = free_port()
    first = EmbeddedBroker(port).__enter__()
    coordinator = CoordinatorProcess(first.bootstrap, PREFIX, log_path=tmp_path / "coordinator.log")

    def ready() -> tuple[int, Any]:
        try:
            return _ready(coordinator)
        except urllib.error.URLError as error:  # its views are down: the worker may have died
            exited = eventually(coordinator.exit_code, lambda code: code is not None, timeout=10, what="exit")
            if exited == 128 + signal.SIGSEGV:
                raise KnownLibrdkafkaCrash(coordinator.tail()) from error
            raise RuntimeError(f"the coordinator exited {exited}: {coordinator.tail()}") from error

    try:
        ensure_topics(Settings(first.bootstrap, PREFIX, partitions=TEST_PARTITIONS))
        coordinator.start()
        eventually(lambda: _ready(coordinator)[0] == 200, timeout=60, what="the worker ready")
        first.__exit__(None, None, None)
        with EmbeddedBroker(port):
            answer: tuple[int, Any] = eventually(
                ready,
                lambda answer: answer[0] == 503 and "cutline topics create" in json.dumps(answer[1]),
                timeout=60,
                what="/ready to say the journal topic is missing and how to make it",
            )
            return answer
    finally:
        coordinator.kill_all()
        first.__exit__(None, None, None)


@pytest.mark.tansu
@pytest.mark.slow
def test_a_fresh_empty_broker_on_the_same_port_is_named_with_what_to_do(tmp_path: Path) -> None:
    # Tried again only when the worker died of librdkafka's known crash (2 of 8 loaded CI runs,
    # none of 20 runs beside two busy loops); any other failure, or the crash every time, fails it.
    for run in range(1, CRASHES_TOLERATED + 2):
        try:
            status, body = _a_worker_whose_broker_is_replaced(tmp_path / f"run-{run}")
            break
        except KnownLibrdkafkaCrash:
            continue
    else:
        pytest.fail(f"the worker died of librdkafka's SIGSEGV (#5280) in each of {run} runs")

    assert 503 == status and f"{PREFIX}checkpoints" in json.dumps(body)
