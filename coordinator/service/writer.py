"""The coordinator's writes (journal, barriers, dead letters) through a confluent-kafka producer.

Faust's own producer is aiokafka's: it builds each record batch in Python on the event loop, and
it sends only when the loop turns, one request at a time. The coordinator decides on that same
loop, so the broker stored a batch of journal records while the loop waited for it, and the
loop decided while the broker waited. librdkafka sends from its own threads: ``produce()`` hands
a record to its queue and returns, the request goes out at once, and the loop decides the
next inputs meanwhile (``docs/benchmarks.md`` and its git history).

Order is kept as the journal needs it: records to one partition are sent in the order they were
handed over, and a retried request cannot overtake a later one (idempotence where the broker
supports it, one request in flight per connection where it does not). The caller hands over the
next writes only after the previous ones were answered, so a write that fails for good is never
followed by a later one that lands. Faust keeps its producer for everything else (snapshots,
ticks); its flush before an offset commit does not cover these writes, and need not: an input's
offset is acked only after the writes it caused were answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from coordinator.core.encoding import Outgoing
from events.kafka.clients import producer_config
from events.wire.sizes import TopicLimits

log = logging.getLogger("cutline.coordinator")

DELIVERY_TIMEOUT_MS = 30_000
"""A write not acknowledged within this time fails (librdkafka's ``message.timeout.ms``)."""

POLL_S = 0.05
"""How long the writer's thread waits for delivery reports in one poll (it wakes when one comes)."""


@dataclass
class Written:
    """What the broker answered for one :meth:`Writer.write`."""

    failed: dict[tuple[str, int], str] = field(default_factory=dict)
    """(topic, partition) → the first error, for every partition with a write that failed."""
    last_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    """(topic, partition) → the offset of the last record written there."""


@dataclass
class _Pending:
    """One write in flight: the records not yet answered, counted down by the delivery reports
    (in the writer's thread) and by :meth:`Writer.write` itself (refusals, and the end of handing
    over), under a lock."""

    future: asyncio.Future[Written]
    loop: asyncio.AbstractEventLoop
    home: Callable[[bytes | None], int]
    outstanding: int
    written: Written = field(default_factory=Written)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def delivered(self, error: KafkaError | None, message: Message) -> None:
        """A delivery report."""
        partition = message.partition()
        if partition is None or partition < 0:  # failed before it was given a partition
            partition = self.home(message.key())
        where = (message.topic() or "", partition)
        with self.lock:
            if error is not None:
                self.written.failed.setdefault(where, str(error))
            else:
                offset = message.offset()
                if offset is not None and offset > self.written.last_offsets.get(where, -1):
                    self.written.last_offsets[where] = offset
            self._count_down()

    def refused(self, where: tuple[str, int], error: str) -> None:
        """A record the producer would not take at all."""
        with self.lock:
            self.written.failed.setdefault(where, error)
            self._count_down()

    def handed_over(self) -> None:
        with self.lock:
            self._count_down()

    def _count_down(self) -> None:
        self.outstanding -= 1
        if self.outstanding == 0:
            with contextlib.suppress(RuntimeError):  # a closed loop (shutdown): nobody waits
                self.loop.call_soon_threadsafe(_resolve, self.future, self.written)


def _resolve(future: asyncio.Future[Written], written: Written) -> None:
    if not future.done():
        future.set_result(written)


class Writer:
    """A librdkafka producer and a thread that serves its delivery reports.

    :meth:`write` hands records over and returns a future that completes once the broker has
    answered for every one of them. Not meant for concurrent writes that must keep an order
    between them: await one before the next.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        idempotent: bool,
        home: Callable[[bytes | None], int],
        limits: TopicLimits | None = None,
    ) -> None:
        """``home`` gives the partition of the job a record is keyed by: where a failure counts
        when the record never got a partition of its own. A record over its topic's
        ``max.message.bytes`` (``limits``, read from the cluster at start) is never sent: it is
        refused at once, a failed write (the runtime admits no decision that would make one, so
        this is the last line, not the rule)."""
        self._limits = limits or TopicLimits()
        largest = max([self._limits.default, *self._limits.limits.values()])
        ordering: dict[str, Any] = (
            {"enable.idempotence": True} if idempotent else {"max.in.flight.requests.per.connection": 1}
        )
        # A write the broker has not taken within DELIVERY_TIMEOUT_MS fails (its partition then
        # recovers and the batch is decided again) instead of holding every decision for
        # librdkafka's default five minutes.
        config = {**ordering, "message.timeout.ms": DELIVERY_TIMEOUT_MS, "message.max.bytes": largest + 1024}
        self._producer = Producer(producer_config(bootstrap, extra=config))
        self._home = home
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="cutline-writer", daemon=True)
        self._thread.start()

    def write(self, messages: Sequence[Outgoing]) -> asyncio.Future[Written]:
        """Produce ``messages`` in order (keyed records go where Faust and Java put them)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Written] = loop.create_future()
        # One count per record, and one more until every record is handed over.
        pending = _Pending(future, loop, self._home, outstanding=len(messages) + 1)
        try:
            for message in messages:
                size = self._limits.over(message.topic, message.key, message.value, message.headers)
                if size is not None:
                    pending.refused(
                        (message.topic, self._home(message.key)),
                        f"a record of {size} bytes is over {message.topic}'s max.message.bytes "
                        f"({self._limits.of(message.topic)}): not sent",
                    )
                    continue
                try:
                    self._produce(message, pending.delivered)
                except (KafkaException, BufferError, ValueError, TypeError) as exc:
                    # Refused at once (too large, unknown topic, queue full for too long): a failed
                    # write like any other, against the partition that holds the record's job.
                    pending.refused((message.topic, self._home(message.key)), repr(exc))
        finally:
            pending.handed_over()
        return future

    def _produce(self, message: Outgoing, on_delivery: Callable[[KafkaError | None, Message], None]) -> None:
        deadline: float | None = None  # set at the first BufferError: the clock is not read per record
        while True:
            try:
                self._producer.produce(
                    message.topic,
                    key=message.key,
                    value=message.value,
                    headers=list(message.headers),
                    on_delivery=on_delivery,
                )
                return
            except BufferError:  # the local queue is full: the writer's thread is draining it
                now = time.monotonic()
                deadline = now + 5.0 if deadline is None else deadline
                if now > deadline:
                    raise
                time.sleep(0.005)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self._producer.poll(POLL_S)
            except Exception:  # pragma: no cover - a report callback failed: say so, keep serving
                log.exception("the coordinator's writer could not serve a delivery report")

    def close(self, timeout: float = 10.0) -> None:
        """Wait up to ``timeout`` s for the records in flight, then stop the thread."""
        left = self._producer.flush(timeout)
        if left:
            log.warning("%d coordinator writes were still in flight at shutdown", left)
        self._stop.set()
        self._thread.join(timeout)
