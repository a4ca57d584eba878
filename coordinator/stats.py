"""Checkpoint statistics of one job, shaped like Flink's REST API (``/jobs/:id/checkpoints``).

A read model: ``track`` folds journal events into :class:`CheckpointStats`,
``with_progress`` adds what the job's pending checkpoints hold so far, and
``checkpoints_json`` / ``config_json`` render Flink's JSON. Pure; the web views
and ``cutline status`` only display it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from coordinator.state import JobState, PendingCheckpoint
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


@dataclass(frozen=True)  # no slots: see JobState (coordinator/state.py)
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


@dataclass(frozen=True)  # no slots: see JobState (coordinator/state.py)
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

    def entry(self, checkpoint_id: int) -> CheckpointEntry | None:
        for entry in self.history:  # newest first: none further down once the ids are smaller
            if entry.id <= checkpoint_id:
                return entry if entry.id == checkpoint_id else None
        return None


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
            return replace(
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
            return replace(
                stats,
                in_progress=max(0, stats.in_progress - 1),
                completed=stats.completed + 1,
                durations=(*stats.durations, event.duration_ms)[-WINDOW:],
                sizes=(*stats.sizes, event.size_bytes)[-WINDOW:],
                latest_completed=stats.latest_completed if savepoint else entry,
                latest_savepoint=entry if savepoint else stats.latest_savepoint,
                history=_with_entry(stats, entry),
            )
        case CheckpointAborted():
            current = stats.entry(event.checkpoint_id)
            pending = before.pending.get(event.checkpoint_id)
            if current is None:
                if pending is None:
                    return replace(stats, failed=stats.failed + 1)
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
            return replace(
                stats,
                in_progress=max(0, stats.in_progress - 1),
                failed=stats.failed + 1,
                latest_failed=failed,
                history=_with_entry(stats, failed),
            )
        case CheckpointRestored():
            return replace(stats, restored=stats.restored + 1, latest_restored=event)
        case _:
            return stats


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
    return stats if history == stats.history else replace(stats, history=history)


def _summary(values: tuple[int, ...]) -> dict[str, float | int]:
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
            "end_to_end_duration": _summary(stats.durations),
            "state_size": _summary(stats.sizes),
            "checkpointed_size": _summary(stats.sizes),
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
