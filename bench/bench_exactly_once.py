"""Benchmark: exactly-once output to Kafka against at-least-once output, side by side in one run
(docs/exactly-once.md; docs/benchmarks.md, "Exactly-once output to Kafka").

    uv run python bench/bench_exactly_once.py [--records 1000000] [--rate 5000] [--seconds 10]
        [--interval-ms 1000] [--size 100] [--rounds 2] [--batch 1000] [--spark] [--flink] [--json PATH]

Apache Kafka, one node started here (or ``CUTLINE_BOOTSTRAP``). Every output record carries the
time its input was produced (its first 8 bytes), and a ``read_committed`` consumer of the output
topic (4 partitions), in a process of its own (:class:`Visible`), notes when each becomes visible:
**latency** is produced -> visible to ``read_committed`` (p50, p99); **throughput** is records from
the first produced to the last visible, over a run long enough (1,000,000 records by default) that
the exactly-once way's last commit weighs little: that wait is the latency's. For the participant
also to the last committed (``committed records/s``: the sink's last commit returned, the plain
producer's last record acknowledged), which the one reader's own pace does not bound.

- **participant** (always): ``ExactlyOnceSink.send`` (sending ahead into an open transaction)
  against a plain idempotent producer (``enable.idempotence``: at-least-once output), in ABBA
  rounds, each with the same ``read_committed`` reader process. The sink's barrier,
  staging and completion come every ``--interval-ms`` in the sending thread (``stage``, then
  ``complete``, as a participant's ``snapshot`` and ``on_complete`` run; the commit runs on the
  sink's committing thread); the coordinator's round trip is not in it. Throughput: ``--records``
  sent as fast as the way allows, one ``send`` (one ``produce``) a record; the CPU per record of the
  sending thread (the loop, the sink's staging; not the wait for the last record to be visible), of
  this process (the client: sends, staging, commits; not the reader) and of the broker. Latency:
  ``--rate`` records/s for ``--seconds``; for the sink also completion -> visible (p50, p99): from the
  ``complete`` call that covers a record to its being read.
- **participant, in batches** (``--batch N``, 0 for none; throughput only): the same, ``N`` records a
  call: ``ExactlyOnceSink.send_many`` against the idempotent producer's best loop over the same
  batch (``produce`` bound once, nothing else in the loop). Compare each with its own kind: the
  per-record rows decide the target; the batch rows show what an app that has its output in
  batches gets.
- **Spark** (``--spark``): the same query, a ``CheckpointedJob`` that copies its input topic's values
  (a stateful step that counts them), checkpointed every ``--interval-ms`` by a coordinator started
  here, writing through ``ExactlyOnceKafkaSink`` (``foreachBatch``) against Spark's own Kafka sink
  (``format("kafka")``, at-least-once; the connector's jars from ``spark_tasks/connector.py``), on
  ``local[2]``; and against at-least-once output from the driver (:class:`DriverProducerSink`: the
  same ``foreachBatch`` collect, a plain idempotent producer flushed in each batch), which shows what
  exactly-once itself costs apart from where the rows are written. Latency: ``--spark-rate``
  records/s for ``--seconds`` into the running job; throughput: ``--spark-records`` (1,000,000)
  produced at once into the running job, about 25 s of batches, so that the exactly-once way's last
  commit (its latency) weighs little. A short run of each way goes first, unmeasured: the driver
  JVM's JIT warms up there, not in round 1.
- **Flink** (``--flink``): Flink's ``KafkaSink`` with ``DeliveryGuarantee.EXACTLY_ONCE`` (SQL
  ``sink.delivery-guarantee = exactly-once``) copying the input topic, checkpointed every
  ``--interval-ms``, in a local MiniCluster of the PyFlink venv (``--flink-python``, by default
  ``/tmp/cutline-flink-venv``) with ``flink-sql-connector-kafka`` from Maven Central (``mvn``);
  latency at ``--rate``, as above.
"""

from __future__ import annotations

import argparse
import bisect
import json
import multiprocessing
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_coordinator import broker  # noqa: E402
from bench.cpu import process_cpu  # noqa: E402
from events.dev.broker import create_topics  # noqa: E402
from events.kafka.clients import consumer_config, producer_config  # noqa: E402
from events.task.exactly_once import ExactlyOnceSink  # noqa: E402
from events.wire.records import CheckpointBarrier, CheckpointCompleted, CheckpointKind  # noqa: E402
from events.wire.topics import Topics  # noqa: E402

PARTITIONS = 4
NO_TIME = bytes(8)
BENCH_TOPICS = Topics("bench-eo.")
"""The participant sink's cutline topics (its journal, which ``recover`` reads, and marker topic)."""
WARM_UP_TOPIC = "bench-eo.warm-up"
"""Where the plain producer sends one record before the clock starts."""
BENCH_BUFFER_BYTES = 1 << 30
"""The participant sink's ``max_buffered_bytes`` here: sending as fast as it goes, the benchmark's loop
buffers ~600,000 records (60 MB) a second, faster than the broker takes them; a participant's input
would bound it."""
IDEMPOTENT, EXACTLY_ONCE = "idempotent producer (at-least-once)", "ExactlyOnceSink"
IDEMPOTENT_BATCH = "idempotent producer, a loop over each batch"
EXACTLY_ONCE_BATCH = "ExactlyOnceSink.send_many"
BATCHED = (IDEMPOTENT_BATCH, EXACTLY_ONCE_BATCH)
SPARK_KAFKA, SPARK_EXACTLY_ONCE = "Spark's kafka sink (at-least-once)", "ExactlyOnceKafkaSink"
SPARK_DRIVER = "foreachBatch, plain producer (at-least-once)"
SPARK_WAYS = (SPARK_KAFKA, SPARK_DRIVER, SPARK_EXACTLY_ONCE)
FLINK_EXACTLY_ONCE = "Flink KafkaSink EXACTLY_ONCE"
FLINK_CONNECTOR = "org.apache.flink:flink-sql-connector-kafka:4.0.1-2.0"
"""Flink's Kafka connector for Flink 2.x, as Maven Central has it (the anchor venv runs Flink 2.3)."""


@dataclass(frozen=True)
class Row:
    """One measured run of one way of writing."""

    section: str
    way: str
    round: int
    records_per_s: float | None = None
    """From the first record produced to the last visible."""
    steady_per_s: float | None = None
    """Between the moments 10 % and 90 % of the records were visible: the rate once the first
    commit is in, without the last one's tail (a run that showed everything at once would have none
    to show, and the exactly-once ways show a commit per interval)."""
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    client_cpu_us: float | None = None
    """CPU µs per record of this process (participant) in the throughput run."""
    broker_cpu_us: float | None = None
    """CPU µs per record of the broker in the throughput run."""
    checkpoint_ms: float | None = None
    """The median checkpoint duration in the latency run (a participant's: its stage and complete
    calls; Spark's and Flink's: trigger -> completed)."""
    commit_p50_ms: float | None = None
    commit_p99_ms: float | None = None
    """Completion -> visible to read_committed, in the latency run (the participant's sink)."""
    committed_per_s: float | None = None
    """From the first record produced to the last committed (participant): the sink's last commit
    returned, the plain producer's last record acknowledged, from when a ``read_committed`` reader may
    read it. Not bound by the benchmark's reader (one Python consumer of every partition: 140,000-
    160,000 records/s at rest, 2026-11-29), which ``records_per_s`` waits for."""
    sender_cpu_us: float | None = None
    """CPU µs per record of the sending thread (participant) in the throughput run, from the first
    record sent to the last handed over (``finish``): not the wait for the last to be visible."""


class Visible:
    """A read_committed consumer of ``topic`` in a process of its own (:func:`read_visible`): when each
    record became visible, and when it was produced (its first 8 bytes, ns).

    Not a thread of the writing process: there it would share the GIL with the sending thread, which
    holds it while it sends (``produce`` keeps it), and would read a commit's burst of records late
    by as much as the sending thread keeps it from them; a plain producer's loop lets go of it more
    often (each wait on its full queue), so the two ways would be measured differently."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._requests, there = context.Pipe()
        self._process = context.Process(target=read_visible, args=(bootstrap, topic, there), daemon=True)
        self._process.start()
        there.close()
        if not self._requests.poll(60):
            raise TimeoutError(f"the read_committed reader of {topic} did not start in 60 s")
        self._requests.recv()  # assigned, reading

    def _ask(self, what: str, produced_ns: int) -> Any:
        self._requests.send((what, produced_ns))
        return self._requests.recv()

    def since(self, produced_ns: int) -> list[tuple[int, int]]:
        """(produced ns, visible ns) of the records produced at or after ``produced_ns``."""
        found: list[tuple[int, int]] = self._ask("since", produced_ns)
        return found

    def wait_for(self, count: int, produced_ns: int = 0, timeout: float = 300.0) -> list[tuple[int, int]]:
        """The records produced at or after ``produced_ns`` once ``count`` of them are visible."""
        deadline = time.monotonic() + timeout
        while (found := self._ask("count", produced_ns)) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{found} of {count} records visible in {timeout:g} s")
            time.sleep(0.02)
        return self.since(produced_ns)

    def close(self) -> None:
        with suppress(OSError):
            self._requests.send(("stop", 0))
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
        self._requests.close()


def read_visible(bootstrap: str, topic: str, requests: Connection) -> None:
    """:class:`Visible`'s process: read ``topic`` (read_committed) from its start, noting each batch
    ``consume`` returns visible at its return, and answer ``count``/``since`` (records produced at or
    after a time) and ``stop`` on ``requests``."""
    extra = {"isolation.level": "read_committed", "fetch.wait.max.ms": 5}
    consumer = Consumer(consumer_config(bootstrap, extra=extra))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen: list[tuple[int, int]] = []
    counted: dict[int, tuple[int, int]] = {}
    """By produced-at-or-after time asked: (records looked at, how many of them qualify)."""
    sent = struct.Struct(">q").unpack_from
    requests.send("ready")
    try:
        while True:
            while requests.poll():
                what, produced_ns = requests.recv()
                if what == "stop":
                    return
                if what == "since":
                    requests.send([s for s in seen if s[0] >= produced_ns])
                else:
                    looked, found = counted.get(produced_ns, (0, 0))
                    found += sum(1 for at, _ in seen[looked:] if at >= produced_ns)
                    counted[produced_ns] = (len(seen), found)
                    requests.send(found)
            batch = consumer.consume(1000, 0.01)
            now = time.time_ns()
            seen.extend((sent(m.value() or NO_TIME)[0], now) for m in batch if m.error() is None)
    finally:
        consumer.close()


def payload(size: int) -> bytes:
    return struct.pack(">q", time.time_ns()) + bytes(max(0, size - 8))


def produce_waiting(producer: Producer, topic: str, value: bytes | None) -> None:
    """Produce ``value``, waiting while the producer's local queue is full."""
    while True:
        try:
            producer.produce(topic, value)
            return
        except BufferError:
            producer.poll(0.05)


def steady_rate(seen: list[tuple[int, int]]) -> float:
    """Records per second between the moments 10 % and 90 % of ``seen`` were visible."""
    times = sorted(visible for _, visible in seen)
    first, last = int(len(times) * 0.1), int(len(times) * 0.9)
    return (last - first) / max(1e-9, (times[last] - times[first]) / 1e9)


def latency_ms(seen: list[tuple[int, int]]) -> tuple[float, float]:
    """p50 and p99 of produced -> visible, in ms."""
    ms = sorted((visible - sent) / 1e6 for sent, visible in seen)
    return round(statistics.median(ms), 1), round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1)


def paced(rate: int, seconds: float, send: Callable[[], object], idle: Callable[[], object]) -> int:
    """Call ``send`` ``rate`` times a second for ``seconds``, ``idle`` while waiting; the count sent."""
    count = int(rate * seconds)
    started = time.monotonic()
    for n in range(count):
        due = started + n / rate
        while time.monotonic() < due:
            idle()
            time.sleep(0.0005)
        send()
    return count


def new_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> str:
    topic = f"bench-eo-{name}-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], partitions=partitions)
    return topic


# ---------------------------------------------------------------- a participant


class Writer:
    """One way for a participant to write: ``send(value)``, ``tick()`` as often as possible,
    ``finish()`` at the end.

    Ready when made, as a participant's output is before its first record: the sink recovered (its
    transactional id initialised, as a participant calls ``recover`` at start), the plain producer's
    idempotent producer id fetched (one record to a warm-up topic, flushed). Neither way's clock pays
    its client's start."""

    def __init__(self, way: str, bootstrap: str, topic: str, interval_ms: int, scratch: Path) -> None:
        self.topic, self.interval_s = topic, interval_ms / 1000
        self.checkpoint_id, self.next_checkpoint = 0, time.monotonic() + self.interval_s
        self.location = scratch
        self.durations_ms: list[float] = []
        self.completed_ns: list[int] = []
        """When each ``complete`` call returned (ascending)."""
        self.sink: ExactlyOnceSink | None = None
        self.producer: Producer | None = None
        create_topics(bootstrap, [*BENCH_TOPICS.all, WARM_UP_TOPIC], partitions=1)  # those not there
        if way in (EXACTLY_ONCE, EXACTLY_ONCE_BATCH):
            job = f"bench-{uuid.uuid4().hex[:6]}"
            sink = self.sink = ExactlyOnceSink(
                bootstrap,
                job,
                "task-0",
                BENCH_TOPICS,
                uid="bench",
                max_buffered_bytes=BENCH_BUFFER_BYTES,
            )
            sink.recover(None)
            self.send: Callable[[bytes], None] = lambda value: sink.send(topic, value)
        else:
            self.producer = Producer(producer_config(bootstrap, {"enable.idempotence": True}))
            self.producer.produce(WARM_UP_TOPIC, b"")
            self.producer.flush(30)
            self.send = self._produce

    def _produce(self, value: bytes) -> None:
        assert self.producer is not None
        produce_waiting(self.producer, self.topic, value)

    def send_batch(self, values: list[bytes]) -> None:
        """``values`` at once: the sink's ``send_many``; the producer's best loop over them."""
        if self.sink is not None:
            self.sink.send_many(self.topic, values)
            return
        assert self.producer is not None
        produce, topic = self.producer.produce, self.topic
        for value in values:
            try:
                produce(topic, value)
            except BufferError:
                self._produce(value)

    def tick(self) -> None:
        if self.producer is not None:
            self.producer.poll(0)
        elif time.monotonic() >= self.next_checkpoint:
            self.checkpoint()

    def checkpoint(self) -> None:
        """A barrier, the staging, and the checkpoint's completion at once."""
        assert self.sink is not None
        began = time.monotonic()
        self.checkpoint_id += 1
        location = (self.location / f"chk-{self.checkpoint_id}").as_uri()
        kind = CheckpointKind.CHECKPOINT
        self.sink.stage(CheckpointBarrier(self.sink.job_id, self.checkpoint_id, 1, kind, 0, location))
        self.sink.complete(
            CheckpointCompleted(self.sink.job_id, self.checkpoint_id, kind, 0, 0, {}, 0, {}, 1, location)
        )
        self.completed_ns.append(time.time_ns())
        self.durations_ms.append((time.monotonic() - began) * 1000)
        self.next_checkpoint = time.monotonic() + self.interval_s

    def finish(self) -> None:
        if self.producer is not None:
            self.producer.flush(60)
        else:
            assert self.sink is not None
            self.checkpoint()
            self.sink.close(300)


@dataclass(frozen=True)
class Throughput:
    """One throughput run: records/s (first sent -> last visible), steady records/s, records/s to the
    last committed, and CPU µs per record of the sending thread, this process and the broker."""

    per_s: float
    steady_per_s: float
    committed_per_s: float
    sender_cpu_us: float
    client_cpu_us: float
    broker_cpu_us: float


def participant_throughput(
    way: str, bootstrap: str, broker_pid: int | None, args: argparse.Namespace, scratch: Path, records: int
) -> Throughput:
    """``records`` written the ``way`` as fast as it goes (a way of :data:`BATCHED` in ``args.batch``
    records a call)."""
    topic = new_topic(bootstrap, "participant")
    visible = Visible(bootstrap, topic)
    writer = Writer(way, bootstrap, topic, args.interval_ms, scratch / uuid.uuid4().hex[:6])
    try:
        cpu, broker_cpu = time.process_time(), process_cpu(broker_pid)
        sender = time.thread_time()
        started = time.time_ns()
        if way in BATCHED:
            for first in range(0, records, args.batch):
                writer.send_batch([payload(args.size) for _ in range(min(args.batch, records - first))])
                writer.tick()
        else:
            for n in range(records):
                writer.send(payload(args.size))
                if n % 1000 == 0:
                    writer.tick()
        writer.finish()
        committed = time.time_ns()
        sender = time.thread_time() - sender
        seen = visible.wait_for(records)
        cpu, broker_cpu = time.process_time() - cpu, process_cpu(broker_pid) - broker_cpu
        last = max(v for _, v in seen)
        per_s = records / ((last - started) / 1e9)
        return Throughput(
            per_s,
            steady_rate(seen),
            records / ((committed - started) / 1e9),
            sender / records * 1e6,
            cpu / records * 1e6,
            broker_cpu / records * 1e6,
        )
    finally:
        visible.close()


def commit_ms(seen: list[tuple[int, int]], completed_ns: list[int]) -> tuple[float | None, float | None]:
    """p50 and p99 of completion -> visible, in ms: for each record, from the first completion after
    it was produced."""
    delays = []
    for sent, visible in seen:
        at = bisect.bisect_left(completed_ns, sent)
        if at < len(completed_ns):
            delays.append((visible - completed_ns[at]) / 1e6)
    if not delays:
        return None, None
    delays.sort()
    return round(statistics.median(delays), 1), round(
        delays[min(len(delays) - 1, int(len(delays) * 0.99))], 1
    )


def participant_latency(
    way: str, bootstrap: str, args: argparse.Namespace, scratch: Path
) -> tuple[float, float, float | None, tuple[float | None, float | None]]:
    """(p50, p99, the median checkpoint's ms, completion -> visible p50 and p99)."""
    topic = new_topic(bootstrap, "participant")
    visible = Visible(bootstrap, topic)
    writer = Writer(way, bootstrap, topic, args.interval_ms, scratch / uuid.uuid4().hex[:6])
    try:
        count = paced(args.rate, args.seconds, lambda: writer.send(payload(args.size)), writer.tick)
        writer.finish()
        seen = visible.wait_for(count)
        p50, p99 = latency_ms(seen)
        durations = writer.durations_ms
        median = round(statistics.median(durations), 1) if durations else None
        return p50, p99, median, commit_ms(seen, writer.completed_ns)
    finally:
        visible.close()


def participant_rows(
    bootstrap: str, broker_pid: int | None, args: argparse.Namespace, scratch: Path, progress: Progress
) -> list[Row]:
    ways = (IDEMPOTENT, EXACTLY_ONCE) + (BATCHED if args.batch else ())
    for way in ways[:2]:  # unmeasured: the cluster's first transaction creates its transaction log
        participant_throughput(way, bootstrap, broker_pid, args, scratch, 2000)
    task = progress.add_task("participant", total=len(ways) * args.rounds)
    rows = []
    for round_ in range(1, args.rounds + 1):
        for way in ways if round_ % 2 else ways[::-1]:
            run = participant_throughput(way, bootstrap, broker_pid, args, scratch, args.records)
            p50 = p99 = checkpoint_ms = commit_p50 = commit_p99 = None
            if way not in BATCHED:
                p50, p99, checkpoint_ms, (commit_p50, commit_p99) = participant_latency(
                    way, bootstrap, args, scratch
                )
            rows.append(
                Row(
                    "participant",
                    way,
                    round_,
                    round(run.per_s),
                    round(run.steady_per_s),
                    p50,
                    p99,
                    round(run.client_cpu_us, 2),
                    round(run.broker_cpu_us, 2),
                    checkpoint_ms,
                    commit_p50,
                    commit_p99,
                    sender_cpu_us=round(run.sender_cpu_us, 2),
                    committed_per_s=round(run.committed_per_s),
                )
            )
            progress.console.print(rows[-1])
            progress.advance(task)
    return rows


# ---------------------------------------------------------------- Spark


def copy_values(state: int, records: Any) -> tuple[int, list[tuple[bytes | None]]]:
    """The Spark query's step: each input value out as it came (the state counts them)."""
    return state + len(records), [(record.value,) for record in records]


@contextmanager
def spark_stack(bootstrap: str, work: Path) -> Iterator[Any]:
    """A coordinator and a ``local[2]`` session with Spark's Kafka connector's jars."""
    from coordinator.service.supervisor import CoordinatorProcess
    from spark_tasks.connector import kafka_connector
    from spark_tasks.session import spark_session

    with CoordinatorProcess(bootstrap, log_path=work / "coordinator" / "log"):
        spark = spark_session(
            "local[2]", "cutline-bench-eo", conf={"spark.jars": kafka_connector().spark_jars}
        )
        try:
            yield spark
        finally:
            spark.stop()


def spark_run(way: str, spark: Any, bootstrap: str, args: argparse.Namespace, work: Path) -> Row:
    """One job that writes one way: latency at ``--spark-rate``, then throughput of
    ``--spark-records`` produced at once, into the running job."""
    from events.wire.records import CheckpointConfig
    from spark_tasks.job import CheckpointedJob, JobSettings
    from spark_tasks.kafka_sink import ExactlyOnceKafkaSink
    from spark_tasks.state import StatefulStep

    step: StatefulStep[int] = StatefulStep(update=copy_values, output_schema="value binary", initial=int)
    source, output = new_topic(bootstrap, "in"), new_topic(bootstrap, "out")
    name = f"bench-eo-{uuid.uuid4().hex[:6]}"
    config = CheckpointConfig(
        interval_ms=args.interval_ms, location=(work / name).as_uri(), timeout_ms=60_000
    )
    settings = JobSettings(
        job_id=name, bootstrap=bootstrap, topics=(source,), config=config, work_dir=work / name / "work",
        source_options={"maxOffsetsPerTrigger": args.spark_per_trigger},
    )  # fmt: skip
    producer = Producer(producer_config(bootstrap, {"linger.ms": 5}))
    visible = Visible(bootstrap, output)
    sink: ExactlyOnceKafkaSink | None = None
    try:
        with CheckpointedJob(spark, settings) as job:
            out = job.stream(step)
            trigger = f"{args.trigger_ms} milliseconds"
            if way == SPARK_EXACTLY_ONCE:
                sink = ExactlyOnceKafkaSink(job, topic=output, uid="bench")
                job.start(out.writeStream.foreachBatch(sink).trigger(processingTime=trigger))
            elif way == SPARK_DRIVER:
                plain = DriverProducerSink(bootstrap, output)
                job.start(out.writeStream.foreachBatch(plain).trigger(processingTime=trigger))
            else:
                writer = out.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                job.start(writer.option("topic", output).trigger(processingTime=trigger))
            row = _spark_measured(way, producer, source, visible, args)
            durations = [c.duration_ms for c in job.completed]
            return Row(
                **{**asdict(row), "checkpoint_ms": statistics.median(durations) if durations else None}
            )
    finally:
        if sink is not None:
            sink.close()
        visible.close()


class DriverProducerSink:
    """At-least-once output through ``foreachBatch``: each batch collected into the driver as
    ``ExactlyOnceKafkaSink`` collects it (``toArrow``) and sent by a plain idempotent producer, flushed
    before the batch ends (a batch run again sends its records again). Beside the exactly-once sink
    it shows what exactly-once itself costs; beside Spark's own sink, what writing from the driver
    costs."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(producer_config(bootstrap, {"enable.idempotence": True, "linger.ms": 5}))

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        for value in batch_df.select("value").toArrow().column("value").to_pylist():
            produce_waiting(self.producer, self.topic, value)
        if self.producer.flush(60):
            raise RuntimeError(f"batch {batch_id}: records not delivered within 60 s")


def _spark_measured(
    way: str, producer: Producer, topic: str, visible: Visible, args: argparse.Namespace
) -> Row:
    def send() -> None:
        producer.produce(topic, payload(args.size))

    def idle() -> None:
        producer.poll(0)

    producer.produce(topic, payload(args.size))  # warm: the first batches and checkpoints
    visible.wait_for(1)
    began = time.time_ns()
    count = paced(args.spark_rate, args.seconds, send, idle)
    producer.flush(30)
    p50, p99 = latency_ms(visible.wait_for(count, began))
    began = time.time_ns()
    for _ in range(args.spark_records):
        produce_waiting(producer, topic, payload(args.size))
    producer.flush(60)
    seen = visible.wait_for(args.spark_records, began, timeout=600)
    per_s = args.spark_records / ((max(v for _, v in seen) - began) / 1e9)
    return Row("spark", way, 0, round(per_s), round(steady_rate(seen)), p50, p99)


def spark_rows(bootstrap: str, args: argparse.Namespace, work: Path, progress: Progress) -> list[Row]:
    ways = SPARK_WAYS
    task = progress.add_task("Spark", total=len(ways) * (args.spark_rounds + 1))
    rows = []
    with spark_stack(bootstrap, work) as spark:
        # unmeasured, as a JVM benchmark warms up (JMH): the session's first queries run while the
        # driver's JIT compiles Spark's and the connector's hot paths, and would weigh on round 1
        short = argparse.Namespace(**{**vars(args), "seconds": 2, "spark_records": args.spark_records // 10})
        for way in ways:
            spark_run(way, spark, bootstrap, short, work)
            progress.advance(task)
        for round_ in range(1, args.spark_rounds + 1):
            for way in ways if round_ % 2 else ways[::-1]:
                row = spark_run(way, spark, bootstrap, args, work)
                rows.append(Row(**{**asdict(row), "round": round_}))
                progress.console.print(rows[-1])
                progress.advance(task)
    return rows


# ---------------------------------------------------------------- Flink


def flink_connector_jar() -> Path:
    """Flink's Kafka connector from Maven Central, through ``mvn`` (its local repository after)."""
    group, artifact, version = FLINK_CONNECTOR.split(":")
    jar = (
        Path.home()
        / ".m2/repository"
        / group.replace(".", "/")
        / artifact
        / version
        / f"{artifact}-{version}.jar"
    )
    if not jar.exists():
        got = subprocess.run(
            ["mvn", "-q", "dependency:get", f"-Dartifact={FLINK_CONNECTOR}", "-Dtransitive=false"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if got.returncode != 0 or not jar.exists():
            raise RuntimeError(f"mvn could not get {FLINK_CONNECTOR}: {(got.stdout + got.stderr)[-2000:]}")
    return jar


def flink_row(bootstrap: str, args: argparse.Namespace, work: Path) -> Row:
    """Flink's exactly-once KafkaSink copying a topic, latency at ``--rate`` (bench/flink_kafka_copy.py
    in the PyFlink venv)."""
    source, output = new_topic(bootstrap, "flink-in"), new_topic(bootstrap, "flink-out")
    visible = Visible(bootstrap, output)
    ready, stop = work / f"flink-ready-{uuid.uuid4().hex[:6]}", work / f"flink-stop-{uuid.uuid4().hex[:6]}"
    command = [
        str(args.flink_python), str(Path(__file__).with_name("flink_kafka_copy.py")),
        "--bootstrap", bootstrap, "--source", source, "--sink", output, "--jar", str(flink_connector_jar()),
        "--interval-ms", str(args.interval_ms), "--ready", str(ready), "--stop", str(stop),
    ]  # fmt: skip
    log = (work / "flink.log").open("w")
    flink = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    producer = Producer(producer_config(bootstrap, {"linger.ms": 5}))
    try:
        while not ready.exists():
            if flink.poll() is not None:
                raise RuntimeError(f"the Flink job exited {flink.returncode}: see {work / 'flink.log'}")
            time.sleep(0.2)
        producer.produce(source, payload(args.size))
        visible.wait_for(1, timeout=300)  # its first checkpoint committed
        began = time.time_ns()
        count = paced(
            args.rate,
            args.seconds,
            lambda: producer.produce(source, payload(args.size)),
            lambda: producer.poll(0),
        )
        producer.flush(30)
        p50, p99 = latency_ms(visible.wait_for(count, began))
        stop.touch()
        flink.wait(120)
        return Row(
            "flink",
            FLINK_EXACTLY_ONCE,
            1,
            None,
            None,
            p50,
            p99,
            checkpoint_ms=flink_checkpoint_ms(work / "flink.log"),
        )
    finally:
        visible.close()
        if flink.poll() is None:
            os.killpg(flink.pid, 15)
            try:
                flink.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(flink.pid, 9)
        log.close()


def flink_checkpoint_ms(log: Path) -> float | None:
    """The median of the checkpoint durations the Flink job printed (``checkpoint_ms [..]``)."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("checkpoint_ms "):
            durations = json.loads(line.removeprefix("checkpoint_ms "))
            return float(statistics.median(durations)) if durations else None
    return None


# ---------------------------------------------------------------- the report


def _median(rows: list[Row], field: str) -> str:
    values = [getattr(r, field) for r in rows if getattr(r, field) is not None]
    return "" if not values else f"{statistics.median(values):,.{2 if 'cpu' in field else 0}f}"


def table(rows: list[Row], interval_ms: int) -> Table:
    """The medians of each way's rounds, and issue 49's latency bound: one checkpoint interval + 2x
    the checkpoint's duration."""
    out = Table(
        "section", "way", "records/s", "steady records/s", "committed records/s", "latency p50 ms",
        "latency p99 ms", "sending thread CPU µs/record", "client CPU µs/record", "broker CPU µs/record",
        "checkpoint ms", "latency target ms",
        "completion -> visible p50 / p99 ms", "rounds",
        title="medians of the rounds",
    )  # fmt: skip
    ways = list(dict.fromkeys((r.section, r.way) for r in rows))
    for section, way in ways:
        mine = [r for r in rows if (r.section, r.way) == (section, way)]
        fields = (
            "records_per_s", "steady_per_s", "committed_per_s", "latency_p50_ms", "latency_p99_ms",
            "sender_cpu_us", "client_cpu_us", "broker_cpu_us", "checkpoint_ms",
        )  # fmt: skip
        durations = [r.checkpoint_ms for r in mine if r.checkpoint_ms is not None]
        target = f"{interval_ms + 2 * statistics.median(durations):,.0f}" if durations else ""
        commit = " / ".join(_median(mine, f) for f in ("commit_p50_ms", "commit_p99_ms")).strip(" /")
        out.add_row(section, way, *(_median(mine, f) for f in fields), target, commit, str(len(mine)))
    return out


def ratio_lines(rows: list[Row]) -> list[str]:
    lines = []
    for section, base, ours in (
        ("participant", IDEMPOTENT, EXACTLY_ONCE),
        ("participant", IDEMPOTENT_BATCH, EXACTLY_ONCE_BATCH),
        ("spark", SPARK_KAFKA, SPARK_EXACTLY_ONCE),
        ("spark", SPARK_DRIVER, SPARK_EXACTLY_ONCE),
    ):
        pairs = [
            (a, b)
            for a in rows
            for b in rows
            if (a.section, a.way, b.section, b.way) == (section, ours, section, base) and a.round == b.round
        ]
        for field in ("records_per_s", "steady_per_s", "committed_per_s", "sender_cpu_us", "client_cpu_us"):
            by_round = [
                round(getattr(a, field) / getattr(b, field), 2) for a, b in pairs if getattr(b, field)
            ]
            target = " (throughput target >= 0.9)" if field.endswith("per_s") else ""
            if by_round:
                lines.append(f"{section}: {ours} / {base}, {field} by round {by_round}{target}")
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--batch", type=int, default=1000, help="records a call in the participant's batch rows (0: none)"
    )
    parser.add_argument("--spark", action="store_true", help="also the Spark sinks")
    parser.add_argument("--spark-records", type=int, default=1_000_000)
    parser.add_argument("--spark-rate", type=int, default=1000)
    parser.add_argument("--spark-per-trigger", type=int, default=20_000)
    parser.add_argument("--spark-rounds", type=int, default=1)
    parser.add_argument("--trigger-ms", type=int, default=200)
    parser.add_argument("--flink", action="store_true", help="also Flink's exactly-once KafkaSink")
    parser.add_argument("--flink-python", type=Path, default=Path("/tmp/cutline-flink-venv/bin/python"))
    parser.add_argument("--json", type=Path, help="write the rows here as JSON")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    console = Console(width=170)
    rows: list[Row] = []
    notes: list[str] = []
    with broker("kafka") as (bootstrap, what, pid), tempfile.TemporaryDirectory() as scratch:
        console.print(f"broker: {what}; load {os.getloadavg()}")
        with Progress(console=console) as progress:
            rows += participant_rows(bootstrap, pid, args, Path(scratch), progress)
            if args.spark:
                rows += spark_rows(bootstrap, args, Path(scratch) / "spark", progress)
            if args.flink:
                try:
                    rows.append(flink_row(bootstrap, args, Path(scratch)))
                    console.print(rows[-1])
                except RuntimeError as exc:
                    notes.append(f"Flink not measured: {exc}")
        console.print(f"load after: {os.getloadavg()}")
    console.print(table(rows, args.interval_ms))
    for line in ratio_lines(rows) + notes:
        console.print(line)
    if args.json:
        args.json.write_text(json.dumps({"rows": [asdict(r) for r in rows], "notes": notes}, indent=1))


if __name__ == "__main__":
    main()
