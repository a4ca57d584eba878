"""The single-object codec (events/wire/codec.py) and the schema files it reads
(docs/design.md, "Wire protocol")."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import types
import typing
from collections.abc import Mapping
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

import avro.schema
import pytest
from fastavro import schemaless_writer
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form
from hypothesis import given, settings
from hypothesis import strategies as st

from events.wire.avro_binary import long_bytes
from events.wire.codec import (
    HEADER_SIZE,
    MAGIC,
    PREVIOUS_WRITES,
    SCHEMAS_DIR,
    BadMagic,
    BodyMismatch,
    Codec,
    DecodeError,
    TruncatedFrame,
    UnknownFingerprint,
    UnknownRecordType,
    from_avro,
    read_body,
    to_avro,
)
from events.wire.records import (
    RECORD_TYPES,
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointConfig,
    CheckpointKind,
    CheckpointRestored,
    CheckpointTriggered,
    ExecutionState,
    JobStatus,
    JobStatusChanged,
    Record,
    RestartStrategy,
    RestartStrategyKind,
    StateHandle,
    TaskAcknowledged,
    TaskStatusChanged,
)

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
NESTED_TYPES: tuple[type, ...] = (CheckpointConfig, StateHandle, RestartStrategy)
ENUM_TYPES: tuple[type[Enum], ...] = (JobStatus, ExecutionState, CheckpointKind, RestartStrategyKind)
CODEC = Codec()


def _ids(cls: type) -> str:
    return cls.__name__


def _avsc(name: str) -> dict[str, Any]:
    """The raw JSON of ``schemas/cutline.<name>.avsc``."""
    return dict(json.loads((SCHEMAS_DIR / f"cutline.{name}.avsc").read_text()))


def _expanded(name: str) -> dict[str, Any]:
    """The self-contained schema of a record, as fastavro loads it."""
    return dict(load_schema(str(SCHEMAS_DIR / f"cutline.{name}.avsc"), _write_hint=False))


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


# ------------------------------------------------ random records from dataclasses


def _non_null(avro_type: Any) -> Any:
    if isinstance(avro_type, list):
        (branch,) = [b for b in avro_type if b != "null"]
        return branch
    return avro_type


def _strategy(hint: Any, avro_type: Any) -> st.SearchStrategy[Any]:
    """Values of one dataclass field; the Avro type decides int or long range."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return st.none() | _strategy(inner, _non_null(avro_type))
    if origin is tuple:
        return st.lists(_strategy(typing.get_args(hint)[0], avro_type["items"]), max_size=4).map(tuple)
    if origin is not None and issubclass(origin, Mapping):
        _, value_hint = typing.get_args(hint)
        return st.dictionaries(st.text(max_size=12), _strategy(value_hint, avro_type["values"]), max_size=4)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return st.sampled_from(list(hint))
    if dataclasses.is_dataclass(hint):
        return records(typing.cast(type, hint))
    if hint is bool:
        return st.booleans()
    if hint is int:
        assert avro_type in ("int", "long"), avro_type
        return INT32 if avro_type == "int" else INT64
    if hint is str:
        return st.text(max_size=24)
    if hint is bytes:
        return st.binary(max_size=24)
    if hint is float:
        assert avro_type == "double", avro_type
        return st.floats(allow_nan=False)  # NaN is not equal to itself: no round trip could compare
    raise TypeError(f"no strategy for {hint!r}")


@cache
def records(cls: type) -> st.SearchStrategy[Any]:
    """Random instances of a record class, every field drawn (defaults included)."""
    hints = typing.get_type_hints(cls)
    avro_types = {f["name"]: f["type"] for f in _avsc(cls.__name__)["fields"]}
    fields = {f.name: _strategy(hints[f.name], avro_types[f.name]) for f in dataclasses.fields(cls)}
    return st.builds(cls, **fields)


# ------------------------------------------------------------ CRC-64-AVRO by hand

_EMPTY64 = 0xC15D213AA4D7A795


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY64 & -(fp & 1))
        table.append(fp)
    return table


_TABLE = _crc64_table()


def crc64_avro(data: bytes) -> int:
    """The Avro specification's 64-bit Rabin fingerprint, as an unsigned integer."""
    fp = _EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


# -------------------------------------------------------------------- examples


def _simplest(cls: type[Any]) -> Any:
    """A record with every required field at a zero value and every optional one at its default."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if _has_default(f):
            continue
        hint = hints[f.name]
        origin = typing.get_origin(hint)
        if hint is bool:
            values[f.name] = False
        elif hint is int:
            values[f.name] = 0
        elif hint is str:
            values[f.name] = ""
        elif isinstance(hint, type) and issubclass(hint, Enum):
            values[f.name] = next(iter(hint))
        elif dataclasses.is_dataclass(hint):
            values[f.name] = _simplest(hint)
        elif origin is tuple:
            values[f.name] = ()
        elif origin is not None and issubclass(origin, Mapping):
            values[f.name] = {}
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: {hint!r}")
    return cls(**values)


SIMPLE: dict[type[Record], Record] = {cls: _simplest(cls) for cls in RECORD_TYPES}


RESTORED = CheckpointRestored("job-1", 42, 3, 1_700_000_000_000, "file:///tmp/chk-42")
FRAME = CODEC.encode(RESTORED)
JOB_RUNNING = JobStatusChanged(
    job_id="job-1",
    status=JobStatus.RUNNING,
    timestamp_ms=1_700_000_000_000,
    attempt=2,
    tasks=("t-0", "t-1"),
    config=CheckpointConfig(1_000, "file:///tmp/chk"),
    error=None,
)


class TestRoundTrip:
    @pytest.mark.parametrize("cls", RECORD_TYPES, ids=_ids)
    @settings(max_examples=60, deadline=None)
    @given(data=st.data())
    def test_every_record_decodes_to_what_was_encoded(self, cls: type[Record], data: st.DataObject) -> None:
        """Any record of any type, with any field values its schema allows, survives a round trip."""
        record = data.draw(records(cls))

        decoded = CODEC.decode(CODEC.encode(record))

        assert record == decoded
        assert cls is type(decoded)

    def test_decoded_fields_have_the_python_types_of_the_record(self) -> None:
        """Enums come back as enum members, arrays as tuples and nested records as dataclasses."""
        decoded = CODEC.decode(CODEC.encode(JOB_RUNNING))

        assert isinstance(decoded, JobStatusChanged)
        assert JobStatus is type(decoded.status)
        assert tuple is type(decoded.tasks)
        assert CheckpointConfig is type(decoded.config)

    def test_one_topic_carries_several_record_types(self) -> None:
        """Frames of several types in one stream each decode to their own type, named by fingerprint."""
        stream = [
            JOB_RUNNING,
            RESTORED,
            TaskStatusChanged("job-1", "t-0", 2, ExecutionState.FAILED, 5, "boom"),
        ]

        decoded = [CODEC.decode(frame) for frame in map(CODEC.encode, stream)]

        assert stream == decoded
        assert [type(r) for r in stream] == [type(r) for r in decoded]


class TestFrameLayout:
    def test_a_frame_starts_with_the_single_object_magic(self) -> None:
        """Every frame starts with C3 01."""
        assert b"\xc3\x01" == FRAME[:2]
        assert b"\xc3\x01" == MAGIC
        assert 10 == HEADER_SIZE

    @pytest.mark.parametrize("cls", RECORD_TYPES, ids=_ids)
    def test_the_fingerprint_is_the_crc64_avro_of_the_canonical_form(self, cls: type[Record]) -> None:
        """Bytes 2..10 are fastavro's CRC-64-AVRO of the writer schema's parsing canonical form
        (the previous version's for a record that needs nothing newer: TestPreviousWrites)."""
        canonical = to_parsing_canonical_form(CODEC.writer_schema(SIMPLE[cls]).parsed)
        frame = CODEC.encode(SIMPLE[cls])

        assert bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")) == frame[2:HEADER_SIZE]

    @pytest.mark.parametrize("cls", RECORD_TYPES, ids=_ids)
    def test_the_fingerprint_is_little_endian_as_the_avro_specification_computes_it(
        self, cls: type[Record]
    ) -> None:
        """The fingerprint bytes are the spec's 64-bit Rabin fingerprint, least significant byte first."""
        canonical = to_parsing_canonical_form(_expanded(cls.__name__))

        expected = crc64_avro(canonical.encode()).to_bytes(8, "little")

        assert expected == CODEC.registry.current(cls.__name__).fingerprint

    @pytest.mark.parametrize("cls", RECORD_TYPES, ids=_ids)
    def test_the_fingerprint_agrees_with_the_avro_library(self, cls: type[Record]) -> None:
        """The Apache ``avro`` library computes the same canonical form and fingerprint as the codec."""
        parsed = avro.schema.parse(json.dumps(_expanded(cls.__name__)))

        assert to_parsing_canonical_form(_expanded(cls.__name__)) == parsed.canonical_form
        assert bytes(parsed.fingerprint("CRC-64-AVRO")) == CODEC.registry.current(cls.__name__).fingerprint

    def test_the_body_is_the_plain_avro_binary_encoding(self) -> None:
        """After the 10-byte header comes the schemaless Avro body and nothing else."""
        body = io.BytesIO()
        schemaless_writer(
            body,
            _expanded("CheckpointRestored"),
            {
                "job_id": "job-1",
                "checkpoint_id": 42,
                "attempt": 3,
                "timestamp_ms": 1_700_000_000_000,
                "location": "file:///tmp/chk-42",
            },
        )

        assert body.getvalue() == FRAME[HEADER_SIZE:]

    def test_every_record_type_has_its_own_fingerprint(self) -> None:
        """No two record types share a fingerprint, so the fingerprint names the type."""
        fingerprints = {CODEC.registry.current(cls.__name__).fingerprint for cls in RECORD_TYPES}

        assert len(RECORD_TYPES) == len(fingerprints)


VECTORS = Path(__file__).resolve().parents[1] / "vectors"


def _fingerprints(version: Path) -> dict[str, str]:
    return {
        path.name.removesuffix(".schema.json"): json.loads(path.read_text())["fingerprint"]["crc64_avro_hex"]
        for path in version.glob("*.schema.json")
    }


def _previous_vectors() -> Path:
    """The vector directory of the schema version before the current one: a version that only added
    record types (v6: LatencyMeasured) changed no schema a reader of the one before it reads."""
    versions = sorted((p for p in VECTORS.glob("v*") if p.name[1:].isdigit()), key=lambda p: int(p.name[1:]))
    newest = _fingerprints(versions[-1])
    for version in reversed(versions[:-1]):
        older = _fingerprints(version)
        if any(newest[name] != fingerprint for name, fingerprint in older.items()):
            return version
    return versions[0]


def _previous_fingerprint(name: str) -> str | None:
    """``name``'s fingerprint in the previous version (None: the record is newer than it)."""
    return _fingerprints(_previous_vectors()).get(name)


def _with_inline(record: Record) -> Record:
    """``record`` using what the current schema version added, which the previous one cannot carry
    (v6: a stop-with-savepoint's trigger and barrier)."""
    match record:
        case CheckpointTriggered() | CheckpointBarrier():
            return dataclasses.replace(record, stop=True, drain=True)
    raise AssertionError(f"no variant of {type(record).__name__} with the new fields")


class TestPreviousWrites:
    """A record that needs nothing the current schema version added is written with the previous
    version's schema, so that a reader of that version (a rolling upgrade) still reads it."""

    @pytest.mark.parametrize("name", sorted(PREVIOUS_WRITES))
    def test_the_previous_writer_writes_the_previous_versions_bytes(self, name: str) -> None:
        """The previous version's fully populated vector, decoded and encoded again, is the same frame
        byte for byte: exactly what a writer of that version wrote."""
        frame = (_previous_vectors() / f"{name}.bin").read_bytes()

        record = CODEC.decode(frame)

        assert frame == CODEC.encode(record)
        assert _previous_fingerprint(name) == CODEC.writer_schema(record).fingerprint.hex()

    @pytest.mark.parametrize("name", sorted(PREVIOUS_WRITES))
    def test_a_record_using_the_new_fields_gets_the_current_schema(self, name: str) -> None:
        record = _with_inline(CODEC.decode((_previous_vectors() / f"{name}.bin").read_bytes()))

        frame = CODEC.encode(record)

        assert CODEC.registry.current(name).fingerprint == frame[2:HEADER_SIZE]
        assert record == CODEC.decode(frame)

    @pytest.mark.parametrize("cls", RECORD_TYPES, ids=_ids)
    def test_every_record_changed_since_the_previous_version_is_written_down(self, cls: type[Record]) -> None:
        """A schema change keeps PREVIOUS_WRITES pointing at the version before it (a record new in
        this version has no previous schema to be written with)."""
        if not (_previous_vectors() / f"{cls.__name__}.schema.json").is_file():
            assert cls.__name__ not in PREVIOUS_WRITES
            return
        previous = _previous_fingerprint(cls.__name__)
        if previous in (None, CODEC.registry.current(cls.__name__).fingerprint.hex()):
            assert cls.__name__ not in PREVIOUS_WRITES
        else:
            assert previous == PREVIOUS_WRITES[cls.__name__][0], f"add {cls.__name__} to PREVIOUS_WRITES"

    def test_previous_frames_take_the_compiled_path_and_their_defaults(self) -> None:
        """The compiled decoder reads a previous writer's body, and the fields it lacks take their
        defaults (the same record as fastavro's schema resolution gives)."""
        frame = (_previous_vectors() / "CheckpointTriggered.bin").read_bytes()
        writer = CODEC.registry.writer(frame[2:HEADER_SIZE])
        assert writer is not None

        fast = CODEC.decode(frame)
        resolved = read_body(frame, HEADER_SIZE, writer, CODEC.registry.current(writer.name), "test")

        assert CODEC._current_reader(frame[2:HEADER_SIZE]) is not None
        assert from_avro(CheckpointTriggered, resolved) == fast
        assert isinstance(fast, CheckpointTriggered)
        assert (False, False) == (fast.stop, fast.drain)  # the fields v6 added, at their defaults


ACK = CheckpointAcknowledged(
    job_id="job-1",
    checkpoint_id=300,
    attempt=2,
    task_id="task-0017",
    timestamp_ms=1_764_000_000_000,
    state=StateHandle("file:///data/chk/job-1/chk-300/task-0017", 1024, "ab" * 32),
    offsets={"input:17": 123_400},
    metrics={"snapshot_ms": 3, "bytes": 1024},
)


def _journaled(ack: CheckpointAcknowledged, timestamp_ms: int) -> TaskAcknowledged:
    """The decider's record of ``ack``: its fields, with the coordinator's time."""
    fields = {f.name: getattr(ack, f.name) for f in dataclasses.fields(ack)}
    return TaskAcknowledged(**{**fields, "timestamp_ms": timestamp_ms})


class _WritingConfluent:
    """A Confluent framing that writes (its ids are never asked in these tests)."""

    writes = True

    def schema_id(self, topic: str, writer: Any) -> int:
        return 7

    def schema(self, schema_id: int) -> Mapping[str, Any]:
        raise LookupError(schema_id)


class TestAcknowledgedFrame:
    """The journal's TaskAcknowledged of an ack is made from the ack's frame (Codec.acknowledged):
    the same bytes as encoding the event, whenever it answers."""

    @pytest.mark.parametrize("timestamp_ms", [0, 5, 1_764_000_000_999, -1, 2**63 - 1])
    def test_the_frame_is_the_encoded_event_byte_for_byte(self, timestamp_ms: int) -> None:
        frame = CODEC.encode(ACK)
        event = _journaled(ACK, timestamp_ms)

        made = CODEC.acknowledged(frame, CODEC.decode(frame), event, "cutline.checkpoints")

        assert CODEC.encode(event, "cutline.checkpoints") == made
        assert event == CODEC.decode(made)

    def test_an_ack_with_inline_state_keeps_the_current_schema(self) -> None:
        ack = dataclasses.replace(
            ACK, state=StateHandle("inline:", 3, hashlib.sha256(b"abc").hexdigest(), b"abc")
        )
        frame = CODEC.encode(ack)
        event = _journaled(ack, 99)

        made = CODEC.acknowledged(frame, CODEC.decode(frame), event)

        assert CODEC.registry.current("TaskAcknowledged").fingerprint == made[2:HEADER_SIZE]
        assert CODEC.encode(event) == made

    def test_a_body_written_another_way_decodes_to_the_event(self) -> None:
        """Another writer's valid body (a ten-byte varint, a map in two blocks) is kept as it is;
        only the timestamp is written anew."""
        ack = dataclasses.replace(ACK, timestamp_ms=1, offsets={"a:0": 1, "b:1": 2})

        def string(text: str) -> bytes:
            return long_bytes(len(text.encode())) + text.encode()

        assert ack.state is not None
        frame = b"".join(
            [
                MAGIC + CODEC.writer_schema(ack).fingerprint,
                string(ack.job_id) + long_bytes(ack.checkpoint_id) + long_bytes(ack.attempt),
                string(ack.task_id),
                b"\x82\x80\x80\x80\x80\x80\x80\x80\x80\x00",  # timestamp 1, in ten bytes
                b"\x02" + string(ack.state.uri) + long_bytes(ack.state.size_bytes) + string(ack.state.sha256),
                b"\x00",  # state.inline: null
                long_bytes(1) + string("a:0") + long_bytes(1),  # offsets: one entry per block
                long_bytes(1) + string("b:1") + long_bytes(2) + long_bytes(0),
                long_bytes(2) + string("snapshot_ms") + long_bytes(3) + string("bytes") + long_bytes(1024),
                long_bytes(0),
            ]
        )
        assert ack == CODEC.decode(frame)
        event = _journaled(ack, 1_764_000_000_123)

        made = CODEC.acknowledged(frame, ack, event)

        assert made is not None and made != CODEC.encode(event)
        assert event == CODEC.decode(made)

    @pytest.mark.parametrize(
        "changed",
        [
            {"job_id": "job-2"},
            {"checkpoint_id": 301},
            {"attempt": 3},
            {"task_id": "task-0018"},
            {"state": None},
            {"state": StateHandle("file:///data/chk/job-1/chk-300/other", 1024, "ab" * 32)},
            {"offsets": {}},
            {"metrics": {"snapshot_ms": 4, "bytes": 1024}},
        ],
        ids=str,
    )
    def test_an_event_that_is_not_the_acks_record_gets_no_frame(self, changed: dict[str, Any]) -> None:
        frame = CODEC.encode(ACK)
        event = dataclasses.replace(_journaled(ACK, 5), **changed)

        assert CODEC.acknowledged(frame, ACK, event) is None

    def test_an_ack_in_a_schema_the_event_is_not_written_with_gets_no_frame(self) -> None:
        """An ack written with an older schema (a participant of schema v3): the event goes out
        with the current one, so it is encoded."""
        older = CODEC.registry.writer(bytes.fromhex("a8edf4019362aa12"))
        assert older is not None
        frame = _frame(older.fingerprint, older.compiled, to_avro(ACK))
        assert ACK == CODEC.decode(frame)

        assert CODEC.acknowledged(frame, ACK, _journaled(ACK, 5)) is None

    def test_no_frame_when_records_are_written_in_the_confluent_format(self) -> None:
        codec = Codec(confluent=_WritingConfluent())
        frame = codec.encode(ACK)

        assert codec.acknowledged(frame, ACK, _journaled(ACK, 5), "cutline.checkpoints") is None
        assert codec.acknowledged(frame, ACK, _journaled(ACK, 5)) == codec.encode(_journaled(ACK, 5))


def _frame(fp: bytes, schema: Any, datum: Mapping[str, Any]) -> bytes:
    out = io.BytesIO()
    out.write(MAGIC + fp)
    schemaless_writer(out, schema, datum)
    return out.getvalue()


TASK_STATUS_FP = CODEC.registry.current("TaskStatusChanged").fingerprint
JOB_STATUS_FP = CODEC.registry.current("JobStatusChanged").fingerprint
RESTORED_FP = CODEC.registry.current("CheckpointRestored").fingerprint

BAD_FRAMES = [
    pytest.param(b"", TruncatedFrame, id="empty"),
    pytest.param(b"\xc3", TruncatedFrame, id="first magic byte only"),
    pytest.param(b"\x00", BadMagic, id="one other byte"),
    pytest.param(FRAME[: HEADER_SIZE - 1], TruncatedFrame, id="header one byte short"),
    pytest.param(b"\xc3\x02" + FRAME[2:], BadMagic, id="wrong second magic byte"),
    pytest.param(b"\x00\x00\x00\x00\x07" + FRAME[HEADER_SIZE:], BadMagic, id="confluent wire format"),
    pytest.param(b'{"job_id": "job-1", "checkpoint_id": 42}', BadMagic, id="json"),
    pytest.param(MAGIC + bytes(8) + FRAME[HEADER_SIZE:], UnknownFingerprint, id="unknown fingerprint"),
    pytest.param(FRAME[:HEADER_SIZE], BodyMismatch, id="header without body"),
    pytest.param(FRAME[:-1], BodyMismatch, id="body one byte short"),
    pytest.param(FRAME[: HEADER_SIZE + 4], BodyMismatch, id="string cut off"),
    pytest.param(FRAME + b"\x00", BodyMismatch, id="one trailing byte"),
    pytest.param(FRAME + FRAME, BodyMismatch, id="two frames glued"),
    pytest.param(MAGIC + RESTORED_FP + b"\x03", BodyMismatch, id="negative string length"),
    pytest.param(MAGIC + RESTORED_FP + b"\x04\xff\xfe", BodyMismatch, id="invalid utf-8"),
    pytest.param(
        MAGIC + TASK_STATUS_FP + b"\x00\x00\x00\x7e\x00\x00", BodyMismatch, id="enum index out of range"
    ),
    pytest.param(
        MAGIC + JOB_STATUS_FP + b"\x00\x02\x00\x00" + b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f",
        BodyMismatch,
        id="array claims 2^62 items",
    ),
    pytest.param(MAGIC + RESTORED_FP + b"\xff" * 64, BodyMismatch, id="endless varint"),
    pytest.param(MAGIC + RESTORED_FP + b"\x00\x00\x00\x00\x04", BodyMismatch, id="union branch out of range"),
]


class TestDecodeErrors:
    @pytest.mark.parametrize(("frame", "error"), BAD_FRAMES)
    def test_a_bad_frame_raises_the_decode_error_that_names_its_fault(
        self, frame: bytes, error: type[DecodeError]
    ) -> None:
        """Each kind of broken frame raises its own DecodeError subclass."""
        with pytest.raises(DecodeError) as raised:
            CODEC.decode(frame)

        assert error is type(raised.value)

    def test_every_decode_error_is_a_value_error_with_its_own_reason(self) -> None:
        """The reasons dead letters carry are distinct, stable codes."""
        errors = [DecodeError, TruncatedFrame, BadMagic, UnknownFingerprint, BodyMismatch]

        assert all(issubclass(e, ValueError) for e in errors)
        assert ["UNDECODABLE", "TRUNCATED_FRAME", "BAD_MAGIC", "UNKNOWN_SCHEMA", "BODY_MISMATCH"] == [
            e.reason for e in errors
        ]

    @pytest.mark.timeout(60)
    @settings(max_examples=300, deadline=1_000)
    @given(frame=st.binary(max_size=256))
    def test_arbitrary_bytes_raise_nothing_but_decode_error(self, frame: bytes) -> None:
        """Decoding any bytes returns a record or raises a DecodeError, and returns promptly."""
        try:
            record = CODEC.decode(frame)
        except DecodeError:
            return
        assert isinstance(record, RECORD_TYPES)

    @pytest.mark.timeout(60)
    @settings(max_examples=500, deadline=1_000)
    @given(
        fp=st.sampled_from([CODEC.registry.current(cls.__name__).fingerprint for cls in RECORD_TYPES]),
        body=st.binary(max_size=256),
    )
    def test_garbage_after_a_valid_header_raises_nothing_but_decode_error(
        self, fp: bytes, body: bytes
    ) -> None:
        """A known fingerprint followed by random bytes decodes or raises a DecodeError, promptly."""
        try:
            record = CODEC.decode(MAGIC + fp + body)
        except DecodeError:
            return
        assert isinstance(record, RECORD_TYPES)

    def test_decode_as_rejects_a_record_of_another_type(self) -> None:
        """Asking for a TaskStatusChanged in a JobStatusChanged frame is a DecodeError."""
        with pytest.raises(BodyMismatch, match="expected TaskStatusChanged, got JobStatusChanged"):
            CODEC.decode_as(TaskStatusChanged, CODEC.encode(JOB_RUNNING))

    def test_decode_as_returns_a_record_of_the_asked_type(self) -> None:
        """decode_as gives the record when its type is the one asked for."""
        assert JOB_RUNNING == CODEC.decode_as(JobStatusChanged, CODEC.encode(JOB_RUNNING))


class TestEncodeErrors:
    @pytest.mark.parametrize(
        "value",
        [
            "JobStatusChanged",
            {"job_id": "job-1"},
            None,
            StateHandle("file:///x", 1, "0" * 64),
            CheckpointConfig(1_000, "file:///x"),
        ],
        ids=["str", "dict", "None", "StateHandle", "CheckpointConfig"],
    )
    def test_encoding_something_that_is_not_a_record_raises_unknown_record_type(self, value: Any) -> None:
        """Only the record types of RECORD_TYPES can be framed; nested records and plain values cannot."""
        with pytest.raises(UnknownRecordType):
            CODEC.encode(value)

    def test_registering_a_schema_of_an_unknown_record_raises_unknown_record_type(self) -> None:
        """A writer schema is only accepted for a record the codec knows."""
        schema = {"type": "record", "name": "Other", "namespace": "cutline", "fields": []}

        with pytest.raises(UnknownRecordType):
            Codec().registry.register_writer_schema(schema)


class TestSchemaResolution:
    def test_an_older_writer_decodes_into_the_current_record_with_defaults(self) -> None:
        """A JobStatusChanged written before its defaulted fields existed decodes with those defaults."""
        codec = Codec()
        old = _expanded("JobStatusChanged")
        old["fields"] = [f for f in old["fields"] if "default" not in f]
        assert ["job_id", "status", "timestamp_ms", "attempt", "tasks"] == [f["name"] for f in old["fields"]]
        fp = codec.registry.register_writer_schema(old)
        datum = {"job_id": "job-1", "status": "RUNNING", "timestamp_ms": 7, "attempt": 2, "tasks": ["t-0"]}

        decoded = codec.decode(_frame(fp, old, datum))

        assert JobStatusChanged("job-1", JobStatus.RUNNING, 7, 2, ("t-0",), None, None, None, None) == decoded

    def test_an_older_writer_is_unknown_until_its_schema_is_registered(self) -> None:
        """Without the old schema the fingerprint names nothing, and decode says so."""
        old = _expanded("JobStatusChanged")
        old["fields"] = [f for f in old["fields"] if "default" not in f]
        datum = {"job_id": "job-1", "status": "RUNNING", "timestamp_ms": 7, "attempt": 2, "tasks": []}
        fp = crc64_avro(to_parsing_canonical_form(old).encode()).to_bytes(8, "little")

        with pytest.raises(UnknownFingerprint):
            Codec().decode(_frame(fp, old, datum))

    def test_a_newer_writer_with_an_extra_defaulted_field_decodes_with_the_current_reader(self) -> None:
        """A field the current schema lacks is skipped; everything else decodes as written."""
        codec = Codec()
        new = copy.deepcopy(_expanded("JobStatusChanged"))
        new["fields"].append({"name": "cluster", "type": "string", "default": "local"})
        fp = codec.registry.register_writer_schema(new)
        datum = {
            "job_id": "job-1",
            "status": "FAILING",
            "timestamp_ms": 7,
            "attempt": 2,
            "tasks": ["t-0", "t-1"],
            "config": None,
            "error": "boom",
            "restored_checkpoint_id": 41,
            "restored_location": "file:///tmp/chk-41",
            "cluster": "eu-west-1",
        }

        decoded = codec.decode(_frame(fp, new, datum))

        assert (
            JobStatusChanged(
                "job-1", JobStatus.FAILING, 7, 2, ("t-0", "t-1"), None, "boom", 41, "file:///tmp/chk-41"
            )
            == decoded
        )

    def test_the_current_schema_keeps_its_fingerprint_after_registering_others(self) -> None:
        """Registering old writer schemas does not change what encode writes."""
        codec = Codec()
        old = _expanded("JobStatusChanged")
        old["fields"] = [f for f in old["fields"] if "default" not in f]
        codec.registry.register_writer_schema(old)

        assert CODEC.encode(JOB_RUNNING) == codec.encode(JOB_RUNNING)


# ---------------------------------------------------------------- schema files

# The fields docs/design.md ("Records") names for each record, with the Avro type where the
# design gives one (None: name only). This is the contract: every
# implementation keeps these; more fields may be added, each with a default.
DESIGN_FIELDS: dict[str, dict[str, Any]] = {
    "JobStatusChanged": {
        "job_id": None,
        "status": "cutline.JobStatus",
        "timestamp_ms": None,
        "attempt": "int",
        "tasks": {"type": "array", "items": "string"},
        "config": ["null", "cutline.CheckpointConfig"],
        "error": ["null", "string"],
    },
    "CheckpointConfig": {
        "interval_ms": None,
        "timeout_ms": None,
        "min_pause_ms": None,
        "max_concurrent": None,
        "tolerable_failures": None,
        "retained": None,
        "location": None,
    },
    "TaskStatusChanged": {
        "job_id": None,
        "task_id": None,
        "attempt": None,
        "status": None,
        "timestamp_ms": None,
        "error": None,
    },
    "CheckpointRequested": {
        "job_id": None,
        "kind": "cutline.CheckpointKind",
        "target": ["null", "string"],
        "timestamp_ms": None,
        "request_id": None,
    },
    "CheckpointBarrier": {
        "job_id": None,
        "checkpoint_id": "long",
        "attempt": None,
        "kind": None,
        "timestamp_ms": None,
        "location": None,
    },
    "CheckpointAcknowledged": {
        "job_id": None,
        "checkpoint_id": None,
        "attempt": None,
        "task_id": None,
        "timestamp_ms": None,
        "state": ["null", "cutline.StateHandle"],
        "offsets": {"type": "map", "values": "long"},
        "metrics": {"type": "map", "values": "long"},
    },
    "StateHandle": {"uri": None, "size_bytes": None, "sha256": None},
    "CheckpointDeclined": {
        "job_id": None,
        "checkpoint_id": None,
        "attempt": None,
        "task_id": None,
        "timestamp_ms": None,
        "reason": None,
        "message": None,
    },
    "CheckpointCompleted": {
        "job_id": None,
        "checkpoint_id": None,
        "kind": None,
        "timestamp_ms": None,
        "duration_ms": None,
        "handles": None,
        "size_bytes": None,
        "offsets": None,
    },
    "CheckpointAborted": {
        "job_id": None,
        "checkpoint_id": None,
        "timestamp_ms": None,
        "reason": None,
        "message": None,
    },
    "TriggerRejected": {"job_id": None, "reason": None, "request_id": ["null", "string"]},
}
DESIGN_CONFIG_DEFAULTS = {
    "timeout_ms": 600_000,
    "min_pause_ms": 0,
    "max_concurrent": 1,
    "tolerable_failures": 0,
    "retained": 1,
}
DESIGN_JOURNAL_RECORDS = [
    "CheckpointTriggered",
    "TaskAcknowledged",
    "CheckpointCompleted",
    "CheckpointAborted",
    "TriggerRejected",
    "SchedulerStarted",
    "SchedulerStopped",
    "CheckpointFailureThresholdExceeded",
    "CheckpointRestored",
]
DESIGN_JOB_STATUSES = [
    "CREATED",
    "RUNNING",
    "FAILING",
    "FAILED",
    "CANCELLING",
    "CANCELED",
    "FINISHED",
    "RESTARTING",
    "SUSPENDED",
]


class TestSchemaFiles:
    @pytest.mark.parametrize("cls", RECORD_TYPES + NESTED_TYPES, ids=_ids)
    def test_a_record_class_has_exactly_the_fields_of_its_schema_in_order(self, cls: type) -> None:
        """Same field names as the .avsc, in its order except that fields with Python defaults come last."""
        avsc_names = [f["name"] for f in _avsc(cls.__name__)["fields"]]
        fields = dataclasses.fields(cls)
        defaulted = {f.name for f in fields if _has_default(f)}

        assert sorted(avsc_names) == sorted(f.name for f in fields)
        assert [n for n in avsc_names if n not in defaulted] + [n for n in avsc_names if n in defaulted] == [
            f.name for f in fields
        ]

    @pytest.mark.parametrize("cls", RECORD_TYPES + NESTED_TYPES, ids=_ids)
    def test_every_avro_default_is_the_python_default(self, cls: type) -> None:
        """A field the schema defaults has the same default in the record class."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for avro_field in _avsc(cls.__name__)["fields"]:
            if "default" not in avro_field:
                continue
            f = fields[avro_field["name"]]
            python_default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            if dataclasses.is_dataclass(python_default):  # a nested record: its default is an object
                python_default = to_avro(python_default)
            assert avro_field["default"] == python_default, f"{cls.__name__}.{f.name}"

    @pytest.mark.parametrize("path", sorted(SCHEMAS_DIR.glob("*.avsc")), ids=lambda p: p.name)
    def test_every_schema_file_is_in_the_cutline_namespace_and_named_after_its_type(self, path: Any) -> None:
        """schemas/cutline.<Name>.avsc defines cutline.<Name>."""
        schema = json.loads(path.read_text())

        assert "cutline" == schema["namespace"]
        assert f"cutline.{schema['name']}.avsc" == path.name

    @pytest.mark.parametrize("cls", RECORD_TYPES + NESTED_TYPES, ids=_ids)
    def test_every_record_class_has_a_schema_file(self, cls: type) -> None:
        """Each record type and nested record has its own .avsc."""
        assert (SCHEMAS_DIR / f"cutline.{cls.__name__}.avsc").is_file()

    @pytest.mark.parametrize("enum", ENUM_TYPES, ids=_ids)
    def test_enum_symbols_are_the_members_of_the_python_enum_in_order(self, enum: type[Enum]) -> None:
        """The Avro enum and the StrEnum list the same symbols in the same order."""
        assert _avsc(enum.__name__)["symbols"] == [m.value for m in enum]

    @pytest.mark.parametrize("record", DESIGN_FIELDS, ids=str)
    def test_every_field_the_design_names_exists_with_its_type(self, record: str) -> None:
        """docs/design.md ("Records") lists the fields every implementation must keep; the schema has them
        all."""
        schema_fields = {f["name"]: f["type"] for f in _avsc(record)["fields"]}
        for name, avro_type in DESIGN_FIELDS[record].items():
            assert name in schema_fields, f"{record}.{name} is missing"
            if avro_type is not None:
                assert avro_type == schema_fields[name], f"{record}.{name}"

    @pytest.mark.parametrize("record", DESIGN_FIELDS, ids=str)
    def test_every_field_beyond_the_design_has_a_default(self, record: str) -> None:
        """Fields added beyond the contract carry a default, so old writers stay readable."""
        extra = [f for f in _avsc(record)["fields"] if f["name"] not in DESIGN_FIELDS[record]]

        assert [] == [f["name"] for f in extra if "default" not in f]

    def test_checkpoint_config_has_the_design_defaults(self) -> None:
        """timeout 600000, min pause 0, max concurrent 1, tolerable failures 0, retained 1."""
        avsc_defaults = {f["name"]: f.get("default") for f in _avsc("CheckpointConfig")["fields"]}
        python_defaults = {f.name: f.default for f in dataclasses.fields(CheckpointConfig)}

        assert DESIGN_CONFIG_DEFAULTS == {k: avsc_defaults[k] for k in DESIGN_CONFIG_DEFAULTS}
        assert DESIGN_CONFIG_DEFAULTS == {k: python_defaults[k] for k in DESIGN_CONFIG_DEFAULTS}

    def test_job_status_has_flinks_statuses(self) -> None:
        """JobStatus holds every status docs/design.md ("Records") lists, in its order."""
        symbols = _avsc("JobStatus")["symbols"]

        assert DESIGN_JOB_STATUSES == [s for s in symbols if s in DESIGN_JOB_STATUSES]

    def test_checkpoint_kind_is_checkpoint_or_savepoint(self) -> None:
        """CheckpointKind is exactly CHECKPOINT | SAVEPOINT."""
        assert ["CHECKPOINT", "SAVEPOINT"] == _avsc("CheckpointKind")["symbols"]

    @pytest.mark.parametrize("record", DESIGN_JOURNAL_RECORDS, ids=str)
    def test_every_journal_record_the_design_names_is_a_record_type(self, record: str) -> None:
        """Each journal record docs/design.md ("Records") names is in RECORD_TYPES with a schema file."""
        assert record in [cls.__name__ for cls in RECORD_TYPES]
        assert (SCHEMAS_DIR / f"cutline.{record}.avsc").is_file()
