"""Which savepoints the journal lists, and which locations a restore may still need."""

from __future__ import annotations

from coordinator.savepoints import needed_locations, savepoints, why_needed
from coordinator.state import JobState
from events.records import (
    CheckpointCompleted,
    CheckpointKind,
    CheckpointRestored,
    JobRestartScheduled,
    JobStatus,
)


def completed(job: str, checkpoint_id: int, kind: CheckpointKind, location: str) -> CheckpointCompleted:
    return CheckpointCompleted(job, checkpoint_id, kind, 1_000 * checkpoint_id, 10, {}, 0, {}, 1, location)


def test_savepoints_are_the_completed_savepoints_of_the_job_in_journal_order() -> None:
    journal = [
        completed("a", 1, CheckpointKind.SAVEPOINT, "file:///sp/a1"),
        completed("a", 2, CheckpointKind.CHECKPOINT, "file:///ck/a/chk-2"),
        completed("b", 1, CheckpointKind.SAVEPOINT, "file:///sp/b1"),
        completed("a", 3, CheckpointKind.SAVEPOINT, "file:///sp/a3"),
    ]

    assert [1, 3] == [s.checkpoint_id for s in savepoints(journal, "a")]
    assert ["file:///sp/a1", "file:///sp/b1", "file:///sp/a3"] == [s.location for s in savepoints(journal)]


def test_retained_checkpoints_are_needed_and_an_old_savepoint_is_not() -> None:
    """Given a job with two retained checkpoints that started from a savepoint, the checkpoints
    are needed (a restore may name them) and the savepoint no longer is."""
    state = JobState(
        "a",
        JobStatus.RUNNING,
        attempt=1,
        completed=(
            completed("a", 4, CheckpointKind.CHECKPOINT, "file:///ck/a/chk-4"),
            completed("a", 5, CheckpointKind.CHECKPOINT, "file:///ck/a/chk-5"),
        ),
        restored=CheckpointRestored("a", 3, 1, 0, "file:///sp/a3"),
    )

    needed = needed_locations({"a": state})

    assert {"file:///ck/a/chk-4", "file:///ck/a/chk-5"} == set(needed)
    assert why_needed("file:///sp/a3", {"a": state}) is None
    assert "checkpoint 5 of job a is retained" == why_needed("file:///ck/a/chk-5/", {"a": state})


def test_what_a_job_restored_is_needed_until_it_completes_a_checkpoint() -> None:
    state = JobState(
        "b", JobStatus.RUNNING, attempt=1, restored=CheckpointRestored("b", 3, 1, 0, "file:///sp/a3")
    )

    reason = why_needed("file:///sp/%61%33", {"b": state})  # the same location, spelled otherwise

    assert reason is not None and "job b restored it in attempt 1" in reason


def test_the_restore_point_of_a_scheduled_restart_is_needed() -> None:
    restart = JobRestartScheduled(
        "c", 2, 0, 1_000, "boom", 1, restore_checkpoint_id=7, restore_location="file:///x/7"
    )
    state = JobState("c", JobStatus.RESTARTING, attempt=1, restart=restart)

    assert "job c's scheduled restart (attempt 2) restores it" == why_needed("file:///x/7", {"c": state})
