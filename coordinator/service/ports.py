"""What the coordinator's shell does outside itself, as ports: the production wiring passes Kafka,
threads and the wall clock (:mod:`coordinator.service.app`); the deterministic simulator
(:mod:`coordinator.simulation`) passes its in-memory log, one seeded scheduler and simulated time.

The :class:`~coordinator.service.worker.Worker` (ownership, recovery, snapshots) and the
:class:`~coordinator.service.inputs.InputLoop` (batches of input decided and published) take
nothing else from the world than what these give them, so the code that ships is the code the
simulator runs under a seed.

- :class:`Clock`: the wall clock decisions are stamped with, a monotonic one for durations.
- :class:`Executor`: blocking work off the event loop (threads in production), background tasks.
- :class:`Recovery`: the reads and writes that recover one journal partition for one generation
  (:class:`coordinator.service.claims.PartitionRecovery` over Kafka).
- :class:`Writes`: records to the journal, barriers and dead-letter topics; fold snapshots.
- :class:`Watch`: which journal partitions the watcher tails, from where
  (:class:`coordinator.service.watcher.JournalWatcher`).
- :class:`InputConsumer`: where the consumer of the input topics stands, and a rewind
  (:class:`coordinator.service.direct.DirectConsumer`).
- :class:`FileChecks`: whether ``file:`` paths lead out through symbolic links, asked by the runtime
  before it decides (:class:`coordinator.service.file_view.LocalFiles`; defined beside it, as the
  runtime takes it and this module imports the runtime).
- :class:`MetadataObjects`: where the ``_metadata`` objects of completions too large for the journal
  are written, before the journal records that refer to them (:class:`StoredMetadata`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from coordinator.core.ownership import Fact
from coordinator.core.snapshot import PartitionSnapshot
from coordinator.service.file_view import FileChecks
from coordinator.service.runtime import Coordinator, Outgoing
from coordinator.service.writer import Written
from events.task import storage

T = TypeVar("T")

__all__ = [
    "Clock",
    "Executor",
    "FileChecks",
    "InputConsumer",
    "MetadataObjects",
    "Recovery",
    "RecoveryFactory",
    "SendTick",
    "StoredMetadata",
    "SystemClock",
    "ThreadExecutor",
    "Watch",
    "Writes",
]


class Clock(Protocol):
    """Time as the shell sees it."""

    def now_ms(self) -> int:
        """The wall clock in milliseconds since the epoch: what decisions are stamped with."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: for durations and deadlines."""
        ...


class Executor(Protocol):
    """Where blocking work runs, and background tasks are started."""

    async def call(
        self, work: Callable[..., T], *args: Any, guard: Callable[[], T | None] | None = None
    ) -> T:
        """``work(*args)`` off the event loop (it blocks), once a thread is free. ``guard``, when
        given, is asked first, on that thread when it picks the work up: an answer other than None
        is the result, and ``work`` is not run (a claim queued behind others must not outlive the
        generation it was for)."""
        ...

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background on the event loop (cancelled by :meth:`close`)."""
        ...

    async def close(self) -> None:
        """Cancel the background work still running."""
        ...


class Recovery(Protocol):
    """The blocking reads and writes of recovering one journal partition for one generation
    (:class:`coordinator.service.claims.PartitionRecovery`): each step returns the fact the
    ownership state machine takes next. The fold goes into :attr:`coordinator`."""

    partition: int
    coordinator: Coordinator
    folded: int
    """Journal records read after the snapshot."""
    snapshot_offset: int | None
    """The journal offset the loaded snapshot covered (None: folded from the start)."""

    def read_snapshot(self, generation: int) -> Fact: ...

    def fold_journal(self, generation: int) -> Fact: ...

    def write_claim(self, generation: int, epoch: int) -> Fact: ...

    def read_to_claim(self, generation: int, offset: int) -> Fact: ...

    def close(self) -> None: ...


RecoveryFactory = Callable[[int], Recovery]
"""A fresh recovery of a partition."""


class Writes(Protocol):
    """The coordinator's writes."""

    async def write(self, messages: Sequence[Outgoing]) -> Written:
        """Write ``messages`` (in order per partition) and wait until the broker answered each."""
        ...

    async def write_snapshot(self, snapshot: PartitionSnapshot) -> bool:
        """Write a fold snapshot and wait for the broker; False if it failed."""
        ...


class Watch(Protocol):
    """The journal watcher: what it tails."""

    def watch(self, partition: int, start: int) -> None:
        """Tail ``partition`` from ``start`` on (again, if it was tailed)."""
        ...

    def unwatch(self, partition: int) -> None: ...


class InputConsumer(Protocol):
    """The consumer of the input topics, as the input loop needs it."""

    def next_offset(self, topic: str, partition: int) -> int | None:
        """The offset of the next record of ``topic[partition]`` the consumer hands over (None:
        nothing handed over nor committed yet: it starts at the partition's beginning)."""
        ...

    def committed(self, topic: str, partition: int) -> int | None:
        """The offset the group has committed for ``topic[partition]``, as this consumer knows it
        (None: none)."""
        ...

    async def rewind(self, topic: str, partition: int, offset: int) -> None:
        """Hand over the records of ``topic[partition]`` again from ``offset`` on: what was acked
        of it at or past ``offset`` counts for nothing, what was fetched of it before is not handed
        over, and the committed offset goes back to ``offset`` if it is past it."""
        ...

    def prefetch(self) -> None:
        """Start fetching the next batch now (the journal writes of this one are under way)."""
        ...


class MetadataObjects(Protocol):
    """Where completions too large for the journal are written (docs/design.md, "Record sizes")."""

    def write(self, uri: str, frame: bytes) -> None:
        """Write ``frame`` at ``uri``, all or nothing; raises when it cannot."""
        ...


SendTick = Callable[[str, int], Awaitable[None]]
"""Sends a tick for a job (its id, the time in ms) to the ticks topic, keyed by the job."""


class SystemClock:
    """The host's clocks."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class ThreadExecutor:
    """Blocking work in the event loop's default thread pool; background work as asyncio tasks."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[None]] = set()

    async def call(
        self, work: Callable[..., T], *args: Any, guard: Callable[[], T | None] | None = None
    ) -> T:
        def run() -> T:
            if guard is not None:
                answer = guard()
                if answer is not None:
                    return answer
            return work(*args)

        return await asyncio.get_running_loop().run_in_executor(None, run)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class StoredMetadata:
    """Metadata objects through :mod:`events.task.storage` (local files, object stores)."""

    def write(self, uri: str, frame: bytes) -> None:
        storage.write_bytes(uri, frame)
