"""Checkpoint statistics shaped like Flink's REST API, folded from the journal."""

from __future__ import annotations

import hashlib
from typing import Any

from coordinator.core.decider import evolve
from coordinator.core.state import JobState, initial_state
from coordinator.core.stats import (
    HISTORY_SIZE,
    TASK_DETAILS_LIMIT,
    CheckpointStats,
    checkpoints_json,
    config_json,
    details_json,
    task_rows,
    track,
    with_progress,
)
from coordinator.core.testing import JOB, LOCATION, ack, config, decline, request, run_commands, running, tick
from events.wire.records import CheckpointKind, StateHandle


def folded(*commands: object) -> tuple[JobState, CheckpointStats | None]:
    """The job's state and its statistics as the views show them after ``commands``."""
    _, events = run_commands(commands)  # type: ignore[arg-type]
    state: JobState = initial_state(JOB)
    stats: CheckpointStats | None = None
    for event in events:
        stats = track(stats, state, event)  # type: ignore[arg-type]
        state = evolve(state, event)
    return state, with_progress(stats, state)


def stats_of(*commands: object) -> CheckpointStats | None:
    """The statistics as the views show them after ``commands``."""
    return folded(*commands)[1]


def handle(checkpoint_id: int, task: str, size: int) -> StateHandle:
    return StateHandle(f"{LOCATION}/{JOB}/chk-{checkpoint_id}/{task}", size, "x")


def inline(checkpoint_id: int, task: str, size: int) -> StateHandle:
    """A snapshot of ``size`` bytes that rides inside the ack."""
    data = b"s" * size
    return StateHandle(
        f"{LOCATION}/{JOB}/chk-{checkpoint_id}/{task}", size, hashlib.sha256(data).hexdigest(), data
    )


def details(checkpoint_id: int, *commands: object) -> dict[str, Any]:
    """``/checkpoints/details/<checkpoint_id>`` after ``commands``."""
    state, stats = folded(*commands)
    assert stats is not None
    entry = stats.entry(checkpoint_id)
    assert entry is not None, f"checkpoint {checkpoint_id} is not shown"
    return details_json(entry, task_rows(stats, state, checkpoint_id))


def task(
    task_id: str, status: str, at: int | None, took: int | None, size: int, storage: str | None
) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "status": status,
        "ack_timestamp": at,
        "end_to_end_duration": took,
        "state_size": size,
        "storage": storage,
    }


class TestCounts:
    def test_counts_completed_failed_and_in_progress(self) -> None:
        """One completed, one declined and one pending checkpoint are counted as such."""
        stats = stats_of(
            running(cfg=config(tolerable_failures=9), at=0),
            tick(1000),
            ack(1, "t0", at=1010),
            ack(1, "t1", at=1020),
            tick(2000),
            decline(2, "t0", at=2001),
            tick(3000),
        )

        body = checkpoints_json(stats)

        assert {"restored": 0, "total": 3, "in_progress": 1, "completed": 1, "failed": 1} == body["counts"]
        assert [3, 2, 1] == [entry["id"] for entry in body["history"]]
        assert ["in_progress", "failed", "completed"] == [entry["@class"] for entry in body["history"]]

    def test_restores_are_counted(self) -> None:
        """A RUNNING status that restored checkpoint 7 counts one restore and names it latest."""
        body = checkpoints_json(stats_of(running(restored_from=7, at=0)))

        assert 1 == body["counts"]["restored"]
        assert 7 == body["latest"]["restored"]["id"]


class TestLatestAndSummary:
    def test_latest_completed_and_savepoint_with_sizes_and_durations(self) -> None:
        """The latest completed checkpoint and savepoint carry acks, size, duration and path."""
        stats = stats_of(
            running(at=0),
            tick(1000),
            ack(1, "t0", at=1010, state=handle(1, "t0", 100)),
            ack(1, "t1", at=1040, state=handle(1, "t1", 50)),
            request(CheckpointKind.SAVEPOINT, at=1500),
            ack(2, "t0", at=1510),
            ack(2, "t1", at=1520),
        )

        latest = checkpoints_json(stats)["latest"]

        completed = latest["completed"]
        assert (1, 2, 2, 150, 40) == (
            completed["id"],
            completed["num_subtasks"],
            completed["num_acknowledged_subtasks"],
            completed["state_size"],
            completed["end_to_end_duration"],
        )
        assert f"{LOCATION}/{JOB}/chk-1" == completed["external_path"]
        assert (2, True) == (latest["savepoint"]["id"], latest["savepoint"]["is_savepoint"])

    def test_summary_percentiles(self) -> None:
        """The duration summary has min, max, avg and percentiles over completed checkpoints."""
        commands: list[object] = [running(at=0)]
        for n, duration in enumerate([10, 20, 30, 40], start=1):
            commands += [tick(n * 1000), ack(n, "t0", at=n * 1000), ack(n, "t1", at=n * 1000 + duration)]

        summary = checkpoints_json(stats_of(*commands))["summary"]["end_to_end_duration"]

        assert (10, 40, 25.0, 30) == (summary["min"], summary["max"], summary["avg"], summary["p50"])

    def test_failed_entries_say_why(self) -> None:
        """A failed checkpoint's entry has its failure time and reason: message."""
        stats = stats_of(
            running(cfg=config(tolerable_failures=9), at=0), tick(1000), decline(1, "t1", at=1005)
        )

        failed = checkpoints_json(stats)["latest"]["failed"]

        assert 1005 == failed["failure_timestamp"]
        assert failed["failure_message"].startswith("CHECKPOINT_DECLINED: task t1 declined")


class TestProgress:
    def test_an_in_progress_checkpoint_shows_its_acks_so_far(self) -> None:
        """A checkpoint that two of three tasks acknowledged shows 2/3, their summed size and the
        latest ack's time, in the history and in its details."""
        stats = stats_of(
            running(tasks=("t0", "t1", "t2"), at=0),
            tick(1000),
            ack(1, "t1", at=1040, state=handle(1, "t1", 50)),
            ack(1, "t0", at=1010, state=handle(1, "t0", 100)),
        )

        entry = checkpoints_json(stats)["history"][0]

        assert ("in_progress", 3, 2, 150, 1040) == (
            entry["@class"],
            entry["num_subtasks"],
            entry["num_acknowledged_subtasks"],
            entry["state_size"],
            entry["latest_ack_timestamp"],
        )
        assert stats is not None and stats.entry(1) == stats.history[0]

    def test_a_checkpoint_without_acks_shows_none(self) -> None:
        """Just triggered: 0 of 2 acknowledged, no size, no latest ack."""
        entry = checkpoints_json(stats_of(running(at=0), tick(1000)))["history"][0]

        assert (0, 0, None) == (
            entry["num_acknowledged_subtasks"],
            entry["state_size"],
            entry["latest_ack_timestamp"],
        )

    def test_a_failed_checkpoint_keeps_the_acks_it_had(self) -> None:
        """Aborted after one ack: the failed entry says 1 of 3 acknowledged, with that ack's size,
        although its acks are no longer pending."""
        stats = stats_of(
            running(tasks=("t0", "t1", "t2"), cfg=config(tolerable_failures=9), at=0),
            tick(1000),
            ack(1, "t0", at=1010, state=handle(1, "t0", 70)),
            decline(1, "t1", at=1020),
        )

        failed = checkpoints_json(stats)["latest"]["failed"]

        assert (1, 1, 70, 1010) == (
            failed["id"],
            failed["num_acknowledged_subtasks"],
            failed["state_size"],
            failed["latest_ack_timestamp"],
        )

    def test_nothing_pending_leaves_the_statistics_as_they_are(self) -> None:
        """With no checkpoint pending there is nothing to add: the same object comes back."""
        stats = stats_of(running(at=0), tick(1000), ack(1, "t0", at=1010), ack(1, "t1", at=1020))
        state = initial_state(JOB)

        assert stats is with_progress(stats, state)
        assert with_progress(None, state) is None


class TestConfig:
    def test_config_view(self) -> None:
        """The config view names Flink's fields."""
        body = config_json(config(interval_ms=500, max_concurrent=2))

        assert (500, 10_000, 2, 1) == (
            body["interval"],
            body["timeout"],
            body["max_concurrent"],
            body["num_retained"],
        )
        assert {} == config_json(None)


class TestDetails:
    """The drill-down of one checkpoint (``/checkpoints/details/<id>``): each of its tasks."""

    def test_a_completed_checkpoint_lists_each_task_with_its_ack_time_duration_size_and_storage(self) -> None:
        """Task t0 wrote its snapshot to a file and acknowledged 10 ms after the trigger; t1 sent
        its snapshot inline 40 ms after."""
        body = details(
            1,
            running(cfg=config(inline_threshold_bytes=1024), at=0),
            tick(1000),
            ack(1, "t0", at=1010, state=handle(1, "t0", 100)),
            ack(1, "t1", at=1040, state=inline(1, "t1", 50)),
        )

        assert ("COMPLETED", 1040) == (body["status"], body["latest_ack_timestamp"])
        assert [
            task("t0", "ACKNOWLEDGED", 1010, 10, 100, "file"),
            task("t1", "ACKNOWLEDGED", 1040, 40, 50, "inline"),
        ] == body["tasks"]

    def test_a_pending_checkpoint_shows_which_tasks_it_still_waits_for(self) -> None:
        body = details(
            1,
            running(tasks=("t0", "t1", "t2"), at=0),
            tick(1000),
            ack(1, "t1", at=1030, state=handle(1, "t1", 7)),
        )

        assert "IN_PROGRESS" == body["status"]
        assert [
            task("t0", "PENDING", None, None, 0, None),
            task("t1", "ACKNOWLEDGED", 1030, 30, 7, "file"),
            task("t2", "PENDING", None, None, 0, None),
        ] == body["tasks"]

    def test_a_failed_checkpoint_names_the_tasks_that_never_acknowledged(self) -> None:
        body = details(
            1,
            running(cfg=config(tolerable_failures=9), at=0),
            tick(1000),
            ack(1, "t0", at=1010, state=handle(1, "t0", 70)),
            decline(1, "t1", at=1020),
        )

        assert "FAILED" == body["status"]
        assert [
            task("t0", "ACKNOWLEDGED", 1010, 10, 70, "file"),
            task("t1", "NOT_ACKNOWLEDGED", None, None, 0, None),
        ] == body["tasks"]

    def test_an_ack_without_state_has_no_storage(self) -> None:
        body = details(1, running(at=0), tick(1000), ack(1, "t0", at=1001), ack(1, "t1", at=1002))

        assert [
            task("t0", "ACKNOWLEDGED", 1001, 1, 0, None),
            task("t1", "ACKNOWLEDGED", 1002, 2, 0, None),
        ] == body["tasks"]

    def test_the_latest_savepoint_has_details_after_the_history_moved_past_it(self) -> None:
        """Savepoint 1, then more checkpoints than the history holds: the latest savepoint's details
        are still there, with its tasks."""
        commands: list[object] = [
            running(at=0),
            request(CheckpointKind.SAVEPOINT, at=500),
            ack(1, "t0", at=510),
            ack(1, "t1", at=520),
        ]
        for n in range(2, HISTORY_SIZE + 4):
            commands += [tick(n * 1000), ack(n, "t0", at=n * 1000 + 1), ack(n, "t1", at=n * 1000 + 2)]
        state, stats = folded(*commands)
        assert stats is not None

        assert 1 not in [entry.id for entry in stats.history]
        body = details(1, *commands)
        assert (1, "SAVEPOINT") == (body["id"], body["checkpoint_type"])
        assert ["t0", "t1"] == [t["task_id"] for t in body["tasks"]]
        shown = {e.id for e in stats.history} | {1}
        assert set(stats.task_details) <= shown, "the rows of checkpoints no longer shown are dropped"

    def test_a_checkpoint_of_very_many_tasks_keeps_no_rows_and_says_so(self) -> None:
        tasks = tuple(f"t{i}" for i in range(TASK_DETAILS_LIMIT + 1))
        acks = [ack(1, t, at=1001) for t in tasks]

        body = details(1, running(tasks=tasks, at=0), tick(1000), *acks)

        assert ("COMPLETED", None) == (body["status"], body["tasks"])
        assert f"more than {TASK_DETAILS_LIMIT} tasks" in body["tasks_missing"]

    def test_a_checkpoint_this_worker_did_not_see_end_says_why_it_has_no_rows(self) -> None:
        """A worker that took the job over from a snapshot has the history, not the task rows."""
        _, stats = folded(running(at=0), tick(1000), ack(1, "t0", at=1010), ack(1, "t1", at=1020))
        assert stats is not None and stats.latest_completed is not None

        body = details_json(stats.latest_completed, task_rows(CheckpointStats(), None, 1))

        assert body["tasks"] is None
        assert "did not see the checkpoint end" in body["tasks_missing"]
