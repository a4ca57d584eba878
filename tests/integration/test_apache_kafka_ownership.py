"""N coordinator workers under Apache Kafka's own group protocol (issue 47, step 3).

The scenarios of test_ownership.py and test_ownership_races.py on an Apache Kafka node of this
module's, with Kafka's default ``group.min.session.timeout.ms`` (6 s) and the workers' session
timeout T = 6 s, as a user's cluster runs them: a worker killed with nobody to tell the group (a
lost machine), a worker paused (SIGSTOP) past the session timeout and resumed, and a worker joining
while another still has dozens of claims in flight. Each asserts the failover bound of
docs/coordinator.md: every job completes checkpoints again within T + 5 s; Apache Kafka answers a
rejoin at once (the embedded broker holds it for T/2, docs/embedded-broker.md), so no hold is
added. The fencing rule holds throughout: no checkpoint id reused, nothing completed lost,
``cutline replay --verify`` passes, and no worker decides a partition another claimed for more
than 1 s.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from support import eventually
from test_ownership import JOBS, Jobs, assert_effective_journal_is_sound, assert_gone, owner_of
from test_ownership_races import (
    MANY_PARTITIONS,
    Checkpointing,
    Monitor,
    PausableWorker,
    _jobs,  # noqa: F401 (fixture)
    _monitor,  # noqa: F401 (fixture)
    _partitions,  # noqa: F401 (fixture)
    _workers,  # noqa: F401 (fixture)
    decided_by_one,
    joined_at,
    queued_claims,
)

from coordinator.service.app import Settings, ensure_topics
from coordinator.service.supervisor import CoordinatorProcess, stop_all
from events.dev.apache_kafka import ApacheKafka
from events.wire.topics import Topics

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timed]

SESSION_TIMEOUT = 6.0
"""The workers' ``--session-timeout``: Apache Kafka's default ``group.min.session.timeout.ms``."""

BOUND = SESSION_TIMEOUT + 5
"""docs/coordinator.md: every job of a worker that was lost completes checkpoints again within it."""


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    with ApacheKafka() as kafka:
        yield kafka.bootstrap


@pytest.fixture(autouse=True)
def _session_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTLINE_SESSION_TIMEOUT", f"{SESSION_TIMEOUT:g}")


@pytest.fixture(name="topics")
def _topics(bootstrap: str, partitions: int) -> Topics:
    """The protocol's topics, made as ``cutline topics create`` makes them (8 partitions unless a
    test asks for more)."""
    settings = Settings(bootstrap, f"t{uuid4().hex[:8]}.", partitions=partitions)
    ensure_topics(settings)
    return settings.topics


def test_a_lost_worker_s_jobs_complete_again_within_the_session_timeout_plus_5_s(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Three workers share six jobs of three tasks; the owner of a job is SIGKILLed with its
    watchdog, as when its machine is lost, in the middle of a checkpoint. The group notices at
    the session timeout, another worker claims the partitions, and the lost worker's jobs complete
    checkpoints again within T + 5 s; no id is reused and nothing completed is lost."""
    workers = [CoordinatorProcess(bootstrap, topics.prefix) for _ in range(3)]
    jobs = Jobs(bootstrap, topics, tmp_path)
    try:
        for worker in workers:
            worker.launch()
        for worker in workers:
            worker.wait_ready(timeout=90)
        jobs.start()
        jobs.wait_for(lambda c: all(len(ids) >= 3 for ids in c.values()), timeout=90)
        victim = owner_of(workers, JOBS[0])
        victims_jobs = {j["id"] for j in victim.get("/jobs?local=1")["jobs"]}
        eventually(lambda: victim.get(f"/jobs/{JOBS[0]}/state")["pending"], timeout=10, interval=0.01)
        worker_pid = victim.worker_pid
        assert worker_pid is not None

        victim.kill_all()
        killed_at = time.monotonic()
        before = jobs.completed()
        assert_gone(worker_pid)
        jobs.wait_for(lambda c: all(max(c[j]) > max(before[j]) for j in victims_jobs), timeout=60)
        failover = time.monotonic() - killed_at

        print(
            f"the lost worker's jobs {sorted(victims_jobs)} completed again {failover:.1f} s after the kill"
        )
        assert failover <= BOUND, f"checkpoints resumed {failover:.1f} s after the kill (bound {BOUND:g} s)"
        after = assert_effective_journal_is_sound(jobs, bootstrap, topics)
        for job in JOBS:
            assert set(before[job]) <= set(jobs.completed(after)[job]), f"{job} lost a completed checkpoint"
    finally:
        jobs.close()
        stop_all(workers)


def _deciding(worker: PausableWorker) -> set[str]:
    return {p for p, held in worker.get("/ready")["partitions"].items() if held["phase"] == "DECIDING"}


def test_a_worker_paused_past_the_session_timeout_and_resumed_fences_no_one(
    topics: Topics, workers: list[PausableWorker], monitor: Monitor, jobs: Checkpointing
) -> None:
    """Two workers decide six jobs; the owner of one is stopped (SIGSTOP, every thread of it, its
    heartbeats too). The other worker claims its partitions and its jobs complete checkpoints again
    within T + 5 s. Resumed (SIGCONT) after that, the paused worker finds itself revoked, rejoins,
    and the partitions are shared again, each decided by one worker; no worker decided a partition
    another had claimed for more than 1 s, and the journal stays sound."""
    bootstrap = monitor.bootstrap
    a, b = PausableWorker(bootstrap, topics.prefix), PausableWorker(bootstrap, topics.prefix)
    workers.extend([a, b])
    for worker in (a, b):
        worker.launch()
    for worker in (a, b):
        worker.wait_ready(timeout=90)
    jobs.start()
    jobs.wait_for_new_completions(0.0, timeout=60)
    paused = owner_of([a, b], jobs.job_ids[0])
    other = b if paused is a else a
    assert paused.pid is not None

    os.kill(paused.pid, signal.SIGSTOP)
    paused_at = time.time()
    took = jobs.wait_for_new_completions(paused_at, timeout=BOUND + 30)
    eventually(
        lambda: _deciding(other),
        lambda mine: mine == {str(p) for p in range(8)},
        timeout=30,
        interval=0.2,
        what="the running worker to decide every partition",
    )
    monitor.resumed[paused.pid] = time.monotonic()
    os.kill(paused.pid, signal.SIGCONT)
    print(f"every job completed a checkpoint {took:.1f} s after the owner of {jobs.job_ids[0]} paused")

    eventually(
        lambda: decided_by_one(a, b),
        lambda decided: decided == [str(p) for p in range(8)] and _deciding(paused),
        timeout=SESSION_TIMEOUT + 30,
        interval=0.2,
        what="the partitions shared again, each decided by one worker",
    )
    jobs.wait_for_new_completions(time.time(), timeout=BOUND)
    assert took <= BOUND, f"jobs completed again only {took:.1f} s after the pause (bound {BOUND:g} s)"
    assert [] == monitor.stale
    assert monitor.checks > 0
    assert [[], []] == [w.get("/jobs")["stepped_down"] for w in (a, b)]
    _assert_replay_verifies(bootstrap, topics)


def _assert_replay_verifies(bootstrap: str, topics: Topics) -> None:
    import subprocess
    import sys

    replay = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "replay", "--bootstrap", bootstrap, "--topic-prefix",
         topics.prefix, "--verify", "--quiet"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert 0 == replay.returncode, replay.stdout + replay.stderr


@pytest.mark.parametrize("partitions", [MANY_PARTITIONS], indirect=True)
def test_a_worker_joining_while_64_claims_are_in_flight_fences_no_one(
    topics: Topics, workers: list[PausableWorker], monitor: Monitor, jobs: Checkpointing
) -> None:
    """Worker A is assigned all 96 partitions and still has at least 64 claims to make (each of its
    recoveries slowed by 1 s) when B joins: the group rebalances under A's claims in flight. No
    worker decides a partition another claimed for more than 1 s, every job completes a
    checkpoint within T + 5 s of B's join, and in the end the two decide all 96 partitions."""
    bootstrap = monitor.bootstrap
    a = PausableWorker(bootstrap, topics.prefix)
    workers.append(a)
    a.slow_recoveries(True)
    a.launch()
    eventually(
        lambda: queued_claims(a), lambda n: n >= 64, timeout=90, interval=0.02, what="64 claims queued at A"
    )
    b = PausableWorker(bootstrap, topics.prefix)
    workers.append(b)
    b.launch()
    jobs.start()
    joined = joined_at(b, timeout=60)
    assert queued_claims(a) >= 64, "A settled its claims before B joined: the race was not run"
    a.slow_recoveries(False)

    took = jobs.wait_for_new_completions(joined, timeout=BOUND + 30)
    print(f"every job completed a checkpoint {took:.1f} s after B joined")
    eventually(
        lambda: (a.get("/ready")["recovered"], b.get("/ready")["recovered"]),
        all,
        timeout=60,
        interval=0.1,
        what="the two workers to settle (recovered)",
    )
    assert took <= BOUND, f"jobs completed only {took:.1f} s after B joined (bound {BOUND:g} s)"
    assert [] == monitor.stale
    assert monitor.checks > 0
    assert [str(p) for p in range(MANY_PARTITIONS)] == decided_by_one(a, b)
    _assert_replay_verifies(bootstrap, topics)
