"""``cutline demo``: a word count over Kafka that checkpoints with cutline, crashes and restores.

Starts the embedded broker (unless given one) and the coordinator, produces a
stream of words, runs a word-count job (one task per input partition, plain
Kafka consumers with the participant library) with checkpoints every second,
shows a live table of checkpoints, kills the job with SIGKILL after a few
completed checkpoints, starts it again from the latest completed checkpoint,
and at the end checks exactly-once: the job's counts equal the words produced.

The job runs in its own process (``python -m coordinator.demo job ...``) so
the crash is a real one.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from coordinator.supervisor import CoordinatorProcess
from events.broker import EmbeddedBroker, create_topics, wait_for_broker
from events.kafka import producer_config
from events.participant import JobDriver
from events.records import CheckpointConfig, JobStatus
from events.topics import Topics

JOB = "wordcount"
GROUP = "wordcount"
WORDS = [
    "barrier",
    "checkpoint",
    "kafka",
    "spark",
    "flink",
    "offset",
    "partition",
    "snapshot",
    "savepoint",
    "journal",
    "coordinator",
    "replay",
    "exactly",
    "once",
    "stream",
    "batch",
    "state",
    "task",
    "ack",
    "decline",
]


@dataclass
class DemoOptions:
    duration: float = 40.0
    bootstrap: str | None = None
    partitions: int = 4
    interval_ms: int = 1000
    rate: int = 500
    crash_after: int = 3
    prefix: str = "cutline."
    workdir: Path | None = None


@dataclass
class DemoResult:
    produced: Counter[str]
    counted: Counter[str]
    completed: int
    failed: int
    restored_from: int | None
    crashed: bool
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def exactly_once(self) -> bool:
        return self.produced == self.counted and self.crashed and self.restored_from is not None


# ------------------------------------------------------------------------ the job


def run_job(
    bootstrap: str, prefix: str, topic: str, partitions: int, interval_ms: int, location: str, out: Path
) -> int:
    """The word-count job: one task per partition, all in this process; SIGTERM ends it."""
    from events.example_app import WordCount

    topics = Topics(prefix)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    driver = JobDriver(bootstrap, JOB, topics)
    tasks = [
        WordCount(bootstrap, JOB, f"{JOB}-{p}", topic, p, topics=topics, group=GROUP)
        for p in range(partitions)
    ]
    latest = driver.latest_completed()
    attempt = latest.attempt + 1 if latest is not None else 1
    for task in tasks:
        task.attempt = attempt
    threads = [
        threading.Thread(target=task.run, args=(stop,), kwargs={"driver": driver}, daemon=True)
        for task in tasks
    ]
    for thread in threads:
        thread.start()
    while any(task.participant is None for task in tasks) and not stop.is_set():
        time.sleep(0.02)
    config = CheckpointConfig(
        interval_ms=interval_ms, location=location, timeout_ms=20_000, tolerable_failures=5
    )
    driver.running(
        [t.task_id for t in tasks],
        config,
        attempt,
        restored_checkpoint_id=None if latest is None else latest.checkpoint_id,
        restored_location=None if latest is None else latest.location or None,
    )
    while not stop.is_set():
        # positions, not records seen: after a restore the job resumes at the checkpoint's offsets
        out.with_suffix(".progress").write_text(str(sum(max(t.next_offset, 0) for t in tasks)))
        stop.wait(0.2)
    for thread in threads:
        thread.join(10)
    total: Counter[str] = Counter()
    for task in tasks:
        total.update(task.counts)
    out.write_text(json.dumps(dict(total)))
    driver.status(JobStatus.FINISHED, attempt=attempt)
    driver.close()
    return 0


class JobProcess:
    """The job in a child process, so that it can really crash."""

    def __init__(self, options: DemoOptions, bootstrap: str, topic: str, workdir: Path) -> None:
        self.out = workdir / "counts.json"
        self.command = [
            sys.executable, "-m", "coordinator.demo", "job", bootstrap, options.prefix, topic,
            str(options.partitions), str(options.interval_ms), f"file://{workdir}/checkpoints", str(self.out),
        ]  # fmt: skip
        self.log = workdir / "job.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.out.unlink(missing_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> Counter[str]:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        if not self.out.exists():
            raise RuntimeError(f"the job did not write its counts; see {self.log}")
        return Counter(json.loads(self.out.read_text()))


# --------------------------------------------------------------------- the demo


@contextmanager
def _broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        wait_for_broker(bootstrap, 30)
        yield bootstrap
        return
    with EmbeddedBroker() as broker:
        yield broker.bootstrap


def _checkpoint_table(stats: dict[str, Any], produced: int, counted: int, phase: str) -> Group:
    table = Table(title="checkpoints of job 'wordcount'", expand=False)
    for column in ("id", "status", "acks", "duration", "size", "reason"):
        table.add_column(column, justify="right" if column in ("id", "duration", "size") else "left")
    for entry in reversed(stats.get("history", [])[:10]):
        status = entry["status"]
        style = {"COMPLETED": "green", "FAILED": "red"}.get(status, "yellow")
        duration = entry.get("end_to_end_duration")
        table.add_row(
            str(entry["id"]) + (" (savepoint)" if entry.get("is_savepoint") else ""),
            Text(status, style=style),
            f"{entry['num_acknowledged_subtasks']}/{entry['num_subtasks']}",
            "" if duration is None else f"{duration} ms",
            f"{entry.get('state_size', 0):,} B",
            entry.get("failure_message", "") or "",
        )
    counts = stats.get("counts", {})
    line = Text.assemble(
        (f"{phase}  ", "bold"),
        f"records produced {produced:,}  read by the job {counted:,}  ",
        (f"completed {counts.get('completed', 0)}", "green"),
        "  ",
        (f"failed {counts.get('failed', 0)}", "red"),
        f"  restored {counts.get('restored', 0)}",
    )
    return Group(table, line)


def run_demo(options: DemoOptions, console: Console | None = None) -> DemoResult:
    """Run the whole demo and return what it measured (see :class:`DemoResult`)."""
    console = console or Console()
    started = time.monotonic()
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="cutline-demo-"))
    if options.bootstrap and options.prefix == "cutline.":
        # a real cluster keeps what earlier runs wrote: start from fresh topics every time
        options.prefix = f"cutline.demo-{int(time.time())}."
    topics = Topics(options.prefix)
    topic = f"{options.prefix}words"
    produced: Counter[str] = Counter()
    produced_total = [0]
    stop_producing = threading.Event()
    with ExitStack() as stack:
        bootstrap = stack.enter_context(_broker(options.bootstrap))
        console.print(f"broker: {bootstrap}" + ("" if options.bootstrap else " (embedded, memory only)"))
        create_topics(bootstrap, [*topics.all, f"{options.prefix}coordinator-ticks"])
        create_topics(bootstrap, [topic], partitions=options.partitions)
        coordinator = CoordinatorProcess(bootstrap, options.prefix, log_path=workdir / "coordinator.log")
        with console.status("starting the coordinator (joins its consumer group)..."):
            coordinator.start()
        stack.callback(coordinator.stop)
        console.print(f"coordinator: {coordinator.url}/jobs/{JOB}/checkpoints   logs: {workdir}")

        def produce() -> None:
            producer = Producer(producer_config(bootstrap, {"linger.ms": 5}))
            rng = random.Random(7)
            period = 1.0 / max(1, options.rate)
            next_at = time.monotonic()
            while not stop_producing.is_set():
                line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
                producer.produce(topic, key=str(produced_total[0]).encode(), value=line.encode())
                produced.update(line.split())
                produced_total[0] += 1
                producer.poll(0)
                next_at += period
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            producer.flush(30)

        producer_thread = threading.Thread(target=produce, daemon=True)
        job = JobProcess(options, bootstrap, topic, workdir)
        stack.callback(job.kill)
        job.start()
        producer_thread.start()
        crashed = False
        restored_from: int | None = None
        crash_at_completed = options.crash_after
        phase = "running"
        end_at = time.monotonic() + options.duration
        stats: dict[str, Any] = {}
        with Live(console=console, refresh_per_second=4) as live:
            while time.monotonic() < end_at:
                try:
                    stats = coordinator.get(f"/jobs/{JOB}/checkpoints")
                except OSError:
                    stats = {}
                completed = stats.get("counts", {}).get("completed", 0)
                if not crashed and completed >= crash_at_completed:
                    job.kill()
                    crashed = True
                    phase = f"crashed after checkpoint {stats['latest']['completed']['id']}, restarting"
                    time.sleep(1.0)
                    job.start()
                    phase = "restored"
                counted = _progress(job)
                live.update(_checkpoint_table(stats, produced_total[0], counted, phase))
                time.sleep(0.25)
            stop_producing.set()
            producer_thread.join(30)
            phase = "draining"
            deadline = time.monotonic() + 60
            while _progress(job) < produced_total[0] and time.monotonic() < deadline:
                live.update(_checkpoint_table(stats, produced_total[0], _progress(job), phase))
                time.sleep(0.25)
        counted_words = job.stop()
        stats = coordinator.get(f"/jobs/{JOB}/checkpoints")
        restored = stats["latest"]["restored"]
        restored_from = restored["id"] if restored else None
    return DemoResult(
        produced=produced,
        counted=counted_words,
        completed=stats["counts"]["completed"],
        failed=stats["counts"]["failed"],
        restored_from=restored_from,
        crashed=crashed,
        seconds=time.monotonic() - started,
    )


def _progress(job: JobProcess) -> int:
    """Input records the job has read past, over all partitions (its own report)."""
    try:
        return int(job.out.with_suffix(".progress").read_text() or 0)
    except (OSError, ValueError):
        return 0


def summary(result: DemoResult) -> Table:
    table = Table(title="summary", show_header=False)
    table.add_row("checkpoints completed", str(result.completed))
    table.add_row("checkpoints failed", str(result.failed))
    table.add_row("crash", "SIGKILL of the job" if result.crashed else "none")
    table.add_row("restored from checkpoint", str(result.restored_from))
    table.add_row("words produced", f"{sum(result.produced.values()):,}")
    table.add_row("words counted", f"{sum(result.counted.values()):,}")
    table.add_row("took", f"{result.seconds:.0f} s")
    return table


def main_job(argv: list[str]) -> int:
    bootstrap, prefix, topic, partitions, interval_ms, location, out = argv
    return run_job(bootstrap, prefix, topic, int(partitions), int(interval_ms), location, Path(out))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "job":
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        sys.exit(main_job(sys.argv[2:]))
    raise SystemExit("usage: python -m coordinator.demo job ... (use `cutline demo`)")
