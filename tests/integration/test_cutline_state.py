"""``cutline state show`` and ``cutline state diff`` read what a keyed job held, from its files (issue 50).

Given two checkpoints of one keyed step written by the keyed tasks' own writer
(:func:`spark_tasks.keyed.write_snapshot`: a full piece, then a delta on it) and their
``_metadata``, the state read back is exactly what the task held at each cut, each key with the
checkpoint that last wrote it; the diff is the keys the batch between them added, changed and
deleted; a corrupt piece is an error naming it, never silent rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("mmh3")

from keyed_checkpoints import three_keyed_checkpoints, two_keyed_checkpoints  # noqa: E402

from events.task.state_view import compare, state_rows  # noqa: E402

CUTLINE = str(Path(sys.executable).parent / "cutline")


@pytest.fixture(name="two")
def _two_checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    return two_keyed_checkpoints(tmp_path)


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


def test_checkpoint_ids_of_a_job_are_resolved_through_its_journal(
    two: tuple[Path, Path], bootstrap: str
) -> None:
    """`cutline state diff --job wc 1 2`: the completions come from the job's journal partition."""
    from confluent_kafka import Producer
    from support import create_protocol_topics

    from events.kafka.clients import producer_config

    prefix = f"state{uuid.uuid4().hex[:6]}."
    topics = create_protocol_topics(bootstrap, prefix)
    producer = Producer(producer_config(bootstrap))
    for directory in two:
        producer.produce(topics.checkpoints, key=b"wc", value=(directory / "_metadata").read_bytes())
    assert 0 == producer.flush(10)

    result = _cutline(
        "diff", "--job", "wc", "1", "2", "--bootstrap", bootstrap, "--topic-prefix", prefix, "--json"
    )
    missing = _cutline("show", "--job", "wc", "7", "--bootstrap", bootstrap, "--topic-prefix", prefix)

    assert 0 == result.returncode, result.stderr
    assert {"d", "b", "a"} == {json.loads(line)["key"] for line in result.stdout.splitlines()}
    assert 0 != missing.returncode and "no completed checkpoint 7" in missing.stderr


def test_cutline_state_json_texts_are_the_states_that_are_json() -> None:
    """Numbers at once, other states parsed one by one; not UTF-8 or not JSON: null."""
    import pyarrow as pa

    from events.task.state_view import json_texts

    states = [b"10", b"-2.5e3", b'{"a": [1]}', b"not json", b"\xff\xfe", b"007", b'"x"']
    utf8 = [s for s in states if s != b"\xff\xfe"]

    assert ["10", "-2.5e3", '{"a": [1]}', None, None, None, '"x"'] == json_texts(pa.array(states)).to_pylist()
    assert ["10", "-2.5e3", '{"a": [1]}', None, None, '"x"'] == json_texts(pa.array(utf8)).to_pylist()


def test_cutline_state_reads_a_checkpoint_whose_last_delta_is_empty(tmp_path: Path) -> None:
    """A batch that changed nothing: its delta piece has no rows; the keys are checkpoint 2's, each
    still last written where it was."""
    from events.task.participant import read_checkpoint_metadata

    _, chk2, chk3 = three_keyed_checkpoints(tmp_path)

    rows = state_rows(read_checkpoint_metadata(chk3), "counts")

    assert [p.keys for p in _manifest_of(chk3).pieces] == [3, 3, 0]
    assert [(r.key, r.state, r.written_in) for r in state_rows(read_checkpoint_metadata(chk2))] == [
        (r.key, r.state, r.written_in) for r in rows
    ]


def _manifest_of(checkpoint: Path) -> Any:
    from events.task.keyed_pieces import read_manifest
    from events.task.participant import read_checkpoint_metadata

    return read_manifest(read_checkpoint_metadata(checkpoint).handles["keyed-0"])
