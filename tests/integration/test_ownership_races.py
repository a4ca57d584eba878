"""Ownership under the races that used to fence the rightful owner, with real worker processes.

Two scenarios an adversarial operator runs: a second worker joins while the first still has
dozens of claims queued (topics of 96 partitions), and a worker is paused (SIGSTOP) in the
middle of a claim, past the session timeout, then resumed. Throughout, a monitor compares what
each worker says it decides (``/ready``) with the effective claims of the journal (the fencing
rule over the log): no worker may go on deciding a partition whose effective claim is another's
for more than 1 s, and every job completes checkpoints again within the session timeout + 5 s.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from uuid import uuid4

import pytest
from confluent_kafka import Consumer, TopicPartition
from support import create_protocol_topics, eventually, kafka_bootstrap

from coordinator.service.supervisor import CoordinatorProcess, stop_all
from events.kafka.clients import consumer_config, job_key, partition_for
from events.kafka.log import LogMessage, read_journal_topic
from events.task.participant import JobDriver, Participant
from events.wire.codec import decode
from events.wire.fencing import Fence, epoch_of
from events.wire.records import CheckpointBarrier, CheckpointCompleted, CheckpointConfig, CoordinatorClaimed
from events.wire.topics import Topics

SESSION_TIMEOUT = float(os.environ["CUTLINE_SESSION_TIMEOUT"])
MANY_PARTITIONS = 96
STALE_LIMIT_S = 1.0
RACE_WORKER_ARGS = ("--loglevel", "info", "--fetch-wait-ms", "50")
"""The workers fetch with a 50 ms wait (the suite's other workers: 500 ms on Apache Kafka, 100 on
Tansu, tests/support.py): on Tansu the bound on the jobs' return counts every hop of a claim's
recovery, and was set with 50 ms hops (25 ms each there; on Apache Kafka a hop is as quick at any wait)."""
TASKS = ("task-0", "task-1")


class PausableWorker(CoordinatorProcess):
    """A worker the test can SIGSTOP in the middle of a claim: right before the claim is produced
    (the generation check passed, the epoch is chosen), so that on SIGCONT it writes a claim for a
    generation the group has moved past."""

    HOOK = """
import os, signal, sys
from coordinator.service import claims
request = sys.argv.pop(1)
write_claim = claims.PartitionRecovery.write_claim
def pausing_write_claim(self, generation, epoch):
    if os.path.exists(request):
        try:
            os.unlink(request)
        except FileNotFoundError:
            pass
        else:
            os.kill(os.getpid(), signal.SIGSTOP)
    return write_claim(self, generation, epoch)
claims.PartitionRecovery.write_claim = pausing_write_claim
read_snapshot = claims.PartitionRecovery.read_snapshot
def slow_read_snapshot(self, generation):
    if os.path.exists(request + ".slow"):
        import time
        time.sleep(1.0)  # a slow broker: the executor's threads are busy, claims queue behind
    return read_snapshot(self, generation)
claims.PartitionRecovery.read_snapshot = slow_read_snapshot
from coordinator.cli import main
main()
"""

    def __init__(self, bootstrap: str, prefix: str) -> None:
        # INFO: the test reads when the worker joins its group from aiokafka's log line
        super().__init__(bootstrap, prefix, watchdog=False, extra_args=RACE_WORKER_ARGS)
        self.request = self.log_path.parent / "pause-request"

    def command(self) -> list[str]:
        plain = super().command()
        return [sys.executable, "-c", self.HOOK, str(self.request), *plain[3:]]

    def pause_in_next_claim(self) -> None:
        self.request.write_text("pause")

    def slow_recoveries(self, slow: bool) -> None:
        """Each recovery's first read takes a second more (or no longer)."""
        marker = self.request.with_name(self.request.name + ".slow")
        if slow:
            marker.write_text("slow")
        else:
            marker.unlink(missing_ok=True)

    def paused(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                return stat.read().rsplit(")", 1)[1].split()[0] == "T"
        except OSError:
            return False


@dataclass
class Monitor:
    """Effective claims from the journal against what each worker's ``/ready`` says it decides."""

    bootstrap: str
    topics: Topics
    partitions: int
    workers: list[PausableWorker]
    effective: dict[int, tuple[int, str, float]] = field(default_factory=dict)
    """Journal partition -> (epoch, worker, when the monitor read it) of its effective claim."""
    resumed: dict[int, float] = field(default_factory=dict)
    """pid -> when the test resumed it (a paused worker cannot be asked; it gets a fresh second)."""
    stale: list[str] = field(default_factory=list)
    checks: int = 0
    _stop: bool = False

    def start(self) -> None:
        threading.Thread(target=self._read_claims, daemon=True).start()
        threading.Thread(target=self._ask_workers, daemon=True).start()

    def stop(self) -> None:
        self._stop = True

    def _read_claims(self) -> None:
        consumer = Consumer(consumer_config(self.bootstrap))
        consumer.assign([TopicPartition(self.topics.checkpoints, p, 0) for p in range(self.partitions)])
        fences: dict[int, Fence] = {}
        try:
            while not self._stop:
                for message in consumer.consume(500, timeout=0.05):
                    if message.error() is not None or not message.value():
                        continue
                    record = decode(message.value())
                    if not isinstance(record, CoordinatorClaimed):
                        continue
                    partition = message.partition()
                    valid, fences[partition] = fences.get(partition, Fence()).claim(record.epoch)
                    if valid and epoch_of(message.headers()) == record.epoch:
                        self.effective[partition] = (record.epoch, record.worker_id, time.monotonic())
        finally:
            consumer.close()

    def _ask_workers(self) -> None:
        while not self._stop:
            for worker in list(self.workers):
                if worker.paused() or worker._process is None or worker._process.poll() is not None:
                    continue
                try:
                    asked = time.monotonic()
                    ready = worker.get("/ready", timeout=1.0)
                except OSError:
                    continue
                self._check(worker, ready, asked)
            time.sleep(0.1)

    def _check(self, worker: PausableWorker, ready: dict[str, object], asked: float) -> None:
        partitions = ready.get("partitions")
        if not isinstance(partitions, dict):
            return
        since_resume = self.resumed.get(worker.pid or -1, 0.0)
        for key, held in partitions.items():
            if held.get("phase") != "DECIDING":
                continue
            effective = self.effective.get(int(key))
            if effective is None:
                continue
            epoch, owner, seen = effective
            self.checks += 1
            if (epoch, owner) != (held["epoch"], ready["worker"]) and held["epoch"] < epoch:
                overdue = asked - max(seen, since_resume)
                if overdue > STALE_LIMIT_S:
                    self.stale.append(
                        f"{ready['worker']} decides partition {key} under epoch {held['epoch']} "
                        f"{overdue:.2f} s after {owner} claimed it with epoch {epoch}"
                    )


def _foreign(message: LogMessage, problem: str) -> None:
    raise AssertionError(f"journal {message.partition}@{message.offset}: {problem}")


def spread_jobs(count: int, partitions: int) -> list[str]:
    """Job ids that land on ``count`` different partitions of ``partitions``."""
    jobs: dict[int, str] = {}
    i = 0
    while len(jobs) < count:
        job = f"job-{i}"
        jobs.setdefault(partition_for(job_key(job), partitions), job)
        i += 1
    return list(jobs.values())


class Checkpointing:
    """A few jobs of two participants each that checkpoint every 200 ms."""

    def __init__(
        self, bootstrap: str, topics: Topics, tmp: Path, job_ids: list[str], partitions: int
    ) -> None:
        self.bootstrap, self.topics, self.job_ids = bootstrap, topics, job_ids
        self.location = f"file://{tmp}/checkpoints"
        self.participants = [
            Participant(bootstrap, job, task, 1, topics, self._snapshot, lambda: {"in:0": 0})
            for job in job_ids
            for task in TASKS
        ]
        for participant in self.participants:
            participant.run_in_thread()
        self.drivers = [JobDriver(bootstrap, job, topics) for job in job_ids]
        self.partitions = sorted({partition_for(job_key(job), partitions) for job in job_ids})

    @staticmethod
    def _snapshot(barrier: CheckpointBarrier) -> bytes:
        return b"state"

    def start(self) -> None:
        config = CheckpointConfig(
            interval_ms=200, timeout_ms=3_000, tolerable_failures=1_000, location=self.location
        )
        for driver in self.drivers:
            driver.running(TASKS, config, attempt=1)

    def completions(self) -> dict[str, list[int]]:
        """Each job's effective completions' timestamps (ms), read from its journal partition."""
        found: dict[str, list[int]] = {job: [] for job in self.job_ids}
        for event, _ in read_journal_topic(
            self.bootstrap, self.topics.checkpoints, _foreign, partitions=self.partitions
        ):
            if isinstance(event, CheckpointCompleted) and event.job_id in found:
                found[event.job_id].append(event.timestamp_ms)
        return found

    def wait_for_new_completions(self, since: float, timeout: float) -> float:
        """Seconds from ``since`` (wall clock) until every job had completed a checkpoint after it,
        by the completions' own timestamps (the coordinator's clock, on this host)."""

        def firsts() -> dict[str, int | None]:
            return {
                j: min((t for t in ts if t >= since * 1000), default=None)
                for j, ts in self.completions().items()
            }

        found = eventually(
            firsts,
            lambda found: all(t is not None for t in found.values()),
            timeout=timeout,
            interval=0.2,
            what="a new checkpoint of every job (None: none yet)",
        )
        return max(t for t in found.values() if t is not None) / 1000 - since

    def close(self) -> None:
        for participant in self.participants:
            participant.close()
        for driver in self.drivers:
            driver.close()


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    """A broker of this module's own. Its first test starts it, so it runs at the priority of the
    module's ``timed`` tests (tests/conftest.py), as their coordinators do: the bounds here measure
    the coordinators and their broker, not a broker busy with the other tests of the worker."""
    with kafka_bootstrap() as address:
        yield address


@pytest.fixture(name="partitions")
def _partitions(request: pytest.FixtureRequest) -> int:
    """The topics' partition count (8 unless a test asks for more with ``indirect``)."""
    return int(getattr(request, "param", 8))


@pytest.fixture(name="topics")
def _topics(bootstrap: str, partitions: int) -> Topics:
    return create_protocol_topics(bootstrap, f"t{uuid4().hex[:8]}.", partitions=partitions)


@pytest.fixture(name="workers")
def _workers(bootstrap: str, topics: Topics) -> Iterator[list[PausableWorker]]:
    workers: list[PausableWorker] = []
    try:
        yield workers
    finally:
        for worker in workers:
            if worker.pid is not None:
                os.kill(worker.pid, signal.SIGCONT) if worker.paused() else None
        stop_all(workers)


@pytest.fixture(name="monitor")
def _monitor(
    bootstrap: str, topics: Topics, partitions: int, workers: list[PausableWorker]
) -> Iterator[Monitor]:
    monitor = Monitor(bootstrap, topics, partitions, workers)
    monitor.start()
    yield monitor
    monitor.stop()


@pytest.fixture(name="jobs")
def _jobs(bootstrap: str, topics: Topics, partitions: int, tmp_path: Path) -> Iterator[Checkpointing]:
    jobs = Checkpointing(bootstrap, topics, tmp_path, spread_jobs(6, partitions), partitions)
    yield jobs
    jobs.close()


def joined_at(worker: PausableWorker, timeout: float = 30.0) -> float:
    """When the worker asked to join its group (wall clock), from its log (aiokafka's INFO line)."""

    def joining() -> str | None:
        lines = worker.log_path.read_text(errors="replace").splitlines()
        return next((line for line in lines if "(Re-)joining group" in line and line.startswith("[")), None)

    try:
        line = eventually(joining, timeout=timeout, what="the worker to join its group")
    except AssertionError as error:
        raise AssertionError(f"{error}; log:\n{worker.tail()}") from None
    return datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def answers(worker: PausableWorker) -> bool:
    try:
        worker.get("/ready", timeout=0.5)
    except OSError:
        return False
    return True


def queued_claims(worker: PausableWorker) -> int:
    """How many of its partitions the worker has not yet claimed and settled."""
    try:
        partitions = worker.get("/ready", timeout=1.0)["partitions"]
    except OSError:
        return 0
    return sum(1 for held in partitions.values() if held["phase"] in ("RECOVERING", "CLAIMING"))


@pytest.mark.slow
@pytest.mark.timed
class TestRaces:
    @pytest.mark.parametrize("partitions", [MANY_PARTITIONS], indirect=True)
    def test_a_worker_joining_while_64_claims_are_queued_fences_no_one(
        self,
        bootstrap: str,
        topics: Topics,
        workers: list[PausableWorker],
        monitor: Monitor,
        jobs: Checkpointing,
    ) -> None:
        """Given worker A assigned all 96 partitions and still claiming at least 64 of them, when B
        joins, then no worker decides a partition another claimed for more than 1 s, and every
        job completes checkpoints within the session timeout + 5 s of B's join."""
        a = PausableWorker(bootstrap, topics.prefix)
        workers.append(a)
        a.slow_recoveries(True)
        a.launch()
        eventually(
            lambda: queued_claims(a),
            lambda queued: queued >= 64,
            timeout=60,
            interval=0.02,
            what="64 claims queued at A",
        )
        b = PausableWorker(bootstrap, topics.prefix)
        workers.append(b)
        b.launch()
        jobs.start()
        eventually(lambda: answers(b), timeout=60, what="B's web server (it joins the group next)")
        assert queued_claims(a) >= 64, "A settled its claims before B joined: the race was not run"
        a.slow_recoveries(False)
        joined = joined_at(b)

        took = jobs.wait_for_new_completions(joined, timeout=SESSION_TIMEOUT + 5 + 30)
        print(f"every job completed a checkpoint {took:.1f} s after B joined")
        eventually(
            lambda: (a.get("/ready")["recovered"], b.get("/ready")["recovered"]),
            all,
            interval=0.1,
            what="the two workers to settle (recovered)",
        )
        jobs.wait_for_new_completions(time.time(), timeout=SESSION_TIMEOUT + 5)

        assert [] == monitor.stale
        assert monitor.checks > 0
        mine = {
            p for w in (a, b) for p, h in w.get("/ready")["partitions"].items() if h["phase"] == "DECIDING"
        }
        assert {str(p) for p in range(MANY_PARTITIONS)} == mine
        assert took <= SESSION_TIMEOUT + 5, f"jobs completed only {took:.1f} s after B joined"

    def test_a_worker_paused_in_the_middle_of_a_claim_fences_no_one(
        self,
        bootstrap: str,
        topics: Topics,
        workers: list[PausableWorker],
        monitor: Monitor,
        jobs: Checkpointing,
    ) -> None:
        """Given two workers deciding, when a third joins and A is paused right before writing a
        claim of that rebalance, past the session timeout, then the others take its partitions and
        every job completes again within the session timeout + 5 s; resumed, A writes its stale
        claim, steps down or abandons it, and no worker ever decides what another claimed for more
        than 1 s."""
        a, b = PausableWorker(bootstrap, topics.prefix), PausableWorker(bootstrap, topics.prefix)
        workers.extend([a, b])
        for worker in (a, b):
            worker.launch()
        for worker in (a, b):
            worker.wait_ready(timeout=90)
        jobs.start()
        jobs.wait_for_new_completions(0.0, timeout=60)

        a.pause_in_next_claim()
        c = PausableWorker(bootstrap, topics.prefix)
        workers.append(c)
        c.launch()
        eventually(a.paused, timeout=60, interval=0.02, what="A to claim (and pause) after C joined")
        paused_at, paused_wall = time.monotonic(), time.time()
        took = jobs.wait_for_new_completions(paused_wall, timeout=SESSION_TIMEOUT + 5 + 10)
        print(f"every job completed a checkpoint again {took:.1f} s after A paused")
        assert took <= SESSION_TIMEOUT + 5, f"jobs completed again only {took:.1f} s after A paused"

        assert a.pid is not None
        time.sleep(max(0.0, paused_at + SESSION_TIMEOUT + 1 - time.monotonic()))
        monitor.resumed[a.pid] = time.monotonic()
        os.kill(a.pid, signal.SIGCONT)
        jobs.wait_for_new_completions(time.time(), timeout=SESSION_TIMEOUT + 5 + 10)
        time.sleep(2 * STALE_LIMIT_S)

        assert [] == monitor.stale
        assert monitor.checks > 0
        eventually(
            lambda: decided_by_one(a, b, c),
            lambda decided: decided == [str(p) for p in range(8)],
            timeout=SESSION_TIMEOUT + 30,
            interval=0.1,
            what="each partition decided by one worker",
        )
        assert [[], [], []] == [w.get("/jobs")["stepped_down"] for w in (a, b, c)]


def decided_by_one(*workers: PausableWorker) -> list[str]:
    """The partitions the workers say they decide, in order (a partition twice if two do)."""
    held = [p for w in workers for p, h in w.get("/ready")["partitions"].items() if h["phase"] == "DECIDING"]
    return sorted(held, key=int)
