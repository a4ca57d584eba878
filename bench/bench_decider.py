"""Benchmark of the pure decider and of offline replay (docs/design.md, "Performance targets").

    uv run python bench/bench_decider.py [--events 1000000] [--jobs 4] [--seed 1] [--no-docs]

Simulates coordinator traffic with the real decider (coordinator/simulation/traffic.py),
then measures:

(a) events folded per second by ``evolve`` alone, over the events in memory,
    and commands per second through ``decide`` + ``evolve``;
(b) writing the journal file (null and deflate block codecs);
(c) replaying it: read + decode (with the default reader, cavro where it is
    installed, and with fastavro side by side), read + decode + fold in this
    process, and ``python -m coordinator.cli replay --from-file F --quiet``,
    with and without ``--verify``, as subprocesses.

Prints a table and writes it into the "Pure decider" section of
docs/benchmarks.md (other sections are left alone). Wall-clock times are the
targets; CPU times are shown next to them because the machine may be shared.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import fastavro
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.cpu import code_checked, machine_line
from coordinator.core.decider import InputRejected, decide, evolve, fold_jobs
from coordinator.core.invariants import first_violation
from coordinator.core.state import JobState, initial_state
from coordinator.replay.journal import AvroReader, _cavro, read_journal_events, write_journal
from coordinator.simulation.traffic import HandledCommand, simulate_steps
from events.wire.records import JournalEvent

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
COMMAND = "uv run python bench/bench_decider.py"
DATE = datetime.date.today().isoformat()
FOLD_TARGET = 200_000
REPLAY_TARGET_S = 10.0

T = TypeVar("T")


@dataclass
class Row:
    """One measured figure."""

    what: str
    value: str
    wall_s: float | None = None
    cpu_s: float | None = None
    target: str = ""
    met: bool | None = None


def timed(fn: Callable[[], T]) -> tuple[T, float, float]:
    """``fn()``, its wall time and its CPU time (this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def best_of(runs: int, fn: Callable[[], T]) -> tuple[T, float, float]:
    """The run with the least wall time of ``runs``."""
    results = [timed(fn) for _ in range(runs)]
    return min(results, key=lambda r: r[1])


def generate(
    events: int, jobs: int, seed: int, console: Console
) -> tuple[list[HandledCommand], list[JournalEvent]]:
    """Simulate until ``events`` journal events exist; every step and the events."""
    steps: list[HandledCommand] = []
    journal: list[JournalEvent] = []
    with Progress(
        TextColumn("simulating coordinator traffic"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("events", total=events)
        for step in simulate_steps(random.Random(seed), jobs=jobs):
            steps.append(step)
            journal.extend(d for d in step.decisions if not isinstance(d, InputRejected))
            if len(steps) % 20_000 == 0:
                progress.update(task, completed=min(len(journal), events))
            if len(journal) >= events:
                break
    # Cut at exactly ``events``; the commands stay whole (the last may have decided a few more).
    return steps, journal[:events]


def decide_and_evolve(steps: list[HandledCommand]) -> dict[str, JobState]:
    """Run every command through decide and evolve, as the coordinator does."""
    states: dict[str, JobState] = {}
    for step in steps:
        command = step.command
        state = states.get(command.job_id) or initial_state(command.job_id)
        for decision in decide(state, command):
            state = evolve(state, decision)
        states[command.job_id] = state
    return states


def replay_in_process(path: Path) -> tuple[int, dict[str, JobState]]:
    """Read, decode and fold a journal file: what replay does without printing."""
    count = 0

    def events() -> Iterator[JournalEvent]:
        nonlocal count
        for event, _, _ in read_journal_events(path):
            count += 1
            yield event

    states = fold_jobs(events())
    return count, states


def drain(path: Path, reader: AvroReader | None = None) -> int:
    return sum(1 for _ in read_journal_events(path, reader=reader))


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_replay_cli(path: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], float, float, str]:
    command = [sys.executable, "-m", "coordinator.cli", "replay", "--from-file", str(path), "--quiet", *flags]
    shown = f"`python -m coordinator.cli replay --from-file {path.name} {' '.join(['--quiet', *flags])}`"
    cpu, wall = children_cpu(), time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    return completed, time.perf_counter() - wall, children_cpu() - cpu, shown


def mb(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-docs", action="store_true", help="do not update docs/benchmarks.md")
    args = parser.parse_args()
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)
    load = os.getloadavg()[0]
    code_checked()  # before the replay subprocesses start from the working directory
    console.print(f"[bold]{COMMAND}[/] (events={args.events:,}, jobs={args.jobs}, seed={args.seed})")

    steps, events = generate(args.events, args.jobs, args.seed, console)
    n = len(events)
    mix = Counter(type(e).__name__ for e in events)
    gc.collect()
    gc.freeze()  # the generated data is not part of what is measured
    rows: list[Row] = []

    # (a) evolve alone, and decide + evolve
    folded, wall, cpu = best_of(3, lambda: fold_jobs(events))
    rate = n / wall
    rows.append(
        Row(f"fold: evolve over {n:,} events in memory", f"{rate:,.0f} events/s", wall, cpu,
            f">= {FOLD_TARGET:,}/s", rate >= FOLD_TARGET)
    )  # fmt: skip
    decided, wall, cpu = best_of(1, lambda: decide_and_evolve(steps))
    assert decided == folded, "decide + evolve over the commands must give the journal's fold"
    rows.append(
        Row(
            f"decide + evolve over {len(steps):,} commands", f"{len(steps) / wall:,.0f} commands/s", wall, cpu
        )
    )
    _, wall, cpu = timed(lambda: first_violation(events))
    rows.append(
        Row(f"invariants (verify) over {n:,} events in memory", f"{n / wall:,.0f} events/s", wall, cpu)
    )
    steps.clear()
    gc.unfreeze()
    gc.collect()
    gc.freeze()

    with tempfile.TemporaryDirectory(prefix="cutline-bench-") as tmp:
        paths = {codec: Path(tmp) / f"journal-{codec}.avro" for codec in ("null", "deflate")}
        # (b) writing
        for codec, path in paths.items():
            written, wall, cpu = timed(
                lambda path=path, codec=codec: write_journal(path, events, codec=codec)
            )
            assert written == n
            rows.append(
                Row(f"write journal, {codec} codec ({mb(path)})", f"{n / wall:,.0f} events/s", wall, cpu)
            )
        events.clear()
        gc.unfreeze()
        gc.collect()
        # (c) replaying
        default = "cavro" if _cavro() is not None else "fastavro"
        for codec, path in paths.items():
            count, wall, cpu = timed(lambda path=path: drain(path))
            assert count == n
            rows.append(
                Row(f"read + decode, {codec} codec ({default})", f"{n / wall:,.0f} events/s", wall, cpu)
            )
        if default != "fastavro":
            count, wall, cpu = timed(lambda: drain(paths["null"], "fastavro"))
            assert count == n
            rows.append(Row("read + decode, null codec (fastavro)", f"{n / wall:,.0f} events/s", wall, cpu))
        (count, states), wall, cpu = timed(lambda: replay_in_process(paths["null"]))
        assert count == n and states == folded
        rows.append(
            Row(f"replay in-process: read + decode + fold {n:,} events", f"{n / wall:,.0f} events/s",
                wall, cpu,
                f"< {REPLAY_TARGET_S:.0f} s", wall < REPLAY_TARGET_S)
        )  # fmt: skip
        for flags in ((), ("--verify",)):
            completed, wall, cpu, shown = run_replay_cli(paths["null"], *flags)
            if completed.returncode != 0:
                console.print(completed.stdout[-2000:], completed.stderr[-2000:])
                raise SystemExit(f"{shown} exited {completed.returncode}")
            rows.append(
                Row(f"{shown} (subprocess)", f"{n / wall:,.0f} events/s", wall, cpu,
                    f"< {REPLAY_TARGET_S:.0f} s", wall < REPLAY_TARGET_S)
            )  # fmt: skip

    machine = (
        f"{machine_line()}, "
        f"fastavro {fastavro.__version__}, cavro {_cavro().__version__ if _cavro() else 'not installed'}, "
        f"load average {load:.1f} at start"
    )
    print_table(console, rows, machine)
    console.print(f"CPU per event: {breakdown(rows, n)}")
    if not args.no_docs:
        write_docs(rows, machine, n, args, mix)
        console.print(f"wrote {DOCS.relative_to(ROOT)}")


def breakdown(rows: list[Row], n: int) -> str:
    """CPU microseconds per event of reading + decoding, folding and verifying."""

    def cpu(prefix: str) -> float:
        row = next(r for r in rows if r.what.startswith(prefix))
        return (row.cpu_s or 0.0) / n * 1e6

    read, fold, verify = cpu("read + decode, null codec ("), cpu("fold:"), cpu("invariants")
    total = read + fold + verify
    return (
        f"read + decode {read:.1f} µs ({read / total:.0%}), fold {fold:.1f} µs ({fold / total:.0%}), "
        f"verify {verify:.1f} µs ({verify / total:.0%})"
    )


def print_table(console: Console, rows: list[Row], machine: str) -> None:
    table = Table(title=f"pure decider: {COMMAND}", caption=machine, title_justify="left")
    for column in ("measure", "rate", "wall", "cpu", "target", ""):
        table.add_column(column, justify="left" if column in ("measure", "target") else "right")
    for row in rows:
        table.add_row(
            row.what,
            row.value,
            f"{row.wall_s:.2f} s" if row.wall_s is not None else "",
            f"{row.cpu_s:.2f} s" if row.cpu_s is not None else "",
            row.target,
            "" if row.met is None else "[green]met[/]" if row.met else "[red]missed[/]",
        )
    console.print(table)


def write_docs(rows: list[Row], machine: str, n: int, args: argparse.Namespace, mix: Counter[str]) -> None:
    lines = [
        "## Pure decider",
        "",
        "```",
        f"{COMMAND} --events {n} --jobs {args.jobs} --seed {args.seed}",
        "```",
        "",
        f"Date: {DATE}. Machine: {machine}. Wall-clock times are what the targets",
        "(docs/design.md, Performance targets) are judged on; CPU times are this process's",
        "(or the subprocess's),",
        "shown because the machine is shared with other work.",
        "",
        "| measure | rate | wall | CPU | target | |",
        "|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        met = "" if row.met is None else "met" if row.met else "**missed**"
        wall = f"{row.wall_s:.2f} s" if row.wall_s is not None else ""
        cpu = f"{row.cpu_s:.2f} s" if row.cpu_s is not None else ""
        lines.append(f"| {row.what} | {row.value} | {wall} | {cpu} | {row.target} | {met} |")
    shares = ", ".join(f"{name} {count / n:.1%}" for name, count in mix.most_common())
    lines += [
        "",
        f"Journal mix ({args.jobs} jobs, 2-8 tasks each): {shares}.",
        "",
        f"Where replay's time goes (CPU per event): {breakdown(rows, n)}.",
        "",
        "What the hot path does: `read_journal_events` reads the records with cavro's compiled",
        "container reader where cavro is installed (CPython 3.11 and 3.12; fastavro elsewhere, and",
        "for files of older schemas), as dicts in schema field order, so each union branch is named",
        "by its field names (no `return_record_name` tuples); `from_avro` runs a decoder compiled",
        "once per record class that sets the frozen dataclass's slots directly; `evolve` builds",
        "each new `JobState` with a `replace` compiled from its fields (same slot-setting), and",
        "tries the three most frequent events first.",
        "",
    ]
    section = "\n".join(lines)
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n\nFigures for docs/design.md's targets.\n\n"
    pattern = re.compile(r"^## Pure decider\n.*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
    text = (
        pattern.sub(lambda _: section + "\n", text)
        if pattern.search(text)
        else text.rstrip() + "\n\n" + section
    )
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(text.rstrip() + "\n")


if __name__ == "__main__":
    main()
