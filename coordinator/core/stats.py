"""Checkpoint statistics of one job, shaped like Flink's REST API (``/jobs/:id/checkpoints``).

A read model: ``track`` folds journal events into :class:`CheckpointStats`,
``with_progress`` adds what the job's pending checkpoints hold so far, and
``checkpoints_json`` / ``config_json`` render Flink's JSON. Pure; the web views
and ``cutline status`` only display it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from coordinator.core.state import JobState, PendingCheckpoint
from events.wire.codegen import replacer
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointKind,
    CheckpointRestored,
    CheckpointTriggered,
    JournalEvent,
    TaskAcknowledged,
)

HISTORY_SIZE = 10
"""Flink's ``web.checkpoints.history`` default."""

WINDOW = 1000
"""Completed checkpoints kept for percentiles."""

TASK_DETAILS_LIMIT = 1000
"""A checkpoint of more tasks keeps no per-task rows (they cost about 100 bytes a task for each of
the checkpoints shown; a job of 100,000 tasks would hold 13 million)."""


@dataclass(frozen=True, slots=True)
class TaskEntry:
    """One task of one checkpoint, as the drill-down shows it (Flink's subtask statistics)."""

    task_id: str
    ack_timestamp: int | None = None
    """When the coordinator accepted the task's ack (its clock, as the trigger's); None: no ack."""
    state_size: int = 0
    storage: str | None = None
    """``inline`` (the snapshot rode inside the ack), ``file``, or None: the ack carried no state."""


@dataclass(frozen=True)  # no slots: see JobState (coordinator/core/state.py)
class CheckpointEntry:
    """One checkpoint as the history shows it."""

    id: int
    status: str  # IN_PROGRESS, COMPLETED, FAILED
    is_savepoint: bool
    trigger_timestamp: int
    num_subtasks: int
    num_acknowledged_subtasks: int = 0
    latest_ack_timestamp: int | None = None
    end_to_end_duration: int | None = None
    state_size: int = 0
    external_path: str | None = None
    failure_timestamp: int | None = None
    failure_reason: str | None = None
    failure_message: str | None = None


@dataclass(frozen=True)  # no slots: see JobState (coordinator/core/state.py)
class CheckpointStats:
    """Counts, a summary of completed checkpoints, the latest of each kind and the history."""

    total: int = 0
    in_progress: int = 0
    completed: int = 0
    failed: int = 0
    restored: int = 0
    durations: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    latest_completed: CheckpointEntry | None = None
    latest_savepoint: CheckpointEntry | None = None
    latest_failed: CheckpointEntry | None = None
    latest_restored: CheckpointRestored | None = None
    history: tuple[CheckpointEntry, ...] = ()  # newest first
    task_details: Mapping[int, tuple[TaskEntry, ...]] = field(
        default_factory=dict, compare=False, metadata={"transient": True}
    )
    """Per checkpoint id, its tasks' rows: of each finished checkpoint the history or a latest one
    shows, as the worker saw it end (at most :data:`TASK_DETAILS_LIMIT` tasks). Transient, as
    Flink's: in no snapshot, so a worker that took the job over from a snapshot has none of the
    checkpoints before; and not part of the statistics' equality. Never mutated: replaced."""

    def entry(self, checkpoint_id: int) -> CheckpointEntry | None:
        """The checkpoint in the history, or the latest completed, savepoint or failed one (a
        savepoint may be older than the whole history)."""
        for entry in self.history:  # newest first: none further down once the ids are smaller
            if entry.id <= checkpoint_id:
                if entry.id == checkpoint_id:
                    return entry
                break
        for latest in (self.latest_completed, self.latest_savepoint, self.latest_failed):
            if latest is not None and latest.id == checkpoint_id:
                return latest
        return None


_replace_stats = replacer(CheckpointStats)
"""``dataclasses.replace`` of :class:`CheckpointStats`, compiled: ``track`` replaces the statistics at
each trigger and completion of every job (:func:`events.wire.codegen.replacer`)."""


def _with_entry(stats: CheckpointStats, entry: CheckpointEntry) -> tuple[CheckpointEntry, ...]:
    others = tuple(e for e in stats.history if e.id != entry.id)
    return tuple(sorted((entry, *others), key=lambda e: -e.id))[:HISTORY_SIZE]


def track(stats: CheckpointStats | None, before: JobState, event: JournalEvent) -> CheckpointStats:
    """The statistics after ``event`` (``before`` is the job's state before it)."""
    stats = stats or CheckpointStats()
    match event:
        case TaskAcknowledged():
            # The job's pending checkpoint holds every ack already: with_progress reads them there
            # when the statistics are shown, instead of counting each ack twice (it is the most
            # frequent event; see the git history of docs/benchmarks.md).
            return stats
        case CheckpointTriggered():
            entry = CheckpointEntry(
                id=event.checkpoint_id,
                status="IN_PROGRESS",
                is_savepoint=event.kind is CheckpointKind.SAVEPOINT,
                trigger_timestamp=event.timestamp_ms,
                num_subtasks=len(event.tasks),
                external_path=event.location,
            )
            return _replace_stats(
                stats,
                total=stats.total + 1,
                in_progress=stats.in_progress + 1,
                history=_with_entry(stats, entry),
            )
        case CheckpointCompleted():
            pending = before.pending.get(event.checkpoint_id)
            entry = CheckpointEntry(
                id=event.checkpoint_id,
                status="COMPLETED",
                is_savepoint=event.kind is CheckpointKind.SAVEPOINT,
                trigger_timestamp=event.timestamp_ms - event.duration_ms,
                num_subtasks=len(pending.triggered.tasks) if pending else len(event.handles),
                num_acknowledged_subtasks=len(pending.triggered.tasks) if pending else len(event.handles),
                latest_ack_timestamp=event.timestamp_ms,
                end_to_end_duration=event.duration_ms,
                state_size=event.size_bytes,
                external_path=event.location,
            )
            savepoint = entry.is_savepoint
            done = _replace_stats(
                stats,
                in_progress=max(0, stats.in_progress - 1),
                completed=stats.completed + 1,
                durations=(*stats.durations, event.duration_ms)[-WINDOW:],
                sizes=(*stats.sizes, event.size_bytes)[-WINDOW:],
                latest_completed=stats.latest_completed if savepoint else entry,
                latest_savepoint=entry if savepoint else stats.latest_savepoint,
                history=_with_entry(stats, entry),
            )
            return _with_tasks(done, event.checkpoint_id, pending)
        case CheckpointAborted():
            current = stats.entry(event.checkpoint_id)
            pending = before.pending.get(event.checkpoint_id)
            if current is None:
                if pending is None:
                    return _replace_stats(stats, failed=stats.failed + 1)
                current = CheckpointEntry(
                    id=event.checkpoint_id,
                    status="IN_PROGRESS",
                    is_savepoint=pending.is_savepoint,
                    trigger_timestamp=pending.triggered.timestamp_ms,
                    num_subtasks=len(pending.triggered.tasks),
                )
            if pending is not None:
                current = _progressed(current, pending)
            failed = replace(
                current,
                status="FAILED",
                end_to_end_duration=event.timestamp_ms - current.trigger_timestamp,
                failure_timestamp=event.timestamp_ms,
                failure_reason=event.reason,
                failure_message=event.message,
            )
            aborted = _replace_stats(
                stats,
                in_progress=max(0, stats.in_progress - 1),
                failed=stats.failed + 1,
                latest_failed=failed,
                history=_with_entry(stats, failed),
            )
            return _with_tasks(aborted, event.checkpoint_id, pending)
        case CheckpointRestored():
            return _replace_stats(stats, restored=stats.restored + 1, latest_restored=event)
        case _:
            return stats


def task_entries(pending: PendingCheckpoint) -> tuple[TaskEntry, ...] | None:
    """The rows of ``pending``'s tasks, in the trigger's order, each with its ack so far; None for a
    checkpoint of more than :data:`TASK_DETAILS_LIMIT` tasks."""
    tasks = pending.triggered.tasks
    if len(tasks) > TASK_DETAILS_LIMIT:
        return None
    rows = []
    for task_id in tasks:
        ack = pending.acks.get(task_id)
        if ack is None:
            rows.append(TaskEntry(task_id))
            continue
        state = ack.state
        storage = None if state is None else "inline" if state.inline is not None else "file"
        rows.append(TaskEntry(task_id, ack.timestamp_ms, state.size_bytes if state else 0, storage))
    return tuple(rows)


def _with_tasks(
    stats: CheckpointStats, checkpoint_id: int, pending: PendingCheckpoint | None
) -> CheckpointStats:
    """``stats`` keeping the task rows of the finished checkpoint ``checkpoint_id`` (as ``pending``
    had them when it ended), and of no checkpoint it no longer shows."""
    shown = {entry.id for entry in stats.history}
    shown.update(e.id for e in (stats.latest_completed, stats.latest_savepoint, stats.latest_failed) if e)
    kept = {cid: rows for cid, rows in stats.task_details.items() if cid in shown}
    rows = None if pending is None else task_entries(pending)
    if rows is not None and checkpoint_id in shown:
        kept[checkpoint_id] = rows
    return _replace_stats(stats, task_details=kept)


def task_rows(
    stats: CheckpointStats | None, state: JobState | None, checkpoint_id: int
) -> tuple[TaskEntry, ...] | None:
    """The task rows of checkpoint ``checkpoint_id``: a pending one's from the job's state (its acks
    so far), a finished one's as kept in ``stats``; None when neither has them."""
    pending = state.pending.get(checkpoint_id) if state is not None else None
    if pending is not None:
        return task_entries(pending)
    return None if stats is None else stats.task_details.get(checkpoint_id)


def _progressed(entry: CheckpointEntry, pending: PendingCheckpoint) -> CheckpointEntry:
    """``entry`` with the acks ``pending`` has so far: their count, summed state size and the
    latest ack's time (Flink's ``latest_ack_timestamp``)."""
    acks = list(pending.acks.values())
    return replace(
        entry,
        num_acknowledged_subtasks=len(acks),
        latest_ack_timestamp=max((ack.timestamp_ms for ack in acks), default=None),
        state_size=sum(ack.state.size_bytes for ack in acks if ack.state),
    )


def with_progress(stats: CheckpointStats | None, state: JobState | None) -> CheckpointStats | None:
    """``stats`` as shown: each in-progress entry of the history with the acks that ``state``'s
    pending checkpoint has so far. ``track`` does not count acks; see there."""
    if stats is None or state is None or not state.pending:
        return stats
    history = tuple(
        _progressed(entry, pending)
        if entry.status == "IN_PROGRESS" and (pending := state.pending.get(entry.id)) is not None
        else entry
        for entry in stats.history
    )
    return stats if history == stats.history else _replace_stats(stats, history=history)


def summarize(values: tuple[int, ...]) -> dict[str, float | int]:
    """Minimum, maximum, average and percentiles (Flink's summary; nearest rank) of ``values``;
    zeros for none."""
    if not values:
        return {"min": 0, "max": 0, "avg": 0, "p50": 0, "p90": 0, "p95": 0, "p99": 0, "p999": 0}
    ordered = sorted(values)

    def pct(q: float) -> int:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "min": ordered[0],
        "max": ordered[-1],
        "avg": round(sum(ordered) / len(ordered), 3),
        "p50": pct(0.5),
        "p90": pct(0.9),
        "p95": pct(0.95),
        "p99": pct(0.99),
        "p999": pct(0.999),
    }


def entry_json(entry: CheckpointEntry | None) -> dict[str, Any] | None:
    """One checkpoint as Flink's ``CheckpointStatistics`` (``@class`` completed/failed/in_progress)."""
    if entry is None:
        return None
    body: dict[str, Any] = {
        "@class": {"COMPLETED": "completed", "FAILED": "failed"}.get(entry.status, "in_progress"),
        "id": entry.id,
        "status": entry.status,
        "is_savepoint": entry.is_savepoint,
        "checkpoint_type": "SAVEPOINT" if entry.is_savepoint else "CHECKPOINT",
        "trigger_timestamp": entry.trigger_timestamp,
        "latest_ack_timestamp": entry.latest_ack_timestamp,
        "end_to_end_duration": entry.end_to_end_duration,
        "state_size": entry.state_size,
        "checkpointed_size": entry.state_size,
        "num_subtasks": entry.num_subtasks,
        "num_acknowledged_subtasks": entry.num_acknowledged_subtasks,
    }
    if entry.status == "COMPLETED":
        body.update(external_path=entry.external_path, discarded=False)
    if entry.status == "FAILED":
        body.update(
            failure_timestamp=entry.failure_timestamp,
            failure_message=f"{entry.failure_reason}: {entry.failure_message}",
        )
    return body


def details_json(entry: CheckpointEntry, rows: tuple[TaskEntry, ...] | None) -> dict[str, Any]:
    """``GET /jobs/:id/checkpoints/details/:cid``: the checkpoint as in the history, and ``tasks``:
    each task acknowledged or not, when, how long after the trigger, its state's size and whether
    it rode inline or went to a file. ``tasks`` is None (and ``tasks_missing`` says why) for a
    checkpoint whose rows are not kept (:attr:`CheckpointStats.task_details`)."""
    body = entry_json(entry)
    assert body is not None
    if rows is None:
        body["tasks"] = None
        body["tasks_missing"] = (
            f"a checkpoint of more than {TASK_DETAILS_LIMIT} tasks keeps no per-task details"
            if entry.num_subtasks > TASK_DETAILS_LIMIT
            else "this worker did not see the checkpoint end: per-task details live in the memory of "
            "the worker that decided it (as Flink's), and one that took the job over has none of "
            "the checkpoints before"
        )
        return body
    body["tasks"] = [_task_json(entry, row) for row in rows]
    return body


def _task_json(entry: CheckpointEntry, row: TaskEntry) -> dict[str, Any]:
    if row.ack_timestamp is not None:
        status = "ACKNOWLEDGED"
    else:
        status = "PENDING" if entry.status == "IN_PROGRESS" else "NOT_ACKNOWLEDGED"
    return {
        "task_id": row.task_id,
        "status": status,
        "ack_timestamp": row.ack_timestamp,
        "end_to_end_duration": None
        if row.ack_timestamp is None
        else max(0, row.ack_timestamp - entry.trigger_timestamp),
        "state_size": row.state_size,
        "storage": row.storage,
    }


def checkpoints_json(stats: CheckpointStats | None) -> dict[str, Any]:
    """``GET /jobs/:id/checkpoints``: counts, summary, latest, history."""
    stats = stats or CheckpointStats()
    restored = stats.latest_restored
    return {
        "counts": {
            "restored": stats.restored,
            "total": stats.total,
            "in_progress": stats.in_progress,
            "completed": stats.completed,
            "failed": stats.failed,
        },
        "summary": {
            "end_to_end_duration": summarize(stats.durations),
            "state_size": summarize(stats.sizes),
            "checkpointed_size": summarize(stats.sizes),
        },
        "latest": {
            "completed": entry_json(stats.latest_completed),
            "savepoint": entry_json(stats.latest_savepoint),
            "failed": entry_json(stats.latest_failed),
            "restored": None
            if restored is None
            else {
                "id": restored.checkpoint_id,
                "restore_timestamp": restored.timestamp_ms,
                "is_savepoint": bool(restored.location and "savepoint" in restored.location),
                "external_path": restored.location,
            },
        },
        "history": [entry_json(e) for e in stats.history],
    }


def config_json(config: CheckpointConfig | None) -> dict[str, Any]:
    """``GET /jobs/:id/checkpoints/config``."""
    if config is None:
        return {}
    return {
        "mode": "exactly_once",
        "interval": config.interval_ms,
        "timeout": config.timeout_ms,
        "min_pause": config.min_pause_ms,
        "max_concurrent": config.max_concurrent,
        "tolerable_failed_checkpoints": config.tolerable_failures,
        "num_retained": config.retained,
        "checkpoint_storage": config.location,
        "externalization": {"enabled": True, "delete_on_cancellation": False},
        "unaligned_checkpoints": False,
    }
