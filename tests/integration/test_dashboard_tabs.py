"""A job's page as a Flink user looks for it: its status line, the Summary and Configuration tabs, and
each checkpoint's tasks (issue 51).

One coordinator worker serves a job of two participant tasks that checkpoints every 300 ms: task-0's
snapshot is small enough to ride inside its ack, task-1's goes to a file. The JSON views are checked
over HTTP, then the tabs in Debian's headless Chromium (screenshots of each under the test's tmp
dir, or ``CUTLINE_SCREENSHOT_DIR``).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright
from support import TEST_PARTITIONS, eventually

from coordinator.core.stats import HISTORY_SIZE
from coordinator.service.app import Settings, ensure_topics
from coordinator.service.supervisor import CoordinatorProcess
from coordinator.service.units import UNLIMITED
from events.task.participant import JobDriver, Participant
from events.wire.records import CheckpointConfig, CheckpointKind, CheckpointRequested
from events.wire.topics import Topics

CHROMIUM = Path("/usr/bin/chromium")
JOB = "orders"
TASKS = ("task-0", "task-1")
SNAPSHOT_BYTES = {"task-0": 64, "task-1": 4096}
"""task-0's snapshot rides inline (under the 1 KiB threshold), task-1's goes to a file."""


@dataclass
class Job:
    coordinator: CoordinatorProcess
    driver: JobDriver

    def get(self, path: str) -> tuple[int, Any]:
        """The status and JSON body of one of the coordinator's views."""
        try:
            with urllib.request.urlopen(self.coordinator.url + path, timeout=5) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)

    def view(self, path: str) -> Any:
        status, body = self.get(path)
        assert 200 == status, (path, body)
        return body


@pytest.fixture(name="job", scope="module")
def _job(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    prefix = f"tabs{uuid.uuid4().hex[:8]}."
    ensure_topics(Settings(bootstrap, prefix, partitions=TEST_PARTITIONS))
    topics = Topics(prefix)
    coordinator = CoordinatorProcess(bootstrap, prefix).start()
    location = f"file://{tmp_path_factory.mktemp('tabs')}/checkpoints"
    participants = []

    def snapshot_of(task: str) -> Any:
        return lambda barrier: b"s" * SNAPSHOT_BYTES[task]

    for task in TASKS:
        participant = Participant(bootstrap, JOB, task, 1, topics, snapshot_of(task), lambda: {"orders:0": 1})
        participant.run_in_thread()
        participants.append(participant)
    driver = JobDriver(bootstrap, JOB, topics)
    config = CheckpointConfig(
        interval_ms=300,
        timeout_ms=10_000,
        location=location,
        tolerable_failures=UNLIMITED,
        inline_threshold_bytes=1024,
    )
    driver.running(TASKS, config, attempt=1)
    try:
        yield Job(coordinator, driver)
    finally:
        for participant in participants:
            participant.close()
        driver.close()
        coordinator.stop()


def completed_checkpoint(job: Job) -> dict[str, Any]:
    """The latest completed checkpoint, once there is one."""
    return eventually(
        lambda: job.view(f"/jobs/{JOB}/checkpoints")["latest"]["completed"],
        timeout=60,
        what="a completed checkpoint",
    )


class TestViews:
    def test_the_job_has_a_status_line_with_its_latest_acknowledgement(self, job: Job) -> None:
        completed_checkpoint(job)

        body = job.view(f"/jobs/{JOB}")

        assert ("RUNNING", 1, 0, 2, {}) == (
            body["status"],
            body["attempt"],
            body["restarts"],
            body["tasks"],
            body["tasks_not_running"],
        )
        assert (
            body["latest_ack_timestamp"]
            >= job.view(f"/jobs/{JOB}/checkpoints")["history"][-1]["trigger_timestamp"]
        )

    def test_a_checkpoints_details_name_each_task_its_ack_duration_size_and_storage(self, job: Job) -> None:
        latest = completed_checkpoint(job)

        details = job.view(f"/jobs/{JOB}/checkpoints/details/{latest['id']}")

        tasks = {task["task_id"]: task for task in details["tasks"]}
        assert list(TASKS) == list(tasks)
        assert {"ACKNOWLEDGED"} == {task["status"] for task in tasks.values()}
        assert ("inline", "file") == (tasks["task-0"]["storage"], tasks["task-1"]["storage"])
        assert (64, 4096) == (tasks["task-0"]["state_size"], tasks["task-1"]["state_size"])
        for task in tasks.values():
            assert details["trigger_timestamp"] <= task["ack_timestamp"] <= details["latest_ack_timestamp"]
            assert task["end_to_end_duration"] == task["ack_timestamp"] - details["trigger_timestamp"]

    def test_the_latest_savepoints_details_answer_after_the_history_moved_past_it(self, job: Job) -> None:
        request = CheckpointRequested(JOB, CheckpointKind.SAVEPOINT, 0, uuid.uuid4().hex)
        job.driver.request(request)
        savepoint = eventually(
            lambda: job.view(f"/jobs/{JOB}/checkpoints")["latest"]["savepoint"],
            timeout=60,
            what="a savepoint",
        )
        eventually(
            lambda: min(e["id"] for e in job.view(f"/jobs/{JOB}/checkpoints")["history"]) > savepoint["id"],
            timeout=60,
            what=f"{HISTORY_SIZE} checkpoints after the savepoint",
        )

        details = job.view(f"/jobs/{JOB}/checkpoints/details/{savepoint['id']}")

        assert ("SAVEPOINT", "COMPLETED") == (details["checkpoint_type"], details["status"])
        assert list(TASKS) == [task["task_id"] for task in details["tasks"]]

    def test_the_summary_has_each_statistic_with_its_unit(self, job: Job) -> None:
        completed_checkpoint(job)

        summary = job.view(f"/jobs/{JOB}/checkpoints/summary")

        assert summary["count"] >= 1
        rows = {row["statistic"]: row for row in summary["rows"]}
        assert ["min", "avg", "max", "p50", "p90", "p95", "p99", "p999"] == list(rows)
        assert rows["min"]["end_to_end_duration"] <= rows["max"]["end_to_end_duration"]
        assert rows["max"]["shown"]["end_to_end_duration"].endswith((" ms", " s"))
        assert "4.1 KiB" == rows["min"]["shown"]["checkpointed_size"]  # 64 + 4096 bytes

    def test_the_configuration_has_units_and_says_unlimited(self, job: Job) -> None:
        config = job.view(f"/jobs/{JOB}/checkpoints/config")

        assert (300, UNLIMITED) == (config["interval"], config["tolerable_failed_checkpoints"])
        shown = {row["key"]: row["shown"] for row in config["shown"]}
        assert {
            "interval": "300 ms",
            "timeout": "10 s",
            "min_pause": "0 ms",
            "max_concurrent": "1",
            "tolerable_failed_checkpoints": "unlimited",
            "num_retained": "1",
            "inline_threshold": "1.0 KiB",
        }.items() <= shown.items()

    def test_a_worker_that_reaches_its_broker_is_ready(self, job: Job) -> None:
        status, ready = eventually(lambda: job.get("/ready"), lambda answer: answer[1]["broker"]["reachable"])

        assert (200, True, []) == (status, ready["ready"], ready["problems"])
        overview = job.view("/overview")
        assert (True, True, job.coordinator.url) == (
            overview["ready"],
            overview["broker"]["reachable"],
            overview["self"].rstrip("/"),
        )

    def test_an_unknown_job_or_checkpoint_is_a_404_that_says_so(self, job: Job) -> None:
        assert 404 == job.get("/jobs/nobody")[0]
        assert 404 == job.get("/jobs/nobody/checkpoints/summary")[0]
        status, body = job.get(f"/jobs/{JOB}/checkpoints/details/999999")
        assert 404 == status
        assert "neither in the history nor the latest completed, savepoint or failed one" in body["errors"][0]


@pytest.fixture(name="page")
def _page() -> Iterator[Page]:
    if not CHROMIUM.exists():
        pytest.skip(
            reason="Debian's chromium is not installed here (.ci/run installs it: apt-get install chromium)"
        )
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": 1280, "height": 900})
        finally:
            browser.close()


@pytest.mark.slow
def test_each_tab_of_the_job_page_shows_what_flink_shows(job: Job, page: Page, tmp_path: Path) -> None:
    """Overview with the job's status line, Summary, Configuration, and a checkpoint's tasks: each
    drawn in the browser from the live views and captured as a screenshot."""
    shots = Path(os.environ.get("CUTLINE_SCREENSHOT_DIR", tmp_path))
    completed_checkpoint(job)
    page.goto(f"{job.coordinator.url}/#/jobs/{JOB}")

    page.locator("#history tbody tr").first.wait_for(timeout=10_000)
    page.wait_for_function(
        "() => document.querySelector('#job-facts').textContent.includes('latest acknowledgement')"
    )
    assert "RUNNING" == page.locator("#job-status").inner_text()
    facts = page.locator("#job-facts").inner_text()
    assert "attempt 1 · restarts 0 · 2 tasks, all running · latest acknowledgement " in facts, facts
    assert page.locator("#live").get_attribute("class") == "live"
    assert page.locator("#banner").is_hidden()
    screenshot(page, shots / "tab-overview.png")

    page.locator('#tabs a[data-tab="summary"]').click()
    page.locator('#summary tr[data-statistic="p999"]').wait_for(timeout=10_000)
    assert page.locator("#tab-overview").is_hidden()
    labels = page.locator("#summary tbody th").all_inner_texts()
    assert ["minimum", "average", "maximum", "50th percentile"] == labels[:4]
    assert page.locator('#summary tr[data-statistic="max"] td.duration').inner_text().endswith((" ms", " s"))
    assert "4.1 KiB" == page.locator('#summary tr[data-statistic="min"] td.size').inner_text()
    screenshot(page, shots / "tab-summary.png")

    page.locator('#tabs a[data-tab="config"]').click()
    page.locator('#config tr[data-setting="interval"]').wait_for(timeout=10_000)
    setting = {
        key: page.locator(f'#config tr[data-setting="{key}"] td').inner_text()
        for key in ("interval", "timeout", "tolerable_failed_checkpoints", "num_retained", "inline_threshold")
    }
    assert {
        "interval": "300 ms",
        "timeout": "10 s",
        "tolerable_failed_checkpoints": "unlimited",
        "num_retained": "1",
        "inline_threshold": "1.0 KiB",
    } == setting
    assert "2147483647" not in page.locator("#config").inner_text()
    screenshot(page, shots / "tab-configuration.png")

    page.locator('#tabs a[data-tab="overview"]').click()
    completed = page.locator("#history tbody tr").filter(has=page.locator(".status-COMPLETED"))
    checkpoint_id = completed.first.get_attribute("data-checkpoint")
    page.locator(f'#history tr[data-checkpoint="{checkpoint_id}"] td a').click()  # the table redraws
    page.locator('#tasks tr[data-task="task-1"]').wait_for(timeout=10_000)
    assert f"Checkpoint {checkpoint_id}" == page.locator('#tabs a[data-tab="checkpoint"]').inner_text()
    row = {task: page.locator(f'#tasks tr[data-task="{task}"] td').all_inner_texts() for task in TASKS}
    assert ["ACKNOWLEDGED", "inline"] == [row["task-0"][1], row["task-0"][5]]
    assert ["ACKNOWLEDGED", "4.0 KiB", "file"] == [row["task-1"][1], row["task-1"][4], row["task-1"][5]]
    assert row["task-1"][3].endswith(" ms"), row
    screenshot(page, shots / "tab-checkpoint.png")


def screenshot(page: Page, path: Path) -> None:
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000, f"{path} looks empty"
