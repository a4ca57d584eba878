"""Benchmark: reading a keyed aggregation's state of 1,000,000 keys with ``cutline-state``, beside
Spark's own ``statestore`` reader of the same aggregation's state (issue 50; docs/state.md).

    uv run python bench/bench_state.py [--keys 1000000] [--partitions 4] [--rounds 3]

The aggregation is a count per key over ``--keys`` distinct keys (``key-0000001``, …), each seen
once. Spark's state: a streaming ``groupBy("key").count()`` over a Parquet file of the keys, run
once (``availableNow``) with ``--partitions`` shuffle partitions on the HDFS-backed state store;
its checkpoint is read with ``spark.read.format("statestore")``. cutline's state: the same counts
as the keyed word count's savepoint in ``--partitions`` tasks, written by
``spark_tasks.state_writer.write_new_savepoint`` (the files a keyed job's savepoint has: a manifest
and a full Arrow piece per task, checked by sha256 when read); read with
``spark.read.format("cutline-state")``, and without Spark by ``events.task.state_view.state_rows``
(what ``cutline state show`` does).

Each Spark read is timed from ``load()`` to the end of a ``noop`` write of every row (so every row
is produced on the executors, none gathered on the driver), and checked: as many rows as keys,
counts summing to the keys. The readers take turns (ABC, CBA, …); the best and median of the
rounds are shown, with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from events.task.participant import read_checkpoint_metadata  # noqa: E402
from events.task.state_view import state_rows  # noqa: E402
from spark_tasks.session import local_spark  # noqa: E402
from spark_tasks.state_source import CutlineStateSource  # noqa: E402
from spark_tasks.state_writer import write_new_savepoint  # noqa: E402
from spark_tasks.wordcount import KEYED_WORD_COUNT  # noqa: E402


def _keys(n: int) -> pa.Array:
    return pa.array([f"key-{i:07d}" for i in range(n)], pa.string())


def spark_state(spark: Any, keys: pa.Array, work: Path) -> str:
    """Run ``groupBy("key").count()`` once over ``keys``; its checkpoint directory."""
    source, checkpoint = work / "keys", work / "spark-checkpoint"
    source.mkdir()
    pq.write_table(pa.table({"key": keys}), source / "part-0.parquet")
    counts = spark.readStream.schema("key string").parquet(str(source)).groupBy("key").count()
    query = (
        counts.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return str(checkpoint)


def cutline_state(keys: pa.Array, partitions: int, work: Path) -> tuple[str, float]:
    """The same counts as a keyed savepoint; its location and the seconds writing it took."""
    started = time.perf_counter()
    table = pa.table({"key": keys, "state": pa.array([1] * len(keys), pa.int64())})
    written = write_new_savepoint(
        table, KEYED_WORD_COUNT, work / "savepoint", job_id="bench", parallelism=partitions
    )
    return written.location, time.perf_counter() - started


def _timed_noop(frame: Any) -> float:
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def _check(frame: Any, count: str, n: int) -> None:
    row = frame.selectExpr("count(*) AS rows", f"sum({count}) AS total").collect()[0]
    if (row["rows"], row["total"]) != (n, n):
        raise SystemExit(f"read {row['rows']} rows summing to {row['total']}, expected {n} and {n}")


def readers(spark: Any, spark_checkpoint: str, savepoint: str, n: int) -> dict[str, Callable[[], float]]:
    def statestore() -> float:
        frame = spark.read.format("statestore").load(spark_checkpoint)
        seconds = _timed_noop(frame)
        _check(frame, "value.count", n)
        return seconds

    def cutline_spark() -> float:
        frame = (
            spark.read.format("cutline-state").option("path", savepoint).option("uid", "word-count").load()
        )
        seconds = _timed_noop(frame)
        _check(frame.selectExpr("cast(cast(state AS string) AS long) AS count"), "count", n)
        return seconds

    def cutline_files() -> float:
        started = time.perf_counter()
        rows = state_rows(read_checkpoint_metadata(savepoint), "word-count")
        seconds = time.perf_counter() - started
        if len(rows) != n or sum(int(r.state) for r in rows) != n:
            raise SystemExit(f"state_rows gave {len(rows)} rows, expected {n}")
        return seconds

    return {
        'Spark\'s format("statestore")': statestore,
        'format("cutline-state")': cutline_spark,
        "state_rows, no Spark (cutline state show)": cutline_files,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    console.print(f"load before: {os.getloadavg()[0]:.2f} (1 min)")
    spark = local_spark("bench-state")
    spark.conf.set("spark.sql.shuffle.partitions", str(args.partitions))
    spark.dataSource.register(CutlineStateSource)
    keys = _keys(args.keys)
    with tempfile.TemporaryDirectory(prefix="bench-state-") as directory:
        work = Path(directory)
        started = time.perf_counter()
        spark_checkpoint = spark_state(spark, keys, work)
        console.print(f"Spark's aggregation of {args.keys:,} keys: {time.perf_counter() - started:.1f} s")
        savepoint, wrote = cutline_state(keys, args.partitions, work)
        console.print(f"cutline's savepoint of them (write_new_savepoint from Arrow): {wrote:.1f} s")
        timed = readers(spark, spark_checkpoint, savepoint, args.keys)
        seconds: dict[str, list[float]] = {name: [] for name in timed}
        for round_ in range(args.rounds):
            order = list(timed) if round_ % 2 == 0 else list(reversed(timed))
            for name in order:
                seconds[name].append(timed[name]())
    spark.stop()
    table = Table(title=f"reading the state of {args.keys:,} keys, {args.partitions} partitions")
    for column in ("reader", "best s", "median s", "keys/s (best)"):
        table.add_column(column, justify="right" if column != "reader" else "left")
    for name, runs in seconds.items():
        best = min(runs)
        table.add_row(name, f"{best:.2f}", f"{statistics.median(runs):.2f}", f"{args.keys / best:,.0f}")
    console.print(table)
    console.print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
