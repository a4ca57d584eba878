"""Savepoints as the journal has them, and what a restore may still need (pure: no I/O).

``cutline savepoints list/show/dispose`` (coordinator/cli.py) read the journal and the
``_metadata`` files and ask these functions what to print and what may be deleted. Flink's
rule: savepoints belong to the user, who disposes of them; checkpoints belong to the job,
which retains and discards them itself. Here a savepoint may be disposed unless a restore may
still need it: a restart restores the job's latest completed checkpoint, or, before the job
completed one, what the attempt restored from (docs/design.md, "Job lifecycle"), so that savepoint stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from coordinator.state import JobState
from events.records import CheckpointCompleted, CheckpointKind, JournalEvent
from events.validation import InvalidUri, canonical_uri


@dataclass(frozen=True, slots=True)
class Savepoint:
    """A completed savepoint of a job, from its ``CheckpointCompleted`` in the journal."""

    job_id: str
    checkpoint_id: int
    location: str
    completed_ms: int
    duration_ms: int
    size_bytes: int
    tasks: int
    """Tasks with state; -1 when the completion is journaled by reference (``savepoints show``
    reads its ``_metadata``)."""
    attempt: int

    @classmethod
    def of(cls, completed: CheckpointCompleted) -> Savepoint:
        return cls(
            job_id=completed.job_id,
            checkpoint_id=completed.checkpoint_id,
            location=completed.location,
            completed_ms=completed.timestamp_ms,
            duration_ms=completed.duration_ms,
            size_bytes=completed.size_bytes,
            tasks=len(completed.handles) if completed.metadata is None else -1,  # in its _metadata
            attempt=completed.attempt,
        )


def savepoints(events: Iterable[JournalEvent], job_id: str | None = None) -> list[Savepoint]:
    """The completed savepoints in ``events`` (of ``job_id``, or of every job), in journal order."""
    return [
        Savepoint.of(event)
        for event in events
        if isinstance(event, CheckpointCompleted)
        and event.kind is CheckpointKind.SAVEPOINT
        and (job_id is None or event.job_id == job_id)
    ]


def needed_locations(states: Mapping[str, JobState]) -> dict[str, str]:
    """Canonical location -> why a restore may need it, over every job of the journal.

    Every retained checkpoint (a job restored with ``restore="latest"``, or by id, reads them),
    the restore point of a scheduled restart, and what a job restored from while it has no
    completed checkpoint since (its next restart restores that)."""
    needed: dict[str, str] = {}

    def need(location: str | None, why: str) -> None:
        if location:
            needed.setdefault(canonical_location(location), why)

    for job_id, state in sorted(states.items()):
        for completed in state.completed:
            need(completed.location, f"checkpoint {completed.checkpoint_id} of job {job_id} is retained")
        if state.restart is not None:
            need(
                state.restart.restore_location,
                f"job {job_id}'s scheduled restart (attempt {state.restart.attempt}) restores it",
            )
        if state.latest_completed is None and state.restored is not None:
            need(
                state.restored.location,
                f"job {job_id} restored it in attempt {state.restored.attempt} and has completed no "
                "checkpoint since: a restart would restore it again",
            )
    return needed


def why_needed(location: str, states: Mapping[str, JobState]) -> str | None:
    """Why a restore may still need ``location`` (None: nothing in the journal needs it)."""
    return needed_locations(states).get(canonical_location(location))


def canonical_location(location: str) -> str:
    """``location``'s one spelling (:func:`events.validation.canonical_uri`), or itself if it is not a
    storage URI cutline accepts."""
    try:
        return canonical_uri(location)
    except InvalidUri:
        return location.rstrip("/")
