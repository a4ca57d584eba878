"""One view of the file system per decided batch, for the symbolic-link check (docs/security.md).

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

import os
import stat
from collections import Counter
from collections.abc import Sequence
from typing import Literal

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
        for the link check of the batch's acks (``coordinator.service.runtime``): kept here, so that
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
