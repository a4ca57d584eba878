"""Keyed state as snapshots keep it: the pieces (Arrow IPC streams of ``key_group, key, state``)
a manifest lists, and reading them back, checked (docs/spark.md, "Keyed state across a shuffle").

The format's one home: Spark's keyed tasks write pieces with :func:`encode_piece`
(:mod:`spark_tasks.keyed`), a restore reads them with :func:`read_key_groups`, and
``cutline state`` reads them without Spark (:mod:`events.task.state_view`). Needs ``pyarrow``.
"""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Mapping

import pyarrow as pa

from events.task import storage
from events.task.manifest import Manifest, Piece, is_keyed_task
from events.task.participant import SnapshotCorrupted, load_task_snapshot
from events.wire.records import StateHandle
from events.wire.validation import is_within

__all__ = [
    "PIECE_SCHEMA",
    "Changes",
    "KeyedState",
    "apply_changes",
    "decode_piece",
    "decode_state_type",
    "encode_state_type",
    "encode_piece",
    "piece_table",
    "pieces_root",
    "read_key_groups",
    "read_manifest",
    "read_manifests",
    "read_piece",
    "state_type_name",
]

PIECE_SCHEMA = pa.schema([("key_group", pa.int32()), ("key", pa.string()), ("state", pa.binary())])

KeyedState = dict[int, dict[str, bytes]]
"""One partition's state: key group → key → the serialized state of the key."""
Changes = dict[int, dict[str, bytes | None]]
"""What changed: key group → key → the new serialized state, or None (deleted)."""


def encode_piece(changes: Mapping[int, Mapping[str, bytes | None]]) -> bytes:
    """``changes`` as an Arrow IPC stream of ``(key_group, key, state)`` rows, in key order."""
    groups: list[int] = []
    keys: list[str] = []
    states: list[bytes | None] = []
    for group in sorted(changes):
        for key in sorted(changes[group]):
            groups.append(group)
            keys.append(key)
            states.append(changes[group][key])
    table = pa.table(
        [pa.array(groups, pa.int32()), pa.array(keys, pa.string()), pa.array(states, pa.binary())],
        schema=PIECE_SCHEMA,
    )
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, PIECE_SCHEMA) as writer:
        writer.write_table(table)
    return sink.getvalue()


def encode_state_type(state_type: pa.DataType) -> str:
    """A step's declared state type as a manifest records it: the base64 of an Arrow schema with one
    field, ``state`` (exact for any Arrow type, structs and lists included)."""
    return base64.b64encode(pa.schema([("state", state_type)]).serialize().to_pybytes()).decode()


def decode_state_type(encoded: str) -> pa.DataType:
    """The Arrow type :func:`encode_state_type` recorded; text that is not one raises ``ValueError``."""
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(encoded, validate=True))).field("state").type
    except (pa.ArrowException, ValueError, KeyError) as exc:
        raise ValueError(f"{encoded[:40]!r} is not a recorded state type: {exc}") from exc


def state_type_name(encoded: str) -> str:
    """A recorded state type as people read it (Arrow's name: ``int64``, ``struct<count: int64>``)."""
    try:
        return str(decode_state_type(encoded))
    except ValueError:
        return f"an unreadable type ({encoded[:40]!r})"


def piece_table(data: bytes, where: str = "a piece") -> pa.Table:
    """A piece's rows as an Arrow table of :data:`PIECE_SCHEMA`; bytes that are not a piece raise
    :class:`SnapshotCorrupted` (a restore then tries an older checkpoint)."""
    try:
        table = pa.ipc.open_stream(data).read_all()
        if not table.schema.equals(PIECE_SCHEMA):
            raise ValueError(f"columns {table.schema.names}, not {PIECE_SCHEMA.names}")
    except (pa.ArrowException, ValueError) as exc:
        raise SnapshotCorrupted(f"{where} is not an Arrow stream of keyed state: {exc}") from exc
    return table


def decode_piece(data: bytes, wanted: range | None = None, where: str = "a piece") -> Changes:
    """The changes in a piece (only the key groups in ``wanted``, when given); bytes that are not a
    piece raise :class:`SnapshotCorrupted` (:func:`piece_table`)."""
    changes: Changes = {}
    columns = piece_table(data, where).to_pydict()
    for group, key, state in zip(columns["key_group"], columns["key"], columns["state"], strict=True):
        if wanted is None or group in wanted:
            changes.setdefault(group, {})[key] = state
    return changes


def apply_changes(state: KeyedState, changes: Mapping[int, Mapping[str, bytes | None]]) -> None:
    """Fold ``changes`` into ``state`` in place (None deletes a key)."""
    for group, entries in changes.items():
        keys = state.setdefault(group, {})
        for key, value in entries.items():
            if value is None:
                keys.pop(key, None)
            else:
                keys[key] = value
        if not keys:
            del state[group]


def read_piece(piece: Piece, root: str) -> bytes:
    """A piece's bytes, checked against its size and sha256 (a missing one is
    :class:`SnapshotCorrupted` too, naming it); it must lie below ``root``, as the one
    URI parser of cutline reads both (:func:`events.wire.validation.is_within`: an encoded ``..`` is no
    way out)."""
    if not is_within(piece.uri, root):
        raise SnapshotCorrupted(f"piece {piece.uri} is outside {root}: a manifest may only name pieces there")
    if not storage.stays_within(piece.uri, root):
        raise SnapshotCorrupted(
            f"piece {piece.uri} is a symbolic link (or lies below one) to a file outside {root}: refused"
        )
    try:
        data = storage.read_bytes(piece.uri)
    except FileNotFoundError:
        raise SnapshotCorrupted(
            f"piece {piece.uri} is missing: its manifest names it, nothing is there"
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != piece.size or digest != piece.sha256:
        raise SnapshotCorrupted(
            f"piece {piece.uri} is corrupt: expected {piece.size} bytes with sha256 {piece.sha256}, "
            f"found {len(data)} bytes with sha256 {digest}"
        )
    return data


def pieces_root(manifest_uri: str) -> str:
    """Where a manifest's pieces may lie: the directory above the manifest's checkpoint directory
    (the job's checkpoint location, whose ``chk-N`` directories hold the pieces of a chain)."""
    checkpoint_dir = manifest_uri.rsplit("/", 1)[0]
    return checkpoint_dir.rsplit("/", 1)[0]


def read_manifest(handle: StateHandle) -> Manifest:
    """The manifest a keyed task's state handle names, checked against the handle's size and sha256."""
    return Manifest.from_bytes(load_task_snapshot(handle), handle.uri)


def read_manifests(handles: Mapping[str, StateHandle]) -> dict[str, Manifest]:
    """The manifests of the keyed tasks among ``handles``, each checked against its handle."""
    return {task: read_manifest(handle) for task, handle in sorted(handles.items()) if is_keyed_task(task)}


def read_key_groups(
    manifests: Mapping[str, Manifest], handles: Mapping[str, StateHandle], wanted: range
) -> tuple[KeyedState, int]:
    """The state of the key groups in ``wanted`` from the manifests that hold any of them (any number
    of old partitions: this is how a job rescales), and how many pieces were read. Raises
    :class:`SnapshotCorrupted` for a piece outside its checkpoint location, not matching its hash,
    or not a piece."""
    state: KeyedState = {}
    read = 0
    for task, manifest in sorted(manifests.items()):
        if not set(manifest.key_groups) & set(wanted):
            continue
        root = pieces_root(handles[task].uri)
        for piece in manifest.pieces:
            apply_changes(state, decode_piece(read_piece(piece, root), wanted, piece.uri))
            read += 1
    return state, read
