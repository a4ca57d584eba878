"""The coordinator says when a batch of input was slow, and in which step."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import pytest

from coordinator.service.app import now_ms
from coordinator.service.inputs import SLOW_BATCH_S, report_slow_batch


def _report_slow_batch(messages: list[Fetched], *times: float) -> None:
    """The report, its wall clock the host's."""
    arrived, deciding, decided, published = times
    report_slow_batch(messages, arrived, deciding, decided, published, now_ms())


@dataclass
class Fetched:
    topic: str
    partition: int
    offset: int
    timestamp: int
    """CreateTime, in milliseconds (as aiokafka's records carry it)."""


def test_a_quick_batch_of_fresh_input_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    now = time.monotonic()
    with caplog.at_level(logging.WARNING, "cutline.coordinator"):
        _report_slow_batch([Fetched("acks", 3, 7, now_ms())], now, now + 0.001, now + 0.002, now + 0.01)

    assert [] == caplog.records


def test_a_batch_whose_journal_writes_took_long_is_logged_with_the_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = time.monotonic()
    with caplog.at_level(logging.WARNING, "cutline.coordinator"):
        _report_slow_batch([Fetched("acks", 3, 7, now_ms())], now - 5.0, now - 4.99, now - 4.98, now)

    [record] = caplog.records
    assert "slow batch of 1 inputs (first acks[3]@7)" in record.getMessage()
    assert "4.98 s until the journal writes were acked" in record.getMessage()


def test_input_that_arrived_late_is_logged_with_its_age(caplog: pytest.LogCaptureFixture) -> None:
    now = time.monotonic()
    late = Fetched("acks", 0, 1, now_ms() - int(2_000 * SLOW_BATCH_S))
    with caplog.at_level(logging.WARNING, "cutline.coordinator"):
        _report_slow_batch([late], now, now, now, now + 0.001)

    [record] = caplog.records
    age = float(record.getMessage().split("): ")[1].split(" s old")[0])
    assert 2 * SLOW_BATCH_S <= age < 2 * SLOW_BATCH_S + 1
