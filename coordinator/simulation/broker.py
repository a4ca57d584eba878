"""The simulated broker: an in-memory log, and the ports a worker reaches Kafka through.

:class:`Log` holds every topic of a prefix as lists of :class:`Entry` (a
:class:`~events.kafka.log.LogMessage`, exactly the bytes and headers the production code writes,
and, for checking only, which worker wrote it). The worker's ports over it:

- :class:`SimRecovery`: :class:`~coordinator.service.claims.PartitionRecovery` itself, its three
  Kafka methods (the last snapshot, the journal from an offset, an append) reading and writing
  the log: the fold, the fencing, the claim and the read to it are the production code's.
- :class:`SimWrites`: journal records, barriers and dead letters land after a delay the world
  chooses, or fail; snapshots likewise.
- :class:`SimWatch`: the journal watcher, reading what landed in the partitions it tails.
- :class:`SimConsumer`: a consumer of the input topics in a group, as Faust's: assigned
  partitions start at the group's committed offsets, batches are handed to the input loop one at
  a time, the offsets the loop acks are committed periodically, a rewind hands records again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordinator.core.snapshot import PartitionSnapshot
from coordinator.service.claims import (
    PartitionRecovery,
    StoredSnapshot,
    claim_of,
    snapshot_message,
    stored_snapshot,
)
from coordinator.service.runtime import Outgoing
from coordinator.service.writer import Written
from coordinator.simulation.oracle import RecoveryReads
from events.kafka.log import LogMessage
from events.wire.codec import DecodeError, default_codec
from events.wire.fencing import HeaderDict, epoch_of
from events.wire.records import CoordinatorClaimed
from events.wire.topics import Topics

if TYPE_CHECKING:
    from coordinator.core.ownership import Claim
    from coordinator.simulation.loop import SimClock


@dataclass(slots=True)
class Entry:
    """One message of the simulated log."""

    message: LogMessage
    writer: str
    """Who wrote it (a worker's id; ``job`` for the jobs' own inputs): for checking only."""
    landed: float
    """The simulated time it landed."""


class Log:
    """Every topic of one prefix, in memory: ``topic -> partition -> entries`` in offset order."""

    def __init__(self, topics: Topics, partitions: int, clock: SimClock) -> None:
        self.topics, self.partitions, self.clock = topics, partitions, clock
        names = [*topics.all, *topics.internal]
        self.data: dict[str, list[list[Entry]]] = {name: [[] for _ in range(partitions)] for name in names}
        self.listeners: list[Callable[[Entry], None]] = []
        """Told of every message as it lands."""

    def append(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes]] = (),
        writer: str = "",
    ) -> int:
        entries = self.data[topic][partition]
        offset = len(entries)
        message = LogMessage(topic, partition, offset, self.clock.now_ms(), key, value, HeaderDict(headers))
        entry = Entry(message, writer, self.clock.now)
        entries.append(entry)
        for listener in self.listeners:
            listener(entry)
        return offset

    def end(self, topic: str, partition: int) -> int:
        """The offset the next message of ``topic[partition]`` gets."""
        return len(self.data[topic][partition])

    def entries(self, topic: str, partition: int) -> list[Entry]:
        return self.data[topic][partition]

    def compact_snapshots(self) -> None:
        """The compacted snapshots topic keeps one message per key (each partition has one key)."""
        for entries in self.data[self.topics.snapshots]:
            del entries[:-1]


class SimRecovery(PartitionRecovery):
    """:class:`PartitionRecovery` over the simulated log (see the module doc); ``reads`` says what
    it read, for the bounded-recovery invariant."""

    def __init__(
        self,
        log: Log,
        worker_id: str,
        partition: int,
        clock: SimClock,
        unreadable: Callable[[int], bool] = lambda partition: False,
    ) -> None:
        super().__init__(
            "simulated",
            log.topics,
            log.topics.snapshots,
            log.partitions,
            partition,
            worker_id,
            timeout=None,
            now_ms=clock.now_ms,
        )
        self._log, self._unreadable = log, unreadable
        self.reads = RecoveryReads(partition)
        self.closed = False

    def _latest_snapshot(self) -> tuple[StoredSnapshot | None, int]:
        if self._unreadable(self.partition):
            raise TimeoutError(f"simulated: the snapshots of partition {self.partition} do not answer")
        entries = self._log.entries(self._log.topics.snapshots, self.partition)
        if not entries:
            return None, 0
        self.reads.snapshot_reads += 1
        stored = stored_snapshot(entries[-1].message)  # the last message, as the real read finds it
        if stored is not None:
            self.reads.base_offset = stored.journal_offset
        return stored, 1

    def _journal(self, start: int | None, until: int | None) -> Generator[LogMessage, None, None]:
        entries = self._log.entries(self._log.topics.checkpoints, self.partition)
        end = len(entries) if until is None else min(len(entries), until + 1)
        for offset in range(start or 0, end):
            if self.reads.lowest_offset is None:
                self.reads.lowest_offset = offset
            self.reads.records += 1
            yield entries[offset].message

    def _append(self, value: bytes, headers: list[tuple[str, bytes]]) -> int:
        return self._log.append(
            self._log.topics.checkpoints, self.partition, None, value, headers, writer=self.worker_id
        )

    def close(self) -> None:
        self.closed = True


Schedule = Callable[[float, Callable[[], None]], None]
"""The world's: run an action after a delay (simulated seconds)."""


class SimWrites:
    """A worker's :class:`~coordinator.service.ports.Writes` over the log.

    ``landing(topic, partition)`` is the world's: how long until a write there lands, and whether
    it fails (``"lost"``: nothing lands; ``"unanswered"``: it lands, and the writer hears it failed).
    """

    def __init__(
        self,
        log: Log,
        worker_id: str,
        home: Callable[[bytes | None], int],
        schedule: Schedule,
        landing: Callable[[str, int], tuple[float, str | None]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.log, self.worker_id, self.home = log, worker_id, home
        self._schedule, self._landing, self._loop = schedule, landing, loop
        self.in_flight = 0
        """Writes handed over and not yet answered."""

    async def write(self, messages: Sequence[Outgoing]) -> Written:
        future: asyncio.Future[Written] = self._loop.create_future()
        groups: dict[tuple[str, int], list[Outgoing]] = {}
        for message in messages:
            partition = max(0, self.home(message.key))
            groups.setdefault((message.topic, partition), []).append(message)
        written = Written()
        delays = {where: self._landing(*where) for where in groups}
        remaining = [len(groups)]
        self.in_flight += 1

        def land(where: tuple[str, int]) -> None:
            _, problem = delays[where]
            if problem != "lost":
                for message in groups[where]:
                    offset = self.log.append(
                        *where, message.key, message.value, message.headers, self.worker_id
                    )
                    written.last_offsets[where] = offset
            if problem is not None:
                written.failed[where] = f"simulated: the write was {problem}"
            remaining[0] -= 1
            if remaining[0] == 0:
                self.in_flight -= 1
                if not future.done():
                    future.set_result(written)

        if not groups:
            self.in_flight -= 1
            return written
        for where in groups:  # one partition's records land in order, as one produce request
            self._schedule(delays[where][0], lambda where=where: land(where))  # type: ignore[misc]
        return await future

    async def write_snapshot(self, snapshot: PartitionSnapshot) -> bool:
        key, value, headers = snapshot_message(snapshot, self.log.partitions)
        delay, problem = self._landing(self.log.topics.snapshots, snapshot.partition)
        future: asyncio.Future[bool] = self._loop.create_future()

        def land() -> None:
            if problem != "lost":
                self.log.append(
                    self.log.topics.snapshots, snapshot.partition, key, value, headers, self.worker_id
                )
            if not future.done():
                future.set_result(problem is None)

        self._schedule(delay, land)
        return await future


class SimWatch:
    """A worker's journal watcher (:class:`~coordinator.service.ports.Watch`) over the log: what
    lands in a tailed partition reaches the worker after ``latency()`` simulated seconds, as
    the claims read and the position read to (``deliver`` is the worker's ``journal_read``, run
    on its loop)."""

    def __init__(
        self,
        log: Log,
        schedule: Schedule,
        latency: Callable[[], float],
        deliver: Callable[[int, list[Claim], int], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.log, self._schedule, self._latency, self._deliver, self._loop = (
            log,
            schedule,
            latency,
            deliver,
            loop,
        )
        self.watched: dict[int, int] = {}
        self._due: set[int] = set()
        self._codec = default_codec()
        self.polled_at: dict[int, float] = {}
        """Partition -> when the watcher last read it (for the step-down invariant)."""

    def watch(self, partition: int, start: int) -> None:
        self.watched[partition] = max(0, start)
        self.poll_soon(partition)

    def unwatch(self, partition: int) -> None:
        self.watched.pop(partition, None)

    def poll_soon(self, partition: int) -> None:
        """Something landed in ``partition`` (or it is watched anew): read it after the latency."""
        if partition in self.watched and partition not in self._due:
            self._due.add(partition)
            self._schedule(self._latency(), lambda: self._poll(partition))

    def _poll(self, partition: int) -> None:
        self._due.discard(partition)
        start = self.watched.get(partition)
        if start is None:
            return
        entries = self.log.entries(self.log.topics.checkpoints, partition)
        claims: list[Claim] = []
        for entry in entries[start:]:
            claim = self._claim(entry.message)
            if claim is not None:
                claims.append(claim)
        end = len(entries)
        self.watched[partition] = end
        self.polled_at[partition] = self.log.clock.now
        if end > start:
            self._loop.call_soon(self._deliver, partition, claims, end)

    def _claim(self, message: LogMessage) -> Claim | None:
        if message.value is None or message.key is not None:
            return None  # claims are unkeyed: every other journal record has its job's key
        try:
            record = self._codec.decode(message.value)
        except DecodeError:
            return None
        if isinstance(record, CoordinatorClaimed) and epoch_of(message.headers) >= 0:
            return claim_of(record, message)
        return None


@dataclass(frozen=True, slots=True)
class Fetched:
    """A record as a consumer hands it over (the fields of aiokafka's ``ConsumerRecord`` the input
    loop reads)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def fetched(message: LogMessage) -> Fetched:
    return Fetched(
        message.topic,
        message.partition,
        message.offset,
        message.timestamp_ms,
        message.key,
        message.value,
        tuple(message.headers.pairs) if isinstance(message.headers, HeaderDict) else (),  # type: ignore[arg-type]
    )


TP = tuple[str, int]


@dataclass(slots=True)
class Group:
    """The consumer group's committed offsets (what a new owner of an input partition starts at)."""

    committed: dict[TP, int] = field(default_factory=dict)


class SimConsumer:
    """A worker's consumer of the input topics (see the module doc). ``handler`` decides a batch
    and returns the records whose offsets may be committed."""

    def __init__(
        self,
        log: Log,
        group: Group,
        topics: Sequence[str],
        loop: asyncio.AbstractEventLoop,
        max_batch: int,
    ) -> None:
        self.log, self.group, self.topics, self.loop, self.max_batch = log, group, topics, loop, max_batch
        self.assigned: list[TP] = []
        self.flowing = False
        """False between a revocation and the next assignment: nothing is fetched or committed."""
        self.generation = -1
        self.position: dict[TP, int] = {}
        self.base: dict[TP, int] = {}
        """Per partition, the committed offset this consumer counts its acks from."""
        self.acked: dict[TP, set[int]] = {}
        self.prefetched: list[Fetched] = []
        self._ready: dict[TP, None] = {}
        """Assigned partitions that may have records past their position, in the order they got them."""
        self.rebalances = 0
        """Revocations so far (a batch decided across one is not acked)."""
        self._wake = asyncio.Event()
        self.acks: list[tuple[TP, int]] = []
        """Every (partition, offset) acked, in order (the world judges them)."""

    # ------------------------------------------------------------ the group's callbacks

    def revoke(self) -> None:
        self.flowing = False
        self.rebalances += 1
        self.assigned = []
        self._ready.clear()
        self.position.clear()
        self.base.clear()
        self.acked.clear()
        self.prefetched.clear()

    def assign(self, generation: int, partitions: Iterable[int]) -> None:
        self.generation = generation
        self.assigned = [(topic, p) for p in sorted(partitions) for topic in self.topics]
        for tp in self.assigned:
            self.position[tp] = self.base[tp] = self.group.committed.get(tp, 0)
            self.acked[tp] = set()
            self._ready[tp] = None
        self.flowing = True
        self._wake.set()

    def landed(self, tp: TP) -> None:
        """A record landed in ``tp``: fetched next, if it is assigned here."""
        if tp in self.position:
            self._ready[tp] = None
            self._wake.set()

    # ------------------------------------------------------------ the input loop's port

    def next_offset(self, topic: str, partition: int) -> int | None:
        return self.position.get((topic, partition))

    def committed(self, topic: str, partition: int) -> int | None:
        return self.base.get((topic, partition))

    async def rewind(self, topic: str, partition: int, offset: int) -> None:
        tp = (topic, partition)
        if tp not in self.position:
            return
        target = offset
        if target < self.base[tp] and self.flowing:
            self.group.committed[tp] = target  # the committed offset goes back at once
        self.position[tp] = target
        self.acked[tp] = {o for o in self.acked[tp] if o < target}
        self.base[tp] = min(self.base[tp], target)
        self.prefetched = [r for r in self.prefetched if (r.topic, r.partition) != tp]
        self._ready[tp] = None

    def prefetch(self) -> None:
        if not self.prefetched:
            self.prefetched = self._take()

    # ------------------------------------------------------------ fetching and committing

    async def fetch(self, timeout: float) -> list[Fetched]:
        """The next batch: what was prefetched, or what is there now, or what lands within
        ``timeout`` (an empty batch when nothing does)."""
        if self.prefetched:
            batch, self.prefetched = self.prefetched, []
            return batch
        batch = self._take()
        if batch:
            return batch
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            return []
        return self._take()

    def _take(self) -> list[Fetched]:
        if not self.flowing:
            return []
        batch: list[Fetched] = []
        for tp in list(self._ready):
            entries = self.log.entries(*tp)
            start = self.position[tp]
            taken = entries[start : start + self.max_batch - len(batch)]
            batch.extend(fetched(e.message) for e in taken)
            self.position[tp] = end = start + len(taken)
            if end >= len(entries):
                del self._ready[tp]
            if len(batch) >= self.max_batch:
                break
        return batch

    def ack(self, records: Iterable[Fetched]) -> None:
        for record in records:
            tp = (record.topic, record.partition)
            acked = self.acked.get(tp)
            if acked is not None and record.offset >= self.base[tp]:
                acked.add(record.offset)
                self.acks.append((tp, record.offset))

    def commit(self, member: bool) -> dict[TP, int]:
        """Commit, per partition, the offset after the acked run from the committed one (as Faust
        does: nothing past an offset not acked); what was committed. The group refuses the commit
        of a consumer that is not ``member`` of its current generation (it was expelled)."""
        if not self.flowing or not member:
            return {}
        committed = {}
        for tp in self.assigned:
            base, acked = self.base[tp], self.acked[tp]
            start = base
            while base in acked:
                acked.discard(base)
                base += 1
            if base != start or self.group.committed.get(tp, 0) != base:
                self.base[tp] = base
                self.group.committed[tp] = base
                committed[tp] = base
        return committed
