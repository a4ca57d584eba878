"""Which events a replay takes (pure: no I/O): one job's, or every job's, up to a cut.

``cutline replay --job J --until OFFSET|TIME`` and the helper process that checks a journal
file (coordinator/replay/file_check.py) select events with a :class:`Selection`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum

from events.wire.records import JournalEvent

__all__ = ["Cut", "JournalSource", "Selection", "journal_source", "parse_until"]


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a replay stops: the last journal offset, or the last event time, to include."""

    offset: int | None = None
    time_ms: int | None = None

    def includes(self, event: JournalEvent, offset: int) -> bool:
        if self.offset is not None:
            return offset <= self.offset
        if self.time_ms is not None:
            return event.timestamp_ms <= self.time_ms
        return True

    def __str__(self) -> str:
        if self.offset is not None:
            return f"offset {self.offset}"
        if self.time_ms is not None:
            return _utc(self.time_ms)
        return "the end"


@dataclass(frozen=True, slots=True)
class Selection:
    """The events a replay takes: one job's (``--job``) up to the cut (``--until``)."""

    cut: Cut
    job: str | None = None

    def wanted(self, event: JournalEvent, offset: int) -> bool:
        return (self.job is None or event.job_id == self.job) and self.cut.includes(event, offset)


_MILLIS = re.compile(r"(\d+)\s*ms")


def parse_until(text: str | None) -> Cut:
    """``1234`` (an offset), ``2026-11-22T10:00:00Z`` (ISO 8601, UTC if no zone) or ``1795338000000ms``."""
    if text is None:
        return Cut()
    value = text.strip()
    if value.isdigit():
        return Cut(offset=int(value))
    millis = _MILLIS.fullmatch(value)
    if millis:
        return Cut(time_ms=int(millis.group(1)))
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"--until {text!r} is neither an offset nor a time: give the last journal offset to include "
            "(e.g. 1234), an ISO-8601 time (e.g. 2026-11-22T10:00:00Z) or epoch milliseconds "
            "(e.g. 1795338000000ms)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return Cut(time_ms=round(moment.timestamp() * 1000))


class JournalSource(Enum):
    """How ``cutline replay`` reads the journal."""

    SPLIT = "split"
    """A whole journal file, split by job over the process and a helper (coordinator/replay/split.py)."""
    ONE_JOB = "one-job"
    """One job's records of a journal file: the other jobs' records are not built into events."""
    FILE = "file"
    """Every record of a journal file, in order (for a cut, a timeline or a plot)."""
    TOPIC = "topic"
    """The journal topic, from its start to its current end."""


def journal_source(*, from_file: bool, selection: Selection, quiet: bool, plot: bool) -> JournalSource:
    """How to read the journal for ``selection``: a whole file, quiet and without a plot, is split by
    job; a file is otherwise read whole, or only one job's records; the topic is read whole."""
    if not from_file:
        return JournalSource.TOPIC
    if selection.job is not None:
        return JournalSource.ONE_JOB
    if quiet and not plot and selection.cut == Cut():
        return JournalSource.SPLIT
    return JournalSource.FILE


def _utc(timestamp_ms: int) -> str:
    """``2026-11-22T10:00:00.123Z``, as :func:`coordinator.replay.timeline.format_time` prints a time."""
    try:
        moment = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return f"{timestamp_ms}ms"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
