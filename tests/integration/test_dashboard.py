"""The web dashboard in a real browser: Debian's headless Chromium driven by Playwright.

A coordinator worker serves the dashboard while a job of two participant tasks checkpoints every
300 ms. The page must show the job, update its completed count without a reload, open the job's
checkpoint history with per-task acks, and draw its charts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import create_topics
from events.task.participant import JobDriver, Participant
from events.wire.records import CheckpointBarrier, CheckpointConfig
from events.wire.topics import Topics

CHROMIUM = Path("/usr/bin/chromium")
JOB = "clicks"
TASKS = ("task-0", "task-1")

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed here (.ci/run installs it: apt-get install chromium)",
)


@pytest.fixture(name="checkpointing")
def _checkpointing(bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[CoordinatorProcess]:
    topics = Topics(topic_prefix)
    create_topics(bootstrap, [*topics.all, topics.ticks])
    coordinator = CoordinatorProcess(bootstrap, topic_prefix).start()
    participants = []

    def snapshot(barrier: CheckpointBarrier) -> bytes:
        return b"x" * (100 + barrier.checkpoint_id)

    for task in TASKS:
        participant = Participant(bootstrap, JOB, task, 1, topics, snapshot, lambda: {"clicks-in:0": 1})
        participant.run_in_thread()
        participants.append(participant)
    driver = JobDriver(bootstrap, JOB, topics)
    config = CheckpointConfig(interval_ms=300, timeout_ms=10_000, location=f"file://{tmp_path}/checkpoints")
    driver.running(TASKS, config, attempt=1)
    try:
        yield coordinator
    finally:
        for participant in participants:
            participant.close()
        driver.close()
        coordinator.stop()


@pytest.fixture(name="page")
def _page() -> Iterator[Page]:
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": 1280, "height": 900})
        finally:
            browser.close()


def test_the_dashboard_follows_a_checkpointing_job_without_a_reload(
    checkpointing: CoordinatorProcess, page: Page, tmp_path: Path
) -> None:
    loads: list[str] = []
    page.on("load", lambda _: loads.append(page.url))
    page.goto(checkpointing.url + "/")

    completed = page.locator(f'#jobs tr[data-job="{JOB}"] td.completed')
    completed.wait_for(timeout=30_000)
    shown = f"""Number(document.querySelector('#jobs tr[data-job="{JOB}"] td.completed').textContent)"""
    page.wait_for_function(f"() => {shown} >= 1", timeout=30_000)
    seen = int(completed.inner_text())
    page.wait_for_function(f"() => {shown} > {seen}", timeout=30_000)
    assert 1 == len(loads), f"the page reloaded: {loads}"
    assert "RUNNING" == page.locator(f'#jobs tr[data-job="{JOB}"] td:nth-child(2)').inner_text()
    assert checkpointing.url in page.locator("#workers").inner_text()

    page.locator(f'#jobs tr[data-job="{JOB}"] a').click()
    history = page.locator("#history tbody tr")
    history.first.wait_for(timeout=10_000)
    page.wait_for_function("() => document.querySelectorAll('#duration-chart rect.bar').length >= 1")
    assert JOB == page.locator("#job-id").inner_text()
    acks = [history.nth(i).locator("td.acks").inner_text() for i in range(history.count())]
    assert "2/2" in acks, acks
    assert int(page.locator("#counts .completed b").inner_text()) > seen
    assert page.locator("#size-chart rect.bar").count() >= 1

    screenshot = Path(os.environ.get("CUTLINE_SCREENSHOT_DIR", tmp_path)) / "dashboard.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000
