"""What `cutline trigger`, `cutline stop` and `cutline cancel` tell the operator, record by record
(coordinator/replay/stop_outcome.py): every request ends with an exit code and a line that says why,
a refusal included (for example a stop sent before a restored attempt runs all its tasks)."""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.replay.stop_outcome import (
    DONE,
    FAILED,
    Progress,
    Sent,
    answer_before_sending,
    follow,
    timed_out,
)
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

JOB = "orders"
STOP = JobStopRequested(job_id=JOB, timestamp_ms=1_000, request_id="r-stop")
SAVEPOINT = CheckpointRequested(
    job_id=JOB, kind=CheckpointKind.SAVEPOINT, timestamp_ms=1_000, request_id="r-sp"
)
CANCEL = JobCancelRequested(job_id=JOB, timestamp_ms=1_000, request_id="r-cancel")


def triggered(checkpoint_id: int, request_id: str, kind: CheckpointKind = CheckpointKind.SAVEPOINT) -> Record:
    return CheckpointTriggered(
        job_id=JOB, checkpoint_id=checkpoint_id, attempt=2, kind=kind, timestamp_ms=1_010,
        location=f"file:///ckpt/{JOB}/savepoint-{checkpoint_id}", tasks=("t0", "t1"),
        deadline_ms=61_010, request_id=request_id,
    )  # fmt: skip


def completed(checkpoint_id: int) -> Record:
    return CheckpointCompleted(
        job_id=JOB, checkpoint_id=checkpoint_id, kind=CheckpointKind.SAVEPOINT, timestamp_ms=1_050,
        duration_ms=40, handles={}, size_bytes=0, offsets={}, attempt=2,
        location=f"file:///ckpt/{JOB}/savepoint-{checkpoint_id}",
    )  # fmt: skip


def stopped(status: JobStatus, error: str | None = None) -> Record:
    return SchedulerStopped(job_id=JOB, attempt=2, timestamp_ms=1_100, status=status, error=error)


def run(progress: Progress, records: Iterable[Record]) -> tuple[Progress, list[str]]:
    said: list[str] = []
    for record in records:
        progress, lines = follow(progress, record)
        said += lines
    return progress, said


class TestRefusals:
    def test_a_stop_before_the_restored_attempt_runs_all_its_tasks_is_refused_saying_why(self) -> None:
        # given: a stop sent while the restored attempt's tasks are still starting
        # when: the coordinator journals its refusal
        rejected = TriggerRejected(
            job_id=JOB, reason="NOT_ALL_REQUIRED_TASKS_RUNNING", request_id="r-stop",
            kind=CheckpointKind.SAVEPOINT, message="attempt 2 is CREATED, not RUNNING",
        )  # fmt: skip
        progress, said = run(Progress(STOP), [rejected])
        # then: the command fails at once, naming the reason and the coordinator's message
        assert progress.exit_code == FAILED
        assert said == ["stop refused (NOT_ALL_REQUIRED_TASKS_RUNNING): attempt 2 is CREATED, not RUNNING"]

    def test_another_request_s_refusal_is_not_this_one_s(self) -> None:
        other = TriggerRejected(job_id=JOB, reason="NOT_ALL_REQUIRED_TASKS_RUNNING", request_id="r-other")
        progress, said = run(Progress(STOP), [other])
        assert progress.exit_code is None and said == []

    def test_a_dead_letter_of_the_request_names_an_unknown_job_and_how_to_list_the_known_ones(self) -> None:
        sent = Sent("cutline.requests", 3, 41)
        letter = DeadLetter(
            topic="cutline.requests", partition=3, offset=41, reason="UNKNOWN_JOB",
            message=f"no status of job {JOB}", timestamp_ms=1_005,
        )  # fmt: skip
        progress, said = run(Progress(SAVEPOINT, sent=sent), [letter])
        assert progress.exit_code == FAILED
        assert said[0].startswith(f"savepoint of {JOB} refused (UNKNOWN_JOB): no status of job {JOB}")
        assert "`cutline list`" in said[0]

    def test_a_dead_letter_of_another_input_is_not_this_request_s(self) -> None:
        letter = DeadLetter(
            topic="cutline.requests", partition=3, offset=40, reason="UNKNOWN_JOB", message="",
            timestamp_ms=1_005,
        )  # fmt: skip
        progress, _ = run(Progress(SAVEPOINT, sent=Sent("cutline.requests", 3, 41)), [letter])
        assert progress.exit_code is None


class TestStop:
    def test_a_stop_succeeds_when_its_savepoint_completes_and_the_job_finishes(self) -> None:
        progress, said = run(
            Progress(STOP), [triggered(7, "r-stop"), completed(7), stopped(JobStatus.FINISHED)]
        )
        assert progress.exit_code == DONE
        assert said == [
            f"savepoint 7 triggered into file:///ckpt/{JOB}/savepoint-7",
            f"savepoint 7 completed at file:///ckpt/{JOB}/savepoint-7 (40 ms)",
            f"job {JOB} is FINISHED",
        ]

    def test_a_stop_whose_savepoint_failed_says_the_job_keeps_running(self) -> None:
        aborted = CheckpointAborted(
            job_id=JOB, checkpoint_id=7, timestamp_ms=1_200, reason="CHECKPOINT_EXPIRED", message="60 s"
        )
        progress, said = run(Progress(STOP), [triggered(7, "r-stop"), aborted])
        assert progress.exit_code == FAILED
        assert said[-1] == "savepoint 7 failed (CHECKPOINT_EXPIRED): 60 s; the job keeps running"

    def test_a_stop_whose_job_then_fails_fails_with_the_job_s_error(self) -> None:
        records = [triggered(7, "r-stop"), completed(7), stopped(JobStatus.FAILED, "driver lost")]
        progress, said = run(Progress(STOP), records)
        assert progress.exit_code == FAILED and said[-1] == f"job {JOB} is FAILED (driver lost)"

    def test_a_stop_waits_for_the_job_after_its_savepoint_and_says_so_when_it_times_out(self) -> None:
        progress, _ = run(Progress(STOP), [triggered(7, "r-stop"), completed(7)])
        assert progress.exit_code is None
        assert "did not report FINISHED within 30 s" in timed_out(progress, 30)


class TestTriggerAndCancel:
    def test_a_queued_savepoint_says_so_and_completes_later(self) -> None:
        queued = CheckpointRequestQueued(
            job_id=JOB, kind=CheckpointKind.SAVEPOINT, periodic=False, timestamp_ms=1_001, request_id="r-sp"
        )
        progress, said = run(Progress(SAVEPOINT), [queued, triggered(8, "r-sp"), completed(8)])
        assert progress.exit_code == DONE
        assert said[0] == "savepoint queued: the job has as many checkpoints pending as it may"

    def test_nothing_is_said_after_the_outcome(self) -> None:
        progress, said = run(
            Progress(SAVEPOINT), [triggered(8, "r-sp"), completed(8), stopped(JobStatus.FAILED)]
        )
        assert progress.exit_code == DONE and len(said) == 2

    def test_a_cancel_of_a_job_that_ended_is_answered_without_sending(self) -> None:
        answered = answer_before_sending(CANCEL, JobStatus.FINISHED)
        assert answered is not None
        progress, said = answered
        assert progress.exit_code == FAILED
        assert said == [f"job {JOB} has already ended: FINISHED; nothing to cancel"]
        assert answer_before_sending(CANCEL, JobStatus.RUNNING) is None

    def test_a_cancel_succeeds_once_the_driver_ends_the_job_canceled(self) -> None:
        progress, said = run(Progress(CANCEL), [stopped(JobStatus.CANCELLING), stopped(JobStatus.CANCELED)])
        assert progress.exit_code == DONE
        assert said == [f"job {JOB} is CANCELLING (attempt 2)", f"job {JOB} is CANCELED"]
