"""One log line per key and interval, and a count of the lines held back: how the coordinator logs
what a flood of input can repeat (a dead letter per refused input, docs/coordinator.md, "Logs").

Pure: the time comes in as data (``now_ms``), nothing is logged here. The first event of a key opens
a window of ``interval_ms`` and is logged; the others of that key inside the window are only
counted. The window's summary ("... and 9,999 more dead letters (UNKNOWN_TASK) in the 10 s after
it") is due when the window has ended: with the key's next logged line, or from :meth:`LogThrottle.due`,
which the shell asks on a timer so that the count of a flood that stopped is not lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DEFAULT_INTERVAL_MS", "Admission", "HeldBack", "LogThrottle", "Window"]

DEFAULT_INTERVAL_MS = 10_000
"""One line per key per 10 s."""


@dataclass(frozen=True, slots=True)
class Window:
    """The window a key's last logged line opened at ``opened_ms``, and the lines held back in it."""

    opened_ms: int
    held: int = 0


@dataclass(frozen=True, slots=True)
class HeldBack:
    """The lines of ``key`` held back in one window of ``interval_ms``."""

    key: str
    count: int
    interval_ms: int

    def line(self, what: str) -> str:
        """``... and 9,999 more dead letters (UNKNOWN_TASK) in the 10 s after it``."""
        return (
            f"... and {self.count:,} more {what} ({self.key}) in the {self.interval_ms / 1000:g} s "
            "after the last one logged"
        )


@dataclass(frozen=True, slots=True)
class Admission:
    """What to log for one event: its own line (``log``), after the summary of the key's window
    that ended, if lines were held back in it."""

    log: bool
    ended: HeldBack | None = None


@dataclass(frozen=True, slots=True)
class LogThrottle:
    """Per key, the open window (see the module's docstring)."""

    interval_ms: int = DEFAULT_INTERVAL_MS
    windows: Mapping[str, Window] = field(default_factory=dict)

    def admit(self, key: str, now_ms: int) -> tuple[LogThrottle, Admission]:
        """This throttle after one event of ``key`` at ``now_ms``, and what to log of it. A clock
        that went back opens a new window, as one past the interval does."""
        window = self.windows.get(key)
        if window is not None and 0 <= now_ms - window.opened_ms < self.interval_ms:
            return self._with(key, Window(window.opened_ms, window.held + 1)), Admission(log=False)
        ended = self._held_back(key, window)
        return self._with(key, Window(now_ms)), Admission(log=True, ended=ended)

    def due(self, now_ms: int) -> tuple[LogThrottle, list[HeldBack]]:
        """This throttle without the windows that ended by ``now_ms``, and the summaries of those
        that held lines back, by key."""
        ended = {
            key: window
            for key, window in self.windows.items()
            if not 0 <= now_ms - window.opened_ms < self.interval_ms
        }
        if not ended:
            return self, []
        kept = {key: window for key, window in self.windows.items() if key not in ended}
        summaries = [self._held_back(key, window) for key, window in sorted(ended.items())]
        return LogThrottle(self.interval_ms, kept), [s for s in summaries if s is not None]

    def _with(self, key: str, window: Window) -> LogThrottle:
        return LogThrottle(self.interval_ms, {**self.windows, key: window})

    def _held_back(self, key: str, window: Window | None) -> HeldBack | None:
        if window is None or window.held == 0:
            return None
        return HeldBack(key, window.held, self.interval_ms)
