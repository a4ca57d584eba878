"""The direct consumer (coordinator/service/direct.py) overrides a private Faust method: these pin
the parts of faust-streaming it relies on, so an upgrade that moves them fails here, not in a
worker that silently stops committing."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence
from typing import Any

import faust
from faust.transport.consumer import CONSUMER_FETCHING, Consumer
from faust.transport.drivers import aiokafka as faust_aiokafka

from coordinator.service.direct import DirectConsumer, use_direct_consumer


def test_faust_s_fetch_loop_is_where_the_direct_consumer_expects_it() -> None:
    assert "fetcher" in inspect.signature(Consumer._drain_messages).parameters
    assert inspect.isasyncgenfunction(Consumer.getmany)
    assert ["self", "tp", "offset_from", "offset_to"] == list(inspect.signature(Consumer._add_gap).parameters)
    assert ["self", "message"] == list(inspect.signature(Consumer.ack).parameters)
    assert issubclass(DirectConsumer, faust_aiokafka.Consumer)
    assert isinstance(CONSUMER_FETCHING, str)


def test_the_app_s_consumer_hands_its_topics_to_the_handler_and_subscribes_them() -> None:
    async def handler(messages: Sequence[Any]) -> None:
        raise AssertionError("nothing is fetched here")

    def between_batches() -> None:
        raise AssertionError("no batch ends here")

    async def build() -> tuple[Any, set[str]]:
        app = faust.App("direct-consumer-test", broker="kafka://127.0.0.1:1", web_enabled=False)
        topics = [
            app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
            for name in ("t.acks", "t.ticks")
        ]
        use_direct_consumer(app, topics, handler, between_batches=between_batches)
        subscribed = {name for topic in app.topics._topics for name in topic.topics}
        return app.consumer, subscribed

    consumer, subscribed = asyncio.run(build())

    assert isinstance(consumer, DirectConsumer)
    assert frozenset({"t.acks", "t.ticks"}) == consumer.direct_topics
    assert handler is consumer.batch_handler
    assert between_batches is consumer.between_batches
    assert {"t.acks", "t.ticks"} <= subscribed
