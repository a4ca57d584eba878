"""Benchmark: the shell's own cost, the shipped Faust worker against a plain loop (issue 52, item 3).

    uv run python bench/bench_shell.py [--brokers kafka tansu] [--quick] [--acks 40000] [--tasks 1000]
                                       [--rounds 2] [--checkpoints 100] [--interval-ms 200]

On each broker (Apache Kafka from ``events/dev/apache_kafka.py``, then the embedded Tansu; or
``CUTLINE_BOOTSTRAP``'s), side by side in one run, the same runtime
(:class:`coordinator.service.runtime.Coordinator`) behind two shells:

- **faust**: ``cutline coordinator`` as deployed, a child process
  (:class:`coordinator.service.supervisor.CoordinatorProcess`);
- **plain**: a tight confluent-kafka loop around ``Coordinator.handle`` in a child process
  (:class:`bench.bench_coordinator.PlainShell`): no group, no offset commits, no recovery, no
  web views; what any shell could reach over this broker on this machine.

Measured as a user would (the parts and their definitions are ``bench/bench_coordinator.py``'s):

1. **acks/s**: one ack flood per shell per round (shells taking turns, ``--rounds`` each), the
   rate of ``TaskAcknowledged`` in the journal (the worker's clock), and the CPU the worker's
   process (and its main thread) spent per ack: on a loaded machine the rate is the machine's,
   the CPU per ack still the shell's;
2. **checkpoint latency** at 2 participants (threads in this process), trigger → completed
   (``CheckpointCompleted.duration_ms``), p50 and p99;
3. along each checkpoint's critical path, **the ack path** (the last ack produced → its decision,
   which completes the checkpoint: fetch, decode, decide, the journal write is not in it) and **the
   journal write** (the trigger's journal record sent → the broker acknowledged it and the barrier
   went out).

Targets: the Faust worker's p50 and p99 within 1.3x of the plain loop's, and at least 20,000 acks/s.
``--check`` exits 1 when one is missed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.bench_coordinator import (
    ACKS_TARGET,
    BROKERS,
    LatencyResult,
    PlainShell,
    ThroughputResult,
    _removed,
    bench_latency,
    bench_throughput,
    broker,
    make_topics,
    mean,
    percentile,
)
from bench.cpu import code_checked, machine_line
from coordinator.core.state import MAX_CONCURRENT_CHECKPOINTS
from coordinator.service.supervisor import CoordinatorProcess

COMMAND = "uv run python bench/bench_shell.py"
RATIO_TARGET = 1.3
ACK_PATH = "→ ack consumed, completion decided"
JOURNAL_WRITE = "→ journal write acked, barrier sent"


@dataclass
class BrokerRun:
    """Both shells on one broker."""

    broker: str
    description: str
    floods: list[ThroughputResult]
    latency: dict[str, LatencyResult]


def floods(
    bootstrap: str, pid: int | None, tasks: int, acks: int, rounds: int, scratch: Path, console: Console
) -> list[ThroughputResult]:
    results = []
    for _ in range(rounds):
        for shell in ("faust", "plain"):
            k = max(1, acks // tasks)
            console.print(f"  ack flood, {shell}: {tasks:,} tasks × {k} checkpoints = {tasks * k:,} acks")
            r = bench_throughput(bootstrap, tasks, k, scratch, console, pid, shell)
            console.print(f"    {r.journal_rate:,.0f} acks/s in the journal, {r.dead_letters} dead letters")
            results.append(r)
    return results


def latencies(
    bootstrap: str, pid: int | None, checkpoints: int, interval_ms: int, scratch: Path, console: Console
) -> dict[str, LatencyResult]:
    results = {}
    for shell in ("faust", "plain"):
        topics = make_topics(bootstrap, f"shell-{shell}")
        coordinator: CoordinatorProcess | PlainShell
        if shell == "plain":
            coordinator = PlainShell(bootstrap, topics.prefix)
        else:
            log = scratch / "coordinator-latency" / "coordinator.log"
            coordinator = CoordinatorProcess(bootstrap, topics.prefix, log_path=log)
        coordinator.start()
        try:
            console.print(f"  latency, {shell}: 2 participants (threads), {checkpoints} checkpoints")
            results[shell] = bench_latency(
                bootstrap, topics, coordinator, 2, "thread", checkpoints, 5, interval_ms, scratch,
                console, pid, shell,
            )  # fmt: skip
        finally:
            coordinator.stop()
    return results


def rows(run: BrokerRun) -> list[tuple[str, float, float, str, bool | None]]:
    """(measure, faust, plain, target, met) for one broker."""
    faust, plain = run.latency["faust"], run.latency["plain"]
    found: list[tuple[str, float, float, str, bool | None]] = []
    for q in (50, 99):
        f, p = percentile(faust.durations, q), percentile(plain.durations, q)
        found.append(
            (f"checkpoint latency p{q}, ms", f, p, f"<= {RATIO_TARGET}x plain", f <= RATIO_TARGET * p)
        )
    for name, stage in (("ack path, ms (mean)", ACK_PATH), ("journal write, ms (mean)", JOURNAL_WRITE)):
        found.append((name, mean(faust.stages.get(stage, [])), mean(plain.stages.get(stage, [])), "", None))
    rates = {s: [r.journal_rate for r in run.floods if r.shell == s] for s in ("faust", "plain")}
    f_rate, p_rate = min(rates["faust"], default=0.0), min(rates["plain"], default=0.0)
    found.append(("acks/s (the slowest round)", f_rate, p_rate, f">= {ACKS_TARGET:,}", f_rate >= ACKS_TARGET))
    for name, process in (
        ("CPU µs per ack, worker process", "coordinator"),
        ("… its main thread", "coordinator main thread"),
    ):
        cpu = {
            s: mean([r.us_per_ack(process) for r in run.floods if r.shell == s]) for s in ("faust", "plain")
        }
        found.append((name, cpu["faust"], cpu["plain"], "", None))
    return found


def table(runs: list[BrokerRun]) -> Table:
    out = Table(title="The worker's own cost: the Faust worker against a plain loop", title_justify="left")
    for i, col in enumerate(("broker", "measure", "Faust worker", "plain loop", "ratio", "target", "")):
        out.add_column(col, justify="left" if i in (0, 1, 5, 6) else "right")
    for run in runs:
        for measure, f, p, target, met in rows(run):
            digits = ",.0f" if "acks" in measure else ".1f"
            ratio = f / p if p else float("nan")
            verdict = "" if met is None else ("met" if met else "[bold red]missed[/]")
            out.add_row(
                BROKERS[run.broker],
                measure,
                format(f, digits),
                format(p, digits),
                f"{ratio:.2f}x",
                target,
                verdict,
            )
        out.add_section()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", nargs="+", choices=tuple(BROKERS), default=["kafka", "tansu"])
    parser.add_argument("--quick", action="store_true", help="10,000 acks, one round, 30 checkpoints")
    parser.add_argument("--acks", type=int, help="acks per flood (40000; quick 10000)")
    parser.add_argument(
        "--tasks",
        type=int,
        default=1000,
        help="tasks of the flooded job (acks / tasks checkpoints: at most 64)",
    )
    parser.add_argument("--rounds", type=int, help="floods per shell, taking turns (2; quick 1)")
    parser.add_argument(
        "--checkpoints", type=int, help="measured checkpoints per latency run (100; quick 30)"
    )
    parser.add_argument(
        "--interval-ms", type=int, default=200, help="checkpoint interval of the latency runs"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args()
    acks = args.acks or (10_000 if args.quick else 40_000)
    rounds = args.rounds or (1 if args.quick else 2)
    checkpoints = args.checkpoints or (30 if args.quick else 100)
    if not 1 <= acks // args.tasks <= MAX_CONCURRENT_CHECKPOINTS:
        parser.error(
            f"--acks {acks} / --tasks {args.tasks} makes {acks // args.tasks} checkpoints pending at once; "
            f"a job may have 1 to {MAX_CONCURRENT_CHECKPOINTS} (max_concurrent): more tasks or fewer acks"
        )

    console = Console(highlight=False) if sys.stdout.isatty() else Console(highlight=False, width=200)
    console.print(
        f"[bold]{COMMAND}[/] {' '.join(sys.argv[1:])}: {machine_line()}, code from {code_checked()}, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    started = time.monotonic()
    runs = []
    for kind in args.brokers:
        scratch = Path(tempfile.mkdtemp(prefix="cutline-shell-"))
        with broker(kind) as (bootstrap, what, pid), _removed(scratch):
            console.print(f"[bold]{what}[/] at {bootstrap}")
            flooded = floods(bootstrap, pid, args.tasks, acks, rounds, scratch, console)
            timed = latencies(bootstrap, pid, checkpoints, args.interval_ms, scratch, console)
            runs.append(BrokerRun(kind, what, flooded, timed))
    console.print(table(runs))
    console.print(
        f"total {time.monotonic() - started:.0f} s, load average {os.getloadavg()[0]:.2f} at the end"
    )
    missed = [m for run in runs for m, *_, met in rows(run) if met is False]
    if args.check and missed:
        sys.exit(1)


if __name__ == "__main__":
    main()
