"""The file system as the simulator gives it to the production runtime and worker: in memory.

- :class:`SimFiles` (:class:`~coordinator.service.ports.FileChecks`): a file system without
  symbolic links, so every ``file:`` path stays where it is;
- :class:`SimMetadata` (:class:`~coordinator.service.ports.MetadataObjects`): the ``_metadata``
  objects the worker writes, by URI.

No host file is read or written under a seed, so a run replays exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class SimFiles:
    """No symbolic links anywhere: every answer is None (the path stays inside)."""

    def __init__(self) -> None:
        self.asked = 0
        """Questions answered (the runtime asks before it decides)."""

    @contextlib.contextmanager
    def batch(self, scan_after: int) -> Iterator[object]:
        yield self

    def linked_out(self, uri: str, location: str, roots: tuple[str, ...]) -> str | None:
        self.asked += 1
        return None

    def resolved_outside(self, uri: str, roots: tuple[str, ...]) -> str | None:
        self.asked += 1
        return None


class SimMetadata:
    """Metadata objects kept in memory, by URI."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def write(self, uri: str, frame: bytes) -> None:
        self.objects[uri] = frame
