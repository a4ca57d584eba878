"""Taking over a journal partition (DESIGN §4a): claim it, read it to the claim, fold it.

A worker assigned partition ``p`` decides nothing of ``p`` until
:func:`claim_partition` has returned: it folds what the journal holds (from
the newest usable fold snapshot on, else from the start), appends
``CoordinatorClaimed`` with an epoch higher than any the partition has seen,
reads on up to its own claim (by offset: silence is never the end) and checks
that the claim is valid under the fencing rule. Two workers claiming at once
(overlapping rebalance generations) cannot both win: the later claim of the
same epoch is void, and its worker claims again, higher.

Blocking (confluent-kafka): the Faust app runs it in a thread, into a fresh
:class:`~coordinator.service.runtime.Coordinator` that it merges into its own
once the claim holds.

Claim intents. Before the claim goes to the journal, its epoch is written to
the snapshots topic (key ``<p>:claim``). A snapshot is only trusted when no
intent newer than the snapshot's epoch exists; otherwise (a worker claimed and
died before it wrote its first snapshot, while an older owner, now a zombie,
kept writing snapshots) the fold starts from the beginning of the journal.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from coordinator.service.runtime import CAUSE_HEADER, Coordinator
from coordinator.snapshot import PartitionSnapshot, SnapshotError, decode_snapshot, encode_snapshot
from events.codec import encode
from events.fencing import Fence, epoch_header, epoch_of
from events.kafka import job_key, partition_for, producer_config
from events.log import LogMessage, fenced_journal, read_to_end
from events.records import CoordinatorClaimed
from events.topics import DEFAULT_PARTITIONS, Topics

log = logging.getLogger("cutline.coordinator")

CLAIM_SUFFIX = ":claim"
"""Key suffix of claim intents in the snapshots topic (``<partition>:claim``)."""


def new_worker_id() -> str:
    """Host, process id and a random suffix: unique per worker process."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class StoredSnapshot:
    """A fold snapshot as the snapshots topic holds it (decoded by the caller's ``decode``)."""

    epoch: int
    journal_offset: int
    value: bytes
    partitions: int = DEFAULT_PARTITIONS
    """The topics' partition count its writer used to choose the partition's jobs
    (:data:`SNAPSHOT_PARTITIONS_HEADER`; a snapshot without it was written with the count of 8 that
    every coordinator used before 2026-11-25)."""


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


SnapshotLoader = Callable[[Coordinator, bytes], tuple[int, int]]
"""Loads a snapshot's value into a fresh coordinator; returns (epoch, journal offset covered)."""

SNAPSHOT_OFFSET_HEADER = "cutline.journal-offset"
SNAPSHOT_PARTITIONS_HEADER = "cutline.partitions"
"""The partition count the snapshot's writer worked jobs' partitions out with: a snapshot holds the
jobs that hash to its partition under that count, so under another count it may lack some."""
"""Header of a snapshot message: the last journal offset it covers (ASCII decimal)."""


def load_snapshot(coordinator: Coordinator, value: bytes) -> tuple[int, int]:
    """:data:`SnapshotLoader` of :mod:`coordinator.snapshot` frames."""
    snapshot = decode_snapshot(value)
    coordinator.load(snapshot)
    return snapshot.epoch, snapshot.journal_offset


def snapshot_message(
    snapshot: PartitionSnapshot, partitions: int
) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """Key, value and headers of ``snapshot``, taken by a coordinator of ``partitions`` partitions, in
    the snapshots topic (one key per partition and epoch: compaction keeps the newest snapshot of
    every epoch, and a zombie's never replaces a newer owner's)."""
    headers = [
        epoch_header(snapshot.epoch),
        (SNAPSHOT_OFFSET_HEADER, b"%d" % snapshot.journal_offset),
        (SNAPSHOT_PARTITIONS_HEADER, b"%d" % partitions),
    ]
    return f"{snapshot.partition}:{snapshot.epoch}".encode(), encode_snapshot(snapshot), headers


def read_snapshots(
    bootstrap: str, topic: str, partition: int, timeout: float | None
) -> tuple[StoredSnapshot | None, int]:
    """The newest snapshot of ``partition`` (highest epoch, then offset) and the highest claim
    intent, from the snapshots topic (to its end)."""
    best: StoredSnapshot | None = None
    intent = 0
    prefix = f"{partition}:".encode()
    for message in read_to_end(bootstrap, topic, [partition], timeout=timeout):
        key = message.key or b""
        if not key.startswith(prefix) or message.value is None:
            continue
        if key.endswith(CLAIM_SUFFIX.encode()):
            if message.value.isdigit():
                intent = max(intent, int(message.value))
            continue
        epoch = epoch_of(message.headers)
        offset_header = message.headers.get(SNAPSHOT_OFFSET_HEADER, b"")
        if epoch < 0 or not offset_header.isdigit():
            continue
        count = message.headers.get(SNAPSHOT_PARTITIONS_HEADER, b"%d" % DEFAULT_PARTITIONS)
        if not count.isdigit():
            continue
        stored = StoredSnapshot(epoch, int(offset_header), message.value, int(count))
        if best is None or (stored.epoch, stored.journal_offset) >= (best.epoch, best.journal_offset):
            best = stored
    return best, intent


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


def claim_partition(
    bootstrap: str,
    topics: Topics,
    snapshots_topic: str,
    partitions: int,
    partition: int,
    worker_id: str,
    load_snapshot: SnapshotLoader | None = load_snapshot,
    timeout: float | None = 30.0,
    now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
) -> ClaimedPartition:
    """Fold ``partition`` of the journal, claim it, read on to the claim; see the module doc.

    ``timeout`` bounds a stalled read (no fetch answer for that long), not the fold:
    a long journal or a paused broker only make it take longer.
    """
    started = time.monotonic()
    coordinator = Coordinator(topics, partitions=partitions)
    fences = {partition: Fence()}
    next_offset: int | None = None
    snapshot_offset: int | None = None
    stored, intent = read_snapshots(bootstrap, snapshots_topic, partition, timeout)
    if stored is not None and load_snapshot is not None:
        if stored.partitions != partitions:
            log.warning(
                "journal partition %d: its snapshot chose the partition's jobs with %d partitions, the "
                "topics have %d: folding from the start",
                partition,
                stored.partitions,
                partitions,
            )
        elif intent > stored.epoch:
            log.warning(
                "journal partition %d: a claim of epoch %d has no snapshot (its worker died while "
                "claiming?); the snapshot of epoch %d may hold a zombie's records: folding from the start",
                partition,
                intent,
                stored.epoch,
            )
        else:
            try:
                epoch, covered = load_snapshot(coordinator, stored.value)
            except SnapshotError as exc:
                log.warning(
                    "journal partition %d: snapshot unreadable (%s); folding from the start", partition, exc
                )
                coordinator = Coordinator(topics, partitions=partitions)
            else:
                fences[partition] = Fence(epoch)
                next_offset = covered + 1
                snapshot_offset = covered
    highest = max(intent, fences[partition].epoch)
    folded = 0

    def fold(until: int | None) -> tuple[int, CoordinatorClaimed | None, LogMessage | None]:
        """Read from ``next_offset`` to ``until`` (or the end); the highest epoch seen and the last
        valid claim with its message."""
        nonlocal next_offset, folded
        seen = 0
        last_claim: tuple[CoordinatorClaimed | None, LogMessage | None] = (None, None)

        def skip(message: LogMessage, problem: str) -> None:
            # Only coordinators write here; anything else was written by mistake. Folding it
            # is impossible, stopping would leave every job without a coordinator: skip it loudly.
            log.error("journal %s[%d]@%d skipped: %s", message.topic, partition, message.offset, problem)

        messages = _counted(
            read_to_end(
                bootstrap, topics.checkpoints, [partition], timeout=timeout, start=next_offset, until=until
            )
        )
        for record, message in fenced_journal(messages.each(), skip, fences):
            if isinstance(record, CoordinatorClaimed):
                seen = max(seen, record.epoch)
                last_claim = (record, message)
            else:
                epoch = epoch_of(message.headers)
                seen = max(seen, epoch)
                coordinator.apply(record, message.headers.get(CAUSE_HEADER), epoch)
        folded += messages.count
        if messages.last is not None:
            next_offset = messages.last + 1
            seen = max(seen, messages.highest_epoch)
        return seen, *last_claim

    highest = max(highest, fold(None)[0])
    problem = misplaced_jobs_problem(coordinator, partition)
    if problem is not None:
        raise PartitionCountChanged(problem)  # before any claim is written
    producer = Producer(producer_config(bootstrap))
    try:
        while True:
            epoch = highest + 1
            _produce(
                producer, snapshots_topic, partition, f"{partition}{CLAIM_SUFFIX}".encode(), b"%d" % epoch
            )
            claim = CoordinatorClaimed(partition, epoch, worker_id, now_ms())
            claim_offset = _produce(
                producer,
                topics.checkpoints,
                partition,
                None,
                encode(claim, topics.checkpoints),
                [epoch_header(epoch)],
            )
            seen, valid_claim, message = fold(claim_offset)
            if valid_claim == claim and message is not None and message.offset == claim_offset:
                return ClaimedPartition(
                    partition,
                    epoch,
                    claim_offset,
                    coordinator,
                    folded,
                    snapshot_offset,
                    time.monotonic() - started,
                )
            log.warning(
                "journal partition %d: claim of epoch %d at offset %d is void (another worker claimed "
                "at the same time); claiming again",
                partition,
                epoch,
                claim_offset,
            )
            highest = max(highest, seen, epoch)
    finally:
        producer.flush(10)


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
