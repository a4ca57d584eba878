"""How a Spark task's replies reach the coordinator: its answer to a barrier (an ack or a decline,
made by :func:`events.task.reply.answer`) with :func:`send_reply`, and the producer that its latency
measurements share (:func:`task_producer`).

The tasks of the partition step (:mod:`spark_tasks.tasks`), of the keyed step
(:mod:`spark_tasks.keyed`) and the latency stages (:mod:`spark_tasks.latency`) send through this
module; it knows nothing of them, only where replies go (:class:`ReplyTarget`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from confluent_kafka import KafkaException, Producer

from events.kafka.clients import deliver, produce_record, producer_config
from events.task.reply import Answer
from events.wire.codec import codec_for
from events.wire.topics import Topics
from events.wire.wire_settings import WireSettings

__all__ = ["ACK_TIMEOUT_S", "ReplyTarget", "await_replies", "send_reply", "task_producer"]

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 10.0
"""How long a task waits for the broker to have its reply."""

_producers: dict[tuple[str, tuple[tuple[str, Any], ...]], Producer] = {}
"""One producer per Python worker and cluster: Spark reuses its Python workers, so
acks after the first do not pay for a connection."""


class ReplyTarget(Protocol):
    """Where a job's tasks send their replies (:class:`spark_tasks.tasks.TaskSettings` is one)."""

    @property
    def job_id(self) -> str: ...

    @property
    def bootstrap(self) -> str: ...

    @property
    def producer_extra(self) -> Mapping[str, Any]: ...

    @property
    def wire(self) -> WireSettings:
        """The framing of the replies: the driver's (an executor is not configured by anyone else)."""
        ...

    @property
    def topics(self) -> Topics: ...


def task_producer(target: ReplyTarget) -> Producer:
    """This Python worker's producer for ``target``'s cluster (made on first use)."""
    key = (target.bootstrap, tuple(sorted(target.producer_extra.items())))
    producer = _producers.get(key)
    if producer is None:
        producer = _producers[key] = Producer(producer_config(target.bootstrap, target.producer_extra))
    return producer


def send_reply(target: ReplyTarget, answered: Answer, *, wait: bool = True) -> None:
    """Send an ack or a decline, naming the coordinator epoch of the barrier it answers, and wait
    until the broker has it (or log why not).

    ``wait=False`` only hands it to the producer: the task goes on with its records and calls
    :func:`await_replies` before it ends (the ack's round trip overlaps the task's work)."""
    reply, topic, headers = answered.reply, answered.topic(target.topics), answered.headers
    if not wait:

        def delivered(error: Any, message: Any) -> None:
            if error is not None:
                log.error(
                    "task %s could not send %s of checkpoint %d to %s: %s",
                    reply.task_id, type(reply).__name__, reply.checkpoint_id, topic, error,
                )  # fmt: skip

        produce_record(
            task_producer(target),
            topic,
            reply,
            on_delivery=delivered,
            headers=headers,
            codec=codec_for(target.wire),
        )
        return
    try:
        deliver(task_producer(target), topic, reply, ACK_TIMEOUT_S, headers, codec_for(target.wire))
    except (KafkaException, TimeoutError) as exc:
        # The checkpoint then expires on the coordinator; failing the task would only
        # make Spark fail the query, and a retry could not do better than the broker.
        log.error(
            "task %s could not send %s of checkpoint %d to %s: %s",
            reply.task_id, type(reply).__name__, reply.checkpoint_id, topic, exc,
        )  # fmt: skip


def await_replies(target: ReplyTarget) -> None:
    """Wait (up to :data:`ACK_TIMEOUT_S`) until the replies sent with ``wait=False`` are delivered."""
    left = task_producer(target).flush(ACK_TIMEOUT_S)
    if left:
        log.error("%d checkpoint replies of job %s not delivered in %gs", left, target.job_id, ACK_TIMEOUT_S)
