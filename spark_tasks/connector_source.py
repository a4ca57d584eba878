"""A checkpointed job's input on Spark's own ``kafka`` connector: the user's ``format("kafka")``
options checked and completed, and the stream unioned with the job's ``cutline-barriers`` source
(docs/spark.md, "Checkpoints on Spark's own kafka connector").

:func:`connector_options` is pure: the options the job gives the connector, or
:class:`ConnectorOptionRefused` saying which option cannot work with cutline's checkpoints and what
to do instead. :func:`connector_stream` builds the query's input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from spark_tasks.barrier_source import FORMAT as BARRIERS_FORMAT
from spark_tasks.barrier_source import BarrierSource
from spark_tasks.kafka_source import TopicPartitionKey, to_offsets

__all__ = [
    "CONNECTOR_FORMAT",
    "ConnectorOptionRefused",
    "connector_options",
    "connector_stream",
]

CONNECTOR_FORMAT = "kafka"
"""Spark's own Kafka source (``spark-sql-kafka-0-10``)."""

_OTHER_SUBSCRIPTIONS = ("assign", "subscribepattern")
_STARTING_BY_TIME = ("startingtimestamp", "startingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy")
_SPLITTING = ("minpartitions", "maxrecordsperpartition")
"""Options with which the connector splits one Kafka partition's offsets of a batch over several
Spark tasks."""


class ConnectorOptionRefused(ValueError):
    """An option of the job's ``kafka`` source cannot work with cutline's checkpoints; the message
    says what to do instead."""


def connector_options(
    user: Mapping[str, Any],
    *,
    bootstrap: str,
    topics: Sequence[str],
    group: str,
    starting: Mapping[TopicPartitionKey, int],
    restored: int | None,
    per_partition: bool = False,
) -> dict[str, str]:
    """The options of the job's ``format("kafka")`` stream: the user's (Spark's own names), with
    ``subscribe`` the job's topics and ``startingOffsets`` the exact offsets ``starting`` (the restored
    checkpoint's, checkpoint ``restored``, or the user's resolved to numbers), so that the job knows
    where its first batch starts. Raises :class:`ConnectorOptionRefused` for an option that cannot be
    (for a ``per_partition`` job, one whose state is one per Kafka partition, also those that split a
    partition over several tasks)."""
    options = {str(k): str(v) for k, v in user.items()}
    lower = {k.lower(): k for k in options}
    for name in _SPLITTING if per_partition else ():
        if name in lower:
            raise ConnectorOptionRefused(
                f"{lower[name]} splits a Kafka partition's records of one batch over several Spark tasks, "
                "but a per-partition StatefulStep folds each partition's records in one task, in order, "
                "from the state at the batch's start: leave it out, or make the job keyed "
                "(keyed_partitions and stream_keyed) to spread the work over more tasks"
            )
    for name in _OTHER_SUBSCRIPTIONS:
        if name in lower:
            raise ConnectorOptionRefused(
                f"{lower[name]} is not supported by a checkpointed job: it reads JobSettings.topics (a "
                "checkpoint names every partition of them); list the topics there"
            )
    subscribed = options.pop(lower["subscribe"], None) if "subscribe" in lower else None
    if subscribed is not None and sorted(t.strip() for t in subscribed.split(",")) != sorted(topics):
        raise ConnectorOptionRefused(
            f"subscribe={subscribed!r} differs from JobSettings.topics {list(topics)}: the job subscribes to "
            "its topics itself; leave subscribe out"
        )
    for name in _STARTING_BY_TIME:
        if name in lower:
            raise ConnectorOptionRefused(
                f"{lower[name]} is not supported by a checkpointed job: its checkpoints need the offsets its "
                "first batch starts at; use startingOffsets (earliest, latest or JSON offsets)"
            )
    given = options.pop(lower["startingoffsets"], None) if "startingoffsets" in lower else None
    if restored is not None and given is not None and given.strip().startswith("{"):
        raise ConnectorOptionRefused(
            f"startingOffsets={given} names offsets, but the job restores checkpoint {restored} and starts "
            "at its offsets: leave startingOffsets out, or restore nothing (JobSettings(restore=None))"
        )
    group_id = options.get(lower.get("kafka.group.id", ""))
    if group_id == group:
        raise ConnectorOptionRefused(
            f"kafka.group.id={group!r} is the job's consumer group, where it commits each completed "
            "checkpoint's offsets: Spark's consumers in that group (its driver's, with "
            "spark.sql.streaming.kafka.useDeprecatedOffsetFetching) would make the broker refuse those "
            "commits. Leave kafka.group.id out (Spark makes one per query) or name another group"
        )
    options.setdefault("kafka.bootstrap.servers", bootstrap)
    return {
        **options,
        "subscribe": ",".join(topics),
        "startingOffsets": json.dumps(to_offsets(starting), separators=(",", ":")),
    }


def connector_stream(spark: Any, options: Mapping[str, str], barrier_options: Mapping[str, Any]) -> Any:
    """The job's input: ``spark.readStream.format("kafka")`` with ``options``, unioned by name with
    its ``cutline-barriers`` source (a column ``cutline_barrier``, null on records; the barrier rows
    have no ``headers`` and no key or value)."""
    spark.dataSource.register(BarrierSource)
    reader = spark.readStream.format(CONNECTOR_FORMAT)
    for key, value in options.items():
        reader = reader.option(key, value)
    barriers = spark.readStream.format(BARRIERS_FORMAT)
    for key, value in barrier_options.items():
        barriers = barriers.option(key, str(value))
    return reader.load().unionByName(barriers.load(), allowMissingColumns=True)
