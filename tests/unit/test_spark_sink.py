"""The sink that keys its output by the input cut and rolls back to a restored checkpoint
(spark_tasks.sink), without Spark: a fake offset log and fake batches."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from events.wire.records import CheckpointCompleted, CheckpointKind
from spark_tasks.sink import (
    CUTS_DIR,
    ROLLED_BACK_DIR,
    BatchCut,
    CutFileSink,
    SinkTakenOver,
    batch_offsets,
    read_rows,
    sink_files,
)
from spark_tasks.wordcount import read_counts


@dataclass
class Row:
    values: dict[str, Any]

    def asDict(self, recursive: bool = False) -> dict[str, Any]:  # noqa: N802 (PySpark's name)
        return dict(self.values)


@dataclass
class Batch:
    rows: list[dict[str, Any]]

    def collect(self) -> list[Row]:
        return [Row(r) for r in self.rows]


@dataclass
class Job:
    """What the sink reads of a CheckpointedJob."""

    work_dir: Path
    attempt: int
    restored: CheckpointCompleted | None = None
    log: list[str] = field(default_factory=list)
    settings: Any = field(default_factory=lambda: SimpleNamespace(latency_interval_ms=0))
    """No latency markers: the sink reads none from the offset log."""
    batch_property: str | None = None
    """Not keyed: no batch id for keyed tasks to learn on Spark Connect."""


def _completed(offsets: dict[str, int]) -> CheckpointCompleted:
    return CheckpointCompleted("wc", 3, CheckpointKind.CHECKPOINT, 1, 1, {}, 0, offsets, attempt=1)


def _log_batch(job: Job, batch_id: int, ends: dict[int, int], barrier: bool = False) -> None:
    """Spark's offset log entry of ``batch_id``: version, metadata, the source's end offset."""
    offsets: dict[str, Any] = {"words": {str(p): o for p, o in ends.items()}}
    if barrier:
        offsets = {"__cutline_barrier__": {"attempt": job.attempt, "id": 1}, **offsets}
    path = job.work_dir / "spark" / "offsets" / str(batch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":1}}\n{json.dumps(offsets)}')


def _rows(*words: tuple[str, int]) -> Batch:
    return Batch([{"word": w, "added": n} for w, n in words])


class TestBatchCut:
    def test_the_name_sorts_by_input_and_depends_on_the_end_only(self) -> None:
        """Two batches ending at the same cut share a name; a later cut sorts after."""
        early = BatchCut({("w", 0): 0}, {("w", 0): 5, ("w", 1): 9})
        same = BatchCut(None, {("w", 1): 9, ("w", 0): 5})
        later = BatchCut(None, {("w", 0): 6, ("w", 1): 9})

        assert early.name == same.name
        assert early.name.startswith("00000000000000000014-")
        assert sorted([later.name, early.name]) == [early.name, later.name]

    def test_after_a_cut_means_past_it_on_any_partition(self) -> None:
        """A batch is after the cut if it read past it anywhere; a partition the cut lacks starts at 0."""
        cut = {("w", 0): 5, ("w", 1): 9}

        assert not BatchCut(None, {("w", 0): 5, ("w", 1): 9}).after(cut)
        assert not BatchCut(None, {("w", 0): 3}).after(cut)
        assert BatchCut(None, {("w", 0): 6, ("w", 1): 9}).after(cut)
        assert BatchCut(None, {("x", 0): 1}).after(cut)


def test_the_offset_log_gives_the_batch_end_without_its_barrier(tmp_path: Path) -> None:
    """The source's line of Spark's offset log is the end; the folded barrier is not an offset."""
    job = Job(tmp_path, 1)
    _log_batch(job, 4, {0: 10, 1: 7}, barrier=True)

    assert {("words", 0): 10, ("words", 1): 7} == batch_offsets(tmp_path / "spark", 4)
    with pytest.raises(RuntimeError, match="batch 5's offsets"):
        batch_offsets(tmp_path / "spark", 5)


def test_each_batch_with_rows_becomes_one_file_named_by_its_cut_with_a_record_of_its_offsets(
    tmp_path: Path,
) -> None:
    """Rows go to <out>/<cut>.jsonl; <out>/_cuts/<cut>.json records the batch; an empty batch writes
    nothing; a re-run of a batch replaces its file."""
    job, out = Job(tmp_path / "work", 1), tmp_path / "out"
    sink = CutFileSink(job, out)  # type: ignore[arg-type]
    _log_batch(job, 0, {0: 3, 1: 2})
    _log_batch(job, 1, {0: 3, 1: 2})
    _log_batch(job, 2, {0: 5, 1: 2})

    sink(_rows(("a", 2), ("b", 1)), 0)
    sink(_rows(), 1)
    sink(_rows(("a", 1)), 2)
    sink(_rows(("a", 1)), 2)  # a re-run

    files = sink_files(out)
    assert [BatchCut(None, {("words", 0): 3, ("words", 1): 2}).name + ".jsonl", files[1].name] == [
        f.name for f in files
    ]
    record = json.loads((out / CUTS_DIR / f"{files[1].stem}.json").read_text())
    assert {
        "attempt": 1,
        "batch": 2,
        "start": {"words:0": 3, "words:1": 2},
        "end": {"words:0": 5, "words:1": 2},
    } == record
    assert [{"added": 2, "word": "a"}, {"added": 1, "word": "b"}, {"added": 1, "word": "a"}] == list(
        read_rows(out)
    )


def test_a_restored_attempt_rolls_back_the_files_written_after_its_cut(tmp_path: Path) -> None:
    """Attempt 1 wrote three batches and crashed; attempt 2 restores the cut after the first: the
    other two move to _rolled_back/attempt-2, and its own batches (numbered from 0 again) replace them."""
    out = tmp_path / "out"
    first = Job(tmp_path / "a1", 1)
    sink = CutFileSink(first, out)  # type: ignore[arg-type]
    for batch_id, (ends, rows) in enumerate(
        [({0: 2, 1: 1}, [("a", 3)]), ({0: 4, 1: 1}, [("a", 2)]), ({0: 4, 1: 3}, [("b", 2)])]
    ):
        _log_batch(first, batch_id, ends)
        sink(_rows(*rows), batch_id)
    (out / ".leftover.jsonl.0123.tmp").write_text("a write the crash cut short")

    second = Job(tmp_path / "a2", 2, restored=_completed({"words:0": 2, "words:1": 1}))
    restored = CutFileSink(second, out)  # type: ignore[arg-type]
    _log_batch(second, 0, {0: 4, 1: 3})  # one batch over what the crashed attempt read in two
    restored(_rows(("a", 2), ("b", 2)), 0)

    assert 2 == len(restored.rolled_back)
    assert {p.name for p in restored.rolled_back} == {
        p.name for p in (out / ROLLED_BACK_DIR / "attempt-2").glob("*.jsonl")
    }
    assert 2 == len(list((out / ROLLED_BACK_DIR / "attempt-2" / CUTS_DIR).glob("*.json")))
    assert 2 == len(sink_files(out)) and not list(out.glob(".*.tmp"))
    assert {"a": 5, "b": 2} == read_counts(out)  # each record's output once


def test_an_attempt_that_restores_nothing_rolls_back_everything(tmp_path: Path) -> None:
    """Starting empty replays the input from the start: every earlier output file goes."""
    out = tmp_path / "out"
    first = Job(tmp_path / "a1", 1)
    _log_batch(first, 0, {0: 2})
    CutFileSink(first, out)(_rows(("a", 1)), 0)  # type: ignore[arg-type]

    again = CutFileSink(Job(tmp_path / "a2", 2), out)  # type: ignore[arg-type]

    assert 1 == len(again.rolled_back) and [] == sink_files(out)


def test_an_older_sink_writes_nothing_once_a_newer_one_rolled_back(tmp_path: Path) -> None:
    """A crashed driver's query outlives it (Spark Connect) and its sink writes on after the next
    attempt's sink rolled back: that write raises and leaves nothing; the newer sink writes."""
    out = tmp_path / "out"
    first = Job(tmp_path / "a1", 1)
    crashed = CutFileSink(first, out)  # type: ignore[arg-type]
    _log_batch(first, 0, {0: 2})
    crashed(_rows(("a", 1)), 0)
    second = Job(tmp_path / "a2", 2, restored=_completed({"words:0": 2}))
    restored = CutFileSink(second, out)  # type: ignore[arg-type]

    _log_batch(first, 1, {0: 4})
    with pytest.raises(SinkTakenOver, match="attempt 2's sink writes here now"):
        crashed(_rows(("a", 2)), 1)
    _log_batch(second, 0, {0: 4})
    restored(_rows(("a", 2)), 0)

    assert {"a": 3} == read_counts(out)
    assert 2 == len(list((out / CUTS_DIR).glob("*.json")))
