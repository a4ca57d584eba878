"""Repeated client errors are logged once per 10 s, with a count (issue 51).

With the broker gone, aiokafka and librdkafka logged ~130 ERROR lines a second; the coordinator's
root handlers carry a :class:`RepeatedLines` filter for the clients' loggers.
"""

from __future__ import annotations

import logging

from coordinator.service.throttled_log import RepeatedLines


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(name: str, message: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, args, None)


def test_one_line_per_template_and_interval_then_the_count() -> None:
    clock = Clock()
    repeated = RepeatedLines(10_000, clock, only=("aiokafka",))
    template = "Unable connect to node with id %s: %s"

    passed = [repeated.filter(record("aiokafka", template, 111, "refused")) for _ in range(1000)]
    clock.now = 10.5
    later = record("aiokafka", template, 111, "refused")

    assert 1 == sum(passed)
    assert repeated.filter(later)
    assert "Unable connect to node with id 111: refused (and 999 more like it in the 10 s before)" == (
        later.getMessage()
    )


def test_other_templates_loggers_and_levels_pass() -> None:
    repeated = RepeatedLines(10_000, Clock(), only=("aiokafka",))
    repeated.filter(record("aiokafka", "Unable connect to node with id %s", 1))

    assert repeated.filter(record("aiokafka", "Failed fetch messages from %s", 1))
    assert repeated.filter(record("aiokafka.conn", "Unable connect to node with id %s", 1))
    assert repeated.filter(record("aiokafka", "Unable connect to node with id %s", 1, level=logging.INFO))
    assert all(repeated.filter(record("cutline.coordinator", "the broker is unreachable")) for _ in range(5))
