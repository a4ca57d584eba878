"""The ``cutline`` command line (docs/design.md, "Command line").

``cutline replay`` folds a journal into the coordinator's state at any offset
or time, prints what happened, and checks the journal against the named
invariants; ``cutline journal-demo`` writes a realistic journal to try it on.
The broker, coordinator, status and trigger commands join this app as they land.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import sys
from array import array
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, NoReturn, TypeAlias

import typer
from confluent_kafka import KafkaException
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.text import Text

from coordinator.decider import evolve
from coordinator.file_check import FileCheck, Verdict, first_verdict
from coordinator.journal import (
    Codec,
    FileTally,
    JournalFileError,
    read_journal_events,
    read_journal_share,
    write_journal,
)
from coordinator.plot import CheckpointOutcomes, write_plot
from coordinator.simulate import simulate
from coordinator.split_replay import replay_file
from coordinator.state import JobState, initial_state
from coordinator.timeline import Acks, ack_progress, format_bytes, format_time, job_summary, timeline_line
from events.codec import default_codec
from events.log import LogMessage, read_journal_topic
from events.records import JournalEvent, RestartStrategyKind, TaskAcknowledged
from events.topics import DEFAULT_PARTITIONS, DEFAULT_PREFIX, Topics
from events.validation import StorageUri

__all__ = ["Cut", "app", "main", "parse_until"]

app = typer.Typer(
    name="cutline",
    help="Flink-style checkpoint coordination for Spark Structured Streaming and Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

FULL_TIMELINE_MAX = 10_000
"""Longer timelines print only their first and last lines (unless --all)."""
TIMELINE_EDGE = 20
PRINT_BATCH = 1_000

USAGE_ERROR = 2
VIOLATION = 1

Bootstrap: TypeAlias = Annotated[
    str | None,
    typer.Option(
        "--bootstrap",
        "-b",
        envvar="CUTLINE_BOOTSTRAP",
        help="Kafka bootstrap servers HOST:PORT (default: $CUTLINE_BOOTSTRAP).",
    ),
]
TopicPrefix: TypeAlias = Annotated[
    str, typer.Option("--topic-prefix", "-p", help="Prefix of every cutline topic.")
]


@app.callback()
def cutline(
    kafka_config: Annotated[
        Path | None,
        typer.Option(
            "--kafka-config",
            exists=True,
            dir_okay=False,
            help="Kafka client properties (kcat/Java style name=value: security.protocol, sasl.*, ssl.*) "
            "for every Kafka client cutline starts; also $CUTLINE_KAFKA_CONFIG.",
        ),
    ] = None,
    kafka_properties: Annotated[
        list[str] | None,
        typer.Option(
            "-X",
            "--kafka-property",
            metavar="NAME=VALUE",
            help="One Kafka client property (repeatable), over the file and $CUTLINE_KAFKA_<NAME> variables.",
        ),
    ] = None,
    schema_registry: Annotated[
        str | None,
        typer.Option(
            "--schema-registry",
            envvar="CUTLINE_SCHEMA_REGISTRY_URL",
            help="Confluent Schema Registry URL: read Confluent-framed records too (the registry extra).",
        ),
    ] = None,
    wire_format: Annotated[
        str,
        typer.Option(
            "--wire-format",
            envvar="CUTLINE_WIRE_FORMAT",
            help="How records are written: single-object (Avro's, the default) or confluent "
            "(magic 0 + schema id, subjects <topic>-cutline.<Record>; needs --schema-registry).",
        ),
    ] = "single-object",
) -> None:
    """Flink-style checkpoint coordination for Spark Structured Streaming and Kafka."""
    from events.client_config import CONFIG_FILE_VARIABLE, ClientConfigError, command_line_warnings, override
    from events.schema_registry import (
        FORMAT_VARIABLE,
        URL_VARIABLE,
        WireFormatError,
        framing_from_environment,
    )

    errors = Console(stderr=True, highlight=False)
    if kafka_config is not None:
        os.environ[CONFIG_FILE_VARIABLE] = str(kafka_config.resolve())
    try:
        override(kafka_properties or [])
    except ClientConfigError as exc:
        _fail(errors, str(exc))
    for warning in command_line_warnings(kafka_properties or []):
        errors.print(Text(f"warning: {warning}", "yellow"))
    # Environment variables, so that every process cutline starts reads and writes the same way.
    if schema_registry:
        os.environ[URL_VARIABLE] = schema_registry
    os.environ[FORMAT_VARIABLE] = wire_format
    try:
        framing_from_environment()
    except WireFormatError as exc:
        _fail(errors, str(exc))


# --------------------------------------------------------------------- --until


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a replay stops: the last journal offset, or the last event time, to include."""

    offset: int | None = None
    time_ms: int | None = None

    def includes(self, event: JournalEvent, offset: int) -> bool:
        if self.offset is not None:
            return offset <= self.offset
        if self.time_ms is not None:
            return event.timestamp_ms <= self.time_ms
        return True

    def __str__(self) -> str:
        if self.offset is not None:
            return f"offset {self.offset}"
        if self.time_ms is not None:
            return format_time(self.time_ms)
        return "the end"


@dataclass(frozen=True, slots=True)
class _Selection:
    """The events a replay takes: one job's (``--job``) up to the cut (``--until``)."""

    cut: Cut
    job: str | None = None

    def wanted(self, event: JournalEvent, offset: int) -> bool:
        return (self.job is None or event.job_id == self.job) and self.cut.includes(event, offset)


_MILLIS = re.compile(r"(\d+)\s*ms")


def parse_until(text: str | None) -> Cut:
    """``1234`` (an offset), ``2026-11-22T10:00:00Z`` (ISO 8601, UTC if no zone) or ``1795338000000ms``."""
    if text is None:
        return Cut()
    value = text.strip()
    if value.isdigit():
        return Cut(offset=int(value))
    millis = _MILLIS.fullmatch(value)
    if millis:
        return Cut(time_ms=int(millis.group(1)))
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"--until {text!r} is neither an offset nor a time: give the last journal offset to include "
            "(e.g. 1234), an ISO-8601 time (e.g. 2026-11-22T10:00:00Z) or epoch milliseconds "
            "(e.g. 1795338000000ms)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return Cut(time_ms=round(moment.timestamp() * 1000))


# ---------------------------------------------------------------------- replay


Line: TypeAlias = tuple[JournalEvent, int, int, Acks | None]
"""What one timeline line shows: the event, its partition and offset, its ack progress."""


@dataclass
class _Replay:
    """Everything one pass over a journal collects."""

    states: dict[str, JobState] = field(default_factory=dict)
    jobs_in_file: set[str] = field(default_factory=set)
    total: int = 0
    selected: int = 0
    partitions: array[int] = field(default_factory=lambda: array("i"))
    offsets: array[int] = field(default_factory=lambda: array("q"))


class _Timeline:
    """Timeline lines as they come: all of them (--all), or the first and last few."""

    def __init__(self, console: Console, *, print_all: bool) -> None:
        self.console = console
        self.print_all = print_all
        self.lines: list[Line] = []
        self.tail: deque[Line] = deque(maxlen=TIMELINE_EDGE)
        self.count = 0

    def add(self, line: Line) -> None:
        self.count += 1
        if self.print_all:
            self.lines.append(line)
            if len(self.lines) >= PRINT_BATCH:
                self._print(self.lines)
                self.lines.clear()
        elif self.count <= FULL_TIMELINE_MAX:
            self.lines.append(line)
        else:
            if self.count == FULL_TIMELINE_MAX + 1:
                self.tail.extend(self.lines[-TIMELINE_EDGE:])
                del self.lines[TIMELINE_EDGE:]
            self.tail.append(line)

    def finish(self) -> None:
        if self.print_all or self.count <= FULL_TIMELINE_MAX:
            for start in range(0, len(self.lines), PRINT_BATCH):
                self._print(self.lines[start : start + PRINT_BATCH])
            return
        self._print(self.lines)
        hidden = self.count - len(self.lines) - len(self.tail)
        self.console.print(
            Text(f"... {hidden:,} more events (--all prints every line) ...", "dim italic"), soft_wrap=True
        )
        self._print(list(self.tail))

    def _print(self, lines: list[Line]) -> None:
        if lines:
            text = Text("\n").join(
                timeline_line(e, offset, partition, acks) for e, partition, offset, acks in lines
            )
            self.console.print(text, soft_wrap=True)


def _replay(
    source: Iterable[tuple[JournalEvent, int, int]],
    selection: _Selection,
    timeline: _Timeline | None,
    result: _Replay,
    *,
    track: bool,
) -> Iterator[JournalEvent]:
    """The selected events of the journal, folding each into ``result`` as it passes."""
    states, jobs_in_file = result.states, result.jobs_in_file
    partitions, offsets = result.partitions, result.offsets
    wanted = selection.wanted
    for event, partition, offset in source:
        result.total += 1
        job_id = event.job_id
        jobs_in_file.add(job_id)
        if not wanted(event, offset):
            continue
        result.selected += 1
        state = states.get(job_id)
        state = states[job_id] = evolve(state if state is not None else initial_state(job_id), event)
        if timeline is not None:
            acks = ack_progress(state, event) if isinstance(event, TaskAcknowledged) else None
            timeline.add((event, partition, offset, acks))
        if track:
            partitions.append(partition)
            offsets.append(offset)
        yield event


def _one_job(path: Path, job: str, result: _Replay) -> Iterator[tuple[JournalEvent, int, int]]:
    """The events of ``job`` in the journal file at ``path``; ``result`` ends with the file's record
    count and job ids as if every record had passed through :func:`_replay`."""
    tally = FileTally()
    try:
        for event, partition, offset, _ in read_journal_share(path, job.__eq__, tally):
            yield event, partition, offset
    finally:
        result.total = tally.records  # _replay counted only the events of job
        result.jobs_in_file |= tally.jobs


def _fail(console: Console, message: str) -> NoReturn:
    console.print(Text(message, "red"), soft_wrap=True)
    raise typer.Exit(USAGE_ERROR)


def _journal_topic(bootstrap: str, prefix: str) -> Iterator[tuple[JournalEvent, int, int]]:
    """The journal topic from its start to its current end, decoded: the same input as a file."""
    topic = Topics(prefix).checkpoints

    def refuse(message: LogMessage, problem: str) -> None:
        raise JournalFileError(
            f"{topic}[{message.partition}]@{message.offset}: {problem}; "
            "only the coordinator may write to the journal topic"
        )

    for event, message in read_journal_topic(bootstrap, topic, refuse):
        yield event, message.partition, message.offset


@app.command()
def replay(
    from_file: Annotated[
        Path | None,
        typer.Option("--from-file", "-f", help="A journal file (Avro container of cutline.JournalEntry)."),
    ] = None,
    job: Annotated[str | None, typer.Option("--job", "-j", help="Only this job's events and state.")] = None,
    until: Annotated[
        str | None,
        typer.Option(
            "--until",
            "-u",
            metavar="OFFSET|TIME",
            help="Last journal offset (1234) or last event time (2026-11-22T10:00:00Z, 1795338000000ms) "
            "to include.",
        ),
    ] = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="Check the invariants; exit 1 on a violation.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No timeline, only states and checks.")
    ] = False,
    print_all: Annotated[
        bool,
        typer.Option("--all", help=f"Print every timeline line, even past {FULL_TIMELINE_MAX:,} events."),
    ] = False,
    bootstrap: Annotated[
        str | None,
        typer.Option(
            "--bootstrap", envvar="CUTLINE_BOOTSTRAP", help="Replay the journal topic of this Kafka cluster."
        ),
    ] = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot", help="Draw the checkpoint timeline (durations, outcomes) to a .png/.svg/.html."
        ),
    ] = None,
) -> None:
    """Rebuild the coordinator's state from its journal (a file or the topic), at any offset or time."""
    console = Console(highlight=False)
    errors = Console(stderr=True, highlight=False)
    try:
        cut = parse_until(until)
    except ValueError as exc:
        _fail(errors, str(exc))
    if from_file is None and not bootstrap:
        _fail(
            errors,
            "replay needs a journal: --from-file F (`cutline journal-demo --out F` writes one) "
            "or --bootstrap HOST:PORT (or CUTLINE_BOOTSTRAP) to replay the journal topic",
        )
    if plot is not None and plot.suffix.lower() not in (".png", ".svg", ".html"):
        _fail(errors, f"--plot writes .png, .svg or .html files, not {plot.name!r}")
    if from_file is None and bootstrap:
        _check_broker(errors, bootstrap)
    origin = str(from_file) if from_file is not None else f"{Topics(topic_prefix).checkpoints} at {bootstrap}"
    timeline = None if quiet else _Timeline(console, print_all=print_all)
    result = _Replay()
    selection = _Selection(cut, job)
    # A whole file, quiet, is split by job over this process and a helper (coordinator/split_replay.py);
    # otherwise a file is checked by a helper process while this one folds it (coordinator/file_check.py).
    whole_file = from_file is not None and quiet and plot is None and job is None and cut == Cut()
    check = FileCheck(from_file, selection) if verify and from_file is not None and not whole_file else None
    check_here = verify and not whole_file and (check is None or not check.in_helper)
    verdict = Verdict(None)
    try:
        source: Iterable[tuple[JournalEvent, int, int]]
        if whole_file and from_file is not None:
            split = replay_file(from_file, verify=verify)
            result.states, result.jobs_in_file, verdict = split.states, split.jobs, split.verdict
            result.total = result.selected = split.records
            source = ()  # replayed
        elif from_file is not None and job is not None:
            source = _one_job(from_file, job, result)  # the other jobs' records are not built into events
        elif from_file is not None:
            source = read_journal_events(from_file)
        else:
            source = _journal_topic(str(bootstrap), topic_prefix)
        events = _replay(source, selection, timeline, result, track=check_here)
        if plot is not None:
            events = _plotted(events, outcomes := CheckpointOutcomes())
        if check_here:
            verdict = first_verdict(events, result.partitions, result.offsets)
        for _ in events:  # the rest, after a violation (or everything, without --verify)
            pass
        if check is not None and check.in_helper:
            verdict = check.verdict()
    except FileNotFoundError:
        _fail(errors, f"{from_file}: no such file; give the path of a journal file to --from-file")
    except IsADirectoryError:
        _fail(errors, f"{from_file} is a directory; give the path of a journal file to --from-file")
    except PermissionError:
        _fail(errors, f"{from_file}: permission denied; check the file's permissions")
    except JournalFileError as exc:
        _fail(errors, str(exc))
    except (KafkaException, TimeoutError) as exc:
        _fail(errors, f"cannot read the journal topic: {exc}")
    finally:
        if check is not None:
            check.close()
    if job is not None and job not in result.jobs_in_file:
        known = ", ".join(sorted(result.jobs_in_file)) or "none"
        _fail(errors, f"job {job!r} has no events in {origin}; its jobs are: {known}")
    if timeline is not None:
        timeline.finish()
    _print_states(console, result, job)
    scope = f" of job {job}" if job else ""
    console.print(
        f"replayed {result.selected:,} of {result.total:,} events{scope} up to {cut} from {origin}",
        soft_wrap=True,
    )
    if plot is not None:
        try:
            write_plot(outcomes.outcomes, plot, title=f"checkpoints in {origin}")
        except OSError as exc:
            _fail(errors, f"cannot write {plot}: {exc.strerror or exc}")
        console.print(f"plotted {len(outcomes.outcomes):,} checkpoints to {plot}", soft_wrap=True)
    if verify:
        if verdict.violation is not None:
            _print_violation(console, verdict)
            raise typer.Exit(VIOLATION)
        console.print(Text(f"verified: {result.selected:,} events, no violation", "green"), soft_wrap=True)


def _plotted(events: Iterator[JournalEvent], outcomes: CheckpointOutcomes) -> Iterator[JournalEvent]:
    for event in events:
        outcomes.add(event)
        yield event


def _print_states(console: Console, result: _Replay, job: str | None) -> None:
    job_ids = [job] if job is not None else sorted(result.states)
    for job_id in job_ids:
        console.print(job_summary(result.states.get(job_id) or initial_state(job_id)))


def _print_violation(console: Console, verdict: Verdict) -> None:
    violation = verdict.violation
    assert violation is not None
    index = violation.index
    position = ""
    if verdict.position is not None:
        partition, offset = verdict.position
        position = f", offset {offset}" + (f" in partition {partition}" if partition >= 0 else "")
    console.print(
        Text.assemble(
            ("violation ", "bold red"),
            (violation.rule, "bold"),
            f" at event #{index}{position}, job {violation.job_id}: {violation.message}",
        ),
        soft_wrap=True,
    )


# ---------------------------------------------------------------- journal-demo


@app.command("journal-demo", hidden=True)
def journal_demo(
    out: Annotated[Path, typer.Option("--out", "-o", help="The journal file to write.")],
    events: Annotated[int, typer.Option("--events", "-n", min=1, help="How many events.")] = 10_000,
    jobs: Annotated[int, typer.Option("--jobs", "-k", min=1, help="How many jobs.")] = 4,
    seed: Annotated[int, typer.Option("--seed", "-s", help="Random seed (same seed, same journal).")] = 0,
    codec: Annotated[Codec, typer.Option("--codec", help="Avro block codec.")] = "null",
) -> None:
    """Write a journal of simulated coordinator traffic (the real decider, simulated jobs and tasks)."""
    console = Console(stderr=True, highlight=False)
    generated = itertools.islice(simulate(random.Random(seed), jobs=jobs), events)
    try:
        with Progress(
            TextColumn("simulating"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=events < 100_000,
        ) as progress:
            task = progress.add_task("events", total=events)

            def counted() -> Iterator[JournalEvent]:
                for i, event in enumerate(generated, 1):
                    if i % 10_000 == 0:
                        progress.update(task, completed=i)
                    yield event

            written = write_journal(out, counted(), codec=codec)
    except OSError as exc:
        _fail(console, f"cannot write {out}: {exc.strerror or exc}")
    size = format_bytes(os.path.getsize(out))
    console.print(f"wrote {written:,} events of {jobs} jobs to {out} ({size}, seed {seed})", soft_wrap=True)


# ------------------------------------------------------------ service commands


def _need_bootstrap(console: Console, bootstrap: str | None) -> str:
    if not bootstrap:
        _fail(
            console,
            "no Kafka cluster given: pass --bootstrap HOST:PORT or set CUTLINE_BOOTSTRAP "
            "(`cutline broker` starts an embedded one)",
        )
    _check_broker(console, bootstrap)
    return bootstrap


def _need_free_port(console: Console, host: str, port: int) -> None:
    """Fail, saying what to do, when the web views could not listen on ``host:port`` (Faust would
    fail later, with a traceback). Bound with SO_REUSEADDR, as aiohttp binds."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        _fail(
            console,
            f"the web views cannot listen on {host}:{port} ({exc.strerror}): another coordinator worker "
            "or program has the port. Each worker on a machine needs its own: pass --web-port with a "
            "free one",
        )


def _check_broker(console: Console, bootstrap: str) -> None:
    from events.broker import wait_for_broker

    try:
        wait_for_broker(bootstrap, timeout=5)
    except TimeoutError as exc:
        _fail(console, f"no Kafka broker answers at {bootstrap} ({exc}); start one with `cutline broker`")


@app.command()
def broker(
    port: Annotated[
        int | None, typer.Option("--port", help="Port on 127.0.0.1 (default: a free one).")
    ] = None,
) -> None:
    """Run the embedded Kafka-protocol broker (Tansu, memory only) until Ctrl-C or SIGTERM."""
    from events.broker import BrokerError, EmbeddedBroker
    from events.stopping import StopSignals

    console = Console(highlight=False)
    # Installed before the broker starts: a SIGTERM while it starts stops it once it has
    try:
        with StopSignals() as stop, EmbeddedBroker(port) as running:
            console.print(f"bootstrap: {running.bootstrap}", soft_wrap=True)
            console.print(
                Text(
                    f"export CUTLINE_BOOTSTRAP={running.bootstrap}   (Ctrl-C stops; data is in memory only)",
                    "dim",
                ),
                soft_wrap=True,
            )
            stop.wait()
    except BrokerError as exc:
        _fail(Console(stderr=True), f"the broker did not start: {exc}")


topics_app = typer.Typer(help="Manage cutline's topics.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")


@topics_app.command("create")
def topics_create(
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="Partitions of every topic.")
    ] = DEFAULT_PARTITIONS,
) -> None:
    """Create every topic of the protocol with one partition count (existing ones are kept, and the
    missing ones get their count; fails, saying what to do, if existing ones differ)."""
    from coordinator.service.app import Settings, TopicLayoutError, ensure_topics, settle_partitions
    from events.broker import partition_counts

    errors = Console(stderr=True, highlight=False)
    bootstrap = _need_bootstrap(errors, bootstrap)
    try:
        settings = settle_partitions(Settings(bootstrap, topic_prefix, partitions=partitions))
        if settings.partitions != partitions:
            errors.print(
                f"the existing topics of {topic_prefix!r} have {settings.partitions} partitions: the missing "
                f"ones get {settings.partitions} too (--partitions {partitions} applies to a new prefix)",
                soft_wrap=True,
            )
        created = ensure_topics(settings)
        settle_partitions(settings)  # someone else may have created some at the same time
    except TopicLayoutError as exc:
        _fail(errors, str(exc))
    names = [*settings.topics.all, settings.ticks_topic, settings.snapshots_topic]
    counts = partition_counts(bootstrap, names)
    console = Console(highlight=False)
    for name in names:
        console.print(
            f"{'created' if name in created else 'exists '}  {name}  ({counts.get(name)} partitions)",
            soft_wrap=True,
        )


@app.command()
def doctor(
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    url: Annotated[
        str, typer.Option("--url", help="A coordinator worker's web views.")
    ] = "http://127.0.0.1:6066",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per check and line.")] = False,
) -> None:
    """Check what cutline needs here: Python, Java, the broker, the topics, the journal's
    retention and the coordinator; say what to fix. Exits 1 if a check failed."""
    import dataclasses
    import json

    from rich.table import Table

    from coordinator.doctor import Verdict, diagnose

    with Console(stderr=True).status("checking..."):
        checks = diagnose(bootstrap, topic_prefix, url)
    if as_json:
        for check in checks:
            print(json.dumps(dataclasses.asdict(check)))
        raise typer.Exit(VIOLATION if any(check.verdict is Verdict.FAIL for check in checks) else 0)
    colour = {Verdict.OK: "green", Verdict.WARN: "yellow", Verdict.FAIL: "red", Verdict.SKIPPED: "dim"}
    table = Table(title="cutline doctor", show_lines=True)
    for column in ("check", "", "found", "what to do"):
        table.add_column(column, overflow="fold")
    for check in checks:
        # Text, not markup: a found value such as "[redacted]" is printed as it is.
        verdict = Text(check.verdict, colour[check.verdict])
        table.add_row(check.name, verdict, Text(check.found), Text(check.fix))
    Console(highlight=False).print(table)
    if any(check.verdict is Verdict.FAIL for check in checks):
        raise typer.Exit(VIOLATION)


savepoints_app = typer.Typer(
    help="List, inspect and dispose of savepoints (Flink's `flink savepoint --dispose`).",
    no_args_is_help=True,
)
app.add_typer(savepoints_app, name="savepoints")


def _journal_states(
    console: Console, bootstrap: str | None, topic_prefix: str
) -> tuple[list[JournalEvent], dict[str, JobState]]:
    """The journal topic's effective events (fencing applied, foreign records skipped) and their fold."""
    from coordinator.decider import fold_jobs

    bootstrap = _need_bootstrap(console, bootstrap)
    skipped: list[str] = []
    events = [
        event
        for event, _ in read_journal_topic(
            bootstrap,
            Topics(topic_prefix).checkpoints,
            lambda message, problem: skipped.append(f"{message.partition}@{message.offset}: {problem}"),
        )
    ]
    if skipped:
        console.print(Text(f"{len(skipped)} journal records skipped (first: {skipped[0]})", "yellow"))
    return events, fold_jobs(events)


def _as_uri(path_or_uri: str) -> str:
    """A URI as it is; a local path as its absolute ``file:`` URI."""
    return path_or_uri if "://" in path_or_uri else Path(path_or_uri).absolute().as_uri()


def _directory_uri(console: Console, directory: str) -> StorageUri:
    from events.validation import InvalidUri, parse_uri

    uri = _as_uri(directory)
    try:
        parsed = parse_uri(uri)
    except InvalidUri as exc:
        _fail(console, f"{directory!r} is not a directory or storage URI cutline accepts: {exc}")
    if parsed.scheme != "file":
        _fail(console, f"{uri}: only savepoints on the local file system (file:) can be read here so far")
    return parsed


@savepoints_app.command("list")
def savepoints_list(
    job: Annotated[str, typer.Argument(help="The job id.")],
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per savepoint and line.")] = False,
) -> None:
    """The completed savepoints of JOB, from the journal: where, when, how big, still on disk, needed."""
    from rich.table import Table

    from coordinator.savepoints import canonical_location, needed_locations, savepoints
    from coordinator.timeline import format_bytes
    from events.participant import METADATA_FILE, UnsupportedLocation, local_path

    errors = Console(stderr=True, highlight=False)
    events, states = _journal_states(errors, bootstrap, topic_prefix)
    if job not in states:
        _fail(errors, f"the journal has no job {job!r}; `cutline replay --bootstrap ...` lists its jobs")
    found = savepoints(events, job)
    console = Console(highlight=False)
    if not found:
        console.print(
            f"job {job} has no completed savepoint; take one with `cutline trigger {job} --savepoint DIR`"
        )
        return
    needed = needed_locations(states)
    rows = []
    for savepoint in found:
        try:
            on_disk: bool | None = (local_path(savepoint.location) / METADATA_FILE).exists()
        except UnsupportedLocation:
            on_disk = None
        rows.append((savepoint, on_disk, needed.get(canonical_location(savepoint.location))))
    if as_json:
        import dataclasses
        import json

        for savepoint, on_disk, needed_by in rows:
            print(json.dumps({**dataclasses.asdict(savepoint), "on_disk": on_disk, "needed_by": needed_by}))
        return
    table = Table(title=f"savepoints of {job}")
    for column in ("id", "attempt", "completed", "took", "size", "tasks", "location", "on disk", "needed by"):
        table.add_column(
            column,
            justify="right" if column in ("id", "attempt", "took", "size", "tasks") else "left",
            overflow="fold",
        )
    for savepoint, on_disk, needed_by in rows:
        table.add_row(
            str(savepoint.checkpoint_id),
            str(savepoint.attempt),
            format_time(savepoint.completed_ms),
            f"{savepoint.duration_ms} ms",
            format_bytes(savepoint.size_bytes),
            str(savepoint.tasks) if savepoint.tasks >= 0 else "see show",
            savepoint.location,
            {True: "yes", False: "no", None: "?"}[on_disk],
            needed_by or "-",
        )
    console.print(table)


@savepoints_app.command("show")
def savepoints_show(
    directory: Annotated[
        str, typer.Argument(help="A savepoint (or checkpoint) directory: path or file: URI.")
    ],
) -> None:
    """What a savepoint's _metadata holds: job, id, offsets, and every task's state handle."""
    from rich.table import Table

    from coordinator.timeline import format_bytes
    from events.participant import MetadataProblem, read_checkpoint_metadata

    errors = Console(stderr=True, highlight=False)
    where = _directory_uri(errors, directory)
    try:
        completed = read_checkpoint_metadata(str(where))
    except MetadataProblem as exc:
        _fail(errors, str(exc))
    console = Console(highlight=False)
    console.print(
        f"[bold]{completed.kind.lower()} {completed.checkpoint_id}[/] of job [bold]{completed.job_id}[/] "
        f"(attempt {completed.attempt}), completed {format_time(completed.timestamp_ms)} in "
        f"{completed.duration_ms} ms, {format_bytes(completed.size_bytes)} in {len(completed.handles)} "
        f"handles\nlocation {completed.location}",
        soft_wrap=True,
    )
    offsets = Table(title="offsets (the next record to read, per topic:partition)")
    offsets.add_column("topic:partition")
    offsets.add_column("offset", justify="right")
    for key, offset in sorted(completed.offsets.items()):
        offsets.add_row(key, str(offset))
    console.print(offsets)
    handles = Table(title="state handles")
    for column in ("task", "uri", "size", "sha256", "present"):
        handles.add_column(column, justify="right" if column == "size" else "left")
    for task, handle in sorted(completed.handles.items()):
        handles.add_row(
            task,
            handle.uri,
            format_bytes(handle.size_bytes),
            handle.sha256[:12],
            "inline" if handle.inline is not None else _present(handle.uri, handle.size_bytes),
        )
    console.print(handles)


def _present(uri: str, size: int) -> str:
    from events.participant import UnsupportedLocation, local_path

    try:
        actual = local_path(uri).stat().st_size
    except UnsupportedLocation:
        return "?"
    except OSError:
        return "missing"
    return "yes" if actual == size else f"{actual} bytes, not {size}"


@savepoints_app.command("dispose")
def savepoints_dispose(
    directory: Annotated[str, typer.Argument(help="The savepoint directory: path or file: URI.")],
    savepoint_roots: Annotated[
        list[str],
        typer.Option(
            "--savepoint-root",
            help="A root savepoints may be disposed in (repeatable): the coordinator's --savepoint-root.",
        ),
    ],
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
) -> None:
    """Delete a savepoint's files: only inside a savepoint root, only a savepoint, and never one a
    restore may still need (the journal says which)."""
    from coordinator.savepoints import why_needed
    from coordinator.timeline import format_bytes
    from events.participant import METADATA_FILE, MetadataProblem, read_checkpoint_metadata
    from events.records import CheckpointKind
    from events.validation import InvalidUri, parse_uri

    errors = Console(stderr=True, highlight=False)
    where = _directory_uri(errors, directory)
    roots = []
    for root in savepoint_roots:
        try:
            roots.append(parse_uri(_as_uri(root)))
        except InvalidUri as exc:
            _fail(errors, f"--savepoint-root {root!r}: {exc}")
    path = Path(where.path)
    real = os.path.realpath(path)
    inside = [r for r in roots if where.within(r) and _real_below(real, os.path.realpath(r.path))]
    if not inside:
        _fail(
            errors,
            f"{where} is not inside a savepoint root ({', '.join(map(str, roots)) or 'none given'}, symbolic "
            "links resolved): cutline disposes of savepoints only there",
        )
    try:
        completed = read_checkpoint_metadata(str(where))
    except MetadataProblem as exc:
        _fail(errors, str(exc))
    if completed.kind is not CheckpointKind.SAVEPOINT:
        _fail(
            errors,
            f"{where} holds checkpoint {completed.checkpoint_id} of job {completed.job_id}: a job retains "
            "and discards its own checkpoints (CheckpointConfig.retained); dispose only of savepoints",
        )
    location = completed.location or str(where)
    try:
        base = parse_uri(location)
    except InvalidUri as exc:
        _fail(
            errors, f"{path / METADATA_FILE} names location {location!r}, which is not a storage URI: {exc}"
        )
    files = []
    for task, handle in sorted(completed.handles.items()):
        try:
            handle_uri = parse_uri(handle.uri)
        except InvalidUri as exc:
            _fail(errors, f"the state handle of {task} is not a storage URI ({exc}); nothing was deleted")
        if not handle_uri.within(base):
            _fail(
                errors,
                f"the state handle of {task} ({handle.uri}) is outside {location}; nothing was deleted",
            )
        if handle.inline is None:  # inline state lives in _metadata and the journal: no file of its own
            files.append(path.joinpath(*handle_uri.segments[len(base.segments) :]))
    _, states = _journal_states(errors, bootstrap, topic_prefix)
    for candidate in {location, str(where)}:
        reason = why_needed(candidate, states)
        if reason is not None:
            _fail(errors, f"{where} is still needed: {reason}. Nothing was deleted.")

    deleted = deleted_bytes = 0
    for file in files:
        if not _real_below(os.path.realpath(file), real):
            _fail(errors, f"{file} leads outside {where} through a symbolic link; stopped")
        try:
            size = file.stat().st_size
            file.unlink()
        except FileNotFoundError:
            continue
        deleted, deleted_bytes = deleted + 1, deleted_bytes + size
    (path / METADATA_FILE).unlink(missing_ok=True)
    console = Console(highlight=False)
    left = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    if not left:
        path.rmdir()
    console.print(
        f"disposed of savepoint {completed.checkpoint_id} of job {completed.job_id}: {deleted} state files "
        f"({format_bytes(deleted_bytes)}) and {METADATA_FILE} deleted"
        + (f"; left in place (not the savepoint's): {', '.join(left)}" if left else f"; {path} removed"),
        soft_wrap=True,
    )


def _real_below(real: str, root: str) -> bool:
    return real.startswith(root.rstrip("/") + "/")


@app.command()
def coordinator(
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    web_host: Annotated[str, typer.Option("--web-host", help="Address of the web views.")] = "127.0.0.1",
    web_port: Annotated[int, typer.Option("--web-port", help="Port of the web views.")] = 6066,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Faust's working directory.")] = Path(
        ".cutline/coordinator"
    ),
    loglevel: Annotated[str, typer.Option("--loglevel", help="debug, info, warning or error.")] = "warning",
    snapshot_interval: Annotated[
        float,
        typer.Option(
            "--snapshot-interval",
            min=0.1,
            help="Seconds between fold snapshots of each owned journal partition.",
        ),
    ] = 10.0,
    savepoint_root: Annotated[
        list[str] | None,
        typer.Option(
            "--savepoint-root",
            metavar="DIR",
            help="A directory (path or URI) savepoint targets may lie in; repeatable. Without any, "
            "savepoints may go only below the parent of each job's checkpoint location.",
        ),
    ] = None,
    session_timeout: Annotated[
        float,
        typer.Option(
            "--session-timeout",
            envvar="CUTLINE_SESSION_TIMEOUT",
            min=1.0,
            help="Seconds without a heartbeat before the group hands this worker's partitions to "
            "the others (Kafka's session.timeout.ms; Apache Kafka accepts 6 to 1800 by default).",
        ),
    ] = 6.0,
    partitions: Annotated[
        int,
        typer.Option(
            "--partitions",
            min=1,
            help="Partitions of the topics it creates when none exists yet. Existing topics keep "
            "theirs, and the coordinator uses their count.",
        ),
    ] = DEFAULT_PARTITIONS,
    watchdog: Annotated[
        bool,
        typer.Option(
            "--watchdog/--no-watchdog",
            envvar="CUTLINE_WATCHDOG",
            help="Run the worker as a child process and, when it dies (SIGKILL, OOM, a crash), tell "
            "its group at once, so that the other workers take its jobs without waiting for the "
            "session timeout.",
        ),
    ] = True,
) -> None:
    """Run the checkpoint coordinator (a Faust worker) until interrupted.

    Start it N times with the same prefix for N workers: each owns the jobs of its partitions."""
    import logging

    from events.validation import InvalidUri, canonical_uri

    errors = Console(stderr=True, highlight=False)
    bootstrap = _need_bootstrap(errors, bootstrap)
    _need_free_port(errors, web_host, web_port)
    roots = []
    for root in savepoint_root or []:
        uri = root if ":" in root.split("/", 1)[0] else Path(root).absolute().as_uri()
        try:
            roots.append(canonical_uri(uri))
        except InvalidUri as exc:
            _fail(errors, f"--savepoint-root {root!r}: {exc}")
    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if watchdog:
        child = _worker_command(
            bootstrap=bootstrap,
            topic_prefix=topic_prefix,
            web_host=web_host,
            web_port=web_port,
            data_dir=data_dir,
            loglevel=loglevel,
            snapshot_interval=snapshot_interval,
            savepoint_root=roots,
            session_timeout=session_timeout,
            partitions=partitions,
        )
        raise typer.Exit(_watch_worker(errors, bootstrap, child))
    # The worker's imports (Faust, aiokafka): not in the watchdog, which only waits.
    from coordinator.service.app import JournalRetentionError, Settings, TopicLayoutError, run
    from coordinator.service.watchdog import die_with_watchdog

    die_with_watchdog(bootstrap=bootstrap)
    errors.print(
        f"coordinator: topics {topic_prefix}*, dashboard on http://{web_host}:{web_port}/", soft_wrap=True
    )
    settings = Settings(
        bootstrap,
        topic_prefix,
        web_host=web_host,
        web_port=web_port,
        data_dir=data_dir,
        snapshot_interval=snapshot_interval,
        savepoint_roots=tuple(roots),
        session_timeout=session_timeout,
        partitions=partitions,
    )
    try:
        run(settings, loglevel)
    except (JournalRetentionError, TopicLayoutError) as exc:
        _fail(errors, str(exc))


def _worker_command(**options: object) -> list[str]:
    """``cutline coordinator --no-watchdog`` with ``options`` (the command's parameters, by name):
    the watchdog's worker. A list is given as its option repeated."""
    command = [sys.executable, "-m", "coordinator.cli", "coordinator", "--no-watchdog"]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        for item in value if isinstance(value, list) else [value]:
            command += [flag, str(item)]
    return command


def _watch_worker(errors: Console, bootstrap: str, command: list[str]) -> int:
    """Run the coordinator worker ``command`` under :func:`coordinator.service.watchdog.watch`."""
    from coordinator.service.watchdog import group_leaver, watch

    return watch(
        command, group_leaver(bootstrap), lambda message: errors.print(message, soft_wrap=True, markup=False)
    )


STRATEGY_NAMES = {kind.flink_name: kind for kind in RestartStrategyKind}


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    command: Annotated[list[str], typer.Argument(help="The job's driver: a command and its arguments.")],
    job: Annotated[str, typer.Option("--job", "-j", help="The job id (what the driver reports).")],
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    restart_strategy: Annotated[
        str | None,
        typer.Option(
            "--restart-strategy",
            help="none, fixed-delay, exponential-delay or failure-rate (restart-strategy.type); "
            "default: the driver's CheckpointConfig.restart_strategy (exponential-delay).",
        ),
    ] = None,
    attempts: Annotated[int, typer.Option(help="fixed-delay: restarts before giving up.")] = 1,
    delay_ms: Annotated[int, typer.Option(help="fixed-delay, failure-rate: wait before a restart.")] = 1_000,
    initial_backoff_ms: Annotated[int, typer.Option(help="exponential-delay: the first wait.")] = 1_000,
    max_backoff_ms: Annotated[int, typer.Option(help="exponential-delay: the longest wait.")] = 60_000,
    backoff_multiplier: Annotated[float, typer.Option(help="exponential-delay: growth per failure.")] = 1.5,
    reset_backoff_threshold_ms: Annotated[
        int, typer.Option(help="exponential-delay: quiet time that resets the backoff.")
    ] = 3_600_000,
    jitter_factor: Annotated[
        float, typer.Option(help="exponential-delay: +- this fraction of a wait.")
    ] = 0.1,
    attempts_before_reset_backoff: Annotated[
        int, typer.Option(help="exponential-delay: restarts in a row before giving up.")
    ] = 2**31 - 1,
    max_failures_per_interval: Annotated[int, typer.Option(help="failure-rate: failures tolerated.")] = 1,
    failure_rate_interval_ms: Annotated[int, typer.Option(help="failure-rate: the window.")] = 60_000,
    stop_timeout_s: Annotated[
        float,
        typer.Option(
            help="Seconds a driver gets to stop after SIGTERM before SIGKILL (a second Ctrl-C or "
            "SIGTERM: at once). With the default, cutline run stops within 10 s."
        ),
    ] = 8.0,
) -> None:
    """Run a job's driver and restart it as its restart strategy decides (Flink's restart strategies).

    The coordinator decides (a missed heartbeat or an exit with an error fails the attempt);
    this command carries it out: it waits the delay and starts the next attempt with
    CUTLINE_ATTEMPT and CUTLINE_RESTORE set, or exits 1 when the strategy gives up.
    Ctrl-C cancels the job. Example: cutline run --job wc --restart-strategy fixed-delay
    --attempts 3 -- python -m spark_tasks.wordcount ...
    """
    from coordinator.restart import strategy_problem
    from coordinator.service.run import RunSettings, supervise
    from events.records import RestartStrategy

    errors = Console(stderr=True, highlight=False)
    bootstrap = _need_bootstrap(errors, bootstrap)
    strategy = None
    if restart_strategy is not None:
        kind = STRATEGY_NAMES.get(restart_strategy)
        if kind is None:
            _fail(
                errors,
                f"unknown restart strategy {restart_strategy!r}: use one of {', '.join(STRATEGY_NAMES)}",
            )
        strategy = RestartStrategy(
            kind, attempts, delay_ms, initial_backoff_ms, max_backoff_ms, backoff_multiplier,
            reset_backoff_threshold_ms, jitter_factor, attempts_before_reset_backoff,
            max_failures_per_interval, failure_rate_interval_ms,
        )  # fmt: skip
        problem = strategy_problem(strategy)
        if problem is not None:
            _fail(errors, f"--restart-strategy {restart_strategy}: {problem}")
    settings = RunSettings(bootstrap, topic_prefix, job, tuple(command), strategy, stop_timeout_s)
    raise typer.Exit(supervise(settings, Console(highlight=False)))


@app.command()
def status(
    job: Annotated[str, typer.Argument(help="The job id.")],
    url: Annotated[str, typer.Option("--url", help="The coordinator's web views.")] = "http://127.0.0.1:6066",
) -> None:
    """Print a job's checkpoint statistics (the coordinator's /jobs/JOB/checkpoints) as tables."""
    import json
    import urllib.error
    import urllib.request

    from coordinator.timeline import render_status

    errors = Console(stderr=True, highlight=False)
    base = url.rstrip("/")
    try:
        with urllib.request.urlopen(f"{base}/jobs/{job}/checkpoints", timeout=10) as response:
            stats = json.load(response)
        with urllib.request.urlopen(f"{base}/jobs/{job}/checkpoints/config", timeout=10) as response:
            config = json.load(response)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            _fail(errors, f"the coordinator at {base} knows no job {job!r}; `curl {base}/jobs` lists them")
        _fail(errors, f"the coordinator at {base} answered {exc.code}: {exc.reason}")
    except (urllib.error.URLError, OSError) as exc:
        _fail(
            errors,
            f"no coordinator answers at {base} ({exc}); start one with `cutline coordinator` or pass --url",
        )
    Console(highlight=False).print(render_status(job, stats, config))


@app.command()
def trigger(
    job: Annotated[str, typer.Argument(help="The job id.")],
    savepoint: Annotated[
        str | None, typer.Option("--savepoint", help="Take a savepoint into this directory (a URI) instead.")
    ] = None,
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
) -> None:
    """Ask the coordinator for a checkpoint (or a savepoint) of JOB now."""
    import time
    import uuid

    from events.participant import JobDriver
    from events.records import CheckpointKind, CheckpointRequested

    errors = Console(stderr=True, highlight=False)
    bootstrap = _need_bootstrap(errors, bootstrap)
    target = None if savepoint is None else _as_uri(savepoint)
    request = CheckpointRequested(
        job_id=job,
        kind=CheckpointKind.SAVEPOINT if savepoint is not None else CheckpointKind.CHECKPOINT,
        timestamp_ms=time.time_ns() // 1_000_000,
        request_id=uuid.uuid4().hex,
        target=target,
    )
    with JobDriver(bootstrap, job, Topics(topic_prefix)) as driver:
        driver.request(request)
    Console(highlight=False).print(
        f"requested {request.kind.lower()} of {job} (request {request.request_id})"
        + (f" into {target}" if target else "")
        + f"; follow it with `cutline tail {Topics(topic_prefix).checkpoints}`",
        soft_wrap=True,
    )


@app.command()
def tail(
    topic: Annotated[
        str, typer.Argument(help="A topic name, or a short name: checkpoints, acks, barriers, ...")
    ],
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="Start at the oldest message.")
    ] = False,
    count: Annotated[int | None, typer.Option("--count", "-n", help="Stop after this many messages.")] = None,
    idle: Annotated[
        float | None, typer.Option("--idle", help="Stop after this many seconds without messages.")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="One JSON object per message (topic, offset, key, headers, decoded record)."
        ),
    ] = False,
) -> None:
    """Print the decoded events of a topic as they arrive (as JSON lines with --json, for any tool)."""
    import json
    import time

    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

    from coordinator.timeline import describe_record, record_json
    from events.kafka import consumer_config
    from events.log import partitions_of

    errors = Console(stderr=True, highlight=False)
    bootstrap = _need_bootstrap(errors, bootstrap)
    topics = Topics(topic_prefix)
    short = {name.removeprefix(topic_prefix): name for name in topics.all}
    name = short.get(topic, topic)
    consumer = Consumer(consumer_config(bootstrap))
    try:
        try:
            partitions = partitions_of(consumer, name)
        except KafkaException:
            known = ", ".join(sorted(short))
            _fail(
                errors,
                f"topic {name!r} does not exist; cutline's topics are: {known} "
                f"(with prefix {topic_prefix!r})",
            )
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        consumer.assign([TopicPartition(name, p, start) for p in partitions])
        console = Console(highlight=False)
        codec = default_codec()
        seen, last = 0, time.monotonic()
        while (count is None or seen < count) and (idle is None or time.monotonic() - last < idle):
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            last = time.monotonic()
            seen += 1
            headers = message.headers() or []
            pairs = list(headers.items()) if isinstance(headers, dict) else list(headers)
            if as_json:
                record = record_json(
                    codec, name, message.partition(), message.offset(), message.key(), message.value(), pairs
                )
                print(json.dumps(record), flush=True)
                continue
            console.print(
                describe_record(codec, message.partition(), message.offset(), message.value(), pairs),
                soft_wrap=True,
            )
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


@app.command()
def demo(
    duration: Annotated[
        float,
        typer.Option(
            "--duration",
            min=10,
            help="Seconds of input to produce, at least (the input goes on until the restarted job "
            "has completed two checkpoints).",
        ),
    ] = 40.0,
    bootstrap: Annotated[
        str | None,
        typer.Option(
            "--bootstrap",
            envvar="CUTLINE_BOOTSTRAP",
            help="A real Kafka cluster instead of the embedded broker (fresh topics each run).",
        ),
    ] = None,
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="Partitions (tasks) of the input.")
    ] = 4,
    interval: Annotated[int, typer.Option("--interval", min=100, help="Checkpoint interval in ms.")] = 1000,
    keyed: Annotated[
        int,
        typer.Option(
            "--keyed",
            min=0,
            max=128,
            help="Shuffle partitions of the keyed word count (one task and ack each); 0 keeps state "
            "per input partition instead.",
        ),
    ] = 8,
) -> None:
    """The main job: a keyed Spark word count that checkpoints with cutline, crashes, restores, and
    checks exactly-once."""
    from coordinator.demo import DemoError, DemoOptions, run_demo, summary
    from events.stopping import StopRequested, StopSignals

    console = Console(highlight=False)
    # SIGTERM, like Ctrl-C, stops everything the demo started (the Spark driver in its own session)
    try:
        with StopSignals() as stop:
            result = run_demo(
                DemoOptions(
                    duration=duration,
                    bootstrap=bootstrap,
                    partitions=partitions,
                    interval_ms=interval,
                    keyed=keyed,
                ),
                console,
                stop,
            )
    except StopRequested:
        console.print(Text("interrupted: everything the demo started was stopped", "yellow"))
        raise typer.Exit(130) from None
    except DemoError as exc:
        console.print(Text(f"demo failed: {exc}", "bold red"), soft_wrap=True)
        console.print(Text("exactly-once: not checked", "bold red"))
        raise typer.Exit(1) from None
    console.print(summary(result))
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
        return
    console.print(Text("exactly-once: FAILED", "bold red"), soft_wrap=True)
    if result.restored_from is None:
        console.print("  the restarted job did not restore from a checkpoint")
    for word in sorted(set(result.produced) | set(result.counted)):
        if result.produced[word] != result.counted[word] or result.final.get(word) != result.produced[word]:
            console.print(
                f"  {word}: produced {result.produced[word]}, counted {result.counted[word]}, "
                f"final count {result.final.get(word)}"
            )
    raise typer.Exit(1)


def main() -> None:
    """The ``cutline`` console script."""
    from events.extras import MissingExtra

    try:
        app()
    except MissingExtra as exc:
        Console(stderr=True, highlight=False).print(Text(str(exc), "red"), soft_wrap=True)
        raise SystemExit(USAGE_ERROR) from None


if __name__ == "__main__":
    main()
