"""Recovery of a journal partition (claim, read to the claim, fold) against a broker that misbehaves.

These tests pause their own embedded broker (SIGSTOP), so they never use the
session's broker or ``CUTLINE_BOOTSTRAP``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from itertools import islice
from random import Random

import pytest
from confluent_kafka import Producer

from coordinator.decider import fold_jobs
from coordinator.service.ownership import ClaimedPartition, claim_partition
from coordinator.simulate import simulate
from coordinator.state import state_json
from events.broker import EmbeddedBroker, create_topics
from events.codec import encode
from events.kafka import job_key, producer_config
from events.records import JournalEvent
from events.topics import Topics

TOPICS = Topics("r.")
SNAPSHOTS = "r.coordinator-snapshots"


@pytest.fixture(name="own_broker")
def _own_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap, [TOPICS.checkpoints, SNAPSHOTS], partitions=1)
        yield broker


def produce_journal(bootstrap: str, events: list[JournalEvent]) -> None:
    """The events as a coordinator of epoch 0 (no claim, no header) would have written them."""
    producer = Producer(producer_config(bootstrap, {"linger.ms": 20, "batch.num.messages": 10_000}))
    for event in events:
        while True:
            try:
                producer.produce(
                    TOPICS.checkpoints, key=job_key(event.job_id), value=encode(event), partition=0
                )
                break
            except BufferError:
                producer.poll(0.1)
    assert 0 == producer.flush(120)


class TestRecoveryWithAPausedBroker:
    def test_the_fold_of_a_60000_event_journal_survives_a_2_s_broker_pause(
        self, own_broker: EmbeddedBroker
    ) -> None:
        """Given a 60,000-event journal, when the broker stops for 2 s while a worker folds it, then
        the worker waits and its state equals the full fold (silence is never the end)."""
        events = list(islice(simulate(Random(7), jobs=4), 60_000))
        produce_journal(own_broker.bootstrap, events)
        result: list[ClaimedPartition | BaseException] = []

        def claim() -> None:
            try:
                result.append(claim_partition(own_broker.bootstrap, TOPICS, SNAPSHOTS, 1, 0, "worker-a"))
            except BaseException as exc:
                result.append(exc)

        worker = threading.Thread(target=claim)
        worker.start()
        time.sleep(0.5)
        folding_when_paused = worker.is_alive()
        assert own_broker.pid is not None
        os.killpg(own_broker.pid, signal.SIGSTOP)
        try:
            time.sleep(2.0)
        finally:
            os.killpg(own_broker.pid, signal.SIGCONT)
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
    def test_each_claim_is_higher_than_every_earlier_one(self, own_broker: EmbeddedBroker) -> None:
        """Claiming a partition twice gives epochs 1 and 2; the second worker's fold holds the first's
        state and the journal's last record is its claim."""
        events = list(islice(simulate(Random(3), jobs=2), 500))
        produce_journal(own_broker.bootstrap, events)

        first = claim_partition(own_broker.bootstrap, TOPICS, SNAPSHOTS, 1, 0, "worker-a")
        second = claim_partition(own_broker.bootstrap, TOPICS, SNAPSHOTS, 1, 0, "worker-b")

        assert (1, 2) == (first.epoch, second.epoch)
        assert second.claim_offset > first.claim_offset
        assert {j: state_json(s) for j, s in first.coordinator.states.items()} == {
            j: state_json(s) for j, s in second.coordinator.states.items()
        }
