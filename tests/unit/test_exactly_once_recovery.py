"""What an exactly-once sink sends again when it resumes, and how it names and stages its output:
the pure core of events/task/exactly_once.py (docs/exactly-once.md)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from events.task.exactly_once import (
    Completion,
    ExactlyOnceSink,
    Marker,
    OutputRecord,
    RecoveryPlan,
    Staged,
    StagedOutput,
    StagedOutputCorrupted,
    decode_staged,
    encode_staged,
    find_staged,
    legacy_staged_name,
    marker_key,
    orphans_for,
    pending_through,
    recovery_plan,
    staged_name,
    transaction_timeout_problem,
    transactional_id,
)
from events.wire.topics import Topics
from spark_tasks.kafka_sink import columns_problem, output_columns, output_record


def test_a_completed_checkpoint_after_the_marker_is_committed_again() -> None:
    # given: checkpoint 3 committed; 4 staged and completed, its commit lost with the process
    marker = Marker(3, 1)
    staged = [Staged(4, 1)]
    completions = [Completion(3, 1), Completion(4, 1)]
    # when
    plan = recovery_plan(marker, staged, completions)
    # then
    assert plan == RecoveryPlan(commit=(4,), delete=())
    assert plan.marker == 4


def test_a_staged_file_up_to_the_marker_is_deleted_not_sent_twice() -> None:
    # given: the commit of 4 went through, the process died before deleting its staged file
    plan = recovery_plan(Marker(4, 1), [Staged(4, 1)], [Completion(4, 1)])
    # then
    assert plan == RecoveryPlan(commit=(), delete=(4,))
    assert plan.marker is None


def test_without_a_marker_every_completed_staged_checkpoint_is_committed_in_order() -> None:
    plan = recovery_plan(None, [Staged(6, 1), Staged(5, 1)], [Completion(5, 1), Completion(6, 1)])
    assert plan.commit == (5, 6)


def test_a_checkpoint_that_never_completed_is_deleted_unsent() -> None:
    # given: 5 completed, 6 was acked but the job restarted before the journal completed it
    plan = recovery_plan(Marker(5, 1), [Staged(6, 1)], [Completion(5, 1)], restored=5)
    # then: the job reads 6's input again from 5's cut
    assert plan == RecoveryPlan(commit=(), delete=(6,))


def test_an_aborted_checkpoint_goes_with_the_next_completed_one_of_its_attempt() -> None:
    # given: 5 aborted (another task declined), 6 completed: 6's cut covers 5's input too
    plan = recovery_plan(Marker(4, 1), [Staged(5, 1), Staged(6, 1)], [Completion(6, 1)])
    assert plan.commit == (5, 6)


def test_an_aborted_checkpoint_of_a_dead_attempt_is_not_covered_by_a_later_attempt() -> None:
    # given: attempt 1 staged 5 and died; attempt 2 restored 4 and completed 6
    plan = recovery_plan(Marker(4, 1), [Staged(5, 1), Staged(6, 2)], [Completion(4, 1), Completion(6, 2)])
    # then: 5's input was read again by attempt 2, whose output is in 6
    assert plan == RecoveryPlan(commit=(6,), delete=(5,))


def test_completions_after_the_restored_checkpoint_are_not_committed() -> None:
    # given: 7 completed too, but the job resumes from 6 (it reads 7's input again)
    plan = recovery_plan(Marker(5, 1), [Staged(6, 1), Staged(7, 1)], [Completion(6, 1), Completion(7, 1)], 6)
    assert plan == RecoveryPlan(commit=(6,), delete=(7,))


def test_a_rescale_to_fewer_tasks_gives_each_removed_task_one_owner() -> None:
    # given: attempt 1 ran task-0..task-3; attempt 2 runs task-0 and task-1
    previous = ["task-0", "task-1", "task-2", "task-3"]
    tasks = ["task-1", "task-0"]
    # when
    shares = {task: orphans_for(task, tasks, previous) for task in tasks}
    # then: task-2 and task-3 are recovered, each by one task, so their output is committed once
    assert shares == {"task-0": ("task-2",), "task-1": ("task-3",)}


def test_orphans_are_dealt_in_turn_when_there_are_more_than_tasks() -> None:
    previous = [f"task-{i}" for i in range(8)]
    shares = [orphans_for(task, ["task-0", "task-1"], previous) for task in ("task-0", "task-1")]
    assert shares == [("task-2", "task-4", "task-6"), ("task-3", "task-5", "task-7")]


def test_a_rescale_to_as_many_or_more_tasks_leaves_no_orphan() -> None:
    previous = ["task-0", "task-1"]
    assert orphans_for("task-0", ["task-0", "task-1"], previous) == ()
    assert orphans_for("task-3", [f"task-{i}" for i in range(4)], previous) == ()


def test_a_task_outside_the_attempts_tasks_is_refused_with_what_to_pass() -> None:
    with pytest.raises(ValueError, match="not one of the attempt's tasks.*pass every task"):
        orphans_for("task-9", ["task-0"], ["task-0", "task-1"])


def test_a_running_completion_sends_every_staged_checkpoint_up_to_it() -> None:
    assert pending_through([7, 5, 6], 6) == (5, 6)
    assert pending_through([7], 6) == ()


def test_transactional_ids_are_stable_and_never_shared_by_two_tasks() -> None:
    assert transactional_id("cutline", "wordcount", "counts", "task-0") == "cutline-wordcount-counts-task%2D0"
    assert transactional_id("p", "a-b", "c", "t") != transactional_id("p", "a", "b-c", "t")
    assert marker_key("wordcount", "counts", "task-0") == b"wordcount/counts/task-0"


def staged() -> StagedOutput:
    records = (
        OutputRecord("out", b"\x00\xffvalue", b"key", headers=(("h", b"\x01"),)),
        OutputRecord("out", None, None, partition=3),
    )
    return StagedOutput("job", "sink", "task-0", 4, 2, records)


def test_a_staged_file_reads_back_as_written() -> None:
    data = encode_staged(staged())
    back = decode_staged(data, "chk-4/task-0.out")
    assert staged().records == tuple(back.records)
    assert (back.checkpoint_id, back.attempt, back.task_id) == (4, 2, "task-0")


def test_a_staged_file_whose_records_changed_is_refused() -> None:
    data = encode_staged(staged()).replace(b"\x00\xffvalue", b"\x00\xffvaluf")
    with pytest.raises(StagedOutputCorrupted, match="sha256"):
        decode_staged(data, "chk-4/task-0.out")


def test_a_torn_staged_file_is_refused() -> None:
    data = encode_staged(staged())
    with pytest.raises(StagedOutputCorrupted):
        decode_staged(data[: len(data) // 2], "chk-4/task-0.out")


def test_two_sinks_of_one_task_stage_apart_and_each_finds_its_own(tmp_path: Path) -> None:
    # given: sinks "counts" and "alerts" of task-0 both staged checkpoint 4 in its location
    location = tmp_path / "chk-4"
    location.mkdir()
    for uid in ("counts", "alerts"):
        output = dataclasses.replace(staged(), uid=uid)
        (location / staged_name("task-0", uid)).write_bytes(encode_staged(output))
    # when: each looks for its own
    counts = find_staged({4: str(location)}, "task-0", "counts")
    alerts = find_staged({4: str(location)}, "task-0", "alerts")
    # then: two files, each read by its own sink only
    assert 2 == len(list(location.glob("*.out")))
    assert ("counts", "alerts") == (counts[4].uid, alerts[4].uid)


def test_a_name_reads_back_one_way_only() -> None:
    assert staged_name("a.b", "c") != staged_name("a", "b.c")


def test_a_staged_file_of_the_old_name_is_recovered_by_its_own_sink_only(tmp_path: Path) -> None:
    # given: a file staged before the uid was in the name, by sink "sink" (staged()'s)
    (tmp_path / legacy_staged_name("task-0")).write_bytes(encode_staged(staged()))
    # then: sink "sink" recovers it; another sink of the task does not take it for its own
    assert [4] == list(find_staged({4: str(tmp_path)}, "task-0", "sink"))
    assert {} == find_staged({4: str(tmp_path)}, "task-0", "other")


# ------------------------------------------------------------------ transaction.timeout.ms


def test_a_transaction_timeout_shorter_than_one_commit_is_refused_with_what_to_do() -> None:
    # when: the broker could abort a commit the sink waits 30 s for
    problem = transaction_timeout_problem(10_000, commit_timeout_ms=30_000)
    # then
    assert problem is not None
    assert "transaction.timeout.ms=10000" in problem and "at least 30000" in problem


def test_a_transaction_timeout_that_outlasts_one_commit_is_enough_whatever_the_checkpoint_interval() -> None:
    # a transaction spans one commit after the completion, never a checkpoint
    assert transaction_timeout_problem(60_000, commit_timeout_ms=30_000) is None


# ------------------------------------------------------------------ the Spark sink's rows


def test_a_row_of_the_kafka_formats_columns_becomes_one_record() -> None:
    row = {
        "key": "alpha",
        "value": b"3",
        "topic": "counts",
        "partition": 2,
        "headers": [{"key": "h", "value": b"v"}],
    }
    assert output_record(row, None) == OutputRecord("counts", b"3", b"alpha", 2, (("h", b"v"),))


def test_the_sinks_topic_is_used_instead_of_the_rows_as_in_spark() -> None:
    row = {"value": "x", "topic": "elsewhere"}
    assert output_record(row, "counts") == OutputRecord("counts", b"x", None, None, ())


def test_a_value_of_another_type_says_which_column() -> None:
    with pytest.raises(TypeError, match="'value' must be binary or string"):
        output_record({"value": 3, "topic": "t"}, None)


def test_a_batchs_arrow_columns_become_the_records_its_rows_would() -> None:
    # given: a batch as toArrow() gives it, string and binary columns, nulls, headers on one row
    pa = pytest.importorskip("pyarrow")
    header = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    table = pa.table(
        {
            "key": pa.array(["alpha", None]),
            "value": pa.array([b"3", b""]),
            "topic": pa.array(["counts", "other"]),
            "partition": pa.array([2, None], pa.int32()),
            "headers": pa.array([[{"key": "h", "value": b"v"}], None], header),
        }
    )
    # when
    records = output_columns(table, None)
    # then: what output_record makes of each row
    assert tuple(output_record(row, None) for row in table.to_pylist()) == tuple(records)
    assert ("counts", "counts") == tuple(r.topic for r in output_columns(table, "counts"))


def test_a_value_column_of_another_type_says_which_column_in_a_batch_too() -> None:
    pa = pytest.importorskip("pyarrow")
    with pytest.raises(TypeError, match="'value' must be binary or string"):
        output_columns(pa.table({"value": pa.array([3]), "topic": pa.array(["t"])}), None)


def test_a_dataframe_without_value_or_topic_is_refused_with_what_to_do() -> None:
    assert "no 'value' column" in (columns_problem(["key", "topic"], None) or "")
    assert "add one or give the sink a topic" in (columns_problem(["key", "value"], None) or "")
    assert columns_problem(["key", "value"], "counts") is None


def test_a_sink_refuses_a_transaction_timeout_shorter_than_its_commit_before_it_does_anything() -> None:
    # when: the sink is made (no broker at this address: the check comes first)
    with pytest.raises(ValueError, match=r"sink counts of wc/task-0: transaction.timeout.ms=5000 is shorter"):
        ExactlyOnceSink(
            "127.0.0.1:1", "wc", "task-0", Topics("cutline."), uid="counts",
            producer_extra={"transaction.timeout.ms": 5000}, timeout=30.0,
        )  # fmt: skip


@pytest.mark.parametrize(
    "record",
    [
        OutputRecord("counts", b"3", b"alpha", 2, (("h", b"v"), ("x", b""))),
        OutputRecord('a "quoted" tôpic', None, None, None, ()),
        OutputRecord("t", b"", b"\x00\xff", 0, ()),
    ],
)
def test_a_staged_record_reads_back_as_sent(record: OutputRecord) -> None:
    # when
    output = StagedOutput("wc", "counts", "task-0", 1, 1, (record,))
    back = decode_staged(encode_staged(output))
    # then: every field, None and empty bytes kept apart
    assert (record,) == tuple(back.records)


def staged_file(version: int, body: bytes, records: int) -> bytes:
    header = {
        "format": "cutline-staged-output", "version": version, "job": "wc", "uid": "counts",
        "task": "task-0", "checkpoint": 1, "attempt": 1, "records": records,
        "sha256": hashlib.sha256(body).hexdigest(),
    }  # fmt: skip
    return json.dumps(header).encode() + b"\n" + body


def test_a_file_staged_in_version_1_still_reads() -> None:
    # given: version 1's JSON lines with base64 bytes (staged before the Arrow format)
    lines = (
        b'{"topic":"counts","partition":2,"key":"YWxwaGE=","value":"Mw==","headers":[["h","dg=="]]}\n'
        b'{"topic":"t","partition":null,"key":null,"value":null,"headers":[]}\n'
    )
    # when
    back = decode_staged(staged_file(1, lines, 2), "chk-1/task-0.out")
    # then
    expected = (OutputRecord("counts", b"3", b"alpha", 2, (("h", b"v"),)), OutputRecord("t", None))
    assert expected == tuple(back.records)


def test_a_staged_file_of_an_unknown_version_is_refused_with_what_to_do() -> None:
    with pytest.raises(StagedOutputCorrupted, match="version 9; this cutline reads versions 1, 2: recover"):
        decode_staged(staged_file(9, b"", 0), "chk-1/task-0.out")


def test_a_staged_file_whose_record_count_differs_from_its_header_is_refused() -> None:
    body = encode_staged(staged()).partition(b"\n")[2]
    with pytest.raises(StagedOutputCorrupted, match="holds 2 records, not 3"):
        decode_staged(staged_file(2, body, 3), "chk-4/task-0.out")
