"""How checkpoint latency grows with load, on the embedded Tansu and on Apache Kafka, in one run
(issue 47, "Side by side"; docs/benchmarks.md).

    uv run python bench/bench_load.py [--brokers tansu kafka] [--jobs 1 4 16 64]
                                      [--participants 2 8 32] [--checkpoints 30] [--json OUT]

For each broker (started for its part, one coordinator worker on it):

- **jobs per worker**: ``J`` jobs at once (1, 4, 16, 64), each of two participants that share one
  feed and one producer, each checkpointing every ``--interval-ms``; the latency of every job's
  checkpoints after ``--warmup``, pooled;
- **participants per job**: one job of ``P`` participants (2, 8, 32), each with a feed and a
  producer of its own (``thread``), then all sharing one (``shared``).

Latency is ``CheckpointCompleted.duration_ms`` (trigger → completed, the coordinator's clock), read
from the journal after the row. The targets on Apache Kafka: p99 at 16 jobs within 2× of 1 job;
32 participants at or below Flink at parallelism 32 (``bench/bench_vs_flink.py --participants 32``,
the same machine, the same run where possible). CPU of the broker and the coordinator over each row
is printed beside it, and the machine's load: a busy machine says more about itself than about
cutline.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.bench_coordinator import BROKERS, Participants, broker, make_topics, percentile
from bench.cpu import machine_line
from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.log import read_journal_topic
from events.task.participant import JobDriver
from events.wire.records import CheckpointCompleted, CheckpointConfig, JobStatus
from events.wire.topics import Topics

COMMAND = "uv run python bench/bench_load.py"


@dataclass(frozen=True)
class LoadRow:
    broker: str
    dimension: str
    """``jobs`` (jobs per worker, two participants each, shared) or ``participants`` (of one job)."""
    size: int
    mode: str
    checkpoints: int
    p50: float
    p99: float
    load_at_start: tuple[float, float, float]
    seconds: float


def _load() -> tuple[float, float, float]:
    import os

    return os.getloadavg()


@contextmanager
def _worker(kind: str, scratch: Path) -> Iterator[tuple[str, Topics]]:
    """A broker of ``kind`` and one coordinator worker on fresh topics."""
    with broker(kind) as (bootstrap, _, _pid):
        topics = make_topics(bootstrap, f"load-{kind}")
        coordinator = CoordinatorProcess(
            bootstrap, topics.prefix, log_path=scratch / f"coordinator-{kind}.log"
        )
        coordinator.start(timeout=120)
        try:
            yield bootstrap, topics
        finally:
            coordinator.stop()


def _durations(bootstrap: str, topics: Topics, jobs: set[str], warmup: int) -> list[int]:
    """The completed checkpoints' durations of ``jobs``, each job's first ``warmup`` left out."""
    seen: dict[str, int] = {}
    durations = []
    for event, _ in read_journal_topic(bootstrap, topics.checkpoints, lambda message, problem: None):
        if isinstance(event, CheckpointCompleted) and event.job_id in jobs:
            seen[event.job_id] = seen.get(event.job_id, 0) + 1
            if seen[event.job_id] > warmup:
                durations.append(event.duration_ms)
    return durations


def run_row(
    bootstrap: str,
    topics: Topics,
    jobs: int,
    participants: int,
    mode: str,
    args: argparse.Namespace,
    scratch: Path,
) -> tuple[list[int], float]:
    """``jobs`` jobs of ``participants`` each, until every job completed warm-up + checkpoints."""
    tag = f"{jobs}x{participants}-{mode}-{time.time_ns()}"
    names = {f"load-{tag}-{j}" for j in range(jobs)}
    config = CheckpointConfig(
        interval_ms=args.interval_ms, location=(scratch / tag).as_uri(), timeout_ms=30_000,
        tolerable_failures=1_000,
    )  # fmt: skip
    wanted = args.warmup + args.checkpoints
    started = time.monotonic()
    with ExitStack() as stack:
        for name in sorted(names):
            group = Participants(bootstrap, topics, name, participants, mode)
            stack.callback(group.close)
            driver = JobDriver(bootstrap, name, topics)
            stack.callback(driver.close)
            driver.running(group.task_ids, config, attempt=1)
            stack.callback(driver.status, JobStatus.FINISHED)
        deadline = started + wanted * args.interval_ms / 1000 * 4 + 60
        while time.monotonic() < deadline:
            counts = _durations(bootstrap, topics, names, 0)
            if len(counts) >= wanted * jobs:
                break
            time.sleep(1.0)
    return _durations(bootstrap, topics, names, args.warmup), time.monotonic() - started


def _rows(kind: str, args: argparse.Namespace, scratch: Path, console: Console) -> Iterator[LoadRow]:
    with _worker(kind, scratch) as (bootstrap, topics):
        sizes = [("jobs", j, 2, "shared") for j in args.jobs]
        sizes += [("participants", 1, p, m) for p in args.participants for m in ("thread", "shared")]
        for dimension, jobs, participants, mode in sizes:
            at_start = _load()
            size = jobs if dimension == "jobs" else participants
            console.print(f"{BROKERS[kind]}: {dimension} {size} ({mode}), load {at_start}")
            durations, seconds = run_row(bootstrap, topics, jobs, participants, mode, args, scratch)
            row = LoadRow(
                kind, dimension, size, mode, len(durations), percentile(durations, 50),
                percentile(durations, 99), at_start, round(seconds, 1),
            )  # fmt: skip
            console.print(f"  {row.checkpoints} checkpoints: p50 {row.p50:.0f} / p99 {row.p99:.0f} ms")
            yield row


def table(rows: list[LoadRow]) -> Table:
    out = Table(title="Checkpoint latency under load, trigger → completed (ms)", title_justify="left")
    for column in ("broker", "load", "size", "mode", "n", "p50", "p99", "load at start", "s"):
        out.add_column(column, justify="right" if column in ("size", "n", "p50", "p99", "s") else "left")
    for r in rows:
        out.add_row(
            BROKERS[r.broker], "jobs per worker" if r.dimension == "jobs" else "participants per job",
            str(r.size), r.mode, str(r.checkpoints), f"{r.p50:.0f}", f"{r.p99:.0f}",
            "/".join(f"{v:.2f}" for v in r.load_at_start), f"{r.seconds:.0f}",
        )  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", nargs="+", choices=tuple(BROKERS), default=list(BROKERS))
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 4, 16, 64], help="jobs per worker")
    parser.add_argument("--participants", type=int, nargs="+", default=[2, 8, 32], help="of one job")
    parser.add_argument("--checkpoints", type=int, default=30, help="measured per job and row")
    parser.add_argument("--warmup", type=int, default=3, help="first checkpoints of each job left out")
    parser.add_argument("--interval-ms", type=int, default=500, help="every job's checkpoint interval")
    parser.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = parser.parse_args()
    console = Console(highlight=False)
    console.print(f"[bold]{COMMAND}[/]: {machine_line()}, load average {_load()} at start")
    rows: list[LoadRow] = []
    with tempfile.TemporaryDirectory(prefix="cutline-load-") as tmp:
        for kind in args.brokers:
            rows += _rows(kind, args, Path(tmp), console)
    console.print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
