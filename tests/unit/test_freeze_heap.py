"""The worker takes its start-up objects out of the garbage collector's sight."""

from __future__ import annotations

import gc
import weakref


class Node:
    """A weak-referenceable object that can take part in a reference cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


def _cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_objects_alive_at_start_are_frozen_and_later_garbage_is_still_collected() -> None:
    from coordinator.service.app import freeze_heap

    gc.unfreeze()
    survivors = [object() for _ in range(1000)]
    try:
        freeze_heap()
        frozen = gc.get_freeze_count()
        later = _cycle()  # garbage made after the freeze, as the worker makes while it runs
        gc.collect()

        assert frozen >= len(survivors)
        assert later() is None
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
