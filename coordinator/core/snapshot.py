"""Snapshots of the coordinator's folded state, one per journal partition
(docs/design.md, "Ownership and fencing").

A worker periodically writes, for each journal partition it owns, what folding that
partition gave: the job states, their checkpoint statistics, the input positions the
journal reflects and the epochs of pending triggers, with the last journal offset they
cover and the writer's claim epoch. Recovery is then the latest valid snapshot plus the
journal after ``journal_offset``, so it no longer grows with the journal's history.

This module is the pure part: :func:`encode_snapshot` and :func:`decode_snapshot`, bytes
in and bytes out. A snapshot is framed like every cutline record (single-object Avro,
:mod:`events.wire.codec`) with the schema ``schemas/cutline.CoordinatorSnapshot.avsc``, whose
states hold the journal's own record types. Decoding gives back states and statistics
equal to the written ones, field types included, so folding the journal tail from a
decoded snapshot gives what folding the whole journal gives.

Old snapshot schemas live in ``schemas/history/cutline.CoordinatorSnapshot.<fp>.avsc``;
a snapshot written with one of them decodes into the current classes (Avro resolution),
so a new worker recovers from an older worker's snapshot.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, cast

from fastavro.schema import load_schema, parse_schema

from coordinator.core.state import FrozenMap, JobState, PendingCheckpoint, Scheduler, frozen_map
from coordinator.core.stats import CheckpointEntry, CheckpointStats
from events.wire.codec import (
    HEADER_SIZE,
    SCHEMAS_DIR,
    DecodeError,
    UnknownFingerprint,
    avro_decoder,
    default_codec,
    read_frame,
    to_avro,
    write_frame,
)
from events.wire.records import (
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointRequestQueued,
    CheckpointRestored,
    CheckpointTriggered,
    ExecutionState,
    JobRestartScheduled,
    JobStatus,
    TaskAcknowledged,
)
from events.wire.writer_schema import NAMESPACE, WriterSchema, schema_fingerprint

__all__ = [
    "SCHEMA_NAME",
    "PartitionSnapshot",
    "SnapshotError",
    "decode_snapshot",
    "encode_snapshot",
    "snapshot_schema",
    "trigger_key",
]

SCHEMA_NAME = "CoordinatorSnapshot"
"""The Avro record of a snapshot: ``schemas/cutline.CoordinatorSnapshot.avsc``."""

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    """The coordinator's folded state of journal ``partition`` up to ``journal_offset``.

    ``epoch`` is the writer's claim epoch; ``journal_offset`` is the last journal offset
    the state covers (-1: none). ``positions`` maps an input ``topic:partition`` to the
    highest input offset the journal reflects; ``trigger_epochs`` maps
    :func:`trigger_key` of a pending checkpoint to the epoch its trigger was journaled
    under. ``states`` and ``stats`` are keyed by job id.
    """

    partition: int
    epoch: int
    journal_offset: int
    positions: Mapping[str, int]
    trigger_epochs: Mapping[str, int]
    states: Mapping[str, JobState]
    stats: Mapping[str, CheckpointStats]
    timestamp_ms: int


class SnapshotError(DecodeError):
    """Bytes that are not a coordinator snapshot this version can read.

    ``reason`` is the codec's code for a bad frame (``TRUNCATED_FRAME``, ``BAD_MAGIC``,
    ``UNKNOWN_SCHEMA``, ``BODY_MISMATCH``), else ``BAD_SNAPSHOT``. Recovery treats the
    snapshot as absent and folds the journal from further back.
    """

    reason = "BAD_SNAPSHOT"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


def trigger_key(job_id: str, checkpoint_id: int) -> str:
    """The key of a pending checkpoint in ``trigger_epochs``: job id, NUL, checkpoint id."""
    return f"{job_id}\x00{checkpoint_id}"


# ------------------------------------------------------------------- schemas


def snapshot_schema(schemas_dir: Path = SCHEMAS_DIR) -> dict[str, Any]:
    """The current snapshot schema, self-contained (every named type inlined)."""
    path = schemas_dir / f"{NAMESPACE}.{SCHEMA_NAME}.avsc"
    return cast(dict[str, Any], load_schema(str(path), _write_hint=False))


class _Schemas:
    """The current snapshot schema and every older one kept in ``schemas/history/``."""

    def __init__(self, schemas_dir: Path = SCHEMAS_DIR) -> None:
        parsed = snapshot_schema(schemas_dir)
        self.current = WriterSchema(SCHEMA_NAME, schema_fingerprint(parsed), parsed)
        self.by_fingerprint = {self.current.fingerprint: self.current}
        for path in sorted((schemas_dir / "history").glob(f"{NAMESPACE}.{SCHEMA_NAME}.*.avsc")):
            old = cast(dict[str, Any], parse_schema(json.loads(path.read_text()), _write_hint=False))
            writer = WriterSchema(SCHEMA_NAME, schema_fingerprint(old), old)
            self.by_fingerprint.setdefault(writer.fingerprint, writer)

    def writer(self, fingerprint: bytes) -> WriterSchema | None:
        return self.by_fingerprint.get(fingerprint)

    def reader(self, name: str) -> WriterSchema:
        return self.current


@cache
def _schemas() -> _Schemas:
    return _Schemas()


# ------------------------------------------------------------------ encoding


def encode_snapshot(snapshot: PartitionSnapshot) -> bytes:
    """The snapshot as a single-object Avro frame.

    Raises ``ValueError`` for a state that folding cannot give, and that would not come
    back equal: a pending checkpoint or an ack kept under a key other than its own id.
    """
    datum = {
        "partition": snapshot.partition,
        "epoch": snapshot.epoch,
        "journal_offset": snapshot.journal_offset,
        "positions": snapshot.positions,
        "trigger_epochs": snapshot.trigger_epochs,
        "states": {job_id: _state_datum(state) for job_id, state in snapshot.states.items()},
        "stats": {job_id: _stats_datum(stats) for job_id, stats in snapshot.stats.items()},
        "timestamp_ms": snapshot.timestamp_ms,
    }
    return write_frame(_schemas().current, datum)


def _optional(value: Any) -> dict[str, Any] | None:
    return None if value is None else to_avro(value)


def _state_datum(state: JobState) -> dict[str, Any]:
    return {
        "job_id": state.job_id,
        "status": state.status,
        "attempt": state.attempt,
        "tasks": state.tasks,
        "config": _optional(state.config),
        "tasks_not_running": state.tasks_not_running,
        "scheduler": _optional(state.scheduler),
        "next_checkpoint_id": state.next_checkpoint_id,
        "pending": [_pending_datum(state.job_id, key, p) for key, p in state.pending.items()],
        "queue": [to_avro(q) for q in state.queue],
        "completed": [to_avro(c) for c in state.completed],
        "latest_savepoint": _optional(state.latest_savepoint),
        "last_completion_ms": state.last_completion_ms,
        "last_completed_id": state.last_completed_id,
        "failures": state.failures,
        "restored": _optional(state.restored),
        "heartbeat_deadline_ms": state.heartbeat_deadline_ms,
        "restarts": state.restarts,
        "backoff_ms": state.backoff_ms,
        "last_failure_ms": state.last_failure_ms,
        "failure_times": state.failure_times,
        "restart": _optional(state.restart),
        "stop": _optional(state.stop),
    }


def _pending_datum(job_id: str, key: int, pending: PendingCheckpoint) -> dict[str, Any]:
    # The keys are not written: folding keys a checkpoint by its id and an ack by its task.
    if key != pending.checkpoint_id:
        raise ValueError(f"{job_id}: pending checkpoint {pending.checkpoint_id} is kept under key {key!r}")
    acks = []
    for task_id, ack in pending.acks.items():
        if task_id != ack.task_id:
            raise ValueError(f"{job_id}: the ack of {ack.task_id!r} is kept under key {task_id!r}")
        acks.append(to_avro(ack))
    return {"triggered": to_avro(pending.triggered), "acks": acks}


def _stats_datum(stats: CheckpointStats) -> dict[str, Any]:
    return {
        "total": stats.total,
        "in_progress": stats.in_progress,
        "completed": stats.completed,
        "failed": stats.failed,
        "restored": stats.restored,
        "durations": stats.durations,
        "sizes": stats.sizes,
        "latest_completed": _optional(stats.latest_completed),
        "latest_savepoint": _optional(stats.latest_savepoint),
        "latest_failed": _optional(stats.latest_failed),
        "latest_restored": _optional(stats.latest_restored),
        "history": [to_avro(e) for e in stats.history],
    }


# ------------------------------------------------------------------ decoding

_config = avro_decoder(CheckpointConfig)
_scheduler = avro_decoder(Scheduler)
_triggered = avro_decoder(CheckpointTriggered)
_acknowledged = avro_decoder(TaskAcknowledged)
_queued = avro_decoder(CheckpointRequestQueued)
_completed = avro_decoder(CheckpointCompleted)
_restored = avro_decoder(CheckpointRestored)
_restart = avro_decoder(JobRestartScheduled)
_entry = avro_decoder(CheckpointEntry)


def _mapping(items: Iterable[tuple[K, V]]) -> FrozenMap[K, V]:
    """Every mapping of a decoded state is built here, as the fold builds it (persistent maps)."""
    return frozen_map(items)


def decode_snapshot(frame: bytes) -> PartitionSnapshot:
    """The snapshot in ``frame``; raises :class:`SnapshotError` when it holds none."""
    schemas = _schemas()
    try:
        _, datum = read_frame(frame, schemas.writer, schemas.reader)
    except UnknownFingerprint as exc:
        other = default_codec().registry.writer(bytes(frame[2:HEADER_SIZE]))
        if other is not None:
            raise SnapshotError(
                f"not a coordinator snapshot: the frame holds a {NAMESPACE}.{other.name}", exc.reason
            ) from exc
        raise SnapshotError(f"not a coordinator snapshot this version knows: {exc}", exc.reason) from exc
    except DecodeError as exc:
        raise SnapshotError(f"not a coordinator snapshot: {exc}", exc.reason) from exc
    try:
        return _snapshot(datum)
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"the snapshot does not make valid states: {exc!r}") from exc


def _snapshot(d: Mapping[str, Any]) -> PartitionSnapshot:
    return PartitionSnapshot(
        partition=d["partition"],
        epoch=d["epoch"],
        journal_offset=d["journal_offset"],
        positions=dict(d["positions"]),
        trigger_epochs=dict(d["trigger_epochs"]),
        states={job_id: _state(state) for job_id, state in d["states"].items()},
        stats={job_id: _stats(stats) for job_id, stats in d["stats"].items()},
        timestamp_ms=d["timestamp_ms"],
    )


def _state(d: dict[str, Any]) -> JobState:
    status, config, scheduler = d["status"], d["config"], d["scheduler"]
    tasks = tuple(d["tasks"])
    task_ids = frozenset(tasks)
    savepoint, restored = d["latest_savepoint"], d["restored"]
    return JobState(
        job_id=d["job_id"],
        status=None if status is None else JobStatus(status),
        attempt=d["attempt"],
        tasks=tasks,
        task_ids=task_ids,
        config=None if config is None else _config(config),
        tasks_not_running=_mapping((t, ExecutionState(s)) for t, s in d["tasks_not_running"].items()),
        scheduler=None if scheduler is None else _scheduler(scheduler),
        next_checkpoint_id=d["next_checkpoint_id"],
        pending=_mapping((p.checkpoint_id, p) for p in (_pending(x, tasks, task_ids) for x in d["pending"])),
        queue=tuple(map(_queued, d["queue"])),
        completed=tuple(map(_completed, d["completed"])),
        latest_savepoint=None if savepoint is None else _completed(savepoint),
        last_completion_ms=d["last_completion_ms"],
        last_completed_id=d["last_completed_id"],
        failures=d["failures"],
        restored=None if restored is None else _restored(restored),
        heartbeat_deadline_ms=d["heartbeat_deadline_ms"],
        restarts=d["restarts"],
        backoff_ms=d["backoff_ms"],
        last_failure_ms=d["last_failure_ms"],
        failure_times=tuple(d["failure_times"]),
        restart=None if d["restart"] is None else _restart(d["restart"]),
        stop=None if d["stop"] is None else _triggered(d["stop"]),
    )


def _pending(d: dict[str, Any], tasks: tuple[str, ...], task_ids: frozenset[str]) -> PendingCheckpoint:
    """A pending checkpoint; one of the job's own tasks shares the job's task set, as in a fold."""
    triggered = _triggered(d["triggered"])
    acks = _mapping((a.task_id, a) for a in map(_acknowledged, d["acks"]))
    same = triggered.tasks == tasks
    return PendingCheckpoint(triggered, acks, task_ids=task_ids if same else frozenset(triggered.tasks))


def _stats(d: Mapping[str, Any]) -> CheckpointStats:
    completed, savepoint, failed, restored = (
        d["latest_completed"],
        d["latest_savepoint"],
        d["latest_failed"],
        d["latest_restored"],
    )
    return CheckpointStats(
        total=d["total"],
        in_progress=d["in_progress"],
        completed=d["completed"],
        failed=d["failed"],
        restored=d["restored"],
        durations=tuple(d["durations"]),
        sizes=tuple(d["sizes"]),
        latest_completed=None if completed is None else _entry(completed),
        latest_savepoint=None if savepoint is None else _entry(savepoint),
        latest_failed=None if failed is None else _entry(failed),
        latest_restored=None if restored is None else _restored(restored),
        history=tuple(map(_entry, d["history"])),
    )
