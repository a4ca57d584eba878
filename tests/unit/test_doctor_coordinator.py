"""``cutline doctor``'s coordinator check: the coordinator's own word (``/ready``), never "ok" beside a
failed broker."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from coordinator.service.doctor import (
    Check,
    CheckStatus,
    beside_the_broker,
    check_coordinator,
    coordinator_verdict,
    find_coordinators,
)

BASE = "http://127.0.0.1:6066"
BROKER_DOWN = {
    "ready": False,
    "problems": ["the broker at 127.0.0.1:9092 is unreachable (for 4 s: ...)"],
    "recovered": True,
    "broker": {"bootstrap": "127.0.0.1:9092", "reachable": False, "error": "Broker transport failure"},
    "worker": "w1",
    "jobs": 1,
    "partitions": {"0": {"epoch": 3, "ready": True, "phase": "DECIDING"}},
}
READY = {**BROKER_DOWN, "ready": True, "problems": [], "broker": {"bootstrap": "x", "reachable": True}}


@pytest.fixture(name="coordinator")
def _coordinator() -> Iterator[tuple[str, list[tuple[int, Any]]]]:
    """A web server answering ``/ready`` with the status and body the test puts in its list."""
    answers: list[tuple[int, Any]] = []

    class Ready(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            status, body = answers[-1]
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answers
    finally:
        server.shutdown()
        server.server_close()


def test_a_coordinator_that_cannot_reach_its_broker_fails_the_check_and_names_the_broker() -> None:
    check = coordinator_verdict(BASE, BROKER_DOWN)

    assert CheckStatus.FAIL == check.verdict
    assert "cannot reach its broker 127.0.0.1:9092 (Broker transport failure)" in check.found
    assert "start the broker" in check.fix


def test_a_ready_coordinator_is_ok() -> None:
    check = coordinator_verdict(BASE, READY)

    assert (CheckStatus.OK, f"{BASE}: worker w1, 1 jobs, ready") == (check.verdict, check.found)


def test_the_coordinator_of_another_topic_prefix_fails_the_check_and_names_both() -> None:
    """A job on a mistyped prefix gets no checkpoint, and a coordinator of another prefix at --url
    says "ready": the check fails, saying which prefix it serves."""
    check = coordinator_verdict(BASE, {**READY, "topic_prefix": "cutline."}, "cutlin.")

    assert CheckStatus.FAIL == check.verdict
    assert f"{BASE} is the coordinator of topic prefix 'cutline.', not 'cutlin.'" in check.found
    assert "--topic-prefix cutline." in check.fix
    assert "`cutline coordinator --topic-prefix cutlin.`" in check.fix


def test_the_coordinator_of_the_prefix_checked_is_ok() -> None:
    check = coordinator_verdict(BASE, {**READY, "topic_prefix": "cutline."}, "cutline.")

    assert CheckStatus.OK == check.verdict


def test_with_no_url_and_no_worker_found_the_check_says_how_to_start_one() -> None:
    """No broker to ask for the group's workers, and none answers at the local address."""
    no_broker = Check("broker", CheckStatus.FAIL, "no broker answers at 127.0.0.1:9")

    check = find_coordinators(None, "cutline.", no_broker, local="http://127.0.0.1:9")

    assert isinstance(check, Check)
    found = (
        "no coordinator answers at http://127.0.0.1:9 (no broker to ask for the workers of topic "
        "prefix 'cutline.')"
    )
    assert (CheckStatus.WARN, found) == (check.verdict, check.found)
    assert "`cutline coordinator --topic-prefix cutline.`" in check.fix


def test_with_no_url_the_local_worker_is_checked_where_the_group_names_none(
    coordinator: tuple[str, list[tuple[int, Any]]],
) -> None:
    url, answers = coordinator
    answers.append((200, READY))

    assert [url] == find_coordinators(None, "cutline.", Check("broker", CheckStatus.SKIPPED, ""), local=url)


def test_a_recovering_coordinator_is_a_warning_naming_the_partitions() -> None:
    recovering = {**READY, "ready": False, "recovered": False, "partitions": {"1": {"ready": False}}}

    check = coordinator_verdict(BASE, recovering)

    assert (CheckStatus.WARN, f"{BASE} is still claiming journal partitions 1") == (
        check.verdict,
        check.found,
    )


def test_the_503_of_ready_is_read_for_its_reasons(coordinator: tuple[str, list[tuple[int, Any]]]) -> None:
    url, answers = coordinator
    answers.append((503, BROKER_DOWN))

    check = check_coordinator(url)

    assert CheckStatus.FAIL == check.verdict
    assert "cannot reach its broker" in check.found


def test_a_503_that_is_not_json_is_a_warning(coordinator: tuple[str, list[tuple[int, Any]]]) -> None:
    url, answers = coordinator
    answers.append((503, b"<html>proxy error</html>"))

    check = check_coordinator(url)

    assert (CheckStatus.WARN, f"{url}/ready answered HTTP 503") == (check.verdict, check.found)


def test_the_coordinator_is_never_ok_beside_a_failed_broker() -> None:
    """A coordinator that still says it is ready while the broker checked here fails (another cluster,
    or its probe has not noticed yet) is a warning that says so."""
    ok = Check("coordinator", CheckStatus.OK, f"{BASE}: worker w1, 1 jobs, ready")
    broker_failed = Check("broker", CheckStatus.FAIL, "no broker answers at 127.0.0.1:9092")

    check = beside_the_broker(ok, broker_failed)

    assert CheckStatus.WARN == check.verdict
    assert "the broker checked here does not answer" in check.found
    assert ok is beside_the_broker(ok, Check("broker", CheckStatus.OK, "fine"))
