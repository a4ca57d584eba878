"""``cutline state show`` and ``cutline state diff`` read what a keyed job held, from its files (issue 50).

Given two checkpoints of one keyed step written by the keyed tasks' own writer
(:func:`spark_tasks.keyed.write_snapshot`: a full piece, then a delta on it) and their
``_metadata``, the state read back is exactly what the task held at each cut, each key with the
checkpoint that last wrote it; the diff is the keys the batch between them added, changed and
deleted; a corrupt piece is an error naming it, never silent rows.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("mmh3")

from events.task.manifest import StepIdentity  # noqa: E402
from events.task.state_view import compare, state_rows  # noqa: E402
from events.wire.codec import encode  # noqa: E402
from events.wire.metadata import METADATA_FILE  # noqa: E402
from events.wire.records import CheckpointCompleted, CheckpointKind, StateHandle  # noqa: E402
from spark_tasks.keyed import (  # noqa: E402
    KeyedSettings,
    KeyedState,
    KeyedStateStore,
    apply_changes,
    key_group,
    write_snapshot,
)

CUTLINE = str(Path(sys.executable).parent / "cutline")
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


@pytest.fixture(name="two")
def _two_checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    """Checkpoint 1 of {a: 1, b: 2, c: 3}; then a batch changes a, deletes b, adds d: checkpoint 2."""
    store = KeyedStateStore(str(tmp_path / "state"), 0)
    first = _state({"a": 1, "b": 2, "c": 3})
    store.seed(first)
    chk1 = _checkpoint(tmp_path, store, first, 1, 0)
    changes: dict[int, dict[str, bytes | None]] = {key_group("a"): {"a": b"10"}, key_group("b"): {"b": None}}
    changes.setdefault(key_group("d"), {})["d"] = b"4"
    second = {g: dict(keys) for g, keys in first.items()}
    apply_changes(second, changes)
    store.save(1, second, changes)
    chk2 = _checkpoint(tmp_path, store, second, 2, 1)
    return chk1, chk2


def _cutline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CUTLINE, "state", *args], capture_output=True, text=True, timeout=60)


def test_cutline_state_show_gives_each_key_and_the_checkpoint_that_last_wrote_it(
    two: tuple[Path, Path],
) -> None:
    _, chk2 = two

    result = _cutline("show", str(chk2), "--uid", "counts", "--json")

    assert 0 == result.returncode, result.stderr
    rows = {
        row["key"]: (row["state"], row["written_in"]) for row in map(json.loads, result.stdout.splitlines())
    }
    assert {"a": (10, "chk-2"), "c": (3, "chk-1"), "d": (4, "chk-2")} == rows


def test_cutline_state_show_one_key_as_a_table(two: tuple[Path, Path]) -> None:
    _, chk2 = two

    result = _cutline("show", str(chk2), "--key", "c")

    assert 0 == result.returncode, result.stderr
    assert "checkpoint 2: 1 keys" in result.stdout and "chk-1" in result.stdout


def test_cutline_state_diff_is_what_the_batch_between_them_did(two: tuple[Path, Path]) -> None:
    chk1, chk2 = two

    result = _cutline("diff", str(chk1), str(chk2), "--json")

    assert 0 == result.returncode, result.stderr
    changes = [
        (c["change"], c["key"], c["before"], c["after"]) for c in map(json.loads, result.stdout.splitlines())
    ]
    assert [("added", "d", None, 4), ("removed", "b", 2, None), ("changed", "a", 1, 10)] == changes
    summary = _cutline("diff", str(chk1), str(chk2))
    assert "1 added, 1 removed, 1 changed" in summary.stdout


def test_the_rows_read_in_process_are_the_state_written(two: tuple[Path, Path]) -> None:
    from events.task.participant import read_checkpoint_metadata

    chk1, chk2 = (read_checkpoint_metadata(c) for c in two)

    assert {"a", "b", "c"} == {row.key for row in state_rows(chk1)}
    assert ("d",) == tuple(c.key for c in compare(state_rows(chk1), state_rows(chk2)).added)


def test_a_corrupt_piece_is_an_error_naming_it(two: tuple[Path, Path]) -> None:
    _, chk2 = two
    delta = next(chk2.glob("*.delta"))
    delta.write_bytes(b"not the piece the manifest names")

    result = _cutline("show", str(chk2))

    assert 0 != result.returncode
    assert "corrupt" in result.stderr and delta.name in result.stderr.replace("\n", "")


def test_an_unknown_uid_says_which_steps_there_are(two: tuple[Path, Path]) -> None:
    result = _cutline("show", str(two[0]), "--uid", "totals")

    assert 0 != result.returncode and "its keyed steps: 'counts'" in result.stderr
