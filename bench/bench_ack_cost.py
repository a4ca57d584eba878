"""Benchmark: the cost of one ack against the number of tasks (docs/design.md, "Performance targets").

    uv run python bench/bench_ack_cost.py [--acks 40000] [--rounds 5] [--sizes 10,100,1000,10000]
                                          [--pending 4] [--seed 1] [--check]

For each task count, one job with that many tasks runs in a fresh
``coordinator.service.runtime.Coordinator`` (no Kafka, no Faust). Checkpoints are
requested ``--pending`` at a time, and every task acknowledges each checkpoint in a
shuffled order with real encoded ``CheckpointAcknowledged`` bytes, as the service
receives them. Only the ``Coordinator.handle`` calls of the acks are timed: decode,
checks, decide, evolve, statistics and encoding, and for the last ack of a
checkpoint its completion too. Requests and the encoding of the acks are not timed.

Every task count runs ``--rounds`` times, the sizes taking turns, so that a burst of
other work on the machine hits all of them alike; the best round of each is shown.
The target: µs per ack at 10,000 tasks within 1.3x of 10 tasks. ``--check`` exits 1
when the largest size's ratio to the smallest is above that.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from bench.cpu import machine_line
from coordinator.service.runtime import Coordinator
from events.kafka.clients import job_key
from events.wire.codec import encode
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointKind,
    CheckpointRequested,
    CheckpointTriggered,
    JobStatus,
    JobStatusChanged,
    StateHandle,
)
from events.wire.topics import Topics

COMMAND = "uv run python bench/bench_ack_cost.py"
RATIO_TARGET = 1.3
JOB = "ack-cost"
TOPICS = Topics("bench.")


@dataclass
class Measured:
    """The acks of one task count in one round and the time their ``handle`` calls took."""

    tasks: int
    acks: int
    seconds: float
    cpu_seconds: float

    @property
    def us_per_ack(self) -> float:
        return self.seconds / self.acks * 1e6

    @property
    def cpu_us_per_ack(self) -> float:
        return self.cpu_seconds / self.acks * 1e6


class _Job:
    """One job of ``tasks`` tasks in its own coordinator, fed through ``handle`` as the service is."""

    def __init__(self, tasks: int, pending: int) -> None:
        self.core = Coordinator(TOPICS, rng=random.Random(1))
        self.task_ids = [f"task-{i:05d}" for i in range(tasks)]
        self.key = job_key(JOB)
        self.clock = 1_000_000
        self.offsets = {TOPICS.job_status: 0, TOPICS.requests: 0, TOPICS.acks: 0}
        config = CheckpointConfig(
            interval_ms=0,  # manual checkpoints only: nothing but the acks triggers or completes
            location="file:///tmp/cutline-bench-ack-cost",  # nothing is written there
            timeout_ms=3_600_000_000,
            max_concurrent=pending,
        )
        running = JobStatusChanged(JOB, JobStatus.RUNNING, self.clock, 1, tuple(self.task_ids), config)
        self._handle(TOPICS.job_status, encode(running))
        self.triggered: list[CheckpointTriggered] = []

    def _handle(self, topic: str, value: bytes) -> list[object]:
        offset = self.offsets[topic]
        self.offsets[topic] = offset + 1
        self.clock += 1
        outcome = self.core.handle(topic, 0, offset, self.key, value, self.clock)
        assert outcome.rejected is None and outcome.job_id == JOB, outcome
        return list(outcome.journal)

    def request(self) -> None:
        request_id = f"r{self.offsets[TOPICS.requests]}"
        request = CheckpointRequested(JOB, CheckpointKind.CHECKPOINT, self.clock, request_id)
        journal = self._handle(TOPICS.requests, encode(request))
        self.triggered += [e for e in journal if isinstance(e, CheckpointTriggered)]

    def acks_of(self, triggered: CheckpointTriggered, order: list[int]) -> list[bytes]:
        """Every task's ack of ``triggered``, encoded, in ``order``."""
        return [
            encode(
                CheckpointAcknowledged(
                    job_id=JOB,
                    checkpoint_id=triggered.checkpoint_id,
                    attempt=1,
                    task_id=self.task_ids[i],
                    timestamp_ms=self.clock,
                    state=StateHandle(f"{triggered.location}/{self.task_ids[i]}", 1024, "0" * 64),
                    offsets={f"input:{i}": triggered.checkpoint_id * 100},
                    metrics={"snapshot_ms": 0, "write_ms": 0, "bytes": 1024},
                )
            )
            for i in order
        ]

    def time_acks(self, values: list[bytes]) -> tuple[float, float, int]:
        """Wall and CPU seconds spent in ``handle`` for ``values``, and the checkpoints they completed."""
        core, topic, key, offset, completed = self.core, TOPICS.acks, self.key, self.offsets[TOPICS.acks], 0
        now = self.clock
        cpu, started = time.process_time(), time.perf_counter()
        for value in values:
            outcome = core.handle(topic, 0, offset, key, value, now)
            offset += 1
            if len(outcome.journal) != 1:  # a completion (or a refusal, which then never completes)
                completed += sum(isinstance(e, CheckpointCompleted) for e in outcome.journal)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        self.offsets[TOPICS.acks] = offset
        return elapsed, cpu, completed


def measure(tasks: int, acks: int, pending: int, seed: int) -> Measured:
    """Time ``acks`` acks (rounded to whole checkpoints) of a job with ``tasks`` tasks."""
    job = _Job(tasks, pending)
    checkpoints = max(1, acks // tasks)
    rng = random.Random(seed)
    order = list(range(tasks))
    for _ in range(pending):
        job.request()
    spent, spent_cpu, completed = 0.0, 0.0, 0
    gc.collect()
    for n in range(checkpoints):
        triggered = job.triggered[n]
        rng.shuffle(order)
        values = job.acks_of(triggered, order)
        seconds, cpu, done = job.time_acks(values)
        spent += seconds
        spent_cpu += cpu
        completed += done
        job.request()  # keeps ``pending`` checkpoints in flight (not timed)
    if completed != checkpoints:
        raise SystemExit(f"{tasks} tasks: {completed} of {checkpoints} checkpoints completed")
    return Measured(tasks, checkpoints * tasks, spent, spent_cpu)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--acks", type=int, default=40_000, help="acks timed per task count and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="10,100,1000,10000", help="task counts, comma-separated")
    parser.add_argument("--pending", type=int, default=4, help="checkpoints in flight (max_concurrent)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--check", action="store_true", help=f"exit 1 if the ratio exceeds {RATIO_TARGET}")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)
    load = os.getloadavg()[0]
    console.print(
        f"[bold]{COMMAND}[/] (acks={args.acks:,}, rounds={args.rounds}, sizes={sizes}, "
        f"pending={args.pending}, seed={args.seed})"
    )

    best: dict[int, Measured] = {}
    rounds: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(args.rounds):
        for tasks in sizes:
            m = measure(tasks, args.acks, args.pending, args.seed + r)
            rounds[tasks].append(m.us_per_ack)
            if tasks not in best or m.us_per_ack < best[tasks].us_per_ack:
                best[tasks] = m
            console.print(
                f"  round {r + 1}: {tasks:>6,} tasks  {m.us_per_ack:6.2f} µs/ack "
                f"(CPU {m.cpu_us_per_ack:6.2f} µs)",
                style="dim",
            )

    machine = f"{machine_line()}, load average {load:.1f} at start"
    console.print(results_table(sizes, best, rounds, machine))
    ratio = best[sizes[-1]].us_per_ack / best[sizes[0]].us_per_ack
    verdict = "met" if ratio <= RATIO_TARGET else "missed"
    console.print(f"{sizes[-1]:,} / {sizes[0]:,} tasks: {ratio:.2f}x (target <= {RATIO_TARGET}x): {verdict}")
    if args.check and ratio > RATIO_TARGET:
        sys.exit(1)


def results_table(
    sizes: list[int], best: dict[int, Measured], rounds: dict[int, list[float]], machine: str
) -> Table:
    """One row per task count: its best round, and the ratio of wall and CPU time to the smallest."""
    base = best[sizes[0]]
    table = Table(title=f"Coordinator.handle per ack: {COMMAND}", caption=machine, title_justify="left")
    columns = ("tasks", "acks timed", "µs/ack", "acks/s", f"ratio to {sizes[0]:,}", "CPU µs/ack", "CPU ratio")
    for column in (*columns, "µs/ack, every round"):
        table.add_column(column, justify="right")
    for tasks in sizes:
        m = best[tasks]
        ratio = m.us_per_ack / base.us_per_ack
        shown = f"{ratio:.2f}x" if ratio <= RATIO_TARGET else f"[red]{ratio:.2f}x[/]"
        table.add_row(
            f"{tasks:,}",
            f"{m.acks:,}",
            f"{m.us_per_ack:.2f}",
            f"{1e6 / m.us_per_ack:,.0f}",
            shown,
            f"{m.cpu_us_per_ack:.2f}",
            f"{m.cpu_us_per_ack / base.cpu_us_per_ack:.2f}x",
            " ".join(f"{u:.2f}" for u in rounds[tasks]),
        )
    return table


if __name__ == "__main__":
    main()
