"""``cutline state show/diff``: what a job held at a checkpoint or savepoint, without Spark.

Reads the checkpoint's ``_metadata`` and its state files (:mod:`events.task.state_view`): a keyed
step's keys and states, each with the checkpoint that last wrote it, and a per-partition task's
state; and the keys added, removed and changed between two checkpoints. A state that is UTF-8 JSON
(a :class:`~spark_tasks.keyed.KeyedStep`'s default serializer) is shown as JSON, any other as
``base64:``; where the step recorded its state's type, ``show`` gives each state decoded as that
type (:func:`events.task.state_view.typed_states`). Needs the ``spark`` extra (pyarrow reads the
pieces).
"""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from coordinator.cli.common import Bootstrap, TopicPrefix, fail, need_bootstrap
from coordinator.cli.help import CutlineGroup
from events.wire.topics import DEFAULT_PREFIX

if TYPE_CHECKING:
    from events.task.state_view import StateChange, StateRow
    from events.wire.records import CheckpointCompleted

state_app = typer.Typer(
    help="What a job held at a checkpoint or savepoint, and what changed between two (no Spark needed).",
    no_args_is_help=True,
    cls=CutlineGroup,
)

Location = Annotated[
    str,
    typer.Argument(
        metavar="DIR|ID",
        help="A checkpoint or savepoint directory (it holds _metadata; a path or a URI: s3://…), or "
        "with --job a checkpoint id.",
    ),
]
Job = Annotated[
    str | None,
    typer.Option("--job", metavar="JOB", help="Take checkpoint ids, resolved through JOB's journal."),
]
Uid = Annotated[str | None, typer.Option("--uid", metavar="STEP", help="Only this keyed step's state.")]
Task = Annotated[
    str | None,
    typer.Option(
        "--task",
        metavar="TASK",
        help="Only this task's state: keyed-N (a shuffle partition), or topic-partition (a per-partition "
        "task's or a participant's snapshot).",
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="One JSON object per line, for any tool.")]


def shown(state: bytes | None) -> Any:
    """A state as people read it: its JSON when it is UTF-8 JSON, else ``base64:...``."""
    if state is None:
        return None
    try:
        return json.loads(state.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "base64:" + base64.b64encode(state).decode()


def _completed(
    errors: Console, where: str, job: str | None, bootstrap: str | None, prefix: str
) -> CheckpointCompleted:
    """The completion ``where`` names: a directory's ``_metadata``, or with ``job`` the completion of
    checkpoint id ``where`` in the job's journal (fencing applied)."""
    from events.extras import MissingExtra, require
    from events.task.completion_metadata import MetadataUnavailable, resolve_completion
    from events.task.participant import MetadataProblem, read_checkpoint_metadata

    try:
        require("spark", "cutline state (reading keyed state pieces)")
        if job is None:
            directory = where if "://" in where else Path(where).resolve()
            return resolve_completion(read_checkpoint_metadata(directory))
        return resolve_completion(_journaled(errors, where, job, bootstrap, prefix))
    except (MissingExtra, MetadataProblem, MetadataUnavailable) as exc:
        fail(errors, str(exc))


def _journaled(
    errors: Console, where: str, job: str, bootstrap: str | None, prefix: str
) -> CheckpointCompleted:
    from events.task.participant import JobDriver, valid_completions
    from events.wire.records import CheckpointCompleted
    from events.wire.topics import Topics

    if not where.isdigit():
        fail(errors, f"with --job, give checkpoint ids, not {where!r}")
    bootstrap = need_bootstrap(errors, bootstrap)
    with JobDriver(bootstrap, job, Topics(prefix)) as driver:
        completed = valid_completions(driver.journal((CheckpointCompleted,)))
    for found in completed:
        if found.checkpoint_id == int(where):
            return found
    known = ", ".join(str(c.checkpoint_id) for c in completed[-10:]) or "none"
    fail(errors, f"job {job!r} has no completed checkpoint {where} in its journal (the latest: {known})")


def _rows(
    errors: Console, completed: CheckpointCompleted, uid: str | None, task: str | None = None
) -> list[StateRow]:
    from events.task.participant import SnapshotCorrupted
    from events.task.state_view import require_uid, state_rows

    try:
        require_uid(completed, uid)
        return state_rows(completed, uid, task)
    except (LookupError, SnapshotCorrupted, OSError) as exc:
        fail(errors, f"checkpoint {completed.checkpoint_id}: {exc}")


def _values(
    errors: Console, completed: CheckpointCompleted, uid: str | None, rows: list[StateRow]
) -> list[Any]:
    """Each row's state as people read it: decoded as the step's recorded state type where it has
    one (keyed rows), else :func:`shown`."""
    import pyarrow as pa

    from events.task.state_view import StateDoesNotFit, recorded_state_type, typed_states

    state_type = recorded_state_type(completed, uid)
    values: list[Any] = []
    for (task, keyed), group in itertools.groupby(rows, key=lambda r: (r.task, r.key_group is not None)):
        same = list(group)
        if state_type is None or not keyed:
            values += [shown(row.state) for row in same]
            continue
        states = pa.array([row.state for row in same], pa.binary())
        try:
            values += typed_states(states, state_type, pa.array([row.key for row in same]), task).to_pylist()
        except StateDoesNotFit as exc:
            fail(errors, f"checkpoint {completed.checkpoint_id}: {exc}")
    return values


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def show(
    location: Location,
    job: Job = None,
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    uid: Uid = None,
    task: Task = None,
    key: Annotated[str | None, typer.Option("--key", help="Only this key.")] = None,
    limit: Annotated[int, typer.Option("--limit", metavar="N", help="At most N rows (0: all).")] = 50,
    as_json: AsJson = False,
) -> None:
    """Every key's state at the checkpoint in DIR, or checkpoint ID of --job (Flink's State Processor
    API, read side), typed as the step declared it."""
    errors = Console(stderr=True, highlight=False)
    completed = _completed(errors, location, job, bootstrap, topic_prefix)
    rows = [row for row in _rows(errors, completed, uid, task) if key is None or row.key == key]
    if key is not None and not rows:
        fail(
            errors,
            f"checkpoint {completed.checkpoint_id} holds no key {key!r}" + (f" of {uid!r}" if uid else ""),
        )
    total, rows = len(rows), rows[:limit] if limit > 0 else rows
    values = _values(errors, completed, uid, rows)
    if as_json:
        for row, value in zip(rows, values, strict=True):
            line = {"task": row.task, "key_group": row.key_group, "key": row.key}
            line |= {"state": value, "written_in": row.written_in}
            print(_json(line))
        return
    table = Table(
        title=f"job {completed.job_id}, {completed.kind.lower()} {completed.checkpoint_id}: {total} keys"
    )
    for column in ("task", "key group", "key", "state", "last written in"):
        table.add_column(column, overflow="fold")
    for row, value in zip(rows, values, strict=True):
        group = "" if row.key_group is None else str(row.key_group)
        table.add_row(row.task, group, row.key, _json(value), row.written_in)
    console = Console(highlight=False)
    console.print(table)
    if total > len(rows):
        console.print(Text(f"({total - len(rows)} more: --limit 0 shows all, --key K one)", "dim"))


def diff(
    before: Annotated[
        str, typer.Argument(metavar="A", help="The earlier checkpoint: a directory, or an id.")
    ],
    after: Annotated[str, typer.Argument(metavar="B", help="The later one.")],
    job: Job = None,
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    uid: Uid = None,
    task: Task = None,
    as_json: AsJson = False,
) -> None:
    """The keys added, removed and changed from checkpoint A to checkpoint B (directories, or with
    --job JOB checkpoint ids of its journal: `cutline state diff --job wordcount 41 42`)."""
    from events.task.state_view import compare

    errors = Console(stderr=True, highlight=False)
    a = _completed(errors, before, job, bootstrap, topic_prefix)
    b = _completed(errors, after, job, bootstrap, topic_prefix)
    if a.job_id != b.job_id:
        errors.print(Text(f"note: {before} is job {a.job_id!r}'s, {after} job {b.job_id!r}'s", "yellow"))
    found = compare(_rows(errors, a, uid, task), _rows(errors, b, uid, task))
    kinds = (("added", found.added), ("removed", found.removed), ("changed", found.changed))
    if as_json:
        for kind, changes in kinds:
            for change in changes:
                line = {"change": kind, "key": change.key}
                line |= {"before": shown(change.before), "after": shown(change.after)}
                print(json.dumps(line, ensure_ascii=False))
        return
    console = Console(highlight=False)
    console.print(
        f"job {b.job_id}: {a.kind.lower()} {a.checkpoint_id} → {b.kind.lower()} {b.checkpoint_id}: "
        f"{len(found.added)} added, {len(found.removed)} removed, {len(found.changed)} changed"
    )
    if any(changes for _, changes in kinds):
        console.print(_diff_table(kinds))


def _diff_table(kinds: tuple[tuple[str, tuple[StateChange, ...]], ...]) -> Table:
    table = Table(show_header=True)
    for column in ("change", "key", "before", "after"):
        table.add_column(column, overflow="fold")
    for kind, changes in kinds:
        for change in changes:
            before, after = (json.dumps(shown(s), ensure_ascii=False) for s in (change.before, change.after))
            table.add_row(
                kind,
                change.key,
                "" if change.before is None else before,
                "" if change.after is None else after,
            )
    return table
