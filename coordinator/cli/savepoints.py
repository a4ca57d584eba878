"""``cutline savepoints list/show/dispose``: the journal's savepoints, and disposing of them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from coordinator.cli.common import (
    Bootstrap,
    TopicPrefix,
    as_uri,
    fail,
    need_bootstrap,
    need_topics,
)
from coordinator.cli.help import CutlineCommand, CutlineGroup
from coordinator.core.savepoints import (
    Disposal,
    Presence,
    Refused,
    Root,
    Savepoint,
    plan_disposal,
    real_below,
    refuse_needed,
    refuse_outside_roots,
)
from coordinator.core.state import JobState
from coordinator.replay.timeline import format_bytes, format_time
from events.kafka.log import read_journal_topic
from events.wire.records import CheckpointCompleted, CheckpointKind, JournalEvent
from events.wire.topics import DEFAULT_PREFIX, Topics
from events.wire.validation import StorageUri

savepoints_app = typer.Typer(
    help="List, inspect and dispose of savepoints (Flink's `flink savepoint --dispose`).",
    no_args_is_help=True,
    cls=CutlineGroup,
)


def _journal_states(
    console: Console, bootstrap: str | None, topic_prefix: str
) -> tuple[list[JournalEvent], dict[str, JobState]]:
    """The journal topic's effective events (fencing applied, foreign records skipped) and their fold."""
    from coordinator.core.decider import fold_jobs

    bootstrap = need_bootstrap(console, bootstrap)
    need_topics(console, bootstrap, topic_prefix, [Topics(topic_prefix).checkpoints])
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


def _directory_uri(console: Console, directory: str) -> StorageUri:
    from events.wire.validation import InvalidUri, parse_uri

    uri = as_uri(directory)
    try:
        parsed = parse_uri(uri)
    except InvalidUri as exc:
        fail(console, f"{directory!r} is not a directory or storage URI cutline accepts: {exc}")
    if parsed.scheme != "file":
        fail(console, f"{uri}: only savepoints on the local file system (file:) can be read here so far")
    return parsed


@savepoints_app.command("list", cls=CutlineCommand)
def savepoints_list(
    job: Annotated[str, typer.Argument(help="The job id.")],
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per savepoint and line.")] = False,
) -> None:
    """The completed savepoints of JOB, from the journal: where, when, how big, still on disk, needed."""
    from rich.table import Table

    from coordinator.core.savepoints import canonical_location, needed_locations, savepoints

    errors = Console(stderr=True, highlight=False)
    events, states = _journal_states(errors, bootstrap, topic_prefix)
    if job not in states:
        fail(errors, f"the journal has no job {job!r}; `cutline replay --bootstrap ...` lists its jobs")
    found = savepoints(events, job)
    console = Console(highlight=False)
    if not found:
        console.print(
            f"job {job} has no completed savepoint; take one with `cutline trigger {job} --savepoint DIR`"
        )
        return
    needed = needed_locations(states)
    rows = [
        (savepoint, _presence(events, savepoint), needed.get(canonical_location(savepoint.location)))
        for savepoint in found
    ]
    if as_json:
        import dataclasses
        import json

        for savepoint, present, needed_by in rows:
            body = {**dataclasses.asdict(savepoint), "on_disk": present.on_disk, "metadata": present.metadata}
            print(json.dumps({**body, "needed_by": needed_by}))
        return
    table = Table(title=f"savepoints of {job}")
    for column in ("id", "attempt", "completed", "took", "size", "tasks", "location", "on disk", "needed by"):
        table.add_column(
            column,
            justify="right" if column in ("id", "attempt", "took", "size", "tasks") else "left",
            overflow="fold",
        )
    for savepoint, present, needed_by in rows:
        table.add_row(
            str(savepoint.checkpoint_id),
            str(savepoint.attempt),
            format_time(savepoint.completed_ms),
            f"{savepoint.duration_ms} ms",
            format_bytes(savepoint.size_bytes),
            str(savepoint.tasks) if savepoint.tasks >= 0 else "see show",
            savepoint.location,
            present.shown,
            needed_by or "-",
        )
    console.print(table)


def _presence(events: list[JournalEvent], savepoint: Savepoint) -> Presence:
    """Whether ``savepoint``'s ``_metadata``, or else every state file its journal record names, is
    on the local disk."""
    from coordinator.core.savepoints import presence, state_files
    from events.task.participant import METADATA_FILE, UnsupportedLocation, local_path

    def exists(uri: str) -> bool | None:
        try:
            return local_path(uri).is_file()
        except UnsupportedLocation:
            return None

    metadata = exists(f"{savepoint.location.rstrip('/')}/{METADATA_FILE}")
    files = [] if metadata else [exists(uri) for uri in state_files(events, savepoint)]
    return presence(metadata, files)


@savepoints_app.command("show", cls=CutlineCommand)
def savepoints_show(
    directory: Annotated[
        str, typer.Argument(help="A savepoint (or checkpoint) directory: path or file: URI.")
    ],
) -> None:
    """What a savepoint's _metadata holds: job, id, offsets, and every task's state handle."""
    from rich.table import Table

    from events.task.participant import MetadataProblem, read_checkpoint_metadata

    errors = Console(stderr=True, highlight=False)
    where = _directory_uri(errors, directory)
    try:
        completed = read_checkpoint_metadata(str(where))
    except MetadataProblem as exc:
        fail(errors, str(exc))
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
    from events.task.participant import UnsupportedLocation, local_path

    try:
        actual = local_path(uri).stat().st_size
    except UnsupportedLocation:
        return "?"
    except OSError:
        return "missing"
    return "yes" if actual == size else f"{actual} bytes, not {size}"


@savepoints_app.command("dispose", cls=CutlineCommand)
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
    from events.task.participant import MetadataProblem, read_checkpoint_metadata
    from events.wire.validation import InvalidUri, parse_uri

    errors = Console(stderr=True, highlight=False)
    where = _directory_uri(errors, directory)
    roots = []
    for root in savepoint_roots:
        try:
            uri = parse_uri(as_uri(root))
        except InvalidUri as exc:
            fail(errors, f"--savepoint-root {root!r}: {exc}")
        roots.append(Root(uri, os.path.realpath(uri.path)))
    path = Path(where.path)
    real = os.path.realpath(path)
    _refuse(errors, refuse_outside_roots(where, real, roots))
    try:
        completed = read_checkpoint_metadata(str(where))
    except MetadataProblem as exc:
        fail(errors, str(exc))
    pieces = _keyed_pieces(errors, completed) if completed.kind is CheckpointKind.SAVEPOINT else {}
    disposal = plan_disposal(where, completed, pieces)
    if isinstance(disposal, Refused):
        fail(errors, disposal.reason)
    _, states = _journal_states(errors, bootstrap, topic_prefix)
    _refuse(errors, refuse_needed(where, disposal, states))
    _dispose(where, real, disposal, errors)


def _keyed_pieces(errors: Console, completed: CheckpointCompleted) -> dict[str, list[str]]:
    """The pieces each keyed task's manifest lists: a keyed savepoint's state is in them."""
    from events.task.manifest import Manifest, is_keyed_task
    from events.task.participant import SnapshotCorrupted, UnsupportedLocation, load_task_snapshot

    pieces = {}
    for task, handle in sorted(completed.handles.items()):
        if not is_keyed_task(task):
            continue
        try:
            manifest = Manifest.from_bytes(load_task_snapshot(handle), handle.uri)
        except FileNotFoundError:
            continue  # a disposal stopped half way: the pieces went before their manifest
        except (OSError, SnapshotCorrupted, UnsupportedLocation) as exc:
            fail(
                errors,
                f"the manifest of {task} cannot be read ({exc}), so its pieces are unknown; "
                "nothing was deleted",
            )
        pieces[task] = [piece.uri for piece in manifest.pieces]
    return pieces


def _refuse(errors: Console, refused: Refused | None) -> None:
    if refused is not None:
        fail(errors, refused.reason)


def _dispose(where: StorageUri, real: str, disposal: Disposal, errors: Console) -> None:
    """Delete the savepoint's state files (not through a symbolic link out of ``where``), its
    ``_metadata``, and its directory if nothing else is left in it."""
    from events.task.participant import METADATA_FILE

    path = Path(where.path)
    deleted = deleted_bytes = 0
    for file in (path.joinpath(*segments) for segments in disposal.files):
        if not real_below(os.path.realpath(file), real):
            fail(errors, f"{file} leads outside {where} through a symbolic link; stopped")
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
        f"disposed of savepoint {disposal.checkpoint_id} of job {disposal.job_id}: {deleted} state files "
        f"({format_bytes(deleted_bytes)}) and {METADATA_FILE} deleted"
        + (f"; left in place (not the savepoint's): {', '.join(left)}" if left else f"; {path} removed"),
        soft_wrap=True,
    )
