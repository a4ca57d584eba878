"""What the decider admits: the input checks, apart from the rules (docs/design.md, "The checkpoint decider").

Each check is pure and looks at one input in one state. It gives None when the input is
acceptable, else the :class:`InputRejected` decision that refuses it: never journaled, the
shell sends the input to the dead-letter topic with its :class:`Rejection` and message.
The rules in :mod:`coordinator.core.decider` run only on what these checks admit.

A refusal here is about the input (a malformed id, another attempt, a task the job does not
have, state outside its checkpoint); a refusal the rules make (``TriggerRejected``: tasks not
running, ``min_pause``, a savepoint target outside the roots) is a journaled fact, not this.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from coordinator.core.restart import strategy_problem
from coordinator.core.state import MAX_CONCURRENT_CHECKPOINTS, JobState
from events.wire.fencing import VOID_EPOCH, epoch_problem, header_epoch
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointConfig,
    CheckpointDeclined,
    JobHeartbeat,
    JobStatus,
    JobStatusChanged,
    StateHandle,
)
from events.wire.sizes import excerpt
from events.wire.validation import (
    MAX_CHECKPOINT_ID,
    MAX_DURATION_MS,
    MAX_INLINE_THRESHOLD_BYTES,
    MAX_MAP_ENTRIES,
    MAX_PARTITION,
    MAX_REQUEST_ID_BYTES,
    MAX_TARGET_BYTES,
    MAX_TASKS,
    InvalidUri,
    StorageUri,
    job_directory_problem,
    parse_below,
    parse_offsets_key,
    parse_uri,
)
from events.wire.vocabulary import DeadLetterReason, Rejection

__all__ = [
    "InputRejected",
    "Rejection",
    "acknowledgement",
    "declination",
    "heartbeat",
    "inline_problem",
    "job_of",
    "job_status",
    "known_job",
    "linked_handle",
    "linked_savepoint",
    "request_fields",
    "stale_answer",
    "storage_uri",
    "task_input",
]


@dataclass(frozen=True, slots=True)
class InputRejected:
    """The command's input was not acceptable; the shell sends it to dead letters.

    Not a journal event: it changes nothing, and ``evolve`` ignores it.
    """

    job_id: str
    reason: Rejection
    message: str


def _refuse(state: JobState, reason: Rejection, message: str) -> InputRejected:
    return InputRejected(state.job_id, reason, message)


# ------------------------------------------------------------------ every input


def job_of(state: JobState, job_id: str) -> InputRejected | None:
    """A command reaches the state of its own job only."""
    if job_id != state.job_id:
        return _refuse(
            state,
            Rejection.UNKNOWN_JOB,
            f"a command of job {excerpt(job_id)!r} reached job {excerpt(state.job_id)!r}",
        )
    return None


def known_job(state: JobState) -> InputRejected | None:
    """Requests, acks, declines and task statuses need a job that reported a status."""
    if not state.known:
        return _refuse(
            state, Rejection.UNKNOWN_JOB, f"no job status was ever reported for job {excerpt(state.job_id)!r}"
        )
    return None


# ------------------------------------------------------------------ requests


def request_fields(
    state: JobState, request_id: str, target: str | None, *, savepoint: bool
) -> InputRejected | None:
    """A request's id and target within their bounds: every decision that answers a request quotes
    them again (its trigger, its rejection, the abort of it queued), so an unbounded field would make
    those decisions too large to journal and wedge the job."""
    size = len(request_id.encode("utf-8", "surrogatepass"))
    if size > MAX_REQUEST_ID_BYTES:
        return _refuse(
            state,
            Rejection.INVALID_REQUEST,
            f"request_id of {size} bytes; at most {MAX_REQUEST_ID_BYTES} are accepted (a UUID is 36)",
        )
    if target is None:
        return None
    if not savepoint:
        return _refuse(
            state,
            Rejection.INVALID_REQUEST,
            f"a checkpoint request takes no target (only a savepoint does): {excerpt(target)!r}",
        )
    size = len(target.encode("utf-8", "surrogatepass"))
    if size > MAX_TARGET_BYTES:
        return _refuse(
            state,
            Rejection.INVALID_REQUEST,
            f"savepoint target of {size} bytes; at most {MAX_TARGET_BYTES} are accepted",
        )
    return None


# ------------------------------------------------------------------ job status


def job_status(state: JobState, changed: JobStatusChanged) -> InputRejected | None:
    """A status of an attempt not older than the job's; a RUNNING one with a valid config and tasks."""
    if changed.attempt < 0:
        return _refuse(state, Rejection.INVALID_STATUS, f"attempt must not be negative: {changed.attempt}")
    if changed.attempt < state.attempt:
        return _refuse(
            state,
            Rejection.STALE_ATTEMPT,
            f"status {changed.status} of attempt {changed.attempt}; the job is at {state.attempt}",
        )
    if changed.status is JobStatus.RUNNING:
        problem = _running_problem(changed)
        if problem is not None:
            return _refuse(state, Rejection.INVALID_CONFIG, problem)
    return None


def _running_problem(changed: JobStatusChanged) -> str | None:
    problem = _config_problem(changed.config)
    if problem is None and not changed.tasks:
        problem = "a RUNNING job status must list the tasks that acknowledge checkpoints"
    if problem is None and len(changed.tasks) > MAX_TASKS:
        problem = f"a job may have at most {MAX_TASKS} tasks, got {len(changed.tasks)}"
    if problem is None and changed.config is not None:
        problem = job_directory_problem(changed.job_id, changed.config.location)  # the driver checks it too
    if problem is None and len(set(changed.tasks)) != len(changed.tasks):
        problem = f"task ids must be unique: {excerpt(list(changed.tasks))}"
    restored = changed.restored_checkpoint_id
    if problem is None and restored is not None and not 1 <= restored <= MAX_CHECKPOINT_ID:
        problem = f"restored_checkpoint_id must be in [1, {MAX_CHECKPOINT_ID}]: {restored}"
    return problem


def _config_problem(config: CheckpointConfig | None) -> str | None:
    if config is None:
        return "a RUNNING job status must carry its checkpoint config"
    return _bounds_problem(config) or _location_problem(config)


def _bounds_problem(config: CheckpointConfig) -> str | None:
    if config.timeout_ms <= 0:
        return f"timeout_ms must be positive, got {config.timeout_ms}"
    if config.min_pause_ms < 0:
        return f"min_pause_ms must not be negative, got {config.min_pause_ms}"
    if not 1 <= config.max_concurrent <= MAX_CONCURRENT_CHECKPOINTS:
        bound = MAX_CONCURRENT_CHECKPOINTS
        return f"max_concurrent must be between 1 and {bound}, got {config.max_concurrent}"
    if config.tolerable_failures < 0:
        return f"tolerable_failures must not be negative, got {config.tolerable_failures}"
    if config.retained < 1:
        return f"retained must be at least 1, got {config.retained}"
    if not 0 <= config.inline_threshold_bytes <= MAX_INLINE_THRESHOLD_BYTES:
        return (
            f"inline_threshold_bytes must be between 0 and {MAX_INLINE_THRESHOLD_BYTES} "
            f"(Flink's memory threshold is at most 1 MiB too), got {config.inline_threshold_bytes}"
        )
    for name in ("interval_ms", "timeout_ms", "min_pause_ms"):
        value = getattr(config, name)
        if value > MAX_DURATION_MS:
            return f"{name} must be at most {MAX_DURATION_MS}, got {value}"
    if not 0 < config.heartbeat_interval_ms <= config.heartbeat_timeout_ms <= MAX_DURATION_MS:
        return (
            f"heartbeats need 0 < heartbeat_interval_ms <= heartbeat_timeout_ms <= {MAX_DURATION_MS}, got "
            f"{config.heartbeat_interval_ms} and {config.heartbeat_timeout_ms}"
        )
    return strategy_problem(config.restart_strategy)


def _location_problem(config: CheckpointConfig) -> str | None:
    if not config.location:
        return "location (the checkpoint storage URI) must not be empty"
    root = storage_uri(config.location)
    if isinstance(root, str):
        return f"location is not a storage URI cutline accepts: {excerpt(root)}"
    if root.scheme == "file" and not root.segments:
        return "location must not be the root of the file system"
    return None


@functools.lru_cache(maxsize=1024)
def storage_uri(uri: str) -> StorageUri | str:
    """``parse_uri``, or the reason it refused ``uri``. A memo: a location is parsed for every ack
    of its checkpoint; ``parse_uri`` is pure, so remembering it changes no decision."""
    try:
        return parse_uri(uri)
    except InvalidUri as exc:
        return str(exc)


def heartbeat(state: JobState, beat: JobHeartbeat) -> InputRejected | None:
    """A heartbeat of the job's current attempt, of a job that ran."""
    if not state.known:
        return _refuse(
            state, Rejection.UNKNOWN_JOB, f"a heartbeat of job {excerpt(beat.job_id)!r}, which never ran"
        )
    if beat.attempt < state.attempt:
        return _refuse(
            state,
            Rejection.STALE_ATTEMPT,
            f"a heartbeat of attempt {beat.attempt}; the job is at {state.attempt}",
        )
    if beat.attempt > state.attempt:
        return _refuse(
            state,
            Rejection.UNKNOWN_ATTEMPT,
            f"a heartbeat of attempt {beat.attempt}, which never reported RUNNING (at {state.attempt})",
        )
    return None


# ------------------------------------------------------------------ task input


def task_input(state: JobState, attempt: int, task_id: str) -> InputRejected | None:
    """Input of a known job's current attempt from one of its tasks."""
    unknown = known_job(state)
    if unknown is not None:
        return unknown
    if attempt < state.attempt:
        return _refuse(
            state,
            Rejection.STALE_ATTEMPT,
            f"attempt {attempt} is older than the job's attempt {state.attempt}",
        )
    if attempt > state.attempt:
        return _refuse(
            state,
            Rejection.UNKNOWN_ATTEMPT,
            f"attempt {attempt} is newer than the job's attempt {state.attempt}",
        )
    if task_id not in state.task_ids:
        return _refuse(
            state,
            Rejection.UNKNOWN_TASK,
            f"task {excerpt(task_id)!r} is not one of {excerpt(list(state.tasks))}",
        )
    return None


def _checkpoint_id(state: JobState, checkpoint_id: int) -> InputRejected | None:
    if checkpoint_id < 1:
        return _refuse(state, Rejection.INVALID_ID, f"checkpoint ids start at 1, got {checkpoint_id}")
    if checkpoint_id > MAX_CHECKPOINT_ID:
        return _refuse(
            state, Rejection.INVALID_ID, f"checkpoint ids end at {MAX_CHECKPOINT_ID}, got {checkpoint_id}"
        )
    if checkpoint_id >= state.next_checkpoint_id:
        return _refuse(
            state,
            Rejection.UNKNOWN_CHECKPOINT,
            f"checkpoint {checkpoint_id} was never triggered (the next id is {state.next_checkpoint_id})",
        )
    return None


def declination(state: JobState, decline: CheckpointDeclined) -> InputRejected | None:
    """A decline from a task of the current attempt, of a checkpoint id that was triggered."""
    return task_input(state, decline.attempt, decline.task_id) or _checkpoint_id(state, decline.checkpoint_id)


def acknowledgement(state: JobState, ack: CheckpointAcknowledged) -> InputRejected | None:
    """An ack as :func:`declination`, with well-formed offsets and metrics; for a pending
    checkpoint, from one of its tasks, with state inside its location (inline state checked)."""
    refused = task_input(state, ack.attempt, ack.task_id) or _checkpoint_id(state, ack.checkpoint_id)
    if refused is not None:
        return refused
    problem = _offsets_problem(ack.offsets)
    if problem:
        return _refuse(state, Rejection.INVALID_OFFSETS, problem)
    if len(ack.metrics) > MAX_MAP_ENTRIES:
        return _refuse(
            state,
            Rejection.INVALID_METRICS,
            f"{len(ack.metrics)} metrics; at most {MAX_MAP_ENTRIES} are accepted",
        )
    pending = state.pending.get(ack.checkpoint_id)
    if pending is None:
        return None  # late: nothing of it is used, so nothing more to check
    if ack.task_id not in pending.task_ids:
        return _refuse(
            state,
            Rejection.UNKNOWN_TASK,
            f"task {excerpt(ack.task_id)!r} is not part of checkpoint {ack.checkpoint_id}",
        )
    if ack.state is None:
        return None
    return _handle_problem(state, ack.state, pending.triggered.location, pending.triggered.inline_limit_bytes)


def _handle_problem(state: JobState, handle: StateHandle, location: str, limit: int) -> InputRejected | None:
    if handle.size_bytes < 0:
        size = handle.size_bytes
        return _refuse(
            state, Rejection.INVALID_STATE_HANDLE, f"state size_bytes must not be negative: {size}"
        )
    problem = _outside_problem(handle.uri, location)
    if problem:
        return _refuse(state, Rejection.STATE_OUTSIDE_LOCATION, problem)
    if handle.inline is not None:
        problem = inline_problem(handle, limit)
        if problem:
            return _refuse(state, Rejection.INVALID_STATE_HANDLE, problem)
    return None


def linked_handle(
    state: JobState, handle: StateHandle | None, where: str, links: Mapping[str, str]
) -> InputRejected | None:
    """An accepted ``file:`` state handle of the checkpoint at ``where`` must stay inside the
    checkpoint's directory once symbolic links are followed: ``links`` is the file system's answer,
    asked by the shell before deciding (:mod:`coordinator.core.links`). Inline state has no file to follow."""
    if handle is None or handle.inline is not None:
        return None
    resolved = links.get(handle.uri)
    if resolved is None:
        return None
    return _refuse(
        state,
        Rejection.STATE_OUTSIDE_LOCATION,
        f"state {handle.uri!r} resolves to {resolved!r} through a symbolic link, "
        f"outside checkpoint location {where!r}",
    )


def linked_savepoint(
    state: JobState, location: str, roots: tuple[str, ...], links: Mapping[str, str]
) -> InputRejected | None:
    """A savepoint's ``location`` must stay inside its savepoint roots (``roots``) once symbolic
    links are followed (``links``, as for :func:`linked_handle`)."""
    resolved = links.get(location)
    if resolved is None:
        return None
    return _refuse(
        state,
        Rejection.SAVEPOINT_TARGET_NOT_ALLOWED,
        f"savepoint location {location!r} resolves to {resolved!r} through a symbolic link, "
        f"outside the savepoint roots {roots}",
    )


def inline_problem(handle: StateHandle, limit: int) -> str | None:
    """Why the inline state of ``handle`` is not acceptable for a checkpoint that allows ``limit``
    bytes inline (None: it is). The size and digest are checked here, once, so that every reader
    of the journal can trust the bytes it restores."""
    assert handle.inline is not None
    size = len(handle.inline)
    if size > limit or limit == 0:
        allowed = "no inline state" if limit == 0 else f"at most {limit} bytes inline"
        return (
            f"inline state of {size} bytes for {excerpt(handle.uri)}: this checkpoint allows {allowed} "
            "(its barrier's inline_limit_bytes); write the snapshot to its uri and send no inline bytes"
        )
    if size != handle.size_bytes:
        uri = excerpt(handle.uri)
        return f"inline state of {size} bytes for {uri}, but its size_bytes says {handle.size_bytes}"
    digest = hashlib.sha256(handle.inline).hexdigest()
    if digest != handle.sha256.lower():
        return (
            f"inline state for {excerpt(handle.uri)} has sha256 {digest}, but its handle says {handle.sha256}"
        )
    return None


def _offsets_problem(offsets: Mapping[str, int]) -> str | None:
    if len(offsets) > MAX_MAP_ENTRIES:
        return f"{len(offsets)} offsets; at most {MAX_MAP_ENTRIES} are accepted"
    for key, offset in offsets.items():
        problem = _offsets_key_problem(key)
        if problem is not None:
            return problem
        if offset < 0:
            return f"offset {offset} for {excerpt(key)} is negative"
    return None


@functools.lru_cache(maxsize=4096, typed=True)
def _offsets_key_problem(key: str) -> str | None:
    """Why ``key`` is not an offsets key (None: it is). A memo, as ``storage_uri``: every ack of a
    task names the same ``topic:partition`` keys again; the check is pure."""
    try:
        _, partition = parse_offsets_key(key)
    except ValueError as exc:
        return str(exc)
    if partition > MAX_PARTITION or key.rpartition(":")[2] != str(partition):
        return f"partition of offsets key {excerpt(key)!r} is not a Kafka partition number"
    return None


def _outside_problem(uri: str, location: str) -> str | None:
    """Why a state handle's ``uri`` is not strictly inside checkpoint ``location`` (None when it is).

    Both are parsed by :func:`events.wire.validation.parse_uri`: a URI that does not parse cannot be
    shown to be inside, so it is refused the same way. Symbolic links are the shell's to resolve.
    """
    root = storage_uri(location)
    if isinstance(root, str):
        return (
            f"checkpoint location {excerpt(location)!r} is not a storage URI cutline accepts: {excerpt(root)}"
        )
    try:
        inner = parse_below(uri, location)
    except InvalidUri as exc:
        return f"state URI is not a storage URI cutline accepts: {excerpt(exc)}"
    if not inner.within(root):
        return f"state {excerpt(uri)!r} is outside checkpoint location {excerpt(location)!r}"
    return None


def stale_answer(
    answer: CheckpointAcknowledged | CheckpointDeclined,
    headers: Iterable[tuple[str, bytes | None]],
    epoch: int,
    triggered: int | None,
    state: JobState | None,
) -> tuple[str, str] | None:
    """The dead-letter reason and message of an ack or decline that answers a superseded barrier, or
    whose epoch header is void (None: it answers a valid one, or cannot tell). ``epoch``: the one the
    worker decides under; ``triggered``: the epoch the checkpoint's trigger was journaled in (None:
    it is not pending); ``state``: the job's (None: unknown). Docs/design.md, "Ownership and fencing"."""
    answered = header_epoch(headers)  # as every reader reads a record's epoch
    if answered is None:
        return None  # a writer that does not echo epochs: the decider's checks apply
    if triggered is not None and answered >= triggered:
        return None  # the usual answer, to the barrier of the epoch that triggered it
    what = "ack" if isinstance(answer, CheckpointAcknowledged) else "decline"
    checkpoint_id = answer.checkpoint_id
    if answered == VOID_EPOCH:
        return DeadLetterReason.VOID_EPOCH, (
            f"the {what} of checkpoint {checkpoint_id} has {epoch_problem(headers)}: "
            "it is void (docs/design.md, Ownership and fencing); "
            "answer with the one epoch header of the barrier"
        )
    if triggered is not None:
        return DeadLetterReason.STALE_EPOCH, (
            f"the {what} of checkpoint {checkpoint_id} answers a barrier of coordinator epoch "
            f"{answered}, but the checkpoint was triggered in epoch {triggered}: that barrier came "
            "from a superseded coordinator (its trigger is void); answer the current barrier"
        )
    never_triggered = state is None or checkpoint_id >= state.next_checkpoint_id
    if answered < epoch and never_triggered:
        # An id the valid journal has not reached: only a void trigger can have sent that barrier.
        # A late or repeated answer to a valid checkpoint that is over is the decider's to reject.
        return DeadLetterReason.STALE_EPOCH, (
            f"the {what} of checkpoint {checkpoint_id} answers a barrier of coordinator epoch "
            f"{answered}; the journal's epoch is {epoch} and has no such pending checkpoint "
            "(the barrier came from a superseded coordinator)"
        )
    return None
