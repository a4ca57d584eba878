"""Fixtures for tests with a real local Spark and a real Kafka-protocol broker.

One SparkSession (``local[2]``, no UI, 2 shuffle partitions) serves the test process: each
pytest-xdist worker that runs a test using it starts one, once (about 10 s). The broker fixtures and
how the files are shared out between the workers are in tests/conftest.py.

PySpark's Python Data Source API needs ``pyarrow`` in the Python workers; it is one of
the project's dependencies.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
from wordfeed import PARTITIONS, Input, Words

from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import create_topics


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession for the whole test session (one per xdist worker), with ``KafkaSource``
    registered."""
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


@pytest.fixture(scope="module")
def coordinator(
    bootstrap: str, topic_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    """One coordinator worker for a module's tests (starting one takes about 5 s). A module that
    uses it makes ``topic_prefix`` module-scoped; its tests have jobs and inputs of their own
    (``given``), and the coordinator keeps the jobs apart as it would in production."""
    log_path = tmp_path_factory.mktemp("coordinator") / "log"
    with CoordinatorProcess(bootstrap, topic_prefix, log_path=log_path) as process:
        yield process


@pytest.fixture
def given(bootstrap: str, topic_prefix: str) -> Input:
    """A 4-partition input topic of words of the test's own, its producer, and a job id."""
    name = uuid4().hex[:8]
    topic = f"{topic_prefix}words-{name}"
    create_topics(bootstrap, [topic], partitions=PARTITIONS)
    return Input(topic, Words(bootstrap, topic), f"wc-{name}")
