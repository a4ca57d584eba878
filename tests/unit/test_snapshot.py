"""Coordinator snapshots (coordinator/core/snapshot.py, docs/design.md, "Ownership and fencing"): exact round
trips, the frame, bad bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.decider import decide, evolve
from coordinator.core.snapshot import (
    SCHEMA_NAME,
    PartitionSnapshot,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
    snapshot_schema,
    trigger_key,
)
from coordinator.core.state import (
    JobState,
    PendingCheckpoint,
    Reason,
    Scheduler,
    frozen_map,
    initial_state,
    pending_checkpoint,
    with_tasks,
)
from coordinator.core.stats import CheckpointEntry, CheckpointStats, TaskEntry, track
from coordinator.core.testing import ack, config, decline, differences, request, running, tick
from events.wire.codec import HEADER_SIZE, MAGIC, SCHEMAS_DIR, DecodeError, default_codec
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointKind,
    CheckpointRequestQueued,
    CheckpointRestored,
    CheckpointTriggered,
    ExecutionState,
    JobStatus,
    StateHandle,
    TaskAcknowledged,
)
from events.wire.writer_schema import schema_fingerprint

JOB = "wordcount"
T0 = 1_767_225_600_000
ROOT = "file:///var/lib/cutline/checkpoints"
TASKS = ("words-0", "words-1", "words-2")
CONFIG = config(
    interval_ms=1_000,
    location=ROOT,
    timeout_ms=60_000,
    min_pause_ms=500,
    max_concurrent=2,
    retained=2,
    inline_threshold_bytes=64,
)
HISTORY = SCHEMAS_DIR / "history"


def handle(checkpoint_id: int, task: str) -> StateHandle:
    """A file's handle, but the last task's small state rides inline (its bytes are in the snapshot)."""
    uri = f"{ROOT}/{JOB}/chk-{checkpoint_id}/{task}.snapshot"
    if task == TASKS[-1]:
        data = f"{task} at {checkpoint_id}".encode()
        return StateHandle(uri, len(data), hashlib.sha256(data).hexdigest(), data)
    return StateHandle(uri, 1_000 + checkpoint_id, "ab" * 32)


def triggered(checkpoint_id: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> CheckpointTriggered:
    return CheckpointTriggered(
        job_id=JOB,
        checkpoint_id=checkpoint_id,
        attempt=2,
        kind=kind,
        timestamp_ms=T0 + checkpoint_id,
        location=f"{ROOT}/{JOB}/chk-{checkpoint_id}",
        tasks=TASKS,
        deadline_ms=T0 + 60_000,
        periodic=kind is CheckpointKind.CHECKPOINT,
        request_id=None if kind is CheckpointKind.CHECKPOINT else f"req-{checkpoint_id}",
        next_trigger_ms=T0 + 1_000 if kind is CheckpointKind.CHECKPOINT else None,
    )


def acked(checkpoint_id: int, task: str, with_state: bool = True) -> TaskAcknowledged:
    return TaskAcknowledged(
        job_id=JOB,
        checkpoint_id=checkpoint_id,
        attempt=2,
        task_id=task,
        timestamp_ms=T0 + checkpoint_id + 10,
        state=handle(checkpoint_id, task) if with_state else None,
        offsets={f"words:{TASKS.index(task)}": 1_000 * checkpoint_id} if with_state else {},
        metrics={"records": 5_000_000_000, "lag_ms": -3} if with_state else {},
    )


def completed(checkpoint_id: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> CheckpointCompleted:
    return CheckpointCompleted(
        job_id=JOB,
        checkpoint_id=checkpoint_id,
        kind=kind,
        timestamp_ms=T0 + checkpoint_id + 20,
        duration_ms=20,
        handles={task: handle(checkpoint_id, task) for task in TASKS},
        size_bytes=3 * (1_000 + checkpoint_id),
        offsets={f"words:{i}": 1_000 * checkpoint_id for i in range(len(TASKS))},
        attempt=2,
        location=f"{ROOT}/{JOB}/chk-{checkpoint_id}",
    )


def queued(kind: CheckpointKind, periodic: bool, request_id: str | None) -> CheckpointRequestQueued:
    return CheckpointRequestQueued(
        job_id=JOB,
        kind=kind,
        periodic=periodic,
        timestamp_ms=T0 + 50,
        request_id=request_id,
        target="file:///savepoints/x" if kind is CheckpointKind.SAVEPOINT else None,
        next_trigger_ms=T0 + 2_000 if periodic else None,
    )


def busy_state() -> JobState:
    """A running job with every part of its state in use: pending with acks, queue, history."""
    return JobState(
        job_id=JOB,
        status=JobStatus.RUNNING,
        attempt=2,
        **with_tasks(TASKS),
        config=CONFIG,
        tasks_not_running=frozen_map({"words-2": ExecutionState.DEPLOYING, "words-0": ExecutionState.FAILED}),
        scheduler=Scheduler(T0 + 1_000),
        next_checkpoint_id=9,
        # out of id order on purpose: the order of a mapping is part of the state
        pending=frozen_map(
            {
                8: pending_checkpoint(
                    triggered(8, CheckpointKind.SAVEPOINT), frozen_map({"words-1": acked(8, "words-1")})
                ),
                7: pending_checkpoint(
                    triggered(7),
                    frozen_map({"words-2": acked(7, "words-2"), "words-0": acked(7, "words-0", False)}),
                ),
                6: pending_checkpoint(triggered(6)),
            }
        ),
        queue=(
            queued(CheckpointKind.SAVEPOINT, False, "req-9"),
            queued(CheckpointKind.CHECKPOINT, False, "req-10"),
            queued(CheckpointKind.CHECKPOINT, True, None),
        ),
        completed=(completed(4), completed(5)),
        latest_savepoint=completed(3, CheckpointKind.SAVEPOINT),
        last_completion_ms=T0 + 25,
        last_completed_id=5,
        failures=2,
        restored=CheckpointRestored(JOB, 2, 2, T0 - 5, f"{ROOT}/{JOB}/chk-2"),
    )


def busy_stats() -> CheckpointStats:
    """Statistics with every field set: counts, windows, each kind of latest, a history."""
    done = CheckpointEntry(
        id=5,
        status="COMPLETED",
        is_savepoint=False,
        trigger_timestamp=T0 + 5,
        num_subtasks=3,
        num_acknowledged_subtasks=3,
        latest_ack_timestamp=T0 + 25,
        end_to_end_duration=20,
        state_size=3_015,
        external_path=f"{ROOT}/{JOB}/chk-5",
    )
    savepoint = dataclasses.replace(done, id=3, is_savepoint=True, external_path="file:///savepoints/x")
    failed = CheckpointEntry(
        id=4,
        status="FAILED",
        is_savepoint=False,
        trigger_timestamp=T0 + 4,
        num_subtasks=3,
        num_acknowledged_subtasks=1,
        end_to_end_duration=60_000,
        failure_timestamp=T0 + 60_004,
        failure_reason="CHECKPOINT_EXPIRED",
        failure_message="expired before words-1, words-2 acknowledged",
    )
    running_entry = CheckpointEntry(
        id=6, status="IN_PROGRESS", is_savepoint=False, trigger_timestamp=T0 + 6, num_subtasks=3
    )
    return CheckpointStats(
        total=6,
        in_progress=1,
        completed=3,
        failed=1,
        restored=1,
        durations=(20, 21, 20),
        sizes=(3_012, 3_013, 3_015),
        latest_completed=done,
        latest_savepoint=savepoint,
        latest_failed=failed,
        latest_restored=CheckpointRestored(JOB, 2, 2, T0 - 5, None),
        history=(running_entry, done, failed, savepoint),
    )


def snapshot_of(
    states: dict[str, JobState], stats: dict[str, CheckpointStats] | None = None, **overrides: Any
) -> PartitionSnapshot:
    values: dict[str, Any] = {
        "partition": 3,
        "epoch": 7,
        "journal_offset": 1_234,
        "positions": {"cutline.acks:3": 99, "cutline.job-status:3": 4},
        "trigger_epochs": {trigger_key(j, c): 7 for j, s in states.items() for c in s.pending},
        "states": states,
        "stats": stats or {},
        "timestamp_ms": T0 + 99,
    }
    values.update(overrides)
    return PartitionSnapshot(**values)


def round_trip(snapshot: PartitionSnapshot) -> PartitionSnapshot:
    return decode_snapshot(encode_snapshot(snapshot))


def decided(*commands: Any) -> tuple[JobState, CheckpointStats | None]:
    """The state and statistics the coordinator holds after deciding ``commands`` (in memory)."""
    state, stats = initial_state(commands[0].job_id), None
    for command in commands:
        for event in decide(state, command):
            stats = track(stats, state, event)
            state = evolve(state, event)
    return state, stats


class TestRoundTrip:
    def test_an_empty_partition_comes_back(self) -> None:
        """A snapshot of a partition with no jobs and no journal yet decodes to itself."""
        snapshot = snapshot_of({}, journal_offset=-1, positions={}, trigger_epochs={})

        assert [] == differences(snapshot, round_trip(snapshot))

    def test_a_busy_job_comes_back_exactly(self) -> None:
        """Pending checkpoints with acks, the queue, completed, savepoint, restore and failures survive."""
        snapshot = snapshot_of({JOB: busy_state()}, {JOB: busy_stats()})

        decoded = round_trip(snapshot)

        assert snapshot == decoded
        assert [] == differences(snapshot, decoded)

    def test_a_job_nothing_is_known_about_comes_back(self) -> None:
        """The initial state (no status, no config, no scheduler) stays all None and empty."""
        snapshot = snapshot_of({"new-job": initial_state("new-job")}, {"new-job": CheckpointStats()})

        assert [] == differences(snapshot, round_trip(snapshot))

    @pytest.mark.parametrize(
        "scheduler",
        [None, Scheduler(None), Scheduler(T0 + 1_000)],
        ids=["stopped", "manual-only", "periodic"],
    )
    def test_a_stopped_scheduler_is_not_one_without_a_next_trigger(self, scheduler: Scheduler | None) -> None:
        """No scheduler, a scheduler with periodic checkpoints off, and a timed one stay distinct."""
        state = dataclasses.replace(busy_state(), scheduler=scheduler)

        decoded = round_trip(snapshot_of({JOB: state})).states[JOB]

        assert [] == differences(scheduler, decoded.scheduler)

    def test_a_stopped_job_with_every_task_down_comes_back(self) -> None:
        """A failed job: status, no scheduler, no queue, every task not running with its state."""
        state = dataclasses.replace(
            busy_state(),
            status=JobStatus.FAILING,
            scheduler=None,
            queue=(),
            pending=frozen_map(),
            tasks_not_running=frozen_map(zip(TASKS, list(ExecutionState)[:3], strict=True)),
        )

        assert [] == differences(state, round_trip(snapshot_of({JOB: state})).states[JOB])

    def test_jobs_positions_and_trigger_epochs_keep_their_order(self) -> None:
        """Many jobs, positions and trigger epochs come back with the same keys in the same order."""
        states = {f"job-{i}": initial_state(f"job-{i}") for i in (3, 1, 2)}
        snapshot = snapshot_of(
            states,
            positions={"b:1": 1, "a:0": 0, "c:9": 2**40},
            trigger_epochs={trigger_key("job-3", 9): 2, trigger_key("job-1", 1): 1},
        )

        decoded = round_trip(snapshot)

        assert [] == differences(snapshot, decoded)
        assert ["job-3", "job-1", "job-2"] == list(decoded.states)

    def test_a_decided_state_comes_back_equal(self) -> None:
        """What the decider holds after real commands decodes equal to it, statistics included."""
        state, stats = decided(
            running(job_id=JOB, tasks=TASKS, cfg=CONFIG, at=0),
            tick(1_000, job_id=JOB),
            *[ack(1, t, job_id=JOB, at=1_010, state=handle(1, t)) for t in TASKS],
            tick(2_000, job_id=JOB),
            decline(2, "words-1", job_id=JOB, at=2_001),
            request(CheckpointKind.SAVEPOINT, job_id=JOB, request_id="sp", at=2_002),
            tick(3_000, job_id=JOB),
            ack(3, "words-0", job_id=JOB, at=3_010, offsets={"words:0": 7}),
        )
        assert state.pending and state.completed and stats is not None

        decoded = round_trip(snapshot_of({JOB: state}, {JOB: stats}))

        assert state == decoded.states[JOB]
        assert stats == decoded.stats[JOB]

    def test_a_failure_reason_enum_comes_back_as_its_value(self) -> None:
        """A Reason held in memory decodes as the plain string the journal gives: equal, not identical."""
        aborted = CheckpointAborted(JOB, 1, T0, Reason.CHECKPOINT_EXPIRED, "late", counts_as_failure=True)
        before = evolve(initial_state(JOB), triggered(1))
        in_memory = track(track(None, initial_state(JOB), triggered(1)), before, aborted)

        decoded = round_trip(snapshot_of({}, {JOB: in_memory})).stats[JOB]

        assert in_memory == decoded
        assert decoded.latest_failed is not None
        assert str is type(decoded.latest_failed.failure_reason)

    def test_the_task_rows_of_the_statistics_stay_in_memory(self) -> None:
        """A snapshot holds no per-task rows (Flink keeps its subtask statistics in memory only): a
        decoded job has none, and its statistics are still equal to those it was made from."""
        with_rows = dataclasses.replace(
            busy_stats(), task_details={5: (TaskEntry("words-0", T0 + 25, 1_005, "file"),)}
        )

        decoded = round_trip(snapshot_of({}, {JOB: with_rows})).stats[JOB]

        assert {} == decoded.task_details
        assert with_rows == decoded

    def test_the_task_sets_are_built_again_from_the_tasks(self) -> None:
        """A snapshot holds no task set; a decoded state and its pending checkpoints get theirs back."""
        decoded = round_trip(snapshot_of({JOB: busy_state()})).states[JOB]

        assert frozenset(TASKS) == decoded.task_ids
        assert all(frozenset(TASKS) == p.task_ids for p in decoded.pending.values())


class TestFrame:
    def test_a_snapshot_is_a_single_object_frame_of_its_schema(self) -> None:
        """C3 01, the CRC-64-AVRO fingerprint of cutline.CoordinatorSnapshot, then the body."""
        frame = encode_snapshot(snapshot_of({JOB: busy_state()}))

        assert MAGIC == frame[:2]
        assert schema_fingerprint(snapshot_schema()) == frame[2:HEADER_SIZE]

    def test_the_states_hold_the_journal_record_types(self) -> None:
        """Events inside the snapshot schema are the wire records, defined exactly as the codec has them."""
        in_snapshot = expanded(snapshot_schema())

        for name in (
            "CheckpointTriggered",
            "TaskAcknowledged",
            "CheckpointCompleted",
            "CheckpointRequestQueued",
            "CheckpointRestored",
        ):
            on_the_wire = expanded(default_codec().registry.current(name).parsed)
            assert on_the_wire[f"cutline.{name}"] == in_snapshot[f"cutline.{name}"]
        assert "cutline.CheckpointConfig" in in_snapshot

    def test_a_pending_checkpoint_under_another_key_is_refused(self) -> None:
        """A state folding cannot give (checkpoint 6 kept as 5) raises rather than decode differently."""
        state = dataclasses.replace(busy_state(), pending=frozen_map({5: pending_checkpoint(triggered(6))}))

        with pytest.raises(ValueError, match="pending checkpoint 6 is kept under key 5"):
            encode_snapshot(snapshot_of({JOB: state}))

    def test_an_ack_under_another_task_is_refused(self) -> None:
        """An ack kept under a key other than its task raises rather than decode differently."""
        state = dataclasses.replace(
            busy_state(),
            pending=frozen_map(
                {6: pending_checkpoint(triggered(6), frozen_map({"words-0": acked(6, "words-1")}))}
            ),
        )

        with pytest.raises(ValueError, match="ack of 'words-1' is kept under key 'words-0'"):
            encode_snapshot(snapshot_of({JOB: state}))


def expanded(schema: Any) -> dict[str, Any]:
    """Every named type of a self-contained schema, by full name, with the types it uses inlined."""
    named: dict[str, Any] = {}

    def collect(node: Any) -> None:
        if isinstance(node, list):
            for branch in node:
                collect(branch)
        elif isinstance(node, dict):
            if node.get("type") in ("record", "enum", "fixed"):
                named[node["name"]] = node
            for f in node.get("fields", []):
                collect(f["type"])
            for key in ("items", "values"):
                if key in node:
                    collect(node[key])

    def inline(node: Any) -> Any:
        if isinstance(node, str):
            return inline(named[node]) if node in named else node
        if isinstance(node, list):
            return [inline(branch) for branch in node]
        if isinstance(node, dict):
            out = {k: inline(v) if k in ("items", "values") else v for k, v in node.items()}
            if "fields" in node:
                out["fields"] = [{**f, "type": inline(f["type"])} for f in node["fields"]]
            return out
        return node

    collect(schema)
    return {name: inline(node) for name, node in named.items()}


GOOD = encode_snapshot(snapshot_of({JOB: busy_state()}, {JOB: busy_stats()}))
BAD_FRAMES = [
    pytest.param(b"", "TRUNCATED_FRAME", id="empty"),
    pytest.param(GOOD[:7], "TRUNCATED_FRAME", id="cut in the header"),
    pytest.param(b"{}", "BAD_MAGIC", id="json"),
    pytest.param(b"\x00" + GOOD[1:], "BAD_MAGIC", id="bad magic"),
    pytest.param(GOOD[:-1], "BODY_MISMATCH", id="cut in the body"),
    pytest.param(GOOD[: len(GOOD) // 2], "BODY_MISMATCH", id="half a body"),
    pytest.param(GOOD + b"\x00", "BODY_MISMATCH", id="a byte after the body"),
    pytest.param(GOOD[:2] + bytes(8) + GOOD[HEADER_SIZE:], "UNKNOWN_SCHEMA", id="unknown fingerprint"),
]


class TestMalformed:
    @pytest.mark.parametrize(("frame", "reason"), BAD_FRAMES)
    def test_bytes_that_are_not_a_snapshot_raise_snapshot_error(self, frame: bytes, reason: str) -> None:
        """Each kind of bad frame raises SnapshotError with the codec's reason code."""
        with pytest.raises(SnapshotError) as raised:
            decode_snapshot(frame)

        assert reason == raised.value.reason

    def test_a_journal_record_is_named_as_what_it_is(self) -> None:
        """A frame of another cutline record is refused, saying which record it holds."""
        frame = default_codec().encode(triggered(1))

        with pytest.raises(SnapshotError, match="holds a cutline.CheckpointTriggered"):
            decode_snapshot(frame)

    def test_snapshot_error_is_a_decode_error(self) -> None:
        """Whoever handles undecodable input (a ValueError with a reason) handles a bad snapshot too."""
        assert issubclass(SnapshotError, DecodeError)
        assert issubclass(SnapshotError, ValueError)
        assert "BAD_SNAPSHOT" == SnapshotError("x").reason

    @settings(max_examples=200, deadline=None)
    @given(body=st.binary(max_size=200))
    def test_garbage_after_a_snapshot_header_raises_nothing_but_snapshot_error(self, body: bytes) -> None:
        """The snapshot's own header followed by random bytes decodes or raises SnapshotError."""
        try:
            decoded = decode_snapshot(GOOD[:HEADER_SIZE] + body)
        except SnapshotError:
            return
        assert isinstance(decoded, PartitionSnapshot)


SCHEMA_CLASSES = [
    pytest.param(PartitionSnapshot, SCHEMA_NAME, id="PartitionSnapshot"),
    pytest.param(JobState, "JobState", id="JobState"),
    pytest.param(PendingCheckpoint, "PendingCheckpoint", id="PendingCheckpoint"),
    pytest.param(Scheduler, "Scheduler", id="Scheduler"),
    pytest.param(CheckpointStats, "CheckpointStats", id="CheckpointStats"),
    pytest.param(CheckpointEntry, "CheckpointEntry", id="CheckpointEntry"),
]


def avsc(name: str) -> dict[str, Any]:
    return dict(json.loads((SCHEMAS_DIR / f"cutline.{name}.avsc").read_text()))


class TestSchema:
    @pytest.mark.parametrize(("cls", "name"), SCHEMA_CLASSES)
    def test_a_state_class_has_exactly_the_fields_of_its_schema_in_order(self, cls: type, name: str) -> None:
        """A field added to a state class but not to its schema (or the reverse) fails here, not later.
        A derived field (a task set, built again from the tasks on decoding) is not in the schema,
        nor a transient one (the statistics' task rows, kept in the worker's memory only)."""
        kept = [
            f.name
            for f in dataclasses.fields(cls)
            if not f.metadata.get("derived") and not f.metadata.get("transient")
        ]
        assert kept == [f["name"] for f in avsc(name)["fields"]]

    @pytest.mark.parametrize(("cls", "name"), SCHEMA_CLASSES)
    def test_every_avro_default_is_the_python_default(self, cls: type, name: str) -> None:
        """A field the schema defaults has the same default in the state class (containers as in Avro)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for avro_field in avsc(name)["fields"]:
            if "default" not in avro_field:
                continue
            f = fields[avro_field["name"]]
            python_default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            if isinstance(python_default, Mapping) and isinstance(avro_field["default"], dict):
                python_default = dict(python_default)
            if isinstance(python_default, tuple):
                python_default = list(python_default)
            if isinstance(python_default, Mapping) and isinstance(avro_field["default"], list):
                python_default = list(python_default.values())
            assert avro_field["default"] == python_default, f"{name}.{f.name}"

    def test_the_current_snapshot_schema_is_kept_in_history(self) -> None:
        """Every snapshot schema a version writes stays in schemas/history, so later versions read it."""
        fp = schema_fingerprint(snapshot_schema()).hex()
        path = HISTORY / f"cutline.{SCHEMA_NAME}.{fp}.avsc"

        assert path.is_file(), (
            f"the snapshot schema changed (a record inside it did, or a state class); keep it so that "
            f"snapshots this version writes stay readable after the next change:\n  uv run python -c "
            f"'import json; from coordinator.core.snapshot import snapshot_schema; "
            f"print(json.dumps(snapshot_schema(), indent=2))' > {path.relative_to(SCHEMAS_DIR.parent)}"
        )
        assert fp == schema_fingerprint(json.loads(path.read_text())).hex()

    @pytest.mark.parametrize(
        "path", sorted(HISTORY.glob(f"cutline.{SCHEMA_NAME}.*.avsc")), ids=lambda p: p.name.split(".")[2]
    )
    def test_every_kept_snapshot_schema_is_readable_by_the_current_one(self, path: Any) -> None:
        """By Avro's resolution rules, the current schema reads a snapshot written with any kept one."""
        checker = ReaderWriterCompatibilityChecker()

        result = checker.get_compatibility(
            avro.schema.parse(json.dumps(snapshot_schema())), avro.schema.parse(path.read_text())
        )

        assert SchemaCompatibilityType.compatible == result.compatibility, result.messages
