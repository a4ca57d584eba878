"""The journal watcher: a worker reads the journal partitions it decides, for newer claims.

A worker that keeps deciding a partition after another worker claimed it writes only void
records (the fencing rule), and without reading the journal it would never notice: its views
would show the partition healthy while none of its checkpoints count. So one thread per worker
tails the journal partitions it holds, from its own claim on, and hands every claim it reads
to the worker (:class:`coordinator.core.ownership.ClaimRead`): a newer one makes the worker step
down at once. Other records are skipped by their fingerprint, without decoding them.

The position it has read to, reported with each batch's claims, is what makes a fold snapshot
safe to write: a snapshot covering journal offset X is written only once the watcher has read
past X and the worker still decides the partition under the same claim (no newer claim up to X).

The consumer belongs to the watcher's thread alone; :meth:`JournalWatcher.watch` and
:meth:`JournalWatcher.unwatch` hand it changes through a queue, and what it reads reaches the
worker's event loop through ``call_soon_threadsafe``, in the order it was read.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition

from coordinator.core.ownership import Claim
from coordinator.service.claims import claim_of
from events.kafka.client_config import fetch_wait_ms
from events.kafka.clients import consumer_config
from events.kafka.log import log_message
from events.wire.codec import DecodeError, default_codec
from events.wire.fencing import epoch_of
from events.wire.records import CoordinatorClaimed

log = logging.getLogger("cutline.coordinator")

OnRead = Callable[[int, list[Claim], int], None]
"""Told, on the worker's loop, of a partition's claims read in one fetch and the offset the
watcher will read next there."""

WATCH_FETCH_WAIT_FLOOR_MS = 50
"""The shortest wait of the watcher's fetches. The embedded broker answers a fetch that finds nothing
after half its wait (docs/embedded-broker.md), and sets ``CUTLINE_FETCH_WAIT_MS`` to 5 ms for the
worker's other consumers: at that wait the watcher would ask it 400 times a second. There a newer
claim is noticed within about 25 ms."""


def watch_fetch_wait_ms(environ: Mapping[str, str] | None = None) -> int:
    """``fetch.wait.max.ms`` of the watcher: that of the worker's other consumers
    (``CUTLINE_FETCH_WAIT_MS``, 500 ms by default), at least :data:`WATCH_FETCH_WAIT_FLOOR_MS`.

    Apache Kafka answers a waiting fetch as soon as a record arrives, so a long wait delays no claim
    the watcher reads: it only spares the broker. At a fixed 50 ms, 20 of the 24 requests a second
    that an idle worker sent its broker were the watcher's, and that broker spent 4.4 % of a core
    (1.9 % with no client); at 500 ms, 2.6 % (docs/benchmarks.md, "The test suite")."""
    return max(WATCH_FETCH_WAIT_FLOOR_MS, fetch_wait_ms(environ=environ))


def claim_fingerprints() -> frozenset[bytes]:
    """The single-object headers (magic + fingerprint) of every known ``CoordinatorClaimed`` schema."""
    return frozenset({b"\xc3\x01" + default_codec().registry.current("CoordinatorClaimed").fingerprint})


class JournalWatcher:
    """Tails journal partitions in a thread and reports the claims it reads (see the module doc)."""

    def __init__(self, bootstrap: str, topic: str, loop: asyncio.AbstractEventLoop, on_read: OnRead) -> None:
        self._bootstrap, self._topic, self._loop, self._on_read = bootstrap, topic, loop, on_read
        self._changes: queue.SimpleQueue[tuple[int, int | None]] = queue.SimpleQueue()
        self._stopped = False
        self._claims = claim_fingerprints()
        self._thread = threading.Thread(target=self._run, name="journal-watcher", daemon=True)
        self._thread.start()

    def watch(self, partition: int, start: int) -> None:
        """Read ``partition`` from offset ``start`` on (again, if it was watched)."""
        self._changes.put((partition, start))

    def unwatch(self, partition: int) -> None:
        self._changes.put((partition, None))

    def close(self) -> None:
        self._stopped = True
        self._thread.join(timeout=5)

    def _run(self) -> None:
        consumer = Consumer(
            consumer_config(self._bootstrap, extra={"fetch.wait.max.ms": watch_fetch_wait_ms()})
        )
        watched: dict[int, int] = {}
        try:
            while not self._stopped:
                if self._apply_changes(watched):
                    consumer.assign([TopicPartition(self._topic, p, o) for p, o in sorted(watched.items())])
                if not watched:
                    time.sleep(0.05)
                    continue
                self._read(consumer, consumer.consume(500, timeout=0.05), watched)
        except KafkaException:
            log.exception("the journal watcher stopped: newer claims are no longer noticed")
        finally:
            consumer.close()

    def _apply_changes(self, watched: dict[int, int]) -> bool:
        changed = False
        while True:
            try:
                partition, start = self._changes.get_nowait()
            except queue.Empty:
                return changed
            changed = True
            if start is None:
                watched.pop(partition, None)
            else:
                watched[partition] = start if start >= 0 else OFFSET_BEGINNING

    def _read(self, consumer: Consumer, messages: list[Message], watched: dict[int, int]) -> None:
        claims: dict[int, list[Claim]] = {}
        positions: dict[int, int] = {}
        for raw in messages:
            partition, value = raw.partition(), raw.value()
            if raw.error() is not None or partition not in watched:
                continue
            positions[partition] = (raw.offset() or 0) + 1
            if value is None or value[:10] not in self._claims:
                continue  # not a claim: skipped without decoding
            message = log_message(raw)
            try:
                record = default_codec().decode(value)
            except DecodeError:
                continue
            if isinstance(record, CoordinatorClaimed) and epoch_of(message.headers) >= 0:
                claim = claim_of(record, message)
                claims.setdefault(message.partition, []).append(claim)
        for partition, position in positions.items():
            watched[partition] = position
            self._loop.call_soon_threadsafe(self._on_read, partition, claims.get(partition, []), position)
