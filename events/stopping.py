"""Stopping on SIGTERM and SIGINT without a lock in the signal handler.

A Python signal handler runs in the main thread, between two bytecodes of whatever the main
thread was doing. If that was ``threading.Event.wait()`` and the handler calls ``Event.set()``,
both want the event's lock, which the main thread holds for a moment inside ``wait()``: a SIGTERM
that lands in that moment hangs the process for good. The same goes for anything in a handler
that takes a lock (logging, ``queue.put``, ``print`` to a buffered stream, ``Popen.poll``).

:class:`StopSignals` takes none: its handler only appends the signal's number to a list, and
the main thread sleeps in ``select`` on a socket that the interpreter writes each signal's number
to (``signal.set_wakeup_fd``), so a wait ends as soon as a signal arrives. It installs its
handler for SIGINT too when SIGINT was ignored: a background job of a non-interactive shell
(``bash -c 'cutline broker &'``) starts with SIGINT and SIGQUIT ignored.
"""

from __future__ import annotations

import select
import signal
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from types import FrameType, TracebackType
from typing import Any, Protocol, Self

__all__ = ["STOP_SIGNALS", "Stop", "StopRequested", "StopSignals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that ask a cutline command to stop."""

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class Stop(Protocol):
    """Something a loop asks whether to stop and sleeps on: a ``threading.Event`` or a
    :class:`StopSignals`."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class StopRequested(Exception):
    """Raised by :meth:`StopSignals.check` once a stop signal has arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class StopSignals:
    """Records SIGTERM and SIGINT (or ``signals``) while installed; a context manager, to be
    entered in the main thread. On exit the previous handlers and wakeup fd are back.

    The handler does nothing but append to :attr:`received`: the program looks at
    :attr:`requested` (or :meth:`is_set`, so that it can stand where a ``threading.Event`` did)
    and sleeps with :meth:`wait`, which returns as soon as a signal arrives."""

    def __init__(self, signals: Iterable[int] = STOP_SIGNALS) -> None:
        self.signals = tuple(signals)
        self.received: list[int] = []
        """The signals received, in order (appending takes no lock)."""
        self._woken: int | None = None
        """A signal seen on the wakeup socket whose Python handler may not have run yet."""
        self._woken_count = 0
        self._previous: dict[int, Handler] = {}
        self._previous_fd = -1
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None

    def __enter__(self) -> Self:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()
        signal.set_wakeup_fd(self._previous_fd)
        for end in (self._reader, self._writer):
            if end is not None:
                end.close()
        self._reader = self._writer = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)

    @property
    def requested(self) -> bool:
        """A stop signal has arrived."""
        return bool(self.received) or self._woken is not None

    @property
    def signum(self) -> int | None:
        """The first stop signal received, or None."""
        return self.received[0] if self.received else self._woken

    def is_set(self) -> bool:
        """:attr:`requested`, under ``threading.Event``'s name."""
        return self.requested

    def check(self) -> None:
        """Raise :class:`StopRequested` if a stop signal has arrived."""
        signum = self.signum
        if signum is not None:
            raise StopRequested(signum)

    def wait(self, timeout: float | None = None, fds: Sequence[int] = ()) -> bool:
        """Sleep until a stop signal arrives, one of ``fds`` is readable (a pidfd: the process
        exited) or ``timeout`` s have passed; whether a stop signal has arrived (at once if one has)."""
        if not self.requested:
            self.sleep(timeout, fds)
        return self.requested

    def sleep(self, timeout: float | None = None, fds: Sequence[int] = ()) -> None:
        """Sleep until a stop signal arrives (another one, if some have), one of ``fds`` is
        readable or ``timeout`` s have passed."""
        if self._reader is None:
            raise RuntimeError("StopSignals used outside its with block")
        deadline = None if timeout is None else time.monotonic() + timeout
        received, woken = len(self.received), self._woken_count
        while len(self.received) == received and self._woken_count == woken:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            ready, _, _ = select.select([self._reader.fileno(), *fds], [], [], remaining)
            self._drain()
            if any(fd in ready for fd in fds):
                return

    def _drain(self) -> None:
        """Empty the wakeup socket, noting a stop signal among the numbers written to it."""
        assert self._reader is not None
        while True:
            try:
                data = self._reader.recv(256)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                return
            for signum in data:
                if signum in self.signals:
                    self._woken_count += 1
                    if self._woken is None:
                        self._woken = signum
