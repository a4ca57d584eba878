"""Python's cycle collector run on a clock in the coordinator worker, not on allocation counts.

By default a young collection starts every 700 net allocations and an older one every tenth of
those. A worker deciding an ack flood keeps a batch's messages, outcomes and new states alive
while it decides, so it ran collections many times a second, walking those objects again and
again. ``bench/bench_coordinator.py`` compares the two (docs/benchmarks.md).

A worker switches the automatic collector off once it has started (``app.run``) and a timer
calls :meth:`ScheduledCollections.collect` every ``GC_INTERVAL_S``: the young generations each
time, everything every ``GC_FULL_EVERY`` times. Garbage without reference cycles (nearly all of
it) is still freed at once by reference counting; garbage in cycles waits up to a second, or
about a minute once it is old.

A collection that falls due while a fetched batch is being decided waits for the batch to end
(:meth:`ScheduledCollections.defer`, then :meth:`ScheduledCollections.collect_deferred` from the
fetch loop): the batch's messages, outcomes and encoded records are then freed, not walked. A
collection in the middle of a batch walks all of them and finds nothing to free.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("cutline.coordinator")

GC_INTERVAL_S = 1.0
"""Seconds between the worker's scheduled collections."""

GC_FULL_EVERY = 60
"""Every this many scheduled collections is a full one (about once a minute); the others collect
the young generations only (``gc.collect(1)``)."""

GC_SLOW_S = 0.25
"""A scheduled collection that takes longer than this is logged."""


class ScheduledCollections:
    """The worker's collections and the time they took (``/metrics``)."""

    def __init__(self, full_every: int = GC_FULL_EVERY) -> None:
        if full_every < 1:
            raise ValueError(f"full_every must be at least 1, got {full_every}")
        self.full_every = full_every
        self.runs = 0
        self.seconds = 0.0
        self.deferred = False
        """A collection fell due during a batch; the end of the batch runs it."""

    def defer(self) -> None:
        """The next collection is due, but a batch is being decided: run it when the batch ends."""
        self.deferred = True

    def collect_deferred(self) -> int:
        """Run the collection :meth:`defer` put off, if any (between batches); how many
        unreachable objects it found."""
        return self.collect() if self.deferred else 0

    def collect(self) -> int:
        """Run the next scheduled collection; how many unreachable objects it found."""
        self.deferred = False
        self.runs += 1
        full = self.runs % self.full_every == 0
        started = time.perf_counter()
        found = gc.collect() if full else gc.collect(1)
        took = time.perf_counter() - started
        self.seconds += took
        if took > GC_SLOW_S:
            log.warning("a %s garbage collection took %.2f s", "full" if full else "young", took)
        return found
