"""A partition assigned to a worker and not decided there says why (issue 52): in its view (``/ready``,
the gauge) and, after 10 s, in the log, once a minute."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pytest

from coordinator.core.ownership import (
    BarriersResent,
    Claim,
    ClaimSettled,
    ClaimWritten,
    Fact,
    Hold,
    JournalFolded,
    Phase,
    RecoveryFailed,
    SnapshotRead,
)
from coordinator.core.state import initial_state
from coordinator.service.runtime import Coordinator
from coordinator.service.views import job_overview
from coordinator.service.worker import UNDECIDED_WARN_S, Worker, why_undecided
from events.wire.records import JobStatus
from events.wire.topics import Topics

T = TypeVar("T")


@dataclass
class Clock:
    at: float = 0.0

    def now_ms(self) -> int:
        return int(self.at * 1000)

    def monotonic(self) -> float:
        return self.at


class Idle:
    """An executor that never gets to the work (the recovery stays where the facts leave it)."""

    async def call(self, work: Callable[..., T], *args: Any, guard: Any = None) -> T:
        raise AssertionError("never started")

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        work.close()

    async def close(self) -> None:
        pass


class Untouched:
    """A recovery whose steps never run (the executor never gets to them)."""

    folded = 0
    snapshot_offset = None

    def __init__(self, partition: int) -> None:
        self.partition = partition

    def read_snapshot(self, generation: int) -> Any:
        raise AssertionError("never run")

    fold_journal = write_claim = read_to_claim = close = read_snapshot


def recovering_worker(clock: Clock) -> Worker:
    """A worker assigned partition 2 at ``clock``'s time, whose first recovery of it failed."""
    nothing: Any = None
    runtime = Coordinator(Topics("t."), partitions=4)
    worker = Worker("w0", runtime, asyncio.Lock(), nothing, Untouched, Idle(), clock)
    worker.assigned(7, {2})
    worker.tell(RecoveryFailed(2, 7, "TimeoutError: the snapshots do not answer"))
    return worker


def test_a_partition_recovering_says_why_and_since_when() -> None:
    clock = Clock(100.0)
    worker = recovering_worker(clock)
    clock.at = 104.5

    (view,) = worker.views()

    assert "RECOVERING" == view.phase
    assert (
        "recovering: reading its snapshot and the journal after it; the last try: recovering failed "
        "(TimeoutError: the snapshots do not answer)"
    ) == view.why
    assert 4.5 == view.undecided_seconds


def test_a_partition_undecided_for_10_s_is_logged_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(100.0)
    worker = recovering_worker(clock)

    with caplog.at_level(logging.WARNING, "cutline.coordinator"):
        for at in (105.0, 100.0 + UNDECIDED_WARN_S, 130.0, 100.0 + UNDECIDED_WARN_S + 60):
            clock.at = at
            worker.log_undecided()

    lines = [r.getMessage() for r in caplog.records]
    assert 2 == len(lines)
    assert lines[0].startswith("journal partition 2: assigned here 10 s ago and not decided: recovering:")
    assert lines[0].endswith("its jobs get no checkpoints until it is")


def test_a_stepped_down_partition_names_the_claim_that_fenced_it() -> None:
    hold = Hold(7, Phase.STEPPED_DOWN, fenced_by=Claim(9, "w3", 8, 120))

    assert (
        "stepped down: worker w3 claimed it with epoch 9 (generation 8); decided here again once the "
        "group assigns it anew"
    ) == why_undecided(hold)
    assert None is why_undecided(Hold(7, Phase.DECIDING))


class DropsOnly:
    """An executor that runs the worker's drops of a partition's fold (as tasks of the running loop)
    and never gets to the rest: the test tells the recovery's facts itself."""

    async def call(self, work: Callable[..., T], *args: Any, guard: Any = None) -> T:
        raise AssertionError("never started")

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        if work.__name__ == "_drop":
            asyncio.get_running_loop().create_task(work)
        else:
            work.close()

    async def close(self) -> None:
        pass


def decided_with(partition: int, generation: int, epoch: int) -> tuple[Fact, ...]:
    """The facts that take a held ``partition`` from recovering to deciding under ``epoch``."""
    return (
        SnapshotRead(partition, generation, epoch - 2, 40),
        JournalFolded(partition, generation, 99, epoch - 1),
        ClaimWritten(partition, generation, epoch, 100 + epoch),
        ClaimSettled(partition, generation, Claim(epoch, "w0", generation, 100 + epoch), epoch),
        BarriersResent(partition, generation),
    )


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class TestAFailedJournalWrite:
    """A journal write fails: the worker recovers the partition again and drops its fold (it may
    hold decisions the journal lacks). Its jobs stay in the views meanwhile, as they stood, each
    saying why its partition is not decided, until it is decided again or leaves the worker (a
    dashboard emptied while the broker was down, 2026-11-30)."""

    @staticmethod
    async def deciding_a_running_job() -> tuple[Worker, str]:
        """A worker deciding partition 2 (claim epoch 4), which holds one running job of it."""
        runtime = Coordinator(Topics("t."), partitions=4)
        worker = Worker("w0", runtime, asyncio.Lock(), Any, Untouched, DropsOnly(), Clock(100.0))  # type: ignore[arg-type]
        worker.assigned(7, {2})
        for fact in decided_with(2, 7, 4):
            worker.tell(fact)
        job_id = next(j for j in (f"job-{i}" for i in range(100)) if runtime.partition_of(j) == 2)
        runtime.fold.states[job_id] = replace(initial_state(job_id), status=JobStatus.RUNNING, attempt=3)
        assert 2 in worker.owners and [] == worker.last_known_jobs()
        return worker, job_id

    @classmethod
    async def after_a_failed_write(cls) -> Worker:
        """A worker whose journal write of partition 2 failed: its running job is listed as known."""
        worker, job_id = await cls.deciding_a_running_job()
        worker.write_failed(2, "delivery timed out")
        await settle()
        assert [job_id] == [job.job_id for job in worker.last_known_jobs()]
        return worker

    def test_its_jobs_stay_listed_as_they_stood_saying_why_they_are_not_decided(self) -> None:
        async def scenario() -> None:
            worker, job_id = await self.deciding_a_running_job()

            worker.write_failed(2, "delivery timed out")
            await settle()

            assert job_id not in worker.runtime.states
            (known,) = worker.last_known_jobs()
            assert (job_id, JobStatus.RUNNING, 3) == (known.job_id, known.state.status, known.state.attempt)
            assert known.why.startswith("recovering: reading its snapshot and the journal after it")
            assert "a write failed (delivery timed out)" in known.why
            shown = job_overview(known.job_id, known.state, known.stats, known.why)
            assert (job_id, "RUNNING", known.why) == (shown["id"], shown["status"], shown["undecided"])

        asyncio.run(scenario())

    def test_they_leave_the_list_once_the_partition_is_decided_again(self) -> None:
        async def scenario() -> None:
            worker = await self.after_a_failed_write()

            for fact in decided_with(2, 7, 6):
                worker.tell(fact)

            assert 2 in worker.owners
            assert [] == worker.last_known_jobs()

        asyncio.run(scenario())

    def test_they_leave_the_list_when_the_partition_leaves_the_worker(self) -> None:
        async def scenario() -> None:
            worker = await self.after_a_failed_write()

            worker.revoked({2})

            assert [] == worker.last_known_jobs()

        asyncio.run(scenario())

    def test_a_revoked_partition_leaves_no_job_listed(self) -> None:
        async def scenario() -> None:
            worker, _ = await self.deciding_a_running_job()

            worker.revoked({2})
            await settle()

            assert [] == worker.last_known_jobs()

        asyncio.run(scenario())
