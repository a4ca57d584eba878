"""Ownership of journal partitions: what one coordinator worker knows, and what it must do next.

A pure state machine, like :mod:`coordinator.core.decider`, for the rules of docs/coordinator.md
("N workers, claims and fencing"). The service turns Faust callbacks and Kafka results into *facts*
(past tense: :class:`PartitionsAssigned`, :class:`ClaimWritten`, :class:`ClaimRead`, ...),
hands each to :func:`step`, and carries out the *commands* it returns (imperative:
:class:`ReadSnapshot`, :class:`WriteClaim`, :class:`StartDeciding`, ...). The deterministic
simulator (:mod:`coordinator.simulation`) runs the production worker, and so this function, for
many workers.

Per partition, a worker goes through these phases::

    UNASSIGNED -> RECOVERING (snapshot, then the journal to its end)
               -> CLAIMING (its claim written, then the journal read up to it)
               -> RESENDING (barriers of pending checkpoints again)
               -> DECIDING
               -> STEPPED_DOWN (a newer claim fenced it; it says so and decides nothing)

The rules it keeps:

- **A claim belongs to the generation that assigned the partition.** Every command and every
  fact about a partition carries the group generation it was for; a fact of any other
  generation than the partition's current one is stale and changes nothing, so work queued or
  in flight for a lost generation is abandoned, never carried on.
- **A lost claim is retried only against an older generation.** When the journal read up to
  its claim shows another worker's claim as the effective one, the worker claims again, higher,
  only if that claim came from an older generation than its own (a zombie that wrote late).
  A claim of the same, a newer or an unknown generation wins: the worker steps down.
- **A newer claim stops the deciding at once.** A worker that reads, in a partition it
  decides, a valid claim newer than its own stops deciding in the same step and says so
  (:class:`StopDeciding` with the claim that fenced it). It claims again at once only when that
  claim came from an older generation than its own assignment; otherwise only when the group
  assigns the partition to it anew.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TypeAlias

__all__ = [
    "UNKNOWN_GENERATION",
    "BarriersResent",
    "Claim",
    "ClaimRead",
    "ClaimSettled",
    "ClaimWriteFailed",
    "ClaimWritten",
    "OwnershipCommand",
    "Fact",
    "FoldJournal",
    "Hold",
    "JournalFolded",
    "JournalWriteFailed",
    "Ownership",
    "PartitionsAssigned",
    "PartitionsRevoked",
    "Phase",
    "ReadSnapshot",
    "ReadToClaim",
    "RecoveryFailed",
    "ResendBarriers",
    "ResendFailed",
    "SnapshotRead",
    "StartDeciding",
    "OwnershipStep",
    "StopDeciding",
    "WriteClaim",
    "initial_ownership",
    "step",
    "steps",
]

UNKNOWN_GENERATION = -1
"""The generation of a claim written by a worker that did not record one (older releases)."""

RETRY_DELAY_S = 1.0
"""Seconds before a failed recovery step is tried again."""


class Phase(StrEnum):
    """Where a worker stands with one partition."""

    RECOVERING = "RECOVERING"
    """Reading the partition's snapshot and folding the journal after it, to its end."""
    CLAIMING = "CLAIMING"
    """Its claim is written (or being written) and the journal is being read up to it."""
    RESENDING = "RESENDING"
    """The claim holds; barriers of pending checkpoints are being sent again."""
    DECIDING = "DECIDING"
    """It decides the partition's input: its records count under the fencing rule."""
    STEPPED_DOWN = "STEPPED_DOWN"
    """A newer claim fenced it: it decides nothing of the partition until assigned it anew."""


@dataclass(frozen=True, slots=True)
class Claim:
    """A valid ``CoordinatorClaimed`` as read from the journal."""

    epoch: int
    worker_id: str
    generation: int
    """The group generation its writer claimed for (:data:`UNKNOWN_GENERATION`: not recorded)."""
    offset: int


@dataclass(frozen=True, slots=True)
class Hold:
    """This worker's hold on one assigned partition."""

    generation: int
    """The group generation that assigned the partition to this worker."""
    phase: Phase
    highest_epoch: int = 0
    """The highest claim epoch seen in the partition (a valid claim, or any record's epoch)."""
    claim_epoch: int = 0
    """The epoch of this worker's claim for this generation (0: none written yet)."""
    claim_offset: int = -1
    """The journal offset of that claim, once written."""
    fenced_by: Claim | None = None
    """The claim that made it step down (``STEPPED_DOWN``)."""
    problem: str | None = None
    """Why its last recovery (or write) failed, while it is recovered again (None: none failed)."""


@dataclass(frozen=True, slots=True)
class Ownership:
    """What one worker knows of the partitions the group gave it."""

    worker_id: str
    generation: int = UNKNOWN_GENERATION
    """The latest group generation this worker was assigned partitions in."""
    holds: Mapping[int, Hold] = field(default_factory=dict)
    """Assigned partition -> this worker's hold on it (read-only: :func:`step` makes new ones)."""

    def deciding(self) -> frozenset[int]:
        """The partitions whose input this worker decides now."""
        return frozenset(p for p, h in self.holds.items() if h.phase is Phase.DECIDING)

    def stepped_down(self) -> frozenset[int]:
        """The assigned partitions a newer claim fenced this worker out of."""
        return frozenset(p for p, h in self.holds.items() if h.phase is Phase.STEPPED_DOWN)


def initial_ownership(worker_id: str) -> Ownership:
    """A worker that holds nothing yet."""
    return Ownership(worker_id)


# ---------------------------------------------------------------- facts


@dataclass(frozen=True, slots=True)
class PartitionsAssigned:
    """The group gave this worker ``partitions`` (its whole assignment) in ``generation``."""

    generation: int
    partitions: frozenset[int]


@dataclass(frozen=True, slots=True)
class PartitionsRevoked:
    """The group took ``partitions`` away (a rebalance began, or the worker left)."""

    partitions: frozenset[int]


@dataclass(frozen=True, slots=True)
class SnapshotRead:
    """The partition's latest snapshot was read and loaded (``journal_offset`` -1: none)."""

    partition: int
    generation: int
    epoch: int
    journal_offset: int


@dataclass(frozen=True, slots=True)
class JournalFolded:
    """The journal was folded to ``offset`` (its end when read), the highest epoch in it seen."""

    partition: int
    generation: int
    offset: int
    highest_epoch: int


@dataclass(frozen=True, slots=True)
class ClaimWritten:
    """This worker's claim of ``epoch`` is in the journal at ``offset``."""

    partition: int
    generation: int
    epoch: int
    offset: int


@dataclass(frozen=True, slots=True)
class ClaimWriteFailed:
    """This worker's claim could not be written (it may or may not be in the journal)."""

    partition: int
    generation: int
    epoch: int
    error: str


@dataclass(frozen=True, slots=True)
class ClaimSettled:
    """The journal was read up to this worker's claim: ``effective`` is the partition's current
    claim there, ``highest_epoch`` the highest epoch read."""

    partition: int
    generation: int
    effective: Claim
    highest_epoch: int


@dataclass(frozen=True, slots=True)
class BarriersResent:
    """The barriers of the partition's pending checkpoints went out again under the claim."""

    partition: int
    generation: int


@dataclass(frozen=True, slots=True)
class ResendFailed:
    """The barriers could not be sent again."""

    partition: int
    generation: int
    error: str


@dataclass(frozen=True, slots=True)
class JournalWriteFailed:
    """A journal write of a decided partition failed: the worker's state may hold decisions the
    journal lacks, so it recovers the partition again from the journal."""

    partition: int
    generation: int
    error: str


@dataclass(frozen=True, slots=True)
class RecoveryFailed:
    """Reading the snapshot or folding the journal failed; ``retry_after_s`` says when to try
    again (an operator's fix, such as a changed partition count, asks for a long wait)."""

    partition: int
    generation: int
    error: str
    retry_after_s: float = RETRY_DELAY_S


@dataclass(frozen=True, slots=True)
class ClaimRead:
    """A valid claim read from the journal while the worker holds the partition (the watcher)."""

    partition: int
    claim: Claim


Fact: TypeAlias = (
    PartitionsAssigned
    | PartitionsRevoked
    | SnapshotRead
    | JournalFolded
    | ClaimWritten
    | ClaimWriteFailed
    | ClaimSettled
    | BarriersResent
    | ResendFailed
    | JournalWriteFailed
    | RecoveryFailed
    | ClaimRead
)


# ------------------------------------------------------------- commands


@dataclass(frozen=True, slots=True)
class ReadSnapshot:
    """Start recovering: load the partition's latest snapshot into a fresh fold."""

    partition: int
    generation: int
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class FoldJournal:
    """Fold the journal after the snapshot, to its end as of now (by offset, never by silence)."""

    partition: int
    generation: int


@dataclass(frozen=True, slots=True)
class WriteClaim:
    """Append ``CoordinatorClaimed(epoch, generation)`` to the journal partition."""

    partition: int
    generation: int
    epoch: int


@dataclass(frozen=True, slots=True)
class ReadToClaim:
    """Fold the journal on up to ``offset`` (this worker's claim) and report the claim there."""

    partition: int
    generation: int
    offset: int


@dataclass(frozen=True, slots=True)
class ResendBarriers:
    """Send the barriers of the partition's pending checkpoints again, under ``epoch``."""

    partition: int
    generation: int
    epoch: int


@dataclass(frozen=True, slots=True)
class StartDeciding:
    """Take the recovered fold as the partition's state and decide its input under ``epoch``;
    watch the journal from ``claim_offset`` for newer claims."""

    partition: int
    epoch: int
    claim_offset: int


@dataclass(frozen=True, slots=True)
class StopDeciding:
    """Stop deciding the partition at once and drop its state; say why (``fenced_by``: the newer
    claim that fenced this worker, None when the group took the partition away)."""

    partition: int
    reason: str
    fenced_by: Claim | None = None


OwnershipCommand: TypeAlias = (
    ReadSnapshot | FoldJournal | WriteClaim | ReadToClaim | ResendBarriers | StartDeciding | StopDeciding
)


@dataclass(frozen=True, slots=True)
class OwnershipStep:
    """The state after one fact, and what to do about it (in this order)."""

    state: Ownership
    commands: tuple[OwnershipCommand, ...] = ()


# ---------------------------------------------------------------- rules


def step(state: Ownership, fact: Fact) -> OwnershipStep:
    """The ownership after ``fact`` and the commands it calls for. Total: never raises."""
    match fact:
        case PartitionsAssigned():
            return _assigned(state, fact)
        case PartitionsRevoked():
            return _revoked(state, fact.partitions, "the group took the partition away")
        case ClaimRead():
            return _claim_read(state, fact)
    hold = state.holds.get(fact.partition)
    if hold is None or hold.generation != fact.generation:
        return OwnershipStep(state)  # stale: work for a generation that is gone is abandoned
    return _recovery_step(state, fact.partition, hold, fact)


def steps(state: Ownership, facts: Iterable[Fact]) -> OwnershipStep:
    """:func:`step` over ``facts`` in order: the final state and every command."""
    commands: list[OwnershipCommand] = []
    for fact in facts:
        made = step(state, fact)
        state = made.state
        commands.extend(made.commands)
    return OwnershipStep(state, tuple(commands))


def _assigned(state: Ownership, fact: PartitionsAssigned) -> OwnershipStep:
    if fact.generation < state.generation:
        return OwnershipStep(state)  # an assignment older than one already seen: stale
    commands: list[OwnershipCommand] = []
    holds = dict(state.holds)
    for partition in sorted(holds.keys() - fact.partitions):
        commands.extend(_let_go(holds.pop(partition), partition, "not in the group's new assignment"))
    for partition in sorted(fact.partitions):
        held = holds.get(partition)
        if held is not None and held.generation == fact.generation:
            continue  # the same assignment told twice
        if held is not None:
            commands.extend(_let_go(held, partition, "assigned again in a new generation"))
        holds[partition] = Hold(fact.generation, Phase.RECOVERING)
        commands.append(ReadSnapshot(partition, fact.generation))
    return OwnershipStep(replace(state, generation=fact.generation, holds=holds), tuple(commands))


def _revoked(state: Ownership, partitions: frozenset[int], reason: str) -> OwnershipStep:
    holds = dict(state.holds)
    commands: list[OwnershipCommand] = []
    for partition in sorted(partitions & holds.keys()):
        commands.extend(_let_go(holds.pop(partition), partition, reason))
    return OwnershipStep(replace(state, holds=holds), tuple(commands))


def _let_go(hold: Hold, partition: int, reason: str) -> list[OwnershipCommand]:
    """What giving up ``hold`` asks for: a partition decided (or about to be) stops at once."""
    if hold.phase in (Phase.RESENDING, Phase.DECIDING):
        return [StopDeciding(partition, reason)]
    return []


def _recovery_step(state: Ownership, partition: int, hold: Hold, fact: Fact) -> OwnershipStep:
    """A result of the recovery work for ``partition``'s current generation."""
    g = hold.generation
    match fact, hold.phase:
        case SnapshotRead(), Phase.RECOVERING:
            raised = replace(hold, highest_epoch=max(hold.highest_epoch, fact.epoch))
            return _with(state, partition, raised, FoldJournal(partition, g))
        case JournalFolded(), Phase.RECOVERING:
            epoch = max(hold.highest_epoch, fact.highest_epoch) + 1
            claiming = replace(hold, phase=Phase.CLAIMING, highest_epoch=epoch - 1, claim_epoch=epoch)
            return _with(state, partition, claiming, WriteClaim(partition, g, epoch))
        case ClaimWritten(), Phase.CLAIMING if fact.epoch == hold.claim_epoch:
            written = replace(hold, claim_offset=fact.offset)
            return _with(state, partition, written, ReadToClaim(partition, g, fact.offset))
        case ClaimWriteFailed(), Phase.CLAIMING if fact.epoch == hold.claim_epoch:
            # It may have landed: fold again to the end and claim above whatever is there.
            failed = replace(hold, problem=f"its claim could not be written ({fact.error})")
            return _restart(state, partition, failed, RETRY_DELAY_S)
        case ClaimSettled(), Phase.CLAIMING:
            return _settled(state, partition, hold, fact)
        case BarriersResent(), Phase.RESENDING:
            deciding = replace(hold, phase=Phase.DECIDING, problem=None)
            return _with(
                state, partition, deciding, StartDeciding(partition, hold.claim_epoch, hold.claim_offset)
            )
        case ResendFailed() | JournalWriteFailed(), Phase.RESENDING | Phase.DECIDING:
            stop = StopDeciding(partition, f"a write failed ({fact.error}); recovering again")
            failed = replace(hold, problem=f"a write failed ({fact.error})")
            return _restart(state, partition, failed, RETRY_DELAY_S, stop)
        case RecoveryFailed(), (Phase.RECOVERING | Phase.CLAIMING):
            failed = replace(hold, problem=f"recovering failed ({fact.error})")
            return _restart(state, partition, failed, fact.retry_after_s)
    return OwnershipStep(state)


def _settled(state: Ownership, partition: int, hold: Hold, fact: ClaimSettled) -> OwnershipStep:
    """The journal read up to this worker's claim: own it, claim again higher, or step down."""
    effective = fact.effective
    highest = max(hold.highest_epoch, fact.highest_epoch, effective.epoch)
    if effective.worker_id == state.worker_id and effective.epoch == hold.claim_epoch:
        held = replace(hold, phase=Phase.RESENDING, highest_epoch=highest, claim_offset=effective.offset)
        return _with(state, partition, held, ResendBarriers(partition, hold.generation, hold.claim_epoch))
    if _older(effective, hold.generation):
        epoch = highest + 1
        again = replace(hold, highest_epoch=highest, claim_epoch=epoch, claim_offset=-1)
        return _with(state, partition, again, WriteClaim(partition, hold.generation, epoch))
    down = replace(hold, phase=Phase.STEPPED_DOWN, highest_epoch=highest, fenced_by=effective)
    return _with(state, partition, down)


def _claim_read(state: Ownership, fact: ClaimRead) -> OwnershipStep:
    """A claim the watcher read in a partition this worker holds."""
    partition, claim = fact.partition, fact.claim
    hold = state.holds.get(partition)
    if hold is None:
        return OwnershipStep(state)
    raised = replace(hold, highest_epoch=max(hold.highest_epoch, claim.epoch))
    if hold.phase not in (Phase.RESENDING, Phase.DECIDING) or claim.epoch <= hold.claim_epoch:
        # Not deciding (the claim it may be making settles it), or not newer than its own claim.
        return OwnershipStep(state) if raised == hold else _with(state, partition, raised)
    stop = StopDeciding(
        partition,
        f"worker {claim.worker_id} claimed the partition with epoch {claim.epoch} "
        f"(generation {claim.generation}) over this worker's epoch {hold.claim_epoch}",
        claim,
    )
    if _older(claim, hold.generation):
        late = f"a late claim of generation {claim.generation} (epoch {claim.epoch}) fenced its own"
        return _restart(state, partition, replace(raised, problem=late), 0.0, stop)
    down = replace(raised, phase=Phase.STEPPED_DOWN, fenced_by=claim)
    return _with(state, partition, down, stop)


def _older(claim: Claim, generation: int) -> bool:
    """Was ``claim`` made for an older generation than ``generation`` (a zombie's, provably)?"""
    return claim.generation != UNKNOWN_GENERATION and claim.generation < generation


def _restart(
    state: Ownership, partition: int, hold: Hold, delay_s: float, *first: OwnershipCommand
) -> OwnershipStep:
    """Recover the partition again from its snapshot, for the same generation (after ``first``)."""
    again = Hold(hold.generation, Phase.RECOVERING, highest_epoch=hold.highest_epoch, problem=hold.problem)
    return _with(state, partition, again, *first, ReadSnapshot(partition, hold.generation, delay_s))


def _with(state: Ownership, partition: int, hold: Hold, *commands: OwnershipCommand) -> OwnershipStep:
    holds = dict(state.holds)
    holds[partition] = hold
    return OwnershipStep(replace(state, holds=holds), commands)
