"""Exactly-once output of a Spark job across an Apache Kafka broker restart (docs/exactly-once.md, "The
Spark sink"): on a one-node Apache Kafka of the module's own, with a coordinator process on it, the
word count of tests/spark/kafka_sink_app.py writes through an ExactlyOnceKafkaSink on a real local
Spark. The driver is held at one step of a checkpoint (its output staged and its batch's tasks not
run, so not acked; its commit's transaction open, records and marker at the broker), the broker is
SIGKILLed and started again on its ports and log dir, and the driver goes on: its source, its tasks'
acks, the coordinator and the sink's committer all carry on on the restarted broker.

A ``read_committed`` reader must see every word counted once, and a ``read_uncommitted`` reader the
same rows: the restart aborts nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import TEST_KAFKA_CONFIG, TEST_KAFKA_HEAP, eventually, on_apache_kafka
from test_kafka_sink import (
    Drivers,
    Feeder,
    Recovery,
    _drivers,  # noqa: F401 (fixture)
    every_word_counted,
    read_output,
)
from wordfeed import Input

from coordinator.service.supervisor import CoordinatorProcess
from events.dev.apache_kafka import ApacheKafka

pytestmark = [
    pytest.mark.skipif(
        not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
    ),
    pytest.mark.slow,
    pytest.mark.timeout(600),  # a Spark driver's start and a broker's restart on busy shared cores
]


@pytest.fixture(scope="module")
def kafka() -> Iterator[ApacheKafka]:
    """A one-node Apache Kafka of this module's own: its tests restart it."""
    with ApacheKafka(heap=TEST_KAFKA_HEAP, config=TEST_KAFKA_CONFIG) as started:
        yield started


@pytest.fixture(scope="module")
def bootstrap(kafka: ApacheKafka) -> str:
    """The module's own broker, for the shared fixtures too (``coordinator``, ``given``)."""
    return kafka.bootstrap


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module's tests."""
    return f"t{uuid.uuid4().hex[:8]}."


@pytest.mark.parametrize(
    "step",
    [
        pytest.param("staged", id="after-the-snapshot-before-the-ack"),
        pytest.param("open", id="during-the-commit"),
    ],
)
def test_exactly_once_spark_output_survives_a_broker_restart(
    kafka: ApacheKafka,
    coordinator: CoordinatorProcess,
    given: Input,
    drivers: Drivers,
    step: str,
    tmp_path: Path,
) -> None:
    release = tmp_path / "release"
    # given: the word count, a checkpoint of it committed, then held at `step` of a later checkpoint
    given.words.produce(40)
    drivers.settings["holds"] = [[step, 2, str(release)]]
    driver = drivers.start()
    assert Recovery.said_by(driver).commit == []
    with Feeder(given):
        held = driver.said(f"held at {step} ")
    checkpoint_id = int(held.rsplit(" ", 1)[1])
    # when: the broker is SIGKILLed and started again meanwhile, and the driver goes on
    kafka.kill(1)
    kafka.restart(1)
    release.touch()
    # then: it commits that checkpoint and a later one on the restarted broker, words arriving again
    with Feeder(given):
        eventually(
            lambda: max(driver.committed(), default=0) > checkpoint_id,
            timeout=180,
            what=f"a checkpoint after {checkpoint_id} committed after the restart",
        )
    assert checkpoint_id in driver.committed()
    # and a read_committed reader sees every word counted once
    seen = every_word_counted(kafka.bootstrap, drivers.output, given.words.produced)
    assert seen.twice == set(), f"rows committed twice: {sorted(seen.twice)[:5]}"
    assert seen.counted == given.words.produced
    # and the restart aborted nothing: a read_uncommitted reader sees the same rows
    assert read_output(kafka.bootstrap, drivers.output, "read_uncommitted").rows == seen.rows
    assert driver.process.poll() is None, "the driver ran on throughout"
