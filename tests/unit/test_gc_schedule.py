"""The worker's garbage collections on a clock (coordinator/service/gc_schedule.py): with the
automatic collector off, cyclic garbage waits for the next scheduled collection; young cycles go
at every run, old ones at the full run."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from coordinator.service.gc_schedule import ScheduledCollections


class Node:
    """A weak-referenceable object that can take part in a reference cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


def _cycle() -> tuple[Node, weakref.ref[Node]]:
    """A reference cycle, held by the returned node until the caller drops it."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


@pytest.fixture
def automatic_collection_off() -> Iterator[None]:
    """As in a started worker (``app.run``): nothing is collected unless scheduled."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.usefixtures("automatic_collection_off")
def test_a_young_cycle_waits_for_the_next_scheduled_collection() -> None:
    collections = ScheduledCollections(full_every=60)
    held, cycle = _cycle()
    del held
    for _ in range(5_000):  # allocations that would have started automatic collections
        _cycle()
    assert cycle() is not None

    collections.collect()

    assert cycle() is None
    assert collections.runs == 1
    assert collections.seconds > 0


@pytest.mark.usefixtures("automatic_collection_off")
def test_an_old_cycle_waits_for_the_full_collection() -> None:
    """A cycle still in use at one collection is promoted to the oldest generation; once garbage,
    young collections leave it, and every ``full_every``-th run collects it."""
    collections = ScheduledCollections(full_every=3)
    held, cycle = _cycle()
    collections.collect()  # run 1: young, the cycle is alive and moves to the old generation
    del held

    collections.collect()  # run 2: young
    assert cycle() is not None

    collections.collect()  # run 3: full

    assert cycle() is None


def test_a_schedule_needs_a_full_collection_now_and_then() -> None:
    with pytest.raises(ValueError, match="full_every must be at least 1"):
        ScheduledCollections(full_every=0)


@pytest.mark.usefixtures("automatic_collection_off")
def test_a_collection_due_during_a_batch_runs_when_the_batch_ends() -> None:
    collections = ScheduledCollections(full_every=60)
    held, cycle = _cycle()
    del held
    assert collections.collect_deferred() == 0  # nothing put off: nothing run
    assert collections.runs == 0

    collections.defer()  # the timer fired while a batch was being decided
    assert cycle() is not None
    assert collections.runs == 0

    collections.collect_deferred()  # the batch ended

    assert cycle() is None
    assert collections.runs == 1
    assert collections.collect_deferred() == 0  # run once, not again
    assert collections.runs == 1


@pytest.mark.usefixtures("automatic_collection_off")
def test_a_collection_on_the_clock_settles_one_put_off() -> None:
    collections = ScheduledCollections(full_every=60)
    collections.defer()

    collections.collect()  # the next tick found no batch in flight

    assert not collections.deferred
    collections.collect_deferred()
    assert collections.runs == 1
