"""A savepoint written without a job (Flink's ``SavepointWriter``): a keyed step's state, as a job's own
savepoint holds it, from state the caller made (:mod:`spark_tasks.state_writer` makes it from a
DataFrame, an Arrow table or another savepoint's state).

:func:`savepoint_files` decides every file (pure): one full piece and one manifest per task, each
task owning a contiguous range of key groups, the manifests recording the step's identity and max
parallelism, and the ``CheckpointCompleted`` of kind ``SAVEPOINT`` whose handles name the manifests
with their sizes and sha256s. :func:`write_savepoint` writes them: the pieces, the manifests, then
``_metadata`` last, as a job's driver does, so a directory with ``_metadata`` is whole. A job
restores it exactly as a savepoint it took, through the same checks and refusals
(:mod:`spark_tasks.restore`: its job id, its step's uid and key function, its key groups and max
parallelism). :func:`read_savepoint_state` reads a savepoint or checkpoint back as whole state, every
piece checked, for a transform. Needs ``pyarrow``; nothing of Spark.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from events.task import storage
from events.task.completion_metadata import resolve_completion
from events.task.keyed_pieces import KeyedState, encode_piece, read_key_groups, read_manifests
from events.task.manifest import Manifest, Piece, StepIdentity
from events.task.participant import read_checkpoint_metadata
from events.wire.codec import Codec, default_codec
from events.wire.metadata import METADATA_FILE
from events.wire.records import CheckpointCompleted, CheckpointKind, StateHandle
from events.wire.validation import MAX_CHECKPOINT_ID, parse_offsets

__all__ = [
    "SavepointFiles",
    "SavepointTarget",
    "SavepointWriteRefused",
    "StoredState",
    "WRITTEN_NAME",
    "read_savepoint_state",
    "savepoint_files",
    "write_savepoint",
]

WRITTEN_NAME = "written"
"""The middle of a written savepoint's file names: ``keyed-3.written`` (a manifest) and
``keyed-3.written.full`` (its piece); a job's own carry its attempt, run and cut there."""


class SavepointWriteRefused(ValueError):
    """The savepoint cannot be written as asked; the message says what to change."""


@dataclass(frozen=True)
class SavepointTarget:
    """What a written savepoint is: whose (``job_id``: a job restores only its own, or one it names
    with ``restore_from_job``), of which step, with which key groups, and from where the job reads on."""

    job_id: str
    location: str
    """The savepoint's directory (a path or storage URI: ``file:``, ``s3://``); it must hold no
    ``_metadata`` yet."""
    step: StepIdentity
    max_parallelism: int
    task_groups: Sequence[range]
    """The key groups of each task (``keyed-0``, ``keyed-1``, …): contiguous, together 0 to
    ``max_parallelism - 1`` exactly once (``spark_tasks.keyed.key_group_range`` of any parallelism)."""
    offsets: Mapping[str, int] = field(default_factory=dict)
    """Where the job reads on, ``topic:partition`` → offset: the input the state already holds ends
    there. A partition without one starts from the earliest offset."""
    checkpoint_id: int = 1
    """The id the job reports restoring (1 to ``MAX_CHECKPOINT_ID``, as every checkpoint id)."""
    timestamp_ms: int = 0


@dataclass(frozen=True)
class SavepointFiles:
    """Every file of a savepoint, in the order they are written (pieces, then manifests), and its
    ``CheckpointCompleted`` (``_metadata``, written last)."""

    files: tuple[tuple[str, bytes], ...]
    completed: CheckpointCompleted


@dataclass(frozen=True)
class StoredState:
    """A savepoint's or checkpoint's keyed state, read back whole: ``state`` (key group → key → the
    stored bytes) of the step ``step`` (None: a manifest from before steps were recorded)."""

    completed: CheckpointCompleted
    state: KeyedState
    step: StepIdentity | None
    max_parallelism: int


def _task(index: int) -> str:
    return f"keyed-{index}"


def _check_target(target: SavepointTarget) -> None:
    """A job id, a checkpoint id a job may restore, the key groups of the tasks 0 to max parallelism -
    1 each once, and offsets that parse."""
    if not target.job_id:
        raise SavepointWriteRefused("a savepoint needs the id of the job that restores it (job_id)")
    if not 1 <= target.checkpoint_id <= MAX_CHECKPOINT_ID:
        raise SavepointWriteRefused(
            f"checkpoint id {target.checkpoint_id}: a savepoint's id is 1 to {MAX_CHECKPOINT_ID}, as any "
            "checkpoint's (the coordinator refuses a job that reports restoring another)"
        )
    covered = [group for groups in target.task_groups for group in groups]
    if sorted(covered) != list(range(target.max_parallelism)):
        raise SavepointWriteRefused(
            f"the tasks' key groups {[f'{g.start}-{g.stop - 1}' for g in target.task_groups]} are not "
            f"0-{target.max_parallelism - 1} each once: use spark_tasks.keyed.key_group_range"
        )
    try:
        parse_offsets(target.offsets)
    except ValueError as exc:
        raise SavepointWriteRefused(f"offsets: {exc} (give 'topic:partition' → offset)") from exc


def savepoint_files(state: KeyedState, target: SavepointTarget) -> SavepointFiles:
    """The files of a savepoint of ``state`` for ``target`` (pure): per task a full piece of its key
    groups' keys and a manifest naming it; a key group of ``state`` outside 0 to max parallelism - 1
    is refused (the key groups were made with another max parallelism)."""
    _check_target(target)
    stray = sorted(group for group in state if not 0 <= group < target.max_parallelism)
    if stray:
        raise SavepointWriteRefused(
            f"key groups {stray[:5]} are outside 0-{target.max_parallelism - 1}: the keys were grouped "
            "with another max parallelism"
        )
    location = target.location.rstrip("/")
    pieces: list[tuple[str, bytes]] = []
    manifests: list[tuple[str, bytes]] = []
    handles: dict[str, StateHandle] = {}
    for index, groups in enumerate(target.task_groups):
        task = _task(index)
        owned = {group: dict(state[group]) for group in groups if state.get(group)}
        data = encode_piece(owned)
        manifest_uri = f"{location}/{task}.{WRITTEN_NAME}"
        piece = Piece(
            f"{manifest_uri}.full",
            len(data),
            hashlib.sha256(data).hexdigest(),
            "full",
            sum(len(keys) for keys in owned.values()),
        )
        document = Manifest(task, target.max_parallelism, groups, 0, (piece,), target.step).to_bytes()
        pieces.append((piece.uri, data))
        manifests.append((manifest_uri, document))
        handles[task] = StateHandle(manifest_uri, len(document), hashlib.sha256(document).hexdigest())
    completed = CheckpointCompleted(
        job_id=target.job_id,
        checkpoint_id=target.checkpoint_id,
        kind=CheckpointKind.SAVEPOINT,
        timestamp_ms=target.timestamp_ms,
        duration_ms=0,
        handles=handles,
        size_bytes=sum(handle.size_bytes for handle in handles.values()),
        offsets=dict(target.offsets),
        location=location,
    )
    return SavepointFiles((*pieces, *manifests), completed)


def write_savepoint(files: SavepointFiles, codec: Codec | None = None) -> CheckpointCompleted:
    """Write ``files``: pieces and manifests, then ``_metadata`` (a job's driver writes it last too:
    a directory with one is whole). Refuses a location that holds a ``_metadata`` already: a
    savepoint is never overwritten."""
    metadata = storage.join(files.completed.location, METADATA_FILE)
    if storage.exists(metadata):
        raise SavepointWriteRefused(
            f"{files.completed.location} holds a savepoint or checkpoint already ({METADATA_FILE}): "
            "write into a new directory"
        )
    for uri, data in files.files:
        storage.write_bytes(uri, data)
    storage.write_bytes(metadata, (codec or default_codec()).encode(files.completed))
    return files.completed


def read_savepoint_state(location: str, uid: str | None = None) -> StoredState:
    """The keyed state of the savepoint or checkpoint at ``location`` (its ``_metadata``), whole,
    every manifest and piece checked as a restore checks them (a corrupt or missing one is
    :class:`~events.task.participant.SnapshotCorrupted` naming it). With ``uid``, the checkpoint's
    keyed step must be that one. Its manifests must agree on the step and max parallelism."""
    completed = resolve_completion(read_checkpoint_metadata(location))
    manifests = read_manifests(completed.handles)
    if not manifests:
        raise SavepointWriteRefused(f"{location} holds no keyed state (no keyed task's manifest)")
    steps = {manifest.step for manifest in manifests.values()}
    limits = {manifest.max_parallelism for manifest in manifests.values()}
    if len(steps) != 1 or len(limits) != 1:
        raise SavepointWriteRefused(
            f"{location}: its manifests disagree on the step ({len(steps)}) or max parallelism ({limits})"
        )
    step, max_parallelism = next(iter(steps)), next(iter(limits))
    if uid is not None and (step is None or step.uid != uid):
        held = "a step without a recorded identity" if step is None else step.describe()
        raise SavepointWriteRefused(f"{location} holds the state of {held}, not of uid {uid!r}")
    state, _ = read_key_groups(manifests, completed.handles, range(max_parallelism))
    return StoredState(completed, state, step, max_parallelism)
