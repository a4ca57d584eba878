"""Waiting in tests: one bounded polling helper instead of hand-written loops.

Tests that talk to a broker, a coordinator worker or Spark wait for a condition to
become true, never for a fixed time; :func:`eventually` polls it and, when it gives
up, says what was awaited and the last value it saw.
"""

from __future__ import annotations

import importlib.util
import os
import reprlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar, overload

T = TypeVar("T")

TEST_PARTITIONS = 2
"""Partitions of the protocol's topics in the tests that run one coordinator worker (and of every
topic a coordinator the tests start creates: ``CUTLINE_PARTITIONS``, set by conftest.py). The
embedded broker's CPU grows with the partitions each idle fetch names: an idle worker on 8
partitions cost it about 0.09 of a core, on 2 about 0.04. The tests of several workers sharing
the jobs create their topics with the product's 8."""

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 600
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = _SHORT.maxdict = 30


@overload
def eventually(
    condition: Callable[[], T], *, timeout: float = ..., interval: float = ..., what: str = ...
) -> T: ...


@overload
def eventually(
    condition: Callable[[], T],
    until: Callable[[T], object],
    *,
    timeout: float = ...,
    interval: float = ...,
    what: str = ...,
) -> T: ...


def eventually(
    condition: Callable[[], T],
    until: Callable[[T], object] | None = None,
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "",
) -> T:
    """Call ``condition`` every ``interval`` seconds until its value passes (is truthy, or satisfies
    ``until``) and return that value; an ``AssertionError`` either raises counts as not yet.

    After ``timeout`` seconds it fails with ``what`` was awaited and the last value (or assertion)
    it saw. The condition is always tried once more at the deadline, so a slow first call still
    gets a second chance.
    """
    deadline = time.monotonic() + timeout
    while True:
        out_of_time = time.monotonic() >= deadline
        try:
            value = condition()
            if until(value) if until is not None else value:
                return value
            shown = _SHORT.repr(value)
        except AssertionError as error:
            shown = f"AssertionError: {error}"
        if out_of_time:
            raise AssertionError(
                f"gave up after {timeout:g}s waiting for {what or _name(condition)}; last seen: {shown}"
            )
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))


def _name(condition: Callable[..., object]) -> str:
    name = getattr(condition, "__name__", repr(condition))
    return "a condition" if name == "<lambda>" else name


def pyspark_script(name: str) -> Path:
    """``bin/<name>`` (``spark-submit``, ``spark-class``) of the installed PySpark, found without
    importing it."""
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None, "PySpark is one of the project's dependencies"
    return Path(spec.origin).parent / "bin" / name


@contextmanager
def kafka_bootstrap() -> Iterator[str]:
    """``bootstrap.servers`` of ``CUTLINE_BOOTSTRAP`` once it answers, or of an embedded broker
    started here (at this process's niceness) and stopped on exit."""
    from events.dev.broker import EmbeddedBroker, wait_for_broker

    external = os.environ.get("CUTLINE_BOOTSTRAP")
    if external:
        wait_for_broker(external, timeout=30)
        yield external
        return
    with EmbeddedBroker() as broker:
        yield broker.bootstrap
