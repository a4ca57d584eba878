"""What a job held at a checkpoint or savepoint, read from its files without Spark (``cutline state``).

A checkpoint's ``CheckpointCompleted`` (its ``_metadata``, or the journal's record) names one state
handle per task. A keyed task's handle is a manifest whose pieces (full, then deltas) rebuild its
key groups (:mod:`events.task.keyed_pieces`); a per-partition task's is the partition's state
itself. :func:`state_tables` folds each task's pieces with Arrow into a table of key and state,
each with the checkpoint directory of the piece that last wrote the key (``chk-41``: "which
checkpoint changed it"); :func:`state_rows` gives them as rows.
Every piece is checked against its manifest's size and sha256, and must lie inside the job's
checkpoint location, as a restore checks them: a corrupt or missing piece is an error naming it,
never silent rows. :func:`compare` gives the keys added, removed and changed between two
checkpoints. Needs ``pyarrow`` (the ``spark`` extra).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from events.task.keyed_pieces import piece_table, pieces_root, read_manifest, read_piece
from events.task.manifest import Manifest, is_keyed_task
from events.task.participant import load_task_snapshot
from events.wire.records import CheckpointCompleted, StateHandle

__all__ = [
    "ROW_SCHEMA",
    "StateChange",
    "StateDiff",
    "StateRow",
    "compare",
    "json_texts",
    "keyed_table",
    "require_uid",
    "state_rows",
    "state_tables",
    "step_uids",
]


ROW_SCHEMA = pa.schema(
    [("key_group", pa.int32()), ("key", pa.string()), ("state", pa.binary()), ("written_in", pa.string())]
)
"""A task's keys as Arrow (:func:`state_tables`): ``written_in`` is the checkpoint directory of the
piece that last wrote the key; a per-partition task's one row has no key group and its task as key."""


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
    for task, table in state_tables(completed, uid):
        columns = table.to_pydict()
        rows += [
            StateRow(task, group, key, state, written_in)
            for group, key, state, written_in in zip(
                columns["key_group"], columns["key"], columns["state"], columns["written_in"], strict=True
            )
        ]
    return rows


def state_tables(completed: CheckpointCompleted, uid: str | None = None) -> Iterator[tuple[str, pa.Table]]:
    """:func:`state_rows` as one Arrow table (``key_group``, ``key``, ``state``, ``written_in``) per
    task, in task order: what a reader of millions of keys takes (``cutline-state``)."""
    keyed = {t: h for t, h in sorted(completed.handles.items()) if is_keyed_task(t)}
    for task, handle in keyed.items():
        manifest = read_manifest(handle)
        if uid is not None and (manifest.step is None or manifest.step.uid != uid):
            continue
        yield task, keyed_table(handle, manifest)
    if uid is None:
        for task, handle in sorted(completed.handles.items()):
            if task not in keyed:
                yield task, _partition_table(task, load_task_snapshot(handle), directory_name(handle.uri))


def _partition_table(task: str, state: bytes, written_in: str) -> pa.Table:
    return pa.table(
        [
            pa.array([None], pa.int32()),
            pa.array([task]),
            pa.array([state], pa.binary()),
            pa.array([written_in]),
        ],
        schema=ROW_SCHEMA,
    )


def keyed_table(handle: StateHandle, manifest: Manifest) -> pa.Table:
    """A keyed task's keys (:data:`ROW_SCHEMA`), sorted by key group and key: its manifest's pieces
    from the last full one on, folded oldest first (the last write of a key wins, a null deletes
    it), each key with the checkpoint directory of the piece that wrote it last. Every piece is
    checked (:func:`~events.task.keyed_pieces.read_piece`)."""
    root = pieces_root(handle.uri)
    start = max(i for i, piece in enumerate(manifest.pieces) if piece.kind == "full")
    groups = manifest.key_groups
    tables = []
    for piece in manifest.pieces[start:]:
        table = piece_table(read_piece(piece, root), piece.uri)
        column = table.column("key_group")
        table = table.filter(pc.and_(pc.greater_equal(column, groups.start), pc.less(column, groups.stop)))
        tables.append(
            table.append_column(
                "written_in", pa.array([directory_name(piece.uri)] * table.num_rows, pa.string())
            )
        )
    folded = pa.concat_tables(tables)
    if len(tables) > 1:
        last = pc.ScalarAggregateOptions(skip_nulls=False)
        folded = (
            folded.group_by(["key_group", "key"], use_threads=False)  # in input order: "last" is the newest
            .aggregate([("state", "last", last), ("written_in", "last", last)])
            .rename_columns(["key_group", "key", "state", "written_in"])
        )
    folded = folded.filter(pc.is_valid(folded.column("state")))
    return (
        folded.sort_by([("key_group", "ascending"), ("key", "ascending")])
        .select(ROW_SCHEMA.names)
        .cast(ROW_SCHEMA)
    )


NUMBER = r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$"
"""A JSON number's text (the keyed word count's states): JSON without parsing it."""


def json_texts(states: pa.Array) -> pa.Array:
    """Each state's text when it is UTF-8 JSON, else null; numbers are recognised at once (Arrow
    compute), other states parsed one by one."""
    try:
        text = states.cast(pa.string())
    except pa.ArrowInvalid:  # some state is not UTF-8: each on its own
        return pa.array([_json_text(state) for state in states.to_pylist()], pa.string())
    number = pc.fill_null(pc.match_substring_regex(text, NUMBER), False)
    others = pc.invert(number)
    if not pc.any(others).as_py():
        return text
    checked = [_json_text(state) for state in states.filter(others).to_pylist()]
    return pc.replace_with_mask(text, others, pa.array(checked, pa.string()))


def _json_text(state: bytes | None) -> str | None:
    if state is None:
        return None
    try:
        text = state.decode("utf-8")
        json.loads(text)
    except (UnicodeDecodeError, ValueError):
        return None
    return text


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
