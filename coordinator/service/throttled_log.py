"""A logger's warnings through a :class:`~coordinator.log_throttle.LogThrottle`: one line per key and
interval, then a line counting those held back (docs/coordinator.md, "Logs")."""

from __future__ import annotations

import logging

from coordinator.log_throttle import DEFAULT_INTERVAL_MS, HeldBack, LogThrottle

__all__ = ["ThrottledLog"]


class ThrottledLog:
    """Warnings of ``what`` (``"dead letters"``) to ``logger``, at most one a key per ``interval_ms``."""

    def __init__(self, logger: logging.Logger, what: str, interval_ms: int = DEFAULT_INTERVAL_MS) -> None:
        self.logger = logger
        self.what = what
        self.throttle = LogThrottle(interval_ms)

    def warning(self, key: str, now_ms: int, message: str, *args: object) -> None:
        """``logger.warning(message, *args)`` unless a line of ``key`` was logged less than the
        interval ago (then it is counted); first the count of the key's last window, if any."""
        self.throttle, admission = self.throttle.admit(key, now_ms)
        if admission.ended is not None:
            self._held_back(admission.ended)
        if admission.log:
            self.logger.warning(message, *args)

    def flush(self, now_ms: int) -> None:
        """Log the counts of the windows that ended by ``now_ms`` (a timer calls it, so that the
        count of a flood that stopped is logged too)."""
        self.throttle, ended = self.throttle.due(now_ms)
        for held in ended:
            self._held_back(held)

    def _held_back(self, held: HeldBack) -> None:
        self.logger.warning("%s", held.line(self.what))
