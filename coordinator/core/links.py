"""The ``file:`` paths a decision would accept or write, asked of the file system before deciding.

The decider judges URIs as strings (:mod:`coordinator.core.checks`); whether a ``file:`` path leads out
of where it must stay through a symbolic link, only the file system can say (docs/security.md). So
the shell asks it first: :func:`questions` derives, from the job's state and the command alone, what
the decision could accept or write, the shell answers each one (the
:class:`~coordinator.service.ports.FileChecks` port), and :func:`with_links` hands the answers to the
decider as data (the command's ``links``). Nothing after ``decide`` reads the file system:

- an ack's ``file:`` state handle must stay inside its checkpoint's directory (:class:`Below`);
- the ``_metadata`` object of a completion the command may make (the last ack of a checkpoint, a
  tick completing one a cut-short write left) goes there only if the journal cannot hold the
  completion, and must stay inside the checkpoint's directory too (:class:`Below`);
- a savepoint's location must stay inside its savepoint roots (:class:`WithinRoots`).

Pure: no I/O. A question asked for nothing (a duplicate ack, a completion that fits the journal)
costs one answer and changes no decision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

from coordinator.core.commands import AcknowledgeCheckpoint, Command, RequestCheckpoint, StopJob, Tick
from coordinator.core.decider import savepoint_location, trusted_roots
from coordinator.core.state import JobState, PendingCheckpoint
from events.wire.codegen import fast_init
from events.wire.metadata import metadata_uri
from events.wire.records import CheckpointKind

__all__ = ["Below", "Question", "WithinRoots", "questions", "with_links"]


@fast_init
@dataclass(frozen=True, slots=True)
class Below:
    """Does ``uri`` stay below the real directory of the checkpoint at ``location`` (the real path of
    the deepest of ``roots`` it is in, then the rest of ``location`` as written)?"""

    uri: str
    location: str
    roots: tuple[str, ...]


@fast_init
@dataclass(frozen=True, slots=True)
class WithinRoots:
    """Does the real path of ``uri`` stay in (or equal) the real path of one of ``roots``?"""

    uri: str
    roots: tuple[str, ...]


Question: TypeAlias = Below | WithinRoots


def questions(state: JobState, command: Command, configured: tuple[str, ...]) -> tuple[Question, ...]:
    """What the file system must answer before ``command`` is decided in ``state`` (``configured``:
    the coordinator's savepoint roots)."""
    config = state.config
    if config is None:
        return ()
    if type(command) is AcknowledgeCheckpoint:  # first: nearly every input is an ack
        pending = state.pending.get(command.ack.checkpoint_id)
        if pending is None or command.ack.task_id in pending.acks:
            return ()  # late or a duplicate: nothing of it is used
        return _ack_questions(command, pending, trusted_roots(config.location, configured))
    if isinstance(command, Tick):
        roots = trusted_roots(config.location, configured)
        return tuple(_metadata(p, roots) for p in state.pending.values() if p.fully_acknowledged)
    if isinstance(command, (RequestCheckpoint, StopJob)):
        if isinstance(command, RequestCheckpoint) and command.request.kind is not CheckpointKind.SAVEPOINT:
            return ()
        location = savepoint_location(state, command.request.target, command.now_ms)
        return (WithinRoots(location, trusted_roots(config.location, configured)),)
    return ()


def _ack_questions(
    command: AcknowledgeCheckpoint, pending: PendingCheckpoint, roots: tuple[str, ...]
) -> tuple[Question, ...]:
    ack = command.ack
    asked: tuple[Question, ...] = ()
    if ack.state is not None and ack.state.inline is None:
        asked = (Below(ack.state.uri, pending.triggered.location, roots),)
    if ack.task_id in pending.task_ids and len(pending.acks) + 1 == len(pending.triggered.tasks):
        asked += (_metadata(pending, roots),)  # the last ack: it completes the checkpoint
    return asked


def _metadata(pending: PendingCheckpoint, roots: tuple[str, ...]) -> Below:
    location = pending.triggered.location
    return Below(metadata_uri(location), location, roots)


def with_links(command: Command, links: Mapping[str, str]) -> Command:
    """``command`` carrying the answers (each ``file:`` URI that leads out, with its real path) to the
    decider; a tick's answers are only the encoder's (:mod:`coordinator.core.encoding`)."""
    if not links or not isinstance(command, (AcknowledgeCheckpoint, RequestCheckpoint, StopJob)):
        return command
    return dataclasses.replace(command, links=links)
