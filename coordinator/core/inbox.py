"""An input message as the coordinator takes it in: its envelope checked, its command, or its dead letter.

Pure: the runtime (:mod:`coordinator.service.runtime`) decodes the bytes and asks these.

- :func:`envelope_problem`: the record belongs on its topic, is keyed by its job id and arrived in
  its job's partition (docs/design.md, "The checkpoint decider"), or why not;
- :func:`command_for`: the command an accepted record asks for, stamped with the time (and the
  first-trigger jitter) as data;
- :func:`dead_letter`: the dead letter of a refused input, cut to fit its topic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

from coordinator.core.admission import preview
from coordinator.core.commands import (
    AcknowledgeCheckpoint,
    CancelJob,
    ChangeJobStatus,
    ChangeTaskStatus,
    Command,
    DeclineCheckpoint,
    RecordHeartbeat,
    RequestCheckpoint,
    StopJob,
)
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointDeclined,
    CheckpointRequested,
    DeadLetter,
    InputRecord,
    JobCancelRequested,
    JobHeartbeat,
    JobStatusChanged,
    JobStopRequested,
    LatencyMeasured,
    Record,
    TaskStatusChanged,
)
from events.wire.vocabulary import DeadLetterReason

__all__ = ["ACCEPTED", "MAX_DEAD_LETTER_VALUE", "command_for", "dead_letter", "envelope_problem"]

ACCEPTED: Mapping[str, tuple[type[Record], ...]] = {
    "job_status": (JobStatusChanged, TaskStatusChanged, JobHeartbeat),
    "requests": (CheckpointRequested, JobStopRequested, JobCancelRequested),
    "acks": (CheckpointAcknowledged, LatencyMeasured),
    "declines": (CheckpointDeclined,),
}
"""Which records each input topic (by its name in :class:`events.wire.topics.Topics`) may carry."""

MAX_DEAD_LETTER_VALUE = 512 * 1024
"""A dead letter keeps at most this many bytes of the input's value (and says so), so that it
still fits in a Kafka message next to the key and the reason."""


def envelope_problem(
    topic: str,
    accepted: tuple[type[Record], ...],
    record: Record,
    key: bytes | None,
    partition: int,
    partitions: int | None,
    home: Callable[[str], int],
) -> tuple[str, str] | None:
    """Why ``record``, read at ``topic[partition]`` under ``key``, is a dead letter (reason,
    message), or None; ``accepted``: the kinds the topic takes; ``home``: a job's partition of the
    ``partitions`` (None: not known; then, or for an input of no partition, it is not checked)."""
    if not isinstance(record, accepted):
        names = ", ".join(k.__name__ for k in accepted) or "nothing"
        return (
            DeadLetterReason.WRONG_TOPIC,
            f"{type(record).__name__} does not belong on {topic} (it takes {names})",
        )
    job_id = cast(InputRecord, record).job_id  # every kind a topic accepts is an input record
    if key is None:
        return DeadLetterReason.MISSING_KEY, (
            f"the message has no key; key every message by its job id ({job_id!r}), so that it "
            "reaches the partition, and the coordinator worker, that owns the job"
        )
    if key != job_id.encode():
        return DeadLetterReason.KEY_MISMATCH, (
            f"message key {key!r} is not the record's job id {job_id!r}; key every message by job_id"
        )
    if partitions is not None and partition >= 0 and partition != (expected := home(job_id)):
        return DeadLetterReason.WRONG_PARTITION, (
            f"a {type(record).__name__} of job {job_id!r} arrived in partition {partition}, but the "
            f"job's partition is {expected} of {partitions}: its key hashed with murmur2, as Java's "
            "client and Faust hash it, so that every event of a job reaches the worker that owns it. "
            'Produce with a murmur2 partitioner (confluent-kafka: "partitioner": "murmur2_random", as '
            "events.kafka.clients.producer_config sets it)"
        )
    return None


def command_for(
    record: InputRecord, now_ms: int, jitter: Callable[[], float], savepoint_roots: tuple[str, ...]
) -> Command:
    """What ``record`` asks the decider, at ``now_ms``; ``jitter`` draws a job start's jitter."""
    match record:
        case CheckpointAcknowledged():  # first: nearly every input is an ack
            return AcknowledgeCheckpoint(record, now_ms)
        case JobStatusChanged():
            return ChangeJobStatus(record, now_ms, jitter=jitter())
        case TaskStatusChanged():
            return ChangeTaskStatus(record, now_ms)
        case CheckpointRequested():
            return RequestCheckpoint(record, now_ms, savepoint_roots)
        case JobStopRequested():
            return StopJob(record, now_ms, savepoint_roots)
        case JobCancelRequested():
            return CancelJob(record, now_ms)
        case CheckpointDeclined():
            return DeclineCheckpoint(record, now_ms)
        case JobHeartbeat():
            return RecordHeartbeat(record, now_ms)
    raise TypeError(f"no command for {type(record).__name__}")  # pragma: no cover


def dead_letter(
    at: tuple[str, int, int],
    key: bytes | None,
    value: bytes | None,
    now_ms: int,
    reason: str,
    message: str,
    job_id: str | None,
    limit: int,
) -> DeadLetter:
    """The dead letter of the input at ``at`` (topic, partition, offset), bounded so that it fits
    the dead-letter topic's ``limit``: its message may quote the input (a 600 KB task id), its key
    and value are the input's."""
    kept = preview(message, key, value, job_id, limit, MAX_DEAD_LETTER_VALUE)
    topic, partition, offset = at
    return DeadLetter(
        topic=topic,
        partition=partition,
        offset=offset,
        reason=reason,
        message=_printable(kept.message),
        timestamp_ms=now_ms,
        key=kept.key,
        value=kept.value,
        job_id=_printable(kept.job_id) if kept.job_id else kept.job_id,
    )


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
