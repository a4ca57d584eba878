"""Spark's own Kafka connector (``format("kafka")``, spark-sql-kafka-0-10), its jars resolved by
``spark_tasks.connector`` from the project's own files, reading the test broker in batch and streaming
queries (docs/spark.md, "Spark's own kafka connector").

The queries run in a session of their own process (:mod:`connector_session`): the connector's jars
reach a driver only when its JVM starts, and this process's JVM serves the shared session.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from uuid import uuid4

import pytest
from confluent_kafka import KafkaError, Message, Producer
from connector_session import ConnectorSession, Row, position
from support import eventually

from events.dev.broker import create_topics
from events.kafka.clients import producer_config
from spark_tasks.connector import (
    CONNECTOR,
    REQUIRED,
    TESTED_FALLBACKS,
    kafka_connector,
    shipped,
    spark_jars_dir,
    spark_version,
)

PARTITIONS = 3


@pytest.fixture(scope="module")
def connector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectorSession]:
    """A ``local[2]`` session made with ``with_kafka_connector``, in a process of its own."""
    session = ConnectorSession(tmp_path_factory.mktemp("connector") / "session.log")
    try:
        yield session
    finally:
        session.close()


@pytest.fixture
def topic(bootstrap: str, topic_prefix: str) -> str:
    name = f"{topic_prefix}records"
    create_topics(bootstrap, [name], partitions=PARTITIONS)
    return name


def produce(bootstrap: str, topic: str, count: int, tag: str = "") -> list[Row]:
    """``count`` records spread over the partitions (the first with a null key); the rows a read of
    them must give, with the offsets the broker gave them."""
    delivered: list[Row] = []

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        assert error is None, error
        key, value = message.key(), message.value()
        delivered.append(
            (
                None if key is None else key.decode(),
                value.decode(),
                topic,
                message.partition(),
                message.offset(),
            )
        )

    producer = Producer(producer_config(bootstrap))
    for n in range(count):
        key = None if n == 0 else f"key-{tag}{n}"
        producer.produce(
            topic, key=key, value=f"value-{tag}{n}", partition=n % PARTITIONS, on_delivery=on_delivery
        )
    assert 0 == producer.flush(30)
    return sorted(delivered, key=position)


def kafka(bootstrap: str, topic: str, **options: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **options}


def offsets(topic: str, by_partition: Mapping[int, int]) -> str:
    """Spark's offset JSON: ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest)."""
    return json.dumps({topic: {str(p): offset for p, offset in by_partition.items()}})


def within(rows: list[Row], ranges: Mapping[int, tuple[int, int | None]]) -> list[Row]:
    """The ``rows`` whose offset is in their partition's ``[start, end)`` (``None``: no end)."""

    def inside(row: Row) -> bool:
        start, end = ranges[row[3]]
        return start <= row[4] and (end is None or row[4] < end)

    return [row for row in rows if inside(row)]


def ends(rows: list[Row]) -> dict[int, int]:
    """Each partition's next offset after ``rows`` (the whole of it)."""
    return {p: 1 + max((row[4] for row in rows if row[3] == p), default=-1) for p in range(PARTITIONS)}


# --------------------------------------------------------------------------- the jars


def test_the_connector_is_the_installed_sparks_own_or_its_tested_fallback() -> None:
    resolved = kafka_connector()

    assert spark_version() == resolved.spark_version
    assert resolved.version in (resolved.spark_version, TESTED_FALLBACKS.get(resolved.spark_version))
    assert [f"{CONNECTOR}-{resolved.version}.jar"] == [
        jar.name for jar in resolved.jars if jar.name.startswith(f"{CONNECTOR}-")
    ]


def test_the_connector_is_its_own_jars_and_none_that_spark_ships() -> None:
    resolved = kafka_connector()
    names = {jar.name for jar in resolved.jars if jar.is_file()}
    sparks = {jar.name for jar in spark_jars_dir().glob("*.jar")}

    assert len(REQUIRED) == len(names) == len(resolved.jars)
    assert all(shipped(artifact, names) for artifact in REQUIRED)
    assert [] == [artifact for artifact in REQUIRED if shipped(artifact, sparks)]
    assert resolved.left_out, "the dependencies Spark ships, left out (kafka-clients' slf4j-api, ...)"


def test_a_process_whose_spark_started_without_the_connector_is_told_so(tmp_path: Path) -> None:
    script = "\n".join(
        [
            "from pyspark.sql import SparkSession",
            "from spark_tasks.connector import ConnectorUnavailable, with_kafka_connector",
            "builder = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')",
            "builder.getOrCreate().stop()",
            "try:",
            "    with_kafka_connector(builder)",
            "except ConnectorUnavailable as refused:",
            "    print(refused)",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False
    )

    assert 0 == done.returncode, done.stderr[-3000:]
    assert "started without Spark's Kafka connector" in done.stdout


# --------------------------------------------------------------------------- batch reads


def test_a_batch_read_returns_exactly_the_records_produced(
    connector: ConnectorSession, bootstrap: str, topic: str
) -> None:
    produced = produce(bootstrap, topic, 12)

    assert produced == connector.read(**kafka(bootstrap, topic))


def test_a_batch_read_starts_and_ends_at_the_offsets_json(
    connector: ConnectorSession, bootstrap: str, topic: str
) -> None:
    produced = produce(bootstrap, topic, 12)  # offsets 0-3 in each partition

    read = connector.read(
        **kafka(
            bootstrap,
            topic,
            startingOffsets=offsets(topic, {0: 1, 1: -2, 2: 3}),
            endingOffsets=offsets(topic, {0: 3, 1: -1, 2: -1}),
        )
    )

    assert within(produced, {0: (1, 3), 1: (0, None), 2: (3, None)}) == read
    assert 2 + 4 + 1 == len(read)


# --------------------------------------------------------------------------- streaming reads


def test_a_streaming_read_returns_exactly_the_records_from_its_starting_offsets_json(
    connector: ConnectorSession, bootstrap: str, topic: str
) -> None:
    produced = produce(bootstrap, topic, 12)
    name = f"stream_{uuid4().hex[:8]}"

    connector.stream(
        name,
        available_now=True,
        **kafka(bootstrap, topic, startingOffsets=offsets(topic, {0: 2, 1: -2, 2: -1})),
    )

    assert within(produced, {0: (2, None), 1: (0, None), 2: (4, None)}) == connector.finish(name)


def test_a_running_streaming_read_returns_the_records_produced_after_its_starting_offsets(
    connector: ConnectorSession, bootstrap: str, topic: str
) -> None:
    before = produce(bootstrap, topic, 6, tag="before-")
    name = f"stream_{uuid4().hex[:8]}"
    connector.stream(name, **kafka(bootstrap, topic, startingOffsets=offsets(topic, ends(before))))
    try:
        after = produce(bootstrap, topic, 9, tag="after-")

        eventually(
            lambda: connector.rows(name),
            lambda rows: rows == after,
            timeout=120,
            what="the records produced after",
        )
    finally:
        connector.stop(name)
