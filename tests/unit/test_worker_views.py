"""A partition assigned to a worker and not decided there says why (issue 52): in its view (``/ready``,
the gauge) and, after 10 s, in the log, once a minute."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from coordinator.core.ownership import Claim, Hold, Phase, RecoveryFailed
from coordinator.service.runtime import Coordinator
from coordinator.service.worker import UNDECIDED_WARN_S, Worker, why_undecided
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
