"""Exactly-once output of a Spark job to Kafka across executor SIGKILLs (docs/exactly-once.md, "The
Spark sink"): the word count of tests/spark/kafka_sink_app.py writes through an ExactlyOnceKafkaSink
on ``local-cluster[2,1,1024]`` (executors in JVMs of their own, with their Python workers), Apache
Kafka and a coordinator process.

The sink stages and commits in the driver (the batches' rows are collected there); executors run the
micro-batches' tasks, which read the input and ack the barriers. An executor JVM is SIGKILLed while
the driver holds a barrier batch after staging its output, before the batch's tasks run and ack,
and another while the driver's commit has its transaction open; Spark replaces each executor and
runs the tasks again. A read_committed reader must see every word counted once (no input offset's
row twice), and a read_uncommitted reader nothing more: no process of the sink died.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest
from clusters import Process, alive, executors
from support import eventually, on_apache_kafka
from test_kafka_sink import (
    Driver,
    Drivers,
    Feeder,
    _drivers,  # noqa: F401 (fixture)
    every_word_counted,
    read_output,
)
from wordfeed import Input

from coordinator.service.supervisor import CoordinatorProcess

pytestmark = [
    pytest.mark.skipif(
        not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
    ),
    pytest.mark.slow,
    pytest.mark.timeout(1200),
]

MASTER = "local-cluster[2,1,1024]"
STARTS_S = 600.0
"""How long a driver and its executors may take to start and run a first checkpoint on busy cores."""


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module's tests."""
    return f"t{uuid.uuid4().hex[:8]}."


def driver_executors(driver: Driver) -> list[Process]:
    """The driver's executor JVMs (local-cluster starts them in the driver's process group)."""
    return executors(lambda p: p.pgid == driver.process.pid)


def kill_an_executor(driver: Driver) -> int:
    """SIGKILL the older of the driver's two executors once both run, and wait until it is gone.

    The older: it has run the job's tasks. The newer may be the replacement of an executor killed
    before, whose JVM runs but has not yet registered with the driver; Spark would replace it without
    the driver ever losing an executor. By start time, not pid: pids wrap around."""
    running = eventually(
        lambda: driver_executors(driver), lambda found: len(found) == 2, timeout=180, what="2 executors"
    )
    victim = min(running, key=lambda process: process.started).pid
    os.kill(victim, signal.SIGKILL)
    eventually(lambda: not alive(victim), timeout=30, what=f"executor {victim} gone")
    return victim


def test_exactly_once_when_an_executor_is_killed_mid_checkpoint_and_mid_commit(
    bootstrap: str, coordinator: CoordinatorProcess, given: Input, drivers: Drivers, tmp_path: Path
) -> None:
    staged, opened = tmp_path / "release-staged", tmp_path / "release-open"
    drivers.settings["master"] = MASTER
    drivers.settings["holds"] = [["open", 1, str(opened)], ["staged", 2, str(staged)]]  # type: ignore[assignment]
    given.words.produce(40)
    driver = drivers.start()
    killed = []
    with Feeder(given):
        # given: the driver's commit of a completed checkpoint holds its transaction open
        held_open = driver.said("held at open ", timeout=STARTS_S)
        # when: an executor is SIGKILLed meanwhile (the micro-batches go on without it)
        killed.append(kill_an_executor(driver))
        opened.touch()
        # and: another, while the driver holds a later barrier batch, its output staged, before the
        # batch's tasks run and ack
        held_staged = driver.said("held at staged ", timeout=STARTS_S)
        killed.append(kill_an_executor(driver))
        staged.touch()
        # then: Spark runs the batch on the executors left and new, its tasks ack, and the
        # checkpoint's output is committed
        checkpoint_id = int(held_staged.rsplit(" ", 1)[1])
        driver.said(f"step committed {checkpoint_id}", timeout=STARTS_S)
    assert f"step committed {held_open.rsplit(' ', 1)[1]}" in driver.lines
    # and a read_committed reader sees every word counted exactly once
    seen = every_word_counted(bootstrap, drivers.output, given.words.produced)
    assert seen.twice == set(), f"rows committed twice: {sorted(seen.twice)[:5]}"
    assert seen.counted == given.words.produced
    # and a read_uncommitted reader sees nothing more: no transaction was aborted
    uncommitted = read_output(bootstrap, drivers.output, "read_uncommitted")
    assert Counter(map(str, uncommitted.rows)) == Counter(map(str, seen.rows))
    assert len(set(killed)) == 2 and driver.process.poll() is None
    # and Spark lost both executors and ran on without the driver failing (the driver may learn of
    # the second loss from the RPC disconnect before the worker reports the SIGKILL's exit code, and
    # may log it after the checkpoint committed)
    eventually(
        lambda: (tmp_path / "driver-0.log").read_text().count("ERROR TaskSchedulerImpl: Lost executor"),
        lambda lost: lost == 2,
        timeout=60,
        what="the driver logging both executors lost",
    )
