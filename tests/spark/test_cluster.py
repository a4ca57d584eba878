"""The keyed word count on real Spark clusters (docs/spark.md, "Deploying on a cluster"): executors in
JVMs of their own, checkpoints and keyed state on S3 (moto's server), Spark's own checkpoint on the
disk the test's processes share.

Each test runs the driver as a child process (``python -m spark_tasks.wordcount --master ...``) on
2 executor slots, and then:

- **an executor SIGKILLed in the middle of a checkpoint**: a gate in front of S3 holds, in one
  checkpoint, every task's manifest but task A's (none of them can ack: the checkpoint stays pending)
  and A's state save after its ack; A's executor JVM is killed there. Spark re-runs A; the re-run
  finds A's snapshot whole, acks it again, and the coordinator counts one ack per task;
- **the driver SIGKILLed** (its JVM, and with local-cluster the cluster it hosts);
- **restored on 4 executor slots with 4 shuffle partitions** (rescaled from 2): the final counts
  are exact against what the test produced.

(a) ``local-cluster[2,1,1024]`` (the master and workers in the driver's JVM, executors in their own)
and then ``local-cluster[4,1,1024]``; (b) a standalone master and 2 workers started by the test
from the installed PySpark (``bin/spark-class``), 2 more for the restore.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from clusters import AWS, BUCKET, SnapshotGate, StandaloneCluster, alive, executor_of, executors, gated_s3
from support import eventually
from wordfeed import Input, every, wait

from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.feed import read_job_partition
from events.task.participant import JobDriver
from events.wire.records import CheckpointAcknowledged, CheckpointCompleted, TaskAcknowledged
from events.wire.topics import Topics
from spark_tasks.keyed import keyed_task_id
from spark_tasks.wordcount import SparkDriver, final_counts, read_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module's tests."""
    return f"t{uuid.uuid4().hex[:8]}."


@pytest.fixture(scope="module")
def gate() -> Iterator[SnapshotGate]:
    """moto's S3 server behind a snapshot gate, for this module's tests (each arms it once); the
    drivers the tests start run on loopback."""
    pytest.importorskip("s3fs")
    with gated_s3() as server_gate, pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        yield server_gate


class Feeder:
    """Produces 3 lines of words every 0.1 s in a thread until stopped, so that micro-batches keep
    having records of both shuffle partitions' keys (the gate needs a task that saves state)."""

    def __init__(self, given: Input) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=every, args=(0.1, self._stop, lambda: given.words.produce(3)))

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _driver(
    given: Input, bootstrap: str, prefix: str, tmp_path: Path, master: str, keyed: int
) -> SparkDriver:
    job_id = given.job_id
    args = [
        "--bootstrap", bootstrap, "--job", job_id, "--topic", given.topic, "--topic-prefix", prefix,
        "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
        "--location", f"s3://{BUCKET}/{job_id}/checkpoints", "--state-location", f"s3://{BUCKET}/{job_id}/state",
        # a batch a second (not the word count's 5): every batch runs a shuffle on the executors and
        # saves state to S3, and one a second is enough to checkpoint every second
        "--keyed", str(keyed), "--interval-ms", "1000", "--trigger-ms", "1000",
        "--source", "cutline-kafka",  # the cluster and S3 with cutline's own source, whatever jars resolve
        "--timeout-ms", "120000", "--tolerable-failures", "10",
        "--master", master, "--conf", "spark.executor.cores=1", "--conf", "spark.executor.memory=1024m",
        *(arg for name in AWS for arg in ("--executor-env", name)),
    ]  # fmt: skip
    logs = tmp_path / f"driver-{keyed}"
    logs.mkdir()
    return SparkDriver(args, logs)


def _journal(bootstrap: str, prefix: str, job_id: str, *kinds: type) -> list[Any]:
    return JobDriver(bootstrap, job_id, Topics(prefix)).journal(kinds)


def _completed(bootstrap: str, prefix: str, job_id: str, checkpoint_id: int) -> bool:
    return any(
        c.checkpoint_id == checkpoint_id for c in _journal(bootstrap, prefix, job_id, CheckpointCompleted)
    )


def _acks_sent(bootstrap: str, prefix: str, job_id: str, checkpoint_id: int, task: str) -> list[Any]:
    """What the tasks sent to the acks topic for ``task`` in ``checkpoint_id`` (every copy)."""
    records = read_job_partition(bootstrap, job_id, Topics(prefix).acks, kinds={"CheckpointAcknowledged"})
    return [
        r.record
        for r in records
        if isinstance(r.record, CheckpointAcknowledged)
        and (r.record.checkpoint_id, r.record.task_id) == (checkpoint_id, task)
    ]


STARTS_S = 600.0
"""How long a driver and its executors may take to start and run a first checkpoint: a minute or two
on an idle 2-core machine, several when other Spark jobs share the cores."""


def _survives_an_executor_kill_a_driver_kill_and_a_rescale(
    given: Input,
    gate: SnapshotGate,
    bootstrap: str,
    prefix: str,
    tmp_path: Path,
    two_slots: str,
    four_slots: Callable[[], str],
    executor_count: Callable[[SparkDriver], int],
) -> None:
    """The scenario of the module docstring on the master ``two_slots``, then on ``four_slots()``."""
    words, out = given.words, tmp_path / "out"
    first = _driver(given, bootstrap, prefix, tmp_path, two_slots, keyed=2)
    second: SparkDriver | None = None
    try:
        words.produce(40)
        first.start()
        wait(lambda: first.seen("running"), "the job running on 2 executor slots", STARTS_S)
        with Feeder(given):
            wait(lambda: first.seen("completed"), "a first completed checkpoint", STARTS_S)
            checkpoint_id = _kill_an_executor_mid_checkpoint(given, gate, bootstrap, prefix)

            # the driver SIGKILLed (with local-cluster, the master and workers in its JVM too)
            wait(lambda: first.seen("completed")[-1]["checkpoint_id"] > checkpoint_id, "a checkpoint", 120)
            first.kill()
            wait(lambda: first.returncode is not None, "the driver gone", 30)

            # restored with 4 executor slots and 4 shuffle partitions
            second = _driver(given, bootstrap, prefix, tmp_path, four_slots(), keyed=4)
            second.start()
            wait(lambda: second.seen("running"), "the restored job running on 4 slots", STARTS_S)
            restored = second.seen("restored")[0]
            assert restored["checkpoint_id"] > checkpoint_id and restored["attempt"] == 2
            assert second.seen("running")[0]["tasks"] == [keyed_task_id(i) for i in range(4)]
            wait(lambda: executor_count(second) == 4, "4 executors", 120)
            wait(lambda: second.seen("completed"), "a checkpoint of the rescaled job", 120)
        wait(lambda: final_counts(out) == dict(words.produced), "every word counted", 180)
        assert read_counts(out) == words.produced
        assert 0 == second.stop()
    finally:
        gate.release()
        for driver in (first, second):
            if driver is not None:
                driver.stop(grace=5)
    # one ack counted per task and checkpoint, in every checkpoint of both attempts
    counted = [
        (a.checkpoint_id, a.task_id) for a in _journal(bootstrap, prefix, given.job_id, TaskAcknowledged)
    ]
    assert len(counted) == len(set(counted))


def _kill_an_executor_mid_checkpoint(given: Input, gate: SnapshotGate, bootstrap: str, prefix: str) -> int:
    """SIGKILL the executor of a task that acked a checkpoint still pending (the gate holds the other
    tasks' manifests); check that Spark's re-run acked the same snapshot again, counted once. The
    checkpoint's id."""
    job_id = given.job_id
    gate.arm(after_checkpoint=0)
    wait(lambda: gate.stopped, "a task held by the gate after its ack (its batch had records)", 240)
    stopped = gate.stopped
    assert stopped is not None
    checkpoint_id, task = stopped.checkpoint_id, keyed_task_id(stopped.partition)

    def counted() -> list[str]:
        acks = _journal(bootstrap, prefix, job_id, TaskAcknowledged)
        return sorted(a.task_id for a in acks if a.checkpoint_id == checkpoint_id)

    wait(lambda: counted() == [task], f"{task}'s ack in the journal", 30)
    assert not _completed(bootstrap, prefix, job_id, checkpoint_id), "the checkpoint is still pending"
    executor = executor_of(stopped.client)
    os.kill(executor.pid, signal.SIGKILL)
    wait(lambda: not alive(executor.pid) and not alive(stopped.client), "the executor gone", 30)
    gate.release()
    wait(lambda: _completed(bootstrap, prefix, job_id, checkpoint_id), f"checkpoint {checkpoint_id}", 180)
    # Spark re-ran the killed task: it acked again, naming the snapshot the killed task wrote (it
    # found it whole and did not write it again), and the coordinator counted one ack per task
    sent = eventually(
        lambda: _acks_sent(bootstrap, prefix, job_id, checkpoint_id, task),
        lambda acks: len(acks) >= 2,
        timeout=180,
        what=f"the re-run {task}'s ack of checkpoint {checkpoint_id}",
    )
    assert len({a.state for a in sent}) == 1, sent
    assert [keyed_task_id(0), keyed_task_id(1)] == counted()
    assert gate.manifests[(checkpoint_id, stopped.partition)] == 1
    completion = next(
        c
        for c in JobDriver(bootstrap, job_id, Topics(prefix)).completions()
        if c.checkpoint_id == checkpoint_id
    )
    assert completion.handles[task] == sent[0].state
    return checkpoint_id


def test_local_cluster_survives_an_executor_kill_a_driver_kill_and_a_rescale(
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    gate: SnapshotGate,
    given: Input,
    tmp_path: Path,
) -> None:
    """On ``local-cluster[2,1,1024]`` with checkpoints and keyed state on S3: an executor SIGKILLed
    after its task acked, in the middle of a checkpoint, is replaced; the re-run task acks the same
    snapshot again and the coordinator counts one ack per task. After a SIGKILL of the driver, the job
    restores on ``local-cluster[4,1,1024]`` with 4 shuffle partitions, and counts exactly."""

    def executors_of(driver: SparkDriver) -> int:
        return len(executors(lambda p: p.pgid == driver.pid))

    _survives_an_executor_kill_a_driver_kill_and_a_rescale(
        given, gate, bootstrap, topic_prefix, tmp_path,
        "local-cluster[2,1,1024]", lambda: "local-cluster[4,1,1024]", executors_of,
    )  # fmt: skip


def test_standalone_cluster_survives_an_executor_kill_a_driver_kill_and_a_rescale(
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    gate: SnapshotGate,
    given: Input,
    tmp_path: Path,
) -> None:
    """On a standalone master with 2 workers of 1 core (started from the installed PySpark, without
    the S3 variables: executors get them from the application) the same: the executor kill, the
    driver kill, and the restore once 2 more workers joined, on 4 executors, exact."""
    cluster = StandaloneCluster(tmp_path / "cluster")
    try:
        cluster.start(workers=2)  # in the try: a master that started is stopped even if a worker fails

        def four_workers() -> str:
            cluster.add_workers(2)
            return cluster.url

        def executors_of(driver: SparkDriver) -> int:
            apps = cluster.state().get("activeapps") or []
            cores = sum(app.get("cores", 0) for app in apps)
            return len(cluster.executors()) if cores == 4 else -1

        _survives_an_executor_kill_a_driver_kill_and_a_rescale(
            given, gate, bootstrap, topic_prefix, tmp_path, cluster.url, four_workers, executors_of
        )
    finally:
        cluster.close()
