"""Checks of untrusted strings at the coordinator's boundary: storage URIs (and their limits).

Pure functions: no file system, no network. Anything a task, a job driver or an
operator sends is parsed here once, the same way for every reader, so that a URI
cannot mean one thing to the location check and another to whoever opens it later.

**Storage URIs.** :func:`parse_uri` accepts exactly one spelling per object and
refuses everything else with :class:`InvalidUri` (a ``ValueError``):

- ``file:`` only as ``file:///absolute/path``: no host (``file://host/x`` and
  ``file://localhost/x`` are refused), no short forms (``file:/x``, ``file:x``).
  Plain paths are refused too: write ``Path(p).absolute().as_uri()``.
- fsspec schemes (:data:`OBJECT_STORE_SCHEMES`: ``s3``, ``gs``, ``abfs``,
  ``hdfs``, ``memory`` and their common aliases) as ``scheme://authority/key``:
  the bucket, container or name node is required, compared exactly, never
  percent-encoded. Any other scheme is refused.
- The scheme in lower case: ``FILE:`` or ``S3:`` is refused rather than
  normalised, so the journal never holds two spellings of one handle.
- Path segments are percent-decoded once, and must then be ordinary names:
  an encoded ``.``, ``/``, ``\\``, ``%`` or control character (``%2e``, ``%2F``,
  ``%5c``, ``%25``, ``%00``...) is refused, because someone decoding the URI
  once more would read a different path; so are raw backslashes and control
  characters, ``?`` and ``#``, invalid UTF-8, malformed escapes, ``.`` and
  ``..`` segments, and empty segments (``a//b``; one trailing ``/`` is allowed).
  A consequence: file names of state handles cannot contain ``%``.
- At most :data:`MAX_URI_LENGTH` characters.

Whether a ``file:`` handle reaches outside its location *through a symbolic
link* cannot be seen from the string: the coordinator's shell resolves it
(``realpath``) before it accepts the handle (``coordinator.service.runtime``).

:func:`parse_offsets_key` parses the ``topic:partition`` keys of an ack's offsets.

**Offsets keys.** Acks and completed checkpoints map ``topic:partition`` to the next offset to
read (docs/design.md, "Wire protocol"). :func:`parse_offsets_key` is the one parser of such a key,
used by the Spark driver, the Spark tasks and the participants alike:

- the key splits at its **last** colon: ``t:1:2`` is topic ``t:1``, partition 2.
  Kafka topic names cannot hold a colon, but the wire contract does not say
  so, and the coordinator splits the same way; so every reader agrees on what a
  key means, even a strange one;
- the topic is any non-empty string;
- the partition is a non-negative int in canonical ASCII decimal: digits
  ``0-9`` only (no sign, no space, no ``²`` or other Unicode digits that
  :meth:`str.isdigit` accepts but :class:`int` refuses), no leading zero
  (``t:01`` would name the same partition as ``t:1``), at most 2**31 - 1
  (Kafka's partition ids are Java ints).

A key that breaks a rule raises :class:`ValueError` with a message naming the
key and the rule. Readers ignore a record with such a key (with a log line);
they never let the error out of their poll loop.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, unquote

from events.wire.codegen import fast_init
from events.wire.sizes import excerpt

__all__ = [
    "INLINE_BUDGET_BYTES",
    "MAX_CHECKPOINT_ID",
    "MAX_DURATION_MS",
    "MAX_INLINE_THRESHOLD_BYTES",
    "MAX_MAP_ENTRIES",
    "MAX_PARTITION",
    "MAX_REQUEST_ID_BYTES",
    "MAX_TASKS",
    "MAX_TARGET_BYTES",
    "MAX_URI_LENGTH",
    "OBJECT_STORE_SCHEMES",
    "InvalidUri",
    "StorageUri",
    "canonical_uri",
    "is_within",
    "job_directory_problem",
    "parse_offsets",
    "parse_offsets_key",
    "parse_uri",
]

MAX_URI_LENGTH = 4096
"""Longest storage URI accepted (Linux's ``PATH_MAX``)."""

MAX_REQUEST_ID_BYTES: Final = 256
"""Longest ``request_id`` of a checkpoint, stop or cancel request, in UTF-8 bytes. The id is
journaled again in every decision that answers the request (a trigger, a rejection, an abort of the
queued request), so an unbounded one could make those decisions too large to journal. Only plain
checkpoint requests queue, and they carry no target: a job's queue holds at most
``MAX_QUEUED_REQUESTS`` (1000) ids, 256 KB, in its partition snapshot."""

MAX_TARGET_BYTES: Final = 4096
"""Longest savepoint ``target`` of a request, in UTF-8 bytes (a URI is at most
:data:`MAX_URI_LENGTH` characters; this bounds its bytes too)."""

MAX_MAP_ENTRIES = 100_000
"""Most entries in an ack's ``offsets`` or ``metrics`` map."""

MAX_TASKS = 100_000
"""Most tasks a RUNNING job may list."""

MAX_CHECKPOINT_ID = 2**62
"""Largest checkpoint id accepted: far beyond any real job, and far enough below Avro's ``long``
that ids counted on from it never overflow."""

MAX_INLINE_THRESHOLD_BYTES = 1024 * 1024
"""Largest ``inline_threshold_bytes`` a job may configure (Flink caps its memory threshold at 1 MiB)."""

INLINE_BUDGET_BYTES = 512 * 1024
"""Most inline state one checkpoint may gather from all its tasks: the completion record carries
all of it and must stay one Kafka record (1 MB by default)."""

MAX_DURATION_MS = 2**40
"""Longest interval, timeout or pause accepted (about 34 years): deadlines computed from it
never overflow Avro's ``long``."""

OBJECT_STORE_SCHEMES = frozenset(
    {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "hdfs", "webhdfs", "memory"}
)
"""fsspec schemes accepted besides ``file``; their authority (bucket, container, name node) is required."""

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_AUTHORITY = re.compile(r"[A-Za-z0-9._~@:-]+")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_FORBIDDEN = re.compile(r"[\\?#\x00-\x1f\x7f]")
_SAFE = "-._~!$&'()*+,;=:@"
"""Characters a canonical path segment keeps as they are (RFC 3986 ``pchar``)."""

_ENCODED_NAMES = {0x2E: "'.'", 0x2F: "'/'", 0x5C: "'\\'", 0x25: "'%'"}


class InvalidUri(ValueError):
    """A storage URI the coordinator refuses; the message says why."""


@fast_init
@dataclass(frozen=True, slots=True)
class StorageUri:
    """A parsed storage URI: its scheme, authority and decoded path segments.

    ``segments`` are plain names (never empty, ``.``, ``..``, nor containing ``/``);
    ``str()`` gives the canonical spelling.
    """

    scheme: str
    authority: str
    segments: tuple[str, ...]

    @property
    def path(self) -> str:
        """The decoded absolute path (``/`` for the root)."""
        return "/" + "/".join(self.segments)

    def __str__(self) -> str:
        encoded = "/".join(quote(s, safe=_SAFE) for s in self.segments)
        if not self.segments:
            return f"{self.scheme}://{self.authority}" + ("/" if self.scheme == "file" else "")
        return f"{self.scheme}://{self.authority}/{encoded}"

    def within(self, root: StorageUri, *, strict: bool = True) -> bool:
        """Is this URI below ``root`` (same scheme and authority)? ``strict=False``: or equal to it."""
        n = len(root.segments)
        return (
            self.scheme == root.scheme
            and self.authority == root.authority
            and self.segments[:n] == root.segments
            and (len(self.segments) > n or not strict)
        )

    @property
    def parent(self) -> StorageUri | None:
        """The URI one segment up; None at the root."""
        if not self.segments:
            return None
        return StorageUri(self.scheme, self.authority, self.segments[:-1])


@functools.lru_cache(maxsize=4096)
def parse_uri(uri: str) -> StorageUri:
    """Parse a storage URI by the rules of this module; raises :class:`InvalidUri`.

    Remembers its last few thousand answers (it is pure): an ack's handle is parsed by the decider
    and again by the shell's link check, a checkpoint's location for every ack.
    """
    if not uri:
        raise InvalidUri("empty URI")
    if len(uri) > MAX_URI_LENGTH:
        raise InvalidUri(f"URI of {len(uri)} characters is longer than {MAX_URI_LENGTH}")
    head, colon, rest = uri.partition(":")
    if not colon or not _SCHEME.fullmatch(head):
        raise InvalidUri(f"{_short(uri)} is not a URI with a scheme; write file:///absolute/path")
    scheme = head
    if scheme != scheme.lower():
        raise InvalidUri(f"scheme {scheme!r} must be written in lower case ({scheme.lower()!r})")
    if scheme == "file":
        if not rest.startswith("///"):
            raise InvalidUri(
                f"{_short(uri)}: a file URI must be file:///absolute/path (no host, not file:/path)"
            )
        authority, path = "", rest[2:]
    elif scheme in OBJECT_STORE_SCHEMES:
        if not rest.startswith("//"):
            raise InvalidUri(f"{_short(uri)}: a {scheme} URI must be {scheme}://bucket/key")
        authority, slash, tail = rest[2:].partition("/")
        if not _AUTHORITY.fullmatch(authority):
            raise InvalidUri(
                f"{_short(uri)}: a {scheme} URI needs a bucket (or container, or host), "
                "written with letters, digits and ._~@:- only"
            )
        path = slash + tail
    else:
        raise InvalidUri(
            f"unsupported scheme {scheme!r}: use file or one of {', '.join(sorted(OBJECT_STORE_SCHEMES))}"
        )
    return StorageUri(scheme, authority, _segments(path, uri))


def _segments(path: str, uri: str) -> tuple[str, ...]:
    if not path:
        return ()
    raw = path[1:].split("/")
    if raw[-1] == "":
        raw.pop()  # one trailing slash
    if (
        "%" not in path
        and "" not in raw
        and "." not in raw
        and ".." not in raw
        and not _FORBIDDEN.search(path)
    ):
        # Plain names, the usual case: each would pass _segment unchanged (one check of the whole
        # path instead of one per segment; a state handle is parsed for every ack).
        return tuple(raw)
    return tuple([_segment(segment, uri) for segment in raw])


def _segment(raw: str, uri: str) -> str:
    if not raw:
        raise InvalidUri(f"{_short(uri)} has an empty path segment ('//')")
    bad = _FORBIDDEN.search(raw)
    if bad:
        raise InvalidUri(f"{_short(uri)} contains {bad.group()!r}")
    if "%" in raw:
        escapes = _ESCAPE.findall(raw)
        if raw.count("%") != len(escapes):
            raise InvalidUri(f"{_short(uri)} has a malformed percent escape")
        for escape in escapes:
            byte = int(escape, 16)
            if byte in _ENCODED_NAMES or byte < 0x20 or byte == 0x7F:
                name = _ENCODED_NAMES.get(byte, f"control character {byte:#04x}")
                raise InvalidUri(f"{_short(uri)} encodes {name} as %{escape}")
        try:
            raw = unquote(raw, errors="strict")
        except UnicodeDecodeError:
            raise InvalidUri(f"{_short(uri)} percent-encodes bytes that are not UTF-8") from None
    if raw in (".", ".."):
        raise InvalidUri(f"{_short(uri)} has a {raw!r} segment")
    return raw


def parse_below(uri: str, parent: str) -> StorageUri:
    """:func:`parse_uri` of ``uri``, worked out from ``parent``'s parse when ``uri`` is ``parent``,
    a ``/`` and plain names (a state handle below its checkpoint location, the usual case).

    Same answer, same errors: the shortcut is taken only where :func:`parse_uri` would split the
    rest into the same names and accept each one unchanged (the test of its plain-names fast path,
    applied to the rest); anything else, and a ``parent`` that does not parse, goes to
    :func:`parse_uri`. It exists because every ack's handle is a new string, so ``parse_uri``'s
    memo misses, while its location is the same for all of the checkpoint's acks
    (``tests/property/test_uri_properties.py`` checks the two agree)."""
    cut = len(parent)
    if (
        len(uri) <= MAX_URI_LENGTH
        and uri.startswith(parent)
        and uri[cut : cut + 1] == "/"
        and not parent.endswith("/")
    ):
        rest = uri[cut + 1 :]
        names = rest.split("/")
        if names[-1] == "":
            names.pop()  # one trailing slash, as parse_uri allows
        if (
            names
            and "%" not in rest
            and "" not in names
            and "." not in names
            and ".." not in names
            and not _FORBIDDEN.search(rest)
        ):
            try:
                base = parse_uri(parent)
            except InvalidUri:
                return parse_uri(uri)
            return StorageUri(base.scheme, base.authority, (*base.segments, *names))
    return parse_uri(uri)


def _short(uri: str) -> str:
    return repr(uri if len(uri) <= 200 else uri[:200] + "...")


def canonical_uri(uri: str) -> str:
    """The one spelling of ``uri`` (escapes decoded where they need not be, no trailing ``/``)."""
    return str(parse_uri(uri))


def is_within(uri: str, location: str) -> bool:
    """Is ``uri`` strictly below ``location``? False when either is not a valid storage URI."""
    try:
        return parse_uri(uri).within(parse_uri(location))
    except InvalidUri:
        return False


# ---------------------------------------------------------------- offsets keys

MAX_PARTITION: Final = 2**31 - 1
"""The highest partition id Kafka can have (a Java int)."""

_DIGITS: Final = frozenset("0123456789")


def parse_offsets_key(key: str) -> tuple[str, int]:
    """The ``(topic, partition)`` an offsets key ``topic:partition`` names; ValueError if it is malformed.

    See the module docstring for the rules: split at the last colon, a non-empty
    topic, a partition in canonical ASCII decimal between 0 and 2**31 - 1.
    """
    if not isinstance(key, str):
        raise ValueError(f"offsets key {excerpt(key)!r} is not a string")
    topic, colon, partition = key.rpartition(":")
    if not colon:
        raise ValueError(f"offsets key {excerpt(key)!r} is not 'topic:partition': it has no ':'")
    if not topic:
        raise ValueError(f"offsets key {excerpt(key)!r} is not 'topic:partition': the topic is empty")
    if not partition:
        raise ValueError(f"offsets key {excerpt(key)!r} is not 'topic:partition': the partition is empty")
    if not set(partition) <= _DIGITS:
        raise ValueError(
            f"offsets key {excerpt(key)!r}: partition {excerpt(partition)!r} is not a non-negative "
            "decimal number (ASCII digits 0-9 only)"
        )
    if len(partition) > 1 and partition[0] == "0":
        raise ValueError(f"offsets key {excerpt(key)!r}: partition {excerpt(partition)!r} has a leading zero")
    number = int(partition)
    if number > MAX_PARTITION:
        raise ValueError(
            f"offsets key {excerpt(key)!r}: partition {number} is above Kafka's maximum {MAX_PARTITION}"
        )
    return topic, number


def parse_offsets(offsets: Mapping[str, int]) -> dict[tuple[str, int], int]:
    """``{topic:partition: offset}`` as ``{(topic, partition): offset}``; ValueError on the first bad entry.

    Keys follow :func:`parse_offsets_key`; offsets must be non-negative ints (the
    next offset to read).
    """
    parsed: dict[tuple[str, int], int] = {}
    for key, offset in offsets.items():
        tp = parse_offsets_key(key)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset {offset!r} of {excerpt(key)!r} is not a non-negative int")
        parsed[tp] = offset
    return parsed


def job_directory_problem(job_id: str, location: str) -> str | None:
    """Why ``job_id`` cannot name exactly one directory below checkpoint ``location`` (checkpoints
    go to ``<location>/<job_id>/chk-<id>``; an id such as ``..`` or ``a/b`` would put them
    elsewhere), or why ``location`` is no storage URI; None: it can. The coordinator refuses a
    RUNNING status for it (``INVALID_CONFIG``), and a driver checks it before it publishes one."""
    try:
        root = parse_uri(location)
        job_dir: StorageUri | None = parse_uri(f"{location.rstrip('/')}/{job_id}")
    except InvalidUri:
        job_dir = None
    if job_dir is None or job_dir.segments != (*root.segments, job_id):
        return (
            f"job id {excerpt(job_id)!r} cannot name a directory of checkpoint location {excerpt(location)!r}"
            " (it must be one path segment: no '/', not '.' or '..')"
        )
    return None
