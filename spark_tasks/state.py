"""Per-partition state of a checkpointed Spark job: the user's step and where its state lives.

A :class:`StatefulStep` is what a job does with each Kafka partition: a function
from the partition's state and its next records to the new state and output rows
(DESIGN §5, "the stateful step"). Between micro-batches the state lives in a
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

from events.participant import write_atomic

__all__ = [
    "KafkaRecord",
    "PartitionStateStore",
    "StatefulStep",
    "task_id",
]

S = TypeVar("S")

VERSIONS_KEPT = 8
"""Versions kept per partition: a re-run only ever needs the newest two."""

_VERSION = re.compile(r"^(\d{20})\.state$")


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


class PartitionStateStore:
    """Versions of each partition's serialized state, as files under ``root``.

    ``root/<topic>-<partition>/<offset:020d>.state`` holds the state after every
    record below ``offset``. Files are written atomically, so a reader sees a whole
    version or none; the newest :data:`VERSIONS_KEPT` per partition are kept. For a
    Spark cluster ``root`` must be on storage every executor sees, as Spark's
    checkpoint location must.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def _dir(self, topic: str, partition: int) -> Path:
        return self.root / f"{quote(topic, safe='')}-{partition}"

    def versions(self, topic: str, partition: int) -> list[int]:
        """The offsets of the stored versions of one partition, ascending."""
        try:
            names = os.listdir(self._dir(topic, partition))
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_VERSION.match, names) if m)

    def load(self, topic: str, partition: int, offset: int) -> tuple[int, bytes] | None:
        """The newest version at or below ``offset``: ``(its offset, its bytes)``, or None."""
        candidates = [v for v in self.versions(topic, partition) if v <= offset]
        if not candidates:
            return None
        version = candidates[-1]
        return version, (self._dir(topic, partition) / f"{version:020d}.state").read_bytes()

    def save(self, topic: str, partition: int, offset: int, data: bytes) -> None:
        """Store the state after every record below ``offset``; drop old versions."""
        if offset < 0:
            raise ValueError(f"a state version needs a non-negative offset, got {offset}")
        directory = self._dir(topic, partition)
        write_atomic(directory / f"{offset:020d}.state", data)
        for old in self.versions(topic, partition)[:-VERSIONS_KEPT]:
            (directory / f"{old:020d}.state").unlink(missing_ok=True)
