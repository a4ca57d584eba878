"""One Kafka edge for every reader of a job's partitions: find the real end, filter, decode, fence.

A participant, the Spark driver's journal follower and barrier feed, ``JobDriver``'s
journal reads and the bench's tail all read "the records of one job from its
partition of a topic". They share three rules, which live here once:

- **The end is where a fetch response says it is** (:func:`events.kafka.clients.find_ends`), never
  ListOffsets "latest" (short by up to one batch on the embedded broker, docs/embedded-broker.md)
  and never a quiet spell.
- **The job's records are the ones keyed by its id**, decoded by the codec; a frame
  that does not decode is counted and logged, never raised.
- **The fencing rule** (:mod:`events.wire.fencing`; docs/design.md, "Ownership and fencing"): a
``CoordinatorClaimed``
  on the journal raises the epoch; a record below the current epoch is void.

:class:`JobRecords` is the filter (it only looks at messages); :class:`JobFeed` is a
consumer that follows the partitions through it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from events.kafka.clients import (
    consume_available,
    consumer_config,
    find_ends,
    job_key,
    job_partition,
    read_partition_to_end,
)
from events.wire.codec import CONFLUENT_HEADER_SIZE, HEADER_SIZE, MAGIC, Codec, DecodeError, default_codec
from events.wire.fencing import VOID_EPOCH, Fence, epoch_of, epoch_problem
from events.wire.records import CoordinatorClaimed, Record
from events.wire.sizes import excerpt

__all__ = ["FeedRecord", "JobFeed", "JobRecords", "read_job_partition"]

log = logging.getLogger(__name__)

CLAIM = CoordinatorClaimed.__name__
END_PROBE_FETCH_WAIT_MS = 10
"""Fetch wait of the consumer that finds the ends: the first fetch answers within a few ms."""


@dataclass(frozen=True, slots=True)
class FeedRecord:
    """One valid record of the job: where it is, the epoch it was written under, and what it is."""

    topic: str
    partition: int
    offset: int
    epoch: int
    name: str
    """The record's schema name, from the frame's fingerprint."""
    value: bytes
    timestamp_ms: int
    """The Kafka timestamp of the message (CreateTime)."""
    record: Record | None
    """The decoded record; None only from a feed made with ``decode=False``."""


class JobRecords:
    """Which messages of a job's partitions count, and as what (no I/O: it is handed messages).

    ``claims_topic`` is the journal: its claims move the fence. ``learning`` is for a
    reader that starts in the middle of a partition (see :class:`events.wire.fencing.Fence`).
    ``kinds`` (schema names) keeps only those records; others are skipped undecoded.
    ``starts`` maps ``(topic, partition)`` to the first offset that counts. Counts what it
    drops: ``undecodable``, and ``void`` records by topic.
    """

    def __init__(
        self,
        job_id: str,
        *,
        claims_topic: str | None = None,
        learning: bool = False,
        kinds: Collection[str] | None = None,
        decode: bool = True,
        starts: Mapping[tuple[str, int], int] | None = None,
        codec: Codec | None = None,
    ) -> None:
        self.job_id = job_id
        self.claims_topic = claims_topic
        self.kinds = None if kinds is None else frozenset(kinds)
        self.decode = decode
        self.starts = dict(starts or {})
        self.fence = Fence(learning=learning)
        self.undecodable = 0
        self.void: Counter[str] = Counter()
        self._key = job_key(job_id)
        self._codec = codec or default_codec()
        self._names: dict[bytes, str | None] = {}

    def admit(self, msg: Message) -> FeedRecord | None:
        """The record ``msg`` holds if it is a valid record of this job, else None.

        Raises only a fatal Kafka error; other errors and partition EOF are logged or skipped.
        """
        error = msg.error()
        if error is not None:
            if error.fatal():
                raise KafkaException(error)
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("reading the partitions of job %s: %s", self.job_id, error)
            return None
        topic, partition, offset, key, value = (
            msg.topic(),
            msg.partition(),
            msg.offset(),
            msg.key(),
            msg.value(),
        )
        if topic is None or partition is None or offset is None or value is None:
            return None
        if offset < self.starts.get((topic, partition), 0) or (key is not None and key != self._key):
            return None
        name = self._name(value)
        if name is None:
            self._undecodable(topic, partition, offset, "unknown or malformed frame header")
            return None
        if name == CLAIM:
            if topic == self.claims_topic:
                self._learn_claim(msg, value, topic, partition, offset)
            return None
        if key is None:
            return None
        epoch = epoch_of(msg.headers())
        if not self._admitted(msg, epoch, name, topic, partition, offset):
            return None
        if self.kinds is not None and name not in self.kinds:
            return None
        record = None
        if self.decode:
            record = self._decoded(value, topic, partition, offset)
            if record is None or getattr(record, "job_id", None) != self.job_id:
                return None
        return FeedRecord(topic, partition, offset, epoch, name, value, msg.timestamp()[1], record)

    def _learn_claim(self, msg: Message, value: bytes, topic: str, partition: int, offset: int) -> None:
        claim = self._decoded(value, topic, partition, offset)
        if isinstance(claim, CoordinatorClaimed) and epoch_of(msg.headers()) != VOID_EPOCH:
            _, self.fence = self.fence.claim(claim.epoch)

    def _admitted(self, msg: Message, epoch: int, name: str, topic: str, partition: int, offset: int) -> bool:
        """Whether the fence admits a record written under ``epoch``; a void record is counted and logged."""
        valid, self.fence = self.fence.admit(epoch)
        if valid:
            return True
        self.void[topic] += 1
        # a warning: a record a coordinator wrote and no reader counts (a zombie's write after a newer
        # claim) is rare, and what it meant (a scheduler's start, say) never reaches the job
        if epoch == VOID_EPOCH:
            log.warning(
                "job %s: %s at %s[%d]@%d is void: %s",
                self.job_id, name, topic, partition, offset, excerpt(epoch_problem(msg.headers())),
            )  # fmt: skip
        else:
            log.warning(
                "job %s: %s at %s[%d]@%d is void: written under coordinator epoch %d, now %d",
                self.job_id, name, topic, partition, offset, epoch, self.fence.epoch,
            )  # fmt: skip
        return False

    def _name(self, value: bytes) -> str | None:
        header = value[:HEADER_SIZE] if value[:2] == MAGIC else value[:CONFLUENT_HEADER_SIZE]
        if header in self._names:
            return self._names[header]
        name = self._codec.record_name(value)
        if name is not None or value[:2] == MAGIC:  # a registry that did not answer may answer later
            self._names[header] = name
        return name

    def _decoded(self, value: bytes, topic: str, partition: int, offset: int) -> Record | None:
        try:
            return self._codec.decode(value)
        except DecodeError as exc:
            self._undecodable(topic, partition, offset, str(exc))
            return None

    def _undecodable(self, topic: str, partition: int, offset: int, why: str) -> None:
        self.undecodable += 1
        log.warning(
            "job %s: undecodable record at %s[%d]@%d: %s", self.job_id, topic, partition, offset, excerpt(why)
        )


class JobFeed:
    """Follows one job's partition of each of ``topics`` and hands out its valid records.

    Starts at each partition's real end now (``from_end``, for readers that only care about
    what happens next) or at its beginning; records come in offset order per partition,
    through :class:`JobRecords` (the claims of ``claims_topic`` move the fence). ``config``
    is added to the consumer's (security settings, a long ``fetch.wait.max.ms`` for a
    background reader: the ends are found by a short-lived consumer with a short wait).
    Not thread-safe.
    """

    def __init__(
        self,
        bootstrap: str,
        job_id: str,
        topics: Sequence[str],
        *,
        claims_topic: str | None = None,
        from_end: bool = True,
        config: Mapping[str, Any] | None = None,
        kinds: Collection[str] | None = None,
        decode: bool = True,
        timeout: float = 30.0,
        codec: Codec | None = None,
    ) -> None:
        self.job_id = job_id
        short_wait = {**(config or {}), "fetch.wait.max.ms": END_PROBE_FETCH_WAIT_MS}
        short_wait["enable.partition.eof"] = True  # find_ends reads the end from partition EOF
        probe = Consumer(consumer_config(bootstrap, extra=short_wait))
        try:
            self.partitions = {topic: job_partition(probe, topic, job_id, timeout) for topic in topics}
            wanted = list(self.partitions.items())
            self.starts = find_ends(probe, wanted, timeout) if from_end else dict.fromkeys(wanted, 0)
        finally:
            probe.close()
        self.records = JobRecords(
            job_id,
            claims_topic=claims_topic,
            learning=from_end,
            kinds=kinds,
            decode=decode,
            starts=self.starts,
            codec=codec,
        )
        self._consumer = Consumer(consumer_config(bootstrap, extra=config))
        self._consumer.assign(
            [
                TopicPartition(topic, partition, start if from_end else OFFSET_BEGINNING)
                for (topic, partition), start in self.starts.items()
            ]
        )
        log.debug("job %s follows %s", job_id, self.starts)

    @property
    def fence(self) -> Fence:
        """The fence as of the last record handed out."""
        return self.records.fence

    def poll(self, timeout: float = 0.0, max_messages: int = 500) -> list[FeedRecord]:
        """The valid records that have arrived, waiting up to ``timeout`` s for the first message."""
        admitted = (
            self.records.admit(msg) for msg in consume_available(self._consumer, max_messages, timeout)
        )
        return [record for record in admitted if record is not None]

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> JobFeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_job_partition(
    bootstrap: str,
    job_id: str,
    topic: str,
    *,
    claims_topic: str | None = None,
    kinds: Collection[str] | None = None,
    timeout: float | None = 60.0,
    config: Mapping[str, Any] | None = None,
) -> Iterator[FeedRecord]:
    """The valid records of ``job_id`` in its partition of ``topic``, from the beginning to the end.

    The end is the high watermark of the first fetch (:func:`events.kafka.clients.read_partition_to_end`),
    which waits :data:`END_PROBE_FETCH_WAIT_MS` unless ``config`` says otherwise (on Apache Kafka a fetch
    of an empty partition is answered only after its wait); a journal read names itself as
    ``claims_topic`` so that its claims fence it.
    """
    consumer = Consumer(
        consumer_config(bootstrap, extra={"fetch.wait.max.ms": END_PROBE_FETCH_WAIT_MS, **(config or {})})
    )
    try:
        records = JobRecords(job_id, claims_topic=claims_topic, kinds=kinds)
        partition = job_partition(consumer, topic, job_id, 10.0 if timeout is None else timeout)
        for msg in read_partition_to_end(consumer, topic, partition, timeout):
            record = records.admit(msg)
            if record is not None:
                yield record
    finally:
        consumer.close()


class SharedJobFeed:
    """One :class:`JobFeed` for every participant of a job in one process, fanned out to each.

    The participants of a job that run in one process (the tasks of a worker, as Flink's subtasks
    share their TaskManager's network stack) read the same partitions of the same topics. With a
    consumer each, a barrier reaches the last of them only after every consumer's fetch has come
    back: on the embedded broker, up to half of ``fetch.wait.max.ms`` each, and the broker serves
    every one of those fetches. Shared, one consumer fetches the records once, and a thread of
    this class hands each to every subscriber's queue in order (a few µs). Each participant still
    snapshots and answers in its own thread.

    ``kinds`` (schema names) keeps only those records, as :class:`JobRecords`: the others are neither
    decoded nor handed out, so a record no subscriber acts on wakes none of their threads
    (:func:`events.task.participant.shared_feed` keeps what a participant acts on). Claims move the
    fence whatever ``kinds`` says.

    A subscriber sees the records that arrive after it subscribed. Thread-safe; :meth:`close`
    stops the thread and the consumer (the subscribers' polls then return nothing).
    """

    def __init__(
        self,
        bootstrap: str,
        job_id: str,
        topics: Sequence[str],
        *,
        claims_topic: str | None = None,
        config: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
        kinds: Collection[str] | None = None,
    ) -> None:
        self.job_id = job_id
        self._feed = JobFeed(
            bootstrap, job_id, topics, claims_topic=claims_topic, config=config, timeout=timeout, kinds=kinds
        )
        self.starts = self._feed.starts
        self.records = self._feed.records
        """What the shared consumer admitted and refused (fencing, undecodable records)."""
        self._subscribers: list[queue.SimpleQueue[FeedRecord]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"cutline-feed-{job_id}", daemon=True)
        self._thread.start()

    def subscribe(self) -> FeedSubscription:
        """A reader of every record from now on (a :class:`JobFeed` look-alike for one participant)."""
        mailbox: queue.SimpleQueue[FeedRecord] = queue.SimpleQueue()
        with self._lock:
            self._subscribers = [*self._subscribers, mailbox]
        return FeedSubscription(self, mailbox)

    def _unsubscribe(self, mailbox: queue.SimpleQueue[FeedRecord]) -> None:
        with self._lock:
            self._subscribers = [m for m in self._subscribers if m is not mailbox]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                records = self._feed.poll(SHARED_POLL_S)
            except Exception:  # pragma: no cover - the consumer failed: say so, keep trying
                log.exception("shared feed of job %s could not poll; trying again", self.job_id)
                self._stop.wait(1.0)
                continue
            if records:
                subscribers = self._subscribers  # replaced, never changed in place: no lock needed
                for record in records:
                    for mailbox in subscribers:
                        mailbox.put(record)

    def close(self) -> None:
        """Stop fanning out and close the consumer; idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(10)
        self._feed.close()

    def __enter__(self) -> SharedJobFeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


SHARED_POLL_S = 0.1
"""How long the shared feed's thread waits for records in one poll (it wakes when they arrive)."""


class FeedSubscription:
    """One subscriber's view of a :class:`SharedJobFeed`: ``poll``, ``records``, ``starts``, ``close``."""

    def __init__(self, shared: SharedJobFeed, mailbox: queue.SimpleQueue[FeedRecord]) -> None:
        self._shared = shared
        self._mailbox = mailbox
        self.starts = shared.starts
        self.records = shared.records

    def poll(self, timeout: float = 0.0, max_messages: int = 500) -> list[FeedRecord]:
        """The records that have arrived, waiting up to ``timeout`` s for the first."""
        try:
            first = self._mailbox.get(timeout=timeout) if timeout > 0 else self._mailbox.get_nowait()
        except queue.Empty:
            return []
        records = [first]
        while len(records) < max_messages:
            try:
                records.append(self._mailbox.get_nowait())
            except queue.Empty:
                break
        return records

    def close(self) -> None:
        """Stop receiving (the shared feed itself stays open for the others)."""
        self._shared._unsubscribe(self._mailbox)
