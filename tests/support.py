"""Waiting in tests, and the brokers they talk to.

Tests that talk to a broker, a coordinator worker or Spark wait for a condition to
become true, never for a fixed time; :func:`eventually` polls it and, when it gives
up, says what was awaited and the last value it saw.

The brokers: Apache Kafka by default (:func:`local_broker`, :data:`TEST_KAFKA_CONFIG`), the embedded
Tansu with ``CUTLINE_TEST_BROKER=tansu``, or ``CUTLINE_BOOTSTRAP``'s cluster (:func:`kafka_bootstrap`);
the protocol's topics made as ``cutline topics create`` makes them (:func:`create_protocol_topics`).
"""

from __future__ import annotations

import importlib.util
import os
import reprlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, overload

from events.wire.topics import Topics

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


TEST_BROKER_VARIABLE = "CUTLINE_TEST_BROKER"
"""Which broker the tests start when ``CUTLINE_BOOTSTRAP`` names none: Apache Kafka by default
(:mod:`events.dev.apache_kafka`: Java 17 and, the first time, Maven), ``tansu`` for the embedded
broker (pip only), the explicit fallback for a machine without Java's build tools."""

BROKERS = ("kafka", "tansu")

TEST_FETCH_WAIT_MS = "100"
"""``CUTLINE_FETCH_WAIT_MS`` on the embedded broker (``CUTLINE_TEST_BROKER=tansu``):
``fetch.wait.max.ms`` of the coordinator workers and of the participants' and drivers' consumers
the tests start. That broker parks a fetch that finds nothing for half of it, so it adds up to
50 ms to a hop; shorter waits cost CPU the suite does not have (an idle worker and the broker's
answers to it: about 0.15 of a core at 50 ms, 0.13 at 100, 0.10 at 200)."""

KAFKA_FETCH_WAIT_MS = "500"
"""``CUTLINE_FETCH_WAIT_MS`` on Apache Kafka (the tests' own or ``CUTLINE_BOOTSTRAP``'s), which answers
a fetch as soon as records arrive: a long wait costs no latency there, as docs/usage.md tells users."""


TEST_KAFKA_HEAP = "256m"
"""``-Xmx`` of each Apache Kafka broker the tests start but the one that the pytest-xdist workers share
(:data:`SESSION_KAFKA_HEAP`): a session's own without xdist, and those of the tests that need one of
their own."""

SESSION_KAFKA_HEAP = "1g"
"""``-Xmx`` of the Apache Kafka broker that the pytest-xdist workers share: it holds the topics that
three workers' tests leave behind (with 256 MB it ran out of heap 15 minutes into the suite). Its
live heap grows by about 40 KB a topic of 2 partitions: about 330 MB at 4,000 topics."""

SESSION_BROKER_VARIABLE = "CUTLINE_TEST_SESSION_BROKER"
"""``bootstrap.servers`` of the Apache Kafka broker that every pytest-xdist worker's session shares
(the ``bootstrap`` fixture), set by the controller that started it (tests/conftest.py). Without it (no
xdist, the embedded Tansu broker) each session starts a broker of its own when a test first needs
one."""

TEST_KAFKA_CONFIG = {
    # a worker's --session-timeout of 3 s (tests/conftest.py) keeps the failover tests short;
    # Apache Kafka's default floor is 6 s
    "group.min.session.timeout.ms": "1000",
    # the internal topics of a broker that lives for one test session: 50 partitions each by
    # default, made when the first group or transactional producer appears
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.num.partitions": "4",
    # fewer idle threads on a 2-core machine shared by the tests' processes
    "num.network.threads": "2",
    "num.io.threads": "4",
    "num.recovery.threads.per.data.dir": "1",
    "background.threads": "4",
}
"""Settings of every Apache Kafka broker the tests start, beyond those of
:class:`~events.dev.apache_kafka.ApacheKafka` (a test cluster's, docs/usage.md)."""


def broker_kind() -> str:
    """The broker the tests start: ``kafka`` (the default) or ``tansu`` (``CUTLINE_TEST_BROKER``)."""
    chosen = os.environ.get(TEST_BROKER_VARIABLE, "").strip().lower() or "kafka"
    if chosen not in BROKERS:
        raise ValueError(f"{TEST_BROKER_VARIABLE}={chosen!r}: give one of {', '.join(BROKERS)}")
    return chosen


def on_apache_kafka() -> bool:
    """Whether the tests' broker is Apache Kafka (or an external cluster, ``CUTLINE_BOOTSTRAP``), not
    the embedded Tansu."""
    return bool(os.environ.get("CUTLINE_BOOTSTRAP")) or broker_kind() == "kafka"


@dataclass(frozen=True)
class LocalBroker:
    """A broker started on this machine for some tests: its address and its processes (each the
    leader of a process group of its own, which a test may SIGSTOP and SIGCONT)."""

    bootstrap: str
    pids: tuple[int, ...]
    directory: Path | None = None
    """Its data and logs (kept after a stop when a process of it had died: a test that kills it
    deletes them)."""


@contextmanager
def local_broker(heap: str = TEST_KAFKA_HEAP) -> Iterator[LocalBroker]:
    """A broker started here (at this process's niceness, from its main thread: it ends with the
    thread that started it) and stopped on exit: Apache Kafka (one node of ``heap``,
    :data:`TEST_KAFKA_CONFIG`), or the embedded Tansu broker with ``CUTLINE_TEST_BROKER=tansu``.
    Where Java or Maven is missing, Apache Kafka fails with what to install
    (:class:`~events.dev.apache_kafka.KafkaUnavailable`) and how to run on Tansu instead: never a
    silent skip."""
    if broker_kind() == "tansu":
        with tansu_broker() as tansu:
            yield tansu
        return
    from events.dev.apache_kafka import ApacheKafka, KafkaUnavailable

    # ends with this process: a pytest worker killed outright leaves no broker behind
    kafka = ApacheKafka(heap=heap, config=TEST_KAFKA_CONFIG, ends_with_parent=True)
    try:
        kafka.start()
    except KafkaUnavailable as exc:
        raise KafkaUnavailable(
            f"{exc}\nThe tests run on Apache Kafka by default; to run them on the embedded Tansu broker "
            f"instead (pip only): {TEST_BROKER_VARIABLE}=tansu uv run pytest"
        ) from exc
    try:
        yield LocalBroker(kafka.bootstrap, tuple(kafka.pids.values()), kafka.nodes[0].directory.parent)
    finally:
        kafka.stop()


@contextmanager
def tansu_broker() -> Iterator[LocalBroker]:
    """An embedded Tansu broker started here and stopped on exit."""
    from events.dev.broker import EmbeddedBroker

    with EmbeddedBroker(ends_with_parent=True) as broker:
        assert broker.pid is not None and broker.log_path is not None
        yield LocalBroker(broker.bootstrap, (broker.pid,), broker.log_path.parent)


@contextmanager
def kafka_bootstrap() -> Iterator[str]:
    """``bootstrap.servers`` of ``CUTLINE_BOOTSTRAP`` once it answers, or of a :func:`local_broker`."""
    from events.dev.broker import wait_for_broker

    external = os.environ.get("CUTLINE_BOOTSTRAP")
    if external:
        wait_for_broker(external, timeout=30)
        yield external
        return
    with local_broker() as broker:
        yield broker.bootstrap


def create_protocol_topics(bootstrap: str, prefix: str, partitions: int = TEST_PARTITIONS) -> Topics:
    """Every topic of ``prefix`` made as ``cutline topics create`` makes them (the journal kept for
    ever, the snapshots compacted: :func:`coordinator.service.app.ensure_topics`), so that a
    coordinator accepts them on any broker; plain ``create_topics`` leaves the journal with the
    broker's retention (7 days on Apache Kafka), which the coordinator refuses."""
    from coordinator.service.app import Settings, ensure_topics

    ensure_topics(Settings(bootstrap, prefix, partitions=partitions))
    return Topics(prefix)
