"""Prometheus metrics of a coordinator worker (coordinator/service/metrics.py), read from a
runtime fed bytes, exposed in the text format and parsed back as Prometheus would."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.service.gc_schedule import ScheduledCollections
from coordinator.service.health import BrokerHealth
from coordinator.service.metrics import (
    CoordinatorCollector,
    InputLag,
    PartitionView,
    RefetchCounts,
    registry_for,
)
from coordinator.service.runtime import Coordinator
from events.wire.codec import encode
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointConfig,
    CheckpointTriggered,
    JobStatus,
    JobStatusChanged,
    StateHandle,
)
from events.wire.topics import Topics

TOPICS = Topics("t.")
JOB = "job"
CONFIG = CheckpointConfig(interval_ms=100, location="file:///ckpt")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scraped(collector: CoordinatorCollector) -> Samples:
    text = generate_latest(registry_for(collector)).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def ack(coordinator: Coordinator, triggered: CheckpointTriggered, task: str, offset: int, now: int) -> None:
    record = CheckpointAcknowledged(
        JOB,
        triggered.checkpoint_id,
        1,
        task,
        now,
        state=StateHandle(f"{triggered.location}/{task}", 100, "0" * 64),
        offsets={"in:0": 7},
    )
    coordinator.handle(TOPICS.acks, 0, offset, JOB.encode(), encode(record), now)


def test_flink_s_checkpoint_metrics_follow_the_job() -> None:
    """Given a job that completed one checkpoint of two tasks and has a second in progress, the
    job's gauges say so under Flink's names."""
    coordinator = Coordinator(TOPICS, rng=random.Random(1))
    running = JobStatusChanged(JOB, JobStatus.RUNNING, 0, 1, ("a", "b"), CONFIG)
    coordinator.handle(TOPICS.job_status, 0, 0, JOB.encode(), encode(running), 0)
    first = next(e for e in coordinator.tick(JOB, 10_000).journal if isinstance(e, CheckpointTriggered))
    ack(coordinator, first, "a", 0, 10_020)
    ack(coordinator, first, "b", 1, 10_050)
    second = next(e for e in coordinator.tick(JOB, 20_000).journal if isinstance(e, CheckpointTriggered))
    ack(coordinator, second, "a", 2, 20_010)

    metrics = scraped(CoordinatorCollector(coordinator))

    job = (("job_id", JOB),)
    assert 2 == metrics[("cutline_job_totalNumberOfCheckpoints", job)]
    assert 1 == metrics[("cutline_job_numberOfCompletedCheckpoints", job)]
    assert 1 == metrics[("cutline_job_numberOfInProgressCheckpoints", job)]
    assert 0 == metrics[("cutline_job_numberOfFailedCheckpoints", job)]
    assert first.checkpoint_id == metrics[("cutline_job_lastCompletedCheckpointId", job)]
    assert 50 == metrics[("cutline_job_lastCheckpointDuration", job)]
    assert 200 == metrics[("cutline_job_lastCheckpointSize", job)]
    assert 1 == metrics[("cutline_job_isRunning", job)]
    assert 1 == metrics[("cutline_job_attempt", job)]
    assert ("cutline_job_lastCheckpointRestoreTimestamp", job) not in metrics  # it never restored


def test_the_worker_counts_inputs_by_topic_and_dead_letters_by_reason() -> None:
    """Given two job-status inputs and three undecodable acks, the counters say 2 and 3."""
    coordinator = Coordinator(TOPICS, rng=random.Random(1))
    running = JobStatusChanged(JOB, JobStatus.RUNNING, 0, 1, ("a",), CONFIG)
    for offset in range(2):
        coordinator.handle(TOPICS.job_status, 0, offset, JOB.encode(), encode(running), 0)
    for offset in range(3):
        coordinator.handle(TOPICS.acks, 0, offset, JOB.encode(), b"\x00garbage", 0)

    metrics = scraped(CoordinatorCollector(coordinator))

    assert 2 == metrics[("cutline_coordinator_inputs_decided_total", (("topic", TOPICS.job_status),))]
    assert 3 == metrics[("cutline_coordinator_inputs_decided_total", (("topic", TOPICS.acks),))]
    assert 3 == metrics[("cutline_coordinator_dead_letters_total", (("reason", "BAD_MAGIC"),))]
    assert 1 == metrics[("cutline_coordinator_jobs", ())]


def test_partitions_and_input_lag_come_from_the_shell() -> None:
    coordinator = Coordinator(TOPICS)
    collector = CoordinatorCollector(
        coordinator,
        partitions=lambda: [PartitionView(3, epoch=4, ready=True, journal_offset=99, recovery_seconds=0.25)],
        input_lag=lambda: [InputLag(TOPICS.acks, 3, 12)],
    )

    metrics = scraped(collector)

    partition = (("partition", "3"),)
    assert (4, 1, 99, 0.25) == (
        metrics[("cutline_coordinator_partition_epoch", partition)],
        metrics[("cutline_coordinator_partition_ready", partition)],
        metrics[("cutline_coordinator_journal_offset", partition)],
        metrics[("cutline_coordinator_recovery_seconds", partition)],
    )
    assert 12 == metrics[("cutline_coordinator_input_lag", (("partition", "3"), ("topic", TOPICS.acks)))]


def test_what_rebalances_cost_the_input_consumer_is_counted() -> None:
    collector = CoordinatorCollector(Coordinator(TOPICS), refetches=lambda: RefetchCounts(37, 2))

    metrics = scraped(collector)

    assert 37 == metrics[("cutline_coordinator_records_fetched_again_total", ())]
    assert 2 == metrics[("cutline_coordinator_partitions_sought_back_total", ())]


def test_the_documented_metrics_and_the_example_alerts_name_metrics_that_exist() -> None:
    """docs/coordinator.md's tables and docs/prometheus-alerts.yml name only exported metrics, and
    the tables name every one."""
    exported = set()
    collector = CoordinatorCollector(
        Coordinator(TOPICS), collections=ScheduledCollections(), broker=lambda: BrokerHealth()
    )
    for family in collector.collect():
        exported.add(family.name + ("_total" if family.type == "counter" else ""))
    docs = Path(__file__).resolve().parents[2] / "docs"
    table = (docs / "coordinator.md").read_text().partition("## Metrics")[2].partition("\n## ")[0]
    alerts = (docs / "prometheus-alerts.yml").read_text()

    assert exported == set(re.findall(r"`(cutline_\w+)`", table))
    assert set(re.findall(r"\b(cutline_\w+)", alerts)) <= exported


def test_the_worker_s_scheduled_garbage_collections_are_counted_with_their_time() -> None:
    collections = ScheduledCollections()
    collections.runs, collections.seconds = 2, 0.125  # as after two runs (tests/unit/test_gc_schedule.py)

    metrics = scraped(CoordinatorCollector(Coordinator(TOPICS), collections=collections))

    assert 2 == metrics[("cutline_coordinator_gc_collections_total", ())]
    assert 0.125 == metrics[("cutline_coordinator_gc_seconds_total", ())]


def test_partitions_stepped_down_are_counted() -> None:
    """A partition a newer claim fenced this worker out of shows in the stepped-down gauge."""
    views = [
        PartitionView(3, epoch=4, ready=True, journal_offset=99, recovery_seconds=0.25),
        PartitionView(5, epoch=2, ready=False, journal_offset=7, recovery_seconds=None, phase="STEPPED_DOWN"),
        PartitionView(6, epoch=0, ready=False, journal_offset=-1, recovery_seconds=None, phase="RECOVERING"),
    ]
    collector = CoordinatorCollector(Coordinator(TOPICS), partitions=lambda: views)
    metrics = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in collector.collect()
        for sample in family.samples
    }
    assert 1 == metrics[("cutline_coordinator_partitions_stepped_down", ())]


def test_how_long_each_held_partition_has_not_been_decided_is_a_gauge() -> None:
    """A partition that cannot be decided says so (issue 52): 0 while decided here."""
    views = [
        PartitionView(3, epoch=4, ready=True, journal_offset=99, recovery_seconds=0.25),
        PartitionView(6, 0, False, -1, None, "RECOVERING", "recovering: ...", undecided_seconds=42.5),
    ]
    metrics = scraped(CoordinatorCollector(Coordinator(TOPICS), partitions=lambda: views))

    assert 0 == metrics[("cutline_coordinator_partition_undecided_seconds", (("partition", "3"),))]
    assert 42.5 == metrics[("cutline_coordinator_partition_undecided_seconds", (("partition", "6"),))]


@pytest.mark.parametrize(("reachable", "value"), [(None, 1.0), (True, 1.0), (False, 0.0)])
def test_the_broker_counts_as_reachable_until_the_probe_finds_it_is_not(
    reachable: bool | None, value: float
) -> None:
    """``cutline_coordinator_broker_reachable`` is 0 only while the probe says the broker is unreachable
    (``/ready`` answers 503 then), not before the first probe."""
    collector = CoordinatorCollector(Coordinator(TOPICS), broker=lambda: BrokerHealth(reachable=reachable))

    assert value == scraped(collector)[("cutline_coordinator_broker_reachable", ())]
