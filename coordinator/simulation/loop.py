"""One seeded scheduler for the simulated workers: simulated time, an event loop per worker, and an
executor without threads.

Each simulated worker runs the production code (:class:`~coordinator.service.worker.Worker`, the
input loop, the ticker) on an asyncio event loop of its own, :class:`SimLoop`: asyncio's own loop
with the clock replaced by :class:`SimClock` and no I/O to wait for. The world runs a loop only
when it says so, so a paused worker's loop simply does not run (its timers fire late, as a
SIGSTOPped process's would), and time only moves when the world moves it: nothing waits for real
time, and from one seed everything happens in the same order every time.

Blocking work (a recovery's reads and writes) goes to :class:`SimExecutor`, the worker's
:class:`~coordinator.service.ports.Executor`: a few simulated threads that pick jobs up in order,
ask the guard when they do, and finish them at a later simulated time that the world chooses
(``finish_at``); the work itself runs then, at once, against the simulated log.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from asyncio import events
from collections import deque
from collections.abc import Callable, Coroutine
from contextvars import Context
from dataclasses import dataclass, field
from typing import Any, TypeVar, TypeVarTuple, Unpack

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

_MIN_SCHEDULED_TIMER_HANDLES = 100
_MIN_CANCELLED = 0.5
"""``asyncio.base_events``' own thresholds: when ``_run_once`` rebuilds the heap of timers."""

EPOCH_MS = 1_800_000_000_000
"""The wall clock (ms since the Unix epoch) when simulated time starts."""


class SimClock:
    """Simulated time, shared by the world and every worker: :class:`~coordinator.service.ports.Clock`.

    :attr:`now` counts seconds from the start (small floats keep their precision: the event loops
    compare timers with it), :meth:`now_ms` reads it as a wall clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def now_ms(self) -> int:
        return EPOCH_MS + int(self.now * 1000)

    def monotonic(self) -> float:
        return self.now


class _Idle:
    """A selector with nothing to select: the loop never waits for I/O."""

    def select(self, timeout: float | None) -> list[Any]:
        return []


class BusyLoop(RuntimeError):
    """A worker's loop kept running without simulated time passing (a spin)."""


class SimLoop(asyncio.BaseEventLoop):
    """An asyncio event loop on simulated time, run step by step by the world (see the module doc).

    Exceptions nobody handled (a task of the worker that died) are collected in :attr:`errors`."""

    MAX_RUNS_PER_INSTANT = 20_000
    # asyncio.BaseEventLoop's own state, which typeshed does not declare
    _ready: deque[asyncio.Handle]
    _scheduled: list[asyncio.TimerHandle]
    _timer_cancelled_count: int
    _closed: bool
    _debug: bool

    def __init__(self, clock: SimClock, name: str) -> None:
        super().__init__()
        self._clock, self.name = clock, name
        self._selector = _Idle()
        self._clock_resolution = 1e-9
        self.errors: list[str] = []
        self.set_exception_handler(self._collect)

    def time(self) -> float:
        return self._clock.now

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    # The world asks these after every event: they read the handles' slots (``_when``,
    # ``_cancelled``) rather than call their methods, for speed; the same answers, the same pops.

    def runnable(self) -> bool:
        """Is there a callback ready, or a timer due, now?"""
        if self._ready:
            return True
        scheduled = self._uncancelled_first()
        return bool(scheduled) and scheduled[0]._when <= self._clock.now  # type: ignore[attr-defined]

    def next_timer(self) -> float | None:
        """When the earliest timer is due (None: none)."""
        scheduled = self._uncancelled_first()
        return scheduled[0]._when if scheduled else None  # type: ignore[attr-defined]

    def _uncancelled_first(self) -> list[asyncio.TimerHandle]:
        """The heap of timers, the cancelled ones at its head popped (as ``_run_once`` pops them)."""
        scheduled = self._scheduled
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False  # type: ignore[attr-defined]
        return scheduled

    # asyncio's call_soon, call_later and call_at, as they are outside debug mode, without their
    # layers of calls: every future's callback and every task step goes through them (by hand,
    # for speed; a closed loop or debug mode takes asyncio's own way).

    def call_soon(
        self, callback: Callable[[Unpack[Ts]], object], *args: *Ts, context: Context | None = None
    ) -> asyncio.Handle:
        if self._closed or self._debug:
            return super().call_soon(callback, *args, context=context)
        handle = asyncio.Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def call_later(
        self,
        delay: float,
        callback: Callable[[Unpack[Ts]], object],
        *args: *Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        return self.call_at(self._clock.now + delay, callback, *args, context=context)

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[Ts]], object],
        *args: *Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        if self._closed or self._debug:
            return super().call_at(when, callback, *args, context=context)
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def run_once(self) -> None:
        """One iteration: the timers due now and the callbacks ready, as ``run_forever`` would.

        Outside debug mode, ``BaseEventLoop._run_once`` without what a loop with no I/O skips (the
        select, its timeout, the events): by hand, for speed, since the simulator runs hundreds of
        thousands of iterations. The cancelled timers are purged, the due ones made ready and the
        ready callbacks run exactly as there (the same heap operations: timers due at the same
        instant run in the same order)."""
        events._set_running_loop(self)
        try:
            if self._debug:
                asyncio.BaseEventLoop._run_once(self)  # type: ignore[attr-defined]
                return
            scheduled = self._scheduled
            count = len(scheduled)
            if count > _MIN_SCHEDULED_TIMER_HANDLES and self._timer_cancelled_count / count > _MIN_CANCELLED:
                scheduled = self._purge_cancelled()
            else:
                scheduled = self._uncancelled_first()
            ready = self._ready
            end_time = self._clock.now + self._clock_resolution
            while scheduled:
                if scheduled[0]._when >= end_time:  # type: ignore[attr-defined]
                    break
                timer = heapq.heappop(scheduled)
                timer._scheduled = False  # type: ignore[attr-defined]
                ready.append(timer)
            for _ in range(len(ready)):
                handle = ready.popleft()
                if not handle._cancelled:
                    handle._run()
        finally:
            events._set_running_loop(None)

    def _purge_cancelled(self) -> list[asyncio.TimerHandle]:
        """Drop every cancelled timer and rebuild the heap, as ``_run_once`` does when they are many."""
        kept = []
        for timer in self._scheduled:
            if timer._cancelled:
                timer._scheduled = False  # type: ignore[attr-defined]
            else:
                kept.append(timer)
        heapq.heapify(kept)
        self._scheduled = kept
        self._timer_cancelled_count = 0
        return kept

    def run_now(self) -> None:
        """Run until nothing is ready and no timer is due at this instant."""
        runs = 0
        while self.runnable():
            self.run_once()
            runs += 1
            if runs > self.MAX_RUNS_PER_INSTANT:
                raise BusyLoop(f"{self.name}'s event loop ran {runs} times without time passing")

    def _collect(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exception = context.get("exception")
        if isinstance(exception, asyncio.CancelledError):
            return
        detail = f"{type(exception).__name__}: {exception}" if exception is not None else ""
        self.errors.append(f"{context.get('message', 'error')} {detail}".strip())


@dataclass(slots=True)
class Job:
    """One piece of blocking work handed to a :class:`SimExecutor`."""

    work: Callable[..., Any]
    args: tuple[Any, ...]
    guard: Callable[[], Any] | None
    future: asyncio.Future[Any]
    started: bool = False

    @property
    def kind(self) -> str:
        """The work's name (``read_snapshot``, ``fold_journal``, ...): its cost depends on it."""
        return getattr(self.work, "__name__", type(self.work).__name__)


@dataclass(slots=True)
class Threads:
    """A simulated thread pool: jobs wait in order for one of ``size`` threads."""

    size: int
    queue: deque[Job] = field(default_factory=deque)
    running: int = 0
    started: list[Job] = field(default_factory=list)
    """The jobs running now (their guard asked, their work not yet done)."""


class SimExecutor:
    """A worker's :class:`~coordinator.service.ports.Executor` without threads (see the module doc).

    ``schedule(delay, action)`` is the world's: it runs ``action`` ``delay`` simulated seconds
    from now, or later while the worker is paused. ``cost(job)`` says how long a job takes."""

    def __init__(
        self,
        loop: SimLoop,
        threads: int,
        schedule: Callable[[float, Callable[[], None]], None],
        cost: Callable[[Job], float],
    ) -> None:
        self.loop, self.threads = loop, Threads(threads)
        self._schedule, self._cost = schedule, cost
        self._tasks: set[asyncio.Task[None]] = set()

    async def call(
        self, work: Callable[..., T], *args: Any, guard: Callable[[], T | None] | None = None
    ) -> T:
        future: asyncio.Future[T] = self.loop.create_future()
        self.threads.queue.append(Job(work, args, guard, future))
        self._schedule(0.0, self._start_jobs)
        return await future

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    @property
    def busy(self) -> int:
        """Jobs queued or running."""
        return len(self.threads.queue) + self.threads.running

    def queued_kinds(self) -> list[str]:
        return [job.kind for job in self.threads.queue]

    def _start_jobs(self) -> None:
        threads = self.threads
        while threads.queue and threads.running < threads.size:
            job = threads.queue.popleft()
            if job.future.done():
                continue  # the task that waited for it was cancelled
            threads.running += 1
            job.started = True
            threads.started.append(job)
            if job.guard is not None:
                answer = job.guard()
                if answer is not None:
                    self._finish(job, answer, None)
                    continue
            self._schedule(self._cost(job), lambda job=job: self._run(job))  # type: ignore[misc]

    def _run(self, job: Job) -> None:
        try:
            result = job.work(*job.args)
        except Exception as exc:
            self._finish(job, None, exc)
        else:
            self._finish(job, result, None)

    def _finish(self, job: Job, result: Any, error: Exception | None) -> None:
        self.threads.running -= 1
        self.threads.started.remove(job)
        if not job.future.done():
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result)
        self._start_jobs()


class Scheduler:
    """The world's own events, in simulated time order (ties in the order they were scheduled)."""

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (max(when, self.clock.now), next(self._seq), action))

    def after(self, delay: float, action: Callable[[], None]) -> None:
        self.at(self.clock.now + max(0.0, delay), action)

    def next_time(self) -> float | None:
        return self._events[0][0] if self._events else None

    def pop_due(self) -> Callable[[], None] | None:
        if self._events and self._events[0][0] <= self.clock.now:
            return heapq.heappop(self._events)[2]
        return None
