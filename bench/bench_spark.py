"""Benchmark: the Spark word count with and without cutline checkpoints, side by side
(docs/design.md, "Performance targets").

    uv run python bench/bench_spark.py [--records 300000] [--per-trigger 20000] [--rounds 2] [--quick]
                                       [--keyed 8] [--markers 1000] [--snapshots]
                                       [--keyed 8 --native [--keys 9 100000]] [--connector]
    uv run python bench/bench_spark.py --all [--records 100000] [--rounds 2] [--keys 9 100000]
                                       [--only keyed|stateless]

One local SparkSession (``local[2]``), the embedded broker (or ``CUTLINE_BOOTSTRAP``)
and a coordinator process. ``--records`` lines of words are produced once to a
4-partition topic; then each round runs the same word count over all of them twice,
in alternating order:

- **without cutline**: the ``cutline-kafka`` source without ``cutline.job`` (no
  barriers), the same stateful step (``spark_tasks.tasks.partition_step``, state
  versions in the same store), the same ``foreachBatch`` sink;
- **with cutline**: :class:`spark_tasks.job.CheckpointedJob`, checkpoints every
  second: barriers, snapshots, acks, the listener, the journal thread, the
  coordinator's work and the consumer group commits.

Both use ``processingTime`` triggers of ``--trigger-ms`` and ``maxOffsetsPerTrigger``
``--per-trigger``, so the backlog is cut into the same micro-batches. Throughput is
records / (end of the last batch - start of the first), from Spark's progress
events. For each completed checkpoint, the **delay in micro-batches** is the
number of batches from the start of the barrier's batch (the batch whose end offset
carries it) to the completion, counting the barrier's own batch: 1 means it
completed before its batch ended. One run of each, unmeasured, warms up first.

``--keyed N`` runs the keyed word count (``spark_tasks.wordcount.KEYED_WORD_COUNT``: the words
shuffled by key group into N partitions, one global count per word) instead, both ways: without
cutline the same route → ``repartitionById`` → keyed step with its state store and no barriers.

``--keyed N --native`` compares the keyed word count with cutline (a checkpoint every
``--interval-ms``) with Spark's own stateful aggregation over the same source and backlog:
``groupBy("word").count()`` in update mode with ``spark.sql.shuffle.partitions`` = N, once with the
HDFS-backed state store (Spark's default) and once with RocksDB, for each ``--keys`` count of
distinct words (one topic each), in ABC/CBA rounds. It prints records/s per run, the ratio cutline /
HDFS-backed store, and the CPU per run (docs/design.md, "Performance targets": at or above the
HDFS-backed store at 9 and at 100,000 keys).

``--connector`` (with ``--keyed N``) reads with Spark's own ``kafka`` connector instead of
``cutline-kafka``, in every variant: the job with ``JobSettings(source="kafka")``, the others with
``format("kafka")`` (docs/spark.md, "Checkpoints on Spark's own kafka connector"). It runs on Apache
Kafka, started here unless ``CUTLINE_BOOTSTRAP`` names a broker (on the embedded broker the
connector's batch ends fall short).

``--all`` measures issue 48's comparisons on the connector in one session, every variant once to warm
up, then round by round with the order reversed each round (ABC, CBA) so that the machine's load
falls on all alike: the keyed rows of ``--native`` at each ``--keys`` (``--keyed`` 8 unless given), and
a stateless query (read, parse, write each batch as Parquet) on the first backlog: the parse in Spark
SQL on the connector and on ``cutline-kafka`` (what the Python source costs), and as a per-partition
step that keeps no state (the form a cutline job runs) on the connector without and with cutline
checkpoints (target >= 0.97: cutline's own cost). It ends with a table of every ratio (per round and
their median, the CPU per record ratio, the target), the command and ``uptime``; each variant's row
shows the 1-minute load at the end of its runs.

``--markers MS`` compares the job with cutline against itself with latency markers every ``MS``
ms (``JobSettings.latency_interval_ms``), in ABBA rounds (docs/design.md, "Performance targets":
at least 99 % of the throughput without markers), and prints the latency per operator that the
coordinator folded (``/jobs/JOB/latency``) for the last run with markers.

``--snapshots`` measures, without Spark, the keyed snapshot of one partition holding 100,000
keys when 0.1 %, 1 %, 10 % and 100 % of them changed since the previous one: the bytes of the
piece written against the full piece
(docs/design.md, "Performance targets": snapshot size follows the changed keys).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpu import TreeMeter, code_checked, machine_line, summed  # noqa: E402
from coordinator.service.supervisor import CoordinatorProcess  # noqa: E402
from events.dev.broker import broker_at, create_topics  # noqa: E402
from events.kafka.clients import producer_config  # noqa: E402
from events.task.participant import write_atomic  # noqa: E402
from events.wire.records import CheckpointCompleted, CheckpointConfig  # noqa: E402
from spark_tasks.job import CheckpointedJob, JobSettings  # noqa: E402
from spark_tasks.kafka_source.offsets import BARRIER_KEY, from_offsets  # noqa: E402
from spark_tasks.kafka_source.options import FORMAT  # noqa: E402
from spark_tasks.keyed import (  # noqa: E402
    TARGET_COLUMN,
    KeyedSettings,
    KeyedState,
    KeyedStateStore,
    apply_changes,
    key_group,
    key_group_range,
    process_step,
    route_step,
    shuffle_schema,
    write_snapshot,
)
from spark_tasks.state import KafkaRecord, StatefulStep  # noqa: E402
from spark_tasks.tasks import TaskSettings, partition_step  # noqa: E402
from spark_tasks.wordcount import KEYED_WORD_COUNT, WORD_COUNT, final_counts, read_counts  # noqa: E402

PARTITIONS = 4
WORDS = ("barrier", "checkpoint", "kafka", "spark", "flink", "offset", "partition", "snapshot", "journal")


@dataclass
class Run:
    name: str
    records: int
    batches: list[dict[str, Any]] = field(default_factory=list)
    completed: list[CheckpointCompleted] = field(default_factory=list)
    wall_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds by kind of process over the run (:func:`process_kind`)."""
    job_id: str = ""
    load: float = 0.0
    """The machine's 1-minute load average at the end of the run (``uptime``'s first figure)."""

    @property
    def measured(self) -> list[dict[str, Any]]:
        """The batches up to the one that reached the end of the backlog (a barrier-only batch after
        it, which only the run with cutline has, is not part of the work measured)."""
        ordered = sorted(self.batches, key=_start_ms)
        for i, batch in enumerate(ordered):
            if _consumed(batch) >= self.records:
                return ordered[: i + 1]
        return ordered

    @property
    def span_s(self) -> float:
        batches = self.measured
        first = min(_start_ms(b) for b in batches)
        last = max(_start_ms(b) + b["durationMs"]["triggerExecution"] for b in batches)
        return float(last - first) / 1000

    @property
    def throughput(self) -> float:
        return self.records / self.span_s

    def delays(self) -> list[int]:
        """Per completed checkpoint: micro-batches from its barrier's batch start to its completion."""
        out = []
        ordered = sorted(self.batches, key=_start_ms)
        for completed in self.completed:
            index = next(
                (i for i, b in enumerate(ordered) if _barrier_id(b) == completed.checkpoint_id),
                None,
            )
            if index is None:
                continue
            ends = [_start_ms(b) + b["durationMs"]["triggerExecution"] for b in ordered[index:]]
            out.append(1 + sum(1 for end in ends if end < completed.timestamp_ms))
        return out


def process_kind(command: str) -> str | None:
    """Which part of the benchmark a process below this one is, from its command line."""
    if "pyspark.daemon" in command or "pyspark.worker" in command or "pyspark/daemon" in command:
        return "Spark Python workers"
    if "tansu" in command or "--cluster-id" in command or " kafka.Kafka " in f"{command} ":
        return "broker"
    if "java" in command.split(" ", 1)[0]:
        return "Spark JVM"
    if "coordinator" in command:
        return "coordinator"
    return None


def measured(runner: Any, *args: Any, threads: bool = False) -> Run:
    """``runner(*args)`` with the CPU of every process of the benchmark over the run (and of each
    thread of the driver and the JVM, with ``threads``)."""
    kinds = frozenset({"driver (Python)", "Spark JVM", "Spark Python workers"}) if threads else frozenset()
    meter = TreeMeter(process_kind, self_name="driver (Python)", threads_of=kinds)
    run: Run = runner(*args)
    run.cpu = meter.stop()
    run.load = os.getloadavg()[0]
    return run


def _start_ms(progress: dict[str, Any]) -> float:
    return datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp() * 1000


def _barrier_id(progress: dict[str, Any]) -> int | None:
    end = progress["sources"][0].get("endOffset")
    parsed = json.loads(end) if isinstance(end, str) else end
    barrier = (parsed or {}).get(BARRIER_KEY)
    return None if barrier is None else int(barrier["id"])


def word(n: int, keys: int) -> str:
    """The ``n``-th word of a backlog of ``keys`` distinct words (:data:`WORDS` for 9)."""
    return WORDS[n % len(WORDS)] if keys == len(WORDS) else f"w{n % keys}"


def produce(bootstrap: str, topic: str, records: int, keys: int = len(WORDS)) -> None:
    """``records`` lines of 1 to 4 words (record ``i`` has ``1 + i % 4``) out of ``keys`` distinct words."""
    producer = Producer(producer_config(bootstrap, {"linger.ms": 20, "batch.num.messages": 10_000}))
    for i in range(records):
        line = " ".join(word(i * 7 + j, keys) for j in range(1 + i % 4))
        while True:
            try:
                producer.produce(topic, value=line.encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def write_batch(out: Path, attempt: int) -> Any:
    """The runs' ``foreachBatch`` sink: the batch's rows as ``out/<attempt>-<batch>.jsonl``.

    Both runs use it, so the comparison measures checkpoints, not sinks. It is keyed by
    batch id and so is only right for a run without restores: a restored job uses
    ``spark_tasks.sink.CutFileSink``.
    """

    def sink(batch_df: Any, batch_id: int) -> None:
        rows = [row.asDict() for row in batch_df.collect()]
        text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        write_atomic(out / f"{attempt:04d}-{batch_id:08d}.jsonl", text.encode())

    return sink


def _consumed(progress: dict[str, Any]) -> int:
    """Records below the batch's end offsets, over all partitions (its barrier and latency marker,
    read by the source's own parser, are no offsets)."""
    end = progress["sources"][0].get("endOffset")
    return sum(from_offsets(end).values()) if end else 0


def _wait_done(query: Any, records: int, timeout: float = 600) -> None:
    """Until a batch has ended at the end of every partition."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        progress = query.lastProgress
        if progress and _consumed(progress) >= records:
            return
        if query.exception() is not None:
            raise RuntimeError(query.exception())
        time.sleep(0.2)
    raise TimeoutError(f"{records} records not processed within {timeout:g}s")


def _source(spark: Any, bootstrap: str, topic: str, args: Any, fmt: str | None = None) -> Any:
    """The ``cutline-kafka`` stream (with ``--connector``, Spark's ``kafka``; ``fmt`` if given) of
    ``topic`` from its start, ``args.per_trigger`` offsets a batch (the input of the runs without
    cutline's job: with it, the job makes the same stream)."""
    if fmt is None:
        fmt = "kafka" if args.connector else FORMAT
    return (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.per_trigger)
        .load()
    )


def _run_to_end(name: str, records: int, query: Any, started: float) -> Run:
    """Wait until ``query`` has read the ``records`` of the backlog, stop it, and make its :class:`Run`
    from its batches with input (``started``: when the run began, for its wall time)."""
    try:
        _wait_done(query, records)
    finally:
        query.stop()
    run = Run(name, records, [p for p in query.recentProgress if p["numInputRows"] > 0])
    run.wall_s = time.monotonic() - started
    return run


def _struct(ddl: str) -> Any:
    """The Spark schema of a step's ``output_schema``."""
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(ddl)
    assert isinstance(schema, StructType), ddl
    return schema


def run_plain(spark: Any, bootstrap: str, topic: str, records: int, args: Any, work: Path) -> Run:
    from pyspark.sql.pandas.types import to_arrow_schema

    name = f"plain-{uuid.uuid4().hex[:6]}"
    source = _source(spark, bootstrap, topic, args)
    if args.keyed:
        schema = _struct(KEYED_WORD_COUNT.output_schema)
        keyed = KeyedSettings(
            job_id=name,
            bootstrap=bootstrap,
            state_root=str(work / name / "keyed"),
            parallelism=args.keyed,
            inputs=frozenset(),
        )
        for index in range(args.keyed):
            KeyedStateStore(keyed.state_root, index).seed({})
        df = (
            source.mapInArrow(route_step(KEYED_WORD_COUNT, args.keyed), shuffle_schema(KEYED_WORD_COUNT))
            .repartitionById(args.keyed, TARGET_COLUMN)
            .mapInArrow(process_step(KEYED_WORD_COUNT, keyed, to_arrow_schema(schema)), schema)
        )
    else:
        schema = _struct(WORD_COUNT.output_schema)
        settings = TaskSettings(job_id=name, bootstrap=bootstrap, state_dir=str(work / name / "state"))
        df = source.mapInArrow(partition_step(WORD_COUNT, settings, to_arrow_schema(schema)), schema)
    started = time.monotonic()
    query = (
        df.writeStream.foreachBatch(write_batch(work / name / "out", 1))
        .option("checkpointLocation", str(work / name / "spark"))
        .trigger(processingTime=f"{args.trigger_ms} milliseconds")
        .start()
    )
    run = _run_to_end("without cutline", records, query, started)
    _check(work / name / "out", records)
    return run


def run_cutline(
    spark: Any, bootstrap: str, topic: str, records: int, args: Any, work: Path, markers_ms: int = 0
) -> Run:
    name = f"cutline-{uuid.uuid4().hex[:6]}"
    settings = JobSettings(
        job_id=name,
        bootstrap=bootstrap,
        topics=(topic,),
        config=CheckpointConfig(
            interval_ms=args.interval_ms, location=(work / name / "checkpoints").as_uri(), timeout_ms=30_000
        ),
        work_dir=work / name,
        restore=None,
        source_options={"maxOffsetsPerTrigger": args.per_trigger},
        keyed_partitions=args.keyed or None,
        latency_interval_ms=markers_ms,
        source="kafka" if args.connector else "cutline-kafka",
    )
    started = time.monotonic()
    with CheckpointedJob(spark, settings) as job:
        counts = job.stream_keyed(KEYED_WORD_COUNT) if args.keyed else job.stream(WORD_COUNT)
        sink = write_batch(work / name / "out", job.attempt)
        query = job.start(
            counts.writeStream.foreachBatch(sink).trigger(processingTime=f"{args.trigger_ms} milliseconds")
        )
        _wait_done(query, records)
        job.stop()
        batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
        run = Run("with cutline", records, batches, list(job.completed))
        run.job_id = name
    run.wall_s = time.monotonic() - started
    _check(work / name / "out", records)
    return run


_STATE = "org.apache.spark.sql.execution.streaming.state"
NATIVE_STORES = {
    "native, HDFS-backed store": f"{_STATE}.HDFSBackedStateStoreProvider",
    "native, RocksDB": f"{_STATE}.RocksDBStateStoreProvider",
}
"""Spark's own state stores, by the name of their run."""
CUTLINE_KEYED = "cutline keyed"


def run_native(spark: Any, bootstrap: str, topic: str, records: int, args: Any, work: Path, name: str) -> Run:
    """Spark's own stateful word count over the same source: ``groupBy("word").count()`` in update
    mode, its state in the store ``NATIVE_STORES[name]``, ``args.keyed`` shuffle partitions."""
    from pyspark.sql import functions as F

    query_dir = work / f"native-{uuid.uuid4().hex[:6]}"
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", NATIVE_STORES[name])
    spark.conf.set("spark.sql.shuffle.partitions", str(args.keyed))
    source = _source(spark, bootstrap, topic, args)
    words = source.select(
        F.explode(F.split(F.lower(F.col("value").cast("string")), r"\s+")).alias("word")
    ).where(F.col("word") != "")
    started = time.monotonic()
    query = (
        words.groupBy("word")
        .count()
        .writeStream.outputMode("update")
        .foreachBatch(write_batch(query_dir / "out", 1))
        .option("checkpointLocation", str(query_dir / "spark"))
        .trigger(processingTime=f"{args.trigger_ms} milliseconds")
        .start()
    )
    run = _run_to_end(name, records, query, started)
    _check_final(query_dir / "out", records)
    return run


def run_cutline_keyed(
    spark: Any, bootstrap: str, topic: str, records: int, args: Any, work: Path, name: str
) -> Run:
    """:func:`run_cutline` of the keyed word count, named for the comparison with Spark's stores."""
    run = run_cutline(spark, bootstrap, topic, records, args, work)
    run.name = name
    _check_final(work / run.job_id / "out", records)
    return run


def _check_final(out: Path, records: int) -> None:
    """The last count of every word adds up to the words produced (a keyed count's output)."""
    expected = sum(1 + i % 4 for i in range(records))
    counted = sum(final_counts(out).values())
    if counted != expected:
        raise AssertionError(f"{out}: final counts add up to {counted} words, produced {expected}")


def _check(out: Path, records: int) -> None:
    expected = sum(1 + i % 4 for i in range(records))
    counted = sum(read_counts(out).values())
    if counted != expected:
        raise AssertionError(f"{out}: counted {counted} words, produced {expected}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--per-trigger", type=int, default=20_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--trigger-ms", type=int, default=200)
    parser.add_argument(
        "--interval-ms", type=int, default=1000, help="checkpoint interval of the runs with cutline"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="60,000 records, one round")
    parser.add_argument("--threads", action="store_true", help="also the CPU of each driver and JVM thread")
    parser.add_argument(
        "--keyed", type=int, default=0, metavar="N", help="the keyed word count, N partitions"
    )
    parser.add_argument("--snapshots", action="store_true", help="only the keyed snapshot sizes (no Spark)")
    parser.add_argument(
        "--native",
        action="store_true",
        help="with --keyed N: cutline's keyed count against Spark's groupBy().count() (HDFS, RocksDB)",
    )
    parser.add_argument(
        "--keys",
        type=int,
        nargs="+",
        help="distinct words, one backlog each (default 9; with --all 9 100000)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="everything on the connector in one run: the keyed rows, the stateless query, cutline-kafka",
    )
    parser.add_argument(
        "--only",
        choices=("keyed", "stateless"),
        help="with --all: only the keyed rows or the stateless query",
    )
    parser.add_argument(
        "--connector",
        action="store_true",
        help="with --keyed N: read with Spark's own kafka connector instead of cutline-kafka",
    )
    parser.add_argument(
        "--markers",
        type=int,
        default=0,
        metavar="MS",
        help="cutline without vs with latency markers every MS",
    )
    args = parser.parse_args()
    if args.quick:
        args.records, args.rounds = 60_000, 1
    args.keys = args.keys or ([len(WORDS), 100_000] if args.all else [len(WORDS)])
    console = Console(width=150)
    if args.snapshots:
        console.print(snapshot_sizes())
        return
    if args.only and not args.all:
        parser.error("--only narrows --all: give --all too")
    if args.all:
        args.connector, args.keyed = True, args.keyed or 8
        side_by_side(args, console, "uv run python bench/bench_spark.py " + " ".join(sys.argv[1:]))
        return
    if args.connector and not args.keyed:
        parser.error(
            "--connector runs the keyed word count (a job on the connector is keyed): give --keyed N"
        )
    if args.native:
        if not args.keyed:
            parser.error("--native compares the keyed word count: give --keyed N")
        native_comparison(args, console)
        return
    work = Path(tempfile.mkdtemp(prefix="cutline-bench-spark-"))
    kind = f"keyed word count ({args.keyed} shuffle partitions)" if args.keyed else "word count"
    console.print(
        f"[bold]Spark {kind} with and without cutline[/], reading with {_source_name(args)} — "
        f"{args.records:,} records, "
        f"{PARTITIONS} partitions, maxOffsetsPerTrigger {args.per_trigger:,}, trigger {args.trigger_ms} ms, "
        f"{args.rounds} round(s); {machine_line()}, "
        f"code from {code_checked()}, load {os.getloadavg()[0]:.2f}"
    )
    runs: list[Run] = []
    first, second = run_plain, run_cutline
    if args.markers:
        first, second = run_cutline, functools.partial(marked, markers_ms=args.markers)
    with (
        _broker(args) as (bootstrap, _),
        CoordinatorProcess(bootstrap, log_path=work / "coordinator" / "log") as coordinator,
    ):
        topic = f"bench-words-{uuid.uuid4().hex[:6]}"
        create_topics(bootstrap, [topic], partitions=PARTITIONS)
        began = time.monotonic()
        produce(bootstrap, topic, args.records)
        console.print(f"produced {args.records:,} records in {time.monotonic() - began:.1f} s")
        spark = _session(args)
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
        try:
            # warm-up, not measured: the JVM, the Python workers, the code paths of both runs
            for runner in (first, second):
                runner(spark, bootstrap, topic, args.records, args, work)
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("runs", total=2 * args.rounds)
                for round_ in range(args.rounds):
                    order = (first, second) if round_ % 2 == 0 else (second, first)
                    for runner in order:
                        runs.append(
                            measured(
                                runner,
                                spark,
                                bootstrap,
                                topic,
                                args.records,
                                args,
                                work,
                                threads=args.threads,
                            )
                        )
                        progress.advance(task)
            latency = _latency(coordinator.url, runs) if args.markers else None
        finally:
            spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    if args.markers:
        markers_report(console, runs, args.markers, latency)
    else:
        report(console, runs)


def _source_name(args: Any) -> str:
    return "Spark's kafka connector" if args.connector else "cutline-kafka"


def _session(args: Any) -> Any:
    """``local[2]``, with Spark's kafka connector's jars for ``--connector``."""
    from spark_tasks.connector import kafka_connector
    from spark_tasks.session import local_spark, spark_session

    if not args.connector:
        return local_spark("cutline-bench")
    return spark_session("local[2]", "cutline-bench", conf={"spark.jars": kafka_connector().spark_jars})


STATELESS_CONNECTOR = "connector, SQL parse"
STATELESS_STEP = "connector, step"
STATELESS_CUTLINE = "connector, step, cutline checkpoints"
STATELESS_PYTHON_SOURCE = "cutline-kafka, SQL parse"
STATELESS = (STATELESS_CONNECTOR, STATELESS_STEP, STATELESS_CUTLINE, STATELESS_PYTHON_SOURCE)
"""The stateless query's variants (read, parse, write; :func:`run_stateless`): the parse in Spark SQL
on the connector and on ``cutline-kafka``, and as cutline's job runs it (:data:`STATELESS_WORDS` per
input partition) on the connector without and with checkpoints."""


class NotOffered(RuntimeError):
    """The product does not run this variant (its refusal says why): the run reports it, unmeasured."""


def parse_words(state: dict[str, int], records: Sequence[KafkaRecord]) -> tuple[dict[str, int], list[Any]]:
    """The stateless query as a per-partition step: each record's words, one row each, and no state."""
    return state, [(w.lower(),) for r in records for w in (r.value or b"").decode("utf-8", "replace").split()]


STATELESS_WORDS = StatefulStep(update=parse_words, output_schema="word string", initial=dict)
"""The stateless query's parse as a cutline job runs it (a step that keeps nothing)."""


def parsed_words(df: Any) -> Any:
    """The stateless query's parse in Spark SQL: each record's words, lower-cased, one row each (a
    barrier row has no value, so no words)."""
    from pyspark.sql import functions as F

    words = F.explode(F.split(F.lower(F.col("value").cast("string")), r"\s+")).alias("word")
    return df.select(words).where(F.col("word") != "")


def write_parquet(out: Path) -> Any:
    """The stateless query's ``foreachBatch`` sink: the batch's rows as Parquet in ``out/<batch>``, written
    by Spark's executors (no rows through the driver)."""

    def sink(batch_df: Any, batch_id: int) -> None:
        batch_df.write.mode("overwrite").parquet(str(out / f"{batch_id:08d}"))

    return sink


def _check_words(out: Path, records: int) -> None:
    """Every word of the backlog written once (the Parquet files of every batch)."""
    import pyarrow.parquet as pq

    expected = sum(1 + i % 4 for i in range(records))
    written = sum(pq.ParquetFile(f).metadata.num_rows for f in out.rglob("*.parquet"))
    if written != expected:
        raise AssertionError(f"{out}: {written} words written, produced {expected}")


def run_stateless(
    spark: Any, bootstrap: str, topic: str, records: int, args: Any, work: Path, name: str
) -> Run:
    """The stateless query over ``topic``: read, parse (:func:`parsed_words`), write
    (:func:`write_parquet`), in the variant ``name`` of :data:`STATELESS`."""
    if name == STATELESS_CUTLINE:
        return _run_stateless_cutline(spark, bootstrap, topic, records, args, work)
    from pyspark.sql.pandas.types import to_arrow_schema

    query_dir = work / f"stateless-{uuid.uuid4().hex[:6]}"
    source = _source(spark, bootstrap, topic, args, FORMAT if name == STATELESS_PYTHON_SOURCE else "kafka")
    if name == STATELESS_STEP:
        schema = _struct(STATELESS_WORDS.output_schema)
        settings = TaskSettings(
            job_id=query_dir.name, bootstrap=bootstrap, state_dir=str(query_dir / "state")
        )
        words = source.mapInArrow(partition_step(STATELESS_WORDS, settings, to_arrow_schema(schema)), schema)
    else:
        words = parsed_words(source)
    started = time.monotonic()
    query = (
        words.writeStream.foreachBatch(write_parquet(query_dir / "out"))
        .option("checkpointLocation", str(query_dir / "spark"))
        .trigger(processingTime=f"{args.trigger_ms} milliseconds")
        .start()
    )
    run = _run_to_end(name, records, query, started)
    _check_words(query_dir / "out", records)
    return run


def _run_stateless_cutline(
    spark: Any, bootstrap: str, topic: str, records: int, args: Any, work: Path
) -> Run:
    """The stateless query as a cutline job on the connector, checkpointing every ``--interval-ms``:
    :data:`STATELESS_WORDS` per input partition. Raises :class:`NotOffered` with the job's refusal
    when the product has no such job."""
    name = f"stateless-cutline-{uuid.uuid4().hex[:6]}"
    settings = JobSettings(
        job_id=name,
        bootstrap=bootstrap,
        topics=(topic,),
        config=CheckpointConfig(
            interval_ms=args.interval_ms, location=(work / name / "checkpoints").as_uri(), timeout_ms=30_000
        ),
        work_dir=work / name,
        restore=None,
        source_options={"maxOffsetsPerTrigger": args.per_trigger},
        source="kafka",
    )
    try:
        job = CheckpointedJob(spark, settings)
    except ValueError as refused:
        raise NotOffered(str(refused)) from refused
    started = time.monotonic()
    with job:
        out = work / name / "out"
        query = job.start(
            job.stream(STATELESS_WORDS)
            .writeStream.foreachBatch(job.foreach_batch(write_parquet(out)))
            .trigger(processingTime=f"{args.trigger_ms} milliseconds")
        )
        _wait_done(query, records)
        job.stop()
        batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
        run = Run(STATELESS_CUTLINE, records, batches, list(job.completed))
        run.job_id = name
    run.wall_s = time.monotonic() - started
    _check_words(out, records)
    return run


@dataclass(frozen=True)
class Comparison:
    """Two variants of one query on the same backlog: ``numerator`` / ``denominator``, and the target of
    that ratio (None: reported, no target)."""

    group: str
    numerator: str
    denominator: str
    target: float | None


def side_by_side_plan(keys: Sequence[int]) -> list[tuple[str, int, list[str]]]:
    """What ``--all`` runs: (group, distinct words of its backlog, variants), the keyed rows at each of
    ``keys`` and the stateless query on the first backlog."""
    return [
        *((f"keyed, {k:,} keys", k, [*NATIVE_STORES, CUTLINE_KEYED]) for k in keys),
        ("stateless", keys[0], list(STATELESS)),
    ]


def side_by_side_comparisons(keys: Sequence[int]) -> list[Comparison]:
    """The ratios ``--all`` reports, with issue 48's targets."""
    keyed = [
        Comparison(f"keyed, {k:,} keys", CUTLINE_KEYED, store, 1.0) for k in keys for store in NATIVE_STORES
    ]
    return [
        *keyed,
        Comparison("stateless", STATELESS_CUTLINE, STATELESS_STEP, 0.97),
        Comparison("stateless", STATELESS_CUTLINE, STATELESS_CONNECTOR, None),
        Comparison("stateless", STATELESS_STEP, STATELESS_CONNECTOR, None),
        Comparison("stateless", STATELESS_PYTHON_SOURCE, STATELESS_CONNECTOR, None),
    ]


def side_by_side(args: Any, console: Console, command: str) -> None:
    """Everything on Spark's kafka connector in one session, the variants interleaved round by round
    (ABC, then CBA) so that the machine's load falls on all alike: the keyed rows at each ``--keys`` and
    the stateless query; one warm-up run of each variant first."""
    plan = [step for step in side_by_side_plan(args.keys) if step[0].startswith(args.only or "")]
    console.print(
        f"[bold]Spark on its own kafka connector, side by side[/] — {args.records:,} records a backlog, "
        f"{PARTITIONS} partitions, keyed: {args.keyed} shuffle partitions at "
        f"{', '.join(f'{k:,}' for k in args.keys)} keys, cutline checkpoints every {args.interval_ms} ms, "
        f"maxOffsetsPerTrigger {args.per_trigger:,}, trigger {args.trigger_ms} ms, {args.rounds} round(s); "
        f"{machine_line()}, code from {code_checked()}\n{uptime()}\ncommand: {command}"
    )
    work = Path(tempfile.mkdtemp(prefix="cutline-bench-spark-"))
    runs: dict[str, list[Run]] = {group: [] for group, _, _ in plan}
    unmeasured: dict[str, str] = {}
    keys_used = sorted({keys for _, keys, _ in plan}, key=args.keys.index)
    with (
        _broker(args) as (bootstrap, broker_name),
        CoordinatorProcess(bootstrap, log_path=work / "coordinator" / "log"),
    ):
        console.print(f"broker: {broker_name}")
        topics = {keys: f"bench-words-{keys}-{uuid.uuid4().hex[:6]}" for keys in keys_used}
        create_topics(bootstrap, list(topics.values()), partitions=PARTITIONS)
        for keys, topic in topics.items():
            produce(bootstrap, topic, args.records, keys)
        spark = _session(args)
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
        try:
            with Progress(console=console, transient=True) as progress:
                total = sum(len(variants) for _, _, variants in plan) * (args.rounds + 1)
                task = progress.add_task("warm-up", total=total)
                for round_ in range(-1, args.rounds):  # round -1: the warm-up, not measured
                    for group, keys, variants in plan:
                        for name in variants if round_ % 2 else variants[::-1]:
                            progress.update(task, description=f"round {round_ + 1}: {group}, {name}")
                            if name not in unmeasured:
                                try:
                                    run = measured(
                                        _side_run,
                                        name,
                                        spark,
                                        bootstrap,
                                        topics[keys],
                                        args,
                                        work,
                                        threads=args.threads,
                                    )
                                except NotOffered as refused:
                                    unmeasured[name] = str(refused)
                                else:
                                    if round_ >= 0:
                                        runs[group].append(run)
                                    progress.console.print(
                                        f"{'warm-up' if round_ < 0 else f'round {round_ + 1}'}: {group}, "
                                        f"{name}: {run.throughput:,.0f} records/s, load {run.load:.1f}"
                                    )
                            progress.advance(task)
        finally:
            spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    comparisons = [c for c in side_by_side_comparisons(args.keys) if c.group in runs]
    side_by_side_report(console, runs, comparisons, unmeasured, command)


WORKER_STARTS = 3
"""How often ``--all`` starts a run whose query failed before its first batch because a Python worker
did not connect back in time."""


def _side_run(name: str, spark: Any, bootstrap: str, topic: str, args: Any, work: Path) -> Run:
    """One run of variant ``name``, started again (a fresh query) if its query failed as it began because
    Spark's fresh Python process for a Python source did not connect back within Spark's 10 s, as on a
    loaded machine (docs/spark.md, "Spark Connect"): no batch ran, nothing is measured twice."""
    for attempt in range(1, WORKER_STARTS + 1):
        try:
            if name in STATELESS:
                return run_stateless(spark, bootstrap, topic, args.records, args, work, name)
            return _variant_run(name, spark, bootstrap, topic, args, work)
        except RuntimeError as failed:
            began = "Current Committed Offsets: {}" in str(failed)  # Spark's account: no batch committed
            if (
                attempt == WORKER_STARTS
                or not began
                or "Python worker failed to connect back" not in str(failed)
            ):
                raise
            print(f"{name}: a Python worker did not connect back in time; starting the run again", flush=True)
    raise AssertionError("unreachable")


def uptime() -> str:
    """``uptime``'s line: the machine's load when a figure was taken."""
    import subprocess

    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def side_by_side_report(
    console: Console,
    runs: dict[str, list[Run]],
    comparisons: Sequence[Comparison],
    unmeasured: Mapping[str, str],
    command: str,
) -> None:
    """Each variant's records/s, CPU and load; then each comparison's ratio per round, its CPU ratio and
    its verdict; the command that produced them and the load at the end."""
    table = Table(title="Records/s in one session, each run the whole backlog; checkpoints and CPU s per run")
    for column in ("query", "variant", "runs", "records/s (range)", "mean", "checkpoints", "CPU: JVM",
                   "Python workers", "coordinator", "broker", "ours", "load (1 min)"):  # fmt: skip
        table.add_column(column, justify="right")
    for group, done in runs.items():
        for name in dict.fromkeys(r.name for r in done):
            mine = [r for r in done if r.name == name]
            rates = sorted(r.throughput for r in mine)
            cpu = summed([r.cpu for r in mine if r.cpu])
            loads = sorted(r.load for r in mine)
            table.add_row(
                group, name, str(len(mine)), f"{rates[0]:,.0f}-{rates[-1]:,.0f}",
                f"{statistics.mean(rates):,.0f}", f"{statistics.mean(len(r.completed) for r in mine):.1f}",
                *(f"{cpu.get(kind, 0.0) / len(mine):.1f}" for kind in ("Spark JVM", "Spark Python workers",
                                                                        "coordinator", "broker")),
                f"{own_cpu(cpu) / len(mine):.1f}",
                f"{loads[0]:.1f}-{loads[-1]:.1f}",
            )  # fmt: skip
    console.print(table)
    console.print(phases_table(runs))
    verdicts = Table(title=f"Ratios (per round, interleaved); command: {command}")
    for column in ("query", "ratio", "per round", "median", "CPU per record", "target", "verdict"):
        verdicts.add_column(column, justify="right")
    for c in comparisons:
        label = f"{c.numerator} / {c.denominator}"
        missing = [name for name in (c.numerator, c.denominator) if name in unmeasured]
        if missing:
            verdicts.add_row(c.group, label, "-", "-", "-", _target(c.target), f"not measured: {missing[0]}")
            continue
        ratios = sorted(_paired(runs[c.group], c.numerator, c.denominator))
        if not ratios:
            continue
        median = statistics.median(ratios)
        verdict = "-" if c.target is None else ("met" if median >= c.target else "missed")
        verdicts.add_row(
            c.group, label, ", ".join(f"{r:.2f}" for r in ratios), f"[bold]{median:.2f}[/]",
            f"{_cpu_ratio(runs[c.group], c.denominator, c.numerator):.2f}", _target(c.target), verdict,
        )  # fmt: skip
    console.print(verdicts)
    for c in comparisons:
        if c.target is not None and c.group in runs and not unmeasured.keys() & {c.numerator, c.denominator}:
            threads = thread_table(runs[c.group], c.numerator, c.denominator)
            if threads.row_count:
                console.print(threads)
    for name, why in unmeasured.items():
        console.print(f"not measured: {name}: {why}")
    console.print(f"command: {command}\n{uptime()}")


def phases_table(runs: Mapping[str, list[Run]]) -> Table:
    """Where each variant's micro-batches spend their time: mean ms per measured batch of each phase of
    Spark's ``durationMs`` (``latestOffset``: the sources' planning, the barrier source's with cutline;
    ``addBatch``: the batch's tasks and sink)."""
    batches = {
        (group, name): [b for r in done if r.name == name for b in r.measured]
        for group, done in runs.items()
        for name in dict.fromkeys(r.name for r in done)
    }
    phases = sorted({k for found in batches.values() for b in found for k in b["durationMs"]})
    table = Table(title="Where a micro-batch's time goes: mean ms per batch (Spark's durationMs)")
    for column in ("query", "variant", "batches", *phases):
        table.add_column(column, justify="right")
    for (group, name), found in batches.items():
        means = [statistics.mean(b["durationMs"].get(k, 0) for b in found) for k in phases]
        table.add_row(group, name, str(len(found)), *(f"{m:,.0f}" for m in means))
    return table


def thread_table(runs: list[Run], a: str, b: str, rows: int = 10) -> Table:
    """With ``--threads``: the threads whose CPU per run differs most between ``a`` and ``b`` (where the
    difference of the two variants' CPU goes)."""
    mean = {
        name: {k: v / len(mine) for k, v in summed([r.cpu for r in mine]).items()}
        for name in (a, b)
        if (mine := [r for r in runs if r.name == name and r.cpu])
    }
    table = Table(title=f"CPU s per run by thread: {a} against {b}")
    for column in ("thread", a, b, "difference"):
        table.add_column(column, justify="right")
    if len(mean) < 2:
        return table
    found = {k for cpu in mean.values() for k in cpu if ": " in k}
    for key in sorted(found, key=lambda k: -abs(mean[a].get(k, 0.0) - mean[b].get(k, 0.0)))[:rows]:
        first, second = mean[a].get(key, 0.0), mean[b].get(key, 0.0)
        table.add_row(key, f"{first:.2f}", f"{second:.2f}", f"{first - second:+.2f}")
    return table


def _target(target: float | None) -> str:
    return "-" if target is None else f"≥ {target:g}"


def own_cpu(cpu: Mapping[str, float]) -> float:
    """CPU seconds of the benchmark's own processes (the driver, Spark, the coordinator, the broker): the
    machine's other work left out, which a shared machine's load would otherwise add."""
    return sum(v for k, v in cpu.items() if k not in ("machine", "other processes", "wall") and ": " not in k)


def _cpu_ratio(runs: list[Run], a: str, b: str) -> float:
    """Median CPU per record of the benchmark's processes in runs of ``a`` / in runs of ``b``: ``b``'s
    throughput ratio if CPU were all that decided it (steadier than a span when other work shares the
    cores)."""
    per_record = {
        name: statistics.median(own_cpu(r.cpu) / r.records for r in runs if r.name == name) for name in (a, b)
    }
    return per_record[a] / per_record[b] if per_record[b] else float("nan")


@contextmanager
def _broker(args: Any) -> Iterator[tuple[str, str]]:
    """(bootstrap, what it is): ``CUTLINE_BOOTSTRAP``'s broker; else, for the connector, Apache Kafka
    started here (on the embedded broker the connector's batch ends fall short); else the embedded
    broker."""
    external = os.environ.get("CUTLINE_BOOTSTRAP")
    if external or not args.connector:
        with broker_at(external) as bootstrap:
            yield bootstrap, f"CUTLINE_BOOTSTRAP={external}" if external else "embedded Tansu"
        return
    from events.dev.apache_kafka import KAFKA_VERSION, ApacheKafka

    with ApacheKafka(heap="512m") as kafka:
        yield kafka.bootstrap, f"Apache Kafka {KAFKA_VERSION}, one node (KRaft), 512 MB heap, started here"


def native_comparison(args: Any, console: Console) -> None:
    """cutline's keyed word count against Spark's own stateful aggregation, for each ``--keys``:
    one warm-up run of each variant, then rounds in ABC and CBA order."""
    variants = [*NATIVE_STORES, CUTLINE_KEYED]
    console.print(
        f"[bold]Keyed word count: cutline (checkpoint every {args.interval_ms} ms) against Spark's "
        f"groupBy().count()[/], reading with {_source_name(args)} — {args.records:,} records, "
        f"{PARTITIONS} partitions, {args.keyed} shuffle partitions, keys "
        f"{', '.join(f'{k:,}' for k in args.keys)}, maxOffsetsPerTrigger "
        f"{args.per_trigger:,}, trigger {args.trigger_ms} ms, {args.rounds} round(s); {machine_line()}, "
        f"code from {code_checked()}, load {os.getloadavg()[0]:.2f}"
    )
    work = Path(tempfile.mkdtemp(prefix="cutline-bench-spark-"))
    runs: dict[int, list[Run]] = {keys: [] for keys in args.keys}
    with (
        _broker(args) as (bootstrap, _),
        CoordinatorProcess(bootstrap, log_path=work / "coordinator" / "log"),
    ):
        topics = {keys: f"bench-words-{keys}-{uuid.uuid4().hex[:6]}" for keys in args.keys}
        create_topics(bootstrap, list(topics.values()), partitions=PARTITIONS)
        for keys, topic in topics.items():
            produce(bootstrap, topic, args.records, keys)
        spark = _session(args)
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
        try:
            for name in variants:  # warm-up, not measured
                _variant_run(name, spark, bootstrap, topics[args.keys[0]], args, work)
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("runs", total=len(variants) * len(args.keys) * args.rounds)
                for round_ in range(args.rounds):
                    for keys, topic in topics.items():
                        for name in variants if round_ % 2 == 0 else variants[::-1]:
                            runs[keys].append(
                                measured(_variant_run, name, spark, bootstrap, topic, args, work)
                            )
                            progress.advance(task)
        finally:
            spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    native_report(console, runs, variants)


def _variant_run(name: str, spark: Any, bootstrap: str, topic: str, args: Any, work: Path) -> Run:
    runner = run_cutline_keyed if name == CUTLINE_KEYED else run_native
    return runner(spark, bootstrap, topic, args.records, args, work, name)


def native_report(console: Console, runs: dict[int, list[Run]], variants: list[str]) -> None:
    """Records/s of each variant (range and mean over its runs), the ratio cutline / HDFS-backed
    store, and the CPU of a run by kind of process."""
    hdfs = next(iter(NATIVE_STORES))
    table = Table(title="Keyed word count, records/s in the same session (each run: the whole backlog)")
    for column in (
        "keys",
        "variant",
        "runs",
        "records/s (range)",
        "mean",
        "/ HDFS store",
        "CPU s: JVM",
        "Python workers",
        "all",
    ):
        table.add_column(column, justify="right")
    for keys, done in runs.items():
        means = {
            name: statistics.mean(r.throughput for r in done if r.name == name)
            for name in variants
            if any(r.name == name for r in done)
        }
        for name in variants:
            mine = [r for r in done if r.name == name]
            if not mine:
                continue
            rates = sorted(r.throughput for r in mine)
            cpu = summed([r.cpu for r in mine if r.cpu])
            table.add_row(
                f"{keys:,}",
                name,
                str(len(mine)),
                f"{rates[0]:,.0f}-{rates[-1]:,.0f}",
                f"{means[name]:,.0f}",
                f"{means[name] / means[hdfs]:.2f}",
                *(
                    f"{cpu.get(kind, 0.0) / len(mine):.1f}"
                    for kind in ("Spark JVM", "Spark Python workers", "machine")
                ),
            )
    console.print(table)
    for keys, done in runs.items():
        ratios = sorted(_paired(done, CUTLINE_KEYED, hdfs))
        if ratios:
            console.print(
                f"{keys:,} keys: cutline / HDFS-backed store per round "
                f"{', '.join(f'{r:.2f}' for r in ratios)}; "
                f"target ≥ 1: {'met' if statistics.median(ratios) >= 1 else 'missed'}"
            )


def _paired(runs: list[Run], a: str, b: str) -> list[float]:
    """Per round (runs in order, one of each variant a round): throughput of ``a`` / of ``b``."""
    per_round = len({r.name for r in runs})
    rounds = [runs[i : i + per_round] for i in range(0, len(runs), per_round)]
    return [
        next(r.throughput for r in group if r.name == a) / next(r.throughput for r in group if r.name == b)
        for group in rounds
        if {a, b} <= {r.name for r in group}
    ]


def marked(
    spark: Any, bootstrap: str, topic: str, records: int, args: Any, work: Path, *, markers_ms: int
) -> Run:
    """:func:`run_cutline` with latency markers every ``markers_ms``."""
    run = run_cutline(spark, bootstrap, topic, records, args, work, markers_ms=markers_ms)
    run.name = "with markers"
    return run


def _latency(url: str, runs: list[Run]) -> dict[str, Any] | None:
    """The coordinator's ``/jobs/JOB/latency`` of the last run with markers."""
    import urllib.request

    job = next((r.job_id for r in reversed(runs) if r.name == "with markers"), None)
    if job is None:
        return None
    with urllib.request.urlopen(f"{url}/jobs/{job}/latency", timeout=10) as response:
        return dict(json.load(response))


def markers_report(
    console: Console, runs: list[Run], markers_ms: int, latency: dict[str, Any] | None
) -> None:
    """Throughput with latency markers against without, per ABBA round and overall."""
    table = Table(title=f"Spark job with cutline, without and with latency markers every {markers_ms} ms")
    for column in ("run", "batches", "span", "records/s"):
        table.add_column(column, justify="right")
    for run in runs:
        name = "without markers" if run.name == "with cutline" else run.name
        table.add_row(name, str(len(run.measured)), f"{run.span_s:.1f} s", f"{run.throughput:,.0f}")
    console.print(table)
    off = [r.throughput for r in runs if r.name == "with cutline"]
    on = [r.throughput for r in runs if r.name == "with markers"]
    ratio = statistics.mean(on) / statistics.mean(off)
    pairs = [runs[i : i + 2] for i in range(0, len(runs) - 1, 2)]
    paired = sorted(
        next(r.throughput for r in pair if r.name == "with markers")
        / next(r.throughput for r in pair if r.name == "with cutline")
        for pair in pairs
        if {r.name for r in pair} == {"with cutline", "with markers"}
    )
    console.print(
        f"throughput with/without markers: {statistics.mean(on):,.0f} / {statistics.mean(off):,.0f} "
        f"records/s = [bold]{ratio:.3f}[/] (target ≥ 0.99: {'met' if ratio >= 0.99 else 'missed'}); "
        f"per-round ratios: {', '.join(f'{p:.3f}' for p in paired)}"
    )
    # CPU per record, a steadier measure of the markers' cost than a run's span: other processes
    # of the machine stretch a span much more than they change the work each record takes.
    cpu_off = [sum(r.cpu.values()) / r.records * 1e6 for r in runs if r.name == "with cutline"]
    cpu_on = [sum(r.cpu.values()) / r.records * 1e6 for r in runs if r.name == "with markers"]
    if cpu_off and cpu_on:
        cpu_ratio = statistics.median(cpu_off) / statistics.median(cpu_on)
        console.print(
            f"CPU per record without/with markers (median, all of the benchmark's processes): "
            f"{statistics.median(cpu_off):.1f} / {statistics.median(cpu_on):.1f} µs "
            f"= [bold]{cpu_ratio:.3f}[/] "
            f"(the share of the work left to the records: target ≥ 0.99: "
            f"{'met' if cpu_ratio >= 0.99 else 'missed'}); median per-round throughput ratio "
            f"{statistics.median(paired):.3f}"
        )
    if latency is not None:
        operators = Table(title="latency per operator, last run with markers (ms, last 128 per histogram)")
        for column in ("operator", "count", "p50", "p99", "max"):
            operators.add_column(column, justify="right")
        for row in latency["operators"]:
            operators.add_row(row["operator_id"], *(f"{row[k]:g}" for k in ("count", "p50", "p99", "max")))
        console.print(operators)


def report(console: Console, runs: list[Run]) -> None:
    table = Table(title="Spark word count, same job and backlog")
    for column in (
        "run",
        "batches",
        "span",
        "records/s",
        "checkpoints",
        "barrier→completed (batches) p50 / max",
        "duration p50 / max",
    ):
        table.add_column(column, justify="right")
    for run in runs:
        delays = run.delays()
        durations = [c.duration_ms for c in run.completed]
        table.add_row(
            run.name,
            str(len(run.measured)),
            f"{run.span_s:.1f} s",
            f"{run.throughput:,.0f}",
            str(len(run.completed)) if run.name == "with cutline" else "-",
            f"{statistics.median(delays):g} / {max(delays)}" if delays else "-",
            f"{statistics.median(durations):g} / {max(durations)} ms" if durations else "-",
        )
    console.print(table)
    phases = Table(title="Where a micro-batch's time goes: mean ms per batch (Spark's durationMs)")
    groups = {
        "without cutline": [b for r in runs if r.name == "without cutline" for b in r.measured],
        "with cutline, barrier batches": [
            b for r in runs if r.name == "with cutline" for b in r.measured if _barrier_id(b) is not None
        ],
        "with cutline, other batches": [
            b for r in runs if r.name == "with cutline" for b in r.measured if _barrier_id(b) is None
        ],
    }
    keys = sorted({k for bs in groups.values() for b in bs for k in b["durationMs"]})
    phases.add_column("batches")
    phases.add_column("n", justify="right")
    for key in keys:
        phases.add_column(key, justify="right")
    for label, batches in groups.items():
        if batches:
            means = [statistics.mean(b["durationMs"].get(k, 0) for b in batches) for k in keys]
            phases.add_row(label, str(len(batches)), *(f"{m:.0f}" for m in means))
    console.print(phases)
    by_position = Table(
        title="addBatch by position in the run: mean ms (b = share of runs with a barrier there)"
    )
    by_position.add_column("kind")
    width = max(len(r.measured) for r in runs)
    for i in range(width):
        by_position.add_column(str(i), justify="right")
    for name in ("without cutline", "with cutline"):
        mine = [r.measured for r in runs if r.name == name]
        cells = []
        for i in range(width):
            at = [m[i] for m in mine if len(m) > i]
            barrier = sum(_barrier_id(b) is not None for b in at)
            mean = statistics.mean(b["durationMs"].get("addBatch", 0) for b in at) if at else 0
            cells.append(f"{mean:.0f}" + (f" b{barrier / len(at):.0%}" if barrier else ""))
        by_position.add_row(name, *cells)
    console.print(by_position)
    console.print(cpu_table(runs))
    plain = [r.throughput for r in runs if r.name == "without cutline"]
    cut = [r.throughput for r in runs if r.name == "with cutline"]
    ratio = statistics.mean(cut) / statistics.mean(plain)
    delays = [d for r in runs for d in r.delays()]
    console.print(
        f"throughput with/without cutline: {statistics.mean(cut):,.0f} / "
        f"{statistics.mean(plain):,.0f} records/s "
        f"= [bold]{ratio:.3f}[/] (target ≥ 0.95: {'met' if ratio >= 0.95 else 'missed'})"
    )
    # Each round runs both kinds back to back; the per-round ratios show the run-to-run spread.
    rounds = [runs[i : i + 2] for i in range(0, len(runs) - 1, 2)]
    paired = sorted(
        next(r.throughput for r in pair if r.name == "with cutline")
        / next(r.throughput for r in pair if r.name == "without cutline")
        for pair in rounds
        if {r.name for r in pair} == {"with cutline", "without cutline"}
    )
    if paired:
        console.print(
            f"per-round ratios ({len(paired)} rounds): median {statistics.median(paired):.3f}, "
            f"range {paired[0]:.3f} to {paired[-1]:.3f}"
        )
    if delays:
        console.print(
            f"barrier → completed: {len(delays)} checkpoints, "
            f"median {statistics.median(delays):g} micro-batch(es), "
            f"max {max(delays)}, share ≤ 1: {sum(d <= 1 for d in delays) / len(delays):.0%} (target ≤ 1)"
        )


def snapshot_sizes(keys: int = 100_000, fractions: tuple[float, ...] = (0.001, 0.01, 0.1, 1.0)) -> Table:
    """Bytes of a keyed partition's snapshot against the keys changed since the previous one."""
    import random

    table = Table(title=f"Keyed snapshot of one partition with {keys:,} keys: piece written vs keys changed")
    for column in ("changed", "keys in piece", "kind", "piece bytes", "share of full", "write ms"):
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        settings = KeyedSettings(
            "sizes", "unused:9092", str(root / "state"), 1, frozenset(), run_id="r", attempt=1
        )
        store = KeyedStateStore(settings.state_root, 0)
        state: KeyedState = {}
        for i in range(keys):
            key = f"key-{i:06d}"
            state.setdefault(key_group(key), {})[key] = str(i).encode()
        store.seed(state)
        location = (root / "checkpoints").as_uri()
        groups = key_group_range(0, 1)
        step = KEYED_WORD_COUNT.identity
        _, _, full = write_snapshot(
            store, state, groups, 128, "keyed-0", settings, _barrier(location, 1), 0, step
        )
        assert full is not None
        table.add_row("all (first)", f"{full.keys:,}", full.kind, f"{full.size:,}", "100 %", "")
        rng = random.Random(1)
        for n, fraction in enumerate(fractions, start=1):
            changes: dict[int, dict[str, bytes | None]] = {}
            for i in rng.sample(range(keys), int(keys * fraction)):
                key = f"key-{i:06d}"
                changes.setdefault(key_group(key), {})[key] = str(-i - n).encode()
            apply_changes(state, changes)
            store.save(n, state, changes)
            began = time.perf_counter()
            _, _, piece = write_snapshot(
                store, state, groups, 128, "keyed-0", settings, _barrier(location, n + 1), n, step
            )
            took = (time.perf_counter() - began) * 1000
            assert piece is not None
            table.add_row(
                f"{fraction:.1%}",
                f"{piece.keys:,}",
                piece.kind,
                f"{piece.size:,}",
                f"{piece.size / full.size:.2%}",
                f"{took:.0f}",
            )
    return table


def _barrier(location: str, checkpoint_id: int) -> dict[str, Any]:
    return {
        "id": checkpoint_id,
        "attempt": 1,
        "kind": "CHECKPOINT",
        "location": f"{location}/chk-{checkpoint_id}",
        "timestamp_ms": 0,
    }


CPU_ROWS = (
    "driver (Python)",
    "Spark JVM",
    "Spark Python workers",
    "coordinator",
    "broker",
    "other children",
    "other processes",
    "machine",
)


def cpu_table(runs: list[Run]) -> Table:
    """Mean CPU seconds per run by kind of process, without and with cutline, and the difference."""
    table = Table(
        title="Where the CPU goes: mean CPU seconds per run (/proc, whole run incl. start and stop)"
    )
    for column in ("process", "without cutline", "with cutline", "difference", "difference, % of machine"):
        table.add_column(column, justify="right")
    kinds: dict[str, list[Mapping[str, float]]] = {
        name: [r.cpu for r in runs if r.name == name and r.cpu]
        for name in ("without cutline", "with cutline")
    }
    if not all(kinds.values()):
        return table
    plain, cut = (
        {k: v / len(kinds[name]) for k, v in summed(kinds[name]).items()}
        for name in ("without cutline", "with cutline")
    )
    threads = sorted(
        {k for k in (*plain, *cut) if ": " in k and max(plain.get(k, 0.0), cut.get(k, 0.0)) >= 0.05},
        key=lambda k: -abs(cut.get(k, 0.0) - plain.get(k, 0.0)),
    )
    for row in (*CPU_ROWS, "wall", *threads):
        before, after = plain.get(row, 0.0), cut.get(row, 0.0)
        share = (after - before) / plain["machine"] if row != "wall" and plain.get("machine") else None
        table.add_row(
            row,
            f"{before:.2f} s",
            f"{after:.2f} s",
            f"{after - before:+.2f} s",
            f"{share:+.1%}" if share is not None else "",
        )
    return table


if __name__ == "__main__":
    main()
