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
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from coordinator.service.ports import Clock, InputConsumer, SendTick
from coordinator.service.runtime import Outcome
from coordinator.service.worker import Worker
from events.wire.topics import Topics

log = logging.getLogger("cutline.coordinator")

SLOW_BATCH_S = 1.0
"""A batch of input that took longer than this from its fetch to its durable journal writes, or
whose oldest message was older than this when fetched, is logged (with where the time went)."""

TICK_RESEND_MS = 1000
"""A tick not decided within this is sent again."""

IDLE_TICK_S = 1.0
"""Longest a worker sleeps between two looks at its jobs' due times. A due time moves with a decided
batch or a partition merged or dropped, and each wakes the ticker (:attr:`Ticker.due_moved`); this
only bounds what nothing announced."""


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


class InputLoop:
    """Decides batches of fetched records for the partitions the worker decides, and publishes.

    Only the records of partitions decided here under a claim are decided; the others wait, not
    acked (a partition being recovered holds up nothing else). Each time a partition starts being
    decided under a new claim, its input partitions are first rewound to the position the journal
    reflects (``Coordinator.positions``: one past the last input a valid journal record names), if
    the consumer is past it: inputs handed over while the partition was recovered, stepped down,
    or decided under a claim that a late claim voided are decided again, in order, before any
    later one (docs/coordinator.md, "A late claim loses no input")."""

    def __init__(
        self,
        worker: Worker,
        clock: Clock,
        topics: Topics,
        *,
        consumer: InputConsumer | None = None,
        on_decided: Callable[[], object] = lambda: None,
        on_tick: Callable[[str], object] = lambda job_id: None,
    ) -> None:
        self.worker, self.runtime, self.clock = worker, worker.runtime, clock
        self.ticks_topic, self.input_topics = topics.ticks, topics.inputs
        self.consumer = consumer
        self.on_decided, self.on_tick = on_decided, on_tick
        self.rewinds = 0
        """Input partitions rewound so far (for metrics and tests)."""
        self._synced: dict[int, int] = {}
        """Partition -> the claim epoch its inputs were last brought in line with the journal for."""

    async def decide_batch(self, records: Sequence[Any]) -> list[Any]:
        """Decide ``records`` (in order per partition) of the partitions this worker decides, publish
        their journal records and wait until the broker holds them; the records whose offsets may be
        committed now: those decided under a claim the worker still holds after the writes, and
        ticks. A partition whose write failed recovers, and its records come again (a rewind).
        An empty batch brings the partitions that started being decided in line (a rewind)."""
        clock, worker = self.clock, self.worker
        arrived = clock.monotonic()
        async with worker.publish_lock:
            held_back = await self._bring_in_line(records)
            deciding = clock.monotonic()
            chosen = self._chosen(records, held_back)
            outcomes = self.decide_all(chosen)
            decided = clock.monotonic()
            if outcomes and self.consumer is not None:
                self.consumer.prefetch()  # the next batch comes in while the journal is written
            failed = await worker.publish(outcomes) if outcomes else set()
        for partition in sorted(failed):
            worker.write_failed(partition, "a journal write failed")
        if records:
            report_slow_batch(records, arrived, deciding, decided, clock.monotonic(), clock.now_ms())
        return self._committable(records, chosen, failed)

    async def _bring_in_line(self, records: Sequence[Any]) -> set[tuple[str, int]]:
        """Rewind the input partitions of each partition decided under a claim not yet brought in
        line; the input partitions whose records in ``records`` were handed over before a rewind."""
        held_back: set[tuple[str, int]] = set()
        owners = {p: self.worker.epoch_of(p) for p in self.worker.owners}
        for partition in [p for p in self._synced if p not in owners]:
            del self._synced[partition]
        for partition, epoch in sorted(owners.items()):
            if epoch is None or self._synced.get(partition) == epoch:
                continue
            if self.consumer is not None:
                held_back |= await self._rewind(partition, records)
            if self.worker.epoch_of(partition) == epoch:
                self._synced[partition] = epoch
        return held_back

    async def _rewind(self, partition: int, records: Sequence[Any]) -> set[tuple[str, int]]:
        assert self.consumer is not None
        rewound = set()
        for topic in self.input_topics:
            reflected = self.runtime.positions.get((topic, partition))
            target = 0 if reflected is None else reflected + 1
            committed = self.consumer.committed(topic, partition)
            if committed is not None:
                # Records handed over below the journal's position while the partition was not
                # decided here were not acked: from the committed offset, they are (as decided).
                target = min(target, committed)
            first = min(
                (r.offset for r in records if r.partition == partition and r.topic == topic), default=None
            )
            position = first if first is not None else self.consumer.next_offset(topic, partition)
            if position is not None and position > target:
                log.info(
                    "journal partition %d decided under a new claim: %s[%d] rewound from %d to %d "
                    "(the journal reflects the inputs before it)",
                    partition,
                    topic,
                    partition,
                    position,
                    target,
                )
                await self.consumer.rewind(topic, partition, target)
                self.rewinds += 1
                rewound.add((topic, partition))
        return rewound

    def _chosen(self, records: Sequence[Any], held_back: set[tuple[str, int]]) -> list[tuple[Any, int]]:
        """The records to decide now, with the epoch each is decided under."""
        chosen = []
        synced, epoch_of = self._synced, self.worker.epoch_of
        for record in records:
            epoch = epoch_of(record.partition)
            if epoch is None or synced.get(record.partition) != epoch:
                continue  # not decided here (yet): its records come again when it is
            if (record.topic, record.partition) in held_back:
                continue  # handed over before a rewind: it comes again, in order
            chosen.append((record, epoch))
        return chosen

    def _committable(
        self, records: Sequence[Any], chosen: list[tuple[Any, int]], failed: set[int]
    ) -> list[Any]:
        epoch_of, ticks = self.worker.epoch_of, self.ticks_topic
        committable = [
            record
            for record, epoch in chosen
            if record.topic != ticks
            and record.partition not in failed
            and epoch_of(record.partition) == epoch
        ]
        # A tick only asks "is anything due?": one not decided here needs no second chance.
        return committable + [record for record in records if record.topic == ticks]

    def decide_all(self, chosen: Sequence[tuple[Any, int]]) -> list[Outcome]:
        outcomes = []
        with self.runtime.batch():  # one view of the file system for the batch's link checks
            for record, epoch in chosen:
                outcome = self.decide(record, epoch)
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
        self.on_tick(job_id)
        if job_id not in self.runtime.states:
            return None  # a job of a partition this worker no longer (or not yet) holds
        return self.runtime.tick(job_id, self.clock.now_ms(), epoch=epoch)


class Ticker:
    """Sends ticks for the jobs that are due (every worker ticks the jobs it holds): one tick a
    job is on its way at a time, until the input loop decided it (:meth:`decided`), or for
    :data:`TICK_RESEND_S` (it went to a partition no longer decided here, say)."""

    def __init__(self, worker: Worker, clock: Clock, send: SendTick, interval: float) -> None:
        self.runtime, self.clock, self.send, self.interval = worker.runtime, clock, send, interval
        self.ticked: dict[str, int] = {}
        """Job -> when its tick on the way was sent (ms)."""
        self.due_moved = asyncio.Event()

    def decided(self, job_id: str) -> None:
        """A tick of ``job_id`` was decided: the next one may go."""
        self.ticked.pop(job_id, None)

    async def run(self, should_stop: Callable[[], bool]) -> None:
        """Tick the jobs that are due (:meth:`send_ticks`), then sleep until the next due time: at
        least ``interval``, at most :data:`IDLE_TICK_S`, and less when a decided batch or a
        partition merged or dropped may have moved a due time (:attr:`due_moved`). An idle worker
        wakes once a second: the wakes cost it more CPU than anything else it does while idle."""
        interval, clock = self.interval, self.clock
        while not should_stop():
            looked = clock.monotonic()
            await self.send_ticks()
            self.due_moved.clear()
            next_at = self.runtime.next_due_at()
            wait = IDLE_TICK_S if next_at is None else (next_at - clock.now_ms()) / 1000
            # not contextlib.suppress: this runs every few milliseconds, and a try costs less
            try:  # noqa: SIM105
                await asyncio.wait_for(self.due_moved.wait(), min(IDLE_TICK_S, max(interval, wait)))
            except TimeoutError:
                pass
            rest = interval - (clock.monotonic() - looked)  # never more than one look per interval
            if rest > 0:
                await asyncio.sleep(rest)

    async def send_ticks(self) -> None:
        """A tick for each job due now, unless one is on its way (a tick decides nothing unless due).

        A tick is decided after the input before it: while the worker is behind, a due job stays
        due, and a tick every 50 ms (as before) added to the backlog it waited behind."""
        now = self.clock.now_ms()
        ticked = self.ticked
        if len(ticked) > 2 * len(self.runtime.states) + 16:
            for job_id in [j for j in ticked if j not in self.runtime.states]:
                del ticked[job_id]
        for job_id in self.runtime.due(now):
            sent = ticked.get(job_id)
            if sent is not None and sent + TICK_RESEND_MS > now:
                continue  # the last tick is still on its way
            ticked[job_id] = now
            await self.send(job_id, now)
