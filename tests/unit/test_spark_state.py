"""The executor side of checkpointed Spark jobs, without Spark: the offset-keyed state store, the
snapshot at a barrier, and the fold of one task's rows (spark_tasks.state, spark_tasks.tasks)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from events.task.participant import write_atomic
from events.task.reply import Reply, answer
from events.wire.barrier_entry import entry_barrier
from events.wire.records import CheckpointAcknowledged, CheckpointDeclined
from spark_tasks import tasks
from spark_tasks.kafka_source.reading import kafka_schema
from spark_tasks.state import VERSIONS_KEPT, PartitionStateStore, StateLost
from spark_tasks.tasks import TaskSettings, partition_step, snapshot_files, write_partition_snapshot
from spark_tasks.wordcount import WORD_COUNT

BARRIER = {"attempt": 2, "id": 7, "kind": "CHECKPOINT", "location": "", "timestamp_ms": 1_700_000_000_000}


RUN = "r1"
"""The run id of the tests' tasks."""


def _settings(tmp_path: Path, **changes: Any) -> TaskSettings:
    return TaskSettings(
        job_id="wc", bootstrap="unused:9092", state_dir=str(tmp_path / "state"), run_id=RUN, **changes
    )


def _reply_after_writing(
    settings: TaskSettings, entry: dict[str, Any], topic: str, partition: int, cut: int, data: bytes
) -> Reply:
    """What a task answers to the barrier ``entry`` after writing ``data``, the state at ``cut``."""
    barrier = entry_barrier(settings.job_id, entry)
    outcome = write_partition_snapshot(settings, barrier, topic, partition, cut, data)
    return answer(barrier, None, f"{topic}-{partition}", outcome, 1).reply


def _snapshot(tmp_path: Path, task: str, cut: int, attempt: int = 2, run: str = RUN) -> Path:
    """Where the tests' checkpoint 7 keeps ``task``'s snapshot at ``cut``."""
    return tmp_path / "chk-7" / f"{task}.a{attempt}-{run}.cut-{cut}"


# ------------------------------------------------------------------ state store


def test_the_store_loads_the_newest_version_at_or_below_an_offset(tmp_path: Path) -> None:
    store = PartitionStateStore(tmp_path)
    store.save("words", 0, 10, b"ten")
    store.save("words", 0, 25, b"twenty-five")

    assert store.load("words", 0, 9) is None
    assert store.load("words", 0, 10) == (10, b"ten")
    assert store.load("words", 0, 24) == (10, b"ten")
    assert store.load("words", 0, 99) == (25, b"twenty-five")
    assert store.load("words", 1, 99) is None  # partitions are apart


def test_the_store_keeps_only_the_newest_versions(tmp_path: Path) -> None:
    store = PartitionStateStore(tmp_path)
    for offset in range(20):
        store.save("words", 3, offset, str(offset).encode())

    assert store.versions("words", 3) == list(range(20 - VERSIONS_KEPT, 20))
    with pytest.raises(ValueError, match="non-negative offset"):
        store.save("words", 3, -1, b"")


# --------------------------------------------------------------------- snapshots


def test_a_snapshot_is_written_under_the_location_and_acknowledged(tmp_path: Path) -> None:
    barrier = {**BARRIER, "location": (tmp_path / "chk-7").as_uri()}

    reply = _reply_after_writing(_settings(tmp_path), barrier, "words", 1, 42, b'{"a":1}')

    assert isinstance(reply, CheckpointAcknowledged)
    assert (reply.job_id, reply.checkpoint_id, reply.attempt, reply.task_id) == ("wc", 7, 2, "words-1")
    assert reply.offsets == {"words:1": 42}
    assert reply.state is not None and reply.state.uri == _snapshot(tmp_path, "words-1", 42).as_uri()
    assert _snapshot(tmp_path, "words-1", 42).read_bytes() == b'{"a":1}'
    assert reply.state.sha256 == hashlib.sha256(b'{"a":1}').hexdigest() and reply.state.size_bytes == 7


def test_a_retried_task_acknowledges_the_snapshot_already_written(tmp_path: Path) -> None:
    barrier = {**BARRIER, "location": (tmp_path / "chk-7").as_uri()}
    first = _reply_after_writing(_settings(tmp_path), barrier, "words", 1, 42, b'{"a":1}')

    again = _reply_after_writing(_settings(tmp_path), barrier, "words", 1, 42, b'{"a": 1}')  # other bytes

    assert isinstance(first, CheckpointAcknowledged) and isinstance(again, CheckpointAcknowledged)
    assert again.state == first.state
    assert _snapshot(tmp_path, "words-1", 42).read_bytes() == b'{"a":1}'


def test_a_snapshot_of_another_cut_run_or_attempt_is_never_reused(tmp_path: Path) -> None:
    """Files that share the checkpoint id but not the cut, the run or the attempt are left alone."""
    barrier = {**BARRIER, "location": (tmp_path / "chk-7").as_uri()}
    others = [
        _snapshot(tmp_path, "words-1", 41),  # this run, another cut
        _snapshot(tmp_path, "words-1", 42, run="r0"),  # an earlier run that used checkpoint id 7
        _snapshot(tmp_path, "words-1", 42, attempt=1),
        tmp_path / "chk-7" / "words-1",  # the name before snapshots were bound to their cut
    ]
    for path in others:
        write_atomic(path, b'{"old":1}')

    reply = _reply_after_writing(_settings(tmp_path), barrier, "words", 1, 42, b'{"new":1}')

    assert isinstance(reply, CheckpointAcknowledged) and reply.state is not None
    assert reply.state.sha256 == hashlib.sha256(b'{"new":1}').hexdigest()
    assert _snapshot(tmp_path, "words-1", 42).read_bytes() == b'{"new":1}'
    assert {path.read_bytes() for path in others} == {b'{"old":1}'}
    assert [_snapshot(tmp_path, "words-1", 41), _snapshot(tmp_path, "words-1", 42)] == snapshot_files(
        tmp_path / "chk-7", ["words-0", "words-1"], 2, RUN
    )


def test_a_snapshot_that_cannot_be_written_is_declined(tmp_path: Path) -> None:
    (tmp_path / "blocked").write_text("a file where the checkpoint directory should be")
    barrier = {**BARRIER, "location": (tmp_path / "blocked" / "chk-7").as_uri()}

    reply = _reply_after_writing(_settings(tmp_path), barrier, "words", 0, 3, b"{}")

    assert isinstance(reply, CheckpointDeclined)
    assert (reply.checkpoint_id, reply.attempt, reply.task_id) == (7, 2, "words-0")
    assert reply.reason == "IO_EXCEPTION" and "NotADirectoryError" in reply.message


def test_a_location_that_is_not_a_file_uri_is_declined(tmp_path: Path) -> None:
    barrier = {**BARRIER, "location": "s3://bucket/chk-7"}

    reply = _reply_after_writing(_settings(tmp_path), barrier, "words", 0, 3, b"{}")

    assert isinstance(reply, CheckpointDeclined) and "s3" in reply.message


# ---------------------------------------------------------------- a task's rows


def _rows(rows: list[tuple[int, str | None, dict[str, Any] | None]]) -> pa.RecordBatch:
    """Source rows of partition 0 of ``words``: (offset, value, barrier entry)."""
    fields = kafka_schema(barriers=True).fieldNames()
    when = datetime(2026, 11, 22, tzinfo=UTC)
    columns: dict[str, list[Any]] = {name: [] for name in fields}
    for offset, value, barrier in rows:
        row = {
            "key": None,
            "value": None if value is None else value.encode(),
            "topic": "words",
            "partition": 0,
            "offset": offset,
            "timestamp": when,
            "timestampType": 0 if barrier is None else -1,
            "cutline_barrier": None if barrier is None else json.dumps(barrier, sort_keys=True),
        }
        for name in fields:
            columns[name].append(row[name])
    return pa.RecordBatch.from_pydict(columns)


OUTPUT = pa.schema(
    [
        ("word", pa.string()),
        ("count", pa.int64()),
        ("added", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
    ]
)


def _run(
    tmp_path: Path, batches: list[pa.RecordBatch], monkeypatch: pytest.MonkeyPatch, **settings: Any
) -> tuple[list[dict[str, Any]], list[Any]]:
    sent: list[Any] = []
    monkeypatch.setattr(tasks, "send_reply", lambda settings, answered: sent.append(answered.reply))
    step = partition_step(WORD_COUNT, _settings(tmp_path, **settings), OUTPUT)
    rows = [row for batch in step(batches) for row in batch.to_pylist()]
    return rows, sent


def test_a_task_folds_its_records_from_the_version_where_its_batch_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    PartitionStateStore(tmp_path / "state").save("words", 0, 10, b'{"spark":2}')

    rows, sent = _run(tmp_path, [_rows([(10, "spark kafka", None), (12, "Spark", None)])], monkeypatch)

    assert sent == []
    assert [(r["word"], r["count"], r["offset"]) for r in rows] == [("kafka", 1, 10), ("spark", 4, 12)]
    assert PartitionStateStore(tmp_path / "state").load("words", 0, 13) == (13, b'{"kafka":1,"spark":4}')


def test_a_barrier_snapshots_the_state_at_the_start_of_its_batch_before_the_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    PartitionStateStore(tmp_path / "state").save("words", 0, 10, b'{"spark":2}')
    barrier = {**BARRIER, "location": (tmp_path / "chk-7").as_uri()}
    batch = _rows([(10, None, barrier), (10, "spark", None)])

    rows, sent = _run(tmp_path, [batch], monkeypatch)
    rerun_rows, resent = _run(tmp_path, [batch], monkeypatch)  # a retried task or a re-run batch

    [ack] = sent
    assert isinstance(ack, CheckpointAcknowledged) and ack.offsets == {"words:0": 10}
    assert _snapshot(tmp_path, "words-0", 10).read_bytes() == b'{"spark":2}'
    assert [(r["word"], r["count"]) for r in rows] == [("spark", 3)]
    [again] = resent
    assert rerun_rows == rows
    assert isinstance(again, CheckpointAcknowledged)
    assert (again.checkpoint_id, again.task_id, again.state, again.offsets) == (
        7,
        "words-0",
        ack.state,
        ack.offsets,
    )


def test_a_partition_without_state_snapshots_its_initial_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    barrier = {**BARRIER, "location": (tmp_path / "chk-7").as_uri()}

    rows, [ack] = _run(tmp_path, [_rows([(0, None, barrier)])], monkeypatch)

    assert rows == [] and isinstance(ack, CheckpointAcknowledged) and ack.offsets == {"words:0": 0}
    assert _snapshot(tmp_path, "words-0", 0).read_bytes() == b"{}"


def test_a_seeded_partition_without_state_declines_and_never_starts_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition whose state the job wrote, but which the task cannot find, declines its barrier,
    skips its records and leaves a tombstone, so a later batch declines too."""
    barrier = {**BARRIER, "location": (tmp_path / "chk-7").as_uri()}
    seeded = {"seeded": frozenset({"words-0"})}
    store = PartitionStateStore(tmp_path / "state")

    rows, [declined] = _run(
        tmp_path,
        [_rows([(10, None, barrier), (10, "spark", None), (11, "kafka", None)])],
        monkeypatch,
        **seeded,
    )
    store.save("words", 0, 10, b'{"spark":2}')  # the store shows up again, without what was skipped
    later = {**BARRIER, "id": 8, "location": (tmp_path / "chk-8").as_uri()}
    again, [declined_again] = _run(
        tmp_path, [_rows([(12, None, later), (12, "spark", None)])], monkeypatch, **seeded
    )

    assert rows == [] and again == []
    assert isinstance(declined, CheckpointDeclined) and isinstance(declined_again, CheckpointDeclined)
    assert (declined.checkpoint_id, declined.task_id, declined.reason) == (
        7,
        "words-0",
        "TASK_CHECKPOINT_FAILURE",
    )
    assert "no state of words[0] at or below offset 10" in declined.message
    assert "work_dir must be on storage every executor sees" in declined.message
    assert (declined_again.checkpoint_id, declined_again.message) == (8, declined.message)
    assert not (tmp_path / "chk-7").exists() and not (tmp_path / "chk-8").exists()
    with pytest.raises(StateLost, match="no state of words"):
        store.load("words", 0, 13)
    assert store.load("words", 0, 11) == (10, b'{"spark":2}')  # below the tombstone


def test_a_barrier_after_records_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    barrier = {**BARRIER, "location": (tmp_path / "chk-7").as_uri()}

    with pytest.raises(RuntimeError, match="barrier row of words\\[0\\] after its records"):
        _run(tmp_path, [_rows([(0, "spark", None), (1, None, barrier)])], monkeypatch)
