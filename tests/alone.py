"""Tests that run alone: while a test marked ``timed`` runs, no other pytest-xdist worker runs one.

A ``timed`` test asserts a bound of the product (every job completes a checkpoint within the session
timeout + 5 s of a failover), which the coordinators it starts should meet as on a machine of their
own, not on cores that the suite's other workers keep busy. Every other test holds a shared turn,
a timed test an exclusive one, so the other workers wait between two of their tests while it runs.

Hand-written over ``fcntl.flock`` because neither the standard library nor ``filelock`` has a
readers-writer lock between processes. A turnstile file makes it fair to the exclusive side:
``flock`` alone would grant shared turns to the workers' later tests ahead of a waiting timed test,
for as long as any of them holds one.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TURNS_VARIABLE = "CUTLINE_TEST_TURNS"
"""The directory of the two lock files, made by the run's first process (pytest-xdist's controller)
and inherited by its workers."""


@contextmanager
def turn(directory: Path, alone: bool) -> Iterator[None]:
    """Hold a turn to run a test: shared with the other workers' tests, or (``alone``) exclusive."""
    with open(directory / "turnstile", "a") as turnstile, open(directory / "running", "a") as running:
        fcntl.flock(turnstile, fcntl.LOCK_EX)  # a waiting exclusive turn holds it: later tests queue
        try:
            fcntl.flock(running, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(running, fcntl.LOCK_UN)
