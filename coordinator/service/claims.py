"""Recovering a journal partition (docs/coordinator.md, "N workers, claims and fencing"): the Kafka I/O.

:mod:`coordinator.core.ownership` decides what a worker does with a partition; this module does the
reading and writing each of its commands asks for, one blocking step at a time (a worker runs
each in a thread), and reports what happened as the fact the state machine takes next:

- :meth:`PartitionRecovery.read_snapshot`: the partition's latest fold snapshot, loaded;
- :meth:`PartitionRecovery.fold_journal`: the journal after it, folded to its end (by offset,
  never by silence), with the highest epoch seen;
- :meth:`PartitionRecovery.write_claim`: ``CoordinatorClaimed`` with the epoch and, in the
  ``cutline.generation`` header, the group generation it claims for;
- :meth:`PartitionRecovery.read_to_claim`: the journal on up to that claim, and the claim
  that is effective there under the fencing rule.

Snapshots. One key per partition in the compacted snapshots topic (the partition number):
compaction keeps one, and a reader reads only the last message of the partition. A worker
writes a snapshot covering journal offset X only after its journal watcher has read past X
without seeing a newer claim (:mod:`coordinator.service.watcher`), so every snapshot in the
topic is a valid base, whoever wrote it: an interrupted claim leaves the previous one usable,
and recovery is never the journal from offset 0 because of a rebalance.

:func:`claim_partition` drives the whole recovery of one partition synchronously through the
same state machine (tests and benchmarks).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from coordinator.core.ownership import (
    UNKNOWN_GENERATION,
    Claim,
    ClaimSettled,
    ClaimWriteFailed,
    ClaimWritten,
    Fact,
    FoldJournal,
    JournalFolded,
    Ownership,
    PartitionsAssigned,
    Phase,
    ReadSnapshot,
    ReadToClaim,
    RecoveryFailed,
    ResendBarriers,
    SnapshotRead,
    WriteClaim,
    step,
)
from coordinator.core.snapshot import PartitionSnapshot, SnapshotError, decode_snapshot, encode_snapshot
from coordinator.service.runtime import Coordinator
from events.kafka.clients import (
    consumer_config,
    job_key,
    partition_for,
    producer_config,
    read_partition_to_end,
    watermark_offsets,
)
from events.kafka.log import LogMessage, fenced_journal, log_message
from events.wire.codec import encode
from events.wire.fencing import Fence, epoch_header, epoch_of
from events.wire.records import CoordinatorClaimed
from events.wire.topics import DEFAULT_PARTITIONS, Topics
from events.wire.vocabulary import (
    CAUSE_HEADER,
    GENERATION_HEADER,
    SNAPSHOT_OFFSET_HEADER,
    SNAPSHOT_PARTITIONS_HEADER,
)

log = logging.getLogger("cutline.coordinator")

RECOVERY_FETCH_WAIT_MS = 10
"""``fetch.wait.max.ms`` of a recovery's consumer, whatever ``CUTLINE_FETCH_WAIT_MS`` says: each of
its reads ends at the partition's end, which it learns from a fetch answer, and Apache Kafka answers
a fetch that finds nothing only after this wait. At the 500 ms users set there
(docs/usage.md), a claim's reads of an empty snapshot partition and of the journal after its
snapshot took a second; 48 claims on a worker's executor threads, 9 s (docs/embedded-broker.md,
"On Apache Kafka")."""

MISPLACED_RETRY_S = 30.0
"""Seconds between recoveries of a partition whose jobs belong elsewhere (only an operator can fix
that, so the error is logged twice a minute, not every second)."""


def new_worker_id() -> str:
    """Host, process id and a random suffix: unique per worker process."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def generation_header(generation: int) -> tuple[str, bytes]:
    return GENERATION_HEADER, b"%d" % generation


def generation_of(headers: dict[str, bytes]) -> int:
    """The generation a claim's headers name (:data:`UNKNOWN_GENERATION` if none or malformed)."""
    value = headers.get(GENERATION_HEADER, b"")
    return int(value) if value.isdigit() and len(value) <= 18 else UNKNOWN_GENERATION


def claim_of(record: CoordinatorClaimed, message: LogMessage) -> Claim:
    """A claim as the ownership state machine sees it."""
    return Claim(record.epoch, record.worker_id, generation_of(message.headers), message.offset)


@dataclass(frozen=True, slots=True)
class StoredSnapshot:
    """A fold snapshot as the snapshots topic holds it (decoded by the caller's ``decode``)."""

    epoch: int
    journal_offset: int
    value: bytes
    partitions: int = DEFAULT_PARTITIONS
    """The topics' partition count its writer used to choose the partition's jobs
    (:data:`SNAPSHOT_PARTITIONS_HEADER`)."""


SnapshotLoader = Callable[[Coordinator, bytes], tuple[int, int]]
"""Loads a snapshot's value into a fresh coordinator; returns (epoch, journal offset covered)."""


def load_fold_snapshot(coordinator: Coordinator, value: bytes) -> tuple[int, int]:
    """:data:`SnapshotLoader` of :mod:`coordinator.core.snapshot` frames."""
    snapshot = decode_snapshot(value)
    coordinator.load(snapshot)
    return snapshot.epoch, snapshot.journal_offset


def snapshot_key(partition: int) -> bytes:
    """The one key of ``partition``'s snapshots: compaction keeps the newest."""
    return b"%d" % partition


def snapshot_message(
    snapshot: PartitionSnapshot, partitions: int
) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """Key, value and headers of ``snapshot``, taken by a coordinator of ``partitions`` partitions, in
    the snapshots topic (epoch and covered offset in the value and the headers)."""
    headers = [
        epoch_header(snapshot.epoch),
        (SNAPSHOT_OFFSET_HEADER, b"%d" % snapshot.journal_offset),
        (SNAPSHOT_PARTITIONS_HEADER, b"%d" % partitions),
    ]
    return snapshot_key(snapshot.partition), encode_snapshot(snapshot), headers


def stored_snapshot(message: LogMessage) -> StoredSnapshot | None:
    """The snapshot a message of the snapshots topic holds; None for anything else (an older
    release's ``<p>:<epoch>`` or ``<p>:claim`` keys, a malformed header)."""
    if message.key != snapshot_key(message.partition) or message.value is None:
        return None
    epoch = epoch_of(message.headers)
    offset = message.headers.get(SNAPSHOT_OFFSET_HEADER, b"")
    count = message.headers.get(SNAPSHOT_PARTITIONS_HEADER, b"%d" % DEFAULT_PARTITIONS)
    if epoch < 0 or not offset.isdigit() or not count.isdigit():
        return None
    return StoredSnapshot(epoch, int(offset), message.value, int(count))


def read_latest_snapshot(
    consumer: Consumer, topic: str, partition: int, timeout: float | None
) -> tuple[StoredSnapshot | None, int]:
    """The last snapshot of ``partition`` and how many messages were read to find it: the read
    starts one message before where ListOffsets says the partition ends (short by up to a batch on
    the embedded broker) and goes on to the end a fetch reports. ``consumer`` is otherwise unused."""
    low, latest = watermark_offsets(
        consumer, TopicPartition(topic, partition), timeout=10.0 if timeout is None else timeout
    )
    start = max(low, latest - 1, 0)
    latest_snapshot: StoredSnapshot | None = None
    read = 0
    for message in read_partition_to_end(consumer, topic, partition, timeout, start=start):
        read += 1
        latest_snapshot = stored_snapshot(log_message(message)) or latest_snapshot
    consumer.unassign()
    return latest_snapshot, read


class PartitionCountChanged(RuntimeError):
    """A journal partition holds jobs whose partition, by the topics' present count, is another."""


def misplaced_jobs_problem(coordinator: Coordinator, partition: int) -> str | None:
    """Why ``partition``'s fold cannot be owned as it is (None: every job in it belongs to it).

    Every journal record is keyed by its job, so a job's records are in the partition its key
    hashes to. A job of the fold that hashes elsewhere now means the topics' partition count is
    not the one the job ran with (partitions were added: Kafka then moves keys). An owner would
    keep only the jobs that hash to the partition (``Coordinator.merge``). The others' inputs
    would then reach a worker that does not know them, which would start their ids again."""
    assert coordinator.partitions is not None
    misplaced = sorted(j for j in coordinator.states if coordinator.partition_of(j) != partition)
    if not misplaced:
        return None
    fits = [
        n
        for n in range(partition + 1, 257)
        if all(partition_for(job_key(j), n) == partition for j in coordinator.states)
    ][:3]
    named = ", ".join(repr(j) for j in misplaced[:5]) + (
        f" and {len(misplaced) - 5} more" if len(misplaced) > 5 else ""
    )
    counts = " or ".join(map(str, fits)) + (" partition" if fits == [1] else " partitions")
    ran_with = f" (every job here belongs to it with {counts})" if fits else ""
    return (
        f"journal partition {partition} holds jobs {named}, which belong to other partitions with the "
        f"{coordinator.partitions} partitions the topics have now: the partition count changed after these "
        f"jobs ran{ran_with}. Kafka moves keys to other partitions when partitions are added, so this "
        "worker does not claim the partition: it would not know these jobs, and their checkpoint ids would "
        "start again. A prefix keeps the partition count it was created with. Run these jobs under a new "
        "prefix (cutline topics create --topic-prefix <new prefix> --partitions N)"
    )


class PartitionRecovery:
    """The reads and writes of recovering one journal partition for one group generation.

    Blocking (confluent-kafka): a worker runs each step in a thread, one step at a time, and
    hands the fact it returns to :func:`coordinator.core.ownership.step`. The fold goes into a fresh
    :class:`~coordinator.service.runtime.Coordinator` that the worker merges into its own once
    the claim holds. ``timeout`` bounds a stalled read (no fetch answer for that long), not the
    fold: a long journal or a paused broker only make it take longer.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        snapshots_topic: str,
        partitions: int,
        partition: int,
        worker_id: str,
        *,
        load: SnapshotLoader | None = load_fold_snapshot,
        timeout: float | None = 30.0,
        now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        producer: Producer | None = None,
    ) -> None:
        """``producer``: the worker's, shared by its recoveries (one is made, and closed, if None)."""
        self.bootstrap, self.topics, self.snapshots_topic = bootstrap, topics, snapshots_topic
        self.partitions, self.partition, self.worker_id = partitions, partition, worker_id
        self._load, self._timeout, self._now_ms = load, timeout, now_ms
        self.coordinator = Coordinator(topics, partitions=partitions)
        self.fence = Fence()
        self.next_offset: int | None = None
        """The journal offset the fold reads next (None: the beginning)."""
        self.snapshot_offset: int | None = None
        """The journal offset the loaded snapshot covered, None when the fold started at the beginning."""
        self.snapshots_read = 0
        self.folded = 0
        """Journal records read (valid or void) after the snapshot."""
        self.highest_epoch = 0
        self.started = time.monotonic()
        self._producer, self._own_producer = producer, producer is None
        self._consumer: Consumer | None = None

    def read_snapshot(self, generation: int) -> SnapshotRead:
        """Load the partition's latest snapshot (if any, and usable) into the fold."""
        stored, self.snapshots_read = self._latest_snapshot()
        if stored is None or self._load is None:
            return SnapshotRead(self.partition, generation, 0, -1)
        if stored.partitions != self.partitions:
            log.warning(
                "journal partition %d: its snapshot chose the partition's jobs with %d partitions, the "
                "topics have %d: folding from the start",
                self.partition,
                stored.partitions,
                self.partitions,
            )
            return SnapshotRead(self.partition, generation, 0, -1)
        try:
            epoch, covered = self._load(self.coordinator, stored.value)
        except SnapshotError as exc:
            log.warning(
                "journal partition %d: snapshot unreadable (%s); folding from the start", self.partition, exc
            )
            self.coordinator = Coordinator(self.topics, partitions=self.partitions)
            return SnapshotRead(self.partition, generation, 0, -1)
        self.fence, self.next_offset, self.snapshot_offset = Fence(epoch), covered + 1, covered
        self.highest_epoch = max(self.highest_epoch, epoch)
        return SnapshotRead(self.partition, generation, epoch, covered)

    def fold_journal(self, generation: int) -> JournalFolded | RecoveryFailed:
        """Fold the journal after the snapshot to its end as of now."""
        self._fold(None)
        problem = misplaced_jobs_problem(self.coordinator, self.partition)
        if problem is not None:
            log.error("%s; its jobs get no checkpoints. Trying again in %g s", problem, MISPLACED_RETRY_S)
            return RecoveryFailed(self.partition, generation, problem, MISPLACED_RETRY_S)
        end = -1 if self.next_offset is None else self.next_offset - 1
        return JournalFolded(self.partition, generation, end, self.highest_epoch)

    def write_claim(self, generation: int, epoch: int) -> ClaimWritten | ClaimWriteFailed:
        """Append this worker's claim of ``epoch`` for ``generation``; its offset."""
        claim = CoordinatorClaimed(self.partition, epoch, self.worker_id, self._now_ms())
        headers = [epoch_header(epoch), generation_header(generation)]
        try:
            offset = self._append(encode(claim, self.topics.checkpoints), headers)
        except (RuntimeError, TimeoutError) as exc:
            return ClaimWriteFailed(self.partition, generation, epoch, str(exc))
        return ClaimWritten(self.partition, generation, epoch, offset)

    def read_to_claim(self, generation: int, offset: int) -> ClaimSettled | RecoveryFailed:
        """Fold on up to ``offset`` (this worker's claim); the claim effective there."""
        effective = self._fold(offset)
        if effective is None:
            return RecoveryFailed(self.partition, generation, f"no valid claim up to offset {offset}")
        return ClaimSettled(self.partition, generation, effective, self.highest_epoch)

    # ------------------------------------------------------------ I/O (Kafka; the simulator's log)

    def _latest_snapshot(self) -> tuple[StoredSnapshot | None, int]:
        """The partition's last snapshot, and how many messages of the snapshots topic were read."""
        return read_latest_snapshot(self.consumer(), self.snapshots_topic, self.partition, self._timeout)

    def _journal(self, start: int | None, until: int | None) -> Generator[LogMessage, None, None]:
        """The journal partition from ``start`` (None: its beginning) to ``until`` (None: its end as of
        now, by the high watermark of a fetch), in offset order."""
        consumer = self.consumer()
        try:
            for message in read_partition_to_end(
                consumer, self.topics.checkpoints, self.partition, self._timeout, start=start, until=until
            ):
                yield log_message(message)
        finally:
            consumer.unassign()

    def _append(self, value: bytes, headers: list[tuple[str, bytes]]) -> int:
        """Append an unkeyed record to the journal partition and wait for the broker; its offset
        (raises RuntimeError or TimeoutError when it may not have landed)."""
        if self._producer is None:
            self._producer = Producer(producer_config(self.bootstrap))
        return _produce(self._producer, self.topics.checkpoints, self.partition, None, value, list(headers))

    def consumer(self) -> Consumer:
        """The recovery's one consumer (every read of it, one after another)."""
        if self._consumer is None:
            # partition EOF: a read that reaches the end hears so at once, not after a fetch wait
            # (which a fetch at the end still waits on Apache Kafka: RECOVERY_FETCH_WAIT_MS)
            extra = {"enable.partition.eof": True, "fetch.wait.max.ms": RECOVERY_FETCH_WAIT_MS}
            self._consumer = Consumer(consumer_config(self.bootstrap, extra=extra))
        return self._consumer

    def close(self) -> None:
        if self._producer is not None and self._own_producer:
            self._producer.flush(10)
            self._producer = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _fold(self, until: int | None) -> Claim | None:
        """Read from ``next_offset`` to ``until`` (or the end) into the fold; the last valid claim."""
        fences = {self.partition: self.fence}
        last_claim: Claim | None = None

        def skip(message: LogMessage, problem: str) -> None:
            # Only coordinators write here; anything else was written by mistake. Folding it
            # is impossible, stopping would leave every job without a coordinator: skip it loudly.
            log.error("journal %s[%d]@%d skipped: %s", message.topic, self.partition, message.offset, problem)

        journal = self._journal(self.next_offset, until)
        messages = _counted(journal)
        try:
            for record, message in fenced_journal(messages.each(), skip, fences):
                if isinstance(record, CoordinatorClaimed):
                    last_claim = claim_of(record, message)
                else:
                    epoch = epoch_of(message.headers)
                    self.coordinator.apply(record, message.headers.get(CAUSE_HEADER), epoch)
        finally:
            journal.close()
        self.fence = fences[self.partition]
        self.folded += messages.count
        if messages.last is not None:
            self.next_offset = messages.last + 1
        self.highest_epoch = max(self.highest_epoch, messages.highest_epoch, self.fence.epoch)
        return last_claim


@dataclass(slots=True)
class ClaimedPartition:
    """The outcome of :func:`claim_partition`: the partition's fold and the worker's epoch."""

    partition: int
    epoch: int
    claim_offset: int
    coordinator: Coordinator
    folded: int
    """Journal records read (valid or void) after the snapshot, up to the claim."""
    snapshot_offset: int | None
    """The journal offset the snapshot covered, None when the fold started at the beginning."""
    seconds: float
    snapshots_read: int = 0
    """Messages of the snapshots topic read to find the snapshot."""


class ClaimLost(RuntimeError):
    """Another worker's claim is the effective one: this worker stepped down."""


def claim_partition(
    bootstrap: str,
    topics: Topics,
    snapshots_topic: str,
    partitions: int,
    partition: int,
    worker_id: str,
    load_fold_snapshot: SnapshotLoader | None = load_fold_snapshot,
    timeout: float | None = 30.0,
    now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    generation: int = 1,
) -> ClaimedPartition:
    """Recover and claim ``partition`` for ``generation`` synchronously, through the ownership state
    machine (as a worker does, step by step); raises :class:`PartitionCountChanged` or
    :class:`ClaimLost` where the worker would wait or step down."""
    recovery = PartitionRecovery(
        bootstrap,
        topics,
        snapshots_topic,
        partitions,
        partition,
        worker_id,
        load=load_fold_snapshot,
        timeout=timeout,
        now_ms=now_ms,
    )
    made = step(Ownership(worker_id), PartitionsAssigned(generation, frozenset({partition})))
    try:
        while True:
            (command,) = made.commands or (None,)
            if isinstance(command, ResendBarriers):
                hold = made.state.holds[partition]
                return ClaimedPartition(
                    partition,
                    hold.claim_epoch,
                    hold.claim_offset,
                    recovery.coordinator,
                    recovery.folded,
                    recovery.snapshot_offset,
                    time.monotonic() - recovery.started,
                    recovery.snapshots_read,
                )
            fact = _carry_out(recovery, command)
            if isinstance(fact, RecoveryFailed) and fact.retry_after_s >= MISPLACED_RETRY_S:
                raise PartitionCountChanged(fact.error)
            made = step(made.state, fact)
            if made.state.holds[partition].phase is Phase.STEPPED_DOWN:
                raise ClaimLost(f"journal partition {partition}: {made.state.holds[partition].fenced_by}")
    finally:
        recovery.close()


def _carry_out(recovery: PartitionRecovery, command: object) -> Fact:
    """The I/O one recovery command asks for, and what came of it."""
    match command:
        case ReadSnapshot(generation=g, delay_s=delay):
            time.sleep(delay)
            return recovery.read_snapshot(g)
        case FoldJournal(generation=g):
            return recovery.fold_journal(g)
        case WriteClaim(generation=g, epoch=epoch):
            return recovery.write_claim(g, epoch)
        case ReadToClaim(generation=g, offset=offset):
            return recovery.read_to_claim(g, offset)
    raise AssertionError(f"not a recovery command: {command!r}")


class _counted:
    """Passes messages through, counting them and noting the last offset and highest epoch."""

    def __init__(self, messages: Any) -> None:
        self._messages = messages
        self.count = 0
        self.last: int | None = None
        self.highest_epoch = 0

    def each(self) -> Any:
        for message in self._messages:
            self.count += 1
            self.last = message.offset
            self.highest_epoch = max(self.highest_epoch, epoch_of(message.headers))
            yield message


def _produce(
    producer: Producer,
    topic: str,
    partition: int,
    key: bytes | None,
    value: bytes,
    headers: list[tuple[str, str | bytes | None]] | None = None,
    timeout: float = 30.0,
) -> int:
    """Produce one message to ``topic[partition]`` and wait for the broker; its offset."""
    outcome: list[tuple[KafkaError | None, Message]] = []
    producer.produce(
        topic,
        value=value,
        key=key,
        partition=partition,
        headers=headers or [],
        on_delivery=lambda error, msg: outcome.append((error, msg)),
    )
    deadline = time.monotonic() + timeout
    while not outcome:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no delivery report for {topic}[{partition}] within {timeout:g}s")
        producer.poll(0.1)
    error, msg = outcome[0]
    if error is not None:
        raise RuntimeError(f"could not write to {topic}[{partition}]: {error}")
    offset = msg.offset()
    assert offset is not None
    return offset
