"""A savepoint written from data (Flink's ``SavepointWriter``, issue 50), without a job or a Spark session.

Given the keyed word count's step, a savepoint written from an Arrow table holds exactly the table's
counts, in manifests and pieces a job's restore reads as its own (the restore's own planner accepts
it for any number of shuffle partitions and refuses it as it refuses a job's savepoint: another
step, another max parallelism). States the step does not keep, duplicate keys and an existing
savepoint are refused before anything is written. A transform drops keys, rewrites states and
re-keys only when told how; a missing or corrupt piece is an error naming it; and all of it works on
S3 (moto's server).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from keyed_checkpoints import UPPER_WORD_COUNT  # noqa: E402

from events.task.participant import SnapshotCorrupted, read_checkpoint_metadata  # noqa: E402
from events.task.state_view import state_rows  # noqa: E402
from events.task.state_writer import (  # noqa: E402
    SavepointTarget,
    SavepointWriteRefused,
    read_savepoint_state,
    savepoint_files,
)
from spark_tasks.keyed import key_group, key_group_range, read_manifest  # noqa: E402
from spark_tasks.restore import JobShape, Refusal, Refused, RestorePlan, plan_restore, restore_step  # noqa: E402
from spark_tasks.state_writer import Rekeying, transform_savepoint, write_new_savepoint  # noqa: E402
from spark_tasks.wordcount import KEYED_WORD_COUNT  # noqa: E402

CUTLINE = str(Path(sys.executable).parent / "cutline")
COUNTS = {"alpha": 3, "beta": 5, "gamma": 1, "delta": 8, "epsilon": 2}
OFFSETS = {"words:0": 7, "words:1": 4}


def _table(counts: dict[str, int]) -> Any:
    return pa.table({"key": list(counts), "state": pa.array(list(counts.values()), pa.int64())})


def _cutline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CUTLINE, "state", *args], capture_output=True, text=True, timeout=60)


def _shown(location: str) -> dict[str, Any]:
    result = _cutline("show", location, "--json", "--limit", "0")
    assert 0 == result.returncode, result.stderr
    return {row["key"]: row["state"] for row in map(json.loads, result.stdout.splitlines())}


def _shape(keyed_partitions: int, max_parallelism: int = 128) -> JobShape:
    return JobShape((("words", 0), ("words", 1)), keyed_partitions, max_parallelism)


def test_savepoint_writer_bootstrap_holds_the_table_as_a_jobs_savepoint_would(tmp_path: Path) -> None:
    """Given counts in an Arrow table, the savepoint written for job wc in 3 tasks holds exactly them
    (read back by `cutline state show`), each task's manifest its key_group_range, the step's
    identity and the offsets given; the job's restore planner accepts it for 5 shuffle partitions."""
    location = tmp_path / "bootstrap"

    completed = write_new_savepoint(
        _table(COUNTS), KEYED_WORD_COUNT, location, job_id="wc", offsets=OFFSETS, parallelism=3
    )

    assert COUNTS == _shown(str(location))
    assert ("wc", "SAVEPOINT", 1) == (completed.job_id, completed.kind.name, completed.checkpoint_id)
    assert OFFSETS == completed.offsets
    manifests = {task: read_manifest(handle) for task, handle in completed.handles.items()}
    assert {f"keyed-{i}": key_group_range(i, 3) for i in range(3)} == {
        task: m.key_groups for task, m in manifests.items()
    }
    assert {KEYED_WORD_COUNT.identity} == {m.step for m in manifests.values()}
    assert {key_group(k) for k in COUNTS} == {r.key_group for r in state_rows(completed)}
    plan = plan_restore(read_checkpoint_metadata(location), _shape(5), manifests)
    assert isinstance(plan, RestorePlan) and plan.keyed_state
    assert {("words", 0): 7, ("words", 1): 4} == dict(plan.offsets)
    assert restore_step(plan, KEYED_WORD_COUNT.identity, allow_non_restored_state=False) is None


def test_savepoint_writer_output_is_refused_as_a_jobs_savepoint_is(tmp_path: Path) -> None:
    """A written savepoint restored into another step, or a job of another max parallelism, is
    refused by the job's own checks, with the reason."""
    completed = write_new_savepoint(_table(COUNTS), KEYED_WORD_COUNT, tmp_path / "sp", job_id="wc")
    manifests = {task: read_manifest(handle) for task, handle in completed.handles.items()}

    plan = plan_restore(completed, _shape(2), manifests)
    assert isinstance(plan, RestorePlan)
    other = replace(KEYED_WORD_COUNT, uid="totals").identity
    refused = restore_step(plan, other, allow_non_restored_state=False)
    wider = plan_restore(completed, _shape(2, max_parallelism=256), manifests)

    assert isinstance(refused, Refused) and Refusal.STEP_CHANGED is refused.refusal
    assert "uid 'word-count', key function spark_tasks.wordcount.words_of" in refused.reason
    assert isinstance(wider, Refused) and Refusal.MAX_PARALLELISM is wider.refusal


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (pa.table({"key": ["a"], "state": ["3"]}), "comes back from the step's encoder as 3"),
        (pa.table({"key": ["a", "a"], "state": [1, 2]}), "keys occur more than once (a)"),
        (pa.table({"key": ["a", None], "state": [1, 2]}), "1 null keys"),
        (pa.table({"word": ["a"], "state": [1]}), "the data has no column key"),
    ],
)
def test_savepoint_writer_refuses_data_the_step_does_not_keep(tmp_path: Path, data: Any, reason: str) -> None:
    """States of another type than the step keeps (a count as text), a key twice, a null key or no
    key column: refused, and nothing is written."""
    with pytest.raises(SavepointWriteRefused, match=reason.replace("(", r"\(").replace(")", r"\)")):
        write_new_savepoint(data, KEYED_WORD_COUNT, tmp_path / "sp", job_id="wc")

    assert not (tmp_path / "sp").exists()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"checkpoint_id": 0}, "checkpoint id 0: a savepoint's id is 1 to"),
        ({"task_groups": [range(64)]}, r"key groups \['0-63'\] are not 0-127 each once"),
        ({"task_groups": [range(100), range(90, 128)]}, "are not 0-127 each once"),
        ({"offsets": {"words": 3}}, "offsets: offsets key 'words' is not 'topic:partition'"),
        ({"job_id": ""}, "needs the id of the job"),
    ],
)
def test_savepoint_writer_refuses_a_savepoint_no_job_restores(change: dict[str, Any], reason: str) -> None:
    """A checkpoint id the coordinator refuses, key groups missing or claimed twice, malformed
    offsets, no job: refused before any file is decided."""
    target = SavepointTarget("wc", "file:///savepoints/sp", KEYED_WORD_COUNT.identity, 128, [range(128)])

    with pytest.raises(SavepointWriteRefused, match=reason):
        savepoint_files({}, replace(target, **change))


def test_savepoint_writer_never_overwrites_a_savepoint(tmp_path: Path) -> None:
    write_new_savepoint(_table(COUNTS), KEYED_WORD_COUNT, tmp_path / "sp", job_id="wc")

    with pytest.raises(SavepointWriteRefused, match="holds a savepoint or checkpoint already"):
        write_new_savepoint(_table({"a": 1}), KEYED_WORD_COUNT, tmp_path / "sp", job_id="wc")
    assert COUNTS == _shown(str(tmp_path / "sp"))


def test_savepoint_writer_transform_drops_rewrites_and_keeps_the_step(tmp_path: Path) -> None:
    """A transform of a savepoint keeps the keys ``keep`` keeps, with ``rewrite``'s states, and the
    source's step, job, offsets and checkpoint id; another number of tasks if asked."""
    source = write_new_savepoint(
        _table(COUNTS), KEYED_WORD_COUNT, tmp_path / "sp", job_id="wc", offsets=OFFSETS, parallelism=2
    )

    written = transform_savepoint(
        tmp_path / "sp",
        tmp_path / "sp-2",
        KEYED_WORD_COUNT,
        keep=lambda key, count: key != "beta",
        rewrite=lambda key, count: None if count == 1 else count * 10,
        parallelism=4,
    )

    assert {"alpha": 30, "delta": 80, "epsilon": 20} == _shown(str(tmp_path / "sp-2"))
    assert (source.job_id, source.offsets, source.checkpoint_id) == (
        written.job_id,
        written.offsets,
        written.checkpoint_id,
    )
    assert 4 == len(written.handles)
    assert KEYED_WORD_COUNT.identity == read_savepoint_state(written.location).step


def test_savepoint_writer_rekeys_only_when_told_how(tmp_path: Path) -> None:
    """Re-keyed for a step with another key function, keys move to their new key groups and the
    savepoint records the new step; keys that meet are refused without a merge, summed with one; a
    transform given the new step as the source's is refused (its state is the old key function's)."""
    counts = {"alpha": 3, "Alpha": 4, "beta": 5}
    write_new_savepoint(_table(counts), KEYED_WORD_COUNT, tmp_path / "sp", job_id="wc")
    upper = UPPER_WORD_COUNT

    with pytest.raises(SavepointWriteRefused, match="keys 'Alpha', 'alpha' all become 'ALPHA'"):
        transform_savepoint(
            tmp_path / "sp", tmp_path / "no", KEYED_WORD_COUNT, rekey=Rekeying(upper, str.upper)
        )
    with pytest.raises(SavepointWriteRefused, match="re-key explicitly"):
        transform_savepoint(tmp_path / "sp", tmp_path / "no", upper)
    written = transform_savepoint(
        tmp_path / "sp", tmp_path / "up", KEYED_WORD_COUNT, rekey=Rekeying(upper, str.upper, merge=sum)
    )

    assert {"ALPHA": 7, "BETA": 5} == _shown(str(tmp_path / "up"))
    assert {key_group("ALPHA"), key_group("BETA")} == {r.key_group for r in state_rows(written)}
    assert upper.identity == read_savepoint_state(written.location).step
    assert not (tmp_path / "no").exists()


def test_a_missing_or_corrupt_piece_is_an_error_naming_it(tmp_path: Path) -> None:
    """`cutline state show` and a transform's read fail naming the piece: missing, or not the bytes
    its manifest names."""
    write_new_savepoint(_table(COUNTS), KEYED_WORD_COUNT, tmp_path / "sp", job_id="wc", parallelism=2)
    first = sorted((tmp_path / "sp").glob("*.full"))[0]
    kept = first.read_bytes()
    first.unlink()

    shown = _cutline("show", str(tmp_path / "sp"))
    with pytest.raises(SnapshotCorrupted, match=f"piece .*{first.name} is missing"):
        transform_savepoint(tmp_path / "sp", tmp_path / "sp-2", KEYED_WORD_COUNT)
    first.write_bytes(kept[:-1])

    assert 0 != shown.returncode and "is missing" in shown.stderr
    assert first.name in shown.stderr.replace("\n", "")
    corrupt = _cutline("show", str(tmp_path / "sp"))
    assert 0 != corrupt.returncode and "corrupt" in corrupt.stderr


def test_cutline_state_reads_and_writes_savepoints_on_s3(s3: Any) -> None:
    """On S3 (moto's server): a savepoint written there is read back by `cutline state show s3://…`,
    transformed from S3 to S3, and a corrupt piece there is an error naming it."""
    bucket = "s3://cutline-checkpoints/savepoints"

    write_new_savepoint(_table(COUNTS), KEYED_WORD_COUNT, f"{bucket}/sp-1", job_id="wc", parallelism=2)
    transform_savepoint(f"{bucket}/sp-1", f"{bucket}/sp-2", KEYED_WORD_COUNT, keep=lambda k, c: c > 2)

    assert COUNTS == _shown(f"{bucket}/sp-1")
    assert {"alpha": 3, "beta": 5, "delta": 8} == _shown(f"{bucket}/sp-2")
    piece = sorted(p for p in s3.find("cutline-checkpoints/savepoints/sp-2") if p.endswith(".full"))[0]
    s3.pipe_file(piece, b"not the piece")
    corrupt = _cutline("show", f"{bucket}/sp-2")
    assert 0 != corrupt.returncode and "corrupt" in corrupt.stderr
    assert piece.rsplit("/", 1)[1] in corrupt.stderr.replace("\n", "")


def test_savepoint_writer_regroups_keys_for_another_max_parallelism(tmp_path: Path) -> None:
    """A job cannot change its max parallelism (key groups cannot be remapped), but the writer has
    the keys: re-keyed as they are for the step with 256 key groups, each key is in its key group of
    256, and a job of 256 restores it while one of 128 refuses it."""
    write_new_savepoint(_table(COUNTS), KEYED_WORD_COUNT, tmp_path / "sp", job_id="wc", parallelism=2)
    wider = replace(KEYED_WORD_COUNT, max_parallelism=256)

    written = transform_savepoint(
        tmp_path / "sp", tmp_path / "wide", KEYED_WORD_COUNT, rekey=Rekeying(wider, lambda key: key)
    )

    manifests = {task: read_manifest(handle) for task, handle in written.handles.items()}
    assert {256} == {m.max_parallelism for m in manifests.values()}
    assert {(k, key_group(k, 256)) for k in COUNTS} == {(r.key, r.key_group) for r in state_rows(written)}
    assert COUNTS == _shown(str(tmp_path / "wide"))
    assert isinstance(plan_restore(written, _shape(3, max_parallelism=256), manifests), RestorePlan)
    assert isinstance(plan_restore(written, _shape(3), manifests), Refused)
