"""What the journal says about one ``cutline stop`` or ``cutline cancel`` request: pure, record by
record, so the command only reads and prints.

A stop is refused (``TriggerRejected`` of its request), or its savepoint is triggered and then
fails (``CheckpointAborted``: the job keeps running) or completes, after which the job's driver
ends it FINISHED. A cancel makes the job CANCELLING, then its driver ends it CANCELED.
"""

from __future__ import annotations

from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointTriggered,
    JobCancelRequested,
    JobStatus,
    JobStopRequested,
    Record,
    SchedulerStopped,
    TriggerRejected,
)

ENDED = frozenset({JobStatus.FINISHED, JobStatus.CANCELED, JobStatus.FAILED})


class StopFollower:
    """Folds the job's journal records into the request's outcome: ``exit_code`` is None until
    there is one (0: the job ended as asked; 1: refused, failed or ended otherwise)."""

    def __init__(self, request: JobStopRequested | JobCancelRequested) -> None:
        self.request = request
        self.savepoint: int | None = None
        self.completed: CheckpointCompleted | None = None
        self.exit_code: int | None = None

    @property
    def wanted(self) -> JobStatus:
        return JobStatus.FINISHED if isinstance(self.request, JobStopRequested) else JobStatus.CANCELED

    def read(self, record: Record) -> list[str]:
        """Take one journal record of the job; what to tell the operator about it."""
        request_id = self.request.request_id
        match record:
            case TriggerRejected(request_id=rid) if rid == request_id:
                self.exit_code = 1
                return [f"stop refused ({record.reason}): {record.message}; the job keeps running"]
            case CheckpointTriggered(request_id=rid) if rid == request_id:
                self.savepoint = record.checkpoint_id
                return [f"savepoint {record.checkpoint_id} triggered into {record.location}"]
            case CheckpointAborted() if record.checkpoint_id == self.savepoint and self.completed is None:
                self.exit_code = 1
                return [
                    f"savepoint {record.checkpoint_id} failed ({record.reason}): {record.message}; "
                    "the job keeps running"
                ]
            case CheckpointCompleted() if record.checkpoint_id == self.savepoint:
                self.completed = record
                return [f"savepoint {record.checkpoint_id} completed at {record.location}"]
            case SchedulerStopped():
                return self._stopped(record)
        return []

    def _stopped(self, record: SchedulerStopped) -> list[str]:
        if record.status is JobStatus.CANCELLING:
            return [f"job {record.job_id} is CANCELLING (attempt {record.attempt})"]
        if record.status not in ENDED:
            return []
        self.exit_code = 0 if record.status is self.wanted else 1
        error = f" ({record.error})" if record.error else ""
        return [f"job {record.job_id} is {record.status}{error}"]

    def timed_out(self, timeout: float) -> str:
        """What to say when no outcome came within ``timeout`` seconds."""
        if self.completed is not None:
            return (
                f"savepoint {self.completed.checkpoint_id} completed, but the job did not report "
                f"{self.wanted} within {timeout:g} s: is its driver stopping?"
            )
        if self.savepoint is not None:
            return f"savepoint {self.savepoint} did not complete within {timeout:g} s"
        return (
            f"no answer to the request within {timeout:g} s: is a `cutline coordinator` running, and does "
            f"it know job {self.request.job_id!r} (see `cutline tail dead-letters --from-beginning`)?"
        )
