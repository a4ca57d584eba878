"""``cutline demo``: a Spark word count over Kafka that checkpoints with cutline, crashes and restores.

Starts the embedded broker (unless given one) and the coordinator, produces a
stream of words into a ``--partitions`` topic, and runs the keyed Spark word count of
:mod:`spark_tasks.wordcount` in a child process with a checkpoint every ``--interval``, reading
Kafka with Spark's own ``kafka`` connector where its jars resolve (Java and Maven, or a cache) and
with ``cutline-kafka`` otherwise (``--source`` chooses; its ``source:`` line says which, and why):
the words are shuffled by key group into ``--keyed`` partitions, each of which keeps
the counts of its words, snapshots them (incrementally) and acks each checkpoint. It shows a live table of
checkpoints (the coordinator's ``/jobs/wordcount/checkpoints`` view) and the
job's status as the journal records it, SIGKILLs the Spark driver after a few
completed checkpoints, and lets ``cutline run`` (which supervises the driver)
carry out what the restart strategy decides: the next attempt restores from the
latest completed checkpoint. Then it stops producing, waits until Spark has
counted every word, stops the job with a savepoint (``cutline stop``: FINISHED), and
checks exactly-once: the words counted in the raw rows
the job wrote through its :class:`~spark_tasks.sink.CutFileSink`
(:func:`spark_tasks.wordcount.read_counts` sums each row's ``added``, with no
de-duplication) equal the words produced, and so does the last count of each word
the job wrote (:func:`spark_tasks.wordcount.final_counts`): its rows are the final
counts, nothing is summed outside Spark. The job writes the same rows to the topic ``word-counts``
through an :class:`~spark_tasks.kafka_sink.ExactlyOnceKafkaSink` too (on either source), and the demo
checks them as a ``read_committed`` consumer sees them: every word counted once, across the crash.
On the embedded Tansu, which shows aborted transactions to such consumers (docs/embedded-broker.md),
it says what that check cannot show there (``--broker kafka`` shows it).

The driver runs in its own process group, so the crash is a real one (the
Python driver, its JVM and its Python workers die at once) and the terminal's
Ctrl-C reaches only the demo, which then stops everything it started in order.

``cutline demo`` (coordinator/cli/demo.py) checks its options and becomes ``python -m
cutline_demo`` with them: the demo is composed here, outside the library packages, so that nothing
in ``coordinator/`` imports ``spark_tasks`` and no library imports the demo.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from coordinator.service.app import Settings, ensure_topics
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.apache_kafka import KAFKA_VERSION, ApacheKafka
from events.dev.broker import BrokerError, broker_at, create_topics
from events.kafka.client_config import client_properties
from events.kafka.clients import producer_config
from events.kafka.feed import JobFeed
from events.stopping import StopRequested, StopSignals
from events.task.participant import JobDriver
from events.wire.codec import use_wire
from events.wire.records import (
    JobFailedPermanently,
    JobRestartScheduled,
    JobStopRequested,
    SchedulerStarted,
    SchedulerStopped,
)
from events.wire.schema_registry import wire_from_environment
from events.wire.topics import Topics
from spark_tasks.connector import kafka_connector
from spark_tasks.source_choice import SourceChoice, SourceUnavailable, choose_source, security_refusal
from spark_tasks.wordcount import SparkDriver, final_counts, read_counts, read_kafka_counts

JOB = "wordcount"
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
    """What ``cutline demo`` runs; the CLI sets the first four."""

    duration: float = 40.0
    """Seconds of input at least; the stream goes on until the restarted job has completed checkpoints."""
    bootstrap: str | None = None
    broker: str = "tansu"
    """The broker started when ``bootstrap`` is None: ``tansu`` (embedded) or ``kafka`` (Apache Kafka)."""
    partitions: int = 4
    keyed: int = 8
    """Shuffle partitions of the keyed word count (its tasks); 0: state per input partition."""
    source: str | None = None
    """``kafka`` (Spark's own connector), ``cutline-kafka``, or None: the connector where its jars
    resolve, cutline-kafka otherwise."""
    interval_ms: int = 1000
    rate: int = 50
    """Lines of words per second."""
    crash_after: int = 3
    """Completed checkpoints of the first driver before its SIGKILL."""
    after_restore: int = 2
    """Completed checkpoints of the restarted driver before the stream stops."""
    prefix: str = "cutline."
    workdir: Path | None = None
    grace: float = 20.0
    """Seconds the Spark driver gets to stop after SIGTERM before SIGKILL."""
    stop_grace: float = 4.0
    """The same when the demo itself is stopped (SIGTERM, Ctrl-C): it stops within 10 s."""
    spark_timeout: float = 300.0
    """Seconds a Spark driver may take to start its query, or to count what is left at the end:
    about 20 s on an idle machine, minutes on a busy one (the demo shows what it waits for)."""


@dataclass
class DemoResult:
    produced: Counter[str]
    counted: Counter[str]
    final: dict[str, int]
    """The last count of each word in the job's output (a keyed job's result)."""
    completed: int
    failed: int
    restored_from: int | None
    crashed: bool
    seconds: float
    kafka: KafkaOutput | None = None
    """The rows the job wrote to Kafka, as a ``read_committed`` consumer sees them."""
    source: str = "cutline-kafka"
    """The source the job read Kafka with (``kafka``: Spark's own connector)."""

    @property
    def exactly_once(self) -> bool:
        return (
            self.produced == self.counted
            and self.final == dict(self.produced)
            and self.crashed
            and self.restored_from is not None
        )

    @property
    def kafka_exactly_once(self) -> bool:
        kafka = self.kafka
        return (
            kafka is not None
            and kafka.counted == self.produced
            and kafka.final == dict(self.produced)
            and self.crashed
            and self.restored_from is not None
        )


@dataclass(frozen=True)
class KafkaOutput:
    """What a ``read_committed`` consumer of the job's Kafka output saw, and on which broker."""

    topic: str
    counted: Counter[str]
    """Words counted: ``added`` summed over every row, with no de-duplication."""
    final: dict[str, int]
    """The last count of each word (a keyed job's result)."""
    shows_aborted: bool
    """The broker shows aborted transactions to ``read_committed`` consumers (the embedded Tansu)."""
    committed_again: tuple[int, ...] = ()
    """Checkpoints whose output the restarted driver's sink committed again: the crash fell between
    their completion and their commit, maybe during a transaction that its recovery aborted."""


class DemoError(RuntimeError):
    """The demo cannot go on (a Spark driver exited or stalled); the message says where to look."""


# ------------------------------------------------------------------ the input


class WordStream:
    """Produces lines of words to the input topic at ``rate`` lines/s; counts what the broker accepted."""

    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        self.topic = topic
        self.rate = rate
        self.produced: Counter[str] = Counter()
        self.lines = 0
        self._producer = Producer(producer_config(bootstrap, {"linger.ms": 5}))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cutline-demo-words", daemon=True)
        self._lock = threading.Lock()
        self.errors: list[str] = []

    @property
    def words(self) -> int:
        with self._lock:
            return self.produced.total()

    def start(self) -> None:
        self._thread.start()

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.errors.append(str(error))
            return
        with self._lock:
            self.produced.update((message.value() or b"").decode().split())
            self.lines += 1

    def _run(self) -> None:
        rng = random.Random(7)
        period = 1.0 / max(1, self.rate)
        next_at = time.monotonic()
        n = 0
        while not self._stop.is_set():
            line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
            self._producer.produce(
                self.topic, key=str(n).encode(), value=line.encode(), on_delivery=self._delivered
            )
            n += 1
            self._producer.poll(0)
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)

    def stop(self) -> None:
        """Stop producing and wait until every line is delivered; idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._producer.flush(30)

    def end_each_partition(self, partitions: int) -> None:
        """Write a record without a value (the word count skips it) to each partition, each alone in
        its batch: on the embedded broker, which answers Spark's kafka connector a partition's end at
        its last batch's first record + 1, the connector then reads every line (docs/spark.md)."""
        for partition in range(partitions):
            self._producer.produce(self.topic, value=None, partition=partition)
            if self._producer.flush(30):
                self.errors.append(f"the empty record ending partition {partition} was not delivered")


# --------------------------------------------------------------------- the demo


def _checkpoint_table(stats: dict[str, Any]) -> Table:
    table = Table(title=f"checkpoints of job '{JOB}'", expand=False)
    for column in ("id", "status", "acks", "duration", "size"):
        table.add_column(
            column, justify="right" if column in ("id", "duration", "size") else "left", no_wrap=True
        )
    table.add_column("reason")  # the only column that wraps on a narrow terminal
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
            _shorten(entry.get("failure_message", "") or "", 72),
        )
    return table


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def journal_seen(statuses: Sequence[str], void: Mapping[str, int]) -> str:
    """What the demo's own reader of the job's journal saw, fenced as the driver's reader is: the job's
    statuses and the records the fence voided. Beside a driver that never confirmed RUNNING it tells
    a journal without a valid ``SchedulerStarted`` from a driver that missed one."""
    voided = ", ".join(f"{count} on {topic}" for topic, count in sorted(void.items())) or "none"
    return (
        f"the job's journal, read fenced: {' → '.join(statuses) or 'no status yet'}; void records: {voided}"
    )


def _offsets(offsets: dict[str, int]) -> str:
    return " ".join(f"{key.rpartition(':')[2]}:{offset}" for key, offset in sorted(offsets.items()))


class _Screen:
    """The live view: the checkpoint table, the stream's progress and the phase; refreshed by :meth:`wait`."""

    def __init__(
        self,
        live: Live,
        coordinator: CoordinatorProcess,
        words: WordStream,
        spark: SparkDriver,
        out: Path,
        stop: StopSignals | None = None,
    ) -> None:
        self.live = live
        self.stop = stop
        self.coordinator = coordinator
        self.words = words
        self.spark = spark
        self.out = out
        self.phase = "starting"
        self.stats: dict[str, Any] = {}
        self.counted = 0
        self.restored: dict[str, Any] | None = None
        self._counted_at = 0.0
        self.statuses: list[str] = []
        """The job's status changes, as the journal records them (``RUNNING (attempt 1)``, ...)."""
        self.restart: JobRestartScheduled | None = None
        self._journal: JobFeed | None = None
        self.end_partitions = False
        """End the input with an empty record per partition (Spark's connector on the embedded broker)."""

    def follow(self, bootstrap: str, topics: Topics) -> None:
        """Follow the job's journal from now on: its status changes and restart decisions."""
        self._journal = JobFeed(bootstrap, JOB, (topics.checkpoints,), claims_topic=topics.checkpoints)

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()

    def _read_journal(self) -> None:
        if self._journal is None:
            return
        for entry in self._journal.poll(0):
            record = entry.record
            if isinstance(record, SchedulerStarted):
                self.statuses.append(f"RUNNING (attempt {record.attempt})")
            elif isinstance(record, SchedulerStopped):
                self.statuses.append(f"{record.status} (attempt {record.attempt})")
            elif isinstance(record, JobRestartScheduled):
                self.restart = record
                self.statuses.append(
                    f"RESTARTING (attempt {record.attempt} in {record.delay_ms / 1000:.1f} s)"
                )
                restore = (
                    "nothing"
                    if record.restore_checkpoint_id is None
                    else f"checkpoint {record.restore_checkpoint_id}"
                )
                self.say(
                    f"the restart strategy decided: attempt {record.attempt} in "
                    f"{record.delay_ms / 1000:.1f} s, restoring {restore} ({record.failure})",
                    "yellow",
                )
            elif isinstance(record, JobFailedPermanently):
                self.statuses.append(f"FAILED for good: {record.reason}")

    def say(self, message: str, style: str = "") -> None:
        self.live.console.print(Text(f"{time.strftime('%H:%M:%S')}  {message}", style), soft_wrap=True)

    def count(self) -> Counter[str]:
        counted = read_counts(self.out)
        self.counted = counted.total()
        self._counted_at = time.monotonic()
        return counted

    def refresh(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stats = self.coordinator.get(f"/jobs/{JOB}/checkpoints")
        self._read_journal()
        if time.monotonic() - self._counted_at >= 1.0:
            self.count()
        counts = self.stats.get("counts", {})
        stream = Text.assemble(
            ("stream  ", "bold"),
            f"produced {self.words.lines:,} lines, {self.words.words:,} words  ",
            f"counted by Spark {self.counted:,} words",
        )
        checkpoints = Text.assemble(
            ("checkpoints  ", "bold"),
            (f"completed {counts.get('completed', 0)}", "green"),
            "  ",
            (f"aborted {counts.get('failed', 0)}", "yellow"),
            f"  in progress {counts.get('in_progress', 0)}  restored {counts.get('restored', 0)}",
        )
        job = Text.assemble(("job  ", "bold"), " → ".join(self.statuses[-5:]) or "not running yet")
        lines: list[Any] = [_checkpoint_table(self.stats), job, stream, checkpoints]
        if self.restored is not None:
            restored = self.restored
            lines.append(
                Text(
                    f"restored: checkpoint {restored['checkpoint_id']}, attempt {restored['attempt']}, "
                    f"offsets {_offsets(restored['offsets'])}",
                    "cyan",
                )
            )
        lines.append(Text(self.phase, "bold yellow"))
        self.live.update(Group(*lines))

    def wait(self, condition: Callable[[], bool], phase: str, timeout: float) -> None:
        """Refresh the view until ``condition`` holds; DemoError if the driver exits or time runs out."""
        self.phase = phase
        deadline = time.monotonic() + timeout
        while True:
            if self.stop is not None:
                self.stop.check()
            self.refresh()
            if condition():
                return
            code = self.spark.returncode
            if code is not None:
                raise DemoError(
                    f"the Spark driver exited with {code} while {phase!r}; "
                    f"its log {self.spark.log_path} ends with:\n{self.spark.tail()}"
                )
            if time.monotonic() > deadline:
                warned = self.spark.warnings()
                void = self._journal.records.void if self._journal is not None else {}
                raise DemoError(
                    f"timed out after {timeout:g} s while {phase!r}; "
                    f"Spark's log {self.spark.log_path} ends with:\n{self.spark.tail()}"
                    + ("\nand cutline's warnings in it were:\n" + "\n".join(warned) if warned else "")
                    + f"\n{journal_seen(self.statuses, void)}"
                )
            if self.stop is not None:
                self.stop.wait(0.25)
            else:
                time.sleep(0.25)


def run_demo(
    options: DemoOptions, console: Console | None = None, stop: StopSignals | None = None
) -> DemoResult:
    """Run the whole demo and return what it measured (see :class:`DemoResult`).

    With ``stop``, a stop signal raises :class:`~events.stopping.StopRequested` at the next step
    or look, after everything the demo started is stopped (the Spark driver given
    ``options.stop_grace`` s instead of ``options.grace``)."""
    console = console or Console()
    check = stop.check if stop is not None else (lambda: None)

    def grace() -> float:
        return options.stop_grace if stop is not None and stop.requested else options.grace

    started = time.monotonic()
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="cutline-demo-"))
    if options.bootstrap and options.prefix == "cutline.":
        # a real cluster keeps what earlier runs wrote: start from fresh topics every time
        options.prefix = f"cutline.demo-{int(time.time())}."
    topics = Topics(options.prefix)
    topic = f"{options.prefix}words"
    counts_topic = f"{options.prefix}word-counts"
    out = workdir / "out"
    choice = _choose_source(options, console)
    on_tansu = options.broker == "tansu" and not options.bootstrap
    console.print(choice.line, soft_wrap=True)
    with ExitStack() as stack:
        if options.broker == "kafka" and not options.bootstrap:
            with console.status("starting Apache Kafka (a few seconds; the first time Maven fetches it)..."):
                bootstrap = stack.enter_context(ApacheKafka()).bootstrap
            console.print(f"broker: {bootstrap} (Apache Kafka {KAFKA_VERSION}, data in a temp dir)")
        else:
            bootstrap = stack.enter_context(broker_at(options.bootstrap))
            console.print(f"broker: {bootstrap}" + ("" if options.bootstrap else " (embedded, memory only)"))
        check()
        # as `cutline topics create` makes them: the journal kept for ever (Apache Kafka's default
        # retention of 7 days would make the coordinator refuse it), the snapshots compacted
        ensure_topics(Settings(bootstrap, options.prefix))
        create_topics(bootstrap, [topic, counts_topic], partitions=options.partitions)
        coordinator = CoordinatorProcess(bootstrap, options.prefix, log_path=workdir / "coordinator.log")
        stack.callback(coordinator.stop)
        with console.status("starting the coordinator (joins its consumer group)..."):
            coordinator.start(abort=check)
        console.print(f"coordinator: {coordinator.url}/ (dashboard)   logs: {workdir}", soft_wrap=True)
        console.print(
            Text(
                "from another terminal, while the demo runs:\n"
                f"  export CUTLINE_BOOTSTRAP={bootstrap}\n"
                f"  uv run cutline status {JOB} --url {coordinator.url}\n"
                f"  uv run cutline tail checkpoints --topic-prefix {options.prefix}",
                "dim",
            ),
            soft_wrap=True,
        )
        spark = SparkDriver(
            [
                *("--bootstrap", bootstrap, "--job", JOB, "--topic", topic, "--topic-prefix", options.prefix),
                *("--work-dir", str(workdir / "spark"), "--location", (workdir / "checkpoints").as_uri()),
                *("--out", str(out), "--interval-ms", str(options.interval_ms)),
                *("--kafka-out", counts_topic),
                *(("--keyed", str(options.keyed)) if options.keyed else ()),
                *("--source", choice.source),
                # a checkpoint completes with the micro-batch its barrier is folded into: a few
                # seconds when the machine is busy, so a generous timeout
                *("--timeout-ms", "60000", "--tolerable-failures", "10"),
            ],
            workdir,
            # `cutline run` supervises the driver: the coordinator decides the restart after the crash
            supervisor=[
                *("--job", JOB, "--bootstrap", bootstrap, "--topic-prefix", options.prefix),
                *("--restart-strategy", "fixed-delay", "--attempts", "3", "--delay-ms", "1000"),
                *("--stop-timeout-s", str(options.grace)),
            ],
        )
        stack.callback(lambda: spark.stop(grace()))
        words = WordStream(bootstrap, topic, options.rate)
        stack.callback(words.stop)
        try:
            try:
                with Live(console=console, refresh_per_second=4) as live:
                    screen = _Screen(live, coordinator, words, spark, out, stop)
                    screen.end_partitions = choice.on_connector and on_tansu
                    screen.follow(bootstrap, topics)
                    stack.callback(screen.close)
                    savepoints = (workdir / "savepoints").as_uri()  # beside the checkpoints

                    def stop_job() -> str:
                        """`cutline stop JOB --savepoint DIR`: its request, as the command sends it."""
                        request = JobStopRequested(JOB, int(time.time() * 1000), uuid.uuid4().hex, savepoints)
                        with JobDriver(bootstrap, JOB, topics) as driver:
                            driver.request(request)
                        return savepoints

                    def read_kafka(committed_again: tuple[int, ...]) -> KafkaOutput | None:
                        """The job's Kafka output, as a `read_committed` consumer sees it."""
                        counted, final = read_kafka_counts(bootstrap, counts_topic)
                        shows_aborted = on_tansu
                        return KafkaOutput(counts_topic, counted, final, shows_aborted, committed_again)

                    result = dataclasses.replace(
                        _play(options, screen, started, stop_job, read_kafka), source=choice.source
                    )
            finally:
                if not console.is_terminal:
                    console.print()  # a live display ends without a newline when not on a terminal
        except (KeyboardInterrupt, StopRequested):
            console.print(Text("interrupted: stopping Spark, the coordinator and the broker...", "yellow"))
            raise
    return result


def _choose_source(options: DemoOptions, console: Console) -> SourceChoice:
    """The source the word count reads with (:func:`~spark_tasks.source_choice.choose_source`); the
    connector's jars are resolved here, before anything starts (Maven fetches them the first time)."""
    with console.status("resolving Spark's kafka connector (the first time, Maven fetches its jars)..."):
        try:
            return choose_source(
                options.source,
                remote=False,
                resolve=kafka_connector,
                refused=security_refusal(client_properties()),
            )
        except SourceUnavailable as exc:
            raise DemoError(str(exc)) from exc


def _play(
    options: DemoOptions,
    screen: _Screen,
    started: float,
    stop_job: Callable[[], str],
    read_kafka: Callable[[tuple[int, ...]], KafkaOutput | None],
) -> DemoResult:
    """The story: start, crash after a few checkpoints, restore, carry on, drain, stop, measure."""
    spark, words = screen.spark, screen.words
    spark.start()
    words.start()
    producing_until = time.monotonic() + options.duration
    screen.say(
        f"`cutline run` started the Spark driver (attempt 1) with a fixed-delay restart strategy; "
        f"input: {options.rate} lines of words per second"
    )
    screen.wait(
        lambda: bool(spark.seen("running")),
        "starting Spark: the JVM, then the first micro-batch (20 s idle, a minute or more when busy)",
        options.spark_timeout,
    )
    running = spark.seen("running")[0]
    shape = (
        f"{options.partitions} input partitions shuffled by word into {options.keyed} keyed tasks"
        if options.keyed
        else "one task per input partition"
    )
    screen.say(f"job RUNNING (attempt {running['attempt']}, {shape})")
    screen.wait(
        lambda: len(spark.seen("completed")) >= options.crash_after,
        f"running: the driver gets a SIGKILL after {options.crash_after} completed checkpoints",
        options.spark_timeout,
    )
    last = spark.seen("completed")[-1]["checkpoint_id"]
    killed = spark.driver_pid
    spark.kill()
    screen.say(
        f"SIGKILL of the job's Spark driver (pid {killed} and its JVM) after checkpoint {last}", "bold red"
    )
    screen.wait(
        lambda: screen.restart is not None,
        "the crash: `cutline run` reports the attempt FAILING, the restart strategy decides",
        options.spark_timeout,
    )
    screen.wait(
        lambda: (
            spark.driver_pid not in (None, killed) and bool(spark.seen("restored") or spark.seen("running"))
        ),
        "restarting Spark: `cutline run` starts attempt 2, the JVM, the restore, the first micro-batch",
        options.spark_timeout,
    )
    screen.say(f"Spark driver of attempt 2 started by `cutline run` (pid {spark.driver_pid})")
    screen.restored = spark.last("restored")
    if screen.restored is None:
        screen.say("the restarted driver found no checkpoint to restore from", "bold red")
    else:
        rolled_back = int(screen.restored.get("rolled_back", 0))
        screen.say(
            f"restored from checkpoint {screen.restored['checkpoint_id']} "
            f"(attempt {screen.restored['attempt']}, offsets {_offsets(screen.restored['offsets'])}); "
            f"the sink rolled back {rolled_back} output file{'' if rolled_back == 1 else 's'} attempt 1 "
            "wrote after that checkpoint",
            "cyan",
        )
    screen.wait(
        lambda: len(spark.seen("completed")) >= options.after_restore and time.monotonic() >= producing_until,
        f"restored: running until {options.after_restore} more checkpoints complete "
        f"and {options.duration:g} s of input",
        options.spark_timeout,
    )
    words.stop()
    if screen.end_partitions:
        words.end_each_partition(options.partitions)
    produced = Counter(words.produced)
    if words.errors:
        screen.say(
            f"{len(words.errors)} lines were not delivered (not counted as produced): {words.errors[0]}"
        )
    screen.say(f"stopped producing: {words.lines:,} lines, {produced.total():,} words")
    screen.wait(
        lambda: screen.count().total() >= produced.total(),
        "draining: waiting until Spark has counted every word",
        options.spark_timeout,
    )
    target = stop_job()
    screen.say(f"Spark has counted every word: `cutline stop {JOB} --savepoint {target}`")
    screen.wait(
        lambda: spark.returncode is not None,
        "stopping with a savepoint: the coordinator triggers it, the job stops FINISHED once it completes",
        options.spark_timeout,
    )
    code = spark.returncode
    if code != 0:  # `cutline run` exits 0 once the job is FINISHED
        raise DemoError(
            f"`cutline run` ended with {code}, not FINISHED; "
            f"the driver's log {spark.log_path}:\n{spark.tail()}"
        )
    latest = (screen.coordinator.get(f"/jobs/{JOB}/checkpoints").get("latest") or {}).get("savepoint")
    where = (
        f"savepoint {latest['id']} at {latest.get('external_path')}" if latest else f"a savepoint in {target}"
    )
    screen.say(
        f"the job is FINISHED with {where} (`cutline run` exit 0); a new run restores it (restore=DIR)"
    )
    screen.phase = "reading the Kafka output as a read_committed consumer"
    screen.refresh()
    committed_again = tuple((screen.restored or {}).get("kafka_committed_again", ()))
    kafka = read_kafka(committed_again)
    if kafka is not None and not options.keyed:  # a row's count is its partition's: the sums are the words
        kafka = dataclasses.replace(kafka, final=dict(kafka.counted))
    screen.phase = "done"
    screen.refresh()
    stats = screen.stats
    return DemoResult(
        produced=produced,
        counted=read_counts(screen.out),
        final=final_counts(screen.out) if options.keyed else dict(read_counts(screen.out)),
        completed=stats.get("counts", {}).get("completed", 0),
        failed=stats.get("counts", {}).get("failed", 0),
        restored_from=None if screen.restored is None else int(screen.restored["checkpoint_id"]),
        crashed=True,
        seconds=time.monotonic() - started,
        kafka=kafka,
    )


def summary(result: DemoResult) -> Table:
    table = Table(title="summary", show_header=False)
    table.add_row("checkpoints completed", str(result.completed))
    table.add_row(
        "checkpoints aborted",
        f"{result.failed} (in flight when the driver was killed, or aborted by the stop's savepoint: "
        "expected; none is lost, the next one covers its records)"
        if result.failed
        else "0",
    )
    table.add_row("source", "Spark's kafka connector" if result.source == "kafka" else result.source)
    table.add_row("crash", "SIGKILL of the job's Spark driver" if result.crashed else "none")
    table.add_row("restored from checkpoint", str(result.restored_from))
    table.add_row("words produced", f"{result.produced.total():,}")
    table.add_row("words counted", f"{result.counted.total():,}")
    if result.kafka is not None:
        table.add_row(f"words in {result.kafka.topic}", f"{result.kafka.counted.total():,} (read_committed)")
    table.add_row("took", f"{result.seconds:.0f} s")
    return table


def kafka_verdict(result: DemoResult) -> tuple[bool | None, str]:
    """The exactly-once line of the Kafka output and whether it held: True, False, or None when it
    was not shown: a broker that shows aborted transactions (Tansu) showed more words than produced
    after a crash in a commit, whose transaction the next driver aborted and did again. Pure."""
    kafka = result.kafka
    if kafka is None:
        return False, "exactly-once to Kafka: not checked"
    seen = f"{kafka.counted.total():,} words in {kafka.topic} = {result.produced.total():,} produced"
    if result.kafka_exactly_once:
        if kafka.shows_aborted:
            return True, (
                f"exactly-once to Kafka: OK as a read_committed consumer sees it, {seen}; "
                "on Tansu it would see aborted transactions too (--broker kafka hides them)"
            )
        return True, f"exactly-once to Kafka: OK for a read_committed consumer, {seen}"
    if (
        kafka.shows_aborted
        and kafka.committed_again
        and kafka.final == dict(result.produced)
        and all(kafka.counted[word] >= n for word, n in result.produced.items())
    ):
        return None, (
            f"exactly-once to Kafka: not shown on Tansu, {seen} (none lost, final counts right): the crash "
            f"fell in the commit of checkpoint {kafka.committed_again[-1]}, and Tansu shows the transaction "
            "the next driver aborted; --broker kafka hides it"
        )
    return False, f"exactly-once to Kafka: FAILED, {seen}"


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m cutline_demo``: ``cutline demo``'s options (its help)."""
    parser = argparse.ArgumentParser(prog="python -m cutline_demo", description=__doc__.split("\n")[0])
    defaults = DemoOptions()
    parser.add_argument("--duration", type=float, default=defaults.duration)
    parser.add_argument("--bootstrap", default=defaults.bootstrap)
    parser.add_argument("--broker", choices=("tansu", "kafka"), default=defaults.broker)
    parser.add_argument("--partitions", type=int, default=defaults.partitions)
    parser.add_argument("--interval", type=int, default=defaults.interval_ms)
    parser.add_argument("--keyed", type=int, default=defaults.keyed)
    parser.add_argument("--source", choices=("kafka", "cutline-kafka"), default=defaults.source)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the demo and print its summary and the exactly-once check: 0 when it holds, 1 when it
    does not or the demo failed, 130 when stopped (SIGTERM, Ctrl-C)."""
    args = build_parser().parse_args(argv)
    use_wire(wire_from_environment())  # as `cutline demo` exported them
    console = Console(highlight=False)
    # SIGTERM, like Ctrl-C, stops everything the demo started (the Spark driver in its own session)
    try:
        with StopSignals() as stop:
            result = run_demo(
                DemoOptions(
                    duration=args.duration,
                    bootstrap=args.bootstrap,
                    broker=args.broker,
                    partitions=args.partitions,
                    interval_ms=args.interval,
                    keyed=args.keyed,
                    source=args.source,
                ),
                console,
                stop,
            )
    except StopRequested:
        console.print(Text("interrupted: everything the demo started was stopped", "yellow"))
        return 130
    except (DemoError, BrokerError) as exc:
        console.print(Text(f"demo failed: {exc}", "bold red"), soft_wrap=True)
        console.print(Text("exactly-once: not checked", "bold red"))
        return 1
    console.print(summary(result))
    held = _print_verdicts(console, result)
    return 0 if held else 1


def _print_verdicts(console: Console, result: DemoResult) -> bool:
    """The exactly-once lines of the file output and of the Kafka output; whether neither failed."""
    if result.exactly_once:
        console.print(
            Text(
                f"exactly-once: OK, {result.counted.total():,} words counted = "
                f"{result.produced.total():,} produced, and every word's final count is right, across a "
                f"crash and a restore from checkpoint {result.restored_from}",
                "bold green",
            ),
            soft_wrap=True,
        )
    else:
        console.print(Text("exactly-once: FAILED", "bold red"), soft_wrap=True)
    kafka_held, line = kafka_verdict(result)
    style = {True: "bold green", False: "bold red", None: "bold yellow"}[kafka_held]
    console.print(Text(line, style), soft_wrap=True)
    if result.exactly_once and kafka_held is not False:
        return True
    if result.restored_from is None:
        console.print("  the restarted job did not restore from a checkpoint")
    kafka = result.kafka or KafkaOutput("", Counter(), {}, shows_aborted=False)
    for word in sorted(set(result.produced) | set(result.counted) | set(kafka.counted)):
        counts = (result.counted[word], result.final.get(word), kafka.counted[word], kafka.final.get(word))
        if any(count != result.produced[word] for count in counts):
            console.print(
                f"  {word}: produced {result.produced[word]}, counted {counts[0]}, final count {counts[1]}; "
                f"in Kafka counted {counts[2]}, final count {counts[3]}"
            )
    return False


if __name__ == "__main__":
    sys.exit(main())
