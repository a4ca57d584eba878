"""The offsets of the ``cutline-kafka`` source: Spark offset JSON and the maps it stands for.

Offsets are ``{"topic": {"partition": next_offset}}``, the same JSON as Spark's built-in source
writes to ``offsets/N``: string keys only (Spark hands offsets back through ``json.loads``, so an
int key would come back as a string) and a fixed order, topics sorted, partitions in numeric order,
because Spark compares offsets by their JSON text. :func:`to_offsets` and :func:`from_offsets`
convert. A batch's end offset may also hold a folded barrier entry (:data:`BARRIER_KEY`,
:mod:`events.wire.barrier_entry`) and a latency marker's time (:data:`MARKER_KEY`). Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "BARRIER_KEY",
    "EARLIEST",
    "LATEST",
    "MARKER_KEY",
    "TopicPartitionKey",
    "barrier_of",
    "from_offsets",
    "marker_of",
    "partition_order",
    "rate_limit",
    "to_offsets",
]

EARLIEST = -2
"""``startingOffsets`` JSON value for "the earliest offset" (as in Spark)."""
LATEST = -1
"""``startingOffsets`` JSON value for "the end of the partition" (as in Spark)."""

BARRIER_KEY = "__cutline_barrier__"
"""Top-level key of an end offset that carries a folded checkpoint barrier
(docs/design.md, "Tasks and Spark")."""
MARKER_KEY = "__cutline_marker__"
"""Top-level key of an end offset that carries a latency marker: ``{"marked_ms": ...}``."""

TopicPartitionKey = tuple[str, int]
"""``(topic, partition)``: the key of every offset map of the source."""


def partition_order(tp: TopicPartitionKey) -> tuple[str, int]:
    """The sort key of offset maps: by topic, then partition number."""
    return tp[0], tp[1]


def to_offsets(
    mapping: Mapping[TopicPartitionKey, int],
    barrier: Mapping[str, Any] | None = None,
    marker_ms: int | None = None,
) -> dict[str, dict[str, Any]]:
    """``{(topic, partition): offset}`` as Spark offset JSON: ``{"topic": {"0": offset}}``.

    Keys are strings; topics are sorted and partitions are in numeric order, so equal
    maps always give equal JSON (Spark compares offsets by their JSON text). A folded
    ``barrier`` goes first, under :data:`BARRIER_KEY`, with its keys sorted; then a folded
    latency marker's time, under :data:`MARKER_KEY`.
    """
    out: dict[str, dict[str, Any]] = {}
    if barrier is not None:
        out[BARRIER_KEY] = {k: barrier[k] for k in sorted(barrier)}
    if marker_ms is not None:
        out[MARKER_KEY] = {"marked_ms": marker_ms}
    for topic, partition in sorted(mapping, key=partition_order):
        offset = mapping[(topic, partition)]
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise TypeError(f"offset of {topic}[{partition}] must be an int, got {offset!r}")
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise TypeError(f"partition of {topic} must be a non-negative int, got {partition!r}")
        out.setdefault(str(topic), {})[str(partition)] = offset
    return out


def from_offsets(offsets: Mapping[str, Any] | str) -> dict[TopicPartitionKey, int]:
    """Spark offset JSON (a dict as Spark passes it, or its text) as ``{(topic, partition): offset}``.

    Raises ``ValueError`` for anything but ``{"topic": {"<digits>": int}}``.
    """
    parsed: Any = json.loads(offsets) if isinstance(offsets, str) else offsets
    if not isinstance(parsed, Mapping):
        raise ValueError(f"offsets must be a JSON object of topics, got {parsed!r}")
    out: dict[TopicPartitionKey, int] = {}
    for topic, partitions in parsed.items():
        if topic in (BARRIER_KEY, MARKER_KEY):
            continue
        if not isinstance(topic, str) or not isinstance(partitions, Mapping):
            raise ValueError(f"offsets of topic {topic!r} must be an object, got {partitions!r}")
        for key, offset in partitions.items():
            if not isinstance(key, str) or not key.isdecimal():
                raise ValueError(f"partition key of {topic!r} must be a decimal string, got {key!r}")
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise ValueError(f"offset of {topic}[{key}] must be an int, got {offset!r}")
            out[(topic, int(key))] = offset
    return out


def barrier_of(offsets: Mapping[str, Any] | str | None) -> dict[str, Any] | None:
    """The barrier folded into Spark offset JSON, or None."""
    if offsets is None:
        return None
    parsed: Any = json.loads(offsets) if isinstance(offsets, str) else offsets
    barrier = parsed.get(BARRIER_KEY) if isinstance(parsed, Mapping) else None
    if barrier is None:
        return None
    if not isinstance(barrier, Mapping):
        raise ValueError(f"{BARRIER_KEY} must be an object, got {barrier!r}")
    return {k: barrier[k] for k in sorted(barrier)}


def marker_of(offsets: Mapping[str, Any] | str | None) -> int | None:
    """The time of the latency marker folded into Spark offset JSON, or None."""
    if offsets is None:
        return None
    parsed: Any = json.loads(offsets) if isinstance(offsets, str) else offsets
    marker = parsed.get(MARKER_KEY) if isinstance(parsed, Mapping) else None
    marked = marker.get("marked_ms") if isinstance(marker, Mapping) else None
    return marked if isinstance(marked, int) and not isinstance(marked, bool) else None


def rate_limit(
    limit: int,
    start: Mapping[TopicPartitionKey, int],
    end: Mapping[TopicPartitionKey, int],
) -> dict[TopicPartitionKey, int]:
    """``end`` capped so that about ``limit`` offsets are read in all, as Spark's Kafka source does.

    Each partition gets ``limit * backlog / total_backlog`` offsets, rounded down, but
    at least 1 when it has a backlog ("don't completely starve small partitions"), and
    never past its ``end``. Partitions missing from ``start`` are taken to start at 0,
    so the caller passes their earliest offsets in ``start``.
    """
    if limit <= 0:
        raise ValueError(f"maxOffsetsPerTrigger must be positive, got {limit}")
    sizes = {tp: e - start.get(tp, 0) for tp, e in end.items() if e - start.get(tp, 0) > 0}
    total = sum(sizes.values())
    if total < 1:
        return dict(end)
    capped: dict[TopicPartitionKey, int] = {}
    for tp, e in end.items():
        size = sizes.get(tp)
        if size is None:
            capped[tp] = e
            continue
        prorate = limit * (size / total)
        step = int(-(-prorate // 1)) if prorate < 1 else int(prorate)
        capped[tp] = min(e, start.get(tp, 0) + step)
    return capped
