"""The executor of retention plans (spark_tasks/retention_executor.py) on real local directories: it
deletes this run's files only, and keeps a piece a retained checkpoint's chain lists. No Spark runs."""

from __future__ import annotations

from pathlib import Path

from events.task.ledger import Discard
from spark_tasks.retention_executor import RetentionExecutor, RunFiles
from spark_tasks.tasks import snapshot_name

RUN = "r1"


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def make(directory: Path, *names: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"x")


def test_a_discarded_per_partition_checkpoint_loses_this_runs_files_only(tmp_path: Path) -> None:
    """Given checkpoint 1's directory with this run's snapshot, another run's and its _metadata, when
    checkpoint 2 completes and the ledger discards 1, then only the other run's snapshot is left."""
    chk1 = tmp_path / "chk-1"
    mine, other = snapshot_name("words-0", 0, RUN, 40), snapshot_name("words-0", 0, "r0", 40)
    make(chk1, mine, other, "_metadata")
    executor = RetentionExecutor(keyed=False)
    run = RunFiles(("words-0",), 0, RUN, None)

    executor.completed(2, [Discard(1, chk1.as_uri())], None, run)

    assert [other] == files_in(chk1)


def test_a_keyed_piece_a_retained_chain_lists_survives_until_no_chain_does(tmp_path: Path) -> None:
    """Given checkpoint 1's full piece and delta, when checkpoint 2 (whose chain lists 1's full piece)
    completes and 1 is discarded, then the full piece stays; when 3 completes with a fresh full piece
    and 2 is discarded, then 1's directory is gone."""
    chk1, chk2 = tmp_path / "chk-1", tmp_path / "chk-2"
    full, delta = (
        snapshot_name("keyed-0", 0, RUN, 5) + ".full",
        snapshot_name("keyed-0", 0, RUN, 5) + ".delta",
    )
    later = snapshot_name("keyed-0", 0, RUN, 9) + ".delta"
    make(chk1, full, delta, "_metadata")
    make(chk2, later, "_metadata")
    executor = RetentionExecutor(keyed=True)
    run = RunFiles(("keyed-0",), 0, RUN, 1)
    executor.completed(1, [], frozenset({(chk1 / full).as_uri(), (chk1 / delta).as_uri()}), run)

    executor.completed(
        2, [Discard(1, chk1.as_uri())], frozenset({(chk1 / full).as_uri(), (chk2 / later).as_uri()}), run
    )
    assert [full] == files_in(chk1)

    executor.completed(3, [Discard(2, chk2.as_uri())], frozenset(), run)
    assert ([], []) == (files_in(chk1), files_in(chk2))
    assert not chk1.exists()
