"""A test marked ``timed`` runs alone (tests/alone.py): an exclusive turn waits for every shared one,
and a shared turn asked for after a waiting exclusive one waits behind it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from alone import turn

SETTLE_S = 0.2
"""Long enough for a thread blocked in ``flock`` to have been granted the lock, were it free."""


def _take(
    directory: Path, alone: bool, order: list[str], name: str, release: threading.Event
) -> threading.Thread:
    def hold() -> None:
        with turn(directory, alone):
            order.append(name)
            release.wait(10)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread


def test_shared_turns_run_together(tmp_path: Path) -> None:
    order: list[str] = []
    release = threading.Event()
    first = _take(tmp_path, False, order, "first", release)
    second = _take(tmp_path, False, order, "second", release)
    time.sleep(SETTLE_S)
    assert sorted(order) == ["first", "second"]
    release.set()
    first.join(5)
    second.join(5)


def test_an_exclusive_turn_waits_for_the_shared_one_and_goes_before_a_later_shared_one(
    tmp_path: Path,
) -> None:
    order: list[str] = []
    shared_released, alone_released, later_released = threading.Event(), threading.Event(), threading.Event()
    running = _take(tmp_path, False, order, "running", shared_released)
    time.sleep(SETTLE_S)
    timed = _take(tmp_path, True, order, "timed", alone_released)
    time.sleep(SETTLE_S)
    later = _take(tmp_path, False, order, "later", later_released)
    time.sleep(SETTLE_S)
    assert order == ["running"], "the timed test started beside a running one, or a later one overtook it"
    shared_released.set()
    running.join(5)
    time.sleep(SETTLE_S)
    assert order == ["running", "timed"], "a later test ran beside the timed one"
    alone_released.set()
    timed.join(5)
    later.join(5)
    assert order == ["running", "timed", "later"]
