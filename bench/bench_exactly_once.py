"""Benchmark: a participant's exactly-once Kafka sink against a plain idempotent producer
(docs/exactly-once.md; docs/benchmarks.md, "Exactly-once output to Kafka").

    uv run python bench/bench_exactly_once.py [--records 200000] [--rate 5000] [--seconds 10]
                                              [--interval-ms 1000] [--size 100] [--rounds 2]

Apache Kafka, one node started here (or ``CUTLINE_BOOTSTRAP``). A 4-partition output topic per run,
and a ``read_committed`` consumer of it in a thread that notes when each record becomes visible.
Two ways to write the same records, in ABBA rounds:

- **idempotent**: ``Producer.produce`` with ``enable.idempotence`` (at-least-once output, no
  transaction), polled as it goes;
- **exactly-once**: ``ExactlyOnceSink.send``; every ``--interval-ms`` the sending thread stages the
  records at a barrier (a local file) and at once completes the checkpoint (``sink.complete``: one
  transaction with the records and the commit marker), as a participant's ``snapshot`` and
  ``on_complete`` do. The coordinator's round trip (barrier, ack, completion) is not in it: this is
  the sink's own cost.

Two measurements per way: **throughput**, ``--records`` records sent as fast as the way allows,
from the first send until the last is visible to ``read_committed``; **latency**, records at
``--rate`` per second for ``--seconds``, each carrying its send time, until visible (p50, p99).
One unmeasured run of each way warms up first (the cluster's first transaction creates its
transaction log).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

from bench.bench_coordinator import broker
from events.dev.broker import create_topics
from events.kafka.clients import consumer_config, producer_config
from events.task.exactly_once import ExactlyOnceSink
from events.wire.records import CheckpointBarrier, CheckpointCompleted, CheckpointKind
from events.wire.topics import Topics

PARTITIONS = 4
WAYS = ("idempotent", "exactly-once")


@dataclass(frozen=True)
class Row:
    way: str
    round: int
    records_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float


class Visible:
    """A read_committed consumer of ``topic`` in a thread: when each record became visible."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        extra = {"isolation.level": "read_committed", "fetch.wait.max.ms": 5}
        self._consumer = Consumer(consumer_config(bootstrap, extra=extra))
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.latencies_ns: list[int] = []
        self.last_ns = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(1000, 0.05):
                if msg.error() is None:
                    now = time.time_ns()
                    (sent,) = struct.unpack_from(">q", msg.value() or bytes(8))
                    self.latencies_ns.append(now - sent)
                    self.last_ns = now

    def wait_for(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.latencies_ns) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.latencies_ns)} of {count} records visible in {timeout:g} s")
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


class Writer:
    """One way to write: ``send(value)``, ``tick()`` as often as possible, ``finish()`` at the end."""

    def __init__(self, way: str, bootstrap: str, topic: str, interval_ms: int, scratch: Path) -> None:
        self.topic, self.interval_s = topic, interval_ms / 1000
        self.checkpoint_id, self.next_checkpoint = 0, time.monotonic() + self.interval_s
        self.location = scratch
        self.sink: ExactlyOnceSink | None = None
        self.producer: Producer | None = None
        if way == "exactly-once":
            job = f"bench-{uuid.uuid4().hex[:6]}"
            self.sink = ExactlyOnceSink(bootstrap, job, "task-0", Topics("bench-eo."), uid="bench")
            self.send: Callable[[bytes], None] = lambda value: self._sink().send(topic, value)
        else:
            self.producer = Producer(producer_config(bootstrap, {"enable.idempotence": True}))
            self.send = self._produce

    def _sink(self) -> ExactlyOnceSink:
        assert self.sink is not None
        return self.sink

    def _produce(self, value: bytes) -> None:
        assert self.producer is not None
        while True:
            try:
                self.producer.produce(self.topic, value)
                return
            except BufferError:
                self.producer.poll(0.05)

    def tick(self, force: bool = False) -> None:
        if self.producer is not None:
            self.producer.poll(0)
            return
        if force or time.monotonic() >= self.next_checkpoint:
            self.checkpoint()

    def checkpoint(self) -> None:
        """A barrier, the staging, and the checkpoint's completion at once."""
        sink = self._sink()
        self.checkpoint_id += 1
        location = (self.location / f"chk-{self.checkpoint_id}").as_uri()
        kind = CheckpointKind.CHECKPOINT
        sink.stage(CheckpointBarrier(sink.job_id, self.checkpoint_id, 1, kind, 0, location))
        sink.complete(
            CheckpointCompleted(sink.job_id, self.checkpoint_id, kind, 0, 0, {}, 0, {}, 1, location)
        )
        self.next_checkpoint = time.monotonic() + self.interval_s

    def finish(self) -> None:
        if self.producer is not None:
            self.producer.flush(60)
        else:
            self.checkpoint()
            self._sink().close()


def payload(size: int) -> bytes:
    return struct.pack(">q", time.time_ns()) + bytes(max(0, size - 8))


def run(way: str, bootstrap: str, args: argparse.Namespace, scratch: Path, round_: int) -> Row:
    throughput = _throughput(way, bootstrap, args, scratch)
    p50, p99 = _latency(way, bootstrap, args, scratch)
    return Row(way, round_, round(throughput), round(p50, 1), round(p99, 1))


def _topic(bootstrap: str) -> str:
    topic = f"bench-eo-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], partitions=PARTITIONS)
    return topic


def _throughput(way: str, bootstrap: str, args: argparse.Namespace, scratch: Path) -> float:
    topic = _topic(bootstrap)
    visible = Visible(bootstrap, topic)
    writer = Writer(way, bootstrap, topic, args.interval_ms, scratch / uuid.uuid4().hex[:6])
    try:
        started = time.time_ns()
        for n in range(args.records):
            writer.send(payload(args.size))
            if n % 1000 == 0:
                writer.tick()
        writer.finish()
        visible.wait_for(args.records)
        return float(args.records / ((visible.last_ns - started) / 1e9))
    finally:
        visible.close()


def _latency(way: str, bootstrap: str, args: argparse.Namespace, scratch: Path) -> tuple[float, float]:
    topic = _topic(bootstrap)
    visible = Visible(bootstrap, topic)
    writer = Writer(way, bootstrap, topic, args.interval_ms, scratch / uuid.uuid4().hex[:6])
    count = args.rate * args.seconds
    try:
        started = time.monotonic()
        for n in range(count):
            due = started + n / args.rate
            while time.monotonic() < due:
                writer.tick()
                time.sleep(0.0005)
            writer.send(payload(args.size))
        writer.finish()
        visible.wait_for(count)
        ms = sorted(ns / 1e6 for ns in visible.latencies_ns)
        return statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    finally:
        visible.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the rows here as JSON")
    args = parser.parse_args()
    console = Console()
    rows: list[Row] = []
    with broker("kafka") as (bootstrap, what, _pid), tempfile.TemporaryDirectory() as scratch:
        console.print(f"broker: {what}; load {os.getloadavg()}")
        for way in WAYS:  # unmeasured: the cluster's first transaction creates its transaction log
            _throughput(way, bootstrap, argparse.Namespace(**{**vars(args), "records": 2000}), Path(scratch))
        for round_ in range(1, args.rounds + 1):
            order = WAYS if round_ % 2 else WAYS[::-1]
            for way in order:
                row = run(way, bootstrap, args, Path(scratch), round_)
                console.print(row)
                rows.append(row)
        console.print(f"load after: {os.getloadavg()}")
    table = Table("way", "records/s", "latency p50 ms", "latency p99 ms")
    for way in WAYS:
        mine = [r for r in rows if r.way == way]
        table.add_row(
            way,
            f"{statistics.median(r.records_per_s for r in mine):,.0f}",
            f"{statistics.median(r.latency_p50_ms for r in mine):.1f}",
            f"{statistics.median(r.latency_p99_ms for r in mine):.1f}",
        )
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
