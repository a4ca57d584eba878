"""Keyed state across a shuffle (docs/design.md, "Tasks and Spark"): key groups, incremental snapshots,
rescaling.

A :class:`KeyedStep` is Flink's ``keyBy(...).process(...)`` for a checkpointed Spark job, and
Spark's ``groupBy(...).applyInPandasWithState(...)`` in spirit::

    step = KeyedStep(
        key_by=lambda record: [(w, 1) for w in record.value.decode().split()],  # (key, value) pairs
        update=lambda key, count, ones: ((count or 0) + len(ones), [(key, (count or 0) + len(ones))]),
        output_schema="word string, count long",
        uid="word-count",                    # the step's identity across versions of the job
    )
    counts = job.stream_keyed(step)          # JobSettings(keyed_partitions=8, ...)

``key_by`` turns each input record into ``(key, value)`` pairs; ``update(key, state, values)``
gets one key's state (None for a new key) and the values the micro-batch brought for it, in input
order, and returns the new state (None deletes the key) and output rows. Snapshots record the
step's ``uid`` and its key function's name; a restore into another step refuses
(:mod:`spark_tasks.restore`).

**Whole batches.** The keyed path itself runs a :class:`KeyedBatchStep`: ``pairs_of`` over an
Arrow batch of records, ``update_batch`` over a micro-batch's keys, their values grouped by key
(a list array) and their states (a column). A :class:`KeyedStep` is its per-record, per-key
convenience (:meth:`KeyedStep.batched`). The map side hashes a batch's keys at once
(:func:`key_groups`); the shuffle side sorts the pairs with Arrow and calls ``update_batch`` once.

**Key groups.** A key belongs to key group ``murmur3_32(utf-8 key) mod max_parallelism`` (Flink's
max parallelism, default 128), and shuffle partition ``i`` of ``P`` owns the contiguous range
:func:`key_group_range` (Flink's ``KeyGroupRangeAssignment``). State is stored and snapshotted
per key group, so a snapshot taken with ``P`` partitions restores into ``P'``: each new partition
reads the key groups it owns from whichever old snapshots hold them.

**The plan.** ``source → mapInArrow(route) → repartitionById(P, cutline_target) →
mapInArrow(process)``. The map side is stateless: it applies ``pairs_of`` and sends each pair to its
key group's partition, and copies every barrier row (one per input partition, first in its
batch: :mod:`spark_tasks.kafka_source`) to all ``P`` partitions. A shuffle task therefore sees the
barrier from every input channel (seed 002's BarrierBuffer); its state before the batch is the
state at the cut (see docs/spark.md, "Keyed state").

**The state store** (:class:`KeyedStateStore`) keeps, per shuffle partition, a delta of the keys
each micro-batch changed and every :data:`FULL_EVERY` versions a full copy, as Spark's
HDFS-backed state store does, on any fsspec URL. Its files are written atomically but not
synced (neither are Spark's): after a crash the job restores from a checkpoint, whose snapshots
are synced. Versions are keyed by the micro-batch id: version
``b`` is the state after every batch below ``b``.

**Snapshots are incremental.** On a checkpoint barrier a task writes one *piece* with the keys
that changed since its previous snapshot (a delta), or all its keys (a full piece: the first
snapshot of a run, after :data:`MAX_CHAIN` deltas, and always for savepoints, which must stand
alone), and a *manifest* (JSON) that lists the pieces that rebuild its state: the previous
snapshot's pieces plus the new one. The manifest (:mod:`events.task.manifest`) is the task's state
handle; it also records the step's identity (``uid`` and the key function's name). Pieces are Arrow
IPC streams of ``(key_group, key, state)`` rows; a null state deletes the key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import pickle
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import mmh3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from events.clock import now_ms
from events.task import storage
from events.task.keyed_pieces import (
    Changes,
    KeyedState,
    apply_changes,
    decode_piece,
    encode_piece,
    encode_state_type,
    read_key_groups,
    read_manifest,
    read_manifests,
)
from events.task.manifest import Manifest, Piece, StepIdentity, callable_name
from events.task.participant import (
    SnapshotCorrupted,
)
from events.task.reply import Answer, Failed, SnapshotOutcome, Snapshotted, answer, failure
from events.wire.codec import process_wire
from events.wire.records import StateHandle
from events.wire.topics import Topics
from events.wire.vocabulary import DeclineReason
from events.wire.wire_settings import WireSettings
from spark_tasks.kafka_source import BARRIER_COLUMN, MARKER_COLUMN, entry_barrier
from spark_tasks.latency import KEYED, ROUTE, Measurements
from spark_tasks.session import is_connect_session
from spark_tasks.state import KafkaRecord, StateLost, _json_dumps, _json_loads
from spark_tasks.tasks import snapshot_name
from spark_tasks.workers import freeze_worker_heap

__all__ = [  # the piece format's names too, from events.task.keyed_pieces, for this module's importers
    "FULL_EVERY",
    "Changes",
    "KeyedState",
    "apply_changes",
    "decode_piece",
    "encode_piece",
    "MAX_CHAIN",
    "MAX_PARALLELISM",
    "KeyedBatchStep",
    "KeyedSettings",
    "KeyedStateStore",
    "KeyedStep",
    "as_batch_step",
    "Manifest",
    "Piece",
    "key_group",
    "key_group_range",
    "key_groups",
    "keyed_task_id",
    "operator_index",
    "process_step",
    "read_key_groups",
    "read_keyed_state",
    "read_manifest",
    "read_manifests",
    "route_step",
    "shuffle_schema",
]

log = logging.getLogger(__name__)

S = TypeVar("S")

MAX_PARALLELISM = 128
"""Key groups per job, as Flink's default max parallelism: the most shuffle partitions a job can
be rescaled to. Fixed for the life of a job's state (a snapshot records it)."""

FULL_EVERY = 16
"""The state store writes a full copy of a partition every this many versions (deltas between)."""

MAX_CHAIN = 8
"""Pieces a snapshot's manifest may list before the next snapshot is a full piece again."""

BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The local property Spark's MicroBatchExecution sets on every task of a micro-batch."""

TARGET_COLUMN = "cutline_target"
SHUFFLE_SCHEMA = (
    f"{TARGET_COLUMN} int, key_group int, key string, value binary, "
    f"topic string, partition int, offset long, seq int, {BARRIER_COLUMN} string, {MARKER_COLUMN} string"
)
"""The rows between the map side and the shuffle side: a pair, or a barrier or latency marker row
(key null); ``value`` is the step's ``value_type`` (:func:`shuffle_schema`), pickled bytes for a
:class:`KeyedStep`."""


# ------------------------------------------------------------------ key groups


def key_group(key: str, max_parallelism: int = MAX_PARALLELISM) -> int:
    """The key group of ``key``: murmur3 (32 bit, seed 0) of its UTF-8 bytes, mod ``max_parallelism``."""
    return int(mmh3.hash(key.encode("utf-8"), 0, signed=False)) % max_parallelism


LONG_KEY_BYTES = 256
"""Keys longer than this are hashed one by one (:func:`key_groups`): the vectorized hash loops once
per 4 bytes of the longest key."""

_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _murmur3_32(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """MurmurHash3 x86 32-bit, seed 0, of ``data[start:start+length]`` for every start and length at
    once (uint32 arithmetic wraps as the C code's). ``data`` is uint32 with 3 spare bytes at the end."""
    blocks = lengths >> 2
    h = np.zeros(len(starts), np.uint32)
    for j in range(int(blocks.max(initial=0))):
        live = np.flatnonzero(blocks > j)
        at = starts[live] + 4 * j
        k = data[at] | (data[at + 1] << 8) | (data[at + 2] << 16) | (data[at + 3] << 24)
        h[live] = _rotl(h[live] ^ (_rotl(k * _C1, 15) * _C2), 13) * np.uint32(5) + np.uint32(0xE6546B64)
    tail, at = lengths & 3, starts + (blocks << 2)
    k = np.where(tail >= 3, data[at + 2] << 16, 0).astype(np.uint32)
    k ^= np.where(tail >= 2, data[at + 1] << 8, 0).astype(np.uint32)
    k ^= np.where(tail >= 1, data[at], 0).astype(np.uint32)
    h ^= np.where(tail >= 1, _rotl(k * _C1, 15) * _C2, 0).astype(np.uint32)
    h ^= lengths.astype(np.uint32)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def key_groups(keys: pa.Array | pa.ChunkedArray, max_parallelism: int = MAX_PARALLELISM) -> np.ndarray:
    """:func:`key_group` of every key of a string column at once (int32), from its Arrow buffers: the
    map side routes a batch without a Python call per key. Keys must not be null."""
    array = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    if pa.types.is_large_string(array.type):
        array = array.cast(pa.string())
    if not pa.types.is_string(array.type) or array.null_count:
        raise ValueError(f"keys must be non-null strings, got {array.type} with {array.null_count} nulls")
    n = len(array)
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32, n + 1, array.offset * 4).astype(np.int64)
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    data = np.concatenate([data, np.zeros(4, np.uint8)]).astype(np.uint32)
    starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
    short = np.flatnonzero(lengths <= LONG_KEY_BYTES)
    hashes = np.zeros(n, np.uint32)
    with np.errstate(over="ignore"):
        hashes[short] = _murmur3_32(data, starts[short], lengths[short])
    for i in np.flatnonzero(lengths > LONG_KEY_BYTES):
        hashes[i] = mmh3.hash(array[int(i)].as_py(), 0, signed=False)
    return (hashes % np.uint32(max_parallelism)).astype(np.int32)


def key_group_range(index: int, parallelism: int, max_parallelism: int = MAX_PARALLELISM) -> range:
    """The key groups shuffle partition ``index`` of ``parallelism`` owns (Flink's
    ``KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex``)."""
    if not 0 < parallelism <= max_parallelism:
        raise ValueError(f"parallelism {parallelism} must be between 1 and max parallelism {max_parallelism}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


def operator_index(group: int, parallelism: int, max_parallelism: int = MAX_PARALLELISM) -> int:
    """The shuffle partition of ``parallelism`` that owns key group ``group``."""
    return group * parallelism // max_parallelism


def keyed_task_id(index: int) -> str:
    """The checkpoint task of shuffle partition ``index``: ``keyed-<index>``."""
    return f"keyed-{index}"


# ------------------------------------------------------------------------ step


@dataclass(frozen=True)
class KeyedStep(Generic[S]):
    """Keyed processing: ``key_by(record) -> (key, value) pairs`` on the map side, then per key
    ``update(key, state | None, values) -> (state | None, rows)`` on the shuffle side.

    ``update`` must be deterministic (a re-run of a batch and a restore replay the same values);
    returning None as the state deletes the key. ``serialize``/``deserialize`` turn one key's state
    into bytes and back (default JSON). Values travel through the shuffle pickled. Rows are tuples
    or dicts of ``output_schema``, a Spark DDL string.
    """

    key_by: Callable[[KafkaRecord], Iterable[tuple[str, Any]]]
    update: Callable[[str, S | None, Sequence[Any]], tuple[S | None, Iterable[Any]]]
    output_schema: str
    serialize: Callable[[S], bytes] = _json_dumps
    deserialize: Callable[[bytes], S] = _json_loads
    max_parallelism: int = MAX_PARALLELISM
    uid: str | None = None
    """The step's identity across versions of the job (Flink's operator uid). Snapshots record it
    and the key function's name; a restore into a step with another refuses unless the job allows
    non-restored state (:mod:`spark_tasks.restore`)."""
    state_type: pa.DataType | None = None
    """The Arrow type of one key's state (optional; its serialized form must be that type's JSON, as
    the default serializer gives). Snapshots record it: ``cutline-state`` reads states as a column of
    it (docs/state.md), and a restore refuses state of another type."""

    @property
    def identity(self) -> StepIdentity:
        """What a snapshot records of this step: its uid, its key function's qualified name and its
        state type."""
        return StepIdentity(self.uid, callable_name(self.key_by), _recorded(self.state_type))

    def batched(self) -> KeyedBatchStep:
        """This step as the keyed path runs it: ``key_by`` and ``update`` called record by record and
        key by key inside the batch functions (values pickled across the shuffle, states as bytes)."""
        return KeyedBatchStep(
            pairs_of=PairsOfRecords(self.key_by),
            update_batch=UpdateEachKey(self.update, self.serialize, self.deserialize),
            output_schema=self.output_schema,
            max_parallelism=self.max_parallelism,
            uid=self.uid,
            state_type=self.state_type,
        )


def _recorded(state_type: pa.DataType | None) -> str | None:
    return None if state_type is None else encode_state_type(state_type)


def _as_stored(states: pa.Array) -> pa.Array:
    """States that are their stored bytes already."""
    return states


@dataclass(frozen=True)
class KeyedBatchStep:
    """Keyed processing over whole Arrow batches, Spark's ``groupBy(...).agg(...)`` in spirit: what the
    keyed path runs (a :class:`KeyedStep` is its per-key convenience, :meth:`KeyedStep.batched`).

    ``pairs_of(records)`` gets a batch of the source's rows (no barrier or marker rows) and returns
    a table of ``row`` (the index of the record a pair came from), ``key`` (a string) and ``value``
    (of ``value_type``), in input order. ``update_batch(keys, values, states)`` gets, per shuffle
    partition and micro-batch, each key once (sorted by key group and key), a list array of each
    key's values in input order, and each key's state before the batch (null for a new key;
    ``decode_states`` of the stored bytes); it returns the new states (one per key, null deletes
    the key) and the output rows (an Arrow table or batch with ``output_schema``'s columns, or
    tuples or dicts). ``encode_states``/``decode_states`` turn a state column into the bytes the
    store and snapshots keep and back. All must be deterministic.
    """

    pairs_of: Callable[[pa.RecordBatch], pa.Table | pa.RecordBatch]
    update_batch: Callable[[pa.Array, pa.ListArray, pa.Array], tuple[pa.Array, Any]]
    output_schema: str
    value_type: pa.DataType = field(default_factory=pa.binary)
    encode_states: Callable[[pa.Array], pa.Array] = _as_stored
    decode_states: Callable[[pa.Array], pa.Array] = _as_stored
    max_parallelism: int = MAX_PARALLELISM
    uid: str | None = None
    """As :attr:`KeyedStep.uid`."""
    state_type: pa.DataType | None = None
    """As :attr:`KeyedStep.state_type` (the stored bytes, ``encode_states``'s, are its JSON)."""

    @property
    def identity(self) -> StepIdentity:
        """What a snapshot records of this step: its uid, ``pairs_of``'s qualified name and its state type."""
        return StepIdentity(self.uid, callable_name(self.pairs_of), _recorded(self.state_type))

    def batched(self) -> KeyedBatchStep:
        return self


AnyKeyedStep = KeyedStep[Any] | KeyedBatchStep


def as_batch_step(step: AnyKeyedStep) -> KeyedBatchStep:
    """The batch form of ``step`` (itself when it is one)."""
    return step.batched()


@dataclass(frozen=True)
class PairsOfRecords:
    """``pairs_of`` over a per-record ``key_by``: one Python call per record, values pickled."""

    key_by: Callable[[KafkaRecord], Iterable[tuple[str, Any]]]

    def __call__(self, records: pa.RecordBatch) -> pa.Table:
        columns = records.to_pydict()
        rows: list[int] = []
        keys: list[str] = []
        values: list[bytes] = []
        for i in range(records.num_rows):
            record = KafkaRecord(
                columns["key"][i], columns["value"][i], columns["topic"][i], columns["partition"][i],
                columns["offset"][i], columns["timestamp"][i],
            )  # fmt: skip
            for key, value in self.key_by(record):
                rows.append(i)
                keys.append(key)
                values.append(pickle.dumps(value))
        return pa.table(
            [pa.array(rows, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.binary())],
            names=["row", "key", "value"],
        )


@dataclass(frozen=True)
class UpdateEachKey:
    """``update_batch`` over a per-key ``update``: one Python call per key, states as their bytes."""

    update: Callable[[str, Any, Sequence[Any]], tuple[Any, Iterable[Any]]]
    serialize: Callable[[Any], bytes]
    deserialize: Callable[[bytes], Any]

    def __call__(self, keys: pa.Array, values: pa.ListArray, states: pa.Array) -> tuple[pa.Array, list[Any]]:
        new_states: list[bytes | None] = []
        rows: list[Any] = []
        for key, pickled, old in zip(keys.to_pylist(), values.to_pylist(), states.to_pylist(), strict=True):
            new, out = self.update(
                key, None if old is None else self.deserialize(old), [pickle.loads(v) for v in pickled]
            )
            new_states.append(None if new is None else self.serialize(new))
            rows.extend(out)
        return pa.array(new_states, pa.binary()), rows


# ---------------------------------------------------------- pieces and manifests


def count_keys(changes: Mapping[int, Mapping[str, Any]]) -> int:
    return sum(len(entries) for entries in changes.values())


def read_keyed_state(
    handles: Mapping[str, StateHandle], wanted: range, max_parallelism: int
) -> tuple[KeyedState, int]:
    """:func:`read_key_groups` of the keyed snapshots in ``handles``, refusing
    (:class:`SnapshotCorrupted`) a snapshot taken with another max parallelism (key groups would not
    line up). A job restores through :func:`spark_tasks.restore.plan_restore` first, which checks
    that and more (every key group covered)."""
    manifests = read_manifests(handles)
    for task, manifest in manifests.items():
        if manifest.max_parallelism != max_parallelism:
            raise SnapshotCorrupted(
                f"{handles[task].uri} was taken with max parallelism {manifest.max_parallelism}, the job "
                f"has {max_parallelism}: key groups cannot be mapped (keep the job's max_parallelism)"
            )
    return read_key_groups(manifests, handles, wanted)


# ------------------------------------------------------------------ state store

_STORE_FILE = re.compile(r"^(\d{20})\.(full|delta|lost|snap)$")

_cache: dict[str, tuple[int, KeyedState]] = {}
"""Per Python worker: the newest state of each store directory this worker saved. Spark reuses its
Python workers, so the next batch of a partition usually finds its state here without reading
files (it still lists the directory, so a version another worker wrote is never missed)."""


class KeyedStateStore:
    """One shuffle partition's state between micro-batches, on any fsspec URL (or a local path).

    ``<root>/p<index>/<version:020d>.delta`` holds the keys batch ``version - 1`` changed;
    ``.full`` every key (every :data:`FULL_EVERY` versions, next to that version's delta);
    ``.lost`` a tombstone (state missing: later loads raise :class:`StateLost`); ``.snap`` the
    manifest of the partition's last checkpoint snapshot taken at that version.
    """

    def __init__(self, root: str, index: int) -> None:
        self.dir = f"{root.rstrip('/')}/p{index}"

    def _entries(self) -> list[tuple[int, str]]:
        found = (_STORE_FILE.match(name) for name in storage.list_names(self.dir))
        return sorted((int(m.group(1)), m.group(2)) for m in found if m)

    def _uri(self, version: int, kind: str) -> str:
        return f"{self.dir}/{version:020d}.{kind}"

    def versions(self) -> list[int]:
        return sorted({v for v, kind in self._entries() if kind in ("full", "delta")})

    def load(self, batch: int) -> KeyedState | None:
        """The state before micro-batch ``batch`` (newest version at or below it), or None if there is
        none. Raises :class:`StateLost` when a tombstone is at or below ``batch``."""
        entries = [(v, kind) for v, kind in self._entries() if v <= batch]
        lost = [v for v, kind in entries if kind == "lost"]
        if lost:
            raise StateLost(storage.read_bytes(self._uri(lost[-1], "lost")).decode("utf-8", "replace"))
        data_versions = [v for v, kind in entries if kind in ("full", "delta")]
        if not data_versions:
            return None
        newest = data_versions[-1]
        cached = _cache.get(self.dir)
        if cached is not None and cached[0] == newest:
            return _copy(cached[1])
        fulls = [v for v, kind in entries if kind == "full"]
        if not fulls:
            return None
        base = fulls[-1]
        state: KeyedState = {}
        apply_changes(state, decode_piece(storage.read_bytes(self._uri(base, "full"))))
        for version, kind in entries:
            if base < version and kind == "delta":
                apply_changes(state, decode_piece(storage.read_bytes(self._uri(version, "delta"))))
        return state

    def changed_since(self, after: int, upto: int) -> set[tuple[int, str]] | None:
        """The ``(key group, key)`` pairs changed by versions in ``(after, upto]``, or None if a delta
        of that range is gone (the caller then writes a full snapshot)."""
        found = [(v, kind) for v, kind in self._entries() if after < v <= upto]  # one listing
        deltas = {v for v, kind in found if kind == "delta"}
        writes = {v for v, kind in found if kind in ("full", "delta")}
        if writes - deltas:
            return None
        changed: set[tuple[int, str]] = set()
        for version in sorted(deltas):
            for group, entries in decode_piece(storage.read_bytes(self._uri(version, "delta"))).items():
                changed.update((group, key) for key in entries)
        return changed

    def save(self, version: int, state: KeyedState, changes: Changes) -> None:
        """Store ``version`` (``state`` after ``changes``): a delta, and every :data:`FULL_EVERY`
        versions a full copy too; then prune what no load or snapshot can need."""
        if changes or version % FULL_EVERY == 0:
            storage.write_bytes(self._uri(version, "delta"), encode_piece(changes), durable=False)
        if version % FULL_EVERY == 0:
            storage.write_bytes(self._uri(version, "full"), encode_piece(state), durable=False)
        _cache[self.dir] = (version, _copy(state))
        self._prune()

    def seed(self, state: KeyedState) -> None:
        """The first version (0): a restored or empty state, written before the query starts."""
        storage.write_bytes(self._uri(0, "full"), encode_piece(state), durable=False)
        storage.write_bytes(self._uri(0, "delta"), encode_piece({}), durable=False)

    def lost(self, version: int, reason: str) -> None:
        storage.write_bytes(self._uri(version, "lost"), reason.encode(), durable=False)

    def last_snapshot(self, batch: int) -> tuple[int, Manifest] | None:
        """The newest snapshot this partition took at or below ``batch`` and its manifest."""
        snaps = [v for v, kind in self._entries() if kind == "snap" and v <= batch]
        if not snaps:
            return None
        uri = self._uri(snaps[-1], "snap")
        return snaps[-1], Manifest.from_bytes(storage.read_bytes(uri), uri)

    def snapshot_taken(self, batch: int, manifest: Manifest) -> None:
        # Not synced: a lost record only makes the next snapshot a full one.
        storage.write_bytes(self._uri(batch, "snap"), manifest.to_bytes(), durable=False)

    def _prune(self) -> None:
        """Keep the two newest full copies and everything after the older one, and the deltas after
        the last snapshot (they make the next snapshot's delta)."""
        entries = self._entries()
        fulls = [v for v, kind in entries if kind == "full"]
        if len(fulls) < 3:
            return
        keep_from = fulls[-2]
        snaps = [v for v, kind in entries if kind == "snap"]
        delta_from = min(keep_from, snaps[-1]) if snaps else keep_from
        for version, kind in entries:
            old = (
                (kind == "full" and version < keep_from)
                or (kind == "delta" and version <= delta_from and version < keep_from)
                or (kind == "snap" and snaps and version < snaps[-1])
            )
            if old:
                storage.delete(self._uri(version, kind))


def _copy(state: KeyedState) -> KeyedState:
    return {group: dict(keys) for group, keys in state.items()}


# --------------------------------------------------------------------- settings


@dataclass(frozen=True)
class KeyedSettings:
    """What every task of a keyed job needs; pickled into the executors with the step."""

    job_id: str
    bootstrap: str
    state_root: str
    """URL (or local path) of the job attempt's state store."""
    parallelism: int
    inputs: frozenset[tuple[str, int]]
    """The channels a barrier must arrive from, every one of them: the job's input partitions, or on
    Spark's kafka connector the ``cutline-barriers`` source's one
    (:data:`spark_tasks.barrier_source.CHANNEL`)."""
    topic_prefix: str = Topics().prefix
    producer_extra: Mapping[str, Any] = field(default_factory=dict)
    run_id: str = ""
    attempt: int = 0
    wire: WireSettings = field(default_factory=process_wire)
    """The framing of the replies: the driver's."""
    acks_carry_offsets: bool = True
    """Partition 0's acks carry the cut's offsets, from the barrier rows (``cutline-kafka``); False on
    Spark's kafka connector, where the driver's ``source`` task acks them."""

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)


# ------------------------------------------------------------------- map side


def _route_schema(value_type: pa.DataType) -> pa.Schema:
    return pa.schema(
        [
            (TARGET_COLUMN, pa.int32()),
            ("key_group", pa.int32()),
            ("key", pa.string()),
            ("value", value_type),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("seq", pa.int32()),
            (BARRIER_COLUMN, pa.string()),
            (MARKER_COLUMN, pa.string()),
        ]
    )


def shuffle_schema(step: AnyKeyedStep) -> str:
    """The Spark DDL of the rows between ``step``'s map side and its shuffle side
    (:data:`SHUFFLE_SCHEMA` with the step's ``value_type``)."""
    from pyspark.sql.pandas.types import from_arrow_type

    value = from_arrow_type(as_batch_step(step).value_type).simpleString()
    return SHUFFLE_SCHEMA.replace("value binary", f"value {value}")


def route_step(
    step: AnyKeyedStep, parallelism: int, settings: KeyedSettings | None = None
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function before the shuffle: pairs to their key group's partition, barrier
    and latency marker rows to every partition (markers are measured here first, with ``settings``).
    A batch is routed with Arrow compute: ``pairs_of`` once, key groups by :func:`key_groups`."""
    batch_step = as_batch_step(step)
    schema = _route_schema(batch_step.value_type)

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_worker_heap()
        job_id, attempt = ("", 0) if settings is None else (settings.job_id, settings.attempt)
        latency = Measurements(job_id, attempt, ROUTE)
        for rows in batches:
            batch, markers = latency.take_markers(rows)
            records, barriers = _split_barriers(batch)
            copies = [(m["topic"], m["partition"], m["offset"], None, m[MARKER_COLUMN]) for m in markers] + [
                (b["topic"], b["partition"], b["offset"], b[BARRIER_COLUMN], None) for b in barriers
            ]
            if copies:
                yield _copies_to_every_partition(copies, parallelism, schema)
            if records.num_rows:
                routed = _route_pairs(batch_step, records, parallelism, schema)
                if routed.num_rows:
                    yield routed
        if settings is not None:
            latency.send(_task_settings(settings))

    return run


def _split_barriers(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list[dict[str, Any]]]:
    """``batch`` without its barrier rows, and those rows (``topic``, ``partition``, ``offset``, the
    barrier's JSON)."""
    if BARRIER_COLUMN not in batch.schema.names:
        return batch, []
    column = batch.column(BARRIER_COLUMN)
    if column.null_count == batch.num_rows:
        return batch, []
    is_barrier = pc.is_valid(column)
    barriers = batch.filter(is_barrier).select(["topic", "partition", "offset", BARRIER_COLUMN]).to_pylist()
    return batch.filter(pc.invert(is_barrier)), barriers


def _copies_to_every_partition(
    copies: list[tuple[str, int, int, str | None, str | None]], parallelism: int, schema: pa.Schema
) -> pa.RecordBatch:
    """A row per shuffle partition for each barrier or marker row (topic, partition, offset, barrier,
    marker)."""
    rows = [copy for copy in copies for _ in range(parallelism)]
    columns: list[list[Any]] = [
        [target for _ in copies for target in range(parallelism)],
        [-1] * len(rows),
        [None] * len(rows),
        [None] * len(rows),
        *([row[i] for row in rows] for i in range(3)),
        [0] * len(rows),
        *([row[i] for row in rows] for i in (3, 4)),
    ]
    return pa.RecordBatch.from_arrays(
        [pa.array(column, f.type) for column, f in zip(columns, schema, strict=True)], schema=schema
    )


def _route_pairs(
    step: KeyedBatchStep, records: pa.RecordBatch, parallelism: int, schema: pa.Schema
) -> pa.RecordBatch:
    """The pairs of ``records`` with their key group, target partition and the input position they
    are ordered by on the shuffle side (topic, partition, offset, then ``seq``: the pair's index)."""
    pairs = step.pairs_of(records)
    keys = _column(pairs, "key")
    groups = key_groups(keys, step.max_parallelism)
    targets = (groups.astype(np.int64) * parallelism // step.max_parallelism).astype(np.int32)
    rows = _column(pairs, "row")
    n = len(keys)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(targets),
            pa.array(groups),
            keys.cast(pa.string()),
            _column(pairs, "value").cast(step.value_type),
            *(pc.take(records.column(name), rows) for name in ("topic", "partition", "offset")),
            pa.array(np.arange(n, dtype=np.int32)),
            pa.nulls(n, pa.string()),
            pa.nulls(n, pa.string()),
        ],
        schema=schema,
    )


def _column(table: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
    column = table.column(name)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


# ---------------------------------------------------------------- shuffle side


def connect_batch_property(job_id: str, run_id: str) -> str:
    """The session setting that tells a keyed job's tasks their micro-batch id on Spark Connect.

    There a ``foreachBatch`` function runs in a Python process of the server and its actions on the
    batch's DataFrame run as Connect executions, outside the query's thread, so its tasks lack
    :data:`BATCH_ID_PROPERTY`. Spark copies a session's ``spark*`` settings into each job's local
    properties, so :func:`batch_id_known` sets this one (per job run: queries of one session do not
    mix) around the function's actions."""
    return f"spark.cutline.batchId.{job_id}.{run_id}"


@contextlib.contextmanager
def batch_id_known(batch_df: Any, batch_id: int, prop: str | None) -> Iterator[None]:
    """Around a ``foreachBatch`` function's actions on ``batch_df``: on a Spark Connect session, the
    keyed tasks they run learn ``batch_id`` from the setting ``prop``
    (:func:`connect_batch_property`); on a classic session (or without ``prop``), nothing to do."""
    if prop is None:
        yield
        return
    session = batch_df.sparkSession
    if not is_connect_session(session):
        yield
        return
    session.conf.set(prop, str(batch_id))
    try:
        yield
    finally:
        session.conf.unset(prop)


@dataclass(frozen=True)
class WithBatchId:
    """A keyed job's ``foreachBatch`` function that works on Spark Connect too: ``function``'s
    actions on the batch run with the batch id known (:func:`batch_id_known`). Made by
    ``CheckpointedJob.foreach_batch``."""

    function: Callable[[Any, int], object]
    prop: str | None

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        with batch_id_known(batch_df, batch_id, self.prop):
            self.function(batch_df, batch_id)


def _batch_id(settings: KeyedSettings) -> tuple[int, int]:
    """(micro-batch id, shuffle partition) of the running task: Spark's, or on Spark Connect inside a
    ``foreachBatch`` function, :func:`batch_id_known`'s."""
    from pyspark import TaskContext

    context = TaskContext.get()
    batch = None
    if context is not None:
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) or context.getLocalProperty(
            connect_batch_property(settings.job_id, settings.run_id)
        )
    if context is None or batch is None:
        raise RuntimeError(
            "keyed state runs only inside a streaming query's micro-batch; on Spark Connect, a "
            "foreachBatch function of a keyed job must be wrapped: job.foreach_batch(function)"
        )
    return int(batch), context.partitionId()


def process_step(
    step: AnyKeyedStep, settings: KeyedSettings, output: pa.Schema
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function after the shuffle: one task per shuffle partition and batch.

    Loads the partition's state before the batch; on the barrier (from every input partition)
    snapshots it into the checkpoint's location and acks; folds the batch's values, grouped by key
    (in input order), through ``update_batch`` at once; saves the changes as the next version.
    """
    batch_step = as_batch_step(step)

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_worker_heap()
        batch_id, index = _batch_id(settings)
        groups = key_group_range(index, settings.parallelism, step.max_parallelism)
        store = KeyedStateStore(settings.state_root, index)
        latency = Measurements(settings.job_id, settings.attempt, KEYED, index)
        barriers, pairs = _take_rows(batches, latency)
        latency.send(_task_settings(settings))
        task = keyed_task_id(index)
        state, missing = _load_state(store, index, batch_id)
        reply = _Replier(step, settings, store, index, groups, barriers)
        if not reply.after_batch:
            reply(batch_id, state, missing)  # the state at the batch's start: the cut
        if state is None:
            if missing is not None:
                log.error("task %s skips batch %d: %s", task, batch_id, missing)
                store.lost(batch_id + 1, missing)
            reply.finish(batch_id, missing)
            return
        changes, rows = fold_pairs(batch_step, state, pairs, groups, index)
        apply_changes(state, changes)
        store.save(batch_id + 1, state, changes)
        if reply.after_batch:
            reply(batch_id + 1, state, None)  # a stop: the state after the batch, its last
        reply.finish(batch_id, None)  # the ack's round trip overlapped the fold; the task ends once it is out
        yield from _output_batches(rows, output)

    return run


@dataclass
class _Replier:
    """A shuffle task's answer to the barrier of its batch, if it has one: the snapshot at the batch's
    start (the cut), or for a stop-with-savepoint barrier after the batch's records, so that its cut
    is the end of the last batch the job runs (docs/spark.md, "Stop with a savepoint")."""

    step: AnyKeyedStep
    settings: KeyedSettings
    store: KeyedStateStore
    index: int
    groups: range
    barriers: Mapping[tuple[str, int], tuple[str, int]]
    answered: bool = False

    @property
    def after_batch(self) -> bool:
        return any(json.loads(raw).get("stop") for raw, _ in self.barriers.values())

    def __call__(self, version: int, state: KeyedState | None, missing: str | None) -> None:
        """Snapshot ``state`` (the partition's ``version``) and send the ack, or the decline."""
        if not self.barriers or self.answered:
            return
        outcome = _on_barriers(
            self.step,
            self.settings,
            self.store,
            self.index,
            self.groups,
            version,
            self.barriers,
            state,
            missing,
        )
        entry = json.loads(next(iter(self.barriers.values()))[0])
        checkpoint = entry_barrier(self.settings.job_id, entry)
        task = keyed_task_id(self.index)
        _send(self.settings, answer(checkpoint, entry.get("epoch"), task, outcome, now_ms()))
        self.answered = True

    def finish(self, batch_id: int, missing: str | None) -> None:
        """Answer now if not yet (a stop's barrier with no state: the decline), and wait until the
        answer is out."""
        if self.barriers:
            self(batch_id, None, missing)
            _await(self.settings)


def _output_batches(rows: Any, output: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``update_batch``'s rows as batches of ``output``: Arrow columns cast by name, or tuples and
    dicts converted."""
    if isinstance(rows, pa.Table | pa.RecordBatch):
        if rows.num_rows:
            columns = [_column(rows, f.name).cast(f.type) for f in output]
            yield pa.RecordBatch.from_arrays(columns, schema=output)
        return
    listed = [row if isinstance(row, Mapping) else dict(zip(output.names, row, strict=True)) for row in rows]
    if listed:
        yield pa.RecordBatch.from_pylist(listed, schema=output)


_PAIR_COLUMNS = ["key_group", "key", "value", "topic", "partition", "offset", "seq"]


def _take_rows(
    batches: Iterable[pa.RecordBatch], latency: Measurements
) -> tuple[dict[tuple[str, int], tuple[str, int]], pa.Table | None]:
    """The barriers (by input partition: the barrier and its offset) and the pairs of a shuffle
    task's batches (None if there were none); latency markers are measured and dropped, never folded."""
    barriers: dict[tuple[str, int], tuple[str, int]] = {}
    pairs: list[pa.RecordBatch] = []
    for arrived in batches:
        batch, _ = latency.take_markers(arrived)
        records, barrier_rows = _split_barriers(batch)
        for row in barrier_rows:
            barriers[(row["topic"], row["partition"])] = (row[BARRIER_COLUMN], row["offset"])
        if records.num_rows:
            pairs.append(records.select(_PAIR_COLUMNS))
    return barriers, pa.Table.from_batches(pairs) if pairs else None


def _load_state(store: KeyedStateStore, index: int, batch_id: int) -> tuple[KeyedState | None, str | None]:
    """The partition's state before ``batch_id``, or None and why it is missing (a tombstone, or no
    version this executor can see)."""
    try:
        state = store.load(batch_id)
    except StateLost as lost:
        return None, str(lost)
    if state is not None:
        return state, None
    return None, (
        f"no keyed state of partition {index} at or below batch {batch_id} in {store.dir} on "
        f"{socket.gethostname()}: the job wrote it before the query started, so this executor "
        "cannot see it. The state location must be on storage every executor sees"
    )


def fold_pairs(
    step: KeyedBatchStep, state: KeyedState, pairs: pa.Table | None, groups: range, index: int
) -> tuple[Changes, Any]:
    """Fold a shuffle task's pairs through ``update_batch`` at once: the changed keys' new encodings
    and the output rows. The pairs are sorted by key group, key and input position (topic,
    partition, offset, seq), so a re-run, and a run after a restore, fold the same values alike."""
    if pairs is None or not pairs.num_rows:
        return {}, []
    _check_key_groups(pairs, groups, index)
    ordered = pairs.sort_by(
        [(name, "ascending") for name in ("key_group", "key", "topic", "partition", "offset", "seq")]
    )
    runs = pc.run_end_encode(_column(ordered, "key"))
    ends = runs.run_ends.to_numpy().astype(np.int32)
    keys = runs.values
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int32)
    key_groups_of = pc.take(_column(ordered, "key_group"), pa.array(starts)).to_pylist()
    values = pa.ListArray.from_arrays(
        pa.array(np.concatenate([[0], ends]).astype(np.int32)), _column(ordered, "value")
    )
    names = keys.to_pylist()
    old = pa.array([state.get(g, {}).get(k) for g, k in zip(key_groups_of, names, strict=True)], pa.binary())
    new_states, rows = step.update_batch(keys, values, step.decode_states(old))
    if len(new_states) != len(keys):
        raise ValueError(f"update_batch returned {len(new_states)} states for {len(keys)} keys")
    encoded = step.encode_states(new_states).cast(pa.binary())
    same = pc.fill_null(pc.equal(encoded, old), pc.and_(pc.is_null(encoded), pc.is_null(old)))
    changed = pc.invert(same)
    changes: Changes = {}
    for group, key, stored in zip(
        pa.array(key_groups_of, pa.int32()).filter(changed).to_pylist(),
        keys.filter(changed).to_pylist(),
        encoded.filter(changed).to_pylist(),
        strict=True,
    ):
        changes.setdefault(group, {})[key] = stored
    return changes, rows


def _check_key_groups(pairs: pa.Table, groups: range, index: int) -> None:
    """Every pair's key group is one this partition owns (a routing bug otherwise)."""
    bounds = pc.min_max(pairs.column("key_group"))
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low < groups.start or high >= groups.stop:
        stray = (
            pairs.filter(
                pc.or_(
                    pc.less(pairs["key_group"], groups.start),
                    pc.greater_equal(pairs["key_group"], groups.stop),
                )
            )
            .slice(0, 1)
            .to_pylist()[0]
        )
        key, group = stray["key"], stray["key_group"]
        raise RuntimeError(f"key {key!r} (key group {group}) reached partition {index}, which owns {groups}")


def _on_barriers(
    step: AnyKeyedStep,
    settings: KeyedSettings,
    store: KeyedStateStore,
    index: int,
    groups: range,
    batch_id: int,
    barriers: Mapping[tuple[str, int], tuple[str, int]],
    state: KeyedState | None,
    missing: str | None,
) -> SnapshotOutcome:
    """Snapshot the state at the cut once a barrier has come from every input partition; what came
    of it (the answer to the barrier is :func:`events.task.reply.answer`'s)."""
    entries = {json.dumps(json.loads(raw), sort_keys=True) for raw, _ in barriers.values()}
    entry = json.loads(next(iter(barriers.values()))[0])
    checkpoint_id = int(entry["id"])
    task = keyed_task_id(index)
    if len(entries) != 1:
        return Failed(
            DeclineReason.TASK_CHECKPOINT_FAILURE,
            f"partition {index} got barriers of different checkpoints in batch {batch_id}",
        )
    absent = sorted(settings.inputs - set(barriers))
    if absent:
        names = ", ".join(f"{t}[{p}]" for t, p in absent)
        return Failed(
            DeclineReason.TASK_CHECKPOINT_FAILURE,
            f"partition {index} got the barrier of checkpoint {checkpoint_id} from {len(barriers)} of "
            f"{len(settings.inputs)} input partitions (none from {names}): not aligned",
        )
    if state is None:
        return Failed(DeclineReason.TASK_CHECKPOINT_FAILURE, str(missing))
    # Only partition 0 records the cut's source offsets: once per checkpoint, as Flink's sources do
    # (on Spark's kafka connector the driver's ``source`` task does: spark_tasks.connector_cuts).
    records = index == 0 and settings.acks_carry_offsets
    offsets = {f"{t}:{p}": cut for (t, p), (_, cut) in sorted(barriers.items())} if records else {}
    started = time.perf_counter()
    try:
        manifest_uri, data, piece = write_snapshot(
            store, state, groups, step.max_parallelism, task, settings, entry, batch_id, step.identity
        )
    except Exception as exc:
        log.warning("task %s declines checkpoint %d: %r", task, checkpoint_id, exc)
        return failure(exc)
    metrics = {
        "write_ms": round((time.perf_counter() - started) * 1000),
        "bytes": piece.size if piece is not None else 0,
        "keys": piece.keys if piece is not None else 0,
    }
    return Snapshotted(manifest_uri, data, offsets, metrics)


def write_snapshot(
    store: KeyedStateStore,
    state: KeyedState,
    groups: range,
    max_parallelism: int,
    task: str,
    settings: KeyedSettings,
    barrier: Mapping[str, Any],
    batch_id: int,
    step: StepIdentity,
) -> tuple[str, bytes, Piece | None]:
    """Write the snapshot of ``state`` (the state before ``batch_id``) for ``barrier``: the new piece,
    then the manifest (which records ``step``). Returns the manifest's URI and bytes and the piece
    written (None when this run had written this very snapshot before: a re-run of the batch acks it
    again)."""
    location = str(barrier["location"]).rstrip("/")
    # the manifest takes the name a task's snapshot would (the cut: the barrier's micro-batch); its
    # pieces add ``.full`` or ``.delta``
    name = quote(snapshot_name(task, int(barrier["attempt"]), settings.run_id, batch_id), safe=":@=+,")
    manifest_uri = f"{location}/{name}"
    if storage.exists(manifest_uri):
        return manifest_uri, storage.read_bytes(manifest_uri), None
    savepoint = barrier.get("kind") == "SAVEPOINT"
    previous = None if savepoint else store.last_snapshot(batch_id - 1)
    changed = None
    if previous is not None and len(previous[1].pieces) < MAX_CHAIN:
        changed = store.changed_since(previous[0], batch_id)
    changes: Changes
    chain: tuple[Piece, ...]
    if changed is None or previous is None:
        kind, changes, chain = "full", {g: dict(keys) for g, keys in state.items()}, ()
    else:
        delta: Changes = {}
        for group, key in changed:
            delta.setdefault(group, {})[key] = state.get(group, {}).get(key)
        kind, changes, chain = "delta", delta, previous[1].pieces
    data = encode_piece(changes)
    piece_uri = f"{manifest_uri}.{kind}"
    storage.write_bytes(piece_uri, data)
    piece = Piece(piece_uri, len(data), hashlib.sha256(data).hexdigest(), kind, count_keys(changes))
    manifest = Manifest(task, max_parallelism, groups, batch_id, (*chain, piece), step)
    document = manifest.to_bytes()
    storage.write_bytes(manifest_uri, document)
    if not savepoint:
        store.snapshot_taken(batch_id, manifest)
    return manifest_uri, document, piece


def _task_settings(settings: KeyedSettings) -> Any:
    from spark_tasks.tasks import TaskSettings

    return TaskSettings(
        job_id=settings.job_id,
        bootstrap=settings.bootstrap,
        state_dir="",
        topic_prefix=settings.topic_prefix,
        producer_extra=settings.producer_extra,
        wire=settings.wire,
    )


def _send(settings: KeyedSettings, answered: Answer) -> None:
    """Hand the ack or decline to the producer; the task awaits it before it ends (:func:`_await`)."""
    from spark_tasks.tasks import send_reply

    send_reply(_task_settings(settings), answered, wait=False)


def _await(settings: KeyedSettings) -> None:
    from spark_tasks.tasks import await_replies

    await_replies(_task_settings(settings))
