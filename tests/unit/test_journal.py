"""Journal files (coordinator/replay/journal.py) and the traffic simulation that fills them."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import itertools
import random
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import avro.datafile
import avro.io
import fastavro
import pytest

from coordinator.core.decider import _replace_state, fold_jobs
from coordinator.core.invariants import first_violation
from coordinator.replay import journal
from coordinator.replay.journal import (
    _CLASSES,
    JOURNAL_SCHEMA_NAME,
    FileTally,
    JournalEntry,
    JournalFileError,
    _open_reader,
    journal_schema,
    read_journal,
    read_journal_events,
    read_journal_share,
    write_journal,
)
from coordinator.simulation.traffic import START_MS, Rates, simulate, simulate_steps
from events.wire.codec import SCHEMAS_DIR, _from_avro_fields, from_avro, to_avro
from events.wire.records import (
    JOURNAL_RECORDS,
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointRequestQueued,
    CheckpointRestored,
    CheckpointTriggered,
    ExecutionState,
    JobFailedPermanently,
    JobHeartbeatRecorded,
    JobRestartScheduled,
    JobStatus,
    JournalEvent,
    SchedulerStarted,
    SchedulerStopped,
    StateHandle,
    TaskAcknowledged,
    TaskStatusRecorded,
    TriggerRejected,
)

LOCATION = "file:///tmp/cutline/checkpoints"
HANDLE = StateHandle(f"{LOCATION}/job-1/chk-7/t0.state", 1234, "ab" * 32)
INLINE = StateHandle(f"{LOCATION}/job-1/chk-7/t1.state", 4, "cd" * 32, b"\x00\xffab")
"""A handle with its (small) state inline; bytes 0x00 and 0xff on purpose."""


def one_of_each() -> list[JournalEvent]:
    """One event of every journal record type, optional fields filled in."""
    config = CheckpointConfig(500, LOCATION, 2000, 100, 2, 3, 2, inline_threshold_bytes=64)
    return [
        SchedulerStarted("job-1", 2, START_MS, ("t0", "t1"), config, START_MS + 250),
        SchedulerStopped("job-1", 2, START_MS + 1, JobStatus.FAILING, "boom"),
        TaskStatusRecorded("job-1", "t1", 2, ExecutionState.FAILED, START_MS + 2, "OOM"),
        CheckpointRequestQueued(
            "job-1", CheckpointKind.SAVEPOINT, False, START_MS + 3, "sp-1", "file:///sp", START_MS + 9
        ),
        CheckpointTriggered(
            "job-1",
            7,
            2,
            CheckpointKind.CHECKPOINT,
            START_MS + 4,
            f"{LOCATION}/job-1/chk-7",
            ("t0", "t1"),
            START_MS + 2004,
            periodic=True,
            request_id="r-1",
            next_trigger_ms=START_MS + 504,
            inline_limit_bytes=64,
        ),  # fmt: skip
        TaskAcknowledged("job-1", 7, 2, "t0", START_MS + 5, HANDLE, {"in:0": 42}, {"sync_ms": 3}),
        CheckpointCompleted(
            "job-1",
            7,
            CheckpointKind.CHECKPOINT,
            START_MS + 6,
            2,
            {"t0": HANDLE, "t1": INLINE},
            1238,
            {"in:0": 42},
            attempt=2,
            location=f"{LOCATION}/job-1/chk-7",
        ),  # fmt: skip
        CheckpointAborted("job-1", 8, START_MS + 7, "CHECKPOINT_DECLINED", "disk full", "t1", True),
        TriggerRejected(
            "job-1",
            "MINIMUM_TIME_BETWEEN_CHECKPOINTS",
            None,
            START_MS + 8,
            CheckpointKind.CHECKPOINT,
            True,
            "min pause",
            START_MS + 100,
        ),  # fmt: skip
        CheckpointFailureThresholdExceeded("job-1", 8, START_MS + 9, 4, 3, "CHECKPOINT_EXPIRED"),
        CheckpointRestored("job-1", 7, 3, START_MS + 10, f"{LOCATION}/job-1/chk-7"),
        JobHeartbeatRecorded("job-1", 3, START_MS + 11, START_MS + 50_011),
        JobRestartScheduled(
            "job-1", 4, START_MS + 12, 1_000, "no heartbeat", 1, 1_000, 7, f"{LOCATION}/job-1/chk-7"
        ),
        JobFailedPermanently("job-1", 4, START_MS + 13, "restart-strategy none", "boom"),
    ]


def without_inline(events: list[JournalEvent]) -> list[JournalEvent]:
    """``events`` as a writer of schema v3 had them: no inline state, no inline limits."""
    out: list[JournalEvent] = []
    for e in events:
        if isinstance(e, SchedulerStarted):
            e = replace(e, config=replace(e.config, inline_threshold_bytes=0))
        elif isinstance(e, CheckpointTriggered):
            e = replace(e, inline_limit_bytes=0)
        elif isinstance(e, CheckpointCompleted):
            e = replace(e, handles={t: h for t, h in e.handles.items() if h.inline is None})
        out.append(e)
    return out


def simulated(count: int, seed: int = 1, jobs: int = 3) -> list[JournalEvent]:
    return list(itertools.islice(simulate(random.Random(seed), jobs=jobs), count))


class TestRoundTrip:
    def test_every_event_type_and_position_survives(self, tmp_path: Path) -> None:
        """Every journal record type, with its partition and offset, reads back equal."""
        entries = [JournalEntry(e, partition=i % 3, offset=100 + i) for i, e in enumerate(one_of_each())]
        path = tmp_path / "journal.avro"

        written = write_journal(path, entries)

        assert set(JOURNAL_RECORDS) == {type(e.event) for e in entries}
        assert len(entries) == written
        assert entries == list(read_journal(path))

    def test_bare_events_get_their_index_as_offset(self, tmp_path: Path) -> None:
        """An event without a position gets partition -1 and its index as offset."""
        events = one_of_each()
        path = tmp_path / "journal.avro"
        write_journal(path, [JournalEntry(events[0], 5, 77), *events[1:]])

        positions = [(e.partition, e.offset) for e in read_journal(path)]

        assert [(5, 77)] + [(-1, i) for i in range(1, len(events))] == positions

    @pytest.mark.parametrize("codec", ["null", "deflate"])
    def test_simulated_journal_survives(self, tmp_path: Path, codec: str) -> None:
        """A simulated journal reads back event for event, with either block codec."""
        events = simulated(3000)
        path = tmp_path / "journal.avro"

        write_journal(path, events, codec=codec)  # type: ignore[arg-type]

        assert events == [event for event, _, _ in read_journal_events(path)]

    def test_empty_journal(self, tmp_path: Path) -> None:
        """A journal with no events is a valid, empty file."""
        path = tmp_path / "journal.avro"

        assert 0 == write_journal(path, [])
        assert [] == list(read_journal(path))


READERS = ["fastavro", *(["cavro"] if importlib.util.find_spec("cavro") else [])]
"""The Avro libraries that can decode journal records here (cavro has wheels for 3.11 and 3.12)."""


class TestAvroReaders:
    """cavro (where installed) and fastavro decode a journal file to the same entries."""

    @pytest.mark.parametrize("reader", READERS)
    @pytest.mark.parametrize("codec", ["null", "deflate"])
    def test_every_record_type_reads_back_equal(self, tmp_path: Path, reader: str, codec: str) -> None:
        """Every record type with its optional fields set, and a simulated journal, read back equal."""
        entries = [
            *(JournalEntry(e, partition=i % 3, offset=100 + i) for i, e in enumerate(one_of_each())),
            *(JournalEntry(e, partition=1, offset=200 + i) for i, e in enumerate(simulated(3000))),
        ]
        path = tmp_path / "journal.avro"
        write_journal(path, entries, codec=codec)  # type: ignore[arg-type]

        read = [JournalEntry(*entry) for entry in read_journal_events(path, reader=reader)]  # type: ignore[arg-type]

        assert entries == read

    @pytest.mark.parametrize("reader", READERS)
    def test_a_truncated_file_is_damaged_after_the_entries_it_has(self, tmp_path: Path, reader: str) -> None:
        """Cut short, a file yields a prefix of its entries, then says how many."""
        events = simulated(5000)
        path = tmp_path / "journal.avro"
        write_journal(path, events)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        read: list[JournalEvent] = []

        with pytest.raises(JournalFileError, match=r"damaged after \d+ entries") as raised:
            for event, _, _ in read_journal_events(path, reader=reader):  # type: ignore[arg-type]
                read.append(event)

        assert 0 < len(read) < len(events)
        assert events[: len(read)] == read
        assert f"damaged after {len(read)} entries" in str(raised.value)

    @pytest.mark.skipif(
        importlib.util.find_spec("cavro") is None, reason="cavro has no wheel for this Python"
    )
    def test_cavro_is_the_default_where_it_is_installed(self) -> None:
        assert journal._cavro_chosen(None)

    def test_without_cavro_fastavro_reads_and_asking_for_cavro_says_so(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Where cavro is not installed (Python 3.13 on), fastavro reads; reader='cavro' is refused."""
        events = simulated(500)
        path = tmp_path / "journal.avro"
        write_journal(path, events)
        monkeypatch.setattr(journal, "_cavro", lambda: None)

        assert not journal._cavro_chosen(None)
        assert events == [event for event, _, _ in read_journal_events(path)]
        with pytest.raises(ValueError, match="cavro is not installed here; use reader='fastavro'"):
            read_journal_events(path, reader="cavro")

    def test_an_unknown_reader_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "journal.avro"
        write_journal(path, simulated(10))

        with pytest.raises(ValueError, match="read with 'cavro' or 'fastavro'"):
            read_journal_events(path, reader="avro")  # type: ignore[arg-type]

    def test_a_file_cavro_refuses_is_read_by_fastavro(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """If cavro's schema rules refuse a file, fastavro (which wrote it) reads it instead."""

        class Refusing:
            DEFAULT_OPTIONS = types.SimpleNamespace(replace=lambda **_: None)

            @staticmethod
            def ContainerReader(*args: object, **kwargs: object) -> None:  # noqa: N802 - cavro's name
                raise ValueError("invalid name")

        events = simulated(500)
        path = tmp_path / "journal.avro"
        write_journal(path, events)
        monkeypatch.setattr(journal, "_cavro", lambda: Refusing)

        assert events == [event for event, _, _ in read_journal_events(path, reader="cavro")]


class TestReadShare:
    """read_journal_share: the events of some jobs, their indices in the file, and a tally of all."""

    @pytest.mark.parametrize("reader", READERS)
    def test_a_share_is_the_file_s_events_of_its_jobs_at_their_indices(
        self, tmp_path: Path, reader: str
    ) -> None:
        events = simulated(3000, jobs=4)
        path = tmp_path / "journal.avro"
        write_journal(path, events)
        wanted = {"job-1", "job-3"}
        tally = FileTally()

        share = list(read_journal_share(path, wanted.__contains__, tally, reader=reader))  # type: ignore[arg-type]

        assert [(e, i) for i, e in enumerate(events) if e.job_id in wanted] == [
            (e, i) for e, _, _, i in share
        ]
        assert [i for _, _, offset, i in share] == [
            offset for _, _, offset, _ in share
        ]  # bare: offset = index
        assert len(events) == tally.records and {e.job_id for e in events} == tally.jobs

    def test_a_file_of_an_older_schema_is_shared_as_it_resolves(self, tmp_path: Path) -> None:
        """A file Avro resolves (records named by their union branch) is shared the same way."""
        older = copy.deepcopy(journal_schema())
        older["fields"] = [f for f in older["fields"] if f["name"] != "partition"]
        events = simulated(500, jobs=3)
        records = [
            {"offset": i, "event": (f"cutline.{type(e).__name__}", to_avro(e))} for i, e in enumerate(events)
        ]
        path = tmp_path / "old.avro"
        with path.open("wb") as out:
            fastavro.writer(out, fastavro.parse_schema(older), records)
        tally = FileTally()

        share = list(read_journal_share(path, "job-2".__eq__, tally))

        assert [e for e in events if e.job_id == "job-2"] == [e for e, _, _, _ in share]
        assert {-1} == {partition for _, partition, _, _ in share}
        assert len(events) == tally.records

    def test_a_truncated_file_is_damaged_after_every_entry_it_has_taken_or_not(self, tmp_path: Path) -> None:
        events = simulated(5000)
        path = tmp_path / "journal.avro"
        write_journal(path, events)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        tally = FileTally()

        with pytest.raises(JournalFileError, match=r"damaged after \d+ entries") as raised:
            for _ in read_journal_share(path, "job-1".__eq__, tally):
                pass

        assert 0 < tally.records < len(events)
        assert f"damaged after {tally.records} entries" in str(raised.value)


class TestAnyAvroTool:
    def test_fastavro_reads_it_without_cutline(self, tmp_path: Path) -> None:
        """Plain fastavro reads the file: the header names cutline.JournalEntry and every record type."""
        path = tmp_path / "journal.avro"
        write_journal(path, one_of_each())

        with path.open("rb") as stream:
            reader = fastavro.reader(stream, return_record_name=True, return_record_name_override=True)
            records = list(reader)
            schema = reader.writer_schema

        assert JOURNAL_SCHEMA_NAME == schema["name"]
        assert [f"cutline.{cls.__name__}" for cls in JOURNAL_RECORDS] == [r["event"][0] for r in records]
        ack = records[5]["event"][1]
        assert {"uri": HANDLE.uri, "size_bytes": 1234, "sha256": HANDLE.sha256, "inline": None} == ack[
            "state"
        ]
        assert {"in:0": 42} == ack["offsets"]

    def test_the_avro_library_reads_it_too(self, tmp_path: Path) -> None:
        """The Apache Avro library, a second implementation, reads the same records."""
        path = tmp_path / "journal.avro"
        write_journal(path, one_of_each())

        with path.open("rb") as stream, avro.datafile.DataFileReader(stream, avro.io.DatumReader()) as reader:
            records = list(reader)

        assert list(range(len(JOURNAL_RECORDS))) == [r["offset"] for r in records]
        assert "job-1" == records[0]["event"]["job_id"]

    def test_a_file_of_an_older_schema_resolves(self, tmp_path: Path) -> None:
        """A file written before ``partition`` existed reads back with its default, -1."""
        older = copy.deepcopy(journal_schema())
        older["fields"] = [f for f in older["fields"] if f["name"] != "partition"]
        records = [
            {"offset": i, "event": (f"cutline.{type(e).__name__}", to_avro(e))}
            for i, e in enumerate(one_of_each())
        ]
        path = tmp_path / "old.avro"
        with path.open("wb") as out:
            fastavro.writer(out, fastavro.parse_schema(older), records)

        entries = list(read_journal(path))

        assert one_of_each() == [e.event for e in entries]
        assert {-1} == {e.partition for e in entries}

    def test_a_file_whose_records_changed_resolves(self, tmp_path: Path) -> None:
        """A file written before TriggerRejected had request_id reads with its default (the field order
        then differs from the current schema's)."""
        older = copy.deepcopy(journal_schema())
        (event_field,) = [f for f in older["fields"] if f["name"] == "event"]
        (rejected,) = [b for b in event_field["type"] if b["name"] == "cutline.TriggerRejected"]
        rejected["fields"] = [f for f in rejected["fields"] if f["name"] != "request_id"]
        events = [e for e in one_of_each() if not isinstance(e, TriggerRejected)]
        old_rejection = TriggerRejected(
            "job-1", "PERIODIC_SCHEDULER_SHUTDOWN", None, START_MS + 8, message="stopped"
        )
        datum = {k: v for k, v in to_avro(old_rejection).items() if k != "request_id"}
        records = [
            {"partition": 0, "offset": i, "event": (f"cutline.{type(e).__name__}", to_avro(e))}
            for i, e in enumerate(events)
        ] + [{"partition": 0, "offset": len(events), "event": ("cutline.TriggerRejected", datum)}]
        path = tmp_path / "old.avro"
        with path.open("wb") as out:
            fastavro.writer(out, fastavro.parse_schema(older), records)

        assert [*events, old_rejection] == [e.event for e in read_journal(path)]

    @pytest.mark.parametrize("reader", READERS)
    def test_a_file_of_schema_v3_is_read_as_written_and_gives_what_resolution_gives(
        self, tmp_path: Path, reader: str
    ) -> None:
        """Schema v4 only added event fields with plain defaults (inline state), so a v3 file is read
        without schema resolution (cavro where installed), its missing fields at their defaults,
        and gives exactly the entries fastavro's resolution gives."""
        v3 = copy.deepcopy(journal_schema())
        added = {"inline", "inline_limit_bytes", "inline_threshold_bytes"}

        def drop(schema: Any) -> None:
            if isinstance(schema, list):
                for branch in schema:
                    drop(branch)
            elif isinstance(schema, dict):
                if schema.get("type") == "record":
                    schema["fields"] = [f for f in schema["fields"] if f["name"] not in added]
                    for f in schema["fields"]:
                        drop(f["type"])
                elif isinstance(schema.get("type"), list | dict):
                    drop(schema["type"])

        drop(v3)
        events = [*without_inline(one_of_each()), *simulated(2000)]
        path = tmp_path / "v3.avro"
        with path.open("wb") as out:
            records = [
                {"partition": 1, "offset": i, "event": (f"cutline.{type(e).__name__}", to_avro(e))}
                for i, e in enumerate(events)
            ]
            fastavro.writer(out, fastavro.parse_schema(v3), records)
        with path.open("rb") as stream:
            _, as_written = _open_reader(stream, str(path), by_name=False)
        with path.open("rb") as stream:
            resolved = [
                from_avro(_CLASSES[r["event"][0]], r["event"][1])
                for r in fastavro.reader(
                    stream,
                    reader_schema=journal_schema(),
                    return_record_name=True,
                    return_record_name_override=True,
                )
            ]

        read = [event for event, _, _ in read_journal_events(path, reader=reader)]  # type: ignore[arg-type]

        assert as_written is not None  # read as written, not resolved
        assert events == read == resolved

    def test_a_failed_write_leaves_no_file(self, tmp_path: Path) -> None:
        """A write that fails half-way leaves neither the journal nor a partial file behind."""
        path = tmp_path / "journal.avro"

        def broken() -> Iterator[JournalEvent]:
            yield from one_of_each()
            raise RuntimeError("simulated crash")

        with pytest.raises(RuntimeError, match="simulated crash"):
            write_journal(path, broken())

        assert [] == list(tmp_path.iterdir())


class TestBadFiles:
    def test_a_missing_file_raises_file_not_found(self, tmp_path: Path) -> None:
        """A missing file is FileNotFoundError, raised when read_journal is called."""
        with pytest.raises(FileNotFoundError):
            read_journal(tmp_path / "nope.avro")

    def test_a_text_file_is_not_a_journal(self, tmp_path: Path) -> None:
        """A file that is not Avro says so, and says how journals are made."""
        path = tmp_path / "notes.txt"
        path.write_text("hello\n")

        with pytest.raises(JournalFileError, match="not an Avro object container file.*journal-demo"):
            read_journal(path)

    def test_an_empty_file_is_not_a_journal(self, tmp_path: Path) -> None:
        """An empty file is not a journal either."""
        path = tmp_path / "empty.avro"
        path.touch()

        with pytest.raises(JournalFileError, match="is empty"):
            read_journal(path)

    def test_an_avro_file_of_another_schema_is_not_a_journal(self, tmp_path: Path) -> None:
        """An Avro file of other records names the records it holds."""
        path = tmp_path / "other.avro"
        schema = {
            "type": "record",
            "name": "Other",
            "namespace": "x",
            "fields": [{"name": "a", "type": "int"}],
        }
        with path.open("wb") as out:
            fastavro.writer(out, schema, [{"a": 1}])

        with pytest.raises(JournalFileError, match=r"x\.Other records, not cutline\.JournalEntry"):
            read_journal(path)

    def test_a_truncated_file_is_damaged(self, tmp_path: Path) -> None:
        """A file cut short reads up to the damage, then raises JournalFileError."""
        path = tmp_path / "journal.avro"
        write_journal(path, simulated(2000))
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

        with pytest.raises(JournalFileError, match="damaged after"):
            for _ in read_journal(path):
                pass

    def test_journal_file_error_is_a_value_error(self) -> None:
        """Callers that catch ValueError catch a bad journal too."""
        assert issubclass(JournalFileError, ValueError)

    def test_schema_is_the_one_in_schemas(self) -> None:
        """The journal schema is schemas/cutline.JournalEntry.avsc with every named type inlined."""
        assert (SCHEMAS_DIR / "cutline.JournalEntry.avsc").is_file()
        assert JOURNAL_SCHEMA_NAME == journal_schema()["name"]


class TestSimulate:
    def test_same_seed_same_journal(self) -> None:
        """The simulation is deterministic: one seed, one journal."""
        assert simulated(2000, seed=5) == simulated(2000, seed=5)
        assert simulated(2000, seed=5) != simulated(2000, seed=6)

    def test_jobs_have_two_to_eight_tasks(self) -> None:
        """Every simulated job runs with 2 to 8 tasks."""
        started = [e for e in simulated(3000, jobs=6) if isinstance(e, SchedulerStarted)]

        assert {f"job-{i}" for i in range(6)} == {e.job_id for e in started}
        assert all(2 <= len(e.tasks) <= 8 for e in started)

    def test_traffic_has_every_kind_of_trouble(self) -> None:
        """With high failure rates, every journal record type and abort reason shows up."""
        rates = Rates(
            decline=0.05, stuck=0.03, task_failure=0.03, savepoint_every_ms=3000, manual_every_ms=2000
        )
        events = list(itertools.islice(simulate(random.Random(2), jobs=3, rates=rates), 20_000))

        reasons = {e.reason for e in events if isinstance(e, CheckpointAborted)}

        assert set(JOURNAL_RECORDS) == {type(e) for e in events}
        assert {"CHECKPOINT_DECLINED", "CHECKPOINT_EXPIRED", "TASK_FAILURE"} <= reasons
        assert any(isinstance(e, CheckpointCompleted) and e.kind is CheckpointKind.SAVEPOINT for e in events)

    def test_simulated_journal_keeps_every_invariant(self) -> None:
        """The simulation drives the real decider, so its journal breaks no invariant."""
        rates = Rates(
            decline=0.05, stuck=0.03, task_failure=0.03, savepoint_every_ms=3000, manual_every_ms=2000
        )

        assert first_violation(itertools.islice(simulate(random.Random(3), rates=rates), 20_000)) is None

    def test_steps_carry_the_commands(self) -> None:
        """simulate_steps gives each command with its decisions, time never going back."""
        steps = list(itertools.islice(simulate_steps(random.Random(1), jobs=2), 500))
        times = [s.command.now_ms for s in steps]

        assert sorted(times) == times
        assert START_MS <= times[0]

    def test_needs_a_job(self) -> None:
        """Simulating no job is a mistake, said at once."""
        with pytest.raises(ValueError, match="jobs must be at least 1"):
            simulate_steps(random.Random(1), jobs=0)


def test_write_journal_takes_str_paths(tmp_path: Path) -> None:
    """write_journal accepts str paths as well as Path objects."""
    path = str(tmp_path / "journal.avro")

    write_journal(path, one_of_each())

    assert len(JOURNAL_RECORDS) == sum(1 for _ in read_journal(path))


class TestHotPaths:
    """The replay hot path's compiled helpers behave as the generic code they replace."""

    def test_compiled_decoders_match_field_by_field_decoding(self) -> None:
        """from_avro's compiled decoder gives what the field-by-field conversion gives."""
        for event in [*one_of_each(), *simulated(2000)]:
            datum = to_avro(event)

            assert _from_avro_fields(type(event), datum) == from_avro(type(event), datum) == event

    def test_a_datum_without_a_defaulted_field_takes_the_default(self) -> None:
        """A field missing from the datum takes the class default, as before."""
        datum = to_avro(CheckpointRestored("job-1", 7, 3, START_MS, "file:///x"))
        del datum["location"]

        assert CheckpointRestored("job-1", 7, 3, START_MS) == from_avro(CheckpointRestored, datum)

    def test_an_unknown_enum_value_is_a_value_error(self) -> None:
        """A value outside an enum fails with the enum's own ValueError."""
        datum = to_avro(SchedulerStopped("job-1", 1, START_MS, JobStatus.FAILED))
        datum["status"] = "EXPLODED"

        with pytest.raises(ValueError, match="EXPLODED"):
            from_avro(SchedulerStopped, datum)

    def test_decoded_records_stay_frozen(self) -> None:
        """Setting slots directly still makes a frozen record."""
        event = from_avro(TaskAcknowledged, to_avro(one_of_each()[5]))

        with pytest.raises(dataclasses.FrozenInstanceError):
            event.task_id = "t9"  # type: ignore[misc]
        assert hash(event.state) == hash(HANDLE)

    def test_compiled_replace_matches_dataclasses_replace(self) -> None:
        """evolve's compiled replace gives what dataclasses.replace gives, and a frozen state."""
        state = fold_jobs(simulated(3000, jobs=1))["job-0"]
        changes: list[dict[str, object]] = [
            {},
            {"failures": 3},
            {"pending": {}, "queue": (), "scheduler": None},
            {"status": JobStatus.FAILED, "attempt": 9, "restored": None},
        ]

        for change in changes:
            assert dataclasses.replace(state, **change) == _replace_state(state, **change)  # type: ignore[arg-type]
        with pytest.raises(dataclasses.FrozenInstanceError):
            _replace_state(state).failures = 1  # type: ignore[misc]
        with pytest.raises(TypeError):
            _replace_state(state, no_such_field=1)
