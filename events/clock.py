"""The wall clock of the task side, read in one place: the pure modules take time as data."""

from __future__ import annotations

import time

__all__ = ["now_ms"]


def now_ms() -> int:
    """The wall-clock time in milliseconds since the epoch: the ``timestamp_ms`` of a record a task
    or a job's driver writes."""
    return time.time_ns() // 1_000_000
