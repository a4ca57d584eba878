"""Journal files: the coordinator's journal, offline, as an Avro object container file.

Each record is a ``cutline.JournalEntry`` (``schemas/cutline.JournalEntry.avsc``):
one journal event and where it stood in the journal topic (partition, offset).
The file header carries the full writer schema, so any Avro tool reads it
(``fastavro``, ``avro-tools tojson``, Spark's ``avro`` source) and an older
cutline's file still decodes here through Avro schema resolution.

Replay reads the records of a file written with the current schema with cavro where it is
installed (a compiled Avro reader: 2.5 µs a record against fastavro's 6.6 on this journal; it
has wheels for CPython 3.11 and 3.12), else with fastavro, which also resolves files of older
schemas and writes every file. Both give the same entries (``tests/unit/test_journal.py``).

Blocks are written with the ``null`` codec by default: on a 1M-event journal
it reads back 10-15 % faster than ``deflate`` and writes about 10 % faster,
but the file is about 4x larger (276 MB against 69 MB; see
``docs/benchmarks.md``). Pass ``codec="deflate"`` for files that travel.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import IO, Any, Final, Literal, TypeAlias, cast

import fastavro
from fastavro.read import SchemaResolutionError
from fastavro.schema import load_schema, to_parsing_canonical_form

from events.codec import SCHEMAS_DIR, avro_decoder, from_avro, to_avro
from events.records import JOURNAL_RECORDS, JournalEvent

__all__ = [
    "JOURNAL_SCHEMA_NAME",
    "JournalEntry",
    "JournalFileError",
    "journal_schema",
    "read_journal",
    "read_journal_events",
    "write_journal",
]

JOURNAL_SCHEMA_NAME: Final = "cutline.JournalEntry"

Codec: TypeAlias = Literal["null", "deflate"]
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
    path: StrPath, entries: Iterable[JournalEntry | JournalEvent], *, codec: Codec = "null"
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
    schema: ``"cavro"`` (the default where installed) or ``"fastavro"``. A file of another
    schema is always resolved by fastavro.
    """
    use_cavro = _cavro_chosen(reader)
    stream = open(path, "rb")  # noqa: SIM115 - the generator below owns and closes it
    try:
        decoders = _branch_decoders()
        records, current = _open_reader(stream, str(path), by_name=decoders is None)
        if decoders is not None and current and use_cavro:
            stream.seek(0)
            records = _cavro_records(stream)
    except BaseException:
        stream.close()
        raise
    if decoders is None or not current:
        return _events_by_name(stream, records, str(path))
    return _events_by_fields(stream, records, str(path), decoders)


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
def _branch_decoders() -> dict[tuple[str, ...], _Decoder] | None:
    """The decoder of each ``event`` union branch, by the branch's field names.

    fastavro builds each record's dict in schema field order and no two journal
    records have the same field names, so ``tuple(datum)`` names the branch: as
    exact as ``return_record_name`` and about 5 % faster on a whole replay. Only
    for files written with the current schema (schema resolution may reorder and
    add fields); None (read by record name instead) if two records ever share
    their field names.
    """
    (event_field,) = [f for f in journal_schema()["fields"] if f["name"] == "event"]
    decoders: dict[tuple[str, ...], _Decoder] = {}
    for branch in event_field["type"]:
        if not isinstance(branch, Mapping) or branch.get("name") not in _CLASSES:
            return None
        decoders[tuple(f["name"] for f in branch["fields"])] = avro_decoder(_CLASSES[branch["name"]])
    return decoders if len(decoders) == len(_CLASSES) else None


def _open_reader(stream: IO[bytes], name: str, *, by_name: bool) -> tuple[Iterator[Any], bool]:
    """A fastavro reader of the journal in ``stream``, and whether it was written with the current
    schema (else the reader resolves it, and names union branches)."""
    magic = stream.read(len(_AVRO_MAGIC))
    if magic != _AVRO_MAGIC:
        what = "is empty" if not magic else f"starts with {magic!r}, not {_AVRO_MAGIC!r}"
        raise JournalFileError(
            f"{name} is not an Avro object container file (it {what}); a journal file is written by "
            "`cutline journal-demo` or coordinator.journal.write_journal"
        )
    stream.seek(0)
    try:
        reader = fastavro.reader(stream, return_record_name=by_name, return_record_name_override=by_name)
    except Exception as exc:  # fastavro raises ValueError, EOFError, struct.error ... on non-Avro input
        raise JournalFileError(
            f"{name} is not an Avro object container file ({exc}); a journal file is written by "
            "`cutline journal-demo` or coordinator.journal.write_journal"
        ) from exc
    writer_schema = reader.writer_schema
    found = writer_schema.get("name") if isinstance(writer_schema, Mapping) else None
    if found != JOURNAL_SCHEMA_NAME:
        raise JournalFileError(
            f"{name} is an Avro file of {found or repr(writer_schema)} records, not {JOURNAL_SCHEMA_NAME}; "
            "replay reads journal files (cutline journal-demo or write_journal writes them)"
        )
    if to_parsing_canonical_form(writer_schema) == _canonical_schema():
        return cast(Iterator[Any], reader), True
    # An older (or newer) JournalEntry schema: Avro schema resolution maps it to ours.
    stream.seek(0)
    try:
        resolving = fastavro.reader(
            stream,
            reader_schema=journal_schema(),
            return_record_name=True,
            return_record_name_override=True,
        )
        return cast(Iterator[Any], resolving), False
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
    importing it takes numpy, about 0.2 s, so only replay does)."""
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
