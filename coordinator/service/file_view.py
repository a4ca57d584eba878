"""The file system's answers to the runtime's questions (:mod:`coordinator.core.links`): whether a ``file:``
path leads out of where it must stay through a symbolic link (docs/security.md).

:class:`FileChecks` is the port the runtime asks through, before it decides; :class:`LocalFiles`
answers it from the host's file system (:func:`linked_out`, :func:`resolved_outside`), through one
:class:`BatchFileView` per decided batch.

The check walks the names below a checkpoint's root and asks of each whether it is a symbolic
link, something else, or not there. Asked with one ``lstat`` per name and ack, that is a system
call inside the worker per name during an ack flood (far dearer there than in a tight loop), and
each ack asks two or three names (the job's directory, the checkpoint's, the state file): enough
to lower the worker's acks per second visibly (docs/benchmarks.md).

A :class:`BatchFileView` answers for the inputs of one batch:

- a path asked again in the batch gets the same answer (the checkpoint's directory is asked by
  every ack of the checkpoint);
- once ``scan_after`` names of one directory have been asked, the directory is listed once
  (``os.scandir``: one listing for all its names; ``DirEntry.is_symlink`` uses the type the
  listing carries, and asks ``lstat`` itself where the file system gives none), and the other
  names of the batch are answered from the listing;
- a name the listing lacks is asked with ``lstat`` (it may have come after the listing), and a
  directory that cannot be listed is asked name by name.

So the check holds as of the batch rather than of each ack: a name that becomes a link while
its batch is decided (a fraction of a second) is seen by the next batch. That is no weaker than
before: a task that can write into the location can swap a file for a link after its ack was
checked anyway, which is why readers of snapshots must not follow links out either.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import stat
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Literal, Protocol

from events.wire.validation import InvalidUri, StorageUri, parse_below, parse_uri

SCAN_AFTER = 4
"""Names of one directory asked in a batch before it is listed: a batch of a few acks (the usual
case below floods) asks ``lstat``; a flood lists each checkpoint directory once per batch."""


def is_link(path: str) -> bool | None:
    """Whether ``path`` is a symbolic link; None when it is not there or cannot be seen."""
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return None


class BatchFileView:
    """:func:`is_link`, answered from what the file system said earlier in the same batch."""

    def __init__(self, scan_after: int = SCAN_AFTER) -> None:
        if scan_after < 1:
            raise ValueError(f"scan_after must be at least 1, got {scan_after}")
        self.scan_after = scan_after
        self._answers: dict[str, bool | None] = {}
        self._listings: dict[str, dict[str, os.DirEntry[str]] | None] = {}
        """Directory -> name -> its entry (asked whether it is a link only when the name is asked);
        None: the directory could not be listed."""
        self._asked: Counter[str] = Counter()
        self._walks: dict[tuple[str, tuple[str, ...]], bool | None] = {}
        self.checkpoint_directories: dict[tuple[str, tuple[str, ...]], str | Literal[False] | None] = {}
        """(checkpoint location, trusted roots) -> its directory's path below its root's real path,
        for the link check of the batch's acks (:func:`linked_out`): kept here, so that
        it lives exactly as long as the batch's view of the file system."""
        self.lstat_calls = 0
        self.listings = 0

    def is_link(self, path: str) -> bool | None:
        """Whether ``path`` (absolute, normalised) is a symbolic link; None when it is not there
        or cannot be seen."""
        if path in self._answers:
            return self._answers[path]
        directory, _, name = path.rpartition("/")
        listing = self._listing(directory)
        answer: bool | None
        entry = listing.get(name) if listing is not None else None
        if entry is not None:
            try:
                answer = entry.is_symlink()  # the listing's type; lstat only where it gave none
            except OSError:
                answer = None
        else:
            self.lstat_calls += 1
            answer = is_link(path)
        self._answers[path] = answer
        return answer

    def walk(self, path: str, names: Sequence[str]) -> bool | None:
        """Asks :meth:`is_link` of ``path/names[0]``, ``path/names[0]/names[1]`` and so on, until
        an answer is not False: True when none was a link and all were there, None when one was
        not there, False when one was a link. Remembered for the batch (every ack of a checkpoint
        walks the same names down to its directory)."""
        key = (path, tuple(names))
        if key in self._walks:
            return self._walks[key]
        answer: bool | None = True
        for name in names:
            path = path + "/" + name
            linked = self.is_link(path)
            if linked is None or linked:
                answer = None if linked is None else False
                break
        self._walks[key] = answer
        return answer

    def _listing(self, directory: str) -> dict[str, os.DirEntry[str]] | None:
        if directory in self._listings:
            return self._listings[directory]
        self._asked[directory] += 1
        if self._asked[directory] < self.scan_after:
            return None
        self.listings += 1
        listing: dict[str, os.DirEntry[str]] | None
        try:
            with os.scandir(directory or "/") as entries:
                listing = {entry.name: entry for entry in entries}
        except OSError:
            listing = None  # not there, or not readable: name by name (lstat may still see them)
        self._listings[directory] = listing
        return listing


class FileChecks(Protocol):
    """The file system's answers the runtime asks for before it decides (:mod:`coordinator.core.links`)."""

    def batch(self, scan_after: int) -> AbstractContextManager[object]:
        """Answer the questions asked inside this block as of one view of the file system."""
        ...

    def linked_out(self, uri: str, location: str, roots: tuple[str, ...]) -> str | None:
        """The real path of ``file:`` ``uri`` when a symbolic link takes it out of the real directory
        of the checkpoint at ``location`` (below the deepest of ``roots`` it is in); None when it
        stays inside, or is no ``file:`` URI."""
        ...

    def resolved_outside(self, uri: str, roots: tuple[str, ...]) -> str | None:
        """The real path of ``file:`` ``uri`` when it is in none of ``roots``' real paths; None when it
        is, or is no ``file:`` URI."""
        ...


class LocalFiles:
    """The :class:`~coordinator.service.ports.FileChecks` of the host's file system: each answer is
    :func:`linked_out` or :func:`resolved_outside`, asked of the batch's :class:`BatchFileView`
    inside :meth:`batch` (``lstat`` per name outside one)."""

    def __init__(self) -> None:
        self._view: BatchFileView | None = None

    @contextlib.contextmanager
    def batch(self, scan_after: int = SCAN_AFTER) -> Iterator[BatchFileView]:
        """Answer the questions asked inside this block from one view of the file system (each
        checkpoint directory listed once for the batch, not ``lstat`` per name and ack)."""
        self._view = view = BatchFileView(scan_after)
        try:
            yield view
        finally:
            self._view = None

    def linked_out(self, uri: str, location: str, roots: tuple[str, ...]) -> str | None:
        return linked_out(uri, location, roots, self._view)

    def resolved_outside(self, uri: str, roots: tuple[str, ...]) -> str | None:
        return resolved_outside(uri, roots)


@functools.lru_cache(maxsize=1024)
def _file_location(uri: str) -> StorageUri | None:
    """``_file_uri`` remembered: locations and roots are the same for many acks."""
    return _file_uri(uri)


def _file_uri(uri: str) -> StorageUri | None:
    try:
        parsed = parse_uri(uri)
    except InvalidUri:
        return None  # the decider has judged it
    return parsed if parsed.scheme == "file" else None


ROOT_TTL = 1.0
"""Seconds a root's real path is remembered: one ``realpath`` per ack (the handle's) instead of two.
Roots are the operator's directories; a link changed above them is seen within this time."""

_REAL_ROOTS: dict[str, tuple[float, str]] = {}


def _real_root(path: str) -> str:
    now = time.monotonic()
    hit = _REAL_ROOTS.get(path)
    if hit is not None and now - hit[0] < ROOT_TTL:
        return hit[1]
    real = os.path.realpath(path)
    if len(_REAL_ROOTS) >= 1024:
        _REAL_ROOTS.clear()
    _REAL_ROOTS[path] = (now, real)
    return real


def _below(path: str, root: str, *, strict: bool = True) -> bool:
    return path.startswith(root.rstrip("/") + "/") or (not strict and path == root)


def resolved_outside(uri: str, roots: Iterable[str]) -> str | None:
    """For a ``file:`` URI: its real path when that is not in (or equal to) the real path of any of
    ``roots``; None when it is, or when ``uri`` is not a ``file:`` URI. Reads the file system."""
    target = _file_uri(uri)
    if target is None:
        return None
    real = os.path.realpath(target.path)
    for root in filter(None, map(_file_location, roots)):
        if _below(real, _real_root(root.path), strict=False):
            return None
    return real


def linked_out(
    uri: str, location: str, roots: tuple[str, ...], files: BatchFileView | None = None
) -> str | None:
    """For a ``file:`` state handle of a checkpoint at ``location``: its real path when that is not
    below the checkpoint's real directory; None when it is (or when either is not a ``file:`` URI).

    The checkpoint's real directory is the real path of the root it was triggered under (the
    job's checkpoint location or a savepoint root: chosen by the operator) followed by the rest of
    ``location`` as written: links between the root and the checkpoint's directory (a ``chk-7``
    that is a link to ``/etc``) count as leaving it, links inside it to files inside it do not.
    Only the path below the root is walked (``lstat`` per name, until a name does not exist):
    what is not there cannot lead anywhere, and what the coordinator may not see, it cannot check.
    With ``files`` (the batch's view), names are asked of it instead of ``lstat`` one by one, and
    the names from the root down to the checkpoint's directory, the same for each of its acks,
    are walked once per batch (:meth:`BatchFileView.walk`).
    """
    if files is not None and not location.endswith("/"):
        cut = len(location)
        name = uri[cut + 1 :]
        if uri.startswith(location) and uri[cut : cut + 1] == "/" and _is_plain_name(name):
            # The usual handle, one plain name in the checkpoint's directory: that directory is
            # worked out once per batch, and only the name is asked. A link goes the long way below.
            directory = _checkpoint_directory(location, roots, files)
            if directory is None:
                return None  # not a file: location, or its directory is not there
            if directory is not False and not files.is_link(directory + "/" + name):
                return None
    anchored = _anchored(location, roots)
    handle = _file_handle(uri, location) if anchored is not None else None
    if handle is None or anchored is None:
        return None
    where, anchor = anchored
    n = len(anchor.segments)
    root = _real_root(anchor.path)
    base, below = root, handle.segments[n:]
    if handle.segments[:n] != anchor.segments:  # pragma: no cover - the decider made sure the
        base, below = "/", handle.segments  # handle is below the location; resolve it all anyway
    # ``path + "/" + name`` is os.path.join's answer here (names are plain, ``path`` ends in none).
    path = base.rstrip("/")
    ask = is_link
    first = 0
    if files is not None:
        ask = files.is_link
        depth = len(where.segments) - n  # names from the root down to the checkpoint's directory
        if base is root and 0 < depth < len(below) and handle.segments[: n + depth] == where.segments:
            walked = files.walk(path, below[:depth])
            if walked is None:
                return None  # not there: nothing below it is either
            if walked:  # no link on the way: only the names below the checkpoint's directory are left
                path, first = path + "/" + "/".join(below[:depth]), depth
    for name in below[first:]:
        path = path + "/" + name
        linked = ask(path)
        if linked is None:
            return None
        if not linked:
            continue
        directory = os.path.join(root, *where.segments[n:])
        real = os.path.realpath(os.path.join(base, *below))
        return None if _below(real, directory) else real
    return None


_PLAIN_NAME = re.compile(r"[^/%\\?#\x00-\x1f\x7f]+")
"""A path segment :func:`events.wire.validation.parse_uri` keeps as written (no escape, no separator,
no character it refuses); ``.`` and ``..`` are plain by this pattern and are excluded apart."""


def _is_plain_name(name: str) -> bool:
    return name not in (".", "..") and _PLAIN_NAME.fullmatch(name) is not None


def _checkpoint_directory(
    location: str, roots: tuple[str, ...], files: BatchFileView
) -> str | Literal[False] | None:
    """The path of ``location``'s directory below the real path of its root (as :func:`linked_out`
    builds it), when no name on the way from the root is a link; None when ``location`` is not a
    ``file:`` URI or a name on the way is not there; False when one is a link. Once per batch."""
    key = (location, roots)
    if key in files.checkpoint_directories:
        return files.checkpoint_directories[key]
    anchored = _anchored(location, roots)
    answer: str | Literal[False] | None = None
    if anchored is not None:
        where, anchor = anchored
        root = _real_root(anchor.path).rstrip("/")
        names = where.segments[len(anchor.segments) :]
        walked = files.walk(root, names) if names else True
        answer = "/".join((root, *names)) if walked else (None if walked is None else False)
    files.checkpoint_directories[key] = answer
    return answer


def _file_handle(uri: str, location: str) -> StorageUri | None:
    """A state handle's ``file:`` URI parsed (:func:`events.wire.validation.parse_below` its checkpoint
    location, as the decider parsed it); None when it is not a ``file:`` URI or does not parse."""
    try:
        parsed = parse_below(uri, location)
    except InvalidUri:
        return None  # the decider has judged it
    return parsed if parsed.scheme == "file" else None


@functools.lru_cache(maxsize=1024)
def _anchored(location: str, roots: tuple[str, ...]) -> tuple[StorageUri, StorageUri] | None:
    """A ``file:`` checkpoint location and the deepest of ``roots`` it is in (itself when in none);
    None when it is not a ``file:`` URI. Pure: remembered per checkpoint, not worked out per ack."""
    where = _file_location(location)
    if where is None:
        return None
    anchors = [r for r in filter(None, map(_file_location, roots)) if where.within(r, strict=False)]
    return where, max(anchors, key=lambda r: len(r.segments), default=where)
