"""Where the test suite's time goes: wall time, the machine's busy CPU, and CPU by kind of process.

    uv run python bench/bench_suite.py [--command "uv run pytest"] [--interval 1] [--json FILE]
        [--processes FILE]

Runs the command (by default the README's test command) from the repository's root and, every
``--interval`` seconds, reads from /proc the CPU of every process below it, by kind (Spark JVMs,
PySpark's Python workers, coordinator workers, the embedded broker, pytest itself, ...).
The machine's busy time (/proc/stat) is exact; a kind's figure misses up to one interval of each
process that ended between two reads. The floor is the busy time over the cores: no schedule of
the same work on this machine takes less wall time. Run it on an otherwise idle machine; to time
CI as it runs, ``--command "bash .ci/run"`` from a fresh clone. ``--processes FILE`` also writes
every process seen (its kind, CPU seconds and command line; one JSON object a line, most CPU first),
to find what of a kind spends.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.cpu import command_line, cpu_and_start, descendants, machine_busy, machine_line

ROOT = Path(__file__).resolve().parent.parent


def _program(command: str) -> str:
    return Path(command.split(" ", 1)[0]).name


def _has(*parts: str) -> Callable[[str], bool]:
    return lambda command: any(part in command for part in parts)


KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("Apache Kafka nodes (JVMs)", lambda c: _program(c) == "java" and " kafka.Kafka " in f"{c} "),
    ("Spark executors (JVMs)", lambda c: _program(c) == "java" and "CoarseGrainedExecutorBackend" in c),
    ("Spark drivers, daemons and Connect servers (JVMs)", lambda c: _program(c) == "java"),
    ("PySpark's Python workers", _has("pyspark")),
    ("Spark drivers started by tests (spark_tasks)", _has("spark_tasks.")),
    ("coordinator workers and watchdogs", _has("cli coordinator", "cutline coordinator", "service.watchdog")),
    ("other cutline commands (run, demo, status, ...)", _has("coordinator.cli", "bin/cutline ")),
    ("embedded broker (Tansu)", _has("tansu")),
    ("pytest and its xdist workers", _has("pytest", "sys.stdin.readline")),
    ("Node.js", lambda c: _program(c) == "node"),
    ("Chromium", _has("chrom")),
    ("uv", lambda c: _program(c) == "uv"),
)
"""A process's kind: the first whose test its command line passes (read again at every look, so
that ``spark-submit``'s shell counts as the JVM it turns into)."""


def kind_of(command: str) -> str:
    return next((name for name, test in KINDS if test(command)), "other processes below the command")


def run(command: list[str], interval: float) -> tuple[dict[str, object], list[dict[str, object]]]:
    """Run ``command`` to its end; its exit code, wall time, the machine's busy CPU and the CPU
    (and the number of processes) of each kind below it; and every process seen below it."""
    busy_before, started = machine_busy(), time.monotonic()
    child = subprocess.Popen(command, cwd=ROOT)
    # (pid, start time) -> (kind, CPU so far, command line)
    last: dict[tuple[int, int], tuple[str, float, str]] = {}
    while True:
        ended = child.poll() is not None
        for pid in descendants(child.pid) if not ended else []:
            read = cpu_and_start(pid)
            if read is not None:
                command_seen = command_line(pid)
                last[(pid, read[1])] = (kind_of(command_seen), read[0], command_seen)
        if ended:
            break
        time.sleep(interval)
    wall, busy = time.monotonic() - started, machine_busy() - busy_before
    by_kind: dict[str, list[float]] = {}
    for kind, used, _ in last.values():
        entry = by_kind.setdefault(kind, [0.0, 0])
        entry[0] += used
        entry[1] += 1
    processes = [
        {"kind": kind, "cpu_s": used, "command": seen}
        for kind, used, seen in sorted(last.values(), key=lambda process: -process[1])
    ]
    return {
        "command": shlex.join(command),
        "exit_code": child.returncode,
        "wall_s": wall,
        "busy_cpu_s": busy,
        "cores": os.cpu_count() or 1,
        "kinds": {k: {"cpu_s": v[0], "processes": int(v[1])} for k, v in by_kind.items()},
    }, processes


def report(result: dict[str, object], console: Console) -> None:
    wall, busy, cores = float(result["wall_s"]), float(result["busy_cpu_s"]), int(result["cores"])  # type: ignore[arg-type]
    kinds: dict[str, dict[str, float]] = result["kinds"]  # type: ignore[assignment]
    table = Table(title=f"CPU by kind of process: {result['command']}")
    table.add_column("kind")
    table.add_column("processes", justify="right")
    table.add_column("CPU s", justify="right")
    table.add_column("share of busy", justify="right")
    for kind, used in sorted(kinds.items(), key=lambda item: -item[1]["cpu_s"]):
        share = used["cpu_s"] / busy if busy else 0.0
        table.add_row(kind, f"{used['processes']:,.0f}", f"{used['cpu_s']:,.0f}", f"{share:.0%}")
    counted = sum(used["cpu_s"] for used in kinds.values())
    rest = max(0.0, busy - counted)
    table.add_row("the rest (other processes; ends between two looks)", "", f"{rest:,.0f}", "")
    console.print(table)
    minutes, seconds = divmod(round(wall), 60)
    console.print(
        f"exit code {result['exit_code']}; wall {minutes} min {seconds} s; machine busy "
        f"{busy:,.0f} CPU s of {wall * cores:,.0f} ({busy / (wall * cores):.0%} of {cores} cores); "
        f"floor (busy / cores) {busy / cores / 60:.1f} min"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--command", default="uv run pytest", help="what to run, from the repository's root")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between two looks at /proc")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--processes", type=Path, help="also write every process seen to this file")
    args = parser.parse_args()
    console = Console()
    console.print(machine_line())
    command = shlex.split(args.command)
    if not command or shutil.which(command[0]) is None:
        parser.error(
            f"{command[0] if command else 'an empty --command'!r} is not a program on PATH: give another "
            '--command, or put it on PATH (uv: `export PATH="$HOME/.local/bin:$PATH"`)'
        )
    result, processes = run(command, args.interval)
    report(result, console)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.processes:
        args.processes.write_text("".join(json.dumps(process) + "\n" for process in processes))
    raise SystemExit(result["exit_code"])


if __name__ == "__main__":
    main()
