"""What the journal and the dead letters say about one request of the command line: a checkpoint
or a savepoint (``cutline trigger``), a stop with a savepoint (``cutline stop``) or a cancel
(``cutline cancel``). Pure, record by record (:func:`follow`), so the commands only read and print.

Any request can be refused. The coordinator journals a ``TriggerRejected`` with the request's id
(the job is stopping, not all its tasks run, the savepoint target is not allowed, the queue is
full), or its shell sends the input to the dead-letter topic with a reason (``UNKNOWN_JOB`` for a
job that never reported a status); a dead letter names the topic, partition and offset of the
input, which is where the command sent it (:class:`Sent`).

A trigger's checkpoint may be queued, then is triggered (its id) and completes or aborts. A stop's
savepoint is triggered, then fails (the job keeps running) or completes, after which the job's
driver ends it FINISHED. A cancel makes the job CANCELLING, then its driver ends it CANCELED; a
cancel of a job that has ended changes nothing and is journaled nowhere, so its answer is the
job's status as the journal has it before the request (:func:`answer_before_sending`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeAlias

from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointKind,
    CheckpointRequested,
    CheckpointRequestQueued,
    CheckpointTriggered,
    DeadLetter,
    JobCancelRequested,
    JobStatus,
    JobStopRequested,
    Record,
    SchedulerStopped,
    TriggerRejected,
)

__all__ = [
    "DONE",
    "ENDED",
    "FAILED",
    "Progress",
    "Request",
    "Sent",
    "answer_before_sending",
    "follow",
    "requested",
    "timed_out",
]

Request: TypeAlias = CheckpointRequested | JobStopRequested | JobCancelRequested

DONE = 0
"""The exit code of a request that did what it asked: the checkpoint completed, the job ended as asked."""
FAILED = 1
"""The exit code of a request that was refused, failed, timed out, or whose job ended otherwise."""

ENDED = frozenset({JobStatus.FINISHED, JobStatus.CANCELED, JobStatus.FAILED})

UNKNOWN_JOB_HINT = "; `cutline list` shows the jobs the coordinator knows"


@dataclass(frozen=True, slots=True)
class Sent:
    """Where the request landed; the dead letter of a refused input names the same place."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Progress:
    """What is known of one request's outcome so far. ``exit_code`` is None until there is one
    (:data:`DONE` or :data:`FAILED`); after that, :func:`follow` changes nothing."""

    request: Request
    sent: Sent | None = None
    checkpoint_id: int | None = None
    """The checkpoint or savepoint triggered for the request (a cancel has none)."""
    completed: CheckpointCompleted | None = None
    cancelling: bool = False
    """A cancel made the job CANCELLING; its driver has yet to end it."""
    exit_code: int | None = None

    @property
    def job_id(self) -> str:
        return self.request.job_id

    @property
    def kind(self) -> str:
        """What the request takes: "checkpoint" or "savepoint" (a stop's is a savepoint)."""
        request = self.request
        if isinstance(request, CheckpointRequested) and request.kind is CheckpointKind.CHECKPOINT:
            return "checkpoint"
        return "savepoint"

    @property
    def wanted(self) -> JobStatus | None:
        """The status the request ends the job with: FINISHED for a stop, CANCELED for a cancel."""
        if isinstance(self.request, JobStopRequested):
            return JobStatus.FINISHED
        if isinstance(self.request, JobCancelRequested):
            return JobStatus.CANCELED
        return None

    @property
    def name(self) -> str:
        """How a refusal names the request."""
        match self.request:
            case JobStopRequested():
                return "stop"
            case JobCancelRequested():
                return "cancel"
        return f"{self.kind} of {self.job_id}"


def requested(request: Request, checkpoints_topic: str) -> str:
    """What ``--no-wait`` says it sent."""
    match request:
        case CheckpointRequested():
            into = f" into {request.target}" if request.target else ""
            what = f"{request.kind.lower()} of {request.job_id}"
        case JobStopRequested():
            into = f" with a savepoint into {request.target}" if request.target else " with a savepoint"
            what = f"stop of {request.job_id}"
        case JobCancelRequested():
            into, what = "", f"cancel of {request.job_id}"
    return (
        f"requested {what} (request {request.request_id}){into}; "
        f"follow it with `cutline tail {checkpoints_topic}`"
    )


def answer_before_sending(request: Request, status: JobStatus | None) -> tuple[Progress, list[str]] | None:
    """The answer to ``request`` when the job's status as journaled (None: no status) already is
    one, so that nothing is sent: a cancel of a job that has ended (the coordinator decides nothing
    for it). Exits :data:`DONE` when the job is CANCELED already. None: send the request."""
    if not isinstance(request, JobCancelRequested) or status not in ENDED:
        return None
    code = DONE if status is JobStatus.CANCELED else FAILED
    nothing = "" if code == DONE else "; nothing to cancel"
    return Progress(request, exit_code=code), [f"job {request.job_id} has already ended: {status}{nothing}"]


def follow(progress: Progress, record: Record) -> tuple[Progress, list[str]]:
    """Take one record of the job (from its journal or the dead letters); what to tell the operator."""
    if progress.exit_code is not None:
        return progress, []
    request_id = progress.request.request_id
    match record:
        case DeadLetter() if progress.sent is not None and _names(record, progress.sent):
            hint = UNKNOWN_JOB_HINT if record.reason == "UNKNOWN_JOB" else ""
            return _refused(progress, record.reason, record.message + hint)
        case TriggerRejected(request_id=rid) if rid == request_id:
            return _refused(progress, record.reason, record.message)
        case CheckpointRequestQueued(request_id=rid) if rid == request_id:
            return progress, [f"{progress.kind} queued: the job has as many checkpoints pending as it may"]
        case CheckpointTriggered(request_id=rid) if rid == request_id:
            into = f" into {record.location}" if record.kind is CheckpointKind.SAVEPOINT else ""
            triggered = dataclasses.replace(progress, checkpoint_id=record.checkpoint_id)
            return triggered, [f"{progress.kind} {record.checkpoint_id} triggered{into}"]
        case CheckpointAborted() if record.checkpoint_id == progress.checkpoint_id:
            return _aborted(progress, record)
        case CheckpointCompleted() if record.checkpoint_id == progress.checkpoint_id:
            return _completed(progress, record)
        case SchedulerStopped() if progress.wanted is not None:
            return _stopped(progress, record)
    return progress, []


def _names(letter: DeadLetter, sent: Sent) -> bool:
    return (letter.topic, letter.partition, letter.offset) == (sent.topic, sent.partition, sent.offset)


def _refused(progress: Progress, reason: str, message: str) -> tuple[Progress, list[str]]:
    return _ended(progress, FAILED), [f"{progress.name} refused ({reason}): {message}"]


def _ended(progress: Progress, code: int) -> Progress:
    return dataclasses.replace(progress, exit_code=code)


def _aborted(progress: Progress, record: CheckpointAborted) -> tuple[Progress, list[str]]:
    if progress.completed is not None:
        return progress, []
    keeps = "; the job keeps running" if progress.wanted is JobStatus.FINISHED else ""
    line = f"{progress.kind} {record.checkpoint_id} failed ({record.reason}): {record.message}{keeps}"
    return _ended(progress, FAILED), [line]


def _completed(progress: Progress, record: CheckpointCompleted) -> tuple[Progress, list[str]]:
    line = f"{progress.kind} {record.checkpoint_id} completed at {record.location} ({record.duration_ms} ms)"
    done = dataclasses.replace(progress, completed=record)
    if progress.wanted is None:  # a trigger: its checkpoint is what it asked for
        done = _ended(done, DONE)
    return done, [line]


def _stopped(progress: Progress, record: SchedulerStopped) -> tuple[Progress, list[str]]:
    if record.status is JobStatus.CANCELLING:
        cancelling = dataclasses.replace(progress, cancelling=True)
        return cancelling, [f"job {record.job_id} is CANCELLING (attempt {record.attempt})"]
    if record.status not in ENDED:
        return progress, []
    error = f" ({record.error})" if record.error else ""
    code = DONE if record.status is progress.wanted else FAILED
    return _ended(progress, code), [f"job {record.job_id} is {record.status}{error}"]


def timed_out(progress: Progress, timeout: float) -> str:
    """What to say when no outcome came within ``timeout`` seconds."""
    if progress.completed is not None:
        return (
            f"savepoint {progress.completed.checkpoint_id} completed, but the job did not report "
            f"{progress.wanted} within {timeout:g} s: is its driver stopping?"
        )
    if progress.checkpoint_id is not None:
        return (
            f"{progress.kind} {progress.checkpoint_id} did not complete within {timeout:g} s "
            f"(`cutline status {progress.job_id}` shows whether it still may)"
        )
    if progress.cancelling:
        return f"job {progress.job_id} did not end within {timeout:g} s: is its driver stopping?"
    return (
        f"no answer to the request within {timeout:g} s: is a `cutline coordinator` running, and does "
        f"it know job {progress.job_id!r} (see `cutline tail dead-letters --from-beginning`)?"
    )
