"""Recovery of a journal partition (claim, read to the claim, fold) against a broker that misbehaves.

These tests pause their own broker (SIGSTOP), so they never use the session's broker or
``CUTLINE_BOOTSTRAP``: Apache Kafka, or Tansu with ``CUTLINE_TEST_BROKER=tansu``
(:func:`support.local_broker`). The module shares that broker; each test has topics of its own.
"""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from itertools import islice
from random import Random
from uuid import uuid4

import pytest
from confluent_kafka import Producer
from support import LocalBroker, local_broker

from coordinator.core.decider import fold_jobs
from coordinator.core.state import state_json
from coordinator.service.claims import (
    ClaimedPartition,
    PartitionCountChanged,
    claim_partition,
    snapshot_message,
)
from coordinator.service.runtime import Coordinator
from coordinator.simulation.traffic import simulate
from events.dev.broker import create_topics
from events.kafka.clients import job_key, producer_config
from events.kafka.log import read_to_end
from events.wire.codec import encode
from events.wire.fencing import epoch_header
from events.wire.records import JournalEvent
from events.wire.topics import Topics
from events.wire.vocabulary import SNAPSHOT_PARTITIONS_HEADER


@pytest.fixture(name="own_broker", scope="module")
def _own_broker() -> Iterator[LocalBroker]:
    with local_broker() as broker:
        yield broker


@pytest.fixture(name="topics")
def _topics(own_broker: LocalBroker) -> Topics:
    """A journal and a snapshot topic of one partition, the test's own."""
    topics = Topics(f"r{uuid4().hex[:8]}.")
    create_topics(own_broker.bootstrap, [topics.checkpoints, topics.snapshots], partitions=1)
    return topics


def produce_journal(
    bootstrap: str, topics: Topics, events: list[JournalEvent], epoch: int | None = None
) -> None:
    """The events as a coordinator of ``epoch`` would have written them (None: no header, epoch 0)."""
    headers = [epoch_header(epoch)] if epoch is not None else None
    producer = Producer(producer_config(bootstrap, {"linger.ms": 20, "batch.num.messages": 10_000}))
    for event in events:
        while True:
            try:
                producer.produce(
                    topics.checkpoints,
                    key=job_key(event.job_id),
                    value=encode(event),
                    partition=0,
                    headers=headers,
                )
                break
            except BufferError:
                producer.poll(0.1)
    assert 0 == producer.flush(120)


@pytest.mark.slow
class TestRecoveryWithAPausedBroker:
    def test_the_fold_of_a_60000_event_journal_survives_a_2_s_broker_pause(
        self, own_broker: LocalBroker, topics: Topics
    ) -> None:
        """Given a 60,000-event journal, when the broker stops for 2 s while a worker folds it, then
        the worker waits and its state equals the full fold (silence is never the end)."""
        events = list(islice(simulate(Random(7), jobs=4), 60_000))
        produce_journal(own_broker.bootstrap, topics, events)
        result: list[ClaimedPartition | BaseException] = []

        def claim() -> None:
            try:
                result.append(
                    claim_partition(own_broker.bootstrap, topics, topics.snapshots, 1, 0, "worker-a")
                )
            except BaseException as exc:
                result.append(exc)

        worker = threading.Thread(target=claim)
        worker.start()
        time.sleep(0.5)
        folding_when_paused = worker.is_alive()
        (pid,) = own_broker.pids
        os.killpg(pid, signal.SIGSTOP)
        try:
            time.sleep(2.0)
        finally:
            os.killpg(pid, signal.SIGCONT)
        worker.join(120)

        assert folding_when_paused, "the fold ended before the pause (the test did not test it)"
        (claimed,) = result
        assert isinstance(claimed, ClaimedPartition), claimed
        expected = fold_jobs(events)
        assert 60_001 == claimed.folded  # every event, and the claim
        assert sorted(expected) == sorted(claimed.coordinator.states)
        for job_id, state in expected.items():
            assert state_json(state) == state_json(claimed.coordinator.states[job_id])
        assert 1 == claimed.epoch


class TestClaims:
    def test_each_claim_is_higher_than_every_earlier_one(
        self, own_broker: LocalBroker, topics: Topics
    ) -> None:
        """Claiming a partition twice gives epochs 1 and 2; the second worker's fold holds the first's
        state and the journal's last record is its claim."""
        events = list(islice(simulate(Random(3), jobs=2), 500))
        produce_journal(own_broker.bootstrap, topics, events)

        first = claim_partition(own_broker.bootstrap, topics, topics.snapshots, 1, 0, "worker-a")
        second = claim_partition(own_broker.bootstrap, topics, topics.snapshots, 1, 0, "worker-b")

        assert (1, 2) == (first.epoch, second.epoch)
        assert second.claim_offset > first.claim_offset
        assert {j: state_json(s) for j, s in first.coordinator.states.items()} == {
            j: state_json(s) for j, s in second.coordinator.states.items()
        }

    def test_a_partition_whose_jobs_hash_elsewhere_now_is_not_claimed(
        self, own_broker: LocalBroker, topics: Topics
    ) -> None:
        """Given the journal of four jobs that ran with one partition, when a worker claims it as
        partition 0 of four (partitions were added since: job-0 and job-2 now hash to 1 and 2), then
        it refuses, names the jobs and the count they ran with, and writes no claim."""
        events = list(islice(simulate(Random(7), jobs=4), 500))
        produce_journal(own_broker.bootstrap, topics, events)
        end = len(events)

        with pytest.raises(PartitionCountChanged) as refused:
            claim_partition(own_broker.bootstrap, topics, topics.snapshots, 4, 0, "worker-a")

        message = str(refused.value)
        assert "holds jobs 'job-0', 'job-2'" in message
        assert "(every job here belongs to it with 1 partition" in message
        assert "new prefix" in message
        assert end == len(list(read_to_end(own_broker.bootstrap, topics.checkpoints, [0], timeout=10)))
        assert 1 == claim_partition(own_broker.bootstrap, topics, topics.snapshots, 1, 0, "worker-b").epoch

    @pytest.mark.parametrize("written_with", [None, 8])
    def test_a_snapshot_taken_with_another_partition_count_is_not_trusted(
        self, own_broker: LocalBroker, topics: Topics, written_with: int | None
    ) -> None:
        """Given a snapshot that chose the partition's jobs with 8 partitions (said by its header, or
        without the header, as every coordinator wrote them before 2026-11-25) and lacks a job, when
        a worker of one partition claims it, then it folds the journal from the start instead."""
        events = list(islice(simulate(Random(11), jobs=3), 600))
        produce_journal(own_broker.bootstrap, topics, events)
        partial = Coordinator(topics, partitions=1)
        partial.recover((e, None) for e in events if e.job_id != "job-1")
        write_snapshot(own_broker.bootstrap, topics, partial, journal_offset=599, partitions=written_with)

        claimed = claim_partition(own_broker.bootstrap, topics, topics.snapshots, 1, 0, "a")

        assert claimed.snapshot_offset is None
        assert 601 == claimed.folded  # the whole journal and the claim
        assert {j: state_json(s) for j, s in fold_jobs(events).items()} == {
            j: state_json(s) for j, s in claimed.coordinator.states.items()
        }


def write_snapshot(
    bootstrap: str,
    topics: Topics,
    holder: ClaimedPartition | Coordinator,
    epoch: int = 0,
    journal_offset: int = -1,
    partitions: int | None = 1,
) -> None:
    """What a worker does after its claim: the partition's fold as a snapshot, taken with
    ``partitions`` (None: without the header that says it, as before 2026-11-25)."""
    if isinstance(holder, ClaimedPartition):
        holder, epoch, journal_offset = holder.coordinator, holder.epoch, holder.claim_offset
    snapshot = holder.snapshot(0, epoch, journal_offset, 0)
    key, value, headers = snapshot_message(snapshot, partitions or 1)
    if partitions is None:
        headers = [(name, v) for name, v in headers if name != SNAPSHOT_PARTITIONS_HEADER]
    producer = Producer(producer_config(bootstrap))
    producer.produce(topics.snapshots, key=key, value=value, headers=headers, partition=0)
    assert 0 == producer.flush(30)


def median_recovery(bootstrap: str, topics: Topics, runs: int) -> tuple[float, int]:
    """Median seconds of a claim (snapshot + tail + claim) over ``runs``, and the records it read."""
    seconds, folded = [], []
    for i in range(runs):
        claimed = claim_partition(bootstrap, topics, topics.snapshots, 1, 0, f"worker-{i}")
        write_snapshot(bootstrap, topics, claimed)
        seconds.append(claimed.seconds)
        folded.append(claimed.folded)
    return statistics.median(seconds), max(folded)


class TestBoundedRecovery:
    def test_recovery_is_the_snapshot_and_the_journal_after_it(
        self, own_broker: LocalBroker, topics: Topics
    ) -> None:
        """Given a snapshot after 2,000 events and 300 more events, a new owner reads only the 300
        (and the claim) and holds what folding all 2,300 gives."""
        events = list(islice(simulate(Random(11), jobs=3), 2_300))
        produce_journal(own_broker.bootstrap, topics, events[:2_000])
        write_snapshot(
            own_broker.bootstrap,
            topics,
            claim_partition(own_broker.bootstrap, topics, topics.snapshots, 1, 0, "a"),
        )
        produce_journal(own_broker.bootstrap, topics, events[2_000:], epoch=1)

        claimed = claim_partition(own_broker.bootstrap, topics, topics.snapshots, 1, 0, "b")

        assert claimed.snapshot_offset == 2_000  # the first claim's offset
        assert 301 == claimed.folded
        assert {j: state_json(s) for j, s in fold_jobs(events).items()} == {
            j: state_json(s) for j, s in claimed.coordinator.states.items()
        }

    @pytest.mark.slow
    @pytest.mark.timeout(900)
    def test_failover_on_a_1m_event_journal_takes_no_longer_than_on_a_1000_event_one(self) -> None:
        """Failover recovery (snapshot + tail + claim) of a 1,000,000-event journal is within 2x that
        of a 1,000-event journal: recovery does not grow with history.

        The journals repeat one simulated block of 1,000 events (simulating and encoding a million
        takes minutes on a busy 2-core machine); the first owner's snapshot is the fold of exactly
        those events, written as a worker writes it."""
        block = list(islice(simulate(Random(5), jobs=4), 1_000))
        frames = [(job_key(e.job_id), encode(e)) for e in block]
        timings = {}
        # a broker of its own, and the small journal measured before the large one is written: no
        # other journal's records weigh on either measurement
        with local_broker() as broker:
            for size in (1_000, 1_000_000):
                topics = Topics(f"r{size}.")
                create_topics(broker.bootstrap, [topics.checkpoints, topics.snapshots], partitions=1)
                produce_frames(broker.bootstrap, topics, frames, size // len(block))
                first = Coordinator(topics, partitions=1)
                for _ in range(size // len(block)):
                    first.recover((event, None) for event in block)
                write_snapshot(broker.bootstrap, topics, first, epoch=0, journal_offset=size - 1)
                timings[size] = median_recovery(broker.bootstrap, topics, runs=5)

        (small, small_read), (large, large_read) = timings[1_000], timings[1_000_000]
        assert large_read == small_read <= 2  # the claims since the snapshot, not the history
        assert large <= 2 * small, f"1M-event failover {large:.3f}s, 1,000-event {small:.3f}s"


def produce_frames(bootstrap: str, topics: Topics, frames: list[tuple[bytes, bytes]], repeat: int) -> None:
    producer = Producer(producer_config(bootstrap, {"linger.ms": 50, "batch.num.messages": 10_000}))
    for _ in range(repeat):
        for key, value in frames:
            while True:
                try:
                    producer.produce(topics.checkpoints, key=key, value=value, partition=0)
                    break
                except BufferError:
                    producer.poll(0.05)
    assert 0 == producer.flush(120)
