"""SIGTERM at 20 random moments of each long-running command: how long each takes to stop.

    uv run python bench/bench_sigterm.py [--moments 20] [--seed 34] [--only broker coordinator run demo]

Each command runs as a background job of a non-interactive shell (``bash -c 'cmd & ...'``, so
with SIGINT ignored) and gets a SIGTERM at a moment drawn (seeded) over its start-up and its
running: ``cutline broker`` in 0-1.5 s, ``cutline coordinator`` (its watchdog and Faust worker,
on a broker this script starts) in 0-6 s, ``cutline run`` (a driver that started a child of its
own) in 0-3 s, ``cutline demo`` (its own broker, coordinator, ``cutline run`` and Spark driver)
in 0-25 s. One run at a time. For each it records the time from the SIGTERM to the exit and the
processes left behind (``events.dev.stop_check``); the target is every exit within 10 s and nothing
left. ``tests/integration/test_sigterm.py`` runs fewer moments of the same.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.cpu import machine_line
from events.dev.broker import EmbeddedBroker, create_topics, free_port
from events.dev.stop_check import StopResult, sigterm_at
from events.wire.topics import Topics

CUTLINE = str(Path(sys.executable).parent / "cutline")
LIMIT_S = 10.0
SPANS = {"broker": 1.5, "coordinator": 6.0, "run": 3.0, "demo": 25.0}


def commands(name: str, count: int, bootstrap: str, workdir: Path) -> list[list[str]]:
    if name == "broker":
        return [[CUTLINE, "broker"]] * count
    if name == "coordinator":
        return [
            [CUTLINE, "coordinator", "--bootstrap", bootstrap, "--topic-prefix", f"bsig{i}.",
             "--web-port", str(free_port()), "--data-dir", str(workdir / f"data-{i}")]
            for i in range(count)
        ]  # fmt: skip
    if name == "run":
        create_topics(bootstrap, Topics("bsig-run.").all)
        return [
            [CUTLINE, "run", "--job", f"sig-{i}", "--bootstrap", bootstrap, "--topic-prefix", "bsig-run.",
             "--", "sh", "-c", "sleep 600 & sleep 600"]
            for i in range(count)
        ]  # fmt: skip
    return [[CUTLINE, "demo"]] * count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--moments", type=int, default=20)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--only", nargs="+", choices=list(SPANS), default=list(SPANS))
    args = parser.parse_args()
    console = Console()
    console.print(machine_line())
    env = {k: v for k, v in os.environ.items() if k != "CUTLINE_BOOTSTRAP"}
    env.setdefault("CUTLINE_SESSION_TIMEOUT", "3")
    results: dict[str, list[StopResult]] = {}
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-sigterm-") as tmp:
        workdir = Path(tmp)
        with Progress(console=console) as progress:
            for name in args.only:
                rng = random.Random(f"{args.seed}-{name}")
                moments = [rng.uniform(0.0, SPANS[name]) for _ in range(args.moments)]
                task = progress.add_task(name, total=len(moments))
                results[name] = []
                for i, (argv, moment) in enumerate(
                    zip(commands(name, len(moments), broker.bootstrap, workdir), moments, strict=True)
                ):
                    log = workdir / f"{name}-{i}.log"
                    result = sigterm_at(argv, moment, limit=LIMIT_S, env=env, log=log)
                    results[name].append(result)
                    if not result.ok:
                        progress.console.print(f"[red]{name} at {moment:.2f} s: {result}[/]")
                        progress.console.print(log.read_text(errors="replace")[-2000:])
                    progress.advance(task)
    table = Table(title=f"exit after SIGTERM (s), {args.moments} moments each, seed {args.seed}")
    columns = ("command", "moments (s)", "median", "p90", "max", "over 10 s", "left behind", "SIGINT ign.")
    for column in columns:
        table.add_column(column, justify="left" if column == "command" else "right")
    for name, found in results.items():
        times = sorted(r.exited_after for r in found if r.exited_after is not None)
        p90 = times[max(0, int(len(times) * 0.9) - 1)] if times else float("nan")
        table.add_row(
            name,
            f"0-{SPANS[name]:g}",
            f"{statistics.median(times):.2f}" if times else "-",
            f"{p90:.2f}",
            f"{max(times):.2f}" if times else "-",
            str(sum(r.exited_after is None for r in found)),
            str(sum(bool(r.left) for r in found)),
            f"{sum(r.sigint_ignored for r in found)}/{len(found)}",
        )
    console.print(table)
    if any(not r.ok for found in results.values() for r in found):
        sys.exit(1)


if __name__ == "__main__":
    main()
