"""A checkpoint barrier as the ``cutline-kafka`` source carries it in-band: the *barrier entry*
(docs/spark.md, "Barrier alignment").

The source folds a barrier into a micro-batch's end offset, as a JSON object under
``__cutline_barrier__``, and writes it on every barrier row of the batch, in the ``cutline_barrier``
column; the tasks that meet the row answer the barrier it holds. This module is its one codec:

- :func:`barrier_entry` and :func:`entry_barrier` are inverses: every field of the
  :class:`~events.wire.records.CheckpointBarrier` but its job id (the reader knows its job), and the
  coordinator epoch that sent it, survive the round trip;
- :func:`barrier_json` is the entry's one text (keys sorted, no spaces): Spark compares offsets by
  their JSON text, so equal entries must give equal text; :func:`parse_barrier_json` reads it back.

Keys: ``attempt``, ``epoch``, ``id``, ``kind``, ``location`` and ``timestamp_ms``; then, only when
set, so that every other barrier's offset JSON stays as it always was, ``stop`` and ``drain`` (both,
when either is set) and ``inline_limit_bytes``. An entry without ``kind``, ``timestamp_ms`` or
``epoch`` reads as a checkpoint, at time 0, from epoch 0. Pure: the stdlib and the records only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from events.wire.records import CheckpointBarrier, CheckpointKind

__all__ = ["barrier_entry", "barrier_json", "entry_barrier", "entry_key", "parse_barrier_json"]


def barrier_entry(barrier: CheckpointBarrier, epoch: int = 0) -> dict[str, Any]:
    """``barrier`` as a batch's end offset holds it; ``epoch`` is the coordinator epoch that sent it
    (the tasks name it on their answers, docs/design.md, "Ownership and fencing")."""
    entry: dict[str, Any] = {
        "attempt": barrier.attempt,
        "epoch": epoch,
        "id": barrier.checkpoint_id,
        "kind": CheckpointKind(barrier.kind).value,
        "location": barrier.location,
        "timestamp_ms": barrier.timestamp_ms,
    }
    if barrier.stop or barrier.drain:
        entry.update(stop=barrier.stop, drain=barrier.drain)
    if barrier.inline_limit_bytes:
        entry["inline_limit_bytes"] = barrier.inline_limit_bytes
    return entry


def entry_barrier(job_id: str, entry: Mapping[str, Any]) -> CheckpointBarrier:
    """The barrier of job ``job_id`` that ``entry`` holds: the inverse of :func:`barrier_entry` (the
    epoch stays in ``entry["epoch"]``). Raises ``ValueError`` naming the key of a malformed entry."""
    kind = entry.get("kind", CheckpointKind.CHECKPOINT.value)
    if kind not in [k.value for k in CheckpointKind]:
        raise ValueError(f"barrier entry's 'kind' must be CHECKPOINT or SAVEPOINT, got {kind!r}")
    location = entry.get("location")
    if not isinstance(location, str):
        raise ValueError(f"barrier entry's 'location' must be a string, got {location!r}")
    return CheckpointBarrier(
        job_id=job_id,
        checkpoint_id=_whole(entry, "id"),
        attempt=_whole(entry, "attempt"),
        kind=CheckpointKind(kind),
        timestamp_ms=_whole(entry, "timestamp_ms", 0),
        location=location,
        inline_limit_bytes=_whole(entry, "inline_limit_bytes", 0),
        stop=_flag(entry, "stop"),
        drain=_flag(entry, "drain"),
    )


def entry_key(entry: Mapping[str, Any]) -> tuple[int, int, int]:
    """An entry's identity, ``(id, attempt, epoch)``: a newer coordinator epoch may send an id again."""
    return _whole(entry, "id"), _whole(entry, "attempt"), _whole(entry, "epoch", 0)


def barrier_json(entry: Mapping[str, Any]) -> str:
    """The ``cutline_barrier`` column's text: the entry as compact JSON, keys sorted."""
    return json.dumps(dict(entry), sort_keys=True, separators=(",", ":"))


def parse_barrier_json(text: str) -> dict[str, Any]:
    """The entry a ``cutline_barrier`` cell holds (the inverse of :func:`barrier_json`)."""
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"a cutline_barrier cell must hold a barrier entry's JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"a cutline_barrier cell must hold a JSON object, got {text!r}")
    return parsed


def _whole(entry: Mapping[str, Any], key: str, default: int | None = None) -> int:
    if key not in entry and default is None:
        raise ValueError(f"barrier entry has no {key!r}: {dict(entry)!r}")
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"barrier entry's {key!r} must be a non-negative integer, got {value!r}")
    return value


def _flag(entry: Mapping[str, Any], key: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"barrier entry's {key!r} must be true or false, got {value!r}")
    return value
