"""A local SparkSession set up for cutline's jobs, tests, benchmark and demo."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_spark(app_name: str = "cutline", cores: int = 2, log_level: str = "ERROR") -> Any:
    """A ``local[cores]`` SparkSession on loopback, without UI, whose Python workers run this interpreter.

    Python workers must import confluent-kafka, pyarrow and this project, so
    ``PYSPARK_PYTHON`` is set to this interpreter (the project's venv).
    """
    from pyspark.sql import SparkSession

    from spark_tasks.kafka_source import KafkaSource

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.default.parallelism", str(cores))
        .config("spark.driver.memory", "1g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .config("spark.sql.streaming.minBatchesToRetain", "10")
        # An idle query reports (and so is RUNNING for cutline) after 1 s, not Spark's 10 s.
        .config("spark.sql.streaming.noDataProgressEventInterval", "1000")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel(log_level)
    session.dataSource.register(KafkaSource)
    return session
