"""Input decided in batches, and ticks: what a worker does with what its consumer hands it.

A batch of fetched records (of the input topics and the ticks topic) goes through the same few
steps: decode → decide → evolve the per-job state → append to the journal (the runtime,
:class:`coordinator.service.runtime.Coordinator`, does the first three in memory; the worker
publishes), and only then are its offsets committable. :class:`InputLoop` does that for the
partitions the :class:`~coordinator.service.worker.Worker` decides; :class:`Ticker` turns the
clock into ticks for the jobs that are due.

Transport-independent: the Faust shell (:mod:`coordinator.service.app`) hands it Faust's batches
and a :class:`~coordinator.service.direct.DirectConsumer`; the simulator
(:mod:`coordinator.simulation`) its own, through the ports of :mod:`coordinator.service.ports`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from coordinator.service.ports import Clock, SendTick
from coordinator.service.runtime import Outcome
from coordinator.service.worker import Worker

log = logging.getLogger("cutline.coordinator")

SLOW_BATCH_S = 1.0
"""A batch of input that took longer than this from its fetch to its durable journal writes, or
whose oldest message was older than this when fetched, is logged (with where the time went)."""

IDLE_TICK_S = 0.1
"""Longest a worker sleeps between two looks at its jobs' due times: a due time that moved without a
decided batch (a recovered or dropped partition) is seen within this."""


class Fetched(Protocol):
    """A fetched record as the input loop reads it (aiokafka's ``ConsumerRecord`` is one)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def timestamp(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def headers(self) -> Any: ...


def report_slow_batch(
    messages: Sequence[Any],
    arrived: float,
    deciding: float,
    decided: float,
    published: float,
    now_ms: int,
) -> None:
    """Log a batch that waited, or whose journal writes took, more than ``SLOW_BATCH_S``: a checkpoint
    then completes that much later, and the log says in which step (an input that reached the
    broker late shows as its age at the fetch: the message's CreateTime against ``now_ms``, the
    wall clock when its writes were acknowledged)."""
    fetched_at = now_ms / 1000 - (published - arrived)  # the wall clock when the batch arrived
    timestamps = [m.timestamp for m in messages if getattr(m, "timestamp", None)]  # CreateTime, ms
    age = fetched_at - min(timestamps) / 1000 if timestamps else 0.0
    if max(published - arrived, age) <= SLOW_BATCH_S:
        return
    log.warning(
        "slow batch of %d inputs (first %s[%d]@%d): %.2f s old when fetched, %.2f s waiting for its "
        "partitions and the publish lock, %.2f s deciding, %.2f s until the journal writes were acked",
        len(messages),
        messages[0].topic,
        messages[0].partition,
        messages[0].offset,
        age,
        deciding - arrived,
        decided - deciding,
        published - decided,
    )


class Prefetch(Protocol):
    def prefetch(self) -> None:
        """Start fetching the next batch now (the journal writes of this one are under way)."""
        ...


class InputLoop:
    """Decides batches of fetched records for the partitions the worker decides, and publishes."""

    def __init__(
        self,
        worker: Worker,
        clock: Clock,
        ticks_topic: str,
        *,
        consumer: Prefetch | None = None,
        pending: Callable[[int], bool] = lambda partition: False,
        patience: float = 12.0,
        on_decided: Callable[[], object] = lambda: None,
    ) -> None:
        self.worker, self.runtime, self.clock = worker, worker.runtime, clock
        self.ticks_topic = ticks_topic
        self.consumer = consumer
        self.pending, self.patience, self.on_decided = pending, patience, on_decided

    async def decide_batch(self, messages: Sequence[Any]) -> None:
        """Decide ``messages`` in order for the partitions this worker decides, publish, and go on
        once the writes are acknowledged; a partition whose write failed recovers, and the batch is
        decided again (what the journal already holds is skipped: ``Coordinator.already_decided``)."""
        clock = self.clock
        arrived = clock.monotonic()
        partitions = {m.partition for m in messages}
        failures = 0
        while True:
            await self.worker.settle(partitions, self.pending, patience=self.patience)
            async with self.worker.publish_lock:
                if any(self.worker.holds(p) and self.worker.epoch_of(p) is None for p in partitions):
                    continue  # a partition started recovering (or stepped down) meanwhile
                deciding = clock.monotonic()
                outcomes = self.decide_all(messages)
                decided = clock.monotonic()
                if self.consumer is not None:
                    self.consumer.prefetch()  # the next batch comes in while the journal is written
                failed = await self.worker.publish(outcomes)
            report_slow_batch(messages, arrived, deciding, decided, clock.monotonic(), clock.now_ms())
            if not failed:
                return
            for partition in failed:
                self.worker.write_failed(partition, "a journal write failed")
            failures += 1
            # A write that keeps failing (a broker refusing the record) must not spin: back off.
            await asyncio.sleep(min(30.0, 0.25 * 2**failures))

    def decide_all(self, messages: Sequence[Any]) -> list[Outcome]:
        outcomes = []
        with self.runtime.batch():  # one view of the file system for the batch's link checks
            for message in messages:
                epoch = self.worker.epoch_of(message.partition)
                if epoch is None:
                    continue  # not decided here: its owner decides it
                outcome = self.decide(message, epoch)
                if outcome is not None:
                    outcomes.append(outcome)
        if outcomes:
            self.on_decided()
        return outcomes

    def decide(self, message: Any, epoch: int) -> Outcome | None:
        if message.topic == self.ticks_topic:
            return self.decide_tick(message, epoch)
        if self.runtime.already_decided(message.topic, message.partition, message.offset):
            return None
        return self.runtime.handle(
            message.topic,
            message.partition,
            message.offset,
            message.key,
            message.value,
            self.clock.now_ms(),
            headers=message.headers,
            epoch=epoch,
        )

    def decide_tick(self, message: Any, epoch: int) -> Outcome | None:
        try:
            job_id = message.key.decode()
        except (AttributeError, UnicodeDecodeError):
            log.warning(
                "tick without a job id at %s[%d]@%d skipped", message.topic, message.partition, message.offset
            )
            return None
        if job_id not in self.runtime.states:
            return None  # a job of a partition this worker no longer (or not yet) holds
        return self.runtime.tick(job_id, self.clock.now_ms(), epoch=epoch)


class Ticker:
    """Sends ticks for the jobs that are due (every worker ticks the jobs it holds)."""

    def __init__(self, worker: Worker, clock: Clock, send: SendTick, interval: float) -> None:
        self.runtime, self.clock, self.send, self.interval = worker.runtime, clock, send, interval
        self.ticked: dict[str, int] = {}
        self.due_moved = asyncio.Event()

    async def run(self, should_stop: Callable[[], bool]) -> None:
        """Tick the jobs that are due (:meth:`send_ticks`), then sleep until the next due time: at
        least ``interval``, at most :data:`IDLE_TICK_S`, and less when a decided batch may have
        moved a due time (:attr:`due_moved`). An idle worker wakes 10 times a second, not 100:
        the wakes cost it more CPU than anything else it does while idle."""
        interval, clock = self.interval, self.clock
        while not should_stop():
            looked = clock.monotonic()
            await self.send_ticks()
            self.due_moved.clear()
            next_at = self.runtime.next_due_at()
            wait = IDLE_TICK_S if next_at is None else (next_at - clock.now_ms()) / 1000
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.due_moved.wait(), min(IDLE_TICK_S, max(interval, wait)))
            rest = interval - (clock.monotonic() - looked)  # never more than one look per interval
            if rest > 0:
                await asyncio.sleep(rest)

    async def send_ticks(self) -> None:
        """A tick for each job due now; a tick decides nothing unless due."""
        now = self.clock.now_ms()
        for job_id in self.runtime.due(now):
            if self.ticked.get(job_id, 0) + 50 > now:
                continue  # the last tick is still on its way
            self.ticked[job_id] = now
            await self.send(job_id, now)
