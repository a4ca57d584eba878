"""Human-readable journals: one line per event, and a summary panel per job state.

Pure formatting: every function returns a string or a rich renderable and
prints nothing, so ``cutline replay``, ``status``, ``tail`` and the tests
share it. Times are UTC, ISO 8601 with milliseconds.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeAlias, assert_never

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from coordinator.core.state import JobState, PendingCheckpoint
from events.wire.codec import Codec, DecodeError, to_avro
from events.wire.fencing import Headers, epoch_problem
from events.wire.records import (
    JOURNAL_RECORDS,
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointRequestQueued,
    CheckpointRestored,
    CheckpointTriggered,
    JobFailedPermanently,
    JobHeartbeatRecorded,
    JobRestartScheduled,
    JobStatus,
    JournalEvent,
    SchedulerStarted,
    SchedulerStopped,
    TaskAcknowledged,
    TaskStatusRecorded,
    TriggerRejected,
)

__all__ = [
    "Acks",
    "ack_progress",
    "config_lines",
    "describe",
    "describe_record",
    "format_bytes",
    "format_time",
    "job_summary",
    "render_status",
    "setting_text",
    "timeline_line",
]

Acks: TypeAlias = tuple[int, int]
"""Acknowledgements so far and tasks to acknowledge, of one pending checkpoint."""

_EVENT_STYLES: dict[type, str] = {
    SchedulerStarted: "magenta",
    SchedulerStopped: "magenta",
    TaskStatusRecorded: "yellow",
    CheckpointRequestQueued: "blue",
    CheckpointTriggered: "blue",
    TaskAcknowledged: "",
    CheckpointCompleted: "green",
    CheckpointAborted: "red",
    TriggerRejected: "yellow",
    CheckpointFailureThresholdExceeded: "bold red",
    CheckpointRestored: "magenta",
    JobHeartbeatRecorded: "dim",
    JobRestartScheduled: "yellow",
    JobFailedPermanently: "bold red",
}

_STATUS_STYLES = {
    JobStatus.RUNNING: "green",
    JobStatus.FAILED: "red",
    JobStatus.FAILING: "red",
    JobStatus.RESTARTING: "yellow",
}


def format_time(timestamp_ms: int | None) -> str:
    """``2026-11-22T10:00:00.123Z`` (UTC, milliseconds); ``-`` for no time."""
    if timestamp_ms is None:
        return "-"
    try:
        moment = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return f"{timestamp_ms}ms"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_bytes(size: int) -> str:
    """``512 B``, ``12.3 KiB``, ``4.0 MiB``, ..."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _kind(kind: CheckpointKind, periodic: bool = False) -> str:
    if kind is CheckpointKind.SAVEPOINT:
        return "savepoint"
    return "periodic checkpoint" if periodic else "checkpoint"


def _relative(timestamp_ms: int, at_ms: int | None) -> str:
    return "-" if at_ms is None else f"+{at_ms - timestamp_ms} ms"


def ack_progress(state: JobState, event: TaskAcknowledged) -> Acks | None:
    """``(acks, tasks)`` of the checkpoint ``event`` acknowledged, in the job's state right after it."""
    pending = state.pending.get(event.checkpoint_id)
    if pending is None:
        return None
    return len(pending.acks), len(pending.triggered.tasks)


def describe(event: JournalEvent, acks: Acks | None = None) -> str:
    """The essentials of one event, in a few words (``acks`` adds ``acks x/y`` to an ack)."""
    match event:
        case SchedulerStarted():
            config = event.config
            first = _relative(event.timestamp_ms, event.next_trigger_ms)
            periodic = (
                f"every {config.interval_ms} ms, first at {first}"
                if config.interval_ms > 0
                else "periodic checkpoints off"
            )
            return f"attempt {event.attempt}, {len(event.tasks)} tasks, {periodic}"
        case SchedulerStopped():
            error = f": {event.error}" if event.error else ""
            return f"attempt {event.attempt} is {event.status}{error}"
        case TaskStatusRecorded():
            error = f": {event.error}" if event.error else ""
            return f"task {event.task_id} is {event.status} (attempt {event.attempt}){error}"
        case CheckpointRequestQueued():
            request = f" {event.request_id}" if event.request_id else ""
            return f"{_kind(event.kind, event.periodic)}{request} waits: max_concurrent pending"
        case CheckpointTriggered():
            request = f", request {event.request_id}" if event.request_id else ""
            return (
                f"#{event.checkpoint_id} {_kind(event.kind, event.periodic)}, {len(event.tasks)} tasks, "
                f"deadline {_relative(event.timestamp_ms, event.deadline_ms)}{request}"
            )
        case TaskAcknowledged():
            progress = f" acks {acks[0]}/{acks[1]}" if acks is not None else ""
            return f"#{event.checkpoint_id} by {event.task_id}{progress}"
        case CheckpointCompleted():
            return (
                f"#{event.checkpoint_id} {_kind(event.kind)} in {event.duration_ms} ms, "
                f"{format_bytes(event.size_bytes)} in {len(event.handles)} handles"
            )
        case CheckpointAborted():
            counted = " (counted)" if event.counts_as_failure else ""
            return f"#{event.checkpoint_id} {event.reason}{counted}: {event.message}"
        case TriggerRejected():
            request = f" {event.request_id}" if event.request_id else ""
            message = f": {event.message}" if event.message else ""
            return f"{_kind(event.kind, event.periodic)}{request} {event.reason}{message}"
        case CheckpointFailureThresholdExceeded():
            return (
                f"#{event.checkpoint_id} {event.reason}: {event.failures} failures, "
                f"{event.tolerable} tolerable - the job fails"
            )
        case CheckpointRestored():
            where = f" at {event.location}" if event.location else ""
            return f"attempt {event.attempt} restored #{event.checkpoint_id}{where}"
        case JobHeartbeatRecorded():
            due = _relative(event.timestamp_ms, event.deadline_ms)
            return f"attempt {event.attempt}, next heartbeat due {due}"
        case JobRestartScheduled():
            return _restart_scheduled(event)
        case JobFailedPermanently():
            return f"attempt {event.attempt} failed for good: {event.reason}; it failed with {event.failure}"
        case _:  # pragma: no cover - mypy checks that every journal record is handled above
            assert_never(event)


def _restart_scheduled(event: JobRestartScheduled) -> str:
    restore = (
        "restoring nothing (no completed checkpoint)"
        if event.restore_checkpoint_id is None
        else f"restoring #{event.restore_checkpoint_id}"
        + (f" at {event.restore_location}" if event.restore_location else "")
    )
    backoff = f", backoff {event.backoff_ms} ms" if event.backoff_ms else ""
    return (
        f"attempt {event.attempt} in {event.delay_ms} ms, {restore} "
        f"(restart {event.restarts}{backoff}) after: {event.failure}"
    )


def timeline_line(
    event: JournalEvent, offset: int | None = None, partition: int = -1, acks: Acks | None = None
) -> Text:
    """One timeline line: time, position, job, event type and its essentials. The position is
    ``partition:offset`` (``offset`` alone for a partition below 0, as in a journal file); none
    without an offset (``cutline tail`` puts the message's position first itself)."""
    position: list[str | tuple[str, str]] = []
    if offset is not None:
        where = f"{partition}:{offset}" if partition >= 0 else str(offset)
        position = [(f"{where:>8}", "cyan"), " "]
    name = type(event).__name__
    return Text.assemble(
        (format_time(getattr(event, "timestamp_ms", None)), "dim"),
        " ",
        *position,
        (event.job_id, "bold"),
        " ",
        (f"{name:<34}", _EVENT_STYLES.get(type(event), "")),
        " ",
        describe(event, acks),
    )


# ------------------------------------------------------------------- job state


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, expand=False)


def _short_kind(kind: CheckpointKind, periodic: bool | None) -> str:
    if kind is CheckpointKind.SAVEPOINT:
        return "savepoint"
    return "checkpoint" if periodic is None else "periodic" if periodic else "manual"


def _pending_table(state: JobState) -> Table:
    table = _table("pending checkpoints")
    table.add_column("id", justify="right")
    table.add_column("kind")
    table.add_column("acks", justify="right", no_wrap=True)
    table.add_column("missing", overflow="fold")
    table.add_column("deadline", no_wrap=True)
    for checkpoint_id in sorted(state.pending):
        pending: PendingCheckpoint = state.pending[checkpoint_id]
        triggered = pending.triggered
        missing = [t for t in triggered.tasks if t not in pending.acks]
        table.add_row(
            str(checkpoint_id),
            _short_kind(triggered.kind, triggered.periodic),
            f"{len(pending.acks)}/{len(triggered.tasks)}",
            ", ".join(missing) or "-",
            format_time(triggered.deadline_ms),
        )
    return table


def _queue_table(state: JobState) -> Table:
    table = _table("queued requests")
    table.add_column("kind")
    table.add_column("request", overflow="fold")
    table.add_column("since", no_wrap=True)
    for queued in state.queue:
        table.add_row(
            _short_kind(queued.kind, queued.periodic),
            queued.request_id or "-",
            format_time(queued.timestamp_ms),
        )
    return table


def _completed_table(state: JobState) -> Table:
    table = _table("retained completed checkpoints")
    table.add_column("id", justify="right")
    table.add_column("completed", no_wrap=True)
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("handles", justify="right")
    for completed in state.completed:
        table.add_row(
            str(completed.checkpoint_id),
            format_time(completed.timestamp_ms),
            f"{completed.duration_ms} ms",
            format_bytes(completed.size_bytes),
            str(len(completed.handles)),
        )
    return table


def _restart_facts(state: JobState) -> str:
    """The restart strategy, what it counted so far and the restart it scheduled, if any."""
    assert state.config is not None
    strategy = state.config.restart_strategy
    text = f"{strategy.kind.flink_name}, {state.restarts} counted"
    if state.last_failure_ms is not None:
        text += f", last failure at {format_time(state.last_failure_ms)}"
    if state.restart is not None:
        restart = state.restart
        restore = "nothing" if restart.restore_checkpoint_id is None else f"#{restart.restore_checkpoint_id}"
        text += (
            f"; attempt {restart.attempt} scheduled at {format_time(restart.restart_at_ms)}, "
            f"restoring {restore} ({restart.failure})"
        )
    return text


def job_summary(state: JobState) -> Panel:
    """A panel with everything folding the journal says about one job."""
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    status = str(state.status) if state.status is not None else "unknown (no status reported)"
    facts.add_row("status", Text(status, _STATUS_STYLES.get(state.status, "") if state.status else "dim"))
    facts.add_row("attempt", str(state.attempt))
    tasks = Text()
    for i, task in enumerate(state.tasks):
        not_running = state.tasks_not_running.get(task)
        tasks.append(", " if i else "")
        tasks.append(f"{task} ({not_running})" if not_running else task, "red" if not_running else "")
    facts.add_row("tasks", tasks if state.tasks else Text("-"))
    config = state.config
    if config is not None:
        facts.add_row(
            "config",
            f"interval {config.interval_ms} ms, timeout {config.timeout_ms} ms, "
            f"min pause {config.min_pause_ms} ms, max concurrent {config.max_concurrent}, "
            f"tolerable failures {config.tolerable_failures}, retained {config.retained}",
        )
        facts.add_row("location", config.location)
        facts.add_row("restarts", _restart_facts(state))
        if state.heartbeat_deadline_ms is not None:
            facts.add_row(
                "heartbeat",
                f"every {config.heartbeat_interval_ms} ms, "
                f"next due by {format_time(state.heartbeat_deadline_ms)}",
            )
    else:
        facts.add_row("config", "-")
    if state.scheduler is None:
        scheduler = "stopped"
    elif state.scheduler.next_trigger_ms is None:
        scheduler = "running, periodic checkpoints off"
    else:
        scheduler = f"next trigger at {format_time(state.scheduler.next_trigger_ms)}"
    facts.add_row("scheduler", scheduler)
    facts.add_row("next checkpoint id", str(state.next_checkpoint_id))
    tolerable = config.tolerable_failures if config else 0
    facts.add_row("failures", f"{state.failures} counted, {tolerable} tolerable")
    facts.add_row(
        "last completion",
        f"#{state.last_completed_id} at {format_time(state.last_completion_ms)}"
        if state.last_completion_ms is not None
        else "-",
    )
    latest = state.latest_completed
    facts.add_row(
        "latest checkpoint",
        f"#{latest.checkpoint_id} in {latest.location or '-'}" if latest is not None else "-",
    )
    savepoint = state.latest_savepoint
    facts.add_row(
        "latest savepoint",
        f"#{savepoint.checkpoint_id} at {format_time(savepoint.timestamp_ms)} in {savepoint.location or '-'}"
        if savepoint is not None
        else "-",
    )
    restored = state.restored
    facts.add_row(
        "restored",
        f"#{restored.checkpoint_id} by attempt {restored.attempt} at {format_time(restored.timestamp_ms)}"
        + (f" from {restored.location}" if restored.location else "")
        if restored is not None
        else "-",
    )
    parts: list[RenderableType] = [facts]
    if state.pending:
        parts.append(_pending_table(state))
    if state.queue:
        parts.append(_queue_table(state))
    if state.completed:
        parts.append(_completed_table(state))
    title = Text.assemble(("job ", "bold"), (state.job_id, "bold cyan"))
    return Panel(Group(*parts), title=title, title_align="left", expand=False)


# ------------------------------------------------------------ any record, stats


def record_json(
    codec: Codec,
    topic: str,
    partition: int | None,
    offset: int | None,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, str | bytes | None]] = (),
) -> dict[str, object]:
    """Any message on a cutline topic as plain JSON (``cutline tail --json``): where it is, its key
    and headers, and the decoded record (its Avro datum, bytes as base64) or why it does not decode.
    A record whose ``cutline.epoch`` headers are doubled or malformed has ``void``: why."""
    body: dict[str, object] = {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": _text_or_base64(key),
        "headers": {name: _text_or_base64(v) for name, v in headers},
    }
    void = epoch_problem(headers)
    if void is not None:
        # its epoch cannot be read: void for every reader (docs/design.md, "Ownership and fencing")
        body["void"] = void
    if value is None:
        return {**body, "type": None, "record": None}
    try:
        record = codec.decode(value)
    except DecodeError as exc:
        return {**body, "type": None, "error": f"{exc.reason}: {exc}", "value_base64": _base64(value)}
    return {**body, "type": type(record).__name__, "record": _jsonable(to_avro(record))}


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _text_or_base64(data: str | bytes | None) -> str | None:
    """UTF-8 text as it is; other bytes as ``base64:...``."""
    if data is None or isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + _base64(data)


def _jsonable(value: object) -> object:
    if isinstance(value, bytes):
        return _base64(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class _Bytes(bytes):
    """Bytes shown by their length (a snapshot's inline state may be 20 KiB: not for one line)."""

    def __repr__(self) -> str:
        return f"<{len(self)} bytes>"


def _brief(value: object) -> object:
    if isinstance(value, bytes):
        return _Bytes(value)
    if isinstance(value, Mapping):
        return {k: _brief(v) for k, v in value.items()}
    return value


def describe_record(
    codec: Codec,
    partition: int | None,
    offset: int | None,
    value: bytes | None,
    headers: Headers = None,
) -> Text:
    """One line for any message on a cutline topic (``cutline tail``): decoded, or why not; marked
    void, and why, when its ``cutline.epoch`` headers are doubled or malformed
    (docs/design.md, "Ownership and fencing")."""
    line = _describe_record(codec, partition, offset, value)
    void = epoch_problem(headers)
    if void is not None:
        line.append_text(Text(f"  VOID: {void}", "bold red"))
    return line


def _describe_record(codec: Codec, partition: int | None, offset: int | None, value: bytes | None) -> Text:
    position = Text(f"{partition}:{offset:<6} ", "cyan")
    if value is None:
        return Text.assemble(position, ("(no value)", "dim"))
    try:
        record = codec.decode(value)
    except DecodeError as exc:
        return Text.assemble(position, (f"undecodable ({exc.reason}): {exc}", "red"))
    if isinstance(record, JOURNAL_RECORDS):
        return Text.assemble(position, timeline_line(record))
    name = type(record).__name__
    fields = ", ".join(
        f"{key}={_brief(value)!r}"
        for key, value in to_avro(record).items()
        if key not in ("job_id", "value", "key")
    )
    return Text.assemble(
        position,
        (format_time(getattr(record, "timestamp_ms", None)), "dim"),
        " ",
        (str(getattr(record, "job_id", "") or ""), "bold"),
        " ",
        (f"{name:<34}", "magenta"),
        " ",
        fields,
    )


MILLISECOND_SETTINGS = frozenset({"interval", "timeout", "min_pause"})
"""The keys of ``/jobs/JOB/checkpoints/config`` (Flink's names) whose values are milliseconds."""


def setting_text(key: str, value: object) -> str:
    """One value of a job's checkpoint configuration as ``cutline status`` shows it: durations with
    their unit, an interval of 0 as periodic checkpoints off, objects as JSON."""
    if key in MILLISECOND_SETTINGS and isinstance(value, int) and not isinstance(value, bool):
        if key == "interval" and value <= 0:
            return "off (no periodic checkpoints)"
        return f"{value} ms"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def config_lines(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``cutline status``'s configuration rows: ``(name, value with its unit)``. A coordinator that
    sends ``shown`` (each setting's label and value as its dashboard shows them) is shown so;
    otherwise each of Flink's keys is shown with :func:`setting_text`."""
    shown = config.get("shown")
    if isinstance(shown, list) and shown and all(isinstance(row, Mapping) for row in shown):
        return [(str(row.get("label") or row.get("key")), str(row.get("shown"))) for row in shown]
    return [(key, setting_text(key, value)) for key, value in config.items() if key != "shown"]


def render_status(
    job_id: str,
    stats: Mapping[str, Any],
    config: Mapping[str, Any],
    *,
    owner: str | None = None,
    latency: Mapping[str, Any] | None = None,
) -> Group:
    """``cutline status``: Flink's checkpoint overview (counts, latest, summary, history, config), the
    web address of the coordinator worker that owns the job, and the latency markers' figures per
    operator when the job sends them."""
    settings = Table(title="configuration", show_header=False)
    for name, value in config_lines(config):
        settings.add_row(name, value)
    operators = (latency or {}).get("operators") or []
    tables = [_overview_table(job_id, stats, owner), _history_table(stats)]
    if operators:
        tables.append(_latency_table(operators))
    return Group(*tables, settings)


def _overview_table(job_id: str, stats: Mapping[str, Any], owner: str | None) -> Table:
    counts = stats.get("counts", {})
    overview = Table(title=f"checkpoints of {job_id}", show_header=False)
    if owner:
        overview.add_row("owner", Text(owner))  # a peer's address: no markup
    for key in ("total", "completed", "failed", "in_progress", "restored"):
        overview.add_row(key.replace("_", " "), str(counts.get(key, 0)))
    latest = stats.get("latest", {})
    for kind in ("completed", "savepoint", "failed"):
        entry = latest.get(kind)
        if entry:
            at = entry.get("latest_ack_timestamp") or entry.get("failure_timestamp")
            detail = f"#{entry['id']} at {format_time(at)}"
            if kind == "failed":
                detail += f" {entry.get('failure_message', '')}"
            elif entry.get("external_path"):
                detail += f" {entry['external_path']}"
            overview.add_row(f"latest {kind}", detail)
    restored = latest.get("restored")
    if restored:
        overview.add_row("restored", f"#{restored['id']} at {format_time(restored['restore_timestamp'])}")
    durations = stats.get("summary", {}).get("end_to_end_duration", {})
    if not counts.get("completed", 0):  # Flink's summary of nothing is all zeros: say so instead
        overview.add_row("duration", Text("no completed checkpoint yet", "dim"))
    elif durations:
        overview.add_row(
            "duration",
            " ".join(f"{k} {durations.get(k, 0)} ms" for k in ("min", "p50", "p99", "max")),
        )
    return overview


def _history_table(stats: Mapping[str, Any]) -> Table:
    history = Table(title="history (newest first)")
    for column in ("id", "status", "acks", "triggered", "duration", "size", "reason"):
        history.add_column(column)
    for entry in stats.get("history", []):
        duration = entry.get("end_to_end_duration")
        history.add_row(
            str(entry["id"]) + (" savepoint" if entry.get("is_savepoint") else ""),
            Text(entry["status"], {"COMPLETED": "green", "FAILED": "red"}.get(entry["status"], "yellow")),
            f"{entry['num_acknowledged_subtasks']}/{entry['num_subtasks']}",
            format_time(entry.get("trigger_timestamp")),
            "" if duration is None else f"{duration} ms",
            format_bytes(entry.get("state_size", 0)),
            entry.get("failure_message", "") or "",
        )
    return history


def _latency_table(operators: Sequence[Mapping[str, Any]]) -> Table:
    figures = Table(title="latency markers, source to operator (ms, recent)")
    for column in ("operator", "markers", "p50", "p99", "max"):
        figures.add_column(column, justify="left" if column == "operator" else "right")
    for row in operators:
        figures.add_row(
            str(row["operator_id"]),
            str(row["count"]),
            *("-" if row.get(k) is None else f"{row[k]:.0f}" for k in ("p50", "p99", "max")),
        )
    return figures
