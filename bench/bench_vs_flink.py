"""Checkpoint latency, cutline next to Flink's MiniCluster, side by side in one run
(docs/design.md, "Performance targets").

    uv run python bench/bench_vs_flink.py [--quick] [--participants 2 8] [--checkpoints 100]
                                          [--brokers tansu kafka] [--modes thread shared]
                                          [--storage files inline] [--kills 2]
                                          [--flink-python PATH] [--anchor PATH] [--json OUT]

For each size N (2 and 8), one after the other so that both systems see the same machine:

- **cutline, N participants**: a broker (``--brokers``: the embedded Tansu, and Apache Kafka itself
  from its Maven Central jars, a row each) and one ``cutline coordinator`` (Faust) process are
  started for the row, N real participants run as threads of this process, a
  checkpoint is triggered every ``--interval-ms``; after ``--warmup`` checkpoints,
  ``--checkpoints`` are measured. Latency is ``CheckpointCompleted.duration_ms`` (trigger →
  completed, the coordinator's clock). This is ``bench_coordinator.bench_latency``, the latency
  part of ``bench/bench_coordinator.py``. The broker and the coordinator are stopped after the row.
  Two rows per size (``--modes``): each participant with a consumer and a producer of its own
  (``thread``), and the participants sharing one feed and one producer (``shared``,
  :class:`events.kafka.feed.SharedJobFeed`), as the subtasks of one Flink TaskManager share its network
  stack. ``--storage`` chooses how the participants' 1 KiB snapshots are kept: an fsynced file
  each (``files``, the default), or inline in the ack (``inline``: the job's
  ``inline_threshold_bytes`` is 20 KiB, Flink's default memory threshold, below which Flink too
  keeps state in the checkpoint's metadata instead of files); both gives a row of each.
- **Flink, parallelism N**: ``../shared/anchors/flink_checkpoint_latency.py`` (Flink 2.3
  MiniCluster: datagen → keyed SUM → blackhole, a checkpoint every ``--interval-ms``), run in a
  scratch venv (never a project dependency). Its own summary line covers every checkpoint of the
  run, the first (slow, start-up) ones included; the same ``checkpointDuration`` values are read
  from Flink's log again: after the first ``--warmup``, the next ``--checkpoints`` (as many as
  cutline's row), with the same percentile as cutline's. That like-for-like row is what the target
  is judged on. The anchor runs long enough for them (``--flink-seconds``; the MiniCluster's start
  counts in it).

- **failover, on each broker** (``--kills`` rounds, 0 leaves it out): ``bench/bench_recovery.py``'s
  failover on that broker: 3 ``cutline coordinator`` workers, 6 jobs of 3 participant threads, a
  checkpoint every 200 ms; each round SIGKILLs the worker process that owns a job while one of its
  checkpoints is pending, and times the kill → the new owner's claim → every job of the killed
  worker completing a checkpoint again (target: within the session timeout + 2 s). Flink's anchor
  has no failover to set beside it.

Order: cutline 2 (each broker and mode), Flink 2, cutline 8 (each broker and mode), Flink 8
(``--rounds`` repeats it), then failover on each broker. When the anchor fails at a size, the
cutline rows of that size are kept, printed and written with why (the table's Flink row says
``failed: ...``); whatever stops the run, the rows measured before are printed (and written).
The target (docs/design.md, "Performance targets"): cutline's p50 and p99 at or below Flink's at the same
size in the same run.

Where Flink comes from: ``--flink-python`` (or ``$CUTLINE_FLINK_PYTHON``) names a Python with
``apache-flink==2.3.0``; without it the venv ``/tmp/cutline-flink-venv`` is made (``uv venv
--python 3.11``) or reused. ``--anchor`` (or ``$CUTLINE_FLINK_ANCHOR``) names the anchor script,
by default ``../shared/anchors/flink_checkpoint_latency.py`` beside the checkout. Java 11 or 17 must
be on the PATH.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.bench_coordinator import (
    BROKERS,
    LatencyResult,
    bench_latency,
    breakdown_table,
    broker,
    make_topics,
    mean,
    percentile,
    slowest_lines,
)
from bench.cpu import code_checked, cpu_model, descendants, machine_busy, machine_line, process_cpu
from coordinator.service.supervisor import CoordinatorProcess

COMMAND = "uv run python bench/bench_vs_flink.py"
ROOT = Path(__file__).resolve().parents[1]
ANCHOR = Path(
    os.environ.get("CUTLINE_FLINK_ANCHOR")
    or ROOT.parent / "shared" / "anchors" / "flink_checkpoint_latency.py"
)
"""The Flink anchor script (``--anchor``): ``$CUTLINE_FLINK_ANCHOR``, else the one beside the checkout."""
FLINK_VENV = Path("/tmp/cutline-flink-venv")
"""The scratch venv made for Flink when neither ``--flink-python`` nor ``$CUTLINE_FLINK_PYTHON`` names one."""
FLINK_VERSION = "2.3.0"
ANCHOR_LINE = re.compile(r"flink par=(\d+) n=(\d+) p50=(\d+) p90=(\d+) p99=(\d+) max=(\d+) ms")
COMPLETED_LINE = re.compile(r"Completed checkpoint (\d+) .*checkpointDuration=(\d+) ms")


def load() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


# ------------------------------------------------------------------ Flink


class FlinkUnavailable(RuntimeError):
    """Flink cannot run here (no Java, no venv, the install failed): the message says what to do."""


def flink_python(given: str | None, console: Console) -> Path:
    """A Python with apache-flink==FLINK_VERSION: ``given``, or the scratch venv (made if needed)."""
    if shutil.which("java") is None:
        raise FlinkUnavailable("no `java` on the PATH: Flink's MiniCluster needs Java 11 or 17")
    if given:
        python = Path(given)
        if not _has_flink(python):
            raise FlinkUnavailable(f"{python} cannot import pyflink {FLINK_VERSION}")
        return python
    python = FLINK_VENV / "bin" / "python"
    if _has_flink(python):
        return python
    uv = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    steps = [
        [uv, "venv", "--python", "3.11", str(FLINK_VENV)],
        [uv, "pip", "install", "--python", str(python), f"apache-flink=={FLINK_VERSION}"],
    ]
    console.print(f"making the Flink venv {FLINK_VENV} (about 320 MB, once)")
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise FlinkUnavailable(
                f"`{' '.join(step)}` failed ({done.returncode}):\n{done.stderr[-2000:]}\n"
                f"Install apache-flink=={FLINK_VERSION} into a Python 3.11 venv by hand and pass "
                "its python with --flink-python."
            )
    if not _has_flink(python):
        raise FlinkUnavailable(f"{python} still cannot import pyflink {FLINK_VERSION} after the install")
    return python


def _has_flink(python: Path) -> bool:
    if not python.exists():
        return False
    probe = "import pyflink.version as v; print(v.__version__)"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=False)
    return done.returncode == 0 and done.stdout.strip() == FLINK_VERSION


def flink_log_dir(python: Path) -> Path:
    """Where the MiniCluster logs (the anchor reads its checkpoints from there too)."""
    probe = "import os, pyflink; print(os.path.join(os.path.dirname(pyflink.__file__), 'log'))"
    return Path(
        subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    )


@dataclass
class FlinkResult:
    parallelism: int
    anchor: dict[str, int]
    """The anchor's own summary line: n, p50, p90, p99, max (ms) over every checkpoint of its run."""
    durations: list[int]
    """checkpointDuration of as many checkpoints as cutline's row measures, after the same warm-up, by
    checkpoint id (from the same log)."""
    warmup: int
    logged: int
    """Checkpoints Flink logged as completed during the run (the anchor's n should be the same)."""
    cpu: dict[str, float]
    load_at_start: tuple[float, float, float]
    wall_s: float


def _completed_checkpoints(logdir: Path, since: datetime) -> dict[int, int]:
    """checkpoint id → checkpointDuration (ms) of what Flink logged at or after ``since``.

    By the time each line carries, not by where the file was before the run (as the anchor does):
    each MiniCluster rewrites ``flink-*-python-vm.log`` from its start, so a run whose log grows
    past the length of the previous run's would lose its first lines to a seek."""
    found: dict[int, int] = {}
    for f in logdir.glob("*.log"):
        with f.open(errors="replace") as handle:
            for line in handle:
                m = COMPLETED_LINE.search(line)
                if m is None:
                    continue
                try:
                    logged = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                except ValueError:
                    continue
                if logged >= since:
                    found[int(m.group(1))] = int(m.group(2))
    return found


def run_flink(
    python: Path,
    anchor: Path,
    parallelism: int,
    seconds: int,
    interval_ms: int,
    warmup: int,
    checkpoints: int,
    scratch: Path,
) -> FlinkResult:
    logdir = flink_log_dir(python)
    since = datetime.now().replace(microsecond=0)  # Flink logs local time, to the ms
    at_start = load()
    command = [
        str(python), str(anchor), "--parallelism", str(parallelism), "--seconds", str(seconds),
        "--interval-ms", str(interval_ms),
    ]  # fmt: skip
    busy, wall = machine_busy(), time.monotonic()
    # The anchor and the JVM it starts: their CPU, sampled while they run (the JVM is not always
    # reaped by the anchor, so the children's times of this process would miss it).
    used: dict[int, float] = {}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=scratch
    ) as process:
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(process.communicate()[0]), daemon=True)
        reader.start()
        deadline = time.monotonic() + seconds + 600
        while reader.is_alive() and time.monotonic() < deadline:
            for pid in descendants(os.getpid()):
                used[pid] = max(used.get(pid, 0.0), process_cpu(pid))
            reader.join(0.5)
        if reader.is_alive():
            process.kill()
            reader.join(10)
    cpu = {"flink": sum(used.values()), "machine": machine_busy() - busy, "wall": time.monotonic() - wall}
    cpu["other processes"] = max(0.0, cpu["machine"] - cpu["flink"])
    stdout = out[0] if out else ""
    line = ANCHOR_LINE.search(stdout)
    if process.returncode != 0 or line is None:
        raise RuntimeError(f"the Flink anchor failed ({process.returncode}):\n{stdout[-3000:]}")
    names = ("parallelism", "n", "p50", "p90", "p99", "max")
    summary = dict(zip(names, map(int, line.groups()), strict=True))
    by_id = _completed_checkpoints(logdir, since)
    return FlinkResult(
        parallelism=parallelism,
        anchor={k: v for k, v in summary.items() if k != "parallelism"},
        durations=[by_id[i] for i in sorted(by_id)[warmup : warmup + checkpoints]],
        warmup=warmup,
        logged=len(by_id),
        cpu=cpu,
        load_at_start=at_start,
        wall_s=cpu["wall"],
    )


# ---------------------------------------------------------------- cutline


@dataclass
class CutlineRow:
    result: LatencyResult
    mode: str
    """``thread``: a feed and a producer per participant; ``shared``: one of each for all."""
    load_at_start: tuple[float, float, float]
    setup_s: float
    broker: str = "tansu"
    """The broker of the row: ``tansu`` or ``kafka`` (:data:`bench.bench_coordinator.BROKERS`)."""

    @property
    def storage(self) -> str:
        return self.result.storage


def run_cutline(
    n: int,
    mode: str,
    checkpoints: int,
    warmup: int,
    interval_ms: int,
    scratch: Path,
    console: Console,
    inline_threshold_bytes: int = 0,
    broker_kind: str = "tansu",
) -> CutlineRow:
    """One latency row on a broker (``broker_kind``) and a coordinator of its own (both stopped
    afterwards)."""
    at_start = load()
    started = time.monotonic()
    with broker(broker_kind) as (bootstrap, _, broker_pid):
        topics = make_topics(bootstrap, f"vs-flink-{n}")
        coordinator = CoordinatorProcess(
            bootstrap,
            topics.prefix,
            log_path=scratch / f"coordinator-{n}-{time.time_ns()}" / "coordinator.log",
        )
        coordinator.start(timeout=120)
        setup = time.monotonic() - started
        try:
            result = bench_latency(
                bootstrap, topics, coordinator, n, mode, checkpoints, warmup, interval_ms, scratch,
                console, broker_pid, inline_threshold_bytes=inline_threshold_bytes,
            )  # fmt: skip
        finally:
            coordinator.stop()
    return CutlineRow(result, mode, at_start, setup, broker_kind)


# ---------------------------------------------------------------- failover


@dataclass
class FailoverRow:
    """The failover rounds on one broker (``bench.bench_recovery.Kill`` each), or why they stopped."""

    broker: str
    kills: list[Any]
    session_timeout: float
    load_at_start: tuple[float, float, float]
    failure: str | None = None

    @property
    def target_s(self) -> float:
        return self.session_timeout + FAILOVER_MARGIN_S


FAILOVER_MARGIN_S = 2.0
"""Target: a killed worker's jobs complete checkpoints again within the session timeout + this."""


def run_failover(kind: str, kills: int, scratch: Path, console: Console) -> FailoverRow:
    """``bench/bench_recovery.py``'s failover on a broker of ``kind``: 3 workers, 6 jobs of 3
    participants, ``kills`` SIGKILLs of a job's owner (its worker process), a replacement between
    rounds."""
    # Imported here: bench_recovery imports the coordinator's Faust app, which the latency rows'
    # process (their participants) must not carry.
    from bench.bench_recovery import Cluster, kill_one
    from coordinator.service.app import Settings

    settings = argparse.Namespace(
        workers=3, jobs=6, tasks=3, interval_ms=200, timeout_ms=4_000,
        session_timeout=Settings.session_timeout, worker_loglevel="warning",
    )  # fmt: skip
    row = FailoverRow(kind, [], Settings.session_timeout, load())
    directory = scratch / f"failover-{kind}-{time.time_ns()}"
    directory.mkdir(parents=True)
    try:
        with broker(kind) as (bootstrap, _, _pid):
            cluster = Cluster(bootstrap, settings, directory)
            try:
                cluster.wait_completions(3, timeout=120)
                for i in range(kills):
                    job = cluster.jobs[i % len(cluster.jobs)]
                    kill = kill_one(cluster, job, timeout=120, what="worker")
                    row.kills.append(kill)
                    console.print(
                        f"  round {i + 1}: killed the owner of {job} (pid {kill.victim_pid}, "
                        f"{len(kill.victim_jobs)} jobs): new claim after {kill.claim_s:.2f} s, all its jobs "
                        f"completed again after {kill.all_s:.2f} s"
                    )
                    if i + 1 < kills:
                        cluster.start_workers(1)  # the replacement; the group rebalances onto it
                        time.sleep(3.0)
                        cluster.wait_completions(3, timeout=120)
            finally:
                cluster.close()
    except Exception as exc:  # keep the rounds measured before, and say why the rest is missing
        row.failure = f"{type(exc).__name__}: {str(exc)[:300]}"
        console.print(f"  [bold red]failover on {BROKERS[kind]} stopped:[/] {row.failure}")
    return row


def failover_table(rows: list[FailoverRow]) -> Table:
    table = Table(
        title="Failover: SIGKILL of a job's owner (its worker process) among 3 workers, "
        "seconds after the kill",
        title_justify="left",
    )
    for col in ("broker", "round", "load at start", "→ new claim", "→ job completes again",
                "→ all its jobs", "target", ""):  # fmt: skip
        table.add_column(col, justify="left" if col in ("broker", "load at start", "") else "right")
    for row in rows:
        for i, k in enumerate(row.kills, 1):
            table.add_row(
                f"cutline (Faust, {BROKERS.get(row.broker, row.broker)})", f"{i}",
                "/".join(f"{v:.2f}" for v in row.load_at_start), f"{k.claim_s:.2f}", f"{k.job_s:.2f}",
                f"{k.all_s:.2f}", f"≤ {row.target_s:g}",
                "met" if k.all_s <= row.target_s else "[bold red]missed[/]",
            )  # fmt: skip
        if row.failure is not None:
            table.add_row(BROKERS.get(row.broker, row.broker), "", "", f"[bold red]stopped: {row.failure}[/]")
        table.add_section()
    return table


def failover_json(rows: list[FailoverRow]) -> list[dict[str, Any]]:
    return [
        {
            "broker": row.broker, "session_timeout_s": row.session_timeout, "target_s": row.target_s,
            "load_at_start": row.load_at_start, "failure": row.failure,
            "kills": [{"claim_s": k.claim_s, "job_s": k.job_s, "all_s": k.all_s, "jobs": len(k.victim_jobs),
                       "load_at_kill": k.load_at_kill} for k in row.kills],
        }
        for row in rows
    ]  # fmt: skip


# ------------------------------------------------------------------ report


def _figures(durations: list[int]) -> tuple[float, float, float, float]:
    return (
        percentile(durations, 50),
        percentile(durations, 90),
        percentile(durations, 99),
        float(max(durations)) if durations else float("nan"),
    )


def verdict(ours: list[int], theirs: tuple[float, float]) -> str:
    p50, p99 = percentile(ours, 50), percentile(ours, 99)
    missed = [
        name for name, mine, limit in (("p50", p50, theirs[0]), ("p99", p99, theirs[1])) if mine > limit
    ]
    return "met" if not missed else f"[bold red]{' and '.join(missed)} missed[/]"


MODES = {"thread": "a feed each", "shared": "one shared feed"}
STORAGE = {"files": 0, "inline": 20_480}
"""``CheckpointConfig.inline_threshold_bytes`` per storage: 20 KiB is Flink's default
``state.storage.fs.memory-threshold``."""


def _alone_json(ours: CutlineRow, failure: str) -> dict[str, Any]:
    """A cutline row of a size whose Flink anchor failed: its own figures, and why there is no anchor."""
    r = ours.result
    p50, p90, p99, top = _figures(r.durations)
    return {
        "size": r.participants, "broker": ours.broker, "mode": ours.mode, "storage": ours.storage,
        "cutline": {"n": len(r.durations), "p50": p50, "p90": p90, "p99": p99, "max": top,
                    "durations": r.durations, "cpu_s": r.cpu, "load_at_start": ours.load_at_start},
        "flink": {"failed": failure}, "target_met": None,
    }  # fmt: skip


def side_by_side(pairs: list[tuple[list[CutlineRow], FlinkResult | str]]) -> Table:
    table = Table(title="Checkpoint latency, trigger → completed, side by side (ms)", title_justify="left")
    left = ("system", "size", "load at start")
    for col in ("system", "size", "n", "p50", "p90", "p99", "max", "mean", *left[2:],
                "CPU %: own", "others", "≤ Flink p50 / p99", ""):  # fmt: skip
        table.add_column(col, justify="left" if col in left else "right")
    for rows, flink in pairs:
        like = _figures(flink.durations) if isinstance(flink, FlinkResult) else (math.nan,) * 4
        for ours in rows:
            r = ours.result
            p50, p90, p99, top = _figures(r.durations)
            own = sum(r.cpu[k] for k in ("coordinator", "broker", "participants"))
            table.add_row(
                f"cutline (Faust, {BROKERS.get(ours.broker, ours.broker)})",
                f"{r.participants} participants, {MODES.get(ours.mode, ours.mode)}, {ours.storage}",
                f"{len(r.durations)}",
                f"{p50:.0f}", f"{p90:.0f}", f"{p99:.0f}", f"{top:.0f}", f"{mean(r.durations):.1f}",
                "/".join(f"{v:.2f}" for v in ours.load_at_start),
                f"{own / r.wall_s:.0%}",
                f"{r.cpu['other processes'] / r.wall_s:.0%}",
                f"{like[0]:.0f} / {like[2]:.0f}" if isinstance(flink, FlinkResult) else "-",
                verdict(r.durations, (like[0], like[2])) if isinstance(flink, FlinkResult) else "no anchor",
            )  # fmt: skip
        if not isinstance(flink, FlinkResult):  # the anchor failed: the cutline rows stand alone
            table.add_row("Flink 2.3 MiniCluster", f"[bold red]failed: {flink}[/]", *([""] * 11))
            table.add_section()
            continue
        a = flink.anchor
        table.add_row(
            "Flink 2.3 MiniCluster",
            f"par. {flink.parallelism}, after {flink.warmup} warm-up",
            f"{len(flink.durations)}",
            *(f"{v:.0f}" for v in like),
            f"{mean(flink.durations):.1f}",
            "/".join(f"{v:.2f}" for v in flink.load_at_start),
            f"{flink.cpu['flink'] / flink.wall_s:.0%}",
            f"{flink.cpu['other processes'] / flink.wall_s:.0%}",
            "",
            "",
        )
        table.add_row(
            "  (anchor's own line)",
            f"par. {flink.parallelism}, all",
            f"{a['n']}" if a["n"] == flink.logged else f"[bold red]{a['n']} of {flink.logged}[/]",
            f"{a['p50']}", f"{a['p90']}", f"{a['p99']}", f"{a['max']}", "", "", "", "", "", "",
        )  # fmt: skip
        table.add_section()
    return table


def as_json(pairs: list[tuple[list[CutlineRow], FlinkResult | str]], meta: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for ours_rows, flink in pairs:
        if not isinstance(flink, FlinkResult):
            rows += [_alone_json(ours, flink) for ours in ours_rows]
            continue
        f50, f90, f99, fmax = _figures(flink.durations)
        for ours in ours_rows:
            r = ours.result
            p50, p90, p99, top = _figures(r.durations)
            rows.append(
                {
                    "size": r.participants,
                    "broker": ours.broker,
                    "mode": ours.mode,
                    "storage": ours.storage,
                    "inline_threshold_bytes": r.inline_threshold_bytes,
                    "cutline": {
                        "n": len(r.durations), "p50": p50, "p90": p90, "p99": p99, "max": top,
                        "mean": mean(r.durations), "aborted": r.aborted, "declined": r.declined,
                        "durations": r.durations, "cpu_s": r.cpu, "load_at_start": ours.load_at_start,
                        "setup_s": ours.setup_s,
                    },
                    "flink": {
                        "n": len(flink.durations), "p50": f50, "p90": f90, "p99": f99, "max": fmax,
                        "mean": mean(flink.durations), "warmup_dropped": flink.warmup,
                        "durations": flink.durations, "anchor_line": flink.anchor, "logged": flink.logged,
                        "cpu_s": flink.cpu,
                        "load_at_start": flink.load_at_start,
                    },
                    "target_met": p50 <= f50 and p99 <= f99,
                    "target_met_against_anchor_line": (
                        p50 <= flink.anchor["p50"] and p99 <= flink.anchor["p99"]
                    ),
                }
            )  # fmt: skip
    return {**meta, "rows": rows}


# ------------------------------------------------------------------ main


def _flink_row(
    python: Path,
    anchor: Path,
    n: int,
    seconds: int,
    args: argparse.Namespace,
    warmup: int,
    checkpoints: int,
    scratch: Path,
) -> FlinkResult | str:
    """The anchor's row at parallelism ``n``, or why it failed (one anchor failure used to lose
    every cutline row of the run)."""
    try:
        return run_flink(python, anchor, n, seconds, args.interval_ms, warmup, checkpoints, scratch)
    except Exception as exc:  # the anchor is a program of its own: any failure of it is reported
        return f"{type(exc).__name__}: {str(exc)[:300]}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run (about 3 min)")
    parser.add_argument("--participants", type=int, nargs="+", default=[2, 8], help="sizes (2 8)")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=tuple(MODES),
        default=list(MODES),
        help="cutline rows per size: participant threads with a feed and a producer each (thread), "
        "or sharing one of each (shared); default both",
    )
    parser.add_argument(
        "--checkpoints", type=int, help="measured cutline checkpoints per row (100; quick 20)"
    )
    parser.add_argument("--warmup", type=int, help="first checkpoints left out on both sides (5; quick 3)")
    parser.add_argument("--interval-ms", type=int, default=200, help="checkpoint interval of both systems")
    parser.add_argument(
        "--flink-seconds",
        type=int,
        help="how long the anchor runs each Flink job (default: long enough for warm-up + checkpoints)",
    )
    parser.add_argument(
        "--storage",
        nargs="+",
        choices=tuple(STORAGE),
        default=["files"],
        help="cutline rows per size and mode: each 1 KiB snapshot an fsynced file (files), or inline in "
        "the ack below Flink's default memory threshold of 20 KiB (inline), as the anchor's Flink job "
        "keeps its small state; default files",
    )
    parser.add_argument(
        "--brokers",
        nargs="+",
        choices=tuple(BROKERS),
        default=list(BROKERS),
        help="the broker of the cutline rows: the embedded Tansu and Apache Kafka itself (default: both, "
        "each started for its row)",
    )
    parser.add_argument(
        "--kills",
        type=int,
        help="failover rounds on each broker after the latency rows (2; quick 1; 0: none)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="repeat the interleaved sequence")
    parser.add_argument(
        "--stages",
        action="store_true",
        help="also show where each row's time went, stage by stage along the critical path",
    )
    parser.add_argument(
        "--flink-python",
        default=os.environ.get("CUTLINE_FLINK_PYTHON"),
        help=f"a Python with apache-flink=={FLINK_VERSION} (default: $CUTLINE_FLINK_PYTHON, else the "
        f"scratch venv {FLINK_VENV}, made if missing)",
    )
    parser.add_argument(
        "--anchor",
        default=str(ANCHOR),
        help=f"the Flink anchor script (default: $CUTLINE_FLINK_ANCHOR, else {ANCHOR})",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the figures (and every duration) as JSON")
    args = parser.parse_args()
    args.checkpoints = args.checkpoints or (20 if args.quick else 100)
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    args.kills = args.kills if args.kills is not None else (1 if args.quick else 2)
    # The anchor runs for a fixed time, the MiniCluster's start included: long enough for warm-up +
    # checkpoints with room to spare (a busy machine, checkpoints slower than the interval); as
    # many as cutline's row measures are kept.
    args.flink_seconds = (
        args.flink_seconds or int((args.warmup + args.checkpoints) * args.interval_ms / 1000 * 1.5) + 15
    )
    return args


Pairs = list[tuple[list[CutlineRow], FlinkResult | str]]


def measure_sizes(
    args: argparse.Namespace, python: Path, scratch: Path, console: Console, pairs: Pairs
) -> None:
    """The interleaved latency rows, appended to ``pairs`` as they are measured (a size whose Flink row
    was not reached says so)."""
    for round_ in range(1, args.rounds + 1):
        for n in args.participants:
            rows: list[CutlineRow] = []
            pairs.append((rows, "not run: the run stopped before it"))
            combinations = [(b, m, s) for b in args.brokers for m in args.modes for s in args.storage]
            for broker_kind, mode, storage in combinations:
                console.print(
                    f"[bold]round {round_}[/]: cutline on {BROKERS[broker_kind]}, {n} participants "
                    f"(threads, {MODES[mode]}, {storage}), load {load()}"
                )
                ours = run_cutline(
                    n, mode, args.checkpoints, args.warmup, args.interval_ms, scratch, console,
                    STORAGE[storage], broker_kind,
                )  # fmt: skip
                r = ours.result
                console.print(
                    f"  {len(r.durations)} measured, {r.aborted} aborted, {r.declined} declined; "
                    f"p50 {percentile(r.durations, 50):.0f} / p99 {percentile(r.durations, 99):.0f} ms"
                )
                for line in slowest_lines([r]):
                    console.print(line, highlight=False, soft_wrap=True)
                rows.append(ours)
            seconds = args.flink_seconds
            console.print(f"[bold]round {round_}[/]: Flink, parallelism {n}, {seconds} s, load {load()}")
            flink = _flink_row(
                python, Path(args.anchor), n, seconds, args, args.warmup, args.checkpoints, scratch
            )
            pairs[-1] = (rows, flink)
            if isinstance(flink, FlinkResult):
                a = flink.anchor
                console.print(
                    f"  anchor: flink par={n} n={a['n']} p50={a['p50']} p90={a['p90']} p99={a['p99']} "
                    f"max={a['max']} ms; {len(flink.durations)} after the warm-up"
                )
            else:  # the cutline rows of the size are kept and printed all the same
                console.print(f"  [bold red]the Flink anchor failed:[/] {flink}")


def report(
    args: argparse.Namespace,
    pairs: Pairs,
    failovers: list[FailoverRow],
    at_start: tuple[float, float, float],
    started: float,
    console: Console,
) -> None:
    """The tables of what was measured (and the JSON file)."""
    if pairs and args.stages:
        console.print(breakdown_table([row.result for rows, _ in pairs for row in rows]))
    if pairs:
        console.print(side_by_side(pairs))
        console.print(
            "cutline: CheckpointCompleted.duration_ms; Flink: checkpointDuration from its log. Percentiles "
            "of the cutline and 'after warm-up' rows by nearest rank; the anchor's line uses its own "
            "(sorted\\[int(q·n)]) over every checkpoint, the first (start-up) ones included ('n of m': it "
            "read only the last n of the m checkpoints Flink logged). CPU in % of one core over the row: "
            "'own' is cutline's coordinator, broker and this process (the participants), or the anchor and "
            "its JVM; 'others' is the rest of the machine; load: the 1, 5 and 15 min load averages."
        )
    if failovers:
        console.print(failover_table(failovers))
    end = load()
    console.print(f"total {time.monotonic() - started:.0f} s, load average {end} at the end")
    if not args.json:
        return
    meta = {
        "command": COMMAND + (" --quick" if args.quick else ""),
        "date": datetime.now().isoformat(timespec="seconds"),
        "machine": {
            "cores": os.cpu_count(),
            "arch": platform.machine(),
            "python": platform.python_version(),
            "cpu": cpu_model(),
        },
        "load_at_start": at_start,
        "load_at_end": end,
        "interval_ms": args.interval_ms,
        "warmup": args.warmup,
        "flink_seconds": args.flink_seconds,
        "failover": failover_json(failovers),
    }
    Path(args.json).write_text(json.dumps(as_json(pairs, meta), indent=1, default=list))
    console.print(f"figures written to {args.json}")


def main() -> None:
    args = parse_args()
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=220)
    if not Path(args.anchor).exists():
        console.print(
            f"[bold red]no Flink anchor at {args.anchor}[/] (pass --anchor PATH or set CUTLINE_FLINK_ANCHOR)"
        )
        sys.exit(2)
    try:
        python = flink_python(args.flink_python, console)
    except FlinkUnavailable as exc:
        console.print(f"[bold red]Flink cannot run:[/] {exc}")
        sys.exit(2)
    at_start = load()
    console.print(
        f"[bold]{COMMAND}[/]{' --quick' if args.quick else ''}: {machine_line()}, "
        f"code from {code_checked()}, load average {at_start} at start; Flink {FLINK_VERSION} from "
        f"{python} with {args.anchor}; {args.checkpoints} checkpoints after {args.warmup} (cutline), the "
        f"anchor runs {args.flink_seconds} s per row"
    )
    started = time.monotonic()
    pairs: Pairs = []
    failovers: list[FailoverRow] = []
    with tempfile.TemporaryDirectory(prefix="cutline-vs-flink-") as tmp:
        scratch = Path(tmp)
        try:
            measure_sizes(args, python, scratch, console, pairs)
            for broker_kind in args.brokers if args.kills > 0 else []:
                console.print(
                    f"[bold]failover[/] on {BROKERS[broker_kind]}: 3 workers, 6 jobs of 3 participants, "
                    f"{args.kills} kills, load {load()}"
                )
                failovers.append(run_failover(broker_kind, args.kills, scratch, console))
        finally:  # whatever stopped the run, the rows measured before it are printed and written
            report(args, pairs, failovers, at_start, started, console)


if __name__ == "__main__":
    main()
