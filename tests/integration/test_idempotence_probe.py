"""The idempotence probe at a coordinator's start says what it found, without an ERROR (issue 51).

On the embedded Tansu broker every coordinator start logged aiokafka's ``ERROR … InitProducerIdRequest``
next to the demo's exactly-once claim. The broker's refusal is the probe's answer: no ERROR line, and
the warning the coordinator logs names the deviation and what a repeated journal write means.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from coordinator.service.app import broker_supports_idempotence
from events.dev.broker import EmbeddedBroker


@pytest.fixture(name="tansu", scope="module")
def _tansu() -> Iterator[str]:
    with EmbeddedBroker() as broker:
        yield broker.bootstrap


@pytest.mark.integration
@pytest.mark.tansu
def test_tansus_refusal_of_a_producer_id_is_an_answer_not_an_error(
    tansu: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        granted, why = broker_supports_idempotence(tansu)

    assert not granted and "refused an idempotent producer" in why
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [] == [f"{r.name}: {r.getMessage()}" for r in errors]
    assert logging.CRITICAL > logging.getLogger("aiokafka.producer.sender").getEffectiveLevel()
