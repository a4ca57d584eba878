"""The ``cutline`` command line (DESIGN §8).

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
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, NoReturn, TypeAlias

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.text import Text

from coordinator.decider import evolve
from coordinator.invariants import Violation, violations
from coordinator.journal import Codec, JournalFileError, read_journal_events, write_journal
from coordinator.simulate import simulate
from coordinator.state import JobState, initial_state
from coordinator.timeline import Acks, ack_progress, format_bytes, format_time, job_summary, timeline_line
from events.records import JournalEvent, TaskAcknowledged

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


@app.callback()
def cutline() -> None:
    """Flink-style checkpoint coordination for Spark Structured Streaming and Kafka."""


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
    path: Path, cut: Cut, job: str | None, timeline: _Timeline | None, result: _Replay, *, track: bool
) -> Iterator[JournalEvent]:
    """The selected events of the journal, folding each into ``result`` as it passes."""
    states, jobs_in_file = result.states, result.jobs_in_file
    partitions, offsets = result.partitions, result.offsets
    for event, partition, offset in read_journal_events(path):
        result.total += 1
        job_id = event.job_id
        jobs_in_file.add(job_id)
        if (job is not None and job_id != job) or not cut.includes(event, offset):
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


def _fail(console: Console, message: str) -> NoReturn:
    console.print(Text(message, "red"), soft_wrap=True)
    raise typer.Exit(USAGE_ERROR)


def _replay_from_kafka(console: Console, bootstrap: str) -> NoReturn:
    """Replay the journal topic itself (issue 3): consume ``cutline.checkpoints`` from the start and
    feed the same fold, timeline and checks as a file replay."""
    _fail(
        console,
        f"replay from Kafka: see issue 3, not available yet (--bootstrap {bootstrap}); use --from-file F",
    )


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
        typer.Option("--bootstrap", envvar="CUTLINE_BOOTSTRAP", help="Kafka bootstrap servers (not yet)."),
    ] = None,
) -> None:
    """Rebuild the coordinator's state from its journal, at any offset or time."""
    console = Console(highlight=False)
    errors = Console(stderr=True, highlight=False)
    try:
        cut = parse_until(until)
    except ValueError as exc:
        _fail(errors, str(exc))
    if from_file is None:
        if bootstrap:
            _replay_from_kafka(errors, bootstrap)
        _fail(
            errors,
            "replay needs --from-file F (a journal file; `cutline journal-demo --out F` writes one); "
            "replay from Kafka (--bootstrap) is not available yet",
        )
    timeline = None if quiet else _Timeline(console, print_all=print_all)
    result = _Replay()
    try:
        events = _replay(from_file, cut, job, timeline, result, track=verify)
        violation = _first_violation(events) if verify else None
        for _ in events:  # the rest, after a violation (or everything, without --verify)
            pass
    except FileNotFoundError:
        _fail(errors, f"{from_file}: no such file; give the path of a journal file to --from-file")
    except IsADirectoryError:
        _fail(errors, f"{from_file} is a directory; give the path of a journal file to --from-file")
    except PermissionError:
        _fail(errors, f"{from_file}: permission denied; check the file's permissions")
    except JournalFileError as exc:
        _fail(errors, str(exc))
    if job is not None and job not in result.jobs_in_file:
        known = ", ".join(sorted(result.jobs_in_file)) or "none"
        _fail(errors, f"job {job!r} has no events in {from_file}; its jobs are: {known}")
    if timeline is not None:
        timeline.finish()
    _print_states(console, result, job)
    scope = f" of job {job}" if job else ""
    console.print(
        f"replayed {result.selected:,} of {result.total:,} events{scope} up to {cut} from {from_file}",
        soft_wrap=True,
    )
    if verify:
        if violation is not None:
            _print_violation(console, violation, result)
            raise typer.Exit(VIOLATION)
        console.print(Text(f"verified: {result.selected:,} events, no violation", "green"), soft_wrap=True)


def _first_violation(events: Iterator[JournalEvent]) -> Violation | None:
    for violation in violations(events):
        return violation
    return None


def _print_states(console: Console, result: _Replay, job: str | None) -> None:
    job_ids = [job] if job is not None else sorted(result.states)
    for job_id in job_ids:
        console.print(job_summary(result.states.get(job_id) or initial_state(job_id)))


def _print_violation(console: Console, violation: Violation, result: _Replay) -> None:
    index = violation.index
    position = ""
    if 0 <= index < len(result.offsets):
        partition, offset = result.partitions[index], result.offsets[index]
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


def main() -> None:
    """The ``cutline`` console script."""
    app()


if __name__ == "__main__":
    main()
