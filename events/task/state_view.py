"""What a job held at a checkpoint or savepoint, read from its files without Spark (``cutline state``).

A checkpoint's ``CheckpointCompleted`` (its ``_metadata``, or the journal's record) names one state
handle per task. A keyed task's handle is a manifest whose pieces (full, then deltas) rebuild its
key groups (:mod:`events.task.keyed_pieces`); a per-partition task's is the partition's state
itself. :func:`state_rows` folds them into rows of key and state, each with the checkpoint
directory of the piece that last wrote the key (``chk-41``: "which checkpoint changed it").
Every piece is checked against its manifest's size and sha256, and must lie inside the job's
checkpoint location, as a restore checks them: a corrupt or missing piece is an error naming it,
never silent rows. :func:`compare` gives the keys added, removed and changed between two
checkpoints. Needs ``pyarrow`` (the ``spark`` extra).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from events.task.keyed_pieces import decode_piece, pieces_root, read_manifest, read_piece
from events.task.manifest import Manifest, is_keyed_task
from events.task.participant import load_task_snapshot
from events.wire.records import CheckpointCompleted, StateHandle

__all__ = ["StateChange", "StateDiff", "StateRow", "compare", "require_uid", "state_rows", "step_uids"]


@dataclass(frozen=True, slots=True)
class StateRow:
    """One key's state (keyed tasks), or one partition's whole state (``key_group`` None, ``key``
    the task: ``topic-partition``)."""

    task: str
    key_group: int | None
    key: str
    state: bytes
    written_in: str
    """The checkpoint or savepoint directory (``chk-41``) of the piece that last wrote the key."""


@dataclass(frozen=True, slots=True)
class StateChange:
    key: str
    before: bytes | None
    after: bytes | None


@dataclass(frozen=True, slots=True)
class StateDiff:
    """The keys added, removed and changed from checkpoint ``a`` to checkpoint ``b``, by key."""

    added: tuple[StateChange, ...]
    removed: tuple[StateChange, ...]
    changed: tuple[StateChange, ...]


def directory_name(uri: str) -> str:
    """The name of the directory a piece or snapshot lies in: its checkpoint (``chk-41``)."""
    return uri.rstrip("/").rsplit("/", 2)[-2]


def step_uids(completed: CheckpointCompleted) -> list[str | None]:
    """The uids of the keyed steps whose state the checkpoint holds (None: a step without a uid)."""
    manifests = [read_manifest(h) for t, h in sorted(completed.handles.items()) if is_keyed_task(t)]
    return sorted({m.step.uid if m.step else None for m in manifests}, key=lambda uid: uid or "")


def state_rows(completed: CheckpointCompleted, uid: str | None = None) -> list[StateRow]:
    """Every key's state in ``completed`` (with ``uid``: of that keyed step only), sorted by key
    group and key; then every per-partition task's state (none with ``uid``)."""
    rows: list[StateRow] = []
    keyed = {t: h for t, h in sorted(completed.handles.items()) if is_keyed_task(t)}
    for task, handle in keyed.items():
        manifest = read_manifest(handle)
        if uid is not None and (manifest.step is None or manifest.step.uid != uid):
            continue
        rows += _keyed_rows(task, handle, manifest)
    if uid is None:
        others = {t: h for t, h in sorted(completed.handles.items()) if t not in keyed}
        rows += [
            StateRow(task, None, task, load_task_snapshot(handle), directory_name(handle.uri))
            for task, handle in others.items()
        ]
    return rows


def _keyed_rows(task: str, handle: StateHandle, manifest: Manifest) -> list[StateRow]:
    """A keyed task's keys: its manifest's pieces folded oldest first, each key remembering the
    piece that wrote it last."""
    root = pieces_root(handle.uri)
    latest: dict[tuple[int, str], tuple[bytes, str]] = {}
    for piece in manifest.pieces:
        changes = decode_piece(read_piece(piece, root), manifest.key_groups, piece.uri)
        if piece.kind == "full":
            latest = {k: v for k, v in latest.items() if k[0] not in changes}
        for group, entries in changes.items():
            for key, state in entries.items():
                if state is None:
                    latest.pop((group, key), None)
                else:
                    latest[(group, key)] = (state, directory_name(piece.uri))
    return [
        StateRow(task, group, key, state, written_in)
        for (group, key), (state, written_in) in sorted(latest.items())
    ]


def compare(before: Iterable[StateRow], after: Iterable[StateRow]) -> StateDiff:
    """The keys added, removed and changed from ``before`` to ``after`` (by key; a per-partition
    task's state is keyed by its task)."""
    old = {row.key: row.state for row in before}
    new = {row.key: row.state for row in after}
    return StateDiff(
        added=tuple(StateChange(k, None, new[k]) for k in sorted(new.keys() - old.keys())),
        removed=tuple(StateChange(k, old[k], None) for k in sorted(old.keys() - new.keys())),
        changed=tuple(
            StateChange(k, old[k], new[k]) for k in sorted(old.keys() & new.keys()) if old[k] != new[k]
        ),
    )


def require_uid(completed: CheckpointCompleted, uid: str | None) -> None:
    """Raise ``LookupError`` when ``uid`` names no keyed step of the checkpoint, listing those it has."""
    if uid is None:
        return
    uids = step_uids(completed)
    if uid not in uids:
        named = ", ".join(repr(u) if u is not None else "(no uid)" for u in uids) or "none"
        raise LookupError(
            f"checkpoint {completed.checkpoint_id} holds no state of step uid {uid!r}; "
            f"its keyed steps: {named}"
        )
