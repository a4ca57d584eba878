"""What the Spark tests share: a 4-partition input topic of words, its producer, and waiting.

The fixtures ``given`` (an :class:`Input`) and ``coordinator`` are in conftest.py.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Producer
from support import eventually

from events.kafka.clients import producer_config

PARTITIONS = 4
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


@dataclass(frozen=True)
class Input:
    """A 4-partition input topic, its word producer and the test's job id."""

    topic: str
    words: Words
    job_id: str


def wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """:func:`support.eventually`, in the (condition, what, timeout) order of the Spark tests."""
    eventually(condition, timeout=timeout, what=what)


def every(seconds: float, stop: threading.Event, action: Callable[[], None]) -> None:
    while not stop.wait(seconds):
        action()


class Words:
    """Produces lines of words to the input topic and counts what it produced."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.produced: Counter[str] = Counter()
        self._producer = Producer(producer_config(bootstrap, {"linger.ms": 5}))
        self._n = 0

    def produce(self, lines: int) -> None:
        for _ in range(lines):
            words = [WORDS[(self._n * 7 + i) % len(WORDS)] for i in range(1 + self._n % 3)]
            self._producer.produce(self.topic, value=" ".join(words).encode(), partition=self._n % PARTITIONS)
            self.produced.update(words)
            self._n += 1
        assert 0 == self._producer.flush(30)
