"""Carries out :mod:`spark_tasks.retention`'s plans on the job's storage (local paths, ``file:`` or any
fsspec URI): lists the directories a plan reads, reads a keyed checkpoint's manifests, deletes.

A failed listing, read or delete is logged and skipped, never raised: the journal follower that
calls this goes on with the next record, and a file left behind is only space.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote

from events.task import storage
from events.task.keyed_pieces import read_manifest
from events.task.ledger import Discard
from events.wire.records import CheckpointCompleted
from spark_tasks.keyed import keyed_task_id
from spark_tasks.retention import (
    DeleteFile,
    DirectoryFiles,
    DiscardAborted,
    RetainCompleted,
    RetentionCommand,
    RetentionState,
    canonical_uri,
    directories_to_read,
    plan_retention,
)
from spark_tasks.tasks import snapshot_names

__all__ = ["RunFiles", "RetentionExecutor"]

log = logging.getLogger(__name__)

PIECE_SUFFIXES = (".full", ".delta")


@dataclass(frozen=True)
class RunFiles:
    """Which files in a checkpoint directory one run and attempt of a job wrote: the only ones
    retention deletes (another run's or attempt's files are theirs)."""

    tasks: tuple[str, ...]
    attempt: int
    run_id: str
    keyed_partitions: int | None

    def of(self, names: Iterable[str]) -> DirectoryFiles:
        """This run's snapshots and pieces among a directory's file ``names``."""
        names = list(names)
        prefixes = tuple(
            quote(f"{keyed_task_id(i)}.a{self.attempt}-{self.run_id}.cut-", safe=":@=+,")
            for i in range(self.keyed_partitions or 0)
        )
        return DirectoryFiles(
            snapshots=tuple(snapshot_names(names, self.tasks, self.attempt, self.run_id)),
            pieces=tuple(n for n in names if n.startswith(prefixes) and n.endswith(PIECE_SUFFIXES))
            if prefixes
            else (),
        )


class RetentionExecutor:
    """One job's retention: its state between journal records, and the plans carried out."""

    def __init__(self, *, keyed: bool) -> None:
        self.state = RetentionState(keyed=keyed)

    def completed(
        self, checkpoint_id: int, discards: Iterable[Discard], pieces: frozenset[str] | None, run: RunFiles
    ) -> None:
        """A checkpoint completed: delete what the ledger's ``discards`` leave unneeded. ``pieces``: a keyed
        checkpoint's (:meth:`pieces_needed_by`, read before its offsets are committed), else None."""
        self.carry_out(RetainCompleted(checkpoint_id, tuple(discards), pieces), run)

    def aborted(self, discard: Discard, run: RunFiles) -> None:
        """A checkpoint aborted and the ledger discards it."""
        self.carry_out(DiscardAborted(discard), run)

    def carry_out(self, command: RetentionCommand, run: RunFiles) -> None:
        """List what the plan reads, plan, then delete in the plan's order."""
        files = {d: run.of(_names(d)) for d in directories_to_read(self.state, command)}
        plan = plan_retention(self.state, command, files)
        for step in plan.steps:
            if isinstance(step, DeleteFile):
                _delete(step.uri)
            else:
                storage.remove_empty_directory(step.directory)
        self.state = plan.state

    @staticmethod
    def pieces_needed_by(completed: CheckpointCompleted) -> frozenset[str]:
        """The pieces (canonical URIs) a keyed checkpoint's manifests list (a chain reaches into older
        checkpoints' directories: those pieces stay while this checkpoint is retained)."""
        needed: set[str] = set()
        for task, handle in completed.handles.items():
            if not task.startswith("keyed-"):
                continue
            try:
                manifest = read_manifest(handle)
                needed.update(canonical_uri(piece.uri) for piece in manifest.pieces)
            except (OSError, ValueError) as exc:  # SnapshotCorrupted, UnsupportedLocation, InvalidUri
                log.warning("checkpoint %d: cannot read %s (%s)", completed.checkpoint_id, handle.uri, exc)
        return frozenset(needed)


def _names(directory: str) -> list[str]:
    try:
        return storage.list_names(directory)
    except (OSError, ValueError, ImportError) as exc:
        log.warning("cannot list %s: %s", directory, exc)
        return []


def _delete(uri: str) -> None:
    try:
        storage.delete(uri)
    except (OSError, ValueError, ImportError) as exc:
        log.warning("cannot delete %s: %s", uri, exc)
