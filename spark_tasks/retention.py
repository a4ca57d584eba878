"""What a checkpointed Spark job deletes when its ledger discards a checkpoint: a pure plan, no I/O.

The job's :class:`~events.task.ledger.JobLedger` decides *which* checkpoints go (completed ones beyond
``retained``, aborted ones; never the latest completed one, never a savepoint). This module decides
*which files* go, under one rule: **never delete what a restore may need**.

- A discarded checkpoint's per-partition snapshots of this run and its ``_metadata`` go at once; its
  directory goes when it is empty.
- A keyed job's snapshots are chains of pieces: a retained checkpoint's manifests can list pieces
  written in older checkpoints' directories. A piece goes only when no retained checkpoint's chain
  lists it (:attr:`RetentionState.needed`); a directory still holding needed pieces is remembered
  (:attr:`RetentionState.kept`) and swept again after each later completion.
- An aborted checkpoint's pieces wait (:attr:`RetentionState.aborted`) until a later checkpoint
  completes: a chain still pending when it aborted may list them.

The shell (:class:`spark_tasks.retention_executor.RetentionExecutor`) lists the directories
:func:`directories_to_read` names, hands their files to :func:`plan_retention`, and carries out its
steps in order, as :mod:`spark_tasks.restore` plans a restore and the job carries it out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from events.task.ledger import Discard
from events.task.storage import join
from events.wire.metadata import METADATA_FILE
from events.wire.validation import parse_uri

__all__ = [
    "DeleteFile",
    "DirectoryFiles",
    "DiscardAborted",
    "RemoveIfEmpty",
    "RetainCompleted",
    "RetentionCommand",
    "RetentionPlan",
    "RetentionState",
    "RetentionStep",
    "canonical_uri",
    "directories_to_read",
    "plan_retention",
]


def canonical_uri(uri: str) -> str:
    """``uri`` spelled as the ledger spells directories and pieces are compared
    (:func:`events.wire.validation.parse_uri`)."""
    return str(parse_uri(uri))


@dataclass(frozen=True)
class DirectoryFiles:
    """This run's files in one checkpoint directory, by kind (file names, not URIs)."""

    snapshots: tuple[str, ...] = ()
    """Per-partition snapshots of this run and attempt (:func:`spark_tasks.tasks.snapshot_names`)."""
    pieces: tuple[str, ...] = ()
    """A keyed job's pieces of this run and attempt (``keyed-<i>.a<attempt>-<run>.cut-<n>.full|.delta``)."""


@dataclass(frozen=True)
class RetentionState:
    """What retention remembers between journal records (only a keyed job's pieces need memory)."""

    keyed: bool
    needed: Mapping[int, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    """Retained keyed checkpoints, by id: the pieces (canonical URIs) their manifests list."""
    aborted: tuple[tuple[int, str], ...] = ()
    """Aborted checkpoints (id, directory) whose pieces wait for a later completion."""
    kept: frozenset[str] = frozenset()
    """Discarded checkpoints' directories that still hold pieces a retained chain needs."""

    @property
    def needed_pieces(self) -> frozenset[str]:
        """Every piece a restore of a retained checkpoint may read."""
        return frozenset().union(*self.needed.values())


@dataclass(frozen=True)
class RetainCompleted:
    """A checkpoint completed: discard what the ledger discards, and keep what its chain needs."""

    checkpoint_id: int
    discards: tuple[Discard, ...] = ()
    pieces: frozenset[str] | None = None
    """A keyed checkpoint's: the pieces (canonical URIs) its manifests list; None for a savepoint or
    a per-partition job's checkpoint (no chain to keep, nothing to sweep)."""


@dataclass(frozen=True)
class DiscardAborted:
    """A checkpoint aborted: discard its snapshots now, its pieces after a later completion."""

    discard: Discard


RetentionCommand = RetainCompleted | DiscardAborted


@dataclass(frozen=True)
class DeleteFile:
    """Delete one file (a storage URI); a file already gone is no problem."""

    uri: str


@dataclass(frozen=True)
class RemoveIfEmpty:
    """Remove a directory if nothing is in it."""

    directory: str


RetentionStep = DeleteFile | RemoveIfEmpty


@dataclass(frozen=True)
class RetentionPlan:
    """The steps to carry out, in order, and the state after them."""

    steps: tuple[RetentionStep, ...]
    state: RetentionState


def directories_to_read(state: RetentionState, command: RetentionCommand) -> tuple[str, ...]:
    """The directories whose files :func:`plan_retention` needs for ``command`` (listed once, before)."""
    if isinstance(command, DiscardAborted):
        discards: Iterable[Discard] = (command.discard,)
    else:
        discards = command.discards
    wanted = [d.directory for d in discards if d.directory is not None]
    if isinstance(command, RetainCompleted) and state.keyed and command.pieces is not None:
        wanted += [directory for aborted_id, directory in state.aborted if aborted_id < command.checkpoint_id]
        wanted += sorted(state.kept)
    return tuple(dict.fromkeys(wanted))


def plan_retention(
    state: RetentionState, command: RetentionCommand, files: Mapping[str, DirectoryFiles]
) -> RetentionPlan:
    """The files ``command`` deletes, given this run's ``files`` in each directory
    :func:`directories_to_read` named (a directory missing from ``files`` holds none)."""
    planner = _Planner(state, {d: (set(f.snapshots), set(f.pieces)) for d, f in files.items()})
    if isinstance(command, DiscardAborted):
        planner.discard(command.discard, aborted=True)
        return planner.plan()
    keyed_chain = command.pieces if state.keyed else None
    if keyed_chain is not None:
        planner.needed[command.checkpoint_id] = keyed_chain
    for discard in command.discards:
        planner.discard(discard, aborted=False)
    if keyed_chain is not None:
        planner.sweep(command.checkpoint_id)
    return planner.plan()


class _Planner:
    """Builds one plan: the state as it evolves, the steps so far, and the files not yet deleted."""

    def __init__(self, state: RetentionState, present: dict[str, tuple[set[str], set[str]]]) -> None:
        self.state = state
        self.needed: dict[int, frozenset[str]] = dict(state.needed)
        self.aborted = list(state.aborted)
        self.kept = set(state.kept)
        self.present = present
        self.steps: list[RetentionStep] = []

    def plan(self) -> RetentionPlan:
        state = replace(
            self.state,
            needed=MappingProxyType(dict(self.needed)),
            aborted=tuple(self.aborted),
            kept=frozenset(self.kept),
        )
        return RetentionPlan(tuple(self.steps), state)

    def discard(self, discard: Discard, *, aborted: bool) -> None:
        """This run's snapshots of the checkpoint and its ``_metadata``, then its directory if empty.
        A keyed job's pieces go only when no retained chain needs them; an aborted checkpoint's wait
        until a later checkpoint completes (a chain pending now may list them)."""
        directory = discard.directory
        if directory is None:  # not inside the job's checkpoint location: nothing of it is the job's
            return
        snapshots, _ = self.present.setdefault(directory, (set(), set()))
        self.steps += [DeleteFile(join(directory, name)) for name in sorted(snapshots)]
        snapshots.clear()
        self.steps.append(DeleteFile(join(directory, METADATA_FILE)))
        if self.state.keyed:
            self.needed.pop(discard.checkpoint_id, None)
            if aborted:
                self.aborted.append((discard.checkpoint_id, directory))
            else:
                self.delete_unneeded_pieces(directory)
        self.steps.append(RemoveIfEmpty(directory))

    def sweep(self, completed_id: int) -> None:
        """Pieces of aborted checkpoints older than a completed one, and pieces kept in discarded
        checkpoints' directories: no chain can need them any more, unless a retained one's does."""
        for aborted_id, directory in list(self.aborted):
            if aborted_id < completed_id:
                self.aborted.remove((aborted_id, directory))
                self.delete_unneeded_pieces(directory)
        for directory in sorted(self.kept):
            self.delete_unneeded_pieces(directory)

    def delete_unneeded_pieces(self, directory: str) -> None:
        """Delete the pieces in ``directory`` that no retained checkpoint needs; remember the directory
        while it keeps some (a later chain may stop needing them)."""
        needed = frozenset().union(*self.needed.values())
        _, pieces = self.present.setdefault(directory, (set(), set()))
        kept = False
        for name in sorted(pieces):
            uri = join(directory, name)
            if canonical_uri(uri) in needed:
                kept = True
            else:
                self.steps.append(DeleteFile(uri))
                pieces.discard(name)
        if kept:
            self.kept.add(directory)
        else:
            self.kept.discard(directory)
            self.steps.append(RemoveIfEmpty(directory))
