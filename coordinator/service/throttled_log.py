"""A logger's warnings through a :class:`~coordinator.service.log_throttle.LogThrottle`: one line per key and
interval, then a line counting those held back (docs/coordinator.md, "Logs")."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from coordinator.service.log_throttle import DEFAULT_INTERVAL_MS, HeldBack, LogThrottle

__all__ = ["NOISY_LOGGERS", "RepeatedLines", "ThrottledLog", "throttle_repeated_lines"]

NOISY_LOGGERS = ("aiokafka", "faust", "mode", "events.kafka.clients")
"""Loggers of the clients that repeat a line many times a second while the broker is unreachable
(aiokafka's "Unable connect to node", librdkafka's "Connect ... failed: Connection refused")."""


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


class RepeatedLines(logging.Filter):
    """Lets one warning or error per logger and message template through per ``interval_ms``; the
    next one let through says how many it stands for. With the broker gone, aiokafka and librdkafka
    logged ~130 ERROR lines a second (10,000 in 75 s), burying the one line that said why.

    ``only``: throttle the records of these loggers and of those below them (none: every logger)."""

    def __init__(
        self,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        clock: Callable[[], float] = time.monotonic,
        only: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self._throttle = LogThrottle(interval_ms)
        self._clock = clock
        self._only = only
        # Log records come from the event loop and from the clients' threads: one at a time here.
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not _below(record.name, self._only):
            return True
        key = f"{record.name}: {record.msg}"
        with self._lock:
            self._throttle, admission = self._throttle.admit(key, int(self._clock() * 1000))
        if admission.log and admission.ended is not None:
            held = admission.ended
            seconds = held.interval_ms / 1000
            # no "%" in the addition: the template formats as before, with its args or without
            record.msg = f"{record.msg} (and {held.count:,} more like it in the {seconds:g} s before)"
        return admission.log


def _below(name: str, only: tuple[str, ...]) -> bool:
    return not only or any(name == prefix or name.startswith(prefix + ".") for prefix in only)


def throttle_repeated_lines(
    names: Iterable[str] = NOISY_LOGGERS, interval_ms: int = DEFAULT_INTERVAL_MS
) -> RepeatedLines:
    """Put one :class:`RepeatedLines` for the records of the loggers ``names`` and below them on the
    root logger's handlers (a filter there sees every record, whatever logger it came from). Call
    it once the logging is set up: a Faust worker sets it up as it starts. Returns it."""
    repeated = RepeatedLines(interval_ms, only=tuple(names))
    for handler in logging.root.handlers:
        handler.addFilter(repeated)
    return repeated
