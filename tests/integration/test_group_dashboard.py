"""One view of the coordinator group (docs/usage.md, "Dashboard"): three real workers on one prefix,
eight jobs spread over them, one in each journal partition.

Every worker's ``/jobs``, dashboard and ``cutline status`` show every job of the group with the
worker that owns it; a job's views on another worker are the owner's; a request for a name that is
not the coordinator's is refused; a worker that does not answer is shown as unreachable. The jobs
hold still (one manual checkpoint each, pending for an hour, no participant), so that what one
worker shows can be compared with what the owner shows.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright
from support import create_protocol_topics, on_apache_kafka
from typer.testing import CliRunner

from coordinator.cli import app
from coordinator.service.supervisor import CoordinatorProcess, stop_all
from events.kafka.clients import job_key, partition_for
from events.task.participant import JobDriver
from events.wire.records import CheckpointConfig, CheckpointKind, CheckpointRequested
from events.wire.topics import DEFAULT_PARTITIONS, Topics

CHROMIUM = Path("/usr/bin/chromium")
HOUR_MS = 3_600_000
ALLOWED_NAME = "dashboard.example"
"""A name the first worker is told to answer to (``--web-allowed-host``), as behind a proxy."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def one_job_per_partition() -> list[str]:
    """Job ids whose records go to partitions 0, 1, ... of every topic, one each: every worker of
    the group then owns some."""
    by_partition: dict[int, str] = {}
    for i in range(1000):
        by_partition.setdefault(partition_for(job_key(f"job-{i}"), DEFAULT_PARTITIONS), f"job-{i}")
    return [by_partition[p] for p in range(DEFAULT_PARTITIONS)]


JOBS = one_job_per_partition()


@dataclass
class Group:
    workers: list[CoordinatorProcess]
    owners: dict[str, str]
    """Each job's owner's web address, from the workers' own views (``/jobs?local=1``)."""

    def worker(self, url: str) -> CoordinatorProcess:
        return next(w for w in self.workers if w.url == url)

    def not_owning(self, job: str) -> CoordinatorProcess:
        return next(w for w in self.workers if w.url != self.owners[job])


def get(url: str, host: str | None = None) -> tuple[int, dict[str, str], Any]:
    """GET a JSON view: its status, headers and body (an error's body too)."""
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.load(error)


def local_owners(workers: list[CoordinatorProcess], pending: bool) -> dict[str, str]:
    """Each job's owner, once every job is held by one worker (``pending``: with its manual
    checkpoint pending)."""
    deadline = time.monotonic() + 60
    while True:
        owners = {
            job["id"]: worker.url
            for worker in workers
            for job in worker.get("/jobs?local=1")["jobs"]
            if not pending or job["counts"]["in_progress"] == 1
        }
        if sorted(owners) == sorted(JOBS):
            return owners
        assert time.monotonic() < deadline, f"not every job held (pending: {pending}): {owners}"
        time.sleep(0.1)


@pytest.fixture(name="group", scope="module")
def _group(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    topics = Topics(f"g{uuid.uuid4().hex[:8]}.")
    create_protocol_topics(bootstrap, topics.prefix, partitions=8)
    allowed = ("--web-allowed-host", ALLOWED_NAME)
    workers = [
        CoordinatorProcess(bootstrap, topics.prefix, extra_args=allowed if i == 0 else ()) for i in range(3)
    ]
    location = f"file://{tmp_path_factory.mktemp('group')}/checkpoints"
    # No periodic trigger for an hour, no participant: one manual checkpoint per job stays pending.
    config = CheckpointConfig(
        interval_ms=HOUR_MS, min_pause_ms=HOUR_MS, timeout_ms=HOUR_MS, location=location
    )
    try:
        for worker in workers:
            worker.launch()
        for worker in workers:
            worker.wait_ready(timeout=90)
        drivers = [JobDriver(bootstrap, job, topics) for job in JOBS]
        for driver in drivers:
            driver.running(["task-0"], config, attempt=1, heartbeats=False)
        local_owners(workers, pending=False)  # a request before its job's RUNNING would be refused
        for driver in drivers:
            request_id = uuid.uuid4().hex
            driver.request(
                CheckpointRequested(driver.job_id, CheckpointKind.CHECKPOINT, now_ms(), request_id)
            )
            driver.close()
        yield Group(workers, local_owners(workers, pending=True))
    finally:
        stop_all(workers)


def test_each_worker_lists_every_job_of_the_group_with_its_owner(group: Group) -> None:
    """Each of the three workers' /jobs lists all eight jobs, each with the web address of the
    worker that owns it (a link, since it is http), and no unreachable peer."""
    assert 3 == len(set(group.owners.values())), "the jobs are spread over the three workers"

    for worker in group.workers:
        status, _, view = get(worker.url + "/jobs")

        assert 200 == status
        assert worker.url == view["self"]
        assert group.owners == {job["id"]: job["owner"] for job in view["jobs"]}
        assert sorted(group.owners) == [job["id"] for job in view["jobs"]]
        assert all(job["owner_link"] == job["owner"] for job in view["jobs"])
        assert [] == view["unreachable"]


def test_a_job_s_views_on_another_worker_are_the_owner_s(group: Group) -> None:
    """A job's checkpoints and state asked of a worker that does not own it are the owner's own
    (asked with ?local=1), naming the owner; with ?local=1 that worker answers only for itself."""
    job = JOBS[0]
    owner, other = group.worker(group.owners[job]), group.not_owning(job)

    for view in ("checkpoints", "state", "checkpoints/config", "checkpoints/trend"):
        status, headers, answer = get(f"{other.url}/jobs/{job}/{view}")

        assert 200 == status, answer
        assert owner.url == headers["Cutline-Owner"]
        assert owner.get(f"/jobs/{job}/{view}?local=1") == answer
    _, _, checkpoints = get(f"{other.url}/jobs/{job}/checkpoints")
    assert 1 == checkpoints["counts"]["in_progress"]
    status, _, answer = get(f"{other.url}/jobs/{job}/checkpoints?local=1")
    assert 404 == status, answer


def test_cutline_status_answers_on_any_worker(group: Group) -> None:
    """`cutline status JOB --url W` prints the job's checkpoints and its owner, whichever worker W is."""
    job = JOBS[1]
    for worker in group.workers:
        result = CliRunner().invoke(app, ["status", job, "--url", worker.url], env={"COLUMNS": "200"})

        assert 0 == result.exit_code, result.output
        assert f"checkpoints of {job}" in result.output
        assert group.owners[job] in result.output
        assert "IN_PROGRESS" in result.output


@pytest.mark.skipif(not on_apache_kafka(), reason="Tansu describes a group without its members")
def test_cutline_doctor_without_url_checks_every_worker_its_group_names(group: Group, bootstrap: str) -> None:
    """`cutline doctor --bootstrap B --topic-prefix P`, no --url: one coordinator check for each worker
    that P's coordinator group names, each finding it ready."""
    prefix = group.workers[0].prefix

    result = CliRunner().invoke(app, ["doctor", "--json", "--bootstrap", bootstrap, "--topic-prefix", prefix])

    checks = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    coordinators = [c for c in checks if c["name"] == "coordinator"]
    assert ["ok"] * len(group.workers) == [c["verdict"] for c in coordinators], coordinators
    assert sorted(f"{worker.url}: worker " for worker in group.workers) == sorted(
        c["found"][: c["found"].index(": worker ") + len(": worker ")] for c in coordinators
    )


def test_a_request_for_another_host_name_is_refused(group: Group) -> None:
    """DNS rebinding: a request whose Host header is not a name of the coordinator gets a 421 that
    says which option allows a name; localhost and a name given with that option are answered."""
    url = group.workers[0].url + "/jobs?local=1"

    status, _, answer = get(url, host="attacker.example")
    local, _, _ = get(url, host="localhost")
    allowed, _, _ = get(url, host=f"{ALLOWED_NAME}:80")
    elsewhere, _, _ = get(group.workers[1].url + "/jobs?local=1", host=ALLOWED_NAME)

    assert 421 == status
    assert "--web-allowed-host attacker.example" in answer["errors"][0]
    assert (200, 200, 421) == (local, allowed, elsewhere)


NO_CHROMIUM = "Debian's chromium is not installed here (.ci/run installs it: apt-get install chromium)"


@pytest.fixture(name="page")
def _page() -> Iterator[Page]:
    if not CHROMIUM.exists():
        pytest.skip(reason=NO_CHROMIUM)
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser.new_page()
        finally:
            browser.close()


def test_one_worker_s_dashboard_shows_every_job_and_opens_another_s(group: Group, page: Page) -> None:
    """In a browser, one worker's dashboard lists all eight jobs with their owners (links to the
    other workers), and a job another worker owns opens with its pending checkpoint and owner."""
    worker = group.workers[0]
    page.goto(worker.url + "/")
    page.wait_for_function(f"() => document.querySelectorAll('#jobs tbody tr').length === {len(JOBS)}")

    for job, owner in group.owners.items():
        cell = page.locator(f'#jobs tr[data-job="{job}"] td.owner')
        assert cell.inner_text().startswith(owner)
        if owner != worker.url:
            assert owner == cell.locator("a").get_attribute("href")
    assert page.locator("#unreachable").is_hidden()

    job = next(j for j, owner in group.owners.items() if owner != worker.url)
    page.locator(f'#jobs tr[data-job="{job}"] td:first-child a').click()
    page.locator("#history tbody tr").first.wait_for(timeout=10_000)
    assert job == page.locator("#job-id").inner_text()
    assert group.owners[job] == page.locator("#job-owner").inner_text()
    assert "0/1" == page.locator("#history tbody tr td.acks").first.inner_text()


def test_a_worker_that_does_not_answer_is_shown_unreachable(group: Group) -> None:
    """A worker frozen (SIGSTOP) does not answer: another worker's /jobs still answers, within its
    peer timeout, with the jobs of the others and the frozen one listed as unreachable. Last in the
    module: a worker frozen past the session timeout would be rebalanced away."""
    frozen, asked = group.workers[2], group.workers[0]
    assert frozen.worker_pid is not None
    os.kill(frozen.worker_pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        status, _, view = get(asked.url + "/jobs")
        took = time.monotonic() - started
    finally:
        os.kill(frozen.worker_pid, signal.SIGCONT)

    assert 200 == status
    assert [frozen.url] == [peer["url"] for peer in view["unreachable"]]
    assert "no answer within" in view["unreachable"][0]["reason"]
    assert {j for j, o in group.owners.items() if o != frozen.url} == {job["id"] for job in view["jobs"]}
    assert took < 5, f"/jobs took {took:.1f} s with a frozen peer"
