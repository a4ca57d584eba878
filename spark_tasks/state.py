"""Per-partition state of a checkpointed Spark job: the user's step and where its state lives.

A :class:`StatefulStep` is what a job does with each Kafka partition: a function
from the partition's state and its next records to the new state and output rows
(docs/design.md, "Tasks and Spark": the stateful step). Between micro-batches the state lives in a
:class:`PartitionStateStore`: one file per version, a version being the
serialized state after every record below an offset. The executor task that
reads a partition loads the version its first row needs, folds the batch's
records, and saves the version at the batch's end; a checkpoint barrier (the
first row of its batch) makes it copy the version at the cut into the
checkpoint's location and acknowledge it.

Spark's own state store (``applyInPandasWithState``/``transformWithState``) keys
versions by batch id and needs a shuffle by key; it also cannot be seeded with
state restored from a cutline checkpoint or savepoint of another job. This store
is keyed by Kafka offset instead, so a task needs nothing but the rows it reads,
a re-run of a batch (same records, same start) loads the same version, and a
restore only has to write one version per partition.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar
from urllib.parse import quote

from events.task.participant import write_atomic

__all__ = [
    "KafkaRecord",
    "PartitionStateStore",
    "StateLost",
    "StatefulStep",
    "task_id",
]

S = TypeVar("S")

VERSIONS_KEPT = 8
"""Versions kept per partition: a re-run only ever needs the newest two."""

_VERSION = re.compile(r"^(\d{20})\.(state|lost)$")


class KafkaRecord(NamedTuple):
    """One record of a partition, as the step sees it (the source's columns)."""

    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp: datetime | None


def task_id(topic: str, partition: int) -> str:
    """The checkpoint task of one input partition: ``<topic>-<partition>``, as Kafka names partitions."""
    return f"{topic}-{partition}"


def _json_dumps(state: Any) -> bytes:
    return json.dumps(state, sort_keys=True, separators=(",", ":")).encode()


def _json_loads(data: bytes) -> Any:
    return json.loads(data)


@dataclass(frozen=True)
class StatefulStep(Generic[S]):
    """What a job does with one Kafka partition: ``update(state, records) -> (state, rows)``.

    ``update`` gets consecutive records of one partition in offset order (one or
    more calls per micro-batch) and returns the new state and the output rows
    (tuples or dicts matching ``output_schema``, a Spark DDL string such as
    ``"word string, count long"``). It must be deterministic: a re-run of a batch
    and a restore replay the same records and must give the same state and rows.
    ``serialize``/``deserialize`` turn the state into the bytes of a snapshot and
    back; the default is JSON, so the state must then be JSON-shaped (dict keys
    are strings). ``initial()`` is the state of a partition nothing was restored for.
    """

    update: Callable[[S, Sequence[KafkaRecord]], tuple[S, Iterable[Any]]]
    output_schema: str
    initial: Callable[[], S]
    serialize: Callable[[S], bytes] = _json_dumps
    deserialize: Callable[[bytes], S] = _json_loads


class StateLost(LookupError):
    """A partition's state was found missing by an earlier task: nothing after it may be trusted."""


class PartitionStateStore:
    """Versions of each partition's serialized state, as files under ``root``.

    ``root/<topic>-<partition>/<offset:020d>.state`` holds the state after every
    record below ``offset``. Files are written atomically, so a reader sees a whole
    version or none; the newest :data:`VERSIONS_KEPT` per partition are kept. For a
    Spark cluster ``root`` must be on storage every executor sees, as Spark's
    checkpoint location must.

    ``<offset:020d>.lost`` is a tombstone: a task found no state where it needed
    one, skipped the partition's records up to ``offset``, and recorded why. A
    load at or above it raises :class:`StateLost` until a restore writes a new
    attempt's store, so a task never folds records onto a version that misses some.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def _dir(self, topic: str, partition: int) -> Path:
        return self.root / f"{quote(topic, safe='')}-{partition}"

    def _entries(self, topic: str, partition: int) -> list[tuple[int, str]]:
        """``(offset, suffix)`` of every version and tombstone, ascending (a tombstone after a version)."""
        try:
            names = os.listdir(self._dir(topic, partition))
        except FileNotFoundError:
            return []
        found = (_VERSION.match(name) for name in names)
        entries = [(int(m.group(1)), m.group(2)) for m in found if m]
        return sorted(entries, key=lambda entry: (entry[0], entry[1] == "lost"))

    def versions(self, topic: str, partition: int) -> list[int]:
        """The offsets of the stored versions of one partition, ascending."""
        return [offset for offset, suffix in self._entries(topic, partition) if suffix == "state"]

    def load(self, topic: str, partition: int, offset: int) -> tuple[int, bytes] | None:
        """The newest version at or below ``offset``: ``(its offset, its bytes)``, or None.

        Raises :class:`StateLost` if a tombstone is newer than that version.
        """
        candidates = [e for e in self._entries(topic, partition) if e[0] <= offset]
        if not candidates:
            return None
        version, suffix = candidates[-1]
        path = self._dir(topic, partition) / f"{version:020d}.{suffix}"
        data = path.read_bytes()
        if suffix == "lost":
            raise StateLost(data.decode("utf-8", "replace"))
        return version, data

    def save(self, topic: str, partition: int, offset: int, data: bytes) -> None:
        """Store the state after every record below ``offset``; drop old versions."""
        self._write(topic, partition, offset, "state", data)

    def lost(self, topic: str, partition: int, offset: int, reason: str) -> None:
        """Record that the partition's state is missing for the records below ``offset`` (a tombstone)."""
        self._write(topic, partition, offset, "lost", reason.encode())

    def _write(self, topic: str, partition: int, offset: int, suffix: str, data: bytes) -> None:
        if offset < 0:
            raise ValueError(f"a state version needs a non-negative offset, got {offset}")
        directory = self._dir(topic, partition)
        write_atomic(directory / f"{offset:020d}.{suffix}", data)
        for old, kind in self._entries(topic, partition)[:-VERSIONS_KEPT]:
            (directory / f"{old:020d}.{kind}").unlink(missing_ok=True)
