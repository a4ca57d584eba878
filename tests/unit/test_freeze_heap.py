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


def test_a_spark_task_freezes_its_python_worker_before_it_runs() -> None:
    """PySpark collects garbage after every task of a reused worker: the keyed map side (as the
    source, the keyed shuffle side and the per-partition step) freezes what is alive when its task
    starts, so that collection walks only the task's own objects."""
    from spark_tasks.keyed import route_step
    from spark_tasks.wordcount import KEYED_WORD_COUNT

    gc.unfreeze()
    try:
        assert 0 == gc.get_freeze_count()

        assert [] == list(route_step(KEYED_WORD_COUNT, 2)([]))

        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
