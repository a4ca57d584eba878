"""bench/bench_spark.py --all: what one run compares, and how its verdicts read (issue 48, item 5)."""

from __future__ import annotations

import json
from io import StringIO

from rich.console import Console

from bench.bench_spark import (
    CUTLINE_KEYED,
    NATIVE_STORES,
    STATELESS,
    STATELESS_CONNECTOR,
    STATELESS_CUTLINE,
    STATELESS_STEP,
    Run,
    own_cpu,
    parse_words,
    process_kind,
    side_by_side_comparisons,
    side_by_side_plan,
    side_by_side_report,
)
from spark_tasks.state import KafkaRecord

HDFS, ROCKSDB = NATIVE_STORES


def run_of(name: str, seconds: float, records: int = 1000, cpu_s: float = 1.0) -> Run:
    """A run of ``name`` that read ``records`` in one batch of ``seconds``, using ``cpu_s`` of the machine."""
    batch = {
        "timestamp": "2026-11-29T12:00:00.000Z",
        "durationMs": {"triggerExecution": seconds * 1000},
        "sources": [{"endOffset": json.dumps({"words": {"0": records}})}],
        "numInputRows": records,
    }
    run = Run(name, records, [batch])
    run.cpu, run.load = {"Spark JVM": cpu_s, "machine": 9.0}, 2.5
    return run


def printed(*args: object) -> str:
    out = StringIO()
    side_by_side_report(Console(file=out, width=400), *args)  # type: ignore[arg-type]
    return out.getvalue()


class TestWhatOneRunMeasures:
    def test_the_keyed_rows_at_each_key_count_and_the_stateless_query_on_the_first_backlog(self) -> None:
        """Given 9 and 100,000 keys, the plan runs Spark's two stores and cutline at each, and the
        stateless variants once, on the 9-key backlog."""
        plan = side_by_side_plan([9, 100_000])

        assert [
            ("keyed, 9 keys", 9, [HDFS, ROCKSDB, CUTLINE_KEYED]),
            ("keyed, 100,000 keys", 100_000, [HDFS, ROCKSDB, CUTLINE_KEYED]),
            ("stateless", 9, list(STATELESS)),
        ] == plan

    def test_the_targets_are_issue_48s(self) -> None:
        """cutline's keyed state at or above each of Spark's stores (1.0), cutline's checkpoints at 0.97
        of the same stateless query without them; the comparisons with the SQL parse and with
        cutline-kafka are reported without a target."""
        targets = {(c.group, c.numerator, c.denominator): c.target for c in side_by_side_comparisons([9])}

        assert 1.0 == targets[("keyed, 9 keys", CUTLINE_KEYED, HDFS)]
        assert 1.0 == targets[("keyed, 9 keys", CUTLINE_KEYED, ROCKSDB)]
        assert 0.97 == targets[("stateless", STATELESS_CUTLINE, STATELESS_STEP)]
        assert [None, None, None] == [t for t in targets.values() if t is None]


class TestTheReport:
    def test_a_ratio_is_the_median_of_the_rounds_and_decides_the_verdict(self) -> None:
        """Given two interleaved rounds where cutline took 1.0 and 2.0 s against the store's 1.0 and 1.0 s,
        the per-round ratios are 1.00 and 0.50, the median 0.75: missed; the command is printed."""
        runs = {
            "keyed, 9 keys": [
                run_of(HDFS, 1.0), run_of(CUTLINE_KEYED, 1.0), run_of(CUTLINE_KEYED, 2.0), run_of(HDFS, 1.0)
            ]
        }  # fmt: skip
        comparisons = [c for c in side_by_side_comparisons([9]) if c.denominator == HDFS]

        text = printed(runs, comparisons, {}, "uv run python bench/bench_spark.py --all")

        line = next(line for line in text.splitlines() if f"{CUTLINE_KEYED} / {HDFS}" in line)
        cells = [cell.strip() for cell in line.split("│") if cell.strip()]
        assert ["0.50, 1.00", "0.75"] == cells[2:4]
        assert ["≥ 1", "missed"] == cells[-2:]
        assert "command: uv run python bench/bench_spark.py --all" in text

    def test_a_variant_the_product_does_not_run_is_reported_unmeasured_with_why(self) -> None:
        """Given the checkpointed stateless variant refused, its comparison says so instead of a ratio."""
        runs = {"stateless": [run_of(STATELESS_CONNECTOR, 1.0), run_of(STATELESS_STEP, 1.1)]}
        comparisons = [c for c in side_by_side_comparisons([9]) if c.group == "stateless"]

        text = printed(runs, comparisons, {STATELESS_CUTLINE: "no such job"}, "cmd")

        assert f"not measured: {STATELESS_CUTLINE}: no such job" in text
        line = next(line for line in text.splitlines() if f"{STATELESS_STEP} / {STATELESS_CONNECTOR}" in line)
        assert "0.91" in line


class TestTheStatelessStep:
    def test_emits_each_word_and_keeps_no_state(self) -> None:
        """Given two records, the step's rows are their words, lower-cased, and its state is unchanged."""
        records = [
            KafkaRecord(None, b"Kafka spark", "t", 0, 0, None),
            KafkaRecord(None, None, "t", 0, 1, None),
            KafkaRecord(None, b"  barrier ", "t", 0, 2, None),
        ]

        assert ({}, [("kafka",), ("spark",), ("barrier",)]) == parse_words({}, records)


class TestProcessKind:
    def test_apache_kafka_started_by_the_benchmark_is_the_broker_not_spark(self) -> None:
        """A java process running ``kafka.Kafka`` counts as the broker; Spark's JVM stays Spark's."""
        assert "broker" == process_kind("/usr/bin/java -Xmx512m -cp /c/* kafka.Kafka /tmp/server.properties")
        assert "Spark JVM" == process_kind(
            "/usr/bin/java -cp /spark/jars/* org.apache.spark.deploy.SparkSubmit"
        )


class TestOwnCpu:
    def test_counts_the_benchmarks_processes_not_the_machines_other_work(self) -> None:
        """The machine's busy time, other processes, the wall clock and per-thread rows are left out."""
        cpu = {"Spark JVM": 2.0, "broker": 0.5, "machine": 40.0, "other processes": 37.5, "wall": 9.0}

        assert 2.5 == own_cpu({**cpu, "Spark JVM: Executor task launch worker": 1.5})
