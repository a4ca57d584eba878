"""A request of a broker that is restarting is asked again until its timeout, never failed at once.

librdkafka answers a metadata or ListOffsets request whose connection broke with an error at once
(tests/integration/test_exactly_once_broker_restart.py breaks real ones); these pin which errors
are asked again, with a client that answers as librdkafka does.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from events.kafka.clients import UNREACHABLE, topic_metadata, watermark_offsets


class Restarting:
    """A client whose first ``failures`` requests fail with ``code``, then answer."""

    def __init__(self, code: int, failures: int = 1) -> None:
        self.code, self.failures, self.asked = code, failures, 0

    def _answer(self, answer: Any) -> Any:
        self.asked += 1
        if self.asked <= self.failures:
            raise KafkaException(KafkaError(self.code))
        return answer

    def list_topics(self, topic: str, timeout: float) -> Any:
        return self._answer(f"metadata of {topic}")

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> Any:
        return self._answer((0, 3))


@pytest.mark.parametrize("code", sorted(UNREACHABLE), ids=lambda code: KafkaError(code).name())
def test_a_metadata_request_that_finds_the_broker_unreachable_is_asked_again(code: int) -> None:
    client = Restarting(code)
    assert topic_metadata(client, "words", timeout=5) == "metadata of words"  # type: ignore[arg-type]
    assert client.asked == 2


def test_an_offsets_request_whose_broker_handle_was_destroyed_is_asked_again() -> None:
    client = Restarting(KafkaError._DESTROY_BROKER)
    assert watermark_offsets(client, TopicPartition("words", 0), timeout=5) == (0, 3)  # type: ignore[arg-type]
    assert client.asked == 2


def test_another_error_fails_at_once() -> None:
    client = Restarting(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        topic_metadata(client, "words", timeout=5)  # type: ignore[arg-type]
    assert client.asked == 1


def test_an_unreachable_broker_fails_the_request_at_its_timeout() -> None:
    client = Restarting(KafkaError._TRANSPORT, failures=1_000)
    with pytest.raises(KafkaException):
        topic_metadata(client, "words", timeout=0.2)  # type: ignore[arg-type]
    assert client.asked >= 1
