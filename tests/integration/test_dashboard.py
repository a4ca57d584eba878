"""The web dashboard in a real browser: Debian's headless Chromium driven by Playwright.

A coordinator worker serves the dashboard while a job of two participant tasks checkpoints every
300 ms. The page must show the job, update its completed count without a reload, open the job's
checkpoint history with per-task acks, and draw its charts. Task 0 also emits latency markers
(``Participant.latency_marker``) through a Kafka topic to an ``enrich`` step that records them
(``Participant.mark_latency``): the job page's Latency panel shows them.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from playwright.sync_api import Page, sync_playwright
from support import create_protocol_topics

from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import create_topics
from events.kafka.clients import producer_config
from events.task.latency import LatencyMarker
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
    create_protocol_topics(bootstrap, topics.prefix)
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
    stop = threading.Event()
    markers = threading.Thread(target=_markers, args=(bootstrap, topic_prefix, participants[0], stop))
    markers.start()
    try:
        yield coordinator
    finally:
        stop.set()
        markers.join()
        for participant in participants:
            participant.close()
        driver.close()
        coordinator.stop()


def _markers(bootstrap: str, prefix: str, source: Participant, stop: threading.Event) -> None:
    """Task 0's source sends a latency marker every 100 ms as a record of its input topic; its
    ``enrich`` step reads it back from Kafka and records how long it took."""
    topic = f"{prefix}clicks-in"
    create_topics(bootstrap, [topic], partitions=1)
    producer = Producer(producer_config(bootstrap))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        while not stop.is_set():
            marker = source.latency_marker("clicks-in", 0, interval_ms=100)
            if marker is not None:
                producer.produce(topic, value=b"", headers=[marker.header()])
                producer.poll(0)
            message = consumer.poll(0.05)
            arrived = (
                None if message is None or message.error() else LatencyMarker.from_headers(message.headers())
            )
            if arrived is not None:
                source.mark_latency(arrived, "enrich", 0)
    finally:
        consumer.close()
        producer.flush(5)


@pytest.fixture(name="page")
def _page() -> Iterator[Page]:
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": 1280, "height": 900})
        finally:
            browser.close()


@pytest.mark.slow
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

    # the Latency panel: the markers' time from the source, through Kafka, to the enrich step
    page.wait_for_function(
        """() => Number(document.querySelector('#latency tr[data-operator="enrich"] td.count')
        ?.textContent) >= 3""",
        timeout=30_000,
    )
    assert page.locator("#no-latency").is_hidden()
    p50 = page.locator('#latency tr[data-operator="enrich"] td.p50').inner_text()
    assert p50.endswith(" ms") and 0 <= int(p50.removesuffix(" ms")) < 10_000, p50
    panel = Path(os.environ.get("CUTLINE_SCREENSHOT_DIR", tmp_path)) / "latency-panel.png"
    page.locator("#latency-panel").screenshot(path=str(panel))
    assert panel.stat().st_size > 2_000
