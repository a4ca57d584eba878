"""``cutline state show/diff``: what a job held at a checkpoint or savepoint, without Spark.

Reads the checkpoint's ``_metadata`` and its state files (:mod:`events.task.state_view`): a keyed
step's keys and states, each with the checkpoint that last wrote it, and a per-partition task's
state; and the keys added, removed and changed between two checkpoints. A state that is UTF-8 JSON
(a :class:`~spark_tasks.keyed.KeyedStep`'s default serializer) is shown as JSON, any other as
``base64:``. Needs the ``spark`` extra (pyarrow reads the pieces).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from coordinator.cli.common import fail
from coordinator.cli.help import CutlineGroup

if TYPE_CHECKING:
    from events.task.state_view import StateChange, StateRow
    from events.wire.records import CheckpointCompleted

state_app = typer.Typer(
    help="What a job held at a checkpoint or savepoint, and what changed between two (no Spark needed).",
    no_args_is_help=True,
    cls=CutlineGroup,
)

Location = Annotated[
    Path, typer.Argument(metavar="DIR", help="A checkpoint or savepoint directory (it holds _metadata).")
]
Uid = Annotated[str | None, typer.Option("--uid", metavar="STEP", help="Only this keyed step's state.")]
AsJson = Annotated[bool, typer.Option("--json", help="One JSON object per line, for any tool.")]


def shown(state: bytes | None) -> Any:
    """A state as people read it: its JSON when it is UTF-8 JSON, else ``base64:...``."""
    if state is None:
        return None
    try:
        return json.loads(state.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "base64:" + base64.b64encode(state).decode()


def _completed(errors: Console, location: Path) -> CheckpointCompleted:
    from events.extras import MissingExtra, require
    from events.task.participant import MetadataProblem, read_checkpoint_metadata
    from events.wire.metadata import MetadataUnavailable, resolve_completion

    try:
        require("spark", "cutline state (reading keyed state pieces)")
        return resolve_completion(read_checkpoint_metadata(location.resolve()))
    except (MissingExtra, MetadataProblem, MetadataUnavailable) as exc:
        fail(errors, str(exc))


def _rows(errors: Console, completed: CheckpointCompleted, uid: str | None) -> list[StateRow]:
    from events.task.participant import SnapshotCorrupted
    from events.task.state_view import require_uid, state_rows

    try:
        require_uid(completed, uid)
        return state_rows(completed, uid)
    except (LookupError, SnapshotCorrupted, OSError) as exc:
        fail(errors, f"checkpoint {completed.checkpoint_id}: {exc}")


def show(
    location: Location,
    uid: Uid = None,
    key: Annotated[str | None, typer.Option("--key", help="Only this key.")] = None,
    limit: Annotated[int, typer.Option("--limit", metavar="N", help="At most N rows (0: all).")] = 50,
    as_json: AsJson = False,
) -> None:
    """Every key's state at the checkpoint in DIR (Flink's State Processor API, read side)."""
    errors = Console(stderr=True, highlight=False)
    completed = _completed(errors, location)
    rows = [row for row in _rows(errors, completed, uid) if key is None or row.key == key]
    if key is not None and not rows:
        fail(
            errors,
            f"checkpoint {completed.checkpoint_id} holds no key {key!r}" + (f" of {uid!r}" if uid else ""),
        )
    total, rows = len(rows), rows[:limit] if limit > 0 else rows
    if as_json:
        for row in rows:
            line = {"task": row.task, "key_group": row.key_group, "key": row.key}
            line |= {"state": shown(row.state), "written_in": row.written_in}
            print(json.dumps(line, ensure_ascii=False))
        return
    table = Table(
        title=f"job {completed.job_id}, {completed.kind.lower()} {completed.checkpoint_id}: {total} keys"
    )
    for column in ("task", "key group", "key", "state", "last written in"):
        table.add_column(column, overflow="fold")
    for row in rows:
        group = "" if row.key_group is None else str(row.key_group)
        table.add_row(
            row.task, group, row.key, json.dumps(shown(row.state), ensure_ascii=False), row.written_in
        )
    console = Console(highlight=False)
    console.print(table)
    if total > len(rows):
        console.print(Text(f"({total - len(rows)} more: --limit 0 shows all, --key K one)", "dim"))


def diff(
    before: Annotated[Path, typer.Argument(metavar="DIR_A", help="The earlier checkpoint or savepoint.")],
    after: Annotated[Path, typer.Argument(metavar="DIR_B", help="The later one.")],
    uid: Uid = None,
    as_json: AsJson = False,
) -> None:
    """The keys added, removed and changed from the checkpoint in DIR_A to the one in DIR_B."""
    from events.task.state_view import compare

    errors = Console(stderr=True, highlight=False)
    a, b = _completed(errors, before), _completed(errors, after)
    if a.job_id != b.job_id:
        errors.print(Text(f"note: {before} is job {a.job_id!r}'s, {after} job {b.job_id!r}'s", "yellow"))
    found = compare(_rows(errors, a, uid), _rows(errors, b, uid))
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
