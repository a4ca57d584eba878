"""Exactly-once output to Kafka from a keyed job on Spark's own ``kafka`` connector (docs/exactly-once.md,
"The Spark sink"), through a rescale 4 → 2 → 8 with transactions pending: the keyed word count of
tests/spark/kafka_sink_app.py (``keyed``) reads with the connector and writes ``(word, count, added)``
rows through an ExactlyOnceKafkaSink, on a real local Spark with the connector's jars, Apache Kafka
and a coordinator process.

The job's first driver (4 shuffle partitions) is SIGKILLed after a checkpoint completed and before
its commit; the second (2) commits that output again, and is SIGKILLed during the commit of its own
next completion (records and marker at the broker, the transaction open); the third (8) aborts that
transaction, commits the output again, and is stopped with a savepoint, whose cut on the connector is
its batch's end, and closes its sink. A ``read_committed`` reader must then see every word of the
input before the savepoint's cut counted once (each word's ``added`` summing to it, no ``(word,
count)`` twice), which fails if the stop batch's own rows were not committed with the savepoint or a
pending commit was lost or done twice; a ``read_uncommitted`` reader sees the rows of the transaction
the second SIGKILL left open twice (so the check can fail). Each attempt restores the latest checkpoint
of the one before, its connector starting at exactly that checkpoint's offsets (the connector's own
record of its initial offsets, ``sources/0/0``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from connector_jobs import spark_starting_offsets
from support import eventually, on_apache_kafka
from test_kafka_sink import (
    Drivers,
    Feeder,
    Recovery,
    _drivers,  # noqa: F401 (fixture)
    _killed_at,
    words_before,
)
from wordfeed import Input

from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.clients import consumer_config, read_partition_to_end
from events.task.participant import JobDriver
from events.wire.records import CheckpointKind, JobStopRequested
from events.wire.topics import Topics
from spark_tasks.keyed import keyed_task_id

pytestmark = [
    pytest.mark.skipif(
        not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
    ),
    pytest.mark.timeout(1200),  # three Spark drivers with the connector start in turn on busy shared cores
]

SHUFFLES = (4, 2, 8)
"""Each attempt's shuffle partitions (its keyed tasks ``keyed-0`` to ``keyed-<n-1>``): the rescale."""


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module's tests."""
    return f"t{uuid.uuid4().hex[:8]}."


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


def killed_during_its_commit(drivers: Drivers, given: Input, after: int) -> int:
    """A driver that restores and recommits checkpoint ``after`` runs on with words arriving until its
    commit of a later completion has its transaction open, and is SIGKILLed there: that checkpoint."""
    second = drivers.start(crash=("open", after + 1))
    assert Recovery.said_by(second).commit[:1] == [after]
    with Feeder(given):
        stopped = second.said("stopped at open ")
    second.kill()
    return int(stopped.rsplit(" ", 1)[1])


def keyed_tasks_by_attempt(journal: JobDriver) -> dict[int, set[frozenset[str]]]:
    """The keyed tasks each attempt's completed checkpoints cover."""
    tasks: dict[int, set[frozenset[str]]] = {}
    for completed in journal.completions():
        assert not completed.by_reference, "a small job's completion fits in one record"
        keyed = frozenset(task for task in completed.handles if task.startswith(keyed_task_id(0)[:-1]))
        tasks.setdefault(completed.attempt, set()).add(keyed)
    return tasks


def test_exactly_once_on_the_connector_through_a_rescale_4_2_8_with_pending_transactions_and_a_stop(
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    given: Input,
    drivers: Drivers,
    tmp_path: Path,
) -> None:
    # given: the keyed job on the connector in 4 shuffle partitions, SIGKILLed once checkpoint N
    # completed and before its transaction
    drivers.settings["keyed"] = str(SHUFFLES[0])
    first_pending = _killed_at(drivers, given, "committing")
    # and restored in 2, which commits N again and is SIGKILLed with the commit of its next completion
    # M open (records and marker at the broker)
    drivers.settings["keyed"] = str(SHUFFLES[1])
    second_pending = killed_during_its_commit(drivers, given, first_pending)
    # when: restored in 8, which recovers, runs on with words arriving, and is stopped with a
    # savepoint (`cutline stop --drain`) while they still arrive
    drivers.settings["keyed"] = str(SHUFFLES[2])
    third = drivers.start()
    recovery = Recovery.said_by(third)
    with Feeder(given):
        third.said("step acked ")  # a barrier batch of attempt 3 ran: the job RUNS (a stop before is refused)
        target = (tmp_path / "savepoint").as_uri()
        journal = JobDriver(bootstrap, given.job_id, Topics(topic_prefix))
        stop = JobStopRequested(given.job_id, int(time.time() * 1000), uuid.uuid4().hex, target, drain=True)
        journal.request(stop)
        eventually(
            lambda: "closed" in third.lines or third.process.poll() is not None,
            timeout=300,
            interval=0.5,
            what="the job FINISHED and its sink closed",
        )
    assert "closed" in third.lines, f"the driver ended first: {third.lines[-10:]}"
    assert 0 == third.process.wait(60)
    # then: each attempt checkpointed in its own number of keyed tasks
    assert keyed_tasks_by_attempt(journal) == {
        attempt: {frozenset(keyed_task_id(i) for i in range(shuffle))}
        for attempt, shuffle in enumerate(SHUFFLES, start=1)
    }
    # and each restored the attempt before's latest checkpoint, the connector starting at exactly its
    # offsets (its own record of its initial offsets)
    for attempt in range(2, len(SHUFFLES) + 1):
        latest = [c for c in journal.completions() if c.attempt == attempt - 1][-1]
        spark = tmp_path / "work" / f"attempt-{attempt}" / "spark"
        assert dict(latest.offsets) == spark_starting_offsets(spark), f"attempt {attempt}"
    # and the third's recovery committed M's staged output again
    assert recovery.commit[:1] == [second_pending]
    # and the savepoint is the last output committed: a read_committed reader sees every word of the
    # input before its cut (the stop batch's end) counted exactly once
    (savepoint,) = [c for c in journal.completions() if c.attempt == 3 and c.kind is CheckpointKind.SAVEPOINT]
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
    # and a read_uncommitted reader sees the rows of M's aborted transaction twice
    assert twice(keyed_rows(bootstrap, drivers.output, "read_uncommitted"))
