"""Recovery and failover of the coordinator's journal partitions (docs/design.md, "Performance targets").

    uv run python bench/bench_recovery.py [--quick] [--skip journal rebalances failover]
                                          [--rebalances 200] [--samples 5]
                                          [--sizes 1000 100000 1000000] [--workers 3] [--kills 5]
                                          [--kill worker|watchdog|all]

1. **Recovery time against the journal's length.** For journals of 1,000, 100,000 and 1,000,000
   events, each on a one-partition journal topic of a fresh embedded broker, a new owner claims
   the partition with ``coordinator.service.claims.claim_partition``, as a worker does when the
   group gives it the partition:

   - *with a snapshot*: the newest fold snapshot of the partition (written by the previous owner,
     ``Coordinator.snapshot`` + ``snapshot_message``), then the journal after it, then its claim.
     Each claim writes its own snapshot afterwards, as a worker does, so the next one reads only
     the claims since (the figure a failover pays);
   - *from the start, no snapshot* (``load_fold_snapshot=None``): reads and folds the whole journal.

   The journals repeat one simulated block of 1,000 events (``coordinator.simulation.traffic.simulate``, 4
   jobs), as ``tests/integration/test_recovery.py`` does: simulating and encoding a million
   events would take minutes, and the fold's cost per event does not depend on the mix. The first
   owner's snapshot is the in-memory fold of exactly those events (``Coordinator.recover``). The
   target: recovery flat in journal length (the test's criterion: 1M within 2× of 1,000).

2. **Failover.** ``--workers`` ``cutline coordinator`` processes (``CoordinatorProcess``) on one
   prefix, ``--jobs`` jobs of ``--tasks`` participant threads each (``bench_coordinator.Participants``),
   a checkpoint every ``--interval-ms``. Each of ``--kills`` rounds picks a job, waits until one of
   its checkpoints is pending, SIGKILLs the worker that owns it, and reads the journal partitions
   of the killed worker's jobs until each has a ``CheckpointCompleted`` written under a newer
   claim. Times run from the kill to the new owner's ``CoordinatorClaimed.timestamp_ms`` and to
   each job's first such ``CheckpointCompleted.timestamp_ms`` (same host's clock). ``--kill``
   chooses what is killed: ``worker`` (the default) SIGKILLs the worker process only, as the OOM
   killer or a crash would, and its watchdog tells the group at once
   (``coordinator.service.watchdog``); ``watchdog`` SIGKILLs the ``cutline coordinator`` process
   (its watchdog), whose worker then exits and has the group told; ``all`` SIGKILLs both, neither
   able to tell the group (``CoordinatorProcess.kill_all``): as when a machine is lost, the group
   notices only after the session timeout. A new worker
   then replaces the killed one, and the next round waits until every job has completed three
   more checkpoints. The target: checkpoints complete again within the session timeout + 2 s.

3. **Recovery after many rebalances** (``--skip rebalances`` leaves it out). Two
   one-partition journals on one fresh embedded broker, each with the same 20,000 simulated events
   and a snapshot of their fold, then 1 and ``--rebalances`` (200) rebalances as a worker does
   them: ``claim_partition(..., generation=g)``, g increasing, then the snapshot of its fold
   (``snapshot_message``), then 20 events under the claim's epoch. Every 5th claim is
   *interrupted*: no snapshot follows it. Then ``--samples`` fresh claims of each, alternated,
   each followed by its snapshot and 20 events as well (so the first sample after N = 200 is the
   only one to find an interrupted claim last). Shown: seconds, snapshot messages read, journal records
   folded; and what the reader before the redesign (ae876e0, keys ``<p>:<epoch>`` and
   ``<p>:claim``) would have read: the same snapshots and claim intents, written to a second
   snapshots topic under those keys, read whole, as it did (uncompacted: every message; distinct
   keys: what full compaction would leave), and whether its rule (an intent newer than the newest
   snapshot) would have folded the journal from offset 0. The target: after 200 within 1.2× of
   after 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from pathlib import Path
from random import Random

from confluent_kafka import Consumer, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

from bench.bench_coordinator import Participants, Tail, broker, journal_partition, make_topics
from bench.cpu import code_checked, machine_line
from coordinator.core.state import state_json
from coordinator.service.app import Settings
from coordinator.service.claims import ClaimedPartition, claim_partition, snapshot_message
from coordinator.service.runtime import Coordinator
from coordinator.service.supervisor import CoordinatorProcess
from coordinator.simulation.traffic import simulate
from events.dev.broker import EmbeddedBroker, create_topics
from events.kafka.clients import consumer_config, job_key, producer_config
from events.kafka.log import read_to_end
from events.task.participant import JobDriver
from events.wire.codec import decode, encode
from events.wire.fencing import epoch_header, epoch_of
from events.wire.records import (
    CheckpointCompleted,
    CheckpointConfig,
    CoordinatorClaimed,
    JobStatus,
    JournalEvent,
)
from events.wire.topics import Topics

COMMAND = "uv run python bench/bench_recovery.py"
TOPICS = Topics("recovery.")
SNAPSHOTS = TOPICS.snapshots
FLAT_RATIO = 2.0
"""Recovery of the longest journal within this factor of the shortest (tests/integration/test_recovery.py)."""
SESSION_TIMEOUT = Settings.session_timeout
SECTIONS = ("journal", "rebalances", "failover")
MARGIN_S = 2.0
"""The target (docs/design.md, "Performance targets"): checkpoints complete again within session timeout +
2 s."""


def load() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def seconds_stats(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.3f} s (max {max(values):.3f})" if values else "-"


# ---------------------------------------------------- 1. recovery against length


@dataclass
class LengthResult:
    events: int
    produce_s: float
    snapshot_bytes: int
    with_snapshot: list[float] = field(default_factory=list)
    read_with_snapshot: int = 0
    full_fold: list[float] = field(default_factory=list)
    read_full: int = 0
    same_state: bool | None = None
    """The full fold's jobs equal the snapshot claim's (None: no full fold)."""
    load_at_start: str = ""


def produce_frames(bootstrap: str, frames: list[tuple[bytes, bytes]], repeat: int) -> None:
    producer = Producer(producer_config(bootstrap, {"linger.ms": 50, "batch.num.messages": 10_000}))
    for _ in range(repeat):
        for key, value in frames:
            while True:
                try:
                    producer.produce(TOPICS.checkpoints, key=key, value=value, partition=0)
                    break
                except BufferError:
                    producer.poll(0.05)
    if producer.flush(300):
        raise RuntimeError("the journal was not written within 300 s")


def write_snapshot(bootstrap: str, holder: Coordinator, epoch: int, journal_offset: int) -> int:
    """Write ``holder``'s fold of partition 0 as its owner does after a claim; the value's size."""
    key, value, headers = snapshot_message(holder.snapshot(0, epoch, journal_offset, 0), 1)
    producer = Producer(producer_config(bootstrap))
    producer.produce(SNAPSHOTS, key=key, value=value, headers=headers, partition=0)
    if producer.flush(30):
        raise RuntimeError("the snapshot was not written within 30 s")
    return len(value)


def jobs_json(claimed: ClaimedPartition) -> dict[str, str]:
    return {job: state_json(state) for job, state in claimed.coordinator.states.items()}


def bench_length(
    size: int, block: list[JournalEvent], runs: int, full_runs: int, console: Console
) -> LengthResult:
    frames = [(job_key(e.job_id), encode(e)) for e in block]
    repeat = size // len(frames)
    at_start = load()
    with EmbeddedBroker() as embedded:
        bootstrap = embedded.bootstrap
        create_topics(bootstrap, [TOPICS.checkpoints, SNAPSHOTS], partitions=1)
        started = time.monotonic()
        produce_frames(bootstrap, frames, repeat)
        produced = time.monotonic() - started
        first = Coordinator(TOPICS, partitions=1)
        for _ in range(repeat):
            first.recover((event, None) for event in block)
        result = LengthResult(size, produced, write_snapshot(bootstrap, first, 0, size - 1))
        result.load_at_start = at_start
        console.print(f"  {size:,} events written in {produced:.1f} s; snapshot {result.snapshot_bytes:,} B")
        last: ClaimedPartition | None = None
        for i in range(runs):
            last = claim_partition(bootstrap, TOPICS, SNAPSHOTS, 1, 0, f"worker-s{i}")
            write_snapshot(bootstrap, last.coordinator, last.epoch, last.claim_offset)
            result.with_snapshot.append(last.seconds)
            result.read_with_snapshot = max(result.read_with_snapshot, last.folded)
        console.print(f"  with a snapshot: {seconds_stats(result.with_snapshot)}, {runs} claims")
        # Claims without a snapshot last: they write no snapshot after their claims (the snapshot
        # claims above would each fold them, as after an interrupted claim).
        for i in range(full_runs):
            full = claim_partition(
                bootstrap, TOPICS, SNAPSHOTS, 1, 0, f"worker-f{i}", load_fold_snapshot=None
            )
            result.full_fold.append(full.seconds)
            result.read_full = max(result.read_full, full.folded)
            if last is not None and result.same_state is None:
                result.same_state = jobs_json(full) == jobs_json(last)
        if full_runs:
            console.print(f"  from the start: {seconds_stats(result.full_fold)}, {full_runs} claims")
    return result


def length_table(results: list[LengthResult]) -> Table:
    table = Table(
        title="1. Recovery of one journal partition (a new owner's claim_partition), wall seconds",
        title_justify="left",
    )
    columns = (
        "journal events",
        "load 1/5/15 at start",
        "with snapshot: median",
        "max",
        "records read",
        "ratio to the first",
        "every claim",
        "from the start: median",
        "max",
        "records read",
        "events/s",
        "same jobs",
    )
    for col in columns:
        table.add_column(col, justify="left" if col in ("load 1/5/15 at start", "every claim") else "right")
    base = statistics.median(results[0].with_snapshot) if results else float("nan")
    for r in results:
        snap = statistics.median(r.with_snapshot)
        full = statistics.median(r.full_fold) if r.full_fold else None
        table.add_row(
            f"{r.events:,}",
            r.load_at_start,
            f"{snap:.3f}",
            f"{max(r.with_snapshot):.3f}",
            f"{r.read_with_snapshot}",
            f"{snap / base:.2f}×",
            " ".join(f"{v:.3f}" for v in r.with_snapshot),
            f"{full:.2f}" if full is not None else "not run",
            f"{max(r.full_fold):.2f}" if r.full_fold else "",
            f"{r.read_full:,}" if r.full_fold else "",
            f"{r.read_full / full:,.0f}" if full else "",
            {None: "", True: "yes", False: "[bold red]NO[/]"}[r.same_state],
        )
    return table


# ------------------------------------------------- 3. recovery after many rebalances


REBALANCE_RATIO = 1.2
"""Recovery after ``--rebalances`` rebalances within this factor of after one (the issue's target)."""
HISTORY_EVENTS = 20_000
EVENTS_PER_REBALANCE = 20
INTERRUPTED_EVERY = 5


@dataclass
class RebalanceHistory:
    """One journal partition with a history and ``rebalances`` claims on it, on its own topics."""

    rebalances: int
    topics: Topics
    snapshots: str
    old_snapshots: str
    """The snapshot messages the design before ae876e0 would have written, keyed as it keyed them."""
    generation: int = 0
    interrupted: int = 0
    snapshot_bytes: list[int] = field(default_factory=list)
    """Size of the snapshot each sample read (the last one written before it)."""
    build_s: float = 0.0
    samples: list[ClaimedPartition] = field(default_factory=list)
    old_read: list[int] = field(default_factory=list)
    """Messages of ``old_snapshots`` read (all of them, as its reader did) before each sample."""
    old_read_s: list[float] = field(default_factory=list)
    old_keys: int = 0
    old_from_zero: list[bool] = field(default_factory=list)
    """Whether the old reader would have folded the journal from offset 0 (a claim intent newer
    than the newest snapshot)."""
    journal_end: list[int] = field(default_factory=list)
    last_snapshot_bytes: int = 0
    events: Iterator[JournalEvent] = field(default_factory=lambda: simulate(Random(7), jobs=4))
    """The journal's events: the same simulation for every N."""


class RebalanceWriter:
    """Writes journal events, snapshots and the old design's keys, waiting for each batch."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(producer_config(bootstrap, {"linger.ms": 5}))

    def journal(self, topic: str, events: Sequence[JournalEvent], epoch: int | None) -> None:
        headers = [] if epoch is None else [epoch_header(epoch)]
        for event in events:
            while True:
                try:
                    self.producer.produce(
                        topic, key=job_key(event.job_id), value=encode(event), partition=0, headers=headers
                    )
                    break
                except BufferError:
                    self.producer.poll(0.05)
        self.flush()

    def snapshot(self, h: RebalanceHistory, holder: Coordinator, epoch: int, journal_offset: int) -> None:
        key, value, headers = snapshot_message(holder.snapshot(0, epoch, journal_offset, 0), 1)
        h.last_snapshot_bytes = len(value)
        self.producer.produce(h.snapshots, key=key, value=value, headers=headers, partition=0)
        # the design before: one key per partition and epoch
        self.producer.produce(h.old_snapshots, key=b"0:%d" % epoch, value=value, headers=headers, partition=0)
        self.flush()

    def old_intent(self, h: RebalanceHistory, epoch: int) -> None:
        """The claim intent the design before wrote to the snapshots topic before each claim."""
        self.producer.produce(h.old_snapshots, key=b"0:claim", value=b"%d" % epoch, partition=0)
        self.flush()

    def flush(self) -> None:
        if self.producer.flush(60):
            raise RuntimeError("not written within 60 s")


def old_reader(bootstrap: str, h: RebalanceHistory) -> tuple[int, float, int, bool]:
    """What the reader before the redesign (ae876e0, ``read_snapshots``) read: every message of the
    partition's snapshots, for the highest-epoch snapshot and the highest claim intent. Returns the
    messages read, the seconds, the distinct keys (what full compaction would leave) and whether it
    would have folded from offset 0 (an intent newer than the newest snapshot)."""
    started = time.monotonic()
    read, best, intent = 0, -1, 0
    keys: set[bytes | None] = set()
    for m in read_to_end(bootstrap, h.old_snapshots, [0], timeout=30):
        read += 1
        keys.add(m.key)
        if m.key == b"0:claim" and m.value is not None:
            intent = max(intent, int(m.value))
        else:
            best = max(best, epoch_of(m.headers))
    return read, time.monotonic() - started, len(keys), intent > best


def build_history(bootstrap: str, writer: RebalanceWriter, h: RebalanceHistory) -> None:
    """The history, its snapshot, then ``h.rebalances`` rebalances as a worker does them."""
    started = time.monotonic()
    create_topics(bootstrap, [h.topics.checkpoints, h.snapshots, h.old_snapshots], partitions=1)
    history = list(islice(h.events, HISTORY_EVENTS))
    writer.journal(h.topics.checkpoints, history, None)
    first = Coordinator(h.topics, partitions=1)
    first.recover((event, None) for event in history)
    writer.snapshot(h, first, 0, HISTORY_EVENTS - 1)
    for n in range(1, h.rebalances + 1):
        h.generation += 1
        writer.old_intent(h, h.generation)  # epochs follow generations here: no claim is ever lost
        claimed = claim_partition(
            bootstrap, h.topics, h.snapshots, 1, 0, f"worker-r{n}", generation=h.generation
        )
        assert claimed.epoch == h.generation, (claimed.epoch, h.generation)
        if n % INTERRUPTED_EVERY:
            writer.snapshot(h, claimed.coordinator, claimed.epoch, claimed.claim_offset)
        else:
            h.interrupted += 1  # the worker lost the partition again before its first snapshot
        writer.journal(h.topics.checkpoints, list(islice(h.events, EVENTS_PER_REBALANCE)), claimed.epoch)
    h.build_s = time.monotonic() - started


def measure_recovery(bootstrap: str, writer: RebalanceWriter, h: RebalanceHistory) -> ClaimedPartition:
    """A fresh owner's claim (timed), then, as the rebalances before it, its snapshot and
    ``EVENTS_PER_REBALANCE`` events: the next sample finds the partition as this one did, but
    for the interrupted claim that may have come last."""
    read, seconds, keys, from_zero = old_reader(bootstrap, h)
    h.old_read.append(read)
    h.old_read_s.append(seconds)
    h.old_keys, h.old_from_zero = keys, [*h.old_from_zero, from_zero]
    h.generation += 1
    writer.old_intent(h, h.generation)
    h.journal_end.append(end_offsets(bootstrap, h.topics.checkpoints, {0})[0])
    h.snapshot_bytes.append(h.last_snapshot_bytes)
    claimed = claim_partition(
        bootstrap, h.topics, h.snapshots, 1, 0, f"worker-m{len(h.samples)}", generation=h.generation
    )
    h.samples.append(claimed)
    writer.snapshot(h, claimed.coordinator, claimed.epoch, claimed.claim_offset)
    writer.journal(h.topics.checkpoints, list(islice(h.events, EVENTS_PER_REBALANCE)), claimed.epoch)
    return claimed


def bench_rebalances(counts: Sequence[int], samples: int, console: Console) -> list[RebalanceHistory]:
    with EmbeddedBroker() as embedded:
        bootstrap = embedded.bootstrap
        writer = RebalanceWriter(bootstrap)
        histories = []
        for n in counts:
            topics = Topics(f"rebalances-{n}.")
            h = RebalanceHistory(n, topics, topics.snapshots, f"{topics.prefix}old-snapshots")
            build_history(bootstrap, writer, h)
            console.print(
                f"  {HISTORY_EVENTS:,} events, a snapshot and {n} rebalances ({h.interrupted} interrupted) "
                f"written in {h.build_s:.1f} s, load {load()}"
            )
            histories.append(h)
        for i in range(samples):
            for h in histories if i % 2 == 0 else histories[::-1]:  # alternated: A B, B A, ...
                c = measure_recovery(bootstrap, writer, h)
                console.print(
                    f"  after {h.rebalances} rebalances, sample {i + 1}: {c.seconds * 1000:.1f} ms, "
                    f"{c.snapshots_read} snapshot messages read, {c.folded} journal records folded"
                )
    return histories


def rebalance_table(histories: list[RebalanceHistory]) -> Table:
    table = Table(
        title="3. Recovery of one journal partition after N rebalances (a fresh claim_partition): "
        f"{HISTORY_EVENTS:,} events, then N claims (every {INTERRUPTED_EVERY}th interrupted: no snapshot "
        f"after it), {EVENTS_PER_REBALANCE} events after each",
        title_justify="left",
    )
    columns = ("N", "ms: median", "min–max", "every sample", "ratio to the first", "snapshot bytes",
               "snapshot msgs read", "journal records folded", "old design: snapshot msgs read",
               "distinct keys", "old: read them (ms)", "old: fold from offset 0")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col == "every sample" else "right")
    base = statistics.median(c.seconds for c in histories[0].samples)
    for h in histories:
        ms = [c.seconds * 1000 for c in h.samples]
        zero = [end for end, z in zip(h.journal_end, h.old_from_zero, strict=True) if z]
        table.add_row(
            f"{h.rebalances}",
            f"{statistics.median(ms):.1f}",
            f"{min(ms):.1f}–{max(ms):.1f}",
            " ".join(f"{v:.1f}" for v in ms) if len(ms) <= 6 else f"{len(ms)} samples",
            f"{statistics.median(ms) / 1000 / base:.2f}×",
            span(h.snapshot_bytes),
            span(c.snapshots_read for c in h.samples),
            span(c.folded for c in h.samples),
            span(h.old_read),
            f"{h.old_keys}",
            f"{statistics.median(h.old_read_s) * 1000:.1f}",
            f"{len(zero)} of {len(h.samples)} ({span(zero)} records)" if zero else "no",
        )
    return table


def span(values: Iterable[int]) -> str:
    ordered = sorted(values)
    return f"{ordered[0]:,}" if ordered[0] == ordered[-1] else f"{ordered[0]:,}–{ordered[-1]:,}"


# ------------------------------------------------------------- 2. failover


@dataclass
class Kill:
    job: str
    victim_pid: int
    victim_jobs: list[str]
    claim_s: float
    """Kill → the first new claim of the killed job's partition (CoordinatorClaimed.timestamp_ms)."""
    job_s: float
    """Kill → the killed job's first checkpoint completed under the new claim."""
    all_s: float
    """Kill → every job of the killed worker completed one under a newer claim."""
    load_at_kill: str
    killed_at: str
    """Wall-clock time of the kill (to find it in the workers' logs)."""
    trail: list[str]
    slowest: tuple[str, list[str]] | None = None
    """When another of the killed worker's jobs completed again last: that job and its records under
    the new claim (as ``trail``), to see where its time went."""
    """The killed job's journal records under the new claim, up to its first completion (s after the kill)."""


class Cluster:
    """Coordinator workers, jobs of participant threads and a tail of every job's journal."""

    def __init__(self, bootstrap: str, args: argparse.Namespace, scratch: Path) -> None:
        self.bootstrap, self.scratch, self.loglevel = bootstrap, scratch, args.worker_loglevel
        self.session_timeout: float = args.session_timeout
        self.topics = make_topics(bootstrap, "failover")
        self.jobs = [f"job-{i}" for i in range(args.jobs)]
        self.workers: list[CoordinatorProcess] = []
        self._spawned = 0
        self.start_workers(args.workers)
        self.participants = [
            Participants(bootstrap, self.topics, job, args.tasks, "thread") for job in self.jobs
        ]
        self.drivers = [JobDriver(bootstrap, job, self.topics) for job in self.jobs]
        self.tails = {job: Tail(bootstrap, self.topics.checkpoints, job) for job in self.jobs}
        config = CheckpointConfig(
            interval_ms=args.interval_ms,
            location=f"file://{scratch}/checkpoints",
            timeout_ms=args.timeout_ms,
            tolerable_failures=1_000_000,
        )
        for driver, participants in zip(self.drivers, self.participants, strict=True):
            driver.running(participants.task_ids, config, attempt=1)

    def start_workers(self, count: int) -> None:
        new = []
        for _ in range(count):
            self._spawned += 1
            log = self.scratch / f"worker-{self._spawned}" / "coordinator.log"
            extra = ("--loglevel", self.loglevel, "--session-timeout", str(self.session_timeout))
            new.append(CoordinatorProcess(self.bootstrap, self.topics.prefix, log_path=log, extra_args=extra))
        threads = [threading.Thread(target=w.start, kwargs={"timeout": 180}) for w in new]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for w in new:
            w.wait_ready(1)  # raises if a start failed
        self.workers.extend(new)

    def completed(self) -> dict[str, int]:
        return {job: tail.counts["CheckpointCompleted"] for job, tail in self.tails.items()}

    def wait_completions(self, more: int, timeout: float) -> None:
        """Until every job has completed ``more`` checkpoints more than now."""
        base = self.completed()
        for job, tail in self.tails.items():
            tail.wait("CheckpointCompleted", base[job] + more, timeout=timeout)

    def owner_of(self, job: str, timeout: float = 30) -> tuple[CoordinatorProcess, list[str]]:
        """The live worker whose views hold ``job``, and every job it holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for worker in self.workers:
                try:
                    held = [j["id"] for j in worker.get("/jobs?local=1")["jobs"]]
                except OSError:
                    continue
                if job in held:
                    return worker, held
            time.sleep(0.1)
        raise TimeoutError(f"no worker holds {job}")

    def close(self) -> None:
        for driver in self.drivers:
            driver.status(JobStatus.FINISHED)
            driver.close()
        for participants in self.participants:
            participants.close()
        for tail in self.tails.values():
            tail.close()
        for worker in self.workers:
            worker.stop()


def end_offsets(bootstrap: str, topic: str, partitions: set[int]) -> dict[int, int]:
    consumer = Consumer(consumer_config(bootstrap))
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions
        }
    finally:
        consumer.close()


def kill_one(cluster: Cluster, job: str, timeout: float, what: str = "worker") -> Kill:
    victim, held = cluster.owner_of(job)
    deadline = time.monotonic() + 10
    while not victim.get(f"/jobs/{job}/state").get("pending") and time.monotonic() < deadline:
        time.sleep(0.005)  # kill it while a checkpoint of the job is pending
    partitions = {journal_partition(j) for j in held}
    start = end_offsets(cluster.bootstrap, cluster.topics.checkpoints, partitions)
    at_kill = load()
    pid = victim.worker_pid  # the worker's claims name its pid
    assert pid is not None
    killed_ms = time.time_ns() / 1e6
    killed_at = datetime.fromtimestamp(killed_ms / 1000).strftime("%H:%M:%S.%f")[:-3]
    if what == "worker":
        victim.kill_worker()
    elif what == "watchdog":
        victim.kill()
    else:
        victim.kill_all()
    cluster.workers.remove(victim)
    claimed: dict[int, tuple[int, float]] = {}  # partition -> (new epoch, ms after the kill)
    again: dict[str, float] = {}  # job -> ms after the kill
    trails: dict[str, dict[int, str]] = {j: {} for j in held}  # job -> offset -> its records under
    # the new claim, up to it completing again
    ends = time.monotonic() + timeout
    while len(again) < len(held):
        if time.monotonic() > ends:
            raise TimeoutError(f"after {timeout:g} s only {sorted(again)} of {held} completed again")
        time.sleep(0.2)
        for p in partitions:
            for m in read_to_end(cluster.bootstrap, cluster.topics.checkpoints, [p], start=start[p]):
                record = decode(m.value) if m.value else None
                if isinstance(record, CoordinatorClaimed):
                    if p not in claimed and f"-{pid}-" not in record.worker_id:
                        claimed[p] = (record.epoch, record.timestamp_ms - killed_ms)
                    continue
                owner = getattr(record, "job_id", None)
                if (
                    p in claimed
                    and owner in trails
                    and owner not in again
                    and epoch_of(m.headers) >= claimed[p][0]
                ):
                    at = (getattr(record, "timestamp_ms", m.timestamp_ms) - killed_ms) / 1000
                    number = getattr(record, "checkpoint_id", "")
                    trails[owner][m.offset] = f"{type(record).__name__} {number} +{at:.2f}".replace("  ", " ")
                if (
                    isinstance(record, CheckpointCompleted)
                    and record.job_id in held
                    and record.job_id not in again
                    and p in claimed
                    and epoch_of(m.headers) >= claimed[p][0]
                ):
                    again[record.job_id] = record.timestamp_ms - killed_ms
    last = max(again, key=again.__getitem__)
    return Kill(
        job=job,
        victim_pid=pid,
        victim_jobs=held,
        claim_s=claimed[journal_partition(job)][1] / 1000,
        job_s=again[job] / 1000,
        all_s=max(again.values()) / 1000,
        load_at_kill=at_kill,
        killed_at=killed_at,
        trail=[trails[job][offset] for offset in sorted(trails[job])],
        slowest=None if last == job else (last, [trails[last][offset] for offset in sorted(trails[last])]),
    )


KILLED = {
    "worker": "its worker process (the watchdog tells the group)",
    "watchdog": "its watchdog (the worker exits and has the group told)",
    "all": "it and its watchdog, neither telling the group",
}


def failover_table(
    kills: list[Kill], workers: int, session_timeout: float = SESSION_TIMEOUT, what: str = "worker"
) -> Table:
    target = session_timeout + MARGIN_S
    table = Table(
        title=f"2. Failover: SIGKILL of a job's owner ({KILLED[what]}) among {workers} workers, seconds "
        f"after the kill (session timeout {session_timeout:g} s)",
        title_justify="left",
    )
    for col in ("round", "killed job", "worker's jobs", "load 1/5/15 at kill", "→ new claim",
                "→ job completes again", "→ all its jobs", f"target ≤ {target:g} s", ""):  # fmt: skip
        table.add_column(col, justify="left" if col in ("killed job", "load 1/5/15 at kill", "") else "right")
    for i, k in enumerate(kills, 1):
        table.add_row(
            f"{i}",
            k.job,
            f"{len(k.victim_jobs)}",
            k.load_at_kill,
            f"{k.claim_s:.2f}",
            f"{k.job_s:.2f}",
            f"{k.all_s:.2f}",
            "",
            "met" if k.all_s <= target else "[bold red]missed[/]",
        )
    table.add_section()
    for name, pick in (("median", statistics.median), ("max", max)):
        all_s = pick([k.all_s for k in kills])
        table.add_row(
            name,
            "",
            "",
            "",
            f"{pick([k.claim_s for k in kills]):.2f}",
            f"{pick([k.job_s for k in kills]):.2f}",
            f"{all_s:.2f}",
            f"{target:g}",
            "met" if all_s <= target else "[bold red]missed[/]",
        )
    return table


def bench_failover(args: argparse.Namespace, console: Console) -> list[Kill]:
    kills: list[Kill] = []
    with tempfile.TemporaryDirectory(prefix="cutline-failover-") as tmp, broker() as (bootstrap, what, _):
        console.print(f"broker: {what} at {bootstrap}; starting {args.workers} workers, load {load()}")
        started = time.monotonic()
        scratch = Path(args.logs) if args.logs else Path(tmp)
        cluster = Cluster(bootstrap, args, scratch)
        try:
            console.print(
                f"  {args.workers} workers ready in {time.monotonic() - started:.0f} s; "
                f"{args.jobs} jobs × {args.tasks} participants, a checkpoint every {args.interval_ms} ms"
            )
            cluster.wait_completions(3, timeout=120)
            for i in range(args.kills):
                job = cluster.jobs[i % len(cluster.jobs)]
                kill = kill_one(cluster, job, timeout=120, what=args.kill)
                kills.append(kill)
                console.print(
                    f"  round {i + 1}: at {kill.killed_at} killed pid {kill.victim_pid} (owner of {job}, "
                    f"holding {len(kill.victim_jobs)} jobs): claim after {kill.claim_s:.2f} s, {job} "
                    f"completed again after {kill.job_s:.2f} s, all its jobs after {kill.all_s:.2f} s"
                )
                console.print(f"    {job} under the new claim: " + ", ".join(kill.trail))
                if kill.slowest is not None and kill.all_s > kill.job_s + 1:
                    console.print(f"    {kill.slowest[0]}, the last: " + ", ".join(kill.slowest[1]))
                if i + 1 < args.kills:
                    cluster.start_workers(1)  # the replacement; the group rebalances onto it
                    time.sleep(args.settle)
                    cluster.wait_completions(3, timeout=120)
        finally:
            cluster.close()
    return kills


# ------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument(
        "--skip", nargs="+", default=[], choices=SECTIONS, help="leave parts out: journal rebalances failover"
    )
    parser.add_argument("--sizes", type=int, nargs="+", help="journal lengths (1000 100000 1000000)")
    parser.add_argument("--runs", type=int, default=5, help="claims with a snapshot per length")
    parser.add_argument("--full-runs", type=int, default=3, help="claims from the start per length")
    parser.add_argument(
        "--full-max", type=int, default=1_000_000, help="longest journal also folded from the start"
    )
    parser.add_argument(
        "--rebalances", type=int, default=200, help="rebalances before the recovery compared with after one"
    )
    parser.add_argument("--samples", type=int, default=5, help="recoveries measured after 1 and after N each")
    parser.add_argument("--workers", type=int, default=3, help="coordinator worker processes (3)")
    parser.add_argument(
        "--session-timeout",
        type=float,
        default=SESSION_TIMEOUT,
        help=f"the workers' --session-timeout in seconds ({SESSION_TIMEOUT:g}, the default)",
    )
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--tasks", type=int, default=3, help="participants per job")
    parser.add_argument("--interval-ms", type=int, default=200, help="checkpoint interval")
    parser.add_argument("--timeout-ms", type=int, default=4_000, help="checkpoint timeout")
    parser.add_argument("--kills", type=int, help="failover rounds (5; quick 2)")
    parser.add_argument(
        "--kill",
        choices=tuple(KILLED),
        default="worker",
        help="SIGKILL the owner's worker process (its watchdog tells the group), its watchdog (the "
        "worker has the group told), or both (nobody tells the group)",
    )
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds after a replacement joins before the next round"
    )
    parser.add_argument("--worker-loglevel", default="warning", help="--loglevel of the workers")
    parser.add_argument("--logs", metavar="DIR", help="keep the workers' logs in DIR (default: a temp dir)")
    args = parser.parse_args()
    sizes = args.sizes or ([1_000, 100_000] if args.quick else [1_000, 100_000, 1_000_000])
    args.kills = args.kills or (2 if args.quick else 5)
    if args.quick:
        args.runs, args.full_runs = min(args.runs, 3), min(args.full_runs, 1)

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=180)
    console.print(
        f"[bold]{COMMAND}[/]{' --quick' if args.quick else ''}: {machine_line()}, "
        f"code from {code_checked()}, load average {load()} at start"
    )
    started = time.monotonic()
    lengths: list[LengthResult] = []
    kills: list[Kill] = []
    if "journal" not in args.skip:
        block = list(islice(simulate(Random(5), jobs=4), 1_000))
        for size in sizes:
            console.print(f"[bold]journal of {size:,} events[/], load {load()}")
            full_runs = args.full_runs if size <= args.full_max else 0
            lengths.append(bench_length(size, block, args.runs, full_runs, console))
    histories: list[RebalanceHistory] = []
    if "rebalances" not in args.skip:
        console.print(f"[bold]recovery after 1 and after {args.rebalances} rebalances[/], load {load()}")
        histories = bench_rebalances([1, args.rebalances], args.samples, console)
    if "failover" not in args.skip:
        console.print(f"[bold]failover[/], {args.workers} workers, {args.kills} kills ({KILLED[args.kill]})")
        kills = bench_failover(args, console)
    if lengths:
        console.print(length_table(lengths))
        base, top = lengths[0], lengths[-1]
        ratio = statistics.median(top.with_snapshot) / statistics.median(base.with_snapshot)
        console.print(
            f"recovery with a snapshot, {top.events:,} against {base.events:,} events: {ratio:.2f}× "
            f"(flat: ≤ {FLAT_RATIO:g}×) " + ("met" if ratio <= FLAT_RATIO else "[bold red]missed[/]")
        )
    if histories:
        console.print(rebalance_table(histories))
        one, many = (statistics.median(c.seconds for c in h.samples) for h in (histories[0], histories[-1]))
        verdict = "met" if many / one <= REBALANCE_RATIO else "[bold red]missed[/]"
        console.print(
            f"recovery after {histories[-1].rebalances} rebalances against after 1: {many / one:.2f}× "
            f"(target ≤ {REBALANCE_RATIO:g}×) {verdict}"
        )
    if kills:
        console.print(failover_table(kills, args.workers, args.session_timeout, args.kill))
    console.print(f"total {time.monotonic() - started:.0f} s, load average {load()} at the end")


if __name__ == "__main__":
    main()
