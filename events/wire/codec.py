"""Avro single-object encoding of cutline records (docs/design.md, "Wire protocol").

A frame is ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the
writer schema's parsing canonical form + the Avro binary body. Neither ``avro``
nor ``fastavro`` ships this framing (fastavro issue #501), so this module owns
it; everything else (schema parsing, fingerprints, binary bodies, reader/writer
resolution) is fastavro's.

The fingerprint names the record type, so one topic carries several types, and
a frame written with an older schema still decodes: the registry knows every
writer schema it was given and resolves it against the current reader schema.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import load_schema, parse_schema, to_parsing_canonical_form

from events.wire.avro_binary import (
    Decoder,
    Encoder,
    Unsupported,
    Unusual,
    compile_decoder,
    compile_encoder,
    long_bytes,
    read_long,
)
from events.wire.codegen import define, slot_setters
from events.wire.records import RECORD_TYPES, CheckpointAcknowledged, Record, TaskAcknowledged
from events.wire.schema_registry import RegistryFraming
from events.wire.vocabulary import DeadLetterReason
from events.wire.wire_settings import WireSettings
from events.wire.writer_schema import NAMESPACE, WriterSchema, schema_fingerprint

MAGIC = b"\xc3\x01"
HEADER_SIZE = len(MAGIC) + 8
SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas"

R = TypeVar("R", bound=Record)
T = TypeVar("T")


class DecodeError(ValueError):
    """A frame could not be turned into a record. ``reason`` is a stable code for dead letters."""

    reason: str = DeadLetterReason.UNDECODABLE


class TruncatedFrame(DecodeError):
    reason: str = DeadLetterReason.TRUNCATED_FRAME


class BadMagic(DecodeError):
    reason: str = DeadLetterReason.BAD_MAGIC


class UnknownFingerprint(DecodeError):
    reason: str = DeadLetterReason.UNKNOWN_SCHEMA


class BodyMismatch(DecodeError):
    reason: str = DeadLetterReason.BODY_MISMATCH


class UnknownSchemaId(DecodeError):
    """A Confluent-framed value whose schema id the registry does not know, or whose schema is
    not one of cutline's."""

    reason: str = DeadLetterReason.UNKNOWN_SCHEMA_ID


class UnknownRecordType(TypeError):
    """Asked to encode something that is not a cutline record."""


# --------------------------------------------------------- record <-> Avro dict
# Hand-written because the records are plain frozen dataclasses with nested
# records, enums and tuples; no library maps those to fastavro dicts both ways
# without a runtime schema layer of its own (dataclasses-avroschema would own
# the schemas, but ours live in schemas/ as the contract).

Converter = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _converters(hint: Any) -> tuple[Converter, Converter]:
    """(to_avro, from_avro) for one field type."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        to_inner, from_inner = _converters(inner)
        if to_inner is _identity and from_inner is _identity:
            return _identity, _identity
        return (
            lambda v: None if v is None else to_inner(v),
            lambda v: None if v is None else from_inner(v),
        )
    if origin is tuple:
        return list, tuple
    if origin is not None and origin.__name__ == "Mapping":
        _, value_hint = typing.get_args(hint)
        to_value, from_value = _converters(value_hint)
        if to_value is _identity:
            return dict, dict
        return (
            lambda m: {k: to_value(v) for k, v in m.items()},
            lambda m: {k: from_value(v) for k, v in m.items()},
        )
    if isinstance(hint, type) and issubclass(hint, Enum):
        return _identity, hint
    if dataclasses.is_dataclass(hint):
        return to_avro, lambda d: from_avro(cast(type[Any], hint), d)
    return _identity, _identity


_FIELD_CONVERTERS: dict[type, tuple[tuple[str, Converter, Converter], ...]] = {}


def _field_converters(cls: type) -> tuple[tuple[str, Converter, Converter], ...]:
    """(name, to_avro, from_avro) per field of a record class, computed once per class."""
    converters = _FIELD_CONVERTERS.get(cls)
    if converters is None:
        hints = typing.get_type_hints(cls)
        converters = tuple((f.name, *_converters(hints[f.name])) for f in dataclasses.fields(cls))
        _FIELD_CONVERTERS[cls] = converters
    return converters


def to_avro(record: Any) -> dict[str, Any]:
    """The fastavro datum of a record (nested records become dicts)."""
    return {name: to(getattr(record, name)) for name, to, _ in _field_converters(type(record))}


def from_avro(cls: type[R], datum: Mapping[str, Any]) -> R:
    """The record of type ``cls`` from a fastavro datum (fields the class lacks are dropped)."""
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = _compile_decoder(cls)
    return cast(R, decoder(datum))


def avro_decoder(cls: type[T]) -> Callable[[Mapping[str, Any]], T]:
    """``from_avro`` bound to one class, for loops over many data of one type (journal replay).

    Any frozen dataclass whose fields map onto an Avro record works, not only the records
    of :data:`RECORD_TYPES` (the coordinator snapshot decodes its state classes with it).
    """
    return cast(Callable[[Mapping[str, Any]], T], _DECODERS.get(cls) or _compile_decoder(cls))


def _from_avro_fields(cls: type[R], datum: Mapping[str, Any]) -> R:
    """:func:`from_avro`, field by field: fields missing from ``datum`` take the class default."""
    return cls(**{name: back(datum[name]) for name, _, back in _field_converters(cls) if name in datum})


# Replay decodes millions of records, so each class gets a decoder compiled from its
# fields: one function, no per-field converter calls. It behaves as _from_avro_fields
# (and falls back to it when a field is missing from the datum).
_DECODERS: dict[type, Callable[[Mapping[str, Any]], Any]] = {}


PLAIN_DEFAULTS = (type(None), bool, int, float, str)
"""Defaults that are their own Avro value: a missing field takes them without conversion (the
compiled record decoders here, and journal files read as written, ``coordinator/replay/journal.py``)."""


def _compile_decoder(cls: type) -> Callable[[Mapping[str, Any]], Any]:
    fields = dataclasses.fields(cls)
    hints = typing.get_type_hints(cls)
    namespace: dict[str, Any] = {"_cls": cls, "_fields": functools.partial(_from_avro_fields, cls)}
    lines = ["def decode(d):", "    try:"]
    for i, f in enumerate(fields):
        if type(f.default) in PLAIN_DEFAULTS:
            # A field with a plain default (None, a number, a string) may be missing: a datum of an
            # older writer schema (Codec's previous writes) lacks the fields added since.
            namespace[f"_d{i}"] = f.default
            lines.append(f"        v{i} = d.get({f.name!r}, _d{i})")
        else:
            lines.append(f"        v{i} = d[{f.name!r}]")
    lines += ["    except KeyError:", "        return _fields(d)"]
    args = [_decode_expr(hints[f.name], f"v{i}", namespace, cls) for i, f in enumerate(fields)]
    setters = slot_setters(cls, [f.name for f in fields])
    if all(f.init for f in fields) and not hasattr(cls, "__post_init__") and setters is not None:
        # Set the slots directly: what the frozen __init__ leaves (one object.__setattr__
        # per field), in half the time.
        namespace["_new"] = object.__new__
        lines.append("    o = _new(_cls)")
        for i, (setter, arg) in enumerate(zip(setters, args, strict=True)):
            namespace[f"_set{i}"] = setter
            lines.append(f"    _set{i}(o, {arg})")
        lines.append("    return o")
    elif all(f.init and not f.kw_only for f in fields):
        lines.append(f"    return _cls({', '.join(args)})")
    else:
        keywords = [f"{f.name}={arg}" for f, arg in zip(fields, args, strict=True)]
        lines.append(f"    return _cls({', '.join(keywords)})")
    decoder = cast(Callable[[Mapping[str, Any]], Any], define("decode", "\n".join(lines), namespace))
    _DECODERS[cls] = decoder
    return decoder


def _decode_expr(hint: Any, var: str, namespace: dict[str, Any], owner: type) -> str:
    """A Python expression that converts the fastavro value in ``var`` to a field of type ``hint``."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        expr = _decode_expr(inner, var, namespace, owner)
        return var if expr == var else f"(None if {var} is None else {expr})"
    if origin is tuple:
        return f"tuple({var})"
    if origin is not None and origin.__name__ == "Mapping":
        _, value_hint = typing.get_args(hint)
        item = f"_x{len(namespace)}"
        value_expr = _decode_expr(value_hint, item, namespace, owner)
        if value_expr == item:
            return f"dict({var})"
        return f"{{_k: {value_expr} for _k, {item} in {var}.items()}}"
    name = f"_g{len(namespace)}"
    if isinstance(hint, type) and issubclass(hint, Enum):
        namespace[name], namespace[f"{name}m"] = hint, hint._value2member_map_
        # The member map holds every value; anything else goes through the enum (and its ValueError).
        return f"({name}m[{var}] if type({var}) is str and {var} in {name}m else {name}({var}))"
    if dataclasses.is_dataclass(hint):
        inner_cls = cast(type, hint)
        namespace[name] = (
            functools.partial(from_avro, inner_cls)
            if inner_cls is owner
            else _DECODERS.get(inner_cls) or _compile_decoder(inner_cls)
        )
        return f"{name}({var})"
    return var


# --------------------------------------------------------------------- registry


class SchemaRegistry:
    """Every known writer schema by fingerprint, and the current schema of every record.

    Loads ``schemas/cutline.*.avsc`` (the current contract) and, when present,
    ``schemas/history/*.avsc`` (older versions that old writers may still send).
    """

    def __init__(self, schemas_dir: Path = SCHEMAS_DIR) -> None:
        self._current: dict[str, WriterSchema] = {}
        self._by_fingerprint: dict[bytes, WriterSchema] = {}
        self._classes: dict[str, type[Record]] = {cls.__name__: cls for cls in RECORD_TYPES}
        for cls in RECORD_TYPES:
            path = schemas_dir / f"{NAMESPACE}.{cls.__name__}.avsc"
            parsed = cast(dict[str, Any], load_schema(str(path), _write_hint=False))
            writer = WriterSchema(cls.__name__, schema_fingerprint(parsed), parsed)
            self._current[cls.__name__] = writer
            self._by_fingerprint[writer.fingerprint] = writer
        history = schemas_dir / "history"
        if history.is_dir():
            for path in sorted(history.glob("*.avsc")):
                schema = json.loads(path.read_text())
                # Other frames keep their old schemas here too (the coordinator snapshot's).
                if str(schema.get("name", "")).removeprefix(f"{NAMESPACE}.") in self._classes:
                    self.register_writer_schema(schema)

    def register_writer_schema(self, schema: Mapping[str, Any]) -> bytes:
        """Make frames written with an older (self-contained) schema decodable; its fingerprint."""
        parsed = cast(dict[str, Any], parse_schema(dict(schema), _write_hint=False))
        name = str(parsed["name"]).removeprefix(f"{NAMESPACE}.")
        if name not in self._classes:
            raise UnknownRecordType(f"{parsed['name']} is not a cutline record")
        writer = WriterSchema(name, schema_fingerprint(parsed), parsed)
        self._by_fingerprint.setdefault(writer.fingerprint, writer)
        return writer.fingerprint

    def current(self, name: str) -> WriterSchema:
        return self._current[name]

    def writer(self, fp: bytes) -> WriterSchema | None:
        return self._by_fingerprint.get(fp)

    def record_class(self, name: str) -> type[Record]:
        return self._classes[name]

    @property
    def names(self) -> Iterable[str]:
        return self._current.keys()


# ------------------------------------------------------- compiled Avro bodies

_ENCODERS: dict[tuple[bytes, type], Encoder | None] = {}
_BODY_DECODERS: dict[bytes, Decoder | None] = {}


def body_encoder(writer: WriterSchema, cls: type) -> Encoder | None:
    """The compiled body encoder of ``cls`` under ``writer`` (:mod:`events.wire.avro_binary`), compiled
    on first use; None when the schema has what it does not compile (fastavro writes it then)."""
    key = (writer.fingerprint, cls)
    try:
        return _ENCODERS[key]
    except KeyError:
        pass
    try:
        encoder: Encoder | None = compile_encoder(writer.parsed, cls)
    except Unsupported:
        encoder = None
    _ENCODERS[key] = encoder
    return encoder


def body_decoder(writer: WriterSchema) -> Decoder | None:
    """The compiled decoder of bodies written and read with ``writer``; None as for encoders."""
    try:
        return _BODY_DECODERS[writer.fingerprint]
    except KeyError:
        pass
    try:
        decoder: Decoder | None = compile_decoder(writer.parsed)
    except Unsupported:
        decoder = None
    _BODY_DECODERS[writer.fingerprint] = decoder
    return decoder


# ---------------------------------------------------------------------- framing


def write_frame(writer: WriterSchema, datum: Mapping[str, Any]) -> bytes:
    """``datum`` as a single-object frame: magic, ``writer``'s fingerprint, Avro body."""
    out = io.BytesIO()
    out.write(MAGIC)
    out.write(writer.fingerprint)
    schemaless_writer(out, writer.compiled, datum)
    return out.getvalue()


def read_frame(
    frame: bytes,
    writer_of: Callable[[bytes], WriterSchema | None],
    reader_of: Callable[[str], WriterSchema],
) -> tuple[WriterSchema, Any]:
    """The writer schema and the datum of a single-object frame, resolved to the current schema.

    ``writer_of`` looks a fingerprint up among the known writer schemas, ``reader_of`` gives
    the current schema of a name. Raises a :class:`DecodeError` subclass saying what is wrong.
    """
    if len(frame) < HEADER_SIZE:
        if not MAGIC.startswith(frame[:2]):
            raise BadMagic(f"frame starts with {frame[:2].hex()}, not c301 (single-object Avro)")
        raise TruncatedFrame(f"frame of {len(frame)} bytes is shorter than its 10-byte header")
    if frame[:2] != MAGIC:
        hint = (
            " or a Confluent Schema Registry frame (pass --schema-registry)" if frame[:1] == b"\x00" else ""
        )
        raise BadMagic(f"frame starts with {frame[:2].hex()}, not c301 (single-object Avro){hint}")
    fp = frame[2:HEADER_SIZE]
    writer = writer_of(fp)
    if writer is None:
        raise UnknownFingerprint(
            f"no known schema has fingerprint {fp.hex()}; register the writer's schema "
            "(schemas/history/) or upgrade cutline"
        )
    return writer, read_body(frame, HEADER_SIZE, writer, reader_of(writer.name), fp.hex())


def read_body(frame: bytes, start: int, writer: WriterSchema, reader: WriterSchema, schema: str) -> Any:
    """The datum of the Avro body from ``start`` to the end of ``frame``, written with ``writer``
    and resolved to ``reader``; ``schema`` names the writer's schema in errors.

    A body written with the reader's own schema is read by its compiled decoder; one written with
    another schema, or one the compiled decoder finds unusual (malformed, or not as fastavro would
    write it), by fastavro, which then decides what it is."""
    if reader is writer:
        decoder = body_decoder(writer)
        if decoder is not None:
            try:
                compiled, end = decoder(frame, start)
            except Unusual:
                pass
            else:
                if end == len(frame):
                    return compiled
    body = io.BytesIO(frame)
    body.seek(start)
    try:
        datum = schemaless_reader(body, writer.compiled, None if reader is writer else reader.compiled)
    except Exception as exc:  # fastavro raises EOFError, ValueError, IndexError, ...
        raise BodyMismatch(f"body does not match schema {writer.name} ({schema}): {exc!r}") from exc
    if body.tell() != len(frame):
        raise BodyMismatch(f"{len(frame) - body.tell()} bytes left after a {writer.name} body")
    return datum


# ------------------------------------------------------------------------ codec


class ConfluentFraming(Protocol):
    """The Confluent Schema Registry wire format (``events/wire/schema_registry.py``): magic byte 0, a
    4-byte big-endian schema id, the Avro body. Ids come from a registry, so this is I/O."""

    writes: bool
    """Whether records are written in this format (they are always read in it)."""

    def schema_id(self, topic: str, writer: WriterSchema) -> int:
        """The registry's id of ``writer`` under the topic's subject for the record."""
        ...

    def schema(self, schema_id: int) -> Mapping[str, Any]:
        """The Avro schema the registry has under ``schema_id``; LookupError if it has none."""
        ...


_FastReader = tuple[Decoder, Callable[[Mapping[str, Any]], Record], str]
"""A current schema's compiled body decoder, its record class's decoder, and the record's name."""

_UNSEEN: Any = object()

CONFLUENT_MAGIC = b"\x00"
CONFLUENT_HEADER_SIZE = 5


def _no_stop(record: Any) -> bool:
    """The trigger or barrier is not a stop-with-savepoint's."""
    return not (record.stop or record.drain)


PREVIOUS_WRITES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "CheckpointTriggered": ("2c29e7e517c4c776", _no_stop),
    "CheckpointBarrier": ("70b525cf8e22dc85", _no_stop),
}
"""Records written with the previous schema version's writer schema (fingerprint, in hex) while
they use nothing that version lacks (the predicate): then a reader of that version, during a rolling
upgrade, still reads them, and readers of this version read them as they read any older writer.
Schema v6 added stop-with-savepoint (``stop`` and ``drain`` of triggers and barriers, and the
requests ``JobStopRequested`` and ``JobCancelRequested``); every other trigger and barrier is
written as v5. A schema change updates this table to the version before it
(``tests/unit/test_codec.py`` checks that every record changed since the previous vector version is
here)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Retiming:
    """How a ``CheckpointAcknowledged`` body becomes the body of its ``TaskAcknowledged``: the two
    schemas lay their fields out alike, so only ``timestamp_ms`` is written anew."""

    header: bytes
    """The single-object header of the ``TaskAcknowledged`` schema."""
    target: WriterSchema
    strings_before: tuple[bool, ...]
    """For each field before ``timestamp_ms``: True for a string (a length, then its bytes), False
    for an int or long (one varint)."""


def _same_layout(a: WriterSchema, b: WriterSchema) -> bool:
    """Whether bodies of ``a`` and ``b`` are the same bytes for the same field values: their
    parsing canonical forms differ in the record's name alone."""
    return to_parsing_canonical_form({**a.parsed, "name": "_"}) == to_parsing_canonical_form(
        {**b.parsed, "name": "_"}
    )


def _retiming(source: WriterSchema, target: WriterSchema) -> _Retiming | None:
    if not _same_layout(source, target):
        return None
    kinds: list[bool] = []
    for field in source.parsed["fields"]:
        if field["name"] == "timestamp_ms":
            if field["type"] != "long":
                return None
            return _Retiming(MAGIC + target.fingerprint, target, tuple(kinds))
        if field["type"] not in ("string", "int", "long"):
            return None
        kinds.append(field["type"] == "string")
    return None


class Codec:
    """Encodes records to single-object frames (or, with ``confluent`` writing, Confluent frames)
    and decodes any known frame back, in either format.

    A record that needs nothing of the current schema version beyond the previous one is written
    with the previous version's schema (:data:`PREVIOUS_WRITES`)."""

    def __init__(
        self,
        registry: SchemaRegistry | None = None,
        confluent: ConfluentFraming | None = None,
        *,
        previous_writes: bool = True,
    ) -> None:
        """``previous_writes=False``: every record is written with the current schema (the test
        vectors of the current version)."""
        self.registry = registry or SchemaRegistry()
        self.confluent = confluent
        self._confluent_writers: dict[int, WriterSchema] = {}
        self._current: dict[bytes, _FastReader | None] = {}
        self._previous: dict[str, tuple[WriterSchema, Callable[[Any], bool]]] = {}
        for name, (fp, fits) in (PREVIOUS_WRITES if previous_writes else {}).items():
            previous = self.registry.writer(bytes.fromhex(fp))
            if previous is not None:  # a registry without schemas/history writes current schemas only
                self._previous[name] = (previous, fits)
        self._retimings: dict[bytes, _Retiming] = {}
        """Fingerprint of a ``CheckpointAcknowledged`` schema this codec writes -> how its bodies
        become ``TaskAcknowledged`` bodies of a schema this codec writes (:meth:`acknowledged`)."""
        for source in self._written("CheckpointAcknowledged"):
            for target in self._written("TaskAcknowledged"):
                retiming = _retiming(source, target)
                if retiming is not None:
                    self._retimings.setdefault(source.fingerprint, retiming)
        self._timestamp: tuple[int | None, bytes] = (None, b"")
        """The last timestamp :meth:`acknowledged` wrote, and its varint."""

    def _written(self, name: str) -> list[WriterSchema]:
        """The schemas this codec writes records named ``name`` with: the current one, the previous."""
        previous = self._previous.get(name)
        return [self.registry.current(name), *([previous[0]] if previous else [])]

    def writer_schema(self, record: Record) -> WriterSchema:
        """The schema ``record`` is written with: the previous version's when it needs nothing newer."""
        name = type(record).__name__
        previous = self._previous.get(name)
        if previous is not None and previous[1](record):
            return previous[0]
        try:
            return self.registry.current(name)
        except KeyError:
            raise UnknownRecordType(f"{name} is not a cutline record") from None

    def encode(self, record: Record, topic: str | None = None) -> bytes:
        """``record``'s frame; in the Confluent format when that is configured and ``topic`` (whose
        subjects its schema is registered under) is given."""
        schema = self.writer_schema(record)
        if topic is not None and self.confluent is not None and self.confluent.writes:
            header = CONFLUENT_MAGIC + self.confluent.schema_id(topic, schema).to_bytes(4, "big")
        else:
            header = MAGIC + schema.fingerprint
        encoder = body_encoder(schema, type(record))
        if encoder is not None:
            return encoder(record, header)
        out = io.BytesIO()
        out.write(header)
        schemaless_writer(out, schema.compiled, to_avro(record))
        return out.getvalue()

    def acknowledged(
        self, ack_frame: bytes, ack: CheckpointAcknowledged, event: TaskAcknowledged, topic: str | None = None
    ) -> bytes | None:
        """``encode(event, topic)``, made from ``ack_frame`` when ``event`` is the journal's record of
        ``ack`` (the record this codec decoded from ``ack_frame``): the same fields, and a timestamp of
        the coordinator's. The body is the ack's, with the event's timestamp written into it, under
        the ``TaskAcknowledged`` schema that lays out its fields alike. None when that does not hold
        (another field differs, a schema this codec does not write, the Confluent format): encode the
        event then.

        Written by hand because this is the coordinator's commonest write, and reusing the ack's
        bytes saves most of encoding the event (docs/benchmarks.md). The rest of the body is kept as
        the sender wrote it; it decoded to the ack's values, so it decodes to the event's."""
        if ack_frame[:2] != MAGIC:
            return None
        if topic is not None and self.confluent is not None and self.confluent.writes:
            return None
        retiming = self._retimings.get(ack_frame[2:HEADER_SIZE])
        if (
            retiming is None
            or event.job_id != ack.job_id
            or event.checkpoint_id != ack.checkpoint_id
            or event.attempt != ack.attempt
            or event.task_id != ack.task_id
            or (event.state is not ack.state and event.state != ack.state)
            or event.offsets != ack.offsets
            or event.metrics != ack.metrics
            or self.writer_schema(event) is not retiming.target
        ):
            return None
        p = HEADER_SIZE
        for is_string in retiming.strings_before:
            n = ack_frame[p]
            if n < 0x80:  # one byte: short strings, small ids
                p += 1
                if is_string:
                    p += (n >> 1) ^ -(n & 1)
            else:
                n, p = read_long(ack_frame, p)
                if is_string:
                    p += n
        start = p
        while ack_frame[p] & 0x80:  # past the ack's timestamp (the decoder read it: it ends)
            p += 1
        timestamp = event.timestamp_ms
        memo = self._timestamp  # read once: another thread may replace it meanwhile
        if memo[0] != timestamp:  # the acks of a batch share the coordinator's clock
            memo = self._timestamp = (timestamp, bytes(long_bytes(timestamp)))
        body_before, body_after = ack_frame[HEADER_SIZE:start], ack_frame[p + 1 :]
        return b"".join((retiming.header, body_before, memo[1], body_after))

    def decode(self, frame: bytes) -> Record:
        """The record in ``frame``; raises a :class:`DecodeError` subclass saying what is wrong."""
        fast: _FastReader | None = (
            self._current.get(frame[2:HEADER_SIZE], _UNSEEN) if frame[:2] == MAGIC else None
        )
        if fast is _UNSEEN:
            fast = self._current_reader(frame[2:HEADER_SIZE])
        if fast is not None:
            # A frame of a current schema: the compiled decoder, then the record (read_frame and
            # read_body would do the same, with more lookups; anything unusual goes their way).
            body, record_of, name = fast
            try:
                datum, end = body(frame, HEADER_SIZE)
            except Unusual:
                pass
            else:
                if end == len(frame):
                    try:
                        return record_of(datum)
                    except (TypeError, ValueError) as exc:
                        raise BodyMismatch(f"body does not make a valid {name}: {exc}") from exc
        registry = self.registry
        if frame[:1] == CONFLUENT_MAGIC and self.confluent is not None:
            writer, datum = self._read_confluent(frame)
        else:
            writer, datum = read_frame(frame, registry.writer, registry.current)
        cls = registry.record_class(writer.name)
        try:
            return from_avro(cls, cast(Mapping[str, Any], datum))
        except (TypeError, ValueError) as exc:
            raise BodyMismatch(f"body does not make a valid {writer.name}: {exc}") from exc

    def _current_reader(self, fp: bytes) -> _FastReader | None:
        """The compiled decoder and record decoder of the current schema with fingerprint ``fp``, or
        of the previous one this codec writes (:data:`PREVIOUS_WRITES`: it lacks only fields with
        plain defaults, which the record decoder fills in); None: another schema, or one the
        compiler leaves to fastavro. Remembered."""
        writer = self.registry.writer(fp)
        fast: _FastReader | None = None
        previous = self._previous.get(writer.name) if writer is not None else None
        if writer is not None and (
            writer is self.registry.current(writer.name) or (previous is not None and writer is previous[0])
        ):
            body = body_decoder(writer)
            if body is not None:
                fast = (body, avro_decoder(self.registry.record_class(writer.name)), writer.name)
        if len(self._current) < 1024:  # fingerprints of frames: garbage must not grow the memo
            self._current[fp] = fast
        return fast

    def record_name(self, frame: bytes) -> str | None:
        """The record type a frame holds, from its header alone (None: unknown or malformed)."""
        if frame[:2] == MAGIC and len(frame) >= HEADER_SIZE:
            writer = self.registry.writer(frame[2:HEADER_SIZE])
            return None if writer is None else writer.name
        if (
            frame[:1] == CONFLUENT_MAGIC
            and self.confluent is not None
            and len(frame) >= CONFLUENT_HEADER_SIZE
        ):
            try:
                return self._confluent_writer(int.from_bytes(frame[1:CONFLUENT_HEADER_SIZE], "big")).name
            except DecodeError:
                return None
        return None

    def _confluent_writer(self, schema_id: int) -> WriterSchema:
        writer = self._confluent_writers.get(schema_id)
        if writer is None:
            assert self.confluent is not None
            try:
                schema = self.confluent.schema(schema_id)
            except LookupError as exc:
                raise UnknownSchemaId(f"the schema registry has no schema {schema_id}: {exc}") from None
            parsed = cast(dict[str, Any], parse_schema(dict(schema), _write_hint=False))
            writer = self.registry.writer(schema_fingerprint(parsed))
            if writer is None:
                raise UnknownSchemaId(
                    f"schema {schema_id} ({parsed.get('name')}) is not a schema of cutline's records "
                    "(schemas/, schemas/history/)"
                )
            self._confluent_writers[schema_id] = writer
        return writer

    def _read_confluent(self, frame: bytes) -> tuple[WriterSchema, Any]:
        if len(frame) < CONFLUENT_HEADER_SIZE:
            raise TruncatedFrame(f"Confluent frame of {len(frame)} bytes is shorter than its 5-byte header")
        schema_id = int.from_bytes(frame[1:CONFLUENT_HEADER_SIZE], "big")
        writer = self._confluent_writer(schema_id)
        reader = self.registry.current(writer.name)
        return writer, read_body(frame, CONFLUENT_HEADER_SIZE, writer, reader, f"id {schema_id}")

    def decode_as(self, cls: type[R], frame: bytes) -> R:
        """Decode and check the record type."""
        record = self.decode(frame)
        if not isinstance(record, cls):
            raise BodyMismatch(f"expected {cls.__name__}, got {type(record).__name__}")
        return record


@cache
def codec_for(wire: WireSettings) -> Codec:
    """The codec of ``wire`` (one per settings in a process: it caches compiled schemas and ids)."""
    if not wire.schema_registry_url:
        return Codec()
    return Codec(confluent=RegistryFraming(wire.schema_registry_url, writes=wire.wire_format == "confluent"))


_process_wire = WireSettings()


def use_wire(wire: WireSettings) -> None:
    """Make ``wire`` the settings of this process's :func:`default_codec`."""
    global _process_wire
    _process_wire = wire


def process_wire() -> WireSettings:
    """The settings :func:`use_wire` last set (single-object framing unless a caller chose)."""
    return _process_wire


def default_codec() -> Codec:
    """The process's codec: of the settings :func:`use_wire` set, single-object framing otherwise."""
    return codec_for(_process_wire)


def encode(record: Record, topic: str | None = None) -> bytes:
    return default_codec().encode(record, topic)


def decode(frame: bytes) -> Record:
    return default_codec().decode(frame)
