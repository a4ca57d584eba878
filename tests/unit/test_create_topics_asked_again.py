"""CreateTopics asked again when its request was cut (events.dev.broker._created): librdkafka fails a
request in flight with ``_DESTROY_BROKER`` when it drops a bootstrap address's handle for the
brokers the cluster's metadata names (a CI run's ``ensure_topics`` on a cluster of three, 2026-12-01).
The admin client here is a stand-in that answers each topic as told: what is tested is which answers
count as created, which are asked for again and which fail."""

from __future__ import annotations

import time
from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]  # not re-exported

from events.dev.broker import _created


class Answering:
    """An admin client whose CreateTopics answers each topic with ``answers[name]`` (None: created)."""

    def __init__(self, answers: dict[str, int | None]) -> None:
        self.answers = answers

    def create_topics(self, new: list[NewTopic], request_timeout: float) -> dict[str, Future[None]]:
        futures: dict[str, Future[None]] = {}
        for topic in new:
            future: Future[None] = Future()
            code = self.answers[topic.topic]
            if code is None:
                future.set_result(None)
            else:
                future.set_exception(KafkaException(KafkaError(code)))
            futures[topic.topic] = future
        return futures


def _asked(
    answers: dict[str, int | None], *, asked_again: bool = False, left_s: float = 10.0
) -> tuple[list[str], list[str]]:
    new = [NewTopic(name, num_partitions=1) for name in answers]
    return _created(Answering(answers), new, time.monotonic() + left_s, "localhost:9092", asked_again)  # type: ignore[arg-type]


def test_a_request_cut_before_its_answer_is_asked_again_and_the_others_count() -> None:
    answers = {
        "a": None,
        "b": KafkaError._DESTROY_BROKER,
        "c": KafkaError._TRANSPORT,
        "d": KafkaError.TOPIC_ALREADY_EXISTS,
    }
    assert (["a"], ["b", "c"]) == _asked(answers)


def test_a_topic_that_exists_when_asked_again_was_created_by_the_cut_request() -> None:
    assert (["b"], []) == _asked({"b": KafkaError.TOPIC_ALREADY_EXISTS}, asked_again=True)


def test_a_cut_request_with_no_time_left_fails() -> None:
    with pytest.raises(KafkaException, match="Broker handle destroyed|_DESTROY_BROKER|Local"):
        _asked({"b": KafkaError._DESTROY_BROKER}, left_s=-1.0)


def test_any_other_refusal_fails_at_once() -> None:
    with pytest.raises(KafkaException):
        _asked({"b": KafkaError.INVALID_REPLICATION_FACTOR})
