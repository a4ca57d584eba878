"""``replay --verify`` of a journal file on the second core.

Replay folds the file's events into job states; ``--verify`` also runs the invariants
(:mod:`coordinator.core.invariants`) over the same events. Both are sequential, but they do not need
each other: the check reads only the events. So for a file, a forked helper process reads the file
itself and checks it while this process folds and prints. Each process decodes the file once;
the check and the fold, each comparable to the decoding, no longer add up on one core
(docs/benchmarks.md).

Only the verdict crosses over: the first violation and where it stands in the file. If the helper
cannot be started (not Linux, a threaded process), fails or dies, this process checks the file
itself afterwards, so the verdict is always the one-process verdict.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Generic, Protocol, TypeVar, cast

from coordinator.core.invariants import Violation, violations
from coordinator.replay.journal import FileTally, read_journal_events, read_journal_share
from events.wire.records import JournalEvent

T = TypeVar("T")


class Selection(Protocol):
    """Which events of the file a replay takes (``--job``, ``--until``)."""

    @property
    def job(self) -> str | None:
        """The one job taken (None: every job)."""
        ...

    def wanted(self, event: JournalEvent, offset: int) -> bool: ...


@dataclass(frozen=True)
class FirstViolation:
    """The first violation among the selected events (None: none), and the file position of the
    event it names (partition, offset; None when it names no event, as at the end of the file)."""

    violation: Violation | None
    position: tuple[int, int] | None = None


def check_file(path: Path, selection: Selection) -> FirstViolation:
    """The invariants over the selected events of the journal file at ``path``."""
    partitions, offsets = array("i"), array("q")  # not objects: nothing for the collector to walk

    def selected() -> Iterator[JournalEvent]:
        wanted = selection.wanted
        job = selection.job
        for event, partition, offset in (
            read_journal_events(path)
            if job is None
            else ((e, p, o) for e, p, o, _ in read_journal_share(path, job.__eq__, FileTally()))
        ):
            if wanted(event, offset):
                partitions.append(partition)
                offsets.append(offset)
                yield event

    return first_verdict(selected(), partitions, offsets)


def first_verdict(
    events: Iterator[JournalEvent], partitions: array[int], offsets: array[int]
) -> FirstViolation:
    """The first violation of the invariants over ``events``, placed by the file positions that
    whoever yields the events appends to ``partitions`` and ``offsets`` as each one passes."""
    for violation in violations(events):
        index = violation.index
        return FirstViolation(
            violation, (partitions[index], offsets[index]) if 0 <= index < len(offsets) else None
        )
    return FirstViolation(None)


def can_fork() -> bool:
    """Whether a helper may be forked here: Linux, and no other thread (a forked thread's lock stays
    held in the child)."""
    return sys.platform == "linux" and threading.active_count() == 1


class ForkedCall(Generic[T]):
    """``function()`` running in a forked helper process, from construction on (check
    :func:`can_fork` first). Only its answer crosses over, pickled."""

    def __init__(self, function: Callable[[], T], name: str) -> None:
        context = multiprocessing.get_context("fork")
        self._answers, answer = context.Pipe(duplex=False)
        self._process: BaseProcess = context.Process(
            target=_call_and_answer, args=(function, answer), name=name, daemon=True
        )
        self._process.start()
        answer.close()  # the helper's end: if it dies, recv() here raises EOFError

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def answer(self) -> T | None:
        """What ``function`` returned, or None if it raised or the helper died (the caller then does
        the work itself and reports any failure in its own words)."""
        try:
            return cast("T | None", self._answers.recv())
        except (EOFError, OSError):
            return None

    def kill(self) -> None:
        self._process.kill()

    def close(self) -> None:
        """Stop the helper whatever it is doing; its work is done or no longer wanted, and it holds
        nothing to clean up."""
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._answers.close()


def _call_and_answer(function: Callable[[], object], answer: Connection) -> None:
    """The helper process: ``function``'s result, or None if it failed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the command's to handle; it stops us
    try:
        result = function()
    except Exception:
        result = None
    answer.send(result)


class FileCheck:
    """:func:`check_file` running in a forked helper process, from construction on.

    :meth:`verdict` waits for it (or, if the helper could not run or died, checks here);
    :meth:`close` stops the helper whatever it is doing (use as a context manager).
    """

    def __init__(self, path: Path, selection: Selection) -> None:
        self._path = path
        self._selection = selection
        self._helper: ForkedCall[FirstViolation] | None = (
            ForkedCall(lambda: check_file(path, selection), "cutline-verify") if can_fork() else None
        )

    @property
    def in_helper(self) -> bool:
        """Whether the check runs in a helper process (else :meth:`verdict` runs it here)."""
        return self._helper is not None

    def verdict(self) -> FirstViolation:
        if self._helper is not None:
            answer = self._helper.answer()  # None if the helper died: check here (the verdict is the same)
            self.close()
            if isinstance(answer, FirstViolation):
                return answer
        return check_file(self._path, self._selection)  # also raises what reading the file raises

    def close(self) -> None:
        if self._helper is not None:
            self._helper.close()
            self._helper = None

    def __enter__(self) -> FileCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
