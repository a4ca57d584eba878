"""Exactly-once output of a Spark job across a coordinator failover in the middle of a checkpoint, on
Apache Kafka (docs/exactly-once.md, "The Spark sink"): two ``cutline coordinator`` workers in one
group; the word count of tests/spark/kafka_sink_app.py writes through an ExactlyOnceKafkaSink on a
real local Spark. The worker that decides the job's partition is SIGKILLed when a task's ack of a
checkpoint reaches it, before it decides (``ack``), or once it decided the completion, before the
completion is written (``completion``). The other worker takes the partition over and sends that
checkpoint's barrier again: the job's source drops a barrier sent again, so the sink stages nothing
over the first cut's output, and the new owner completes the checkpoint from the acks already sent
(or expires it: its output then goes with the next completion). The driver runs on throughout.

A ``read_committed`` reader must see every word counted once (the ``added`` of its rows sum to what
was produced, no input offset's row twice), and a ``read_uncommitted`` reader nothing more: no
process died with a transaction open.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from dying_worker import DyingWorker, owner_of
from support import create_protocol_topics, eventually, on_apache_kafka
from test_kafka_sink import (
    Drivers,
    Feeder,
    Recovery,
    _drivers,  # noqa: F401 (fixture)
    every_word_counted,
    read_output,
)
from wordfeed import Input

from coordinator.service.supervisor import stop_all
from events.task.participant import JobDriver
from events.wire.records import CheckpointAborted, CheckpointCompleted
from events.wire.topics import Topics

pytestmark = [
    pytest.mark.skipif(
        not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
    ),
    pytest.mark.timeout(600),  # a Spark driver's start and a session timeout on busy shared cores
]

SESSION_TIMEOUT = float(os.environ["CUTLINE_SESSION_TIMEOUT"])


@pytest.fixture
def workers(bootstrap: str, topic_prefix: str) -> Iterator[list[DyingWorker]]:
    """Two coordinator workers of the test's own topic prefix, either of which dies when asked."""
    create_protocol_topics(bootstrap, topic_prefix)
    started = [DyingWorker(bootstrap, topic_prefix) for _ in range(2)]
    try:
        for worker in started:
            worker.launch()
        for worker in started:
            worker.wait_ready(timeout=90)
        yield started
    finally:
        stop_all(started)


@pytest.mark.parametrize(
    "point", [pytest.param("ack", id="ack-arrived"), pytest.param("completion", id="completion-decided")]
)
def test_exactly_once_when_a_spark_job_s_coordinator_fails_over_mid_checkpoint(
    bootstrap: str,
    topic_prefix: str,
    workers: list[DyingWorker],
    given: Input,
    drivers: Drivers,
    point: str,
) -> None:
    # given: the word count writing through the sink, a checkpoint of it committed, words arriving
    given.words.produce(40)
    driver = drivers.start()
    assert Recovery.said_by(driver).commit == []
    with Feeder(given):
        driver.said("step committed ")
        # when: the worker deciding the job's partition is SIGKILLed at `point` of its next checkpoint
        victim = owner_of(workers, given.job_id, timeout=SESSION_TIMEOUT + 60)
        victim.ask(point, given.job_id, -1)
        died = eventually(victim.death, timeout=120, what=f"the owner to die at {point}")
        assert died is not None
        # then: the other worker takes the partition over, and decides that checkpoint
        (survivor,) = [w for w in workers if w is not victim]
        assert owner_of(workers, given.job_id, timeout=SESSION_TIMEOUT + 60) is survivor
        journal = JobDriver(bootstrap, given.job_id, Topics(topic_prefix))
        kinds = (CheckpointCompleted, CheckpointAborted)
        decided = eventually(
            lambda: [e for e in journal.journal(kinds) if isinstance(e, kinds) and e.checkpoint_id == died],
            timeout=90,
            what=f"checkpoint {died} decided by the survivor",
        )
        assert len(decided) == 1, decided
        # and the driver's sink commits a later checkpoint, the job running on
        eventually(
            lambda: max(driver.committed(), default=0) > died,
            timeout=120,
            what=f"a checkpoint after {died} committed",
        )
    # and a read_committed reader sees every word counted once
    seen = every_word_counted(bootstrap, drivers.output, given.words.produced)
    assert seen.twice == set(), f"rows committed twice: {sorted(seen.twice)[:5]}"
    assert seen.counted == given.words.produced
    # and the barrier sent again staged nothing over the first cut's output: one staged file for it
    assert driver.lines.count(f"step staged {died}") == 1, [line for line in driver.lines if "staged" in line]
    # and nothing was aborted: a read_uncommitted reader sees the same rows
    assert read_output(bootstrap, drivers.output, "read_uncommitted").rows == seen.rows
    assert driver.process.poll() is None, "the driver ran on throughout"
    journal.close()
