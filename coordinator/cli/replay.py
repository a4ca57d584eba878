"""``cutline replay`` and ``cutline journal-demo``: fold a journal at any offset or time."""

from __future__ import annotations

import itertools
import os
import random
from array import array
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, TypeAlias

import typer
from confluent_kafka import KafkaException
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.text import Text

from coordinator.cli.common import (
    VIOLATION,
    TopicPrefix,
    check_broker,
    fail,
)
from coordinator.core.decider import evolve
from coordinator.core.state import JobState, initial_state
from coordinator.replay.file_check import FileCheck, FirstViolation, first_verdict
from coordinator.replay.journal import (
    ContainerCodec,
    FileTally,
    JournalFileError,
    read_journal_events,
    read_journal_share,
    write_journal,
)
from coordinator.replay.plot import CheckpointOutcomes, write_plot
from coordinator.replay.selection import JournalSource, Selection, journal_source, parse_until
from coordinator.replay.split import replay_file
from coordinator.replay.timeline import Acks, ack_progress, format_bytes, job_summary, timeline_line
from coordinator.simulation.traffic import simulate
from events.kafka.log import LogMessage, read_journal_topic
from events.kafka.refusals import AccessRefused
from events.wire.records import JournalEvent, TaskAcknowledged
from events.wire.topics import DEFAULT_PREFIX, Topics

FULL_TIMELINE_MAX = 10_000
"""Longer timelines print only their first and last lines (unless --all)."""
TIMELINE_EDGE = 20
PRINT_BATCH = 1_000

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
    selection: Selection,
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
        fail(errors, str(exc))
    _check_options(errors, from_file, bootstrap, plot)
    origin = str(from_file) if from_file is not None else f"{Topics(topic_prefix).checkpoints} at {bootstrap}"
    timeline = None if quiet else _Timeline(console, print_all=print_all)
    result = _Replay()
    selection = Selection(cut, job)
    source = journal_source(
        from_file=from_file is not None, selection=selection, quiet=quiet, plot=plot is not None
    )
    split = source is JournalSource.SPLIT
    # A whole file, quiet, is split by job over this process and a helper (coordinator/replay/split.py);
    # otherwise a file is checked by a helper process while this one folds it
    # (coordinator/replay/file_check.py).
    check = FileCheck(from_file, selection) if verify and from_file is not None and not split else None
    check_here = verify and not split and (check is None or not check.in_helper)
    outcomes = CheckpointOutcomes() if plot is not None else None
    with _journal_errors(errors, from_file):
        try:
            verdict = FirstViolation(None)
            events: Iterator[JournalEvent] = iter(())
            if split and from_file is not None:
                verdict = _replay_split(from_file, result, verify=verify)
            else:
                journal = _journal(source, from_file, job, bootstrap, topic_prefix, result)
                events = _replay(journal, selection, timeline, result, track=check_here)
            if outcomes is not None:
                events = _plotted(events, outcomes)
            if check_here:
                verdict = first_verdict(events, result.partitions, result.offsets)
            for _ in events:  # the rest, after a violation (or everything, without --verify)
                pass
            if check is not None and check.in_helper:
                verdict = check.verdict()
        finally:
            if check is not None:
                check.close()
    _print_replayed(console, errors, result, selection, origin, timeline)
    if plot is not None and outcomes is not None:
        _write_plot(console, errors, outcomes, plot, origin)
    if verify:
        if verdict.violation is not None:
            _print_violation(console, verdict)
            raise typer.Exit(VIOLATION)
        console.print(Text(f"verified: {result.selected:,} events, no violation", "green"), soft_wrap=True)


def _check_options(errors: Console, from_file: Path | None, bootstrap: str | None, plot: Path | None) -> None:
    if from_file is None and not bootstrap:
        fail(
            errors,
            "replay needs a journal: --from-file F (`cutline journal-demo --out F` writes one) "
            "or --bootstrap HOST:PORT (or CUTLINE_BOOTSTRAP) to replay the journal topic",
        )
    if plot is not None and plot.suffix.lower() not in (".png", ".svg", ".html"):
        fail(errors, f"--plot writes .png, .svg or .html files, not {plot.name!r}")
    if from_file is None and bootstrap:
        check_broker(errors, bootstrap)


@contextmanager
def _journal_errors(errors: Console, from_file: Path | None) -> Iterator[None]:
    """Fail, saying what to do, when the journal (the file or the topic) cannot be read."""
    try:
        yield
    except FileNotFoundError:
        fail(errors, f"{from_file}: no such file; give the path of a journal file to --from-file")
    except IsADirectoryError:
        fail(errors, f"{from_file} is a directory; give the path of a journal file to --from-file")
    except AccessRefused as exc:  # the broker's, not the file system's
        fail(errors, str(exc))
    except PermissionError:
        fail(errors, f"{from_file}: permission denied; check the file's permissions")
    except JournalFileError as exc:
        fail(errors, str(exc))
    except (KafkaException, TimeoutError) as exc:
        fail(errors, f"cannot read the journal topic: {exc}")


def _replay_split(from_file: Path, result: _Replay, *, verify: bool) -> FirstViolation:
    """The whole file, split by job over this process and a helper: its states, in ``result``."""
    split = replay_file(from_file, verify=verify)
    result.states, result.jobs_in_file = split.states, split.jobs
    result.total = result.selected = split.records
    return split.verdict


def _journal(
    source: JournalSource,
    from_file: Path | None,
    job: str | None,
    bootstrap: str | None,
    topic_prefix: str,
    result: _Replay,
) -> Iterable[tuple[JournalEvent, int, int]]:
    """The journal's events with their partitions and offsets, read as ``source`` says."""
    if source is JournalSource.ONE_JOB and from_file is not None and job is not None:
        return _one_job(from_file, job, result)  # the other jobs' records are not built into events
    if source is JournalSource.FILE and from_file is not None:
        return read_journal_events(from_file)
    return _journal_topic(str(bootstrap), topic_prefix)


def _print_replayed(
    console: Console,
    errors: Console,
    result: _Replay,
    selection: Selection,
    origin: str,
    timeline: _Timeline | None,
) -> None:
    job = selection.job
    if job is not None and job not in result.jobs_in_file:
        known = ", ".join(sorted(result.jobs_in_file)) or "none"
        fail(errors, f"job {job!r} has no events in {origin}; its jobs are: {known}")
    if timeline is not None:
        timeline.finish()
    _print_states(console, result, job)
    scope = f" of job {job}" if job else ""
    console.print(
        f"replayed {result.selected:,} of {result.total:,} events{scope} up to {selection.cut} from {origin}",
        soft_wrap=True,
    )


def _write_plot(
    console: Console, errors: Console, outcomes: CheckpointOutcomes, plot: Path, origin: str
) -> None:
    try:
        write_plot(outcomes.outcomes, plot, title=f"checkpoints in {origin}")
    except OSError as exc:
        fail(errors, f"cannot write {plot}: {exc.strerror or exc}")
    console.print(f"plotted {len(outcomes.outcomes):,} checkpoints to {plot}", soft_wrap=True)


def _plotted(events: Iterator[JournalEvent], outcomes: CheckpointOutcomes) -> Iterator[JournalEvent]:
    for event in events:
        outcomes.add(event)
        yield event


def _print_states(console: Console, result: _Replay, job: str | None) -> None:
    job_ids = [job] if job is not None else sorted(result.states)
    for job_id in job_ids:
        console.print(job_summary(result.states.get(job_id) or initial_state(job_id)))


def _print_violation(console: Console, verdict: FirstViolation) -> None:
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


def journal_demo(
    out: Annotated[Path, typer.Option("--out", "-o", help="The journal file to write.")],
    events: Annotated[int, typer.Option("--events", "-n", min=1, help="How many events.")] = 10_000,
    jobs: Annotated[int, typer.Option("--jobs", "-k", min=1, help="How many jobs.")] = 4,
    seed: Annotated[int, typer.Option("--seed", "-s", help="Random seed (same seed, same journal).")] = 0,
    codec: Annotated[ContainerCodec, typer.Option("--codec", help="Avro block codec.")] = "null",
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
        fail(console, f"cannot write {out}: {exc.strerror or exc}")
    size = format_bytes(os.path.getsize(out))
    console.print(f"wrote {written:,} events of {jobs} jobs to {out} ({size}, seed {seed})", soft_wrap=True)
