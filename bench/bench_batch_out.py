"""Benchmark: what it costs to take one micro-batch out of Spark, each way a sink could take it
(docs/benchmarks.md, "Exactly-once output to Kafka": where the Spark sink's time goes).

    uv run python bench/bench_batch_out.py [--rows 20000] [--size 100] [--rounds 25] [--warm 5]

One batch like the exactly-once benchmark's (``--rows`` values of ``--size`` bytes, 2 partitions),
persisted on ``local[2]``, written again and again; the ways in turn in each round, the first
``--warm`` rounds unmeasured (the driver's JIT):

- ``noop``: Spark's ``noop`` format, the floor of running a write job;
- ``toArrow``: collected into the driver as Arrow (what ``ExactlyOnceKafkaSink`` does with a batch);
- ``toArrow + lists``: the same, the values then as Python bytes (what a driver that produces them
  from Python does: the exactly-once benchmark's ``DriverProducerSink``);
- ``parquet``: Parquet files written by the tasks (what a sink whose tasks stage the rows and whose
  driver stages only their names would write);
- ``kafka``: Spark's own Kafka sink, the tasks producing to Apache Kafka (one node started here).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_coordinator import broker  # noqa: E402
from events.dev.broker import create_topics  # noqa: E402


def ways(batch: Any, bootstrap: str, scratch: Path) -> dict[str, Callable[[], object]]:
    """Each way of taking ``batch`` out, as a call that does it once."""
    topic = f"batch-out-{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, [topic], partitions=4)
    kafka = batch.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    return {
        "noop": lambda: batch.write.format("noop").mode("overwrite").save(),
        "toArrow": batch.toArrow,
        "toArrow + lists": lambda: batch.toArrow().column("value").to_pylist(),
        "parquet": lambda: batch.write.parquet(str(scratch / uuid.uuid4().hex)),
        "kafka": kafka.save,
    }


def measure(calls: dict[str, Callable[[], object]], rounds: int, warm: int) -> dict[str, list[float]]:
    """Milliseconds of each call in each measured round (the calls in turn within a round)."""
    taken: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(warm + rounds):
        for name, call in calls.items():
            began = time.perf_counter()
            call()
            if round_ >= warm:
                taken[name].append((time.perf_counter() - began) * 1000)
    return taken


def table(taken: dict[str, list[float]], rows: int) -> Table:
    out = Table(title=f"one persisted batch of {rows:,} rows out of Spark (local[2]), ms")
    for column in ("way", "median", "p10", "p90"):
        out.add_column(column, justify="left" if column == "way" else "right")
    for name, times in taken.items():
        deciles = statistics.quantiles(times, n=10)
        out.add_row(name, f"{statistics.median(times):.1f}", f"{deciles[0]:.1f}", f"{deciles[-1]:.1f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--warm", type=int, default=5)
    args = parser.parse_args()
    from pyspark.sql.functions import expr

    from spark_tasks.connector import kafka_connector
    from spark_tasks.session import spark_session

    console = Console(width=120)
    with broker("kafka") as (bootstrap, what, _), tempfile.TemporaryDirectory() as scratch:
        console.print(f"broker: {what}; load {os.getloadavg()}")
        spark = spark_session(
            "local[2]", "cutline-bench-batch-out", conf={"spark.jars": kafka_connector().spark_jars}
        )
        try:
            value = expr(f"cast(repeat('x', {args.size}) as binary)").alias("value")
            batch = spark.range(args.rows, numPartitions=2).select(value).persist()
            batch.count()
            taken = measure(ways(batch, bootstrap, Path(scratch)), args.rounds, args.warm)
        finally:
            spark.stop()
        console.print(f"load after: {os.getloadavg()}")
    console.print(table(taken, args.rows))


if __name__ == "__main__":
    main()
