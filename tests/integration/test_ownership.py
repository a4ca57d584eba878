"""N coordinator workers with fencing (docs/design.md, "Ownership and fencing"), with real worker processes
and participants.

Three ``cutline coordinator`` processes on one prefix form one Faust app; each
owns the jobs of its partitions. The tests kill one in the middle of a
checkpoint, freeze one past the session timeout (a zombie), and check what the
journal says through the fencing rule: ids never reused, nothing completed
lost, ``cutline replay --verify`` holds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from uuid import uuid4

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families
from support import create_protocol_topics, eventually, on_apache_kafka

from coordinator.core.invariants import first_violation
from coordinator.service.app import Settings, TopicLayoutError, settle_partitions
from coordinator.service.claims import snapshot_key
from coordinator.service.supervisor import CoordinatorProcess, stop_all
from coordinator.service.watchdog import process_state, running
from events.dev.broker import create_topics
from events.kafka.clients import job_key, partition_for, producer_config
from events.kafka.log import LogMessage, read_journal_topic, read_to_end
from events.task.participant import JobDriver, Participant
from events.wire.codec import decode
from events.wire.fencing import epoch_of
from events.wire.records import (
    JOURNAL_RECORDS,
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointDeclined,
    CheckpointTriggered,
    CoordinatorClaimed,
    DeadLetter,
    JournalEvent,
)
from events.wire.topics import Topics

SESSION_TIMEOUT = float(os.environ["CUTLINE_SESSION_TIMEOUT"])
"""The workers' ``--session-timeout`` (its ``envvar``, set for every test by ``tests/conftest.py``)."""

JOBS = [f"job-{i}" for i in range(6)]
TASKS = ("task-0", "task-1", "task-2")


@pytest.fixture(name="topics")
def _topics(bootstrap: str, topic_prefix: str) -> Topics:
    return create_protocol_topics(bootstrap, topic_prefix, partitions=8)


def _alive(worker: CoordinatorProcess) -> bool:
    return worker._process is not None and worker._process.poll() is None


class Jobs:
    """Six jobs of three participant tasks each, every task counting in its own thread."""

    def __init__(self, bootstrap: str, topics: Topics, tmp: Path) -> None:
        self.bootstrap, self.topics = bootstrap, topics
        self.location = f"file://{tmp}/checkpoints"
        self.participants: list[Participant] = []
        self.drivers: list[JobDriver] = []
        for job in JOBS:
            for task in TASKS:
                counter = {"n": 0}

                def snapshot(barrier: CheckpointBarrier, counter: dict[str, int] = counter) -> bytes:
                    counter["n"] += 1
                    return str(counter["n"]).encode()

                participant = Participant(
                    bootstrap, job, task, 1, topics, snapshot, lambda counter=counter: {"in:0": counter["n"]}
                )
                participant.run_in_thread()
                self.participants.append(participant)
            self.drivers.append(JobDriver(bootstrap, job, topics))

    def start(self) -> None:
        config = CheckpointConfig(
            interval_ms=300, timeout_ms=4_000, tolerable_failures=1_000, location=self.location
        )
        for driver in self.drivers:
            driver.running(TASKS, config, attempt=1)

    def journal(self) -> list[JournalEvent]:
        """The effective journal (the fencing rule applied), every partition."""
        return [e for e, _ in read_journal_topic(self.bootstrap, self.topics.checkpoints, _foreign)]

    def completed(self, journal: list[JournalEvent] | None = None) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {job: [] for job in JOBS}
        for event in self.journal() if journal is None else journal:
            if isinstance(event, CheckpointCompleted):
                found[event.job_id].append(event.checkpoint_id)
        return found

    def wait_for(self, predicate: Callable[[dict[str, list[int]]], bool], timeout: float) -> float:
        """Seconds until ``predicate`` holds for the completed ids by job."""
        started = time.monotonic()
        try:
            eventually(self.completed, predicate, timeout=timeout, interval=0.2, what="the completed ids")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.describe()}") from None
        return time.monotonic() - started

    def describe(self, last: int = 8) -> str:
        """Per job: how many checkpoints completed, the latest ids, and its last effective journal
        events (what a failure needs to show: where a job stopped, and under whom)."""
        journal = self.journal()
        lines = []
        for job in JOBS:
            events = [e for e in journal if getattr(e, "job_id", None) == job]
            ids = [e.checkpoint_id for e in events if isinstance(e, CheckpointCompleted)]
            tail = ", ".join(
                f"{type(e).__name__} {getattr(e, 'checkpoint_id', '')}".strip() for e in events[-last:]
            )
            lines.append(f"  {job}: {len(ids)} completed (latest {ids[-3:]}); last events: {tail}")
        return "\n".join(lines)

    def close(self) -> None:
        for participant in self.participants:
            participant.close()
        for driver in self.drivers:
            driver.close()


def _foreign(message: LogMessage, problem: str) -> None:
    raise AssertionError(f"journal {message.partition}@{message.offset}: {problem}")


@pytest.fixture(name="jobs")
def _jobs(bootstrap: str, topics: Topics, tmp_path: Path) -> Iterator[Jobs]:
    jobs = Jobs(bootstrap, topics, tmp_path)
    try:
        yield jobs
    finally:
        jobs.close()


@dataclass
class Cluster:
    """Three workers on one prefix and the six jobs they share, started once for a class of tests
    that run in order (the last one may kill a worker)."""

    topics: Topics
    workers: list[CoordinatorProcess]
    jobs: Jobs


@pytest.fixture(name="cluster", scope="class")
def _cluster(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    topics = create_protocol_topics(bootstrap, f"t{uuid4().hex[:8]}.", partitions=8)
    workers = [CoordinatorProcess(bootstrap, topics.prefix) for _ in range(3)]
    jobs: Jobs | None = None
    try:
        for worker in workers:
            worker.launch()
        for worker in workers:
            worker.wait_ready(timeout=90)
        jobs = Jobs(bootstrap, topics, tmp_path_factory.mktemp("ownership"))
        jobs.start()
        yield Cluster(topics, workers, jobs)
    finally:
        if jobs is not None:
            jobs.close()
        stop_all(workers)


W = TypeVar("W", bound=CoordinatorProcess)


def owner_of(workers: list[W], job_id: str) -> W:
    """The worker whose views hold ``job_id`` (it owns the job's partition)."""

    def holder() -> W | None:
        for worker in workers:
            if _alive(worker) and job_id in {j["id"] for j in worker.get("/jobs?local=1")["jobs"]}:
                return worker
        return None

    return eventually(holder, interval=0.2, what=f"a worker that holds {job_id}")


def assert_effective_journal_is_sound(jobs: Jobs, bootstrap: str, topics: Topics) -> list[JournalEvent]:
    """Per job: triggered and completed ids unique and increasing; the invariants and
    ``cutline replay --verify`` (which applies the fencing rule itself) hold."""
    journal = jobs.journal()
    for job in JOBS:
        triggered = [
            e.checkpoint_id for e in journal if isinstance(e, CheckpointTriggered) and e.job_id == job
        ]
        completed = jobs.completed(journal)[job]
        assert sorted(set(triggered)) == triggered, f"{job}: ids reused or out of order: {triggered}"
        assert sorted(set(completed)) == completed, f"{job}: completions reused: {completed}"
    assert first_violation(journal) is None
    replay = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "replay", "--bootstrap", bootstrap, "--topic-prefix",
         topics.prefix, "--verify", "--quiet"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert 0 == replay.returncode, replay.stdout + replay.stderr
    return journal


@pytest.mark.slow
@pytest.mark.timed
class TestThreeWorkers:
    """Runs in order on one cluster: the views of three live workers first, then the failover."""

    def test_each_job_is_reported_by_the_one_worker_that_owns_it(self, cluster: Cluster) -> None:
        """Metrics and the dashboard's views with three workers: every job comes from exactly one
        worker's /metrics and /jobs, its count between the journal's before and after the scrape,
        and every worker's /workers lists all three with the journal partitions each owns."""
        workers, jobs = cluster.workers, cluster.jobs
        jobs.wait_for(lambda c: all(len(ids) >= 2 for ids in c.values()), timeout=90)

        before = jobs.completed()
        reported: dict[str, list[tuple[str, float]]] = {job: [] for job in JOBS}
        for worker in workers:
            with urllib.request.urlopen(worker.url + "/metrics", timeout=5) as response:
                families = text_string_to_metric_families(response.read().decode())
                for family in families:
                    for sample in family.samples:
                        if sample.name == "cutline_job_numberOfCompletedCheckpoints":
                            reported[sample.labels["job_id"]].append((worker.url, sample.value))
            owned = {j["id"] for j in worker.get("/jobs?local=1")["jobs"]}
            assert owned == {job for job, seen in reported.items() if any(u == worker.url for u, _ in seen)}
        after = jobs.completed()

        for job in JOBS:
            [(_, count)] = reported[job]
            assert len(before[job]) <= count <= len(after[job]), job
        listed = [worker.get("/workers") for worker in workers]
        urls = {worker.url for worker in workers}
        for view in listed:
            assert urls == {w["url"] for w in view["workers"]}
            assert sorted(p for w in view["workers"] for p in w["partitions"]) == list(range(8))

    def test_a_killed_worker_s_jobs_complete_again_and_nothing_is_lost(
        self, cluster: Cluster, bootstrap: str
    ) -> None:
        """SIGKILL of the worker owning a job in the middle of a checkpoint: its jobs complete
        checkpoints again within session timeout + 5 s, no id is reused, nothing completed is lost."""
        workers, jobs, topics = cluster.workers, cluster.jobs, cluster.topics
        jobs.wait_for(lambda c: all(len(ids) >= 3 for ids in c.values()), timeout=90)
        victim = owner_of(workers, JOBS[0])
        victims_jobs = {j["id"] for j in victim.get("/jobs?local=1")["jobs"]}
        with contextlib.suppress(AssertionError):  # kill it while a checkpoint of the job is pending
            eventually(lambda: victim.get(f"/jobs/{JOBS[0]}/state")["pending"], timeout=10, interval=0.01)
        worker_pid = victim.worker_pid
        assert worker_pid is not None and worker_pid != victim.pid  # a watchdog and its worker
        victim.kill_all()  # a lost machine: nobody tells the group, which notices at the timeout
        killed_at = time.monotonic()
        before = jobs.completed()
        assert_gone(worker_pid)

        def completed_again(completed: dict[str, list[int]]) -> bool:
            return all(max(completed[j]) > max(before[j]) for j in victims_jobs)

        jobs.wait_for(completed_again, timeout=60)
        failover = time.monotonic() - killed_at

        # The embedded broker holds every JoinGroup for about half the session timeout, rejoins of a
        # running group included (docs/embedded-broker.md); Apache Kafka answers a rejoin at once.
        rejoin_hold = 0.0 if on_apache_kafka() else SESSION_TIMEOUT / 2
        bound = SESSION_TIMEOUT + rejoin_hold + 5
        assert failover <= bound, f"checkpoints resumed {failover:.1f}s after the kill (bound {bound:.0f}s)"
        after = assert_effective_journal_is_sound(jobs, bootstrap, topics)
        completed_after = jobs.completed(after)
        for job in JOBS:
            assert set(before[job]) <= set(completed_after[job]), f"{job} lost a completed checkpoint"


def assert_gone(pid: int, timeout: float = 10.0) -> None:
    """Until process ``pid`` has ended (a zombie not yet reaped counts as ended)."""

    def ended() -> bool:
        assert not running(pid), f"process {pid} still runs ({process_state(pid)})"
        return True

    eventually(ended, timeout=timeout, what=f"process {pid} to end")


WATCHED_SESSION_TIMEOUT = 15.0
"""Long enough that a handover waiting for it could not pass for one that did not: on the
embedded broker a handover then takes the worker's next heartbeat (1 s), the rejoin hold of half
this timeout (docs/embedded-broker.md) and the claim."""


@pytest.mark.slow
@pytest.mark.timed
class TestWatchdog:
    @pytest.mark.parametrize("killed", ["worker", "watchdog"])
    def test_a_killed_worker_or_watchdog_hands_its_jobs_over_before_the_session_timeout(
        self, bootstrap: str, topics: Topics, jobs: Jobs, killed: str
    ) -> None:
        """SIGKILL of the worker process alone (as the OOM killer would): the watchdog tells the
        group that the worker left. SIGKILL of the watchdog (``kill -9`` of ``cutline
        coordinator``): its worker exits at once and has the group told. Either way the other
        worker claims its partitions, and its jobs complete checkpoints again before the session
        timeout has even passed. No id is reused, nothing completed is lost, and ``replay
        --verify`` holds."""
        timeout = ("--session-timeout", f"{WATCHED_SESSION_TIMEOUT:g}")
        workers = [CoordinatorProcess(bootstrap, topics.prefix, extra_args=timeout) for _ in range(2)]
        try:
            for worker in workers:
                worker.launch()
            for worker in workers:
                worker.wait_ready(timeout=120)
            jobs.start()
            jobs.wait_for(lambda c: all(len(ids) >= 3 for ids in c.values()), timeout=120)
            victim = owner_of(workers, JOBS[0])
            victims_jobs = {j["id"] for j in victim.get("/jobs?local=1")["jobs"]}
            before = jobs.completed()
            killed_at = time.monotonic()

            worker_pid = victim.worker_pid
            if killed == "worker":
                victim.kill_worker()
            else:
                victim.kill()
            assert worker_pid is not None
            assert_gone(worker_pid)
            jobs.wait_for(lambda c: all(max(c[j]) > max(before[j]) for j in victims_jobs), timeout=60)
            failover = time.monotonic() - killed_at

            assert victim._process is not None
            if killed == "worker":
                assert victim._process.returncode == 128 + signal.SIGKILL
            else:
                assert victim._process.returncode == -signal.SIGKILL
                # The leaver is nobody's child to wait for: it may log after the jobs have moved.
                told = f"its worker (pid {worker_pid}) exited; told group"
                eventually(victim.tail, lambda tail: told in tail, timeout=10, what=repr(told))
            assert "told group" in victim.tail() and "left: its partitions move" in victim.tail()
            assert failover < WATCHED_SESSION_TIMEOUT, (
                f"checkpoints resumed {failover:.1f}s after the kill: the group waited for the session "
                f"timeout ({WATCHED_SESSION_TIMEOUT:g}s)"
            )
            after = assert_effective_journal_is_sound(jobs, bootstrap, topics)
            for job, ids in before.items():
                assert set(ids) <= set(jobs.completed(after)[job]), f"{job} lost a completed checkpoint"
        finally:
            stop_all(workers)


class StoppableWorker(CoordinatorProcess):
    """A coordinator worker the test can SIGSTOP at a chosen point: in its tick of a given job.

    Stopped there (every thread, its consumer's heartbeat thread too), it drops out of the group
    after the session timeout; on SIGCONT the first thing it does is finish that tick's decision
    and append it, and only then can it learn that it was revoked. A SIGSTOP from outside lands
    anywhere, and whether the zombie then appends anything is a race with its heartbeat."""

    HOOK = """
import os, signal, sys
from coordinator.service import app, runtime
request = sys.argv.pop(1)
tick = runtime.Coordinator.tick
def stopping_tick(self, job_id, now_ms, epoch=0):
    if os.path.exists(request) and open(request).read().strip() == job_id:
        os.unlink(request)
        os.kill(os.getpid(), signal.SIGSTOP)
        now_ms = app.now_ms()
    return tick(self, job_id, now_ms, epoch)
runtime.Coordinator.tick = stopping_tick
from coordinator.cli import main
main()
"""

    def __init__(self, bootstrap: str, prefix: str) -> None:
        super().__init__(bootstrap, prefix, watchdog=False)  # the hook runs the worker in this process
        self.request = self.log_path.parent / "stop-request"

    def command(self) -> list[str]:
        plain = super().command()
        assert plain[1:3] == ["-m", "coordinator.cli"], plain
        return [sys.executable, "-c", self.HOOK, str(self.request), *plain[3:]]

    def stop_in_tick_of(self, job_id: str, timeout: float = 10.0) -> None:
        """SIGSTOP the worker in its next tick of ``job_id`` (it must hold the job)."""
        self.request.write_text(job_id)
        eventually(self.stopped, timeout=timeout, what=f"the worker to tick {job_id} and stop in it")

    def stopped(self) -> bool:
        """Whether the process is stopped by a signal (Linux: state T in /proc/<pid>/stat)."""
        assert self.pid is not None
        return process_state(self.pid) == "T"

    def wake(self) -> None:
        assert self.pid is not None
        os.kill(self.pid, signal.SIGCONT)


@pytest.fixture(name="stoppable_workers")
def _stoppable_workers(bootstrap: str, topics: Topics) -> Iterator[list[StoppableWorker]]:
    workers = [StoppableWorker(bootstrap, topics.prefix) for _ in range(3)]
    try:
        for worker in workers:
            worker.launch()
        for worker in workers:
            worker.wait_ready(timeout=90)
        yield workers
    finally:
        for worker in workers:
            worker.request.unlink(missing_ok=True)
            if _alive(worker):
                worker.wake()
        stop_all(workers)


@pytest.mark.slow
class TestZombie:
    def test_a_stopped_worker_s_appends_are_void_and_its_barriers_answers_dead_letters(
        self, stoppable_workers: list[StoppableWorker], jobs: Jobs, bootstrap: str, topics: Topics
    ) -> None:
        """SIGSTOP of a job's owner (in a tick of the job) past the session timeout, the group
        reassigns, the new owner claims, SIGCONT: the zombie finishes its decision and appends it
        before it learns it was revoked. What it appended is void, acks of its barriers are dead
        letters, and the effective journal of every job keeps unique, increasing ids."""
        workers = stoppable_workers
        jobs.start()
        jobs.wait_for(lambda c: all(len(ids) >= 2 for ids in c.values()), timeout=90)
        zombie = owner_of(workers, JOBS[0])
        others = [w for w in workers if w is not zombie]

        zombie.stop_in_tick_of(JOBS[0])
        eventually(
            lambda: {j["id"] for w in others for j in w.get("/jobs?local=1")["jobs"]},
            lambda held: JOBS[0] in held,
            timeout=SESSION_TIMEOUT + 30,
            interval=0.2,
            what="the group to reassign the stopped worker's partitions",
        )
        before = jobs.completed()
        zombie.wake()
        jobs.wait_for(lambda c: all(len(c[j]) >= len(before[j]) + 3 for j in JOBS), timeout=60)

        void = _void_records(list(read_to_end(bootstrap, topics.checkpoints)))
        letters = [decode(m.value) for m in read_to_end(bootstrap, topics.dead_letters) if m.value]
        stale = [d for d in letters if isinstance(d, DeadLetter) and d.reason == "STALE_EPOCH"]
        assert_effective_journal_is_sound(jobs, bootstrap, topics)
        # The zombie's tick of JOBS[0] came due seconds ago: it expired or triggered a checkpoint,
        # appended that after the newer claim, and it is void ...
        assert JOBS[0] in {r.job_id for r in map(_decoded, void) if isinstance(r, JOURNAL_RECORDS)}
        # ... and the acks of the barriers it sent meanwhile went nowhere: each is a dead letter
        # naming the epoch it answered.
        void_triggers = {
            (r.job_id, r.checkpoint_id) for r in map(_decoded, void) if isinstance(r, CheckpointTriggered)
        }
        answered = {(d.job_id, _ack_id(d)) for d in stale}
        refused = [
            f"{d.job_id} {_ack_id(d)}: {d.message}"
            for d in stale
            if (d.job_id, _ack_id(d)) not in void_triggers
        ]
        assert answered <= void_triggers, "acks of valid checkpoints were refused as stale: " + "; ".join(
            refused
        )
        for letter in stale:
            assert "superseded" in letter.message


def _ack_id(letter: DeadLetter) -> int:
    ack = decode(letter.value or b"")
    assert isinstance(ack, CheckpointAcknowledged | CheckpointDeclined)
    return ack.checkpoint_id


def _decoded(message: LogMessage) -> object:
    return decode(message.value) if message.value else None


def _void_records(raw: list[LogMessage]) -> list[LogMessage]:
    """Journal messages of an epoch lower than the latest claim before them in their partition."""
    current: dict[int, int] = {}
    void = []
    for message in raw:
        record = decode(message.value) if message.value else None
        if isinstance(record, CoordinatorClaimed):
            if record.epoch > current.get(message.partition, 0):
                current[message.partition] = record.epoch
            continue
        if epoch_of(message.headers) < current.get(message.partition, 0):
            void.append(message)
    return void


class TestRetention:
    def test_a_journal_with_finite_retention_is_refused(self, bootstrap: str, topic_prefix: str) -> None:
        """The coordinator exits non-zero and says how to keep the journal for ever."""
        topics = Topics(topic_prefix)
        create_topics(bootstrap, [topics.checkpoints], config={"retention.ms": "604800000"})
        create_topics(bootstrap, [*topics.all, topics.ticks])
        worker = CoordinatorProcess(bootstrap, topic_prefix)

        with pytest.raises(RuntimeError, match="exited with") as failure:
            worker.start(timeout=60)

        assert "finite retention (retention.ms=604800000)" in str(failure.value)
        assert "retention.ms=-1" in str(failure.value)

    def test_a_compacted_journal_is_refused(self, bootstrap: str, topic_prefix: str) -> None:
        """Compaction keeps one record per job id: the coordinator exits and says how to stop it."""
        topics = Topics(topic_prefix)
        config = {"cleanup.policy": "compact", "retention.ms": "-1"}
        create_topics(bootstrap, [topics.checkpoints], config=config)
        create_topics(bootstrap, [*topics.all, topics.ticks])
        worker = CoordinatorProcess(bootstrap, topic_prefix)

        with pytest.raises(RuntimeError, match="exited with") as failure:
            worker.start(timeout=60)

        assert "cleanup.policy=compact: compaction keeps one record per key" in str(failure.value)
        assert "--add-config cleanup.policy=delete,retention.ms=-1" in str(failure.value)


class TestPartitionCount:
    """The coordinator uses the partition count its topics were created with, not its default of 8:
    a job's partition is worked out from its key and that count."""

    @pytest.mark.slow
    def test_a_restarted_worker_knows_every_job_of_topics_with_two_partitions(
        self, bootstrap: str, topic_prefix: str, tmp_path: Path
    ) -> None:
        """Topics made with ``cutline topics create --partitions 2``, as docs/embedded-broker.md advises
        for a small machine. A worker is SIGKILLed and another starts: it claims both partitions and
        every job completes checkpoints again, with no id reused (with 8 as the count, the claim left
        out the jobs whose partition differs under 8 and 2, and they never checkpointed again)."""
        topics = create_protocol_topics(bootstrap, topic_prefix, partitions=2)
        moved = [job for job in JOBS if partition_for(job_key(job), 8) != partition_for(job_key(job), 2)]
        assert moved, "some job must have another partition number under 8 partitions than under 2"
        first = CoordinatorProcess(bootstrap, topic_prefix, extra_args=("--snapshot-interval", "0.5"))
        second = CoordinatorProcess(bootstrap, topic_prefix)
        jobs = Jobs(bootstrap, topics, tmp_path)
        try:
            first.start(timeout=90)
            jobs.start()
            jobs.wait_for(lambda c: all(len(ids) >= 2 for ids in c.values()), timeout=90)
            checkpointed_ms = time.time() * 1000
            eventually(
                lambda: {
                    m.key
                    for m in read_to_end(bootstrap, topics.snapshots)
                    if m.timestamp_ms > checkpointed_ms
                },
                lambda keys: {snapshot_key(0), snapshot_key(1)} <= keys,
                interval=0.2,
                what="a fold snapshot of each partition after the jobs checkpointed",
            )
            first.kill()
            before = jobs.completed()

            second.start(timeout=90)
            jobs.wait_for(lambda c: all(max(c[j]) > max(before[j]) for j in JOBS), timeout=60)

            assert {j["id"] for j in second.get("/jobs?local=1")["jobs"]} == set(JOBS)
            assert_effective_journal_is_sound(jobs, bootstrap, topics)
        finally:
            jobs.close()
            stop_all([first, second])

    def test_it_takes_the_count_of_the_existing_topics(self, bootstrap: str, topic_prefix: str) -> None:
        settings = Settings(bootstrap, topic_prefix)
        assert settle_partitions(settings) == settings  # no topics yet: they are made with its count
        create_topics(bootstrap, [*settings.topics.all, *settings.topics.internal], 3)

        assert settle_partitions(settings).partitions == 3

    def test_topics_of_different_partition_counts_are_refused(
        self, bootstrap: str, topic_prefix: str
    ) -> None:
        """The coordinator exits non-zero, names the counts and says how to fix it."""
        topics = Topics(topic_prefix)
        create_topics(bootstrap, [topics.checkpoints], partitions=2, config={"retention.ms": "-1"})
        create_topics(bootstrap, [*topics.all, topics.ticks], partitions=8)
        with pytest.raises(TopicLayoutError, match="different partition counts") as refused:
            settle_partitions(Settings(bootstrap, topic_prefix))
        assert f"2 partitions: {topics.checkpoints}" in str(refused.value)

        with pytest.raises(RuntimeError, match="exited with") as failure:
            CoordinatorProcess(bootstrap, topic_prefix).start(timeout=60)
        assert "different partition counts" in str(failure.value)
        assert "cutline topics create" in str(failure.value)


def _produce_all(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    producer = Producer(producer_config(bootstrap, {"linger.ms": 20, "batch.num.messages": 10_000}))
    for key, value in messages:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.1)
    assert 0 == producer.flush(60)
