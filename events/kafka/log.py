"""Read a whole topic to its current end, as plain messages with positions; read the journal fenced.

Built on :func:`events.kafka.clients.read_partition_to_end` (one partition, ended by the high
watermark a fetch reports, because the embedded broker's ListOffsets(latest)
is wrong: docs/embedded-broker.md), one partition after another. :func:`read_journal_topic`
and :func:`fenced_journal` apply the fencing rule (docs/design.md, "Ownership and fencing")
(:mod:`events.wire.fencing`): every reader of the journal goes through them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

from confluent_kafka import Consumer, KafkaException

from events.kafka.clients import consumer_config, partition_count, read_partition_to_end
from events.wire.codec import DecodeError, default_codec
from events.wire.fencing import VOID_EPOCH, Fence, HeaderDict, epoch_of, epoch_problem, header_epoch
from events.wire.records import JOURNAL_RECORDS, CoordinatorClaimed, JournalEvent
from events.wire.sizes import excerpt

log = logging.getLogger(__name__)

END_FETCH_WAIT_MS = 10
"""``fetch.wait.max.ms`` of a read to the end, whatever ``CUTLINE_FETCH_WAIT_MS`` says: the end is the
high watermark of a fetch's answer (ListOffsets "latest" is short on the embedded broker), and a fetch
of a range with nothing in it is answered only after its wait on Apache Kafka (half of it on Tansu).
At the 500 ms users set on Apache Kafka, a read of an empty partition took 564 ms, at 10 ms 72 ms."""


@dataclass(frozen=True, slots=True)
class LogMessage:
    """One message of a topic, with its position and headers (a :class:`~events.wire.fencing.HeaderDict`
    when read from Kafka: by name, and every header as the message carried them)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


def partitions_of(consumer: Consumer, topic: str, timeout: float = 10.0) -> list[int]:
    """The partition numbers of ``topic``; ``KafkaException`` saying what to do if it is missing."""
    try:
        return list(range(partition_count(consumer, topic, timeout)))
    except LookupError as exc:
        raise KafkaException(f"{exc} (`cutline topics create` creates cutline's topics)") from exc


def read_to_end(
    bootstrap: str,
    topic: str,
    partitions: Iterable[int] | None = None,
    *,
    timeout: float | None = 60.0,
    start: int | None = None,
    until: int | None = None,
) -> Iterator[LogMessage]:
    """Every message of ``topic`` (or of ``partitions``) up to its end as of now, partition by
    partition, in offset order within each. ``start``/``until`` (offsets) and ``timeout`` (a stall,
    not the read) as in :func:`events.kafka.clients.read_partition_to_end`."""
    consumer = Consumer(consumer_config(bootstrap, extra={"fetch.wait.max.ms": END_FETCH_WAIT_MS}))
    try:
        chosen = sorted(partitions) if partitions is not None else partitions_of(consumer, topic)
        for partition in chosen:
            messages = read_partition_to_end(
                consumer, topic, partition, timeout=timeout, start=start, until=until
            )
            for message in messages:
                yield log_message(message)
    finally:
        consumer.close()


def log_message(message: Any) -> LogMessage:
    """A confluent-kafka message as a :class:`LogMessage`."""
    return LogMessage(
        topic=message.topic(),
        partition=message.partition(),
        offset=cast(int, message.offset()),
        timestamp_ms=message.timestamp()[1],
        key=message.key(),
        value=message.value(),
        headers=_headers(message.headers()),
    )


JournalRecord: TypeAlias = JournalEvent | CoordinatorClaimed
"""What the journal topic carries: the coordinator's events and the workers' claims."""

OnForeign: TypeAlias = Callable[[LogMessage, str], None]
OnVoid: TypeAlias = Callable[[LogMessage, JournalRecord, int, int], None]
"""Told of a void record: the message, its record, its epoch and the partition's current epoch."""


def _log_void(message: LogMessage, record: JournalRecord, epoch: int, current: int) -> None:
    if epoch == VOID_EPOCH:
        log.info(
            "void journal record %s[%d]@%d (%s with %s)",
            message.topic,
            message.partition,
            message.offset,
            type(record).__name__,
            excerpt(epoch_problem(message.headers)),
        )
        return
    log.info(
        "void journal record %s[%d]@%d (%s of epoch %d, the partition's epoch is %d)",
        message.topic,
        message.partition,
        message.offset,
        type(record).__name__,
        epoch,
        current,
    )


def fenced_journal(
    messages: Iterable[LogMessage],
    on_foreign: OnForeign,
    fences: MutableMapping[int, Fence] | None = None,
    on_void: OnVoid | None = None,
) -> Iterator[tuple[JournalRecord, LogMessage]]:
    """The valid records among journal ``messages`` (in offset order per partition), decoded.

    Applies the fencing rule (:mod:`events.wire.fencing`) per partition: void records go to
    ``on_void`` (default: an INFO log line; the epoch is :data:`~events.wire.fencing.VOID_EPOCH` for
    a record whose epoch header is doubled or malformed) and are not yielded; valid claims are.
    ``fences`` holds each partition's fence and is updated as the read goes on (pass
    :class:`~events.wire.fencing.Fence` ``(epoch, learning=True)`` to start in the middle).
    A message that is not a journal record goes to ``on_foreign`` with the reason.
    """
    codec = default_codec()
    fences = {} if fences is None else fences
    void = on_void or _log_void
    for message in messages:
        if message.value is None:
            continue
        try:
            record = codec.decode(message.value)
        except DecodeError as exc:
            on_foreign(message, str(exc))
            continue
        fence = fences.get(message.partition) or Fence()
        if isinstance(record, CoordinatorClaimed):
            if header_epoch(message.headers) == VOID_EPOCH:
                void(message, record, VOID_EPOCH, fence.epoch)  # an unreadable epoch header
                continue
            valid, fences[message.partition] = fence.claim(record.epoch)
            if valid:
                yield record, message
            else:
                void(message, record, record.epoch, fence.epoch)
            continue
        if not isinstance(record, JOURNAL_RECORDS):
            on_foreign(message, f"a {type(record).__name__} is not a journal event")
            continue
        epoch = epoch_of(message.headers)
        valid, fences[message.partition] = fence.admit(epoch)
        if valid:
            yield record, message
        else:
            void(message, record, epoch, fence.epoch)


class FencedMarks:
    """Which messages of a journal topic, read in offset order per partition, the fencing rule voids,
    and why (``cutline tail``). :func:`fenced_journal` judges each message, so that a reader that
    shows the journal marks exactly what every reader that folds it leaves out.

    ``learning``: the read starts in the middle of a partition (at its end), where a record of a
    higher epoch than any claim seen proves that claim (:class:`~events.wire.fencing.Fence`)."""

    def __init__(self, *, learning: bool) -> None:
        self._fences: dict[int, Fence] = {}
        self._learning = learning
        self._void: str | None = None

    def void(self, message: LogMessage) -> str | None:
        """Why ``message`` is void under the fencing rule (None: it is valid, or no journal record)."""
        if message.partition not in self._fences:
            self._fences[message.partition] = Fence(learning=self._learning)
        self._void = None
        for _ in fenced_journal([message], lambda m, problem: None, self._fences, self._on_void):
            pass
        return self._void

    def _on_void(self, message: LogMessage, record: JournalRecord, epoch: int, current: int) -> None:
        if epoch == VOID_EPOCH:
            self._void = f"its epoch header is unreadable ({excerpt(epoch_problem(message.headers))})"
        else:
            self._void = (
                f"fenced out: a {type(record).__name__} of epoch {epoch}, below the partition's epoch "
                f"{current} (a superseded coordinator wrote it; every reader leaves it out)"
            )


def read_journal_topic(
    bootstrap: str,
    topic: str,
    on_foreign: OnForeign,
    partitions: Iterable[int] | None = None,
    *,
    on_void: OnVoid | None = None,
    timeout: float | None = 60.0,
) -> Iterator[tuple[JournalEvent, LogMessage]]:
    """The effective journal: its valid events from the start to the current end, decoded, with
    each message (claims and void records left out, docs/design.md, "Ownership and fencing").

    Only the coordinator writes there; a message that is not a journal event is
    handed to ``on_foreign`` with the reason (it may raise, or log and go on).
    """
    messages = read_to_end(bootstrap, topic, partitions, timeout=timeout)
    for record, message in fenced_journal(messages, on_foreign, on_void=on_void):
        if not isinstance(record, CoordinatorClaimed):
            yield record, message


def _headers(raw: Any) -> HeaderDict:
    return HeaderDict(raw.items() if isinstance(raw, dict) else raw or ())
