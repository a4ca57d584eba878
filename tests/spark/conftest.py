"""Fixtures for tests with a real local Spark and a real Kafka-protocol broker.

One SparkSession (``local[2]``, no UI, 2 shuffle partitions) serves the whole
session; starting it takes about 10 s. The broker fixtures are in tests/conftest.py.

PySpark's Python Data Source API needs ``pyarrow`` in the Python workers; it is one of
the project's dependencies.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession for the whole test session, with ``KafkaSource`` registered."""
    from pyspark.sql import SparkSession

    from spark_tasks.kafka_source import KafkaSource

    # Python workers must run this interpreter (the venv with confluent-kafka and this project).
    saved = {
        name: os.environ.get(name) for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")
    }
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("cutline-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .config("spark.sql.streaming.minBatchesToRetain", "10")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(KafkaSource)
    try:
        yield session
    finally:
        session.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
