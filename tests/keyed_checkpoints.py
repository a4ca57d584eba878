"""Keyed checkpoints on disk, written by the keyed tasks' own writer, for the tests that read state back.

:func:`two_keyed_checkpoints`: checkpoint 1 of ``{a: 1, b: 2, c: 3}`` (a full piece), then a batch
changes ``a`` to 10, deletes ``b`` and adds ``d: 4``: checkpoint 2 (a delta on it), each with its
``_metadata``.

:data:`UPPER_WORD_COUNT`: the keyed word count with another key function (upper-cased words), the
step a savepoint of the word count is re-keyed for.

:data:`TALLY_STEP`: a keyed step whose state is a declared struct (:data:`TALLY`), and
:data:`TALLIES`, states of it. :func:`per_partition_checkpoint`: a per-partition job's checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from events.task import storage
from events.task.manifest import StepIdentity
from events.task.participant import snapshot_uri
from events.wire.codec import encode
from events.wire.metadata import METADATA_FILE
from events.wire.records import CheckpointCompleted, CheckpointKind, StateHandle
from spark_tasks.keyed import (
    KeyedSettings,
    KeyedState,
    KeyedStateStore,
    KeyedStep,
    apply_changes,
    key_group,
    write_snapshot,
)
from spark_tasks.wordcount import KEYED_WORD_COUNT, words_of

STEP = StepIdentity("counts", "tests.words_of")


def _state(counts: dict[str, int]) -> KeyedState:
    state: KeyedState = {}
    for key, count in counts.items():
        state.setdefault(key_group(key), {})[key] = json.dumps(count).encode()
    return state


def _checkpoint(
    root: Path, store: KeyedStateStore, state: KeyedState, checkpoint_id: int, batch: int
) -> Path:
    """The keyed task's snapshot of ``state`` for checkpoint ``checkpoint_id``, with its ``_metadata``."""
    settings = KeyedSettings(
        job_id="wc", bootstrap="unused:9092", state_root=str(root / "state"), parallelism=1,
        inputs=frozenset({("words", 0)}), run_id="r1", attempt=1,
    )  # fmt: skip
    directory = root / "checkpoints" / "wc" / f"chk-{checkpoint_id}"
    barrier = {"id": checkpoint_id, "attempt": 1, "kind": "CHECKPOINT", "location": directory.as_uri()}
    uri, data, _ = write_snapshot(store, state, range(128), 128, "keyed-0", settings, barrier, batch, STEP)
    handle = StateHandle(uri, len(data), hashlib.sha256(data).hexdigest())
    completed = CheckpointCompleted(
        job_id="wc", checkpoint_id=checkpoint_id, kind=CheckpointKind.CHECKPOINT, timestamp_ms=0,
        duration_ms=1, handles={"keyed-0": handle}, size_bytes=len(data), offsets={"words:0": batch * 10},
        attempt=1, location=directory.as_uri(),
    )  # fmt: skip
    (directory / METADATA_FILE).write_bytes(encode(completed))
    return directory


def two_keyed_checkpoints(root: Path) -> tuple[Path, Path]:
    """Checkpoint 1 of {a: 1, b: 2, c: 3}; then a batch changes a, deletes b, adds d: checkpoint 2."""
    chk1, chk2, _ = three_keyed_checkpoints(root)
    return chk1, chk2


def three_keyed_checkpoints(root: Path) -> tuple[Path, Path, Path]:
    """:func:`two_keyed_checkpoints`, then a batch that changes nothing: checkpoint 3 (an empty delta)."""
    store = KeyedStateStore(str(root / "state"), 0)
    first = _state({"a": 1, "b": 2, "c": 3})
    store.seed(first)
    chk1 = _checkpoint(root, store, first, 1, 0)
    changes: dict[int, dict[str, bytes | None]] = {key_group("a"): {"a": b"10"}, key_group("b"): {"b": None}}
    changes.setdefault(key_group("d"), {})["d"] = b"4"
    second = {g: dict(keys) for g, keys in first.items()}
    apply_changes(second, changes)
    store.save(1, second, changes)
    chk2 = _checkpoint(root, store, second, 2, 1)
    store.save(2, second, {})
    chk3 = _checkpoint(root, store, second, 3, 2)
    return chk1, chk2, chk3


def upper_words_of(records: pa.RecordBatch) -> Any:
    """The word count's pairs with upper-cased words: a key function that keys ``alpha`` as ``ALPHA``."""
    pairs = words_of(records)
    return pairs.set_column(1, "key", pc.utf8_upper(pairs.column("key")))


UPPER_WORD_COUNT = replace(KEYED_WORD_COUNT, pairs_of=upper_words_of)
"""The keyed word count (uid ``word-count``) keyed by :func:`upper_words_of`."""


TALLY = pa.struct([("count", pa.int64()), ("last", pa.string())])
TALLIES = {"alpha": {"count": 3, "last": "x"}, "beta": {"count": 5, "last": "y"}}


def keep_last(key: str, state: Any, values: Any) -> tuple[Any, list[Any]]:
    """A tally of a key's values: how many, and the last."""
    count = (state or {"count": 0})["count"] + len(values)
    return {"count": count, "last": values[-1]}, []


def tally_pairs(record: Any) -> list[tuple[str, Any]]:
    return [(record.value.decode(), record.value.decode())]


TALLY_STEP = KeyedStep(tally_pairs, keep_last, "word string", uid="tallies", state_type=TALLY)


def per_partition_checkpoint(root: Path) -> Path:
    """A checkpoint of a per-partition job: task words-0's snapshot in a file, as a participant writes
    it at a barrier (:func:`snapshot_uri`), and words-1's inline in its handle."""
    directory = root / "chk-5"
    directory.mkdir(parents=True)
    first, second = b'{"alpha": 2, "beta": 1}', b'{"gamma": 4}'
    uri = snapshot_uri(directory.as_uri(), "words-0")
    storage.write_bytes(uri, first)
    handles = {
        "words-0": StateHandle(uri, len(first), hashlib.sha256(first).hexdigest()),
        "words-1": StateHandle(
            snapshot_uri(directory.as_uri(), "words-1"),
            len(second),
            hashlib.sha256(second).hexdigest(),
            inline=second,
        ),
    }
    completed = CheckpointCompleted(
        job_id="pp", checkpoint_id=5, kind=CheckpointKind.CHECKPOINT, timestamp_ms=0, duration_ms=1,
        handles=handles, size_bytes=len(first), offsets={"words:0": 3, "words:1": 1},
        location=directory.as_uri(),
    )  # fmt: skip
    (directory / METADATA_FILE).write_bytes(encode(completed))
    return directory
