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

**Key groups.** A key belongs to key group ``murmur3_32(utf-8 key) mod max_parallelism`` (Flink's
max parallelism, default 128), and shuffle partition ``i`` of ``P`` owns the contiguous range
:func:`key_group_range` (Flink's ``KeyGroupRangeAssignment``). State is stored and snapshotted
per key group, so a snapshot taken with ``P`` partitions restores into ``P'``: each new partition
reads the key groups it owns from whichever old snapshots hold them.

**The plan.** ``source → mapInArrow(route) → repartitionById(P, cutline_target) →
mapInArrow(process)``. The map side is stateless: it applies ``key_by`` and sends each pair to its
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

import hashlib
import io
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
import pyarrow as pa

from events.clock import now_ms
from events.task import storage
from events.task.manifest import Manifest, Piece, StepIdentity, callable_name, is_keyed_task
from events.task.participant import (
    SnapshotCorrupted,
    load_task_snapshot,
)
from events.task.reply import Answer, Failed, Outcome, Snapshotted, answer, failure
from events.wire.codec import WireSettings, process_wire
from events.wire.records import StateHandle
from events.wire.topics import Topics
from events.wire.validation import is_within
from events.wire.vocabulary import DeclineReason
from spark_tasks.kafka_source import BARRIER_COLUMN, MARKER_COLUMN, entry_barrier
from spark_tasks.latency import KEYED, ROUTE, Measurements
from spark_tasks.state import KafkaRecord, StateLost, _json_dumps, _json_loads
from spark_tasks.tasks import snapshot_name

__all__ = [
    "FULL_EVERY",
    "MAX_CHAIN",
    "MAX_PARALLELISM",
    "KeyedSettings",
    "KeyedStateStore",
    "KeyedStep",
    "Manifest",
    "Piece",
    "key_group",
    "key_group_range",
    "keyed_task_id",
    "operator_index",
    "process_step",
    "read_key_groups",
    "read_keyed_state",
    "read_manifest",
    "read_manifests",
    "route_step",
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
(key null)."""

PIECE_SCHEMA = pa.schema([("key_group", pa.int32()), ("key", pa.string()), ("state", pa.binary())])

KeyedState = dict[int, dict[str, bytes]]
"""One partition's state: key group → key → the serialized state of the key."""
Changes = dict[int, dict[str, bytes | None]]
"""What changed: key group → key → the new serialized state, or None (deleted)."""


# ------------------------------------------------------------------ key groups


def key_group(key: str, max_parallelism: int = MAX_PARALLELISM) -> int:
    """The key group of ``key``: murmur3 (32 bit, seed 0) of its UTF-8 bytes, mod ``max_parallelism``."""
    return int(mmh3.hash(key.encode("utf-8"), 0, signed=False)) % max_parallelism


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

    @property
    def identity(self) -> StepIdentity:
        """What a snapshot records of this step: its uid and its key function's qualified name."""
        return StepIdentity(self.uid, callable_name(self.key_by))


# ---------------------------------------------------------- pieces and manifests


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


def decode_piece(data: bytes, wanted: range | None = None, where: str = "a piece") -> Changes:
    """The changes in a piece (only the key groups in ``wanted``, when given); bytes that are not a
    piece raise :class:`SnapshotCorrupted` (a restore then tries an older checkpoint)."""
    try:
        table = pa.ipc.open_stream(data).read_all()
        if not table.schema.equals(PIECE_SCHEMA):
            raise ValueError(f"columns {table.schema.names}, not {PIECE_SCHEMA.names}")
    except (pa.ArrowException, ValueError) as exc:
        raise SnapshotCorrupted(f"{where} is not an Arrow stream of keyed state: {exc}") from exc
    changes: Changes = {}
    columns = table.to_pydict()
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


def count_keys(changes: Mapping[int, Mapping[str, Any]]) -> int:
    return sum(len(entries) for entries in changes.values())


def _read_piece(piece: Piece, root: str) -> bytes:
    """A piece's bytes, checked against its size and sha256; it must lie below ``root``, as the one
    URI parser of cutline reads both (:func:`events.wire.validation.is_within`: an encoded ``..`` is no
    way out)."""
    if not is_within(piece.uri, root):
        raise SnapshotCorrupted(f"piece {piece.uri} is outside {root}: a manifest may only name pieces there")
    data = storage.read_bytes(piece.uri)
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
            apply_changes(state, decode_piece(_read_piece(piece, root), wanted, piece.uri))
            read += 1
    return state, read


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
    """The job's input partitions: a barrier must arrive from every one of them."""
    topic_prefix: str = Topics().prefix
    producer_extra: Mapping[str, Any] = field(default_factory=dict)
    run_id: str = ""
    attempt: int = 0
    wire: WireSettings = field(default_factory=process_wire)
    """The framing of the replies: the driver's."""

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)


# ------------------------------------------------------------------- map side


def route_step(
    step: KeyedStep[Any], parallelism: int, settings: KeyedSettings | None = None
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function before the shuffle: pairs to their key group's partition, barrier
    and latency marker rows to every partition (markers are measured here first, with ``settings``)."""
    schema = pa.schema(
        [
            (TARGET_COLUMN, pa.int32()),
            ("key_group", pa.int32()),
            ("key", pa.string()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("seq", pa.int32()),
            (BARRIER_COLUMN, pa.string()),
            (MARKER_COLUMN, pa.string()),
        ]
    )
    max_parallelism = step.max_parallelism

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        job_id, attempt = ("", 0) if settings is None else (settings.job_id, settings.attempt)
        latency = Measurements(job_id, attempt, ROUTE)
        for rows in batches:
            batch, markers = latency.take_markers(rows)
            out: dict[str, list[Any]] = {name: [] for name in schema.names}
            for m in markers:
                for target in range(parallelism):
                    _append(out, target, -1, None, None, m["topic"], m["partition"], m["offset"], 0, None,
                            m[MARKER_COLUMN])  # fmt: skip
            columns = batch.to_pydict()
            barriers = columns.get(BARRIER_COLUMN) or [None] * batch.num_rows
            for i in range(batch.num_rows):
                topic, partition, offset = columns["topic"][i], columns["partition"][i], columns["offset"][i]
                if barriers[i] is not None:
                    for target in range(parallelism):
                        _append(out, target, -1, None, None, topic, partition, offset, 0, barriers[i], None)
                    continue
                record = KafkaRecord(
                    columns["key"][i], columns["value"][i], topic, partition, offset, columns["timestamp"][i]
                )
                for seq, (key, value) in enumerate(step.key_by(record)):
                    group = key_group(key, max_parallelism)
                    target = operator_index(group, parallelism, max_parallelism)
                    _append(
                        out,
                        target,
                        group,
                        key,
                        pickle.dumps(value),
                        topic,
                        partition,
                        offset,
                        seq,
                        None,
                        None,
                    )
            if out[TARGET_COLUMN]:
                yield pa.RecordBatch.from_pydict(out, schema=schema)
        if settings is not None:
            latency.send(_task_settings(settings))

    return run


def _append(out: dict[str, list[Any]], *values: Any) -> None:
    for column, value in zip(out.values(), values, strict=True):
        column.append(value)


# ---------------------------------------------------------------- shuffle side


def _batch_id() -> tuple[int, int]:
    """(micro-batch id, shuffle partition) of the running task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    if context is None or batch is None:
        raise RuntimeError("keyed state runs only inside a streaming query's micro-batch")
    return int(batch), context.partitionId()


def process_step(
    step: KeyedStep[Any], settings: KeyedSettings, output: pa.Schema
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function after the shuffle: one task per shuffle partition and batch.

    Loads the partition's state before the batch; on the barrier (from every input partition)
    snapshots it into the checkpoint's location and acks; folds the batch's values key by key
    (in input order) through ``update``; saves the changes as the next version.
    """

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batch_id, index = _batch_id()
        groups = key_group_range(index, settings.parallelism, step.max_parallelism)
        store = KeyedStateStore(settings.state_root, index)
        latency = Measurements(settings.job_id, settings.attempt, KEYED, index)
        barriers, pairs = _take_rows(batches, latency)
        latency.send(_task_settings(settings))
        task = keyed_task_id(index)
        state, missing = _load_state(store, index, batch_id)
        if barriers:
            outcome = _on_barriers(step, settings, store, index, groups, batch_id, barriers, state, missing)
            entry = json.loads(next(iter(barriers.values()))[0])
            checkpoint = entry_barrier(settings.job_id, entry)
            _send(settings, answer(checkpoint, entry.get("epoch"), task, outcome, now_ms()))
        if state is None:
            if missing is not None:
                log.error("task %s skips batch %d: %s", task, batch_id, missing)
                store.lost(batch_id + 1, missing)
            if barriers:
                _await(settings)
            return
        changes, rows = _fold_pairs(step, state, pairs, groups, index)
        apply_changes(state, changes)
        store.save(batch_id + 1, state, changes)
        if barriers:
            _await(settings)  # the ack's round trip overlapped the fold; the task ends once it is out
        if rows:
            yield pa.RecordBatch.from_pylist(
                [
                    row if isinstance(row, Mapping) else dict(zip(output.names, row, strict=True))
                    for row in rows
                ],
                schema=output,
            )

    return run


_Pair = tuple[str, int, int, int, int, str, bytes]
"""A shuffled pair: topic, partition, offset, seq, key group, key, pickled value."""


def _take_rows(
    batches: Iterable[pa.RecordBatch], latency: Measurements
) -> tuple[dict[tuple[str, int], tuple[str, int]], list[_Pair]]:
    """The barriers (by input partition: the barrier and its offset) and the pairs of a shuffle
    task's batches; latency markers are measured and dropped, never folded."""
    barriers: dict[tuple[str, int], tuple[str, int]] = {}
    pairs: list[_Pair] = []
    for arrived in batches:
        batch, _ = latency.take_markers(arrived)
        columns = batch.to_pydict()
        for i in range(batch.num_rows):
            topic, partition, offset = columns["topic"][i], columns["partition"][i], columns["offset"][i]
            barrier = columns[BARRIER_COLUMN][i]
            if barrier is not None:
                barriers[(topic, partition)] = (barrier, offset)
                continue
            pairs.append(
                (topic, partition, offset, columns["seq"][i], columns["key_group"][i], columns["key"][i],
                 columns["value"][i])
            )  # fmt: skip
    return barriers, pairs


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


def _fold_pairs(
    step: KeyedStep[Any], state: KeyedState, pairs: list[_Pair], groups: range, index: int
) -> tuple[Changes, list[Any]]:
    """Fold the pairs key by key through ``update``: the changed keys' new encodings and the output
    rows. Deterministic order: a re-run, and a run after a restore, fold the same values alike."""
    pairs.sort(key=lambda p: (p[0], p[1], p[2], p[3]))
    by_key: dict[tuple[int, str], list[Any]] = {}
    for _, _, _, _, group, key, value in pairs:
        by_key.setdefault((group, key), []).append(pickle.loads(value))
    changes: Changes = {}
    rows: list[Any] = []
    for (group, key), values in sorted(by_key.items()):
        if group not in groups:
            raise RuntimeError(
                f"key {key!r} (key group {group}) reached partition {index}, which owns {groups}"
            )
        old = state.get(group, {}).get(key)
        new, out = step.update(key, None if old is None else step.deserialize(old), values)
        encoded = None if new is None else step.serialize(new)
        if encoded != old:
            changes.setdefault(group, {})[key] = encoded
        rows.extend(out)
    return changes, rows


def _on_barriers(
    step: KeyedStep[Any],
    settings: KeyedSettings,
    store: KeyedStateStore,
    index: int,
    groups: range,
    batch_id: int,
    barriers: Mapping[tuple[str, int], tuple[str, int]],
    state: KeyedState | None,
    missing: str | None,
) -> Outcome:
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
    # Only partition 0 records the cut's source offsets: once per checkpoint, as Flink's sources do.
    offsets = {f"{t}:{p}": cut for (t, p), (_, cut) in sorted(barriers.items())} if index == 0 else {}
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
