"""``spark.read.format("cutline-state")`` reads a keyed job's state at a checkpoint (issue 50).

The same two keyed checkpoints as ``cutline state``'s tests (tests/keyed_checkpoints.py), read as a
DataFrame on the test session: each key once, its state as stored and as JSON, and the checkpoint
that last wrote it; a corrupt piece fails the read naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from keyed_checkpoints import two_keyed_checkpoints

pytestmark = pytest.mark.spark


def test_cutline_state_reads_each_key_with_its_state_and_the_checkpoint_that_wrote_it(
    spark: Any, tmp_path: Path
) -> None:
    _, chk2 = two_keyed_checkpoints(tmp_path)

    rows = (
        spark.read.format("cutline-state").option("path", str(chk2)).option("uid", "counts").load().collect()
    )

    assert {"a": ("10", "chk-2"), "c": ("3", "chk-1"), "d": ("4", "chk-2")} == {
        r["key"]: (r["state_json"], r["written_in"]) for r in rows
    }
    assert {b"10", b"3", b"4"} == {bytes(r["state"]) for r in rows}


def test_a_corrupt_piece_fails_the_read_naming_it(spark: Any, tmp_path: Path) -> None:
    _, chk2 = two_keyed_checkpoints(tmp_path)
    delta = next(chk2.glob("*.delta"))
    delta.write_bytes(b"not the piece the manifest names")

    with pytest.raises(Exception, match="corrupt"):
        spark.read.format("cutline-state").option("path", str(chk2)).load().collect()


READ_ON_S3 = """
import json, sys
from spark_tasks.session import local_spark
spark = local_spark("cutline-state-s3", cores=1)
rows = spark.read.format("cutline-state").option("path", sys.argv[1]).load().collect()
print(json.dumps({r["key"]: [r["state_json"], r["written_in"]] for r in rows}))
spark.stop()
"""


def test_cutline_state_reads_a_savepoint_on_s3(s3: Any, tmp_path: Path) -> None:
    """Given a savepoint of the word count written to S3 (moto's server), a Spark application started
    with the S3 endpoint and keys in its environment (as the ``s3`` fixture sets them) reads it
    there: every key with its count. (A Python data source plans in processes the JVM starts with
    its own environment, so the keys must be there when Spark starts: hence a process of its own.)"""
    import json
    import subprocess
    import sys

    import pyarrow as pa

    from spark_tasks.state_writer import write_new_savepoint
    from spark_tasks.wordcount import KEYED_WORD_COUNT

    counts = {"alpha": 3, "beta": 5, "gamma": 1}
    location = "s3://cutline-checkpoints/savepoints/sp-1"
    table = pa.table({"key": list(counts), "state": pa.array(list(counts.values()), pa.int64())})
    write_new_savepoint(table, KEYED_WORD_COUNT, location, job_id="wc", parallelism=2)

    result = subprocess.run(
        [sys.executable, "-c", READ_ON_S3, location],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )

    assert 0 == result.returncode, result.stderr[-3000:]
    read = json.loads(result.stdout.strip().splitlines()[-1])
    assert {key: [str(count), "sp-1"] for key, count in counts.items()} == read
