"""Typed state, per-partition snapshots and the state type refusal (issue 50).

A keyed step that declares its state's type (``KeyedStep.state_type``) has it recorded in every
manifest its savepoints hold: ``cutline state show`` gives each state decoded as that type, a user's
columns decode JSON states by field, and a state that does not fit is an error naming its task and
key. Manifests without the type read as before. A per-partition task's snapshot and a participant's
are one row per task, read by ``--task``. A job whose step declares another state type refuses the
savepoint at restore, naming both types.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from keyed_checkpoints import TALLIES, TALLY, TALLY_STEP, per_partition_checkpoint, two_keyed_checkpoints  # noqa: E402

from events.task.participant import read_checkpoint_metadata  # noqa: E402
from events.task.state_view import (  # noqa: E402
    StateDoesNotFit,
    recorded_state_type,
    state_columns,
    state_rows,
    typed_states,
)
from events.task.state_writer import SavepointWriteRefused  # noqa: E402
from events.wire.records import CheckpointCompleted  # noqa: E402
from spark_tasks.keyed import read_manifest  # noqa: E402
from spark_tasks.restore import JobShape, Refusal, Refused, RestorePlan, plan_restore, restore_step  # noqa: E402
from spark_tasks.state_writer import write_new_savepoint  # noqa: E402
from spark_tasks.wordcount import KEYED_WORD_COUNT  # noqa: E402

CUTLINE = str(Path(sys.executable).parent / "cutline")
TYPED_WORD_COUNT = replace(KEYED_WORD_COUNT, state_type=pa.int64())


def _cutline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CUTLINE, "state", *args], capture_output=True, text=True, timeout=60)


def _tallies(location: Path) -> CheckpointCompleted:
    table = pa.table({"key": list(TALLIES), "state": pa.array(list(TALLIES.values()), TALLY)})
    return write_new_savepoint(table, TALLY_STEP, location, job_id="tally", parallelism=2)


def test_cutline_state_show_gives_states_as_the_type_the_step_recorded(tmp_path: Path) -> None:
    """Given a savepoint of a step whose state is a struct, its manifests record the type, and
    `show --json` gives each state as that struct's JSON object; a checkpoint without a recorded type
    has none (its states are shown as before)."""
    completed = _tallies(tmp_path / "sp")

    result = _cutline("show", str(tmp_path / "sp"), "--json")

    assert 0 == result.returncode, result.stderr
    assert TALLIES == {row["key"]: row["state"] for row in map(json.loads, result.stdout.splitlines())}
    assert {TALLY_STEP.identity.state_type} == {
        read_manifest(handle).step.state_type  # type: ignore[union-attr]
        for handle in completed.handles.values()
    }
    assert TALLY == recorded_state_type(completed)
    assert recorded_state_type(read_checkpoint_metadata(two_keyed_checkpoints(tmp_path)[0])) is None


def test_cutline_state_show_names_a_state_that_does_not_fit_its_recorded_type(tmp_path: Path) -> None:
    """A piece whose state is not JSON of the recorded type (written by another encoder): `show` fails
    naming the task and key, and the writer refuses such states before writing anything."""
    with pytest.raises(SavepointWriteRefused, match="state_type string"):
        write_new_savepoint(
            pa.table({"key": ["a"], "state": [1]}),
            replace(KEYED_WORD_COUNT, state_type=pa.string()),
            tmp_path / "never",
            job_id="wc",
        )
    states = pa.array([b'{"count": 1, "last": "x"}', b'{"count": "many"}'])

    with pytest.raises(StateDoesNotFit, match=r"task keyed-3, key 'beta': its state \{\"count\": \"many\"\}"):
        typed_states(states, TALLY, pa.array(["alpha", "beta"]), "keyed-3")
    assert not (tmp_path / "never").exists()


def test_cutline_state_columns_of_a_users_schema_decode_json_states_by_field() -> None:
    """Objects give each column their field of its name (null where missing); a bare value fills the
    one column; a bare value for two columns, or a value of another type, names its key."""
    objects = pa.array([b'{"count": 2, "last": "b"}', b'{"count": 7}'])
    keys = pa.array(["a", "b"])
    two = pa.schema([("count", pa.int64()), ("last", pa.string())])

    assert [[2, 7], ["b", None]] == [c.to_pylist() for c in state_columns(objects, keys, "keyed-0", two)]
    assert [[3, 4]] == [
        c.to_pylist() for c in state_columns(pa.array([b"3", b"4"]), keys, "keyed-0", two.remove(1))
    ]
    with pytest.raises(StateDoesNotFit, match="key 'a': its state 3 is not a JSON object"):
        state_columns(pa.array([b"3", b"4"]), keys, "keyed-0", two)
    with pytest.raises(StateDoesNotFit, match="key 'b': its state \"x\" does not fit column count int64"):
        state_columns(pa.array([b"1", b'"x"']), keys, "keyed-0", two.remove(1))


def test_cutline_state_show_reads_per_partition_and_participant_snapshots_by_task(tmp_path: Path) -> None:
    """Each per-partition task's snapshot is one row keyed by its task; `--task` gives one; a task
    the checkpoint does not hold is an error listing those it does."""
    directory = per_partition_checkpoint(tmp_path)

    one = _cutline("show", str(directory), "--task", "words-1", "--json")
    every = state_rows(read_checkpoint_metadata(directory))
    missing = _cutline("show", str(directory), "--task", "words-7")

    assert 0 == one.returncode, one.stderr
    assert [
        {"task": "words-1", "key_group": None, "key": "words-1", "state": {"gamma": 4}, "written_in": "chk-5"}
    ] == [json.loads(line) for line in one.stdout.splitlines()]
    assert [("words-0", b'{"alpha": 2, "beta": 1}'), ("words-1", b'{"gamma": 4}')] == [
        (r.key, r.state) for r in every
    ]
    assert (
        0 != missing.returncode and "holds no task 'words-7'; its tasks: words-0, words-1" in missing.stderr
    )


def test_savepoint_writer_output_of_another_state_type_is_refused_at_restore(tmp_path: Path) -> None:
    """A bootstrapped savepoint of counts (int64) restored into the word count declaring string
    states is refused by the restore's own check, naming both types, even with non-restored state
    allowed; the step with the same type, and a step that declares none, restore it."""
    table = pa.table({"key": ["alpha", "beta"], "state": pa.array([3, 5], pa.int64())})
    completed = write_new_savepoint(table, TYPED_WORD_COUNT, tmp_path / "sp", job_id="wc")
    manifests = {task: read_manifest(handle) for task, handle in completed.handles.items()}
    plan = plan_restore(completed, JobShape((("words", 0),), 2, 128), manifests)
    assert isinstance(plan, RestorePlan)
    textual = replace(KEYED_WORD_COUNT, state_type=pa.string()).identity

    refused = restore_step(plan, textual, allow_non_restored_state=False)
    allowed = restore_step(plan, textual, allow_non_restored_state=True)

    assert isinstance(refused, Refused) and Refusal.STATE_TYPE_CHANGED is refused.refusal
    assert "state type int64; this step's state type is string" in refused.reason
    assert isinstance(allowed, Refused)
    assert restore_step(plan, TYPED_WORD_COUNT.identity, allow_non_restored_state=False) is None
    assert restore_step(plan, KEYED_WORD_COUNT.identity, allow_non_restored_state=False) is None
    untyped = write_new_savepoint(table, KEYED_WORD_COUNT, tmp_path / "untyped", job_id="wc")
    old = {task: read_manifest(handle) for task, handle in untyped.handles.items()}
    old_plan = plan_restore(untyped, JobShape((("words", 0),), 2, 128), old)
    assert isinstance(old_plan, RestorePlan)
    assert restore_step(old_plan, textual, allow_non_restored_state=False) is None
