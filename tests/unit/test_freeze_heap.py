"""The worker takes its start-up objects out of the garbage collector's sight."""

from __future__ import annotations

import gc
import weakref


class Node:
    """A weak-referenceable object that can take part in a reference cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


def _cycle() -> weakref.ref[Node]:
    """A reference cycle that is garbage as soon as this returns."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_objects_alive_at_start_are_frozen_and_later_garbage_is_still_collected() -> None:
    from coordinator.service.app import freeze_heap

    gc.unfreeze()
    alive_at_start = Node()
    alive_at_start.other = alive_at_start
    started = weakref.ref(alive_at_start)
    try:
        freeze_heap()
        del alive_at_start  # now a cycle of garbage, but one the collector no longer walks
        later = _cycle()  # garbage made after the freeze, as the worker makes while it runs
        gc.collect()

        assert started() is not None
        assert later() is None
    finally:
        gc.unfreeze()
        gc.collect()
    assert started() is None  # unfrozen, it is collected like any cycle
