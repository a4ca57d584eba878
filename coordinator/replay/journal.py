"""Journal files: the coordinator's journal, offline, as an Avro object container file.

Each record is a ``cutline.JournalEntry`` (``schemas/cutline.JournalEntry.avsc``):
one journal event and where it stood in the journal topic (partition, offset).
The file header carries the full writer schema, so any Avro tool reads it
(``fastavro``, ``avro-tools tojson``, Spark's ``avro`` source) and an older
cutline's file still decodes here through Avro schema resolution.

Replay reads the records of a file written with the current schema (or with an older one that
only lacks event fields with plain defaults, which the decoders fill in) with cavro where it is
installed (a compiled Avro reader, faster than fastavro on this journal; it
has wheels for CPython 3.11 and 3.12), else with fastavro, which also resolves files of other
older schemas and writes every file. Both give the same entries (``tests/unit/test_journal.py``).

Blocks are written with the ``null`` codec by default: such a file reads back and
writes faster than with ``deflate``, but is several times larger (see
``docs/benchmarks.md``). Pass ``codec="deflate"`` for files that travel.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import IO, Any, Final, Literal, TypeAlias, cast

import fastavro
from fastavro.read import SchemaResolutionError
from fastavro.schema import load_schema, to_parsing_canonical_form

from events.wire.codec import PLAIN_DEFAULTS, SCHEMAS_DIR, avro_decoder, from_avro, to_avro
from events.wire.records import JOURNAL_RECORDS, JournalEvent

__all__ = [
    "JOURNAL_SCHEMA_NAME",
    "JournalEntry",
    "FileTally",
    "JournalFileError",
    "journal_schema",
    "read_journal",
    "read_journal_events",
    "read_journal_share",
    "write_journal",
]

JOURNAL_SCHEMA_NAME: Final = "cutline.JournalEntry"

ContainerCodec: TypeAlias = Literal["null", "deflate"]
"""The Avro block codecs a journal file may be written with (both are in every Avro library)."""

StrPath: TypeAlias = str | os.PathLike[str]

_AVRO_MAGIC: Final = b"Obj\x01"
_CLASSES: Final[dict[str, type[JournalEvent]]] = {f"cutline.{cls.__name__}": cls for cls in JOURNAL_RECORDS}


class JournalFileError(ValueError):
    """A file is not a cutline journal (not Avro, another schema, or damaged); the message says why
    and what to do."""


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One journal event and its position in the journal topic (-1: unknown)."""

    event: JournalEvent
    partition: int = -1
    offset: int = -1


@cache
def journal_schema() -> dict[str, Any]:
    """The parsed ``cutline.JournalEntry`` schema, every named type it uses inlined."""
    return cast(dict[str, Any], load_schema(str(SCHEMAS_DIR / "cutline.JournalEntry.avsc")))


@cache
def _canonical_schema() -> str:
    return to_parsing_canonical_form(journal_schema())


def write_journal(
    path: StrPath, entries: Iterable[JournalEntry | JournalEvent], *, codec: ContainerCodec = "null"
) -> int:
    """Write ``entries`` to a new journal file at ``path``; how many were written.

    A bare event gets partition -1 and, as its offset, its index in ``entries``.
    """
    count = 0

    def records() -> Iterator[dict[str, Any]]:
        nonlocal count
        for index, item in enumerate(entries):
            if isinstance(item, JournalEntry):
                event, partition, offset = item.event, item.partition, item.offset
            else:
                event, partition, offset = item, -1, index
            count += 1
            # Tuple notation names the union branch, so fastavro need not guess it from the fields.
            yield {
                "partition": partition,
                "offset": offset,
                "event": (f"cutline.{type(event).__name__}", to_avro(event)),
            }

    # Written beside the target and renamed into place, so a failed write leaves no half journal.
    partial = f"{os.fspath(path)}.partial-{os.getpid()}"
    try:
        with open(partial, "wb") as out:
            fastavro.writer(out, journal_schema(), records(), codec=codec)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        raise
    return count


def read_journal(path: StrPath) -> Iterator[JournalEntry]:
    """The entries of the journal file at ``path``, in file order.

    The file is opened and its header checked at once: a missing file raises
    :class:`FileNotFoundError`, a file that is not a journal raises
    :class:`JournalFileError`. A damaged block raises :class:`JournalFileError`
    when it is reached.
    """
    return (JournalEntry(event, partition, offset) for event, partition, offset in read_journal_events(path))


def read_journal_events(
    path: StrPath, *, reader: AvroReader | None = None
) -> Iterator[tuple[JournalEvent, int, int]]:
    """:func:`read_journal` as ``(event, partition, offset)`` tuples: replay's hot path.

    ``reader`` picks the Avro library that decodes the records of a file written with the current
    schema, or with an older one whose events only lack fields with plain defaults (schema v3
    against v4): ``"cavro"`` (the default where installed) or ``"fastavro"``. A file of any other
    schema is resolved by fastavro.
    """
    stream, records, decoders = _open_journal(path, reader)
    if decoders is None:
        return _events_by_name(stream, records, str(path))
    return _events_by_fields(stream, records, str(path), decoders)


@dataclass
class FileTally:
    """What a pass over a whole journal file saw of all its records, taken or not."""

    records: int = 0
    jobs: set[str] = field(default_factory=set)


def read_journal_share(
    path: StrPath, takes: Callable[[str], bool], tally: FileTally, *, reader: AvroReader | None = None
) -> Iterator[tuple[JournalEvent, int, int, int]]:
    """The events of the jobs ``takes`` accepts, as ``(event, partition, offset, index in the
    file)``; ``tally`` counts every record of the file and notes every job id as the pass goes.
    ``takes`` is asked once per job, in the order the jobs first appear in the file.

    Only taken records become events (about a quarter of a record's cost, the rest being the
    Avro reading), so two processes can split a replay by job, each reading the whole file
    (``coordinator/replay/split.py``). Errors are :func:`read_journal_events`'."""
    stream, records, decoders = _open_journal(path, reader)
    return _share(stream, records, str(path), decoders, takes, tally)


def _open_journal(
    path: StrPath, reader: AvroReader | None
) -> tuple[IO[bytes], Iterator[Any], dict[tuple[str, ...], _Decoder] | None]:
    """The open file, its records, and the decoders by field names of its events (None: its
    records name their union branches, read by name)."""
    use_cavro = _cavro_chosen(reader)
    stream = open(path, "rb")  # noqa: SIM115 - the caller's generator owns and closes it
    try:
        by_name = _branch_decoders(_schema_json()) is None
        records, as_written = _open_reader(stream, str(path), by_name=by_name)
        decoders = None if as_written is None or by_name else _branch_decoders(as_written)
        if decoders is not None and use_cavro:
            stream.seek(0)
            records = _cavro_records(stream)
    except BaseException:
        stream.close()
        raise
    return stream, records, decoders


AvroReader: TypeAlias = Literal["cavro", "fastavro"]
"""The libraries that can decode a journal file's records."""


@cache
def _cavro() -> Any | None:
    """The cavro module, or None where it is not installed (no wheel for this Python)."""
    try:
        import cavro
    except ImportError:
        return None
    return cavro


def _cavro_chosen(reader: AvroReader | None) -> bool:
    if reader is None:
        return _cavro() is not None
    if reader not in ("cavro", "fastavro"):
        raise ValueError(f"reader={reader!r}: the journal is read with 'cavro' or 'fastavro'")
    if reader == "cavro" and _cavro() is None:
        raise ValueError("reader='cavro', but cavro is not installed here; use reader='fastavro'")
    return reader == "cavro"


def _cavro_records(stream: IO[bytes]) -> Iterator[Any]:
    """cavro's reader of the journal in ``stream`` (at its start), its records as dicts in schema
    field order (as fastavro gives them); fastavro's if cavro cannot take the file."""
    cavro: Any = _cavro()
    try:
        options = cavro.DEFAULT_OPTIONS.replace(record_decodes_to_dict=True)
        return cast(Iterator[Any], iter(cavro.ContainerReader(stream, options=options)))
    except Exception:  # a schema cavro's rules refuse: fastavro reads what it wrote
        stream.seek(0)
        return cast(Iterator[Any], iter(fastavro.reader(stream)))


_Decoder: TypeAlias = Callable[[Mapping[str, Any]], JournalEvent]


@cache
def _schema_json() -> str:
    return json.dumps(journal_schema(), sort_keys=True)


@cache
def _branch_decoders(schema_json: str) -> dict[tuple[str, ...], _Decoder] | None:
    """The decoder of each ``event`` union branch of the journal schema ``schema_json`` (the
    current one, or an older one that only lacks fields with plain defaults), by the branch's
    field names.

    fastavro and cavro build each record's dict in schema field order and no two journal
    records have the same field names, so ``tuple(datum)`` names the branch: as
    exact as ``return_record_name`` and cheaper on a whole replay. Only
    for files read as they were written (schema resolution may reorder and
    add fields); None (read by record name instead) if two records ever share
    their field names.
    """
    (event_field,) = [f for f in json.loads(schema_json)["fields"] if f["name"] == "event"]
    decoders: dict[tuple[str, ...], _Decoder] = {}
    for branch in event_field["type"]:
        if not isinstance(branch, Mapping) or branch.get("name") not in _CLASSES:
            return None
        decoders[tuple(f["name"] for f in branch["fields"])] = avro_decoder(_CLASSES[branch["name"]])
    return decoders if len(decoders) == len(_CLASSES) else None


def _records_by_name(schema: Any, found: dict[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Every record defined in ``schema`` (named types inlined at their first use), by full name."""
    if isinstance(schema, list):
        for branch in schema:
            _records_by_name(branch, found)
    elif isinstance(schema, Mapping):
        kind = schema.get("type")
        if kind == "record":
            found[str(schema["name"])] = schema
            for f in schema["fields"]:
                _records_by_name(f["type"], found)
        elif kind == "array":
            _records_by_name(schema["items"], found)
        elif kind == "map":
            _records_by_name(schema["values"], found)
        elif isinstance(kind, list | Mapping):
            _records_by_name(kind, found)
    return found


def _pruned(schema: Any, keep: Mapping[str, Mapping[str, Any]]) -> Any:
    """``schema`` without the record fields ``keep`` (the writer's records) lacks, each of which
    must have a plain default (None, a number, a string); ValueError otherwise."""
    if isinstance(schema, list):
        return [_pruned(branch, keep) for branch in schema]
    if not isinstance(schema, Mapping):
        return schema
    kind = schema.get("type")
    if kind == "record":
        writer = keep.get(str(schema["name"]))
        names = {f["name"] for f in writer["fields"]} if writer is not None else None
        fields = []
        for f in schema["fields"]:
            if names is None or f["name"] in names:
                fields.append({**f, "type": _pruned(f["type"], keep)})
            elif "default" not in f or type(f["default"]) not in PLAIN_DEFAULTS:
                raise ValueError(f"{schema['name']}.{f['name']} has no plain default")
        return {**schema, "fields": fields}
    if kind == "array":
        return {**schema, "items": _pruned(schema["items"], keep)}
    if kind == "map":
        return {**schema, "values": _pruned(schema["values"], keep)}
    if isinstance(kind, list | Mapping):
        return {**schema, "type": _pruned(kind, keep)}
    return schema


@cache
def _lacks_only_plain_defaults(writer_json: str) -> bool:
    """Is ``writer_json`` (an older file's schema) the current journal schema without some event
    fields that have plain defaults, and otherwise the same (schema v3 against v4: inline state)?
    Then its records are read as they were written, cavro and the field-name decoders included, and
    the decoders fill in the missing fields' defaults; no schema resolution (about 2.5x slower)."""
    writer = json.loads(writer_json)
    if [f["name"] for f in writer["fields"]] != [f["name"] for f in journal_schema()["fields"]]:
        return False  # the entry's own fields are read as written: only the events' may be missing
    try:
        pruned = _pruned(journal_schema(), _records_by_name(writer, {}))
    except ValueError:
        return False
    return to_parsing_canonical_form(pruned) == to_parsing_canonical_form(writer)


def _open_reader(stream: IO[bytes], name: str, *, by_name: bool) -> tuple[Iterator[Any], str | None]:
    """A fastavro reader of the journal in ``stream``, and the schema (JSON) its records are read
    as written with: the current one, or an older one that only lacks fields with plain defaults;
    None when the reader resolves them to the current schema (and names union branches)."""
    magic = stream.read(len(_AVRO_MAGIC))
    if magic != _AVRO_MAGIC:
        what = "is empty" if not magic else f"starts with {magic!r}, not {_AVRO_MAGIC!r}"
        raise JournalFileError(
            f"{name} is not an Avro object container file (it {what}); a journal file is written by "
            "`cutline journal-demo` or coordinator.replay.journal.write_journal"
        )
    stream.seek(0)
    try:
        reader = fastavro.reader(stream, return_record_name=by_name, return_record_name_override=by_name)
    except Exception as exc:  # fastavro raises ValueError, EOFError, struct.error ... on non-Avro input
        raise JournalFileError(
            f"{name} is not an Avro object container file ({exc}); a journal file is written by "
            "`cutline journal-demo` or coordinator.replay.journal.write_journal"
        ) from exc
    writer_schema = reader.writer_schema
    found = writer_schema.get("name") if isinstance(writer_schema, Mapping) else None
    if found != JOURNAL_SCHEMA_NAME:
        raise JournalFileError(
            f"{name} is an Avro file of {found or repr(writer_schema)} records, not {JOURNAL_SCHEMA_NAME}; "
            "replay reads journal files (cutline journal-demo or write_journal writes them)"
        )
    if to_parsing_canonical_form(writer_schema) == _canonical_schema():
        return cast(Iterator[Any], reader), _schema_json()
    written = json.dumps(writer_schema, sort_keys=True)
    if not by_name and _lacks_only_plain_defaults(written) and _branch_decoders(written) is not None:
        return cast(Iterator[Any], reader), written
    # An older (or newer) JournalEntry schema: Avro schema resolution maps it to ours.
    stream.seek(0)
    try:
        resolving = fastavro.reader(
            stream,
            reader_schema=journal_schema(),
            return_record_name=True,
            return_record_name_override=True,
        )
        return cast(Iterator[Any], resolving), None
    except Exception as exc:
        raise JournalFileError(
            f"{name} was written with a {JOURNAL_SCHEMA_NAME} schema this cutline cannot resolve "
            f"({exc}); read it with the cutline version that wrote it"
        ) from exc


_READ_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    EOFError,
    KeyError,
    TypeError,
    IndexError,
    SchemaResolutionError,
)


def _read_errors() -> tuple[type[Exception], ...]:
    """What a damaged file raises while it is read (cavro's own errors too, once it is imported:
    importing it takes numpy, which is slow to import, so only replay does)."""
    cavro = sys.modules.get("cavro")
    return _READ_ERRORS if cavro is None else (*_READ_ERRORS, cavro.CavroException)


def _damaged(name: str, index: int, exc: Exception) -> JournalFileError:
    return JournalFileError(
        f"{name} is damaged after {index} entries ({type(exc).__name__}: {exc}); "
        "replay a prefix with --until, or take the journal again"
    )


def _events_by_fields(
    stream: IO[bytes], records: Iterator[Any], name: str, decoders: dict[tuple[str, ...], _Decoder]
) -> Iterator[tuple[JournalEvent, int, int]]:
    index = 0
    try:
        for record in records:
            datum = record["event"]
            yield decoders[tuple(datum)](datum), record["partition"], record["offset"]
            index += 1
    except _read_errors() as exc:
        raise _damaged(name, index, exc) from exc
    finally:
        stream.close()


def _share(
    stream: IO[bytes],
    records: Iterator[Any],
    name: str,
    decoders: dict[tuple[str, ...], _Decoder] | None,
    takes: Callable[[str], bool],
    tally: FileTally,
) -> Iterator[tuple[JournalEvent, int, int, int]]:
    taken: dict[str, bool] = {}  # takes() once per job, not per record
    index = 0
    try:
        for record in records:
            if decoders is None:
                record_name, datum = record["event"]
            else:
                datum = record["event"]
            job_id = datum["job_id"]
            take = taken.get(job_id)
            if take is None:
                take = taken[job_id] = takes(job_id)
            if take:
                event = (
                    from_avro(_CLASSES[record_name], datum)
                    if decoders is None
                    else decoders[tuple(datum)](datum)
                )
                yield event, record["partition"], record["offset"], index
            index += 1
    except _read_errors() as exc:
        raise _damaged(name, index, exc) from exc
    finally:
        tally.records = index
        tally.jobs.update(taken)
        stream.close()


def _events_by_name(
    stream: IO[bytes], records: Iterator[Any], name: str
) -> Iterator[tuple[JournalEvent, int, int]]:
    classes = _CLASSES
    index = 0
    try:
        for record in records:
            record_name, datum = record["event"]
            yield from_avro(classes[record_name], datum), record["partition"], record["offset"]
            index += 1
    except _read_errors() as exc:
        raise _damaged(name, index, exc) from exc
    finally:
        stream.close()
