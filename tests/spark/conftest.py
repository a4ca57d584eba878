"""Fixtures for tests with a real local Spark and a real Kafka-protocol broker.

One SparkSession (``local[2]``, no UI, 2 shuffle partitions) serves the whole
session; starting it takes about 10 s. The broker fixtures are in tests/conftest.py.

PySpark's Python Data Source API needs ``pyarrow`` in the Python workers; it is one of
the project's dependencies.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wordfeed import PARTITIONS, Input, Words

from coordinator.service.supervisor import CoordinatorProcess
from events.broker import create_topics


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession for the whole test session, with ``KafkaSource`` registered."""
    from spark_tasks.session import local_spark

    saved = {
        name: os.environ.get(name) for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")
    }
    session = local_spark("cutline-tests")
    try:
        yield session
    finally:
        session.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def coordinator(bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[CoordinatorProcess]:
    with CoordinatorProcess(bootstrap, topic_prefix, log_path=tmp_path / "coordinator" / "log") as process:
        yield process


@pytest.fixture
def given(bootstrap: str, topic_prefix: str) -> Input:
    """A 4-partition input topic of words for the test, its producer, and a job id."""
    topic = topic_prefix + "words"
    create_topics(bootstrap, [topic], partitions=PARTITIONS)
    return Input(topic, Words(bootstrap, topic), "wc-" + topic_prefix.rstrip("."))
