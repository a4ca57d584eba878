"""How checkpoint latency grows with load, on the embedded Tansu and on Apache Kafka, next to Flink's
MiniCluster, in one run (issue 47, "Side by side"; docs/benchmarks.md, "Latency under load").

    uv run python bench/bench_load.py [--brokers tansu kafka] [--jobs 1 4 16 64]
                                      [--participants 2 8 32] [--modes thread shared]
                                      [--storage files inline]
                                      [--checkpoints 20] [--interval-ms 500]
                                      [--flink-parallelism 32] [--flink-python PATH] [--json OUT]

For each broker (started for its part, one ``cutline coordinator`` worker on it, as a user runs it):

- **jobs per worker**: ``J`` jobs at once (1, 4, 16, 64), each of two participants that share one
  feed and one producer (each job as its own process would have them), every job checkpointing
  every ``--interval-ms``. After each job's first ``--warmup`` checkpoints, its next
  ``--checkpoints`` are measured (more where a row would have fewer than ``--min-samples`` in all:
  a p99 of fewer than 100 is the maximum), and the jobs' are pooled;
- **participants per job**: one job of ``P`` participants (2, 8, 32), each with a feed and a
  producer of its own (``thread``), then all sharing one (``shared``); ``--modes process`` adds a
  row of one process each, as tasks on separate machines (or processes) run.

Every participant is a thread of this process (bench.bench_coordinator.Participants: a 1 KiB
snapshot each), or with ``process`` a process of its own (its CPU counted as the participants').
``--storage`` chooses where the participants' snapshots go, per row of participants: an fsynced file
each (``files``), or inline in the ack (``inline``: the job's ``inline_threshold_bytes`` is 20 KiB,
Flink's default memory threshold, below which Flink keeps each subtask's state in the checkpoint's
metadata instead of a file, as the anchor's Flink job does); the rows of jobs use files.

Latency is ``CheckpointCompleted.duration_ms`` (trigger → completed, the coordinator's clock), read
from the journal as it is written. Each row shows where
the machine's CPU went meanwhile, in % of one core: the coordinator worker, the broker, this
process (the participants and their feeds) and every other process of the machine (other work).

Then Flink 2.3's MiniCluster at ``--flink-parallelism`` (32) with the same interval, warm-up and
number of checkpoints as a row of one job (``bench/bench_vs_flink.py``'s anchor, in its scratch
venv). The targets on Apache Kafka: p99 at 16 jobs within 2x of 1 job; 32 participants at or
below Flink at parallelism 32 (p50 and p99), both judged in this run. A failed or missing Flink
anchor leaves the cutline rows standing, its row saying why.

``--fetch-wait-ms`` sets the ``fetch.wait.max.ms`` of the coordinator's and the participants'
consumers (``CUTLINE_FETCH_WAIT_MS``) and of the shared feeds: cutline's defaults (2-5 ms) are made
for the embedded broker, which answers a waiting fetch only after half its wait; Apache Kafka answers
as soon as records arrive, so there a long wait costs no latency and each idle consumer stops
sending the broker hundreds of fetches a second.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from rich.console import Console
from rich.table import Table

from bench.bench_coordinator import (
    BROKERS,
    Meter,
    Participants,
    TaskTrace,
    broker,
    journal_partition,
    make_topics,
    percentile,
)
from bench.bench_vs_flink import (
    ANCHOR,
    STORAGE,
    FlinkResult,
    FlinkUnavailable,
    flink_python,
    run_flink,
)
from bench.cpu import code_checked, machine_line
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import partition_counts
from events.kafka.clients import consume_available, consumer_config, job_key
from events.kafka.log import read_to_end
from events.task.participant import JobDriver
from events.wire.codec import decode, default_codec
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointTriggered,
    JobStatus,
    TaskAcknowledged,
)
from events.wire.topics import Topics

COMMAND = "uv run python bench/bench_load.py"
JOBS_RATIO_TARGET = 2.0
"""p99 at 16 jobs on one worker within this many times the p99 of 1 job (on Apache Kafka)."""
MODES = {"thread": "a feed each", "shared": "one shared feed", "process": "a process each"}
COMPLETED = CheckpointCompleted.__name__


def load() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


@dataclass(frozen=True)
class LoadRow:
    broker: str
    dimension: str
    """``jobs`` (jobs per worker, two participants each, sharing a feed) or ``participants`` (of one
    job)."""
    size: int
    mode: str
    durations: list[int]
    """``--checkpoints`` per job after its warm-up, every job's pooled."""
    cpu: dict[str, float]
    """CPU seconds over the row: coordinator, broker, bench (this process: the participants),
    other processes, and the row's wall time."""
    load_at_start: tuple[float, float, float]
    complete: bool = True
    """False when a job did not reach its checkpoints before the row's deadline (its rows are short)."""
    completed: int = 0
    """Checkpoints completed over the row, warm-up included: what its CPU seconds paid for."""
    stages: dict[str, list[float]] = field(default_factory=dict)
    """``--stages``: per measured checkpoint of a one-job row, ms after the trigger was decided at
    which each step of :data:`STAGES` happened (its first and last participant)."""
    storage: str = "files"
    """Where the participants' snapshots go: a key of :data:`bench.bench_vs_flink.STORAGE`."""

    @property
    def way(self) -> str:
        """The participants' mode and, beside files, their storage: the table's ``mode`` column."""
        return MODES[self.mode] + ("" if self.storage == "files" else f", {self.storage}")

    @property
    def p50(self) -> float:
        return percentile(self.durations, 50)

    @property
    def p99(self) -> float:
        return percentile(self.durations, 99)

    def share(self, name: str) -> float:
        """CPU of ``name`` in % of one core over the row."""
        return 100 * self.cpu.get(name, 0.0) / max(self.cpu.get("wall", 1.0), 1e-9)

    def per_checkpoint(self, name: str) -> float:
        """CPU ms of ``name`` per checkpoint completed over the row (the machine's load does not change
        it much, unlike the latency)."""
        return 1000 * self.cpu.get(name, 0.0) / max(self.completed, 1)


# ------------------------------------------------------------------ journal


class Completions:
    """Every ``CheckpointCompleted`` of ``jobs`` in the journal, read as it is written, in a thread.

    Only the completions of the jobs are decoded (named by their frames' fingerprints), so the tail costs
    the participants' process little while the row runs: decoding every record of the jobs' journal (32
    ``TaskAcknowledged`` a checkpoint at 32 participants) held the GIL the participants needed."""

    def __init__(self, bootstrap: str, topic: str, jobs: set[str]) -> None:
        self._keys = {job_key(job) for job in jobs}
        self._codec = default_codec()
        self.durations: dict[str, list[int]] = {job: [] for job in jobs}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        count = partition_counts(bootstrap, [topic])[topic]
        self._consumer = Consumer(consumer_config(bootstrap, extra={"fetch.wait.max.ms": 100}))
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(count)])
        self._thread = threading.Thread(target=self._run, name="load-completions", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in consume_available(self._consumer, 5_000, 0.2):
                value = message.value()
                if message.error() or message.key() not in self._keys or not value:
                    continue
                if self._codec.record_name(value) != COMPLETED:
                    continue
                event = decode(value)
                if isinstance(event, CheckpointCompleted):
                    with self._cond:
                        self.durations[event.job_id].append(event.duration_ms)
                        self._cond.notify_all()

    def wait(self, each: int, timeout: float) -> bool:
        """Until every job has completed ``each`` checkpoints; False if ``timeout`` s passed first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while min(len(d) for d in self.durations.values()) < each:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.5))
        return True

    def count(self) -> int:
        """Checkpoints completed so far, every job's."""
        with self._cond:
            return sum(len(d) for d in self.durations.values())

    def measured(self, warmup: int, checkpoints: int) -> list[int]:
        with self._cond:
            return [d for job in sorted(self.durations) for d in self.durations[job][warmup:][:checkpoints]]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


# ------------------------------------------------------------------ stages

STAGES = (
    ("trigger journaled", "CheckpointTriggered's message CreateTime (produced after the decision)"),
    ("barrier published", "the barrier's CreateTime: produced once the trigger's write was acked"),
    ("barrier seen, first", "the first participant's snapshot(barrier) call"),
    ("barrier seen, last", "the last participant's"),
    ("snapshot written, first", "the first ack's timestamp_ms: its snapshot durable"),
    ("snapshot written, last", "the last ack's"),
    ("ack produced, first", "the first ack's CreateTime"),
    ("ack produced, last", "the last ack's"),
    ("ack decided, first", "the first TaskAcknowledged.timestamp_ms (the coordinator's clock)"),
    ("completed", "CheckpointCompleted.timestamp_ms: the last ack decided (= duration_ms)"),
    ("completion journaled", "CheckpointCompleted's message CreateTime"),
)
"""The steps of one checkpoint, each as ms after its trigger was decided (one host's clock)."""


def stage_timeline(
    bootstrap: str, topics: Topics, job: str, traces: list[TaskTrace], measured: int
) -> dict[str, list[float]]:
    """When each step of :data:`STAGES` happened in each of the last ``measured`` completed checkpoints
    of ``job``, read back from the journal, barriers and acks topics and the participants' traces."""
    partition = journal_partition(job)
    key = job_key(job)

    def records(topic: str) -> list[tuple[Any, int]]:
        found = read_to_end(bootstrap, topic, [partition], timeout=30)
        return [(decode(m.value), m.timestamp_ms) for m in found if m.key == key and m.value]

    journal = records(topics.checkpoints)
    triggered = {r.checkpoint_id: (r, ts) for r, ts in journal if isinstance(r, CheckpointTriggered)}
    completed = {r.checkpoint_id: (r, ts) for r, ts in journal if isinstance(r, CheckpointCompleted)}
    decided: dict[int, list[int]] = {}
    for r, _ in journal:
        if isinstance(r, TaskAcknowledged):
            decided.setdefault(r.checkpoint_id, []).append(r.timestamp_ms)
    barriers = {r.checkpoint_id: ts for r, ts in reversed(records(topics.barriers))
                if isinstance(r, CheckpointBarrier)}  # fmt: skip
    acks: dict[int, list[tuple[int, int]]] = {}
    for r, ts in records(topics.acks):
        if isinstance(r, CheckpointAcknowledged):
            acks.setdefault(r.checkpoint_id, []).append((r.timestamp_ms, ts))
    timeline: dict[str, list[float]] = {name: [] for name, _ in STAGES}
    for cid in sorted(completed)[-measured:]:
        seen = [t.barrier_seen[cid] / 1e6 for t in traces if cid in t.barrier_seen]
        if cid not in triggered or cid not in barriers or not seen or not acks.get(cid):
            continue
        trigger, trigger_sent = triggered[cid]
        done, done_sent = completed[cid]
        written, produced = [a[0] for a in acks[cid]], [a[1] for a in acks[cid]]
        steps = (trigger_sent, barriers[cid], min(seen), max(seen), min(written), max(written),
                 min(produced), max(produced), min(decided[cid]), done.timestamp_ms, done_sent)  # fmt: skip
        for (name, _), at in zip(STAGES, steps, strict=True):
            timeline[name].append(at - trigger.timestamp_ms)
    return timeline


def stages_table(rows: list[LoadRow]) -> Table:
    out = Table(
        title="Where a checkpoint's time goes: ms after its trigger was decided (p50 / p99)",
        title_justify="left",
    )
    out.add_column("step")
    traced = [r for r in rows if r.stages]
    for r in traced:
        out.add_column(f"{r.size} participants, {r.way}", justify="right")
    out.add_column("measured as")
    for name, how in STAGES:
        cells = [
            f"{percentile(r.stages[name], 50):.1f} / {percentile(r.stages[name], 99):.1f}" for r in traced
        ]
        out.add_row(name, *cells, how)
    return out


# ------------------------------------------------------------------ rows


@dataclass(frozen=True)
class Worker:
    """A broker and one coordinator worker on fresh topics."""

    kind: str
    bootstrap: str
    topics: Topics
    coordinator: CoordinatorProcess
    broker_pid: int | None


@contextmanager
def running_worker(kind: str, scratch: Path) -> Iterator[Worker]:
    with broker(kind) as (bootstrap, _, broker_pid):
        topics = make_topics(bootstrap, f"load-{kind}")
        coordinator = CoordinatorProcess(
            bootstrap, topics.prefix, log_path=scratch / f"coordinator-{kind}.log"
        )
        coordinator.start(timeout=120)
        try:
            yield Worker(kind, bootstrap, topics, coordinator, broker_pid)
        finally:
            coordinator.stop()


def run_row(
    worker: Worker,
    dimension: str,
    jobs: int,
    participants: int,
    mode: str,
    args: argparse.Namespace,
    storage: str = "files",
) -> LoadRow:
    """``jobs`` jobs of ``participants`` each, until every job completed warm-up + checkpoints (or the
    row's deadline passed)."""
    at_start = load()
    tag = f"{jobs}x{participants}-{mode}-{time.time_ns()}"
    names = {f"load-{tag}-{j}" for j in range(jobs)}
    config = CheckpointConfig(
        interval_ms=args.interval_ms, location=(args.scratch / tag).as_uri(), timeout_ms=30_000,
        tolerable_failures=1_000, inline_threshold_bytes=STORAGE[storage],
    )  # fmt: skip
    measured = max(args.checkpoints, -(-args.min_samples // jobs))
    wanted = args.warmup + measured
    completions = Completions(worker.bootstrap, worker.topics.checkpoints, names)
    with ExitStack() as stack:
        stack.callback(completions.close)
        drivers = []
        for name in sorted(names):
            group = Participants(worker.bootstrap, worker.topics, name, participants, mode)
            stack.callback(group.close)
            driver = JobDriver(worker.bootstrap, name, worker.topics)
            stack.callback(driver.close)
            drivers.append((driver, group))
        # every job's clients exist before the first starts: the measured span is the jobs' running
        pids = {"coordinator": worker.coordinator.worker_pid, "broker": worker.broker_pid}
        pids |= {f"participant {pid}": pid for _, group in drivers for pid in group.pids}
        meter = Meter(pids)
        for driver, group in drivers:
            driver.running(group.task_ids, config, attempt=1)
            stack.callback(driver.status, JobStatus.FINISHED)
        complete = completions.wait(wanted, timeout=wanted * args.interval_ms / 1000 * 6 + 60)
        cpu, completed = meter.stop(), completions.count()
        # participant processes (``--modes process``) count as the participants, as the threads do
        cpu["bench"] += sum(cpu.pop(name) for name in [n for n in cpu if n.startswith("participant ")])
    stages = {}
    if args.stages and jobs == 1:  # after the participants closed: a process's traces come back then
        ((driver, group),) = drivers
        stages = stage_timeline(worker.bootstrap, worker.topics, driver.job_id, group.traces, measured)
    return LoadRow(
        worker.kind, dimension, jobs if dimension == "jobs" else participants, mode,
        completions.measured(args.warmup, measured), cpu, at_start, complete, completed, stages, storage,
    )  # fmt: skip


def broker_rows(kind: str, args: argparse.Namespace, console: Console) -> Iterator[LoadRow]:
    sizes = [("jobs", j, 2, "shared", "files") for j in args.jobs]
    sizes += [
        ("participants", 1, p, m, s) for p in args.participants for m in args.modes for s in args.storage
    ]
    with running_worker(kind, args.scratch) as worker:
        for dimension, jobs, participants, mode, storage in sizes:
            size = jobs if dimension == "jobs" else participants
            console.print(f"{BROKERS[kind]}: {dimension} {size} ({MODES[mode]}, {storage}), load {load()}")
            row = run_row(worker, dimension, jobs, participants, mode, args, storage)
            short = (
                "" if row.complete else " [bold red](deadline passed: not every job got its checkpoints)[/]"
            )
            console.print(
                f"  {len(row.durations)} checkpoints: p50 {row.p50:.0f} / p99 {row.p99:.0f} ms; CPU % of a "
                f"core: coordinator {row.share('coordinator'):.0f}, broker {row.share('broker'):.0f}, "
                f"participants {row.share('bench'):.0f}, others {row.share('other processes'):.0f}; CPU ms "
                f"per checkpoint: coordinator {row.per_checkpoint('coordinator'):.1f}, broker "
                f"{row.per_checkpoint('broker'):.1f}, participants {row.per_checkpoint('bench'):.1f}{short}"
            )
            yield row


# ------------------------------------------------------------------ Flink


def flink_rows(args: argparse.Namespace, console: Console) -> list[FlinkResult | str]:
    """Flink at each ``--flink-parallelism``, or why it could not run (the cutline rows stand)."""
    if not args.flink_parallelism:
        return []
    try:
        python = flink_python(args.flink_python, console)
    except FlinkUnavailable as exc:
        return [f"unavailable: {exc}" for _ in args.flink_parallelism]
    checkpoints = max(args.checkpoints, args.min_samples)  # as many as a cutline row of one job
    seconds = int((args.warmup + checkpoints) * args.interval_ms / 1000 * 1.5) + 30
    found: list[FlinkResult | str] = []
    for parallelism in args.flink_parallelism:
        console.print(f"Flink 2.3 MiniCluster: parallelism {parallelism}, {seconds} s, load {load()}")
        try:
            result: FlinkResult | str = run_flink(
                python, Path(args.anchor), parallelism, seconds, args.interval_ms, args.warmup,
                checkpoints, args.scratch,
            )  # fmt: skip
        except Exception as exc:  # the anchor is a program of its own: any failure of it is reported
            result = f"{type(exc).__name__}: {str(exc)[:300]}"
        console.print(f"  {_flink_line(result)}")
        found.append(result)
    return found


def _flink_line(result: FlinkResult | str) -> str:
    if isinstance(result, str):
        return f"[bold red]the Flink anchor failed:[/] {result}"
    d = result.durations
    p50, p99 = percentile(d, 50), percentile(d, 99)
    return f"{len(d)} checkpoints after {result.warmup}: p50 {p50:.0f} / p99 {p99:.0f} ms"


# ------------------------------------------------------------------ report


def table(rows: list[LoadRow], flink: list[FlinkResult | str]) -> Table:
    out = Table(title="Checkpoint latency under load, trigger → completed (ms)", title_justify="left")
    right = ("size", "n", "p50", "p99", "max", "coordinator", "broker", "participants / Flink", "others")
    for column in ("system", "load", "size", "mode", "n", "p50", "p99", "max", "coordinator", "broker",
                   "participants / Flink", "others", "load at start"):  # fmt: skip
        out.add_column(column, justify="right" if column in right else "left")
    for r in rows:
        out.add_row(
            f"cutline on {BROKERS[r.broker]}",
            "jobs per worker" if r.dimension == "jobs" else "participants per job",
            str(r.size), r.way, str(len(r.durations)) + ("" if r.complete else " (short)"),
            f"{r.p50:.0f}", f"{r.p99:.0f}", f"{max(r.durations, default=0)}",
            *(f"{r.share(k):.0f} %" for k in ("coordinator", "broker", "bench", "other processes")),
            "/".join(f"{v:.2f}" for v in r.load_at_start),
        )  # fmt: skip
    for f in flink:
        if isinstance(f, str):
            out.add_row("Flink 2.3 MiniCluster", "", "", f"[bold red]failed: {f[:120]}[/]", *([""] * 9))
            continue
        out.add_row(
            "Flink 2.3 MiniCluster", "parallelism", str(f.parallelism), "", str(len(f.durations)),
            f"{percentile(f.durations, 50):.0f}", f"{percentile(f.durations, 99):.0f}",
            f"{max(f.durations, default=0)}", "", "", f"{100 * f.cpu['flink'] / f.wall_s:.0f} %",
            f"{100 * f.cpu['other processes'] / f.wall_s:.0f} %",
            "/".join(f"{v:.2f}" for v in f.load_at_start),
        )  # fmt: skip
    return out


def verdicts(rows: list[LoadRow], flink: list[FlinkResult | str]) -> list[str]:
    """The targets, per broker: p99 at 16 jobs against 1 job, and 32 participants against Flink at 32."""
    lines = []
    by_key = {(r.broker, r.dimension, r.size, r.mode, r.storage): r for r in rows}
    anchors = {f.parallelism: f for f in flink if isinstance(f, FlinkResult)}
    for kind in dict.fromkeys(r.broker for r in rows):
        one = by_key.get((kind, "jobs", 1, "shared", "files"))
        sixteen = by_key.get((kind, "jobs", 16, "shared", "files"))
        if one and sixteen:
            ratio = sixteen.p99 / one.p99
            met = "met" if ratio <= JOBS_RATIO_TARGET else "[bold red]missed[/]"
            lines.append(
                f"{BROKERS[kind]}: p99 at 16 jobs {sixteen.p99:.0f} ms against 1 job {one.p99:.0f} ms = "
                f"{ratio:.2f}x (target ≤ {JOBS_RATIO_TARGET:g}x) {met}"
            )
        for mode, storage in [(m, s) for m in MODES for s in STORAGE]:
            row, anchor = by_key.get((kind, "participants", 32, mode, storage)), anchors.get(32)
            if row and anchor:
                f50, f99 = percentile(anchor.durations, 50), percentile(anchor.durations, 99)
                met = "met" if row.p50 <= f50 and row.p99 <= f99 else "[bold red]missed[/]"
                lines.append(
                    f"{BROKERS[kind]}: 32 participants ({row.way}) p50/p99 "
                    f"{row.p50:.0f}/{row.p99:.0f} ms against Flink at parallelism 32 "
                    f"{f50:.0f}/{f99:.0f} ms {met}"
                )
    return lines


def as_json(rows: list[LoadRow], flink: list[FlinkResult | str], meta: dict[str, Any]) -> dict[str, Any]:
    found: list[dict[str, Any]] = []
    for f in flink:
        if isinstance(f, str):
            found.append({"failed": f})
        else:
            d = f.durations
            found.append({"parallelism": f.parallelism, "n": len(d), "p50": percentile(d, 50),
                          "p99": percentile(d, 99), "durations": d, "anchor_line": f.anchor, "cpu_s": f.cpu,
                          "load_at_start": f.load_at_start})  # fmt: skip
    cutline = [{**asdict(r), "p50": r.p50, "p99": r.p99} for r in rows]
    return {**meta, "rows": cutline, "flink": found}


# ------------------------------------------------------------------ main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", nargs="+", choices=tuple(BROKERS), default=list(BROKERS))
    parser.add_argument("--jobs", type=int, nargs="*", default=[1, 4, 16, 64], help="jobs per worker")
    parser.add_argument("--participants", type=int, nargs="*", default=[2, 8, 32], help="of one job")
    parser.add_argument("--modes", nargs="+", choices=tuple(MODES), default=["thread", "shared"],
                        help="participants as threads with a feed and a producer each (thread), or sharing "
                        "one (shared), or a process each (process); default thread shared")  # fmt: skip
    parser.add_argument(
        "--storage",
        nargs="+",
        choices=tuple(STORAGE),
        default=["files", "inline"],
        help="rows of participants with each 1 KiB snapshot an fsynced file (files), or inline in the ack "
        "below Flink's default memory threshold of 20 KiB (inline), as the anchor's Flink job keeps its "
        "subtasks' state; default both",
    )
    parser.add_argument("--checkpoints", type=int, default=20, help="measured per job and row, at least")
    parser.add_argument(
        "--min-samples",
        type=int,
        default=100,
        help="checkpoints measured per row at least, the jobs' pooled (100: a p99 that is not the max; a "
        "job of a row with fewer jobs measures more of its checkpoints)",
    )
    parser.add_argument(
        "--fetch-wait-ms",
        type=int,
        help="fetch.wait.max.ms of the coordinator's and the participants' consumers "
        "(CUTLINE_FETCH_WAIT_MS) and of the shared feeds (default: cutline's own: 500 ms, 5 where "
        "the embedded broker runs)",
    )
    parser.add_argument("--warmup", type=int, default=3, help="first checkpoints of each job left out")
    parser.add_argument(
        "--interval-ms", type=int, default=500, help="every job's (and Flink's) checkpoint interval"
    )
    parser.add_argument("--flink-parallelism", type=int, nargs="*", default=[32],
                        help="Flink rows (default 32; none: no Flink row)")  # fmt: skip
    parser.add_argument("--flink-python", help="a Python with apache-flink==2.3.0 (default: the scratch venv "
                        "/tmp/cutline-flink-venv, made if missing)")  # fmt: skip
    parser.add_argument("--anchor", default=str(ANCHOR), help="the Flink anchor script")
    parser.add_argument(
        "--stages",
        action="store_true",
        help="also show when each step of a one-job row's checkpoints happened (trigger -> barrier -> "
        "snapshot -> ack -> decided -> journaled), read back from the topics after the row",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the rows (and every duration) as JSON")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.fetch_wait_ms is not None:  # the workers and the shared feeds read the environment
        os.environ["CUTLINE_FETCH_WAIT_MS"] = str(args.fetch_wait_ms)
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=200)
    at_start, started = load(), time.monotonic()
    console.print(
        f"[bold]{COMMAND}[/]: {machine_line()}, code from {code_checked()}, load average {at_start} "
        f"at start; a checkpoint every {args.interval_ms} ms, {args.checkpoints} measured per job after "
        f"{args.warmup} (at least {args.min_samples} a row); fetch.wait.max.ms "
        f"{os.environ.get('CUTLINE_FETCH_WAIT_MS', 'cutline defaults')}"
    )
    rows: list[LoadRow] = []
    flink: list[FlinkResult | str] = []
    with tempfile.TemporaryDirectory(prefix="cutline-load-") as tmp:
        args.scratch = Path(tmp)
        try:
            for kind in args.brokers:
                for row in broker_rows(kind, args, console):
                    rows.append(row)
            flink = flink_rows(args, console)
        finally:  # what was measured is printed, whatever stopped the run
            console.print(table(rows, flink))
            if args.stages and rows:
                console.print(stages_table(rows))
            for line in verdicts(rows, flink):
                console.print(line)
            end = load()
            console.print(
                "CPU in % of one core over each row: the coordinator worker, the broker, this process (the "
                "participants, their feeds and producers), every other process of the machine (other work); "
                f"Flink: the anchor and its JVM. total {time.monotonic() - started:.0f} s, load average "
                f"{end} at the end"
            )
            if args.json:
                meta = {"command": COMMAND, "date": datetime.now().isoformat(timespec="seconds"),
                        "load_at_start": at_start, "load_at_end": end, "interval_ms": args.interval_ms,
                        "warmup": args.warmup, "checkpoints": args.checkpoints}  # fmt: skip
                Path(args.json).write_text(json.dumps(as_json(rows, flink, meta), indent=1, default=list))


if __name__ == "__main__":
    main()
