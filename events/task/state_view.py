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
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from events.task.keyed_pieces import decode_state_type, piece_table, pieces_root, read_manifest, read_piece
from events.task.manifest import Manifest, is_keyed_task
from events.task.participant import load_task_snapshot
from events.wire.records import CheckpointCompleted, StateHandle

__all__ = [
    "ROW_SCHEMA",
    "StateChange",
    "StateDiff",
    "StateDoesNotFit",
    "StateRow",
    "compare",
    "json_texts",
    "keyed_table",
    "recorded_state_type",
    "require_uid",
    "state_columns",
    "state_rows",
    "state_tables",
    "step_uids",
    "typed_states",
]


class StateDoesNotFit(ValueError):
    """A state is not JSON of the type or columns it is read as; the message names its task and key."""


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


def recorded_state_type(completed: CheckpointCompleted, uid: str | None = None) -> pa.DataType | None:
    """The state type the keyed step (``uid``'s, or the checkpoint's one keyed step) declared, as its
    manifests record it; None when they record none, or when the checkpoint holds several keyed
    steps and ``uid`` names none of them."""
    steps = {read_manifest(h).step for t, h in sorted(completed.handles.items()) if is_keyed_task(t)} - {None}
    types = {s.state_type for s in steps if s is not None and (uid is None or s.uid == uid)}
    if len(types) != 1 or None in types or (uid is None and len(steps) > 1):
        return None
    return decode_state_type(str(next(iter(types))))


def state_rows(
    completed: CheckpointCompleted, uid: str | None = None, task: str | None = None
) -> list[StateRow]:
    """Every key's state in ``completed`` (with ``uid``: of that keyed step only; with ``task``: of
    that task only), sorted by key group and key; then every per-partition task's state (none with
    ``uid``)."""
    rows: list[StateRow] = []
    if task is not None:
        if task not in completed.handles:
            known = ", ".join(sorted(completed.handles)) or "none"
            raise LookupError(
                f"checkpoint {completed.checkpoint_id} holds no task {task!r}; its tasks: {known}"
            )
        completed = replace(completed, handles={task: completed.handles[task]})
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


def typed_states(states: pa.Array, state_type: pa.DataType, keys: pa.Array, task: str) -> pa.Array:
    """Stored states (each the JSON of one state) as a column of ``state_type``: numbers at once
    (Arrow casts their text), others parsed one by one. A state that is not JSON of the type raises
    :class:`StateDoesNotFit` naming its task and key."""
    if pa.types.is_integer(state_type) or pa.types.is_floating(state_type):
        try:
            return states.cast(pa.string()).cast(state_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # some state is not a number's text: parse each, to name it
    values = _parsed(states, keys, task)
    return _column(values, state_type, keys, task, f"state type {state_type}")


def state_columns(states: pa.Array, keys: pa.Array, task: str, fields: pa.Schema) -> list[pa.Array]:
    """Stored JSON states as the columns of ``fields`` (a user's schema): a state that is a JSON object
    gives each column its field of that name (null where it has none); any other state fills the one
    column there is. A state that fits neither, or a value not of its column's type, raises
    :class:`StateDoesNotFit` naming its task and key."""
    if len(fields) == 1:
        try:
            return [typed_states(states, fields[0].type, keys, task)]
        except StateDoesNotFit:
            pass  # objects, to be read by field name
    names = set(fields.names)
    rows = _parsed(states, keys, task)
    for value, key in zip(rows, keys.to_pylist(), strict=True):
        if value is not None and not _has_columns(value, names) and len(names) != 1:
            raise StateDoesNotFit(
                f"task {task}, key {key!r}: its state {_excerpt(value)} is not a JSON object with any of "
                f"the columns {fields.names}, so it fills none: give one column for such states, or name "
                "the object's fields"
            )
    columns = []
    for field in fields:
        values = [v.get(field.name) if _has_columns(v, names) else v for v in rows]
        columns.append(_column(values, field.type, keys, task, f"column {field.name} {field.type}"))
    return columns


def _has_columns(value: Any, names: set[str]) -> bool:
    return isinstance(value, dict) and bool(value.keys() & names)


def _parsed(states: pa.Array, keys: pa.Array, task: str) -> list[Any]:
    values: list[Any] = []
    for state, key in zip(states.to_pylist(), keys.to_pylist(), strict=True):
        try:
            values.append(None if state is None else json.loads(state))
        except (UnicodeDecodeError, ValueError):
            raise StateDoesNotFit(
                f"task {task}, key {key!r}: its state is not JSON ({state[:40]!r}), so it has no typed "
                "value: read the state column (bytes) instead"
            ) from None
    return values


def _column(values: list[Any], state_type: pa.DataType, keys: pa.Array, task: str, what: str) -> pa.Array:
    try:
        return pa.array(values, state_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        pass  # find the state that does not fit, to name it
    for value, key in zip(values, keys.to_pylist(), strict=True):
        try:
            pa.array([value], state_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            raise StateDoesNotFit(
                f"task {task}, key {key!r}: its state {_excerpt(value)} does not fit {what}: {exc}"
            ) from None
    raise StateDoesNotFit(f"task {task}: its states do not fit {what}")


def _excerpt(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


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
