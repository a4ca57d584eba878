"""SparkSessions set up for cutline's jobs, tests, benchmark and demo: ``local[N]``, clusters and
Spark Connect (docs/spark.md, "Spark Connect")."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

STREAMING_CONFIG = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.pollingDelay": "10ms",
    "spark.sql.streaming.minBatchesToRetain": "10",
    # An idle query reports (and so is RUNNING for cutline) after 1 s, not Spark's 10 s.
    "spark.sql.streaming.noDataProgressEventInterval": "1000",
}
"""Session settings of cutline's jobs that a Connect client may set too (none is a static conf)."""


def local_spark(app_name: str = "cutline", cores: int = 2, log_level: str = "ERROR") -> Any:
    """A ``local[cores]`` SparkSession on loopback, without UI, whose Python workers run this interpreter."""
    return spark_session(
        f"local[{cores}]",
        app_name,
        conf={"spark.sql.shuffle.partitions": str(cores), "spark.default.parallelism": str(cores)},
        log_level=log_level,
    )


def spark_session(
    master: str,
    app_name: str = "cutline",
    *,
    conf: Mapping[str, str] | None = None,
    executor_env: Iterable[str] = (),
    log_level: str = "ERROR",
) -> Any:
    """A SparkSession on ``master`` (``local[N]``, ``local-cluster[N,cores,MB]``, ``spark://host:port``,
    ...) for cutline's jobs, without UI, with ``KafkaSource`` registered.

    Python workers must import confluent-kafka, pyarrow and this project, so ``PYSPARK_PYTHON`` is
    this interpreter (the project's venv); on another master than ``local[N]`` one already set is
    kept, since executors on other hosts may have the project elsewhere. ``local…`` masters (their
    executors are this machine's processes) run on loopback; on another, the driver's address is
    Spark's (``SPARK_LOCAL_IP``, ``spark.driver.host``). ``executor_env`` names variables of this
    process that every executor's environment gets (``spark.executorEnv.NAME``): the state store's
    credentials and endpoint, for example. ``conf`` goes to the builder last (docs/spark.md,
    "Deploying on a cluster").
    """
    from pyspark.sql import SparkSession

    from spark_tasks.kafka_source import KafkaSource
    from spark_tasks.state_source import CutlineStateSource

    missing = [name for name in executor_env if name not in os.environ]
    if missing:
        raise ValueError(f"executor_env names {', '.join(missing)}, which this process's environment lacks")
    local = master.startswith("local")
    if master.startswith("local["):
        os.environ["PYSPARK_PYTHON"] = sys.executable
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "1g")
    )
    for key, value in STREAMING_CONFIG.items():
        builder = builder.config(key, value)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    for name in executor_env:
        builder = builder.config(f"spark.executorEnv.{name}", os.environ[name])
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    session.dataSource.register(KafkaSource)
    session.dataSource.register(CutlineStateSource)
    return session


def connect_spark(remote: str, *, conf: Mapping[str, str] | None = None) -> Any:
    """A Spark Connect session (``SparkSession.builder.remote``) on the server at ``remote``
    (``sc://host:port``), with cutline's streaming settings, then ``conf`` (session settings, not
    the server's static ones), and ``KafkaSource`` registered.

    The server runs the Python side of the job (the source, the tasks, a ``foreachBatch`` sink) in
    its own Python workers: start it with ``PYSPARK_PYTHON`` naming an interpreter that imports
    this project, confluent-kafka and pyarrow. Needs the ``connect`` extra.
    """
    from events.extras import require

    require("connect", "a Spark Connect session")
    from pyspark.sql import SparkSession

    from spark_tasks.kafka_source import KafkaSource
    from spark_tasks.state_source import CutlineStateSource

    builder = SparkSession.builder.remote(remote)
    for key, value in {**STREAMING_CONFIG, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.dataSource.register(KafkaSource)
    session.dataSource.register(CutlineStateSource)
    return session


def is_connect_session(spark: Any) -> bool:
    """Is ``spark`` a Spark Connect client session? It has no JVM in this process (no
    ``SparkContext``): only a classic session takes the JVM paths (the job's query listener)."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")
