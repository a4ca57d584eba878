"""Savepoints as the journal has them, and what a restore may still need (pure: no I/O).

``cutline savepoints list/show/dispose`` (coordinator/cli/savepoints.py) read the journal and the
``_metadata`` files and ask these functions what to print and what may be deleted. Flink's
rule: savepoints belong to the user, who disposes of them; checkpoints belong to the job,
which retains and discards them itself. Here a savepoint may be disposed unless a restore may
still need it: a restart restores the job's latest completed checkpoint, or, before the job
completed one, what the attempt restored from (docs/design.md, "Job lifecycle"), so that savepoint stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from coordinator.core.state import JobState
from events.wire.metadata import METADATA_FILE
from events.wire.records import CheckpointCompleted, CheckpointKind, JournalEvent
from events.wire.validation import InvalidUri, StorageUri, canonical_uri, parse_uri


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


def state_files(events: Iterable[JournalEvent], savepoint: Savepoint) -> tuple[str, ...]:
    """The state files (URIs) the journal's completion of ``savepoint`` names: its handles that are
    not inline; none when it is journaled by reference (they are in its ``_metadata``)."""
    for event in events:
        if (
            isinstance(event, CheckpointCompleted)
            and (event.job_id, event.checkpoint_id) == (savepoint.job_id, savepoint.checkpoint_id)
            and event.metadata is None
        ):
            return tuple(handle.uri for _, handle in sorted(event.handles.items()) if handle.inline is None)
    return ()


@dataclass(frozen=True, slots=True)
class Presence:
    """Whether a savepoint is still on disk, as ``cutline savepoints list`` says it."""

    on_disk: bool | None
    """None: cannot be told here (not on the local file system)."""
    metadata: bool | None
    """Whether its ``_metadata`` is there (None: cannot be told)."""

    @property
    def shown(self) -> str:
        if self.on_disk is None:
            return "?"
        if not self.on_disk:
            return "no"
        return "yes" if self.metadata else "yes, no _metadata"


def presence(metadata: bool | None, files: Sequence[bool | None]) -> Presence:
    """A savepoint is on disk when its ``_metadata`` is there (``metadata``), or, without one (a
    savepoint older than its tasks' writing it, or whose tasks could not see each other's files),
    when every state file its journal record names is there (``files``: each one's presence, None
    when it cannot be told; none known: it cannot be told either). Pure."""
    if metadata is None:
        return Presence(None, None)
    if metadata:
        return Presence(True, True)
    if not files or None in files:
        return Presence(False if False in files else None, False)
    return Presence(all(files), False)


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
    """``location``'s one spelling (:func:`events.wire.validation.canonical_uri`), or itself if it is not a
    storage URI cutline accepts."""
    try:
        return canonical_uri(location)
    except InvalidUri:
        return location.rstrip("/")


# -------------------------------------------------------------- disposing of one


@dataclass(frozen=True, slots=True)
class Refused:
    """A disposal refused, and why (nothing is deleted)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Root:
    """A savepoint root as given, and its real path (symbolic links resolved by the caller)."""

    uri: StorageUri
    real: str


@dataclass(frozen=True, slots=True)
class Disposal:
    """What disposing of the savepoint in a directory deletes: its state files, then its ``_metadata``."""

    job_id: str
    checkpoint_id: int
    location: str
    """The location its ``_metadata`` names (a restore may name it so)."""
    files: tuple[tuple[str, ...], ...]
    """Its own state files, as path segments below the directory: a keyed savepoint's pieces first,
    then the handles' files (a keyed task's manifest); inline state has none (it lives in
    ``_metadata`` and the journal)."""


def refuse_outside_roots(where: StorageUri, real: str, roots: Sequence[Root]) -> Refused | None:
    """Only a directory inside a savepoint root may be disposed of, as given and as ``real`` (its
    real path) lies: a symbolic link does not lead out."""
    if any(where.within(root.uri) and real_below(real, root.real) for root in roots):
        return None
    given = ", ".join(str(root.uri) for root in roots) or "none given"
    return Refused(
        f"{where} is not inside a savepoint root ({given}, symbolic links resolved): cutline disposes "
        "of savepoints only there"
    )


def plan_disposal(
    where: StorageUri, completed: CheckpointCompleted, pieces: Mapping[str, Sequence[str]] | None = None
) -> Disposal | Refused:
    """What disposing of ``where``, whose ``_metadata`` holds ``completed``, deletes: only a savepoint
    (a job retains and discards its own checkpoints), and only state files below its location.

    ``pieces`` are the piece URIs a keyed task's manifest lists (task -> URIs; the caller reads the
    manifests): they go before the manifests, so a manifest outlives its pieces if a disposal stops
    half way. A piece outside the location refuses the whole disposal, as a handle outside does."""
    if completed.kind is not CheckpointKind.SAVEPOINT:
        return Refused(
            f"{where} holds checkpoint {completed.checkpoint_id} of job {completed.job_id}: a job retains "
            "and discards its own checkpoints (CheckpointConfig.retained); dispose only of savepoints"
        )
    location = completed.location or str(where)
    try:
        base = parse_uri(location)
    except InvalidUri as exc:
        return Refused(
            f"{where.path.rstrip('/')}/{METADATA_FILE} names location {location!r}, which is not a "
            f"storage URI: {exc}"
        )
    piece_files: list[tuple[str, ...]] = []
    files: list[tuple[str, ...]] = []
    for task, handle in sorted(completed.handles.items()):
        named = [("state handle", handle.uri)] + [("piece", uri) for uri in (pieces or {}).get(task, ())]
        for what, uri in named:
            inside = _below(base, uri)
            if isinstance(inside, str):
                return Refused(f"the {what} of {task} {inside}; nothing was deleted")
            if what == "piece":
                piece_files.append(inside)
            elif handle.inline is None:
                files.append(inside)
    return Disposal(
        completed.job_id, completed.checkpoint_id, location, tuple(dict.fromkeys(piece_files + files))
    )


def _below(base: StorageUri, uri: str) -> tuple[str, ...] | str:
    """``uri``'s path segments below ``base``, or why it has none (not a storage URI, or outside)."""
    try:
        parsed = parse_uri(uri)
    except InvalidUri as exc:
        return f"is not a storage URI ({exc})"
    if not parsed.within(base):
        return f"({uri}) is outside {base}"
    return parsed.segments[len(base.segments) :]


def refuse_needed(where: StorageUri, disposal: Disposal, states: Mapping[str, JobState]) -> Refused | None:
    """A savepoint a restore may still need (:func:`needed_locations`) stays, under either name."""
    for candidate in sorted({disposal.location, str(where)}):
        reason = why_needed(candidate, states)
        if reason is not None:
            return Refused(f"{where} is still needed: {reason}. Nothing was deleted.")
    return None


def real_below(real: str, root: str) -> bool:
    """Whether the real path ``real`` lies below the real path ``root``."""
    return real.startswith(root.rstrip("/") + "/")
