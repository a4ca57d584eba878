"""A task's answer to a barrier: the barrier and the outcome of its snapshot in, the exact ack or
decline out. Pure: no Kafka, no files, no clock (docs/design.md, "The task side").

Every task (a :class:`~events.task.participant.Participant`, a Spark partition task, a keyed shuffle
task) takes its snapshot in its own shell, then calls :func:`answer` with what came of it:

- :class:`Snapshotted`: the snapshot's bytes, the URI they were written to (or that names them
  when they ride inline in the ack) and the cut's offsets: an ack with the handle (size, sha256);
- :class:`Failed`: a decline with a Flink failure reason and what to fix (:func:`failure` turns an
  exception into one).

The checks are the ones the coordinator would make of the reply (docs/design.md, "The checkpoint
decider", rule 4), made here first so that a task declines, with the reason, rather than sends an
ack the coordinator refuses: the handle strictly inside the barrier's location, offsets keys it
accepts, inline bytes only within the barrier's limit. The reply names the barrier's job, id and
attempt, and :attr:`Answer.headers` the coordinator epoch of the barrier it answers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from events.wire.fencing import epoch_header
from events.wire.records import CheckpointAcknowledged, CheckpointBarrier, CheckpointDeclined, StateHandle
from events.wire.topics import Topics
from events.wire.validation import is_within, parse_offsets
from events.wire.vocabulary import DeclineReason

__all__ = [
    "Answer",
    "Failed",
    "SnapshotOutcome",
    "Reply",
    "Snapshotted",
    "answer",
    "barrier_epoch",
    "failure",
    "fits_inline",
]

Reply = CheckpointAcknowledged | CheckpointDeclined


@dataclass(frozen=True)
class Snapshotted:
    """The task's snapshot at the cut: ``data`` written at ``uri``, or riding in the ack (``inline``:
    nothing was written, ``uri`` only names it); ``offsets`` maps ``topic:partition`` to the next
    offset to read after the cut."""

    uri: str
    data: bytes
    offsets: Mapping[str, int]
    metrics: Mapping[str, int] = field(default_factory=dict)
    inline: bool = False


@dataclass(frozen=True)
class Failed:
    """The task could not snapshot: a Flink failure ``reason`` and a ``message`` saying what to fix."""

    reason: str
    message: str


SnapshotOutcome = Snapshotted | Failed


@dataclass(frozen=True)
class Answer:
    """The reply to one barrier and the coordinator epoch it answers (None: not known)."""

    reply: Reply
    epoch: int | None

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        """The Kafka headers the reply goes out with: the epoch of the barrier it answers (the
        coordinator refuses answers to a superseded coordinator's barriers)."""
        return [] if self.epoch is None else [epoch_header(self.epoch)]

    def topic(self, topics: Topics) -> str:
        """Where the reply goes: the acks topic or the declines topic."""
        return topics.acks if isinstance(self.reply, CheckpointAcknowledged) else topics.declines


def failure(exc: BaseException) -> Failed:
    """The decline of a snapshot that raised ``exc``: IO_EXCEPTION for an OSError (the storage),
    TASK_CHECKPOINT_FAILURE for anything else."""
    reason = DeclineReason.IO_EXCEPTION if isinstance(exc, OSError) else DeclineReason.TASK_CHECKPOINT_FAILURE
    return Failed(reason, f"{type(exc).__name__}: {exc}")


def fits_inline(data: bytes, barrier: CheckpointBarrier) -> bool:
    """May ``data`` ride inline in the ack to ``barrier`` instead of being written to a file?

    The coordinator allows it up to the barrier's ``inline_limit_bytes`` (the job's
    ``inline_threshold_bytes``, shared out among its tasks), as Flink keeps state below its memory
    threshold in the checkpoint's metadata. The coordinator's journal makes the bytes durable once
    it accepts the ack; no file, no fsync.
    """
    return 0 < barrier.inline_limit_bytes and len(data) <= barrier.inline_limit_bytes


def barrier_epoch(epoch: object) -> int | None:
    """The coordinator epoch a barrier names, if it is one (a non-negative int), else None."""
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0 else None


def answer(
    barrier: CheckpointBarrier, epoch: int | None, task_id: str, outcome: SnapshotOutcome, now_ms: int
) -> Answer:
    """The reply of ``task_id`` to ``barrier`` (sent by coordinator ``epoch``) at ``now_ms``: the ack
    of a :class:`Snapshotted` that passes the checks (see the module docstring), else the decline
    saying why."""
    if isinstance(outcome, Snapshotted):
        problem = _snapshot_problem(barrier, outcome)
        outcome = outcome if problem is None else problem
    return Answer(_reply(barrier, task_id, outcome, now_ms), barrier_epoch(epoch))


def _reply(barrier: CheckpointBarrier, task_id: str, outcome: SnapshotOutcome, now_ms: int) -> Reply:
    if isinstance(outcome, Failed):
        return CheckpointDeclined(
            job_id=barrier.job_id,
            checkpoint_id=barrier.checkpoint_id,
            attempt=barrier.attempt,
            task_id=task_id,
            timestamp_ms=now_ms,
            reason=outcome.reason,
            message=outcome.message,
        )
    data = outcome.data
    handle = StateHandle(
        uri=outcome.uri,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        inline=data if outcome.inline else None,
    )
    return CheckpointAcknowledged(
        job_id=barrier.job_id,
        checkpoint_id=barrier.checkpoint_id,
        attempt=barrier.attempt,
        task_id=task_id,
        timestamp_ms=now_ms,
        state=handle,
        offsets=dict(outcome.offsets),
        metrics=dict(outcome.metrics),
    )


def _snapshot_problem(barrier: CheckpointBarrier, snapshot: Snapshotted) -> Failed | None:
    """Why the coordinator would refuse an ack of ``snapshot`` to ``barrier``, as a decline."""
    try:
        parse_offsets(snapshot.offsets)
    except ValueError as exc:
        return failure(exc)
    if not is_within(snapshot.uri, barrier.location):
        return Failed(
            DeclineReason.TASK_CHECKPOINT_FAILURE,
            f"the snapshot {snapshot.uri} is not inside the checkpoint location {barrier.location}",
        )
    if snapshot.inline and not fits_inline(snapshot.data, barrier):
        return Failed(
            DeclineReason.TASK_CHECKPOINT_FAILURE,
            f"{len(snapshot.data)} bytes of inline state, but the barrier allows "
            f"{barrier.inline_limit_bytes}: write the snapshot to its uri",
        )
    return None
