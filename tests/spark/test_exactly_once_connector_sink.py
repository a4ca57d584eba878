"""Exactly-once output to Kafka from a keyed job on Spark's own ``kafka`` connector (docs/exactly-once.md,
"The Spark sink"): the keyed word count of tests/spark/kafka_sink_app.py (``keyed``) reads with the
connector and writes ``(word, count, added)`` rows through an ExactlyOnceKafkaSink, on a real local
Spark with the connector's jars, Apache Kafka and a coordinator process.

A driver SIGKILLed after a checkpoint completed, before its commit or during it, has that output
committed by the next driver; that one is then stopped with a savepoint, whose cut on the connector
is its batch's end, and closes its sink. A ``read_committed`` reader must then see every word of the
input before the savepoint's cut counted once (each word's ``added`` summing to it, no ``(word,
count)`` twice), which fails if the stop batch's own rows were not committed with the savepoint; a
``read_uncommitted`` reader sees the rows of the transaction the SIGKILL left open twice.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from support import eventually, on_apache_kafka
from test_kafka_sink import Drivers, Feeder, Recovery, _killed_at, words_before
from wordfeed import Input

from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.clients import consumer_config, read_partition_to_end
from events.task.participant import JobDriver
from events.wire.records import CheckpointKind, JobStopRequested
from events.wire.topics import Topics

pytestmark = [
    pytest.mark.skipif(
        not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
    ),
    pytest.mark.timeout(900),  # two Spark drivers with the connector start in turn on busy shared cores
]

SHUFFLE = 2
"""The keyed word count's shuffle partitions (its tasks ``keyed-0`` and ``keyed-1``)."""


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module's tests."""
    return f"t{uuid.uuid4().hex[:8]}."


@pytest.fixture
def drivers(bootstrap: str, topic_prefix: str, given: Input, tmp_path: Path) -> Iterator[Drivers]:
    """Child drivers of the keyed word count on the connector, writing through the sink."""
    started = Drivers(bootstrap, topic_prefix, given, tmp_path)
    started.settings["keyed"] = str(SHUFFLE)
    try:
        yield started
    finally:
        started.close()


def keyed_rows(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[tuple[str, int, int]]:
    """The ``(word, count, added)`` rows a reader with ``isolation`` sees in the output topic."""
    consumer = Consumer(consumer_config(bootstrap, extra={"isolation.level": isolation}))
    try:
        found = [json.loads(m.value() or b"") for m in read_partition_to_end(consumer, topic, 0)]
    finally:
        consumer.close()
    return [(row["word"], row["count"], row["added"]) for row in found]


def twice(rows: list[tuple[str, int, int]]) -> set[tuple[str, int]]:
    """The ``(word, count)`` pairs seen more than once: a keyed count is output once per batch."""
    return {key for key, n in Counter((word, count) for word, count, _ in rows).items() if n > 1}


@pytest.mark.parametrize(
    ("crash", "drain"),
    [
        pytest.param("committing", False, id="before-the-commit-then-stop"),
        pytest.param(
            "open", True, id="during-the-commit-then-stop-drain"
        ),  # records and marker at the broker
    ],
)
def test_exactly_once_on_the_connector_through_a_driver_kill_after_the_completion_and_a_stop(
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    given: Input,
    drivers: Drivers,
    tmp_path: Path,
    crash: str,
    drain: bool,
) -> None:
    # given: the keyed job on the connector SIGKILLed once checkpoint N completed, before its
    # transaction or with it open
    checkpoint_id = _killed_at(drivers, given, crash)
    # when: the next driver restores N and recovers, runs on with words arriving, and is stopped
    # with a savepoint (`cutline stop`, with --drain or without) while they still arrive
    second = drivers.start()
    recovery = Recovery.said_by(second)
    with Feeder(given):
        second.said(
            "step acked "
        )  # a barrier batch of attempt 2 ran: the job RUNS (a stop before is refused)
        target = (tmp_path / "savepoint").as_uri()
        journal = JobDriver(bootstrap, given.job_id, Topics(topic_prefix))
        journal.request(
            JobStopRequested(given.job_id, int(time.time() * 1000), uuid.uuid4().hex, target, drain)
        )
        eventually(
            lambda: "closed" in second.lines or second.process.poll() is not None,
            timeout=300,
            interval=0.5,
            what="the job FINISHED and its sink closed",
        )
    assert "closed" in second.lines, f"the driver ended first: {second.lines[-10:]}"
    assert 0 == second.process.wait(60)
    # then: its recovery committed N's staged output again
    assert recovery.commit[:1] == [checkpoint_id]
    # and the savepoint is the last output committed: a read_committed reader sees every word of the
    # input before its cut (the stop batch's end) counted exactly once
    (savepoint,) = [c for c in journal.completions() if c.attempt == 2 and c.kind is CheckpointKind.SAVEPOINT]
    cut = {int(tp.rsplit(":", 1)[1]): offset for tp, offset in savepoint.offsets.items()}
    seen = keyed_rows(bootstrap, drivers.output)
    assert twice(seen) == set(), f"counts committed twice: {sorted(twice(seen))[:5]}"
    counted: Counter[str] = Counter()
    for word, _, added in seen:
        counted[word] += added
    before_the_cut: Counter[str] = Counter()
    for (_, word), n in words_before(bootstrap, given.topic, cut).items():
        before_the_cut[word] += n
    assert counted == before_the_cut
    # and a read_uncommitted reader sees the aborted transaction's rows twice (none without one)
    assert bool(twice(keyed_rows(bootstrap, drivers.output, "read_uncommitted"))) == (crash == "open")
