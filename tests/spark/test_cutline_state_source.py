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
