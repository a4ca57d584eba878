"""Small confluent-kafka helpers shared by job drivers, participants and tools.

Two rules of the wire protocol (docs/design.md, "Wire protocol") live here. Every message of a
job is keyed by ``job_id`` (UTF-8; claims have a null key, docs/wire-format.md),
and every producer places keys as Faust, aiokafka and the Java client do
(murmur2), so all events of one job share a partition number in every topic.
confluent-kafka's default partitioner (CRC32) would scatter them.

Consumers that follow a topic wait up to ``CUTLINE_FETCH_WAIT_MS`` (500 ms by default, right for
Apache Kafka; the embedded broker sets a short one: docs/embedded-broker.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from events.kafka.client_config import client_properties, fetch_wait_ms
from events.kafka.refusals import PLACEHOLDER_BOOTSTRAP, AccessRefused, explain, is_refusal, refusal_message
from events.wire.codec import Codec, default_codec
from events.wire.records import Record

__all__ = [
    "PARTITIONER",
    "MissingTopics",
    "commit_offsets",
    "consume_available",
    "consumer_config",
    "deliver",
    "earliest_offsets",
    "find_ends",
    "job_key",
    "job_partition",
    "latest_offsets",
    "murmur2",
    "partition_count",
    "partition_for",
    "produce_record",
    "producer_config",
    "read_partition_to_end",
    "record_key",
    "refused_topics",
    "require_topics",
    "topics_problem",
    "watermark_offsets",
]

log = logging.getLogger(__name__)

PARTITIONER = "murmur2_random"
"""librdkafka's name for the Java client's key hash (Faust and aiokafka use it too)."""

PLACEHOLDER_GROUP = "cutline.unused"
"""librdkafka wants a ``group.id`` even for ``assign()``-only consumers that never commit."""

DeliveryCallback = Callable[[KafkaError | None, Message], None]


def job_key(job_id: str) -> bytes:
    """The message key of every event of ``job_id``."""
    return job_id.encode("utf-8")


def record_key(record: Record) -> bytes | None:
    """The key of ``record``: its ``job_id`` in UTF-8 (None for a dead letter without a job)."""
    job_id: str | None = getattr(record, "job_id", None)
    return None if job_id is None else job_key(job_id)


def murmur2(data: bytes) -> int:
    """The Java client's ``Utils.murmur2`` of ``data``, as an unsigned 32-bit int."""
    length = len(data)
    m = 0x5BD1E995
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    tail = length & ~3
    for i in range(0, tail, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    extra = length & 3
    if extra >= 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition the Java client, Faust and ``murmur2_random`` pick for ``key``."""
    if partitions <= 0:
        raise ValueError(f"partition count must be positive, got {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def producer_config(bootstrap: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Config of a low-latency producer that places keys as Faust and Java do.

    ``extra`` overrides (e.g. ``{"enable.idempotence": True}`` where ordering across
    retries matters more than the first message's latency).
    """
    return {
        "bootstrap.servers": bootstrap,
        "partitioner": PARTITIONER,
        "linger.ms": 0,
        "acks": "all",
        # Off: an idempotent librdkafka producer holds its first message 0.5-1 s until its
        # PID timer fires (the bootstrap connection is dropped for the advertised broker).
        # Acks and declines are idempotent by checkpoint id; JobDriver waits for each event.
        "enable.idempotence": False,
        "logger": log,
        **client_properties(),
        **(extra or {}),
    }


def consumer_config(
    bootstrap: str, group_id: str | None = None, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Config of a consumer that never commits by itself and fetches with a short wait.

    ``auto.offset.reset`` is ``earliest``: "latest" is wrong on the embedded broker.
    """
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id or PLACEHOLDER_GROUP,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": fetch_wait_ms(),
        "logger": log,
        **client_properties(),
        **(extra or {}),
    }


def produce_record(
    producer: Producer,
    topic: str,
    record: Record,
    on_delivery: DeliveryCallback | None = None,
    headers: Sequence[tuple[str, bytes]] = (),
    codec: Codec | None = None,
) -> None:
    """Encode ``record`` with ``codec`` (the process's by default) and produce it to ``topic``,
    keyed by its ``job_id``.

    Serves delivery callbacks of earlier messages (``poll(0)``) but does not wait.
    """
    value = (codec or default_codec()).encode(record, topic)
    kwargs: dict[str, Any] = {"key": record_key(record), "value": value}
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    if headers:
        kwargs["headers"] = list(headers)
    try:
        producer.produce(topic, **kwargs)
    except BufferError:
        producer.poll(1.0)  # local queue full: make room once, then try again
        producer.produce(topic, **kwargs)
    producer.poll(0)


def deliver(
    producer: Producer,
    topic: str,
    record: Record,
    timeout: float,
    headers: Sequence[tuple[str, bytes]] = (),
    codec: Codec | None = None,
) -> None:
    """Produce ``record`` and wait until the broker has it.

    Raises :class:`~events.kafka.refusals.AccessRefused` when the principal may not write ``topic``,
    KafkaException with any other error of the broker, or TimeoutError if it was not delivered within
    ``timeout`` s.
    """
    errors: list[KafkaError] = []
    delivered: list[Message] = []

    def on_delivery(error: KafkaError | None, msg: Message) -> None:
        if error is not None:
            errors.append(error)
        else:
            delivered.append(msg)

    produce_record(producer, topic, record, on_delivery=on_delivery, headers=headers, codec=codec)
    producer.flush(timeout)
    if errors:
        refused = explain(errors[0], "Write", topic)
        raise KafkaException(errors[0]) if refused is None else AccessRefused(refused)
    if not delivered:
        raise TimeoutError(f"{type(record).__name__} not delivered to {topic} within {timeout:g}s")


def commit_offsets(consumer: Consumer, offsets: Sequence[TopicPartition]) -> str | None:
    """Commit ``offsets`` to ``consumer``'s group and wait; None, or what went wrong."""
    if not offsets:
        return None
    try:
        result = consumer.commit(offsets=list(offsets), asynchronous=False)
    except KafkaException as exc:
        return str(exc)
    failed = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in result or () if tp.error is not None]
    return "; ".join(failed) if failed else None


class MissingTopics(LookupError):
    """Topics (or partitions) an app reads do not exist: :func:`require_topics` says which, and what
    to do."""


def topics_problem(bootstrap: str, wanted: Iterable[str], existing: Mapping[str, int]) -> str | None:
    """What to say when some of ``wanted`` are not among the ``existing`` topics (name -> partition
    count), or None when all are. A wanted name is a topic, or ``topic:partition`` (an offsets key,
    as a participant's ``offsets()`` names its partitions): then that partition must exist too. Pure."""
    problems: list[str] = []
    for name in dict.fromkeys(wanted):
        topic, _, partition = name.rpartition(":") if ":" in name else (name, "", "")
        count = existing.get(topic)
        if count is None:
            problems.append(
                f"topic {topic} does not exist at {bootstrap}: create it (cutline topics create "
                "creates only cutline's topics) or check the name"
            )
        elif partition and (not partition.isdigit() or int(partition) >= count):
            problems.append(
                f"topic {topic} has {count} partition{'s' if count != 1 else ''} at {bootstrap}, "
                f"no partition {partition}: check the partition, or add partitions to the topic"
            )
    return "; ".join(problems) or None


def require_topics(
    bootstrap: str,
    wanted: Iterable[str],
    *,
    timeout: float = 10.0,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Raise :class:`MissingTopics` at once, with what to do, unless every topic (or
    ``topic:partition``) in ``wanted`` exists: an app checks its input topics at start, rather than
    read nothing while empty checkpoints complete. It only lists the cluster's topics (a consumer's
    metadata request creates none); :class:`~events.kafka.refusals.AccessRefused` when the principal
    may not Describe one (the listing leaves it out); KafkaException when the broker does not answer in
    ``timeout`` s."""
    wanted = list(wanted)
    consumer = Consumer(consumer_config(bootstrap, extra=extra))
    try:
        listed = consumer.list_topics(timeout=timeout).topics
        existing = {name: len(topic.partitions) for name, topic in listed.items() if topic.error is None}
        unseen = [name.rpartition(":")[0] if ":" in name else name for name in wanted]
        refused = refused_topics(consumer, [n for n in unseen if n not in existing], timeout, bootstrap)
    finally:
        consumer.close()
    if refused:
        raise AccessRefused("\n".join(refused.values()))
    problem = topics_problem(bootstrap, wanted, existing)
    if problem is not None:
        raise MissingTopics(problem)


def partition_count(client: Consumer | Producer, topic: str, timeout: float = 10.0) -> int:
    """The number of partitions of ``topic``; :class:`~events.kafka.refusals.AccessRefused` naming the
    ACL when the principal may not Describe it (with the Write a producer, or the Read a consumer, needs
    next), LookupError saying what to do when it does not exist."""
    info = topic_metadata(client, topic, timeout).topics.get(topic)
    if info is not None and is_refusal(info.error):
        needs = "Write" if isinstance(client, Producer) else "Read"
        raise AccessRefused(
            refusal_message("Describe", "topic", topic, error=info.error.name(), also=[needs])
        )
    if info is None or info.error is not None or not info.partitions:
        reason = info.error if info is not None and info.error is not None else "no partitions"
        raise LookupError(
            f"topic {topic!r} is not available ({reason}): create it (`cutline topics create` creates "
            "cutline's topics) or check the name"
        )
    return len(info.partitions)


def refused_topics(
    client: Consumer | Producer,
    names: Iterable[str],
    timeout: float = 10.0,
    bootstrap: str = PLACEHOLDER_BOOTSTRAP,
) -> dict[str, str]:
    """Of ``names`` (topics a listing of the cluster left out), those the principal may not Describe,
    each with what to say (:func:`~events.kafka.refusals.refusal_message`); the others do not exist. A
    listing leaves out a topic either way: only the metadata of that one topic tells them apart."""
    refused: dict[str, str] = {}
    for name in dict.fromkeys(names):
        info = client.list_topics(name, timeout=timeout).topics.get(name)
        if info is not None and info.error is not None and info.error.name() == "TOPIC_AUTHORIZATION_FAILED":
            refused[name] = refusal_message("Describe", "topic", name, bootstrap=bootstrap)
    return refused


def job_partition(client: Consumer | Producer, topic: str, job_id: str, timeout: float = 10.0) -> int:
    """The partition of ``topic`` that holds the events of ``job_id``."""
    return partition_for(job_key(job_id), partition_count(client, topic, timeout))


def consume_available(consumer: Consumer, num_messages: int = 500, timeout: float = 0.0) -> list[Message]:
    """Up to ``num_messages`` messages that are there now, waiting up to ``timeout`` s only for the first.

    (``Consumer.consume`` itself waits the whole timeout unless ``num_messages`` arrive.)
    """
    messages: list[Message] = consumer.consume(num_messages=num_messages, timeout=0)
    if messages or timeout <= 0:
        return messages
    first = consumer.poll(timeout)
    if first is None:
        return []
    return (
        [first, *consumer.consume(num_messages=num_messages - 1, timeout=0)] if num_messages > 1 else [first]
    )


NOT_LEADER_YET = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)
"""Answers of Apache Kafka for a partition created a moment ago: the cluster's metadata already shows
it while its broker has not yet taken the leadership (docs/embedded-broker.md)."""


UNREACHABLE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._DESTROY_BROKER,
    }
)
"""What librdkafka answers a ListOffsets or a metadata request while its broker cannot be reached
(restarting, say), without asking again as it does other requests: a transport error where the
connection broke, "broker handle destroyed" where the broker's handle went with it, an unknown
partition once the partition's leader is unknown. (A partition that does not exist answers unknown
too: it fails at the timeout.)"""


def _asked_again(ask: Callable[[float], Any], timeout: float, pauses: Mapping[int, float]) -> Any:
    """``ask(seconds left)``, asked again after ``pauses[code]`` s while it raises a KafkaException of
    a code in ``pauses``, until ``timeout``; then that exception."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ask(max(0.1, deadline - time.monotonic()))
        except KafkaException as exc:
            code = exc.args[0].code()
            if code not in pauses or time.monotonic() >= deadline:
                raise
            time.sleep(pauses[code])


_WHILE_UNREACHABLE = dict.fromkeys(UNREACHABLE, 0.5)
_WHILE_LEADERLESS_OR_UNREACHABLE = {**dict.fromkeys(NOT_LEADER_YET, 0.05), **_WHILE_UNREACHABLE}
_WHILE_LEADER_MOVES = {
    **_WHILE_LEADERLESS_OR_UNREACHABLE,
    # a request that carries the partition's leader epoch (ListOffsets by timestamp) is refused while
    # this client's metadata is older than the leader: after a broker's restart, for one
    KafkaError.FENCED_LEADER_EPOCH: 0.05,
    KafkaError.UNKNOWN_LEADER_EPOCH: 0.05,
    KafkaError.OFFSET_NOT_AVAILABLE: 0.05,
}


def watermark_offsets(consumer: Consumer, tp: TopicPartition, timeout: float = 10.0) -> tuple[int, int]:
    """``consumer.get_watermark_offsets(tp, cached=False)`` (ListOffsets), asked again until
    ``timeout`` while the broker answers :data:`NOT_LEADER_YET` or cannot be reached
    (:data:`UNREACHABLE`): a broker restarted within it is waited out, as Spark's Kafka source
    retries its offset requests."""
    low, high = _asked_again(
        lambda left: consumer.get_watermark_offsets(tp, timeout=left, cached=False),
        timeout,
        _WHILE_LEADERLESS_OR_UNREACHABLE,
    )
    return int(low), int(high)


def latest_offsets(
    consumer: Consumer, partitions: Iterable[tuple[str, int]], timeout: float = 10.0
) -> dict[tuple[str, int], int]:
    """ListOffsets "latest" of every partition in one request per leader (:func:`_listed_offsets`)."""
    return _listed_offsets(consumer, partitions, OFFSET_END, timeout)


def earliest_offsets(
    consumer: Consumer, partitions: Iterable[tuple[str, int]], timeout: float = 10.0
) -> dict[tuple[str, int], int]:
    """ListOffsets "earliest" (each log's start) of every partition in one request per leader."""
    return _listed_offsets(consumer, partitions, OFFSET_BEGINNING, timeout)


def _listed_offsets(
    consumer: Consumer, partitions: Iterable[tuple[str, int]], at: int, timeout: float
) -> dict[tuple[str, int], int]:
    """ListOffsets at the logical offset ``at`` (the end or the start) of every partition, in one
    request per leader (``offsets_for_times`` with ``at`` for the timestamp, which the broker answers
    as ListOffsets "latest" or "earliest"), asked again as :func:`watermark_offsets` is and while
    the client's metadata lags the partition's leader epoch. ``get_watermark_offsets`` asks for one
    partition's two ends in two requests, one after the other: 128 round trips for a probe of 64
    partitions."""
    asked = [TopicPartition(topic, partition, at) for topic, partition in partitions]
    if not asked:
        return {}

    def ask(left: float) -> list[TopicPartition]:
        answered: list[TopicPartition] = consumer.offsets_for_times(asked, timeout=left)
        for tp in answered:
            if tp.error is not None:  # a partition's own error: asked again while it is passing
                raise KafkaException(tp.error)
        return answered

    answered = _asked_again(ask, timeout, _WHILE_LEADER_MOVES)
    return {(tp.topic, tp.partition): int(tp.offset) for tp in answered}


def topic_metadata(client: Consumer | Producer, topic: str, timeout: float = 10.0) -> Any:
    """``client.list_topics(topic)``, a metadata request (its ``ClusterMetadata``), asked again until
    ``timeout`` while the broker cannot be reached (:data:`UNREACHABLE`): librdkafka answers it at
    once with a transport error where the connection broke, and a broker restarted within the
    timeout is waited out, as by :func:`watermark_offsets`."""
    return _asked_again(lambda left: client.list_topics(topic, timeout=left), timeout, _WHILE_UNREACHABLE)


def find_ends(
    consumer: Consumer, partitions: Iterable[tuple[str, int]], timeout: float = 30.0
) -> dict[tuple[str, int], int]:
    """Where each ``(topic, partition)`` ends now, as the fetch responses answered after this call
    say: at or after its end when the call began, never past what the consumer may read.

    ListOffsets "latest" (short by up to one batch on the embedded broker, docs/embedded-broker.md;
    one request for every partition, :func:`latest_offsets`) is only where the fetch starts, one
    record before it. The end is the offset of the partition-EOF event (the high
    watermark, or the last stable offset for a ``read_committed`` consumer); or, when the partition
    grew after ListOffsets, the high watermark of the response that brought its first record, once
    a record at or past it has come: reading on to the EOF would chase a partition that a
    producer keeps writing to for as long as it writes faster than this consumer reads. (A
    watermark cached before the first record could be an earlier assignment's.) ``consumer`` must
    have ``enable.partition.eof`` on and be otherwise unused; it is left unassigned. A
    TimeoutError names the partitions whose end was not found (and the watermark it was reading to).
    """
    wanted = sorted(set(partitions))
    if not wanted:
        return {}
    deadline = time.monotonic() + timeout
    latest = latest_offsets(consumer, wanted, timeout=max(0.1, deadline - time.monotonic()))
    # one record before it: a fetch at the end would wait fetch.wait.max.ms for a record that may never
    # come, where one that brings the last record is answered at once
    consumer.assign([TopicPartition(t, p, max(latest[(t, p)] - 1, 0)) for t, p in wanted])
    ends: dict[tuple[str, int], int] = {}
    targets: dict[tuple[str, int], int] = {}
    """The high watermark of the response that brought a partition's first record."""
    try:
        while len(ends) < len(wanted):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [
                    f"{t}[{p}]" + (f" (read to {targets[(t, p)]} for its end)" if (t, p) in targets else "")
                    for t, p in wanted
                    if (t, p) not in ends
                ]
                raise TimeoutError(f"no end found for {', '.join(missing)} within {timeout:g}s")
            for msg in consume_available(consumer, 1000, min(0.1, remaining)):
                where = (msg.topic() or "", msg.partition() or 0)
                if where not in ends:
                    end = _fetched_end(consumer, msg, where, targets)
                    if end is not None:
                        ends[where] = end
    finally:
        consumer.unassign()
    return {tp: ends[tp] for tp in wanted}


def _fetched_end(
    consumer: Consumer, msg: Message, where: tuple[str, int], targets: dict[tuple[str, int], int]
) -> int | None:
    """The end of ``where`` that ``msg`` says, or None (not yet, or a passing error); ``targets``
    keeps the watermark a partition's first record came with (see :func:`find_ends`)."""
    error = msg.error()
    if error is None:
        offset = int(msg.offset() or 0)
        if where not in targets:  # its response's high watermark was cached before the record came
            _, high = consumer.get_watermark_offsets(TopicPartition(*where), cached=True)
            targets[where] = max(int(high), offset + 1)
        return targets[where] if offset + 1 >= targets[where] else None
    refused = explain(error, "Read", where[0])
    if refused is not None:
        raise AccessRefused(refused)  # no waiting heals a refusal: say it at once
    if error.code() == KafkaError._PARTITION_EOF:
        return int(msg.offset() or 0)
    if error.fatal():
        raise KafkaException(error)
    log.warning("finding the end of %s[%d]: %s", where[0], where[1], error)
    return None


def read_partition_to_end(
    consumer: Consumer,
    topic: str,
    partition: int,
    timeout: float | None = 60.0,
    *,
    start: int | None = None,
    until: int | None = None,
) -> Iterator[Message]:
    """Every message of one partition from ``start`` (default: its beginning) to its end.

    The end is the high watermark of the first fetch response after the assignment
    (ListOffsets "latest" is wrong on the embedded broker, docs/embedded-broker.md), or, with
    ``until``, the message at offset ``until`` (e.g. a record this process just wrote).
    Silence is never taken for the end: a paused broker only makes the read wait.
    ``timeout`` bounds a stall, not the read: TimeoutError when no message and no
    fetch answer came for that long (None: wait for ever). ``consumer`` must be
    otherwise unused: it is assigned to the partition.
    """
    tp = TopicPartition(topic, partition)
    # metadata first: OFFSET_BEGINNING assigned before the leader is known waits for a 500 ms timer
    partition_count(consumer, topic, 10.0 if timeout is None else timeout)
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING if start is None else start)])
    end = -1 if until is None else until + 1
    next_offset = -1 if start is None else start
    last_progress = time.monotonic()
    while True:
        messages = consume_available(consumer, 1000, timeout=0.05)
        now = time.monotonic()
        for msg in messages:
            error = msg.error()
            if error is not None:
                refused = explain(error, "Read", topic)
                if refused is not None:
                    raise AccessRefused(refused)  # no waiting heals a refusal: say it at once
                if error.fatal():
                    raise KafkaException(error)
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("reading %s[%d]: %s", topic, partition, error)
                continue
            offset = msg.offset()
            if offset is not None:
                next_offset = offset + 1
            last_progress = now
            yield msg
        low, high = consumer.get_watermark_offsets(tp, cached=True)
        if high >= 0:  # a fetch has answered since the assignment
            if end < 0:
                end = high  # the end as of the first answer: a growing partition is not chased
                last_progress = now
            position = consumer.position([tp])[0].offset
            if max(next_offset, position) >= end or (next_offset < 0 and 0 <= end <= low):
                return
        if timeout is not None and now - last_progress >= timeout:
            where = f"offset {max(next_offset, 0)} of {end}" if end >= 0 else "no fetch answered yet"
            raise TimeoutError(
                f"reading {topic}[{partition}] made no progress for {timeout:g}s ({where}); "
                "is the broker reachable?"
            )
