"""Benchmark: one hop through the broker, against what else its fetches cover (docs/embedded-broker.md;
docs/design.md, "Performance targets").

    uv run python bench/bench_broker_hop.py [--samples 300] [--partitions 1,8,40]
                                             [--background 0,1,3] [--fetch-wait-ms 2]

A hop is ``produce()`` of one record by a confluent-kafka producer (``linger.ms`` 0, the
producer config of ``events.kafka.clients``) until ``poll()`` of an assigned consumer returns it, one
record at a time, 11-17 ms apart (below the latency benchmarks' checkpoint rate). Two series:

1. **Partitions in the consumer's own fetch.** The consumer is assigned 1, 8 or 40 partitions
   (five topics of eight, as the coordinator's input topics and its ticks topic are); the
   record goes to the first. The coordinator's consumer fetches 40 partitions at a time.
2. **Other consumers polling the broker.** The consumer fetches one partition; next to it,
   0, 1 or 3 consumers (threads of this process) each fetch 40 partitions of five other topics
   that nobody writes to, at the same ``fetch.wait.max.ms``: the load of coordinator workers
   and participants that wait for records.

The broker's CPU during each row is from /proc when it runs on this machine. Runs on the
embedded broker, or on ``CUTLINE_BOOTSTRAP``. Percentiles by nearest rank.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from confluent_kafka import Consumer, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

from bench.bench_coordinator import broker
from bench.cpu import machine_line, process_cpu
from events.dev.broker import create_topics
from events.kafka.clients import consumer_config, producer_config

COMMAND = "uv run python bench/bench_broker_hop.py"
TOPICS = 5
PARTITIONS = 8


@dataclass(frozen=True)
class Row:
    """The hops of one setting, in ms."""

    series: str
    fetched_partitions: int
    background_consumers: int
    samples: int
    p50: float
    p90: float
    p99: float
    broker_cpu_percent: float | None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest rank."""
    return sorted_values[max(0, min(len(sorted_values) - 1, round(q * len(sorted_values)) - 1))]


def _consumer(bootstrap: str, wait_ms: int, partitions: list[TopicPartition]) -> Consumer:
    group = f"hop-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(consumer_config(bootstrap, group_id=group, extra={"fetch.wait.max.ms": wait_ms}))
    consumer.assign(partitions)
    return consumer


def _spread(names: list[str], count: int) -> list[TopicPartition]:
    """``count`` partitions, the first of each topic first (0 of every topic, then 1, ...)."""
    every = [TopicPartition(name, p, 0) for p in range(PARTITIONS) for name in names]
    return every[:count]


def hops(producer: Producer, consumer: Consumer, topic: str, samples: int) -> list[float]:
    """``samples`` hops (ms) of one record to partition 0 of ``topic``, sorted."""
    while consumer.poll(0.3) is not None:  # what was there before
        pass
    measured = []
    for i in range(samples):
        started = time.perf_counter()
        producer.produce(topic, b"hop", partition=0)
        producer.poll(0)
        while True:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                break
        measured.append((time.perf_counter() - started) * 1000)
        time.sleep(0.011 + (i % 7) * 0.001)
    return sorted(measured)


def row(
    series: str,
    bootstrap: str,
    broker_pid: int | None,
    producer: Producer,
    fetched: list[TopicPartition],
    background: list[list[TopicPartition]],
    wait_ms: int,
    samples: int,
) -> Row:
    consumer = _consumer(bootstrap, wait_ms, fetched)
    stop = threading.Event()
    others = [_consumer(bootstrap, wait_ms, partitions) for partitions in background]

    def poll_quietly(other: Consumer) -> None:
        while not stop.is_set():
            other.poll(0.1)

    threads = [threading.Thread(target=poll_quietly, args=(o,), daemon=True) for o in others]
    for thread in threads:
        thread.start()
    try:
        cpu, wall = process_cpu(broker_pid), time.monotonic()
        measured = hops(producer, consumer, fetched[0].topic, samples)
        cpu, wall = process_cpu(broker_pid) - cpu, time.monotonic() - wall
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        for other in others:
            other.close()
        consumer.close()
    return Row(
        series=series,
        fetched_partitions=len(fetched),
        background_consumers=len(background),
        samples=samples,
        p50=percentile(measured, 0.5),
        p90=percentile(measured, 0.9),
        p99=percentile(measured, 0.99),
        broker_cpu_percent=None if broker_pid is None else 100 * cpu / wall,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=300, help="hops per row")
    parser.add_argument(
        "--partitions", default="1,8,40", help="partitions in the consumer's fetch (series 1)"
    )
    parser.add_argument("--background", default="0,1,3", help="other consumers of 40 partitions (series 2)")
    parser.add_argument("--fetch-wait-ms", type=int, default=2, help="fetch.wait.max.ms of every consumer")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    sizes = [int(n) for n in args.partitions.split(",")]
    if any(not 1 <= n <= TOPICS * PARTITIONS for n in sizes):
        parser.error(f"--partitions: each between 1 and {TOPICS * PARTITIONS}")
    backgrounds = [int(n) for n in args.background.split(",")]
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=140)
    console.print(f"[bold]{COMMAND}[/]: {machine_line()}, load average {os.getloadavg()[0]:.2f} at start")
    rows: list[Row] = []
    with broker() as (bootstrap, what, broker_pid):
        console.print(f"broker: {what} at {bootstrap}; fetch.wait.max.ms {args.fetch_wait_ms}")
        prefix = f"hop-{uuid.uuid4().hex[:6]}"
        own = [f"{prefix}-in{i}" for i in range(TOPICS)]
        quiet = [[f"{prefix}-bg{k}-{i}" for i in range(TOPICS)] for k in range(max(backgrounds, default=0))]
        create_topics(bootstrap, [*own, *(name for names in quiet for name in names)], partitions=PARTITIONS)
        producer = Producer(producer_config(bootstrap))
        producer.produce(own[0], b"warm-up", partition=0)
        producer.flush(10)
        try:
            for n in sizes:
                console.print(f"  consumer of {n} partitions ...", style="dim")
                rows.append(
                    row(
                        "own fetch",
                        bootstrap,
                        broker_pid,
                        producer,
                        _spread(own, n),
                        [],
                        args.fetch_wait_ms,
                        args.samples,
                    )
                )
            for k in backgrounds:
                console.print(f"  {k} other consumers ...", style="dim")
                background = [_spread(quiet[i], TOPICS * PARTITIONS) for i in range(k)]
                rows.append(
                    row(
                        "other consumers",
                        bootstrap,
                        broker_pid,
                        producer,
                        _spread(own, 1),
                        background,
                        args.fetch_wait_ms,
                        args.samples,
                    )
                )
        finally:
            producer.flush(10)

    table = Table(title=f"One hop, produce → poll (ms): {COMMAND}")
    for name in (
        "series",
        "partitions fetched",
        "other consumers (40 partitions each)",
        "p50",
        "p90",
        "p99",
        "broker CPU",
    ):
        table.add_column(name, justify="left" if name == "series" else "right")
    for r in rows:
        table.add_row(
            r.series,
            str(r.fetched_partitions),
            str(r.background_consumers),
            f"{r.p50:.2f}",
            f"{r.p90:.2f}",
            f"{r.p99:.2f}",
            "-" if r.broker_cpu_percent is None else f"{r.broker_cpu_percent:.0f} %",
        )
    console.print(table)
    console.print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        with open(args.json, "w") as out:
            json.dump([asdict(r) for r in rows], out, indent=2)


if __name__ == "__main__":
    main()
