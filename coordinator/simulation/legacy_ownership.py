"""The old coordinator's ownership rules, kept ONLY so the simulator can show their bug again.

Never used by the service. :mod:`coordinator.simulation.run` (``--rules legacy``) runs the
production :class:`~coordinator.service.worker.Worker` with these rules in place of
:func:`coordinator.core.ownership.step`; its tests show that seeds break an invariant under them that
hold under the current rules. The old rules' mistakes, each reproduced here:

- **no generation guard in the rules**: a recovery result is taken whatever generation it was
  for, and a claim under way went on after a revocation (the worker's own guard on a queued
  claim still applies);
- **a lost claim is retried higher whatever the winner's generation**: two workers can fence
  each other in turn;
- **no step-down on a newer claim**: a fenced worker goes on deciding (all its records void) and
  believes it owns the partition.

It works on the same :class:`~coordinator.core.ownership.Ownership` data and returns the same
commands, so the worker carries both out the same way.
"""

from __future__ import annotations

from dataclasses import replace

from coordinator.core.ownership import (
    BarriersResent,
    ClaimRead,
    ClaimSettled,
    ClaimWriteFailed,
    ClaimWritten,
    Fact,
    FoldJournal,
    Hold,
    JournalFolded,
    Ownership,
    OwnershipCommand,
    OwnershipStep,
    PartitionsAssigned,
    PartitionsRevoked,
    Phase,
    ReadSnapshot,
    ReadToClaim,
    RecoveryFailed,
    ResendBarriers,
    ResendFailed,
    SnapshotRead,
    StartDeciding,
    StopDeciding,
    WriteClaim,
    step,
)

__all__ = ["legacy_step"]


def legacy_step(state: Ownership, fact: Fact) -> OwnershipStep:
    """The old rules: assignments as today, recovery results of any generation, no watching."""
    match fact:
        case PartitionsAssigned() | PartitionsRevoked():
            return _legacy_assignment(state, fact)
        case ClaimRead():
            return OwnershipStep(state)  # the old shell never read claims while deciding
    hold = state.holds.get(fact.partition)
    if hold is None:
        return OwnershipStep(state)
    return _legacy_recovery(state, fact, fact.partition, hold)


def _legacy_assignment(state: Ownership, fact: PartitionsAssigned | PartitionsRevoked) -> OwnershipStep:
    """Assignments as today, but the old shell did not cancel a claim under way: it goes on for a
    partition taken away."""
    made = step(state, fact)
    holds = dict(made.state.holds)
    for partition, under_way in state.holds.items():
        if under_way.phase is Phase.CLAIMING and partition not in holds:
            holds[partition] = under_way
    return OwnershipStep(replace(made.state, holds=holds), made.commands)


def _legacy_recovery(state: Ownership, fact: Fact, p: int, hold: Hold) -> OwnershipStep:
    """Recovery results of any generation are taken (the bug of regression seed 979)."""
    g = hold.generation
    match fact, hold.phase:
        case SnapshotRead(), Phase.RECOVERING:
            return _with(
                state, p, replace(hold, highest_epoch=max(hold.highest_epoch, fact.epoch)), FoldJournal(p, g)
            )
        case JournalFolded(), Phase.RECOVERING:
            epoch = max(hold.highest_epoch, fact.highest_epoch) + 1
            claiming = replace(hold, phase=Phase.CLAIMING, highest_epoch=epoch - 1, claim_epoch=epoch)
            return _with(state, p, claiming, WriteClaim(p, g, epoch))
        case ClaimWritten(), Phase.CLAIMING:
            written = replace(hold, claim_epoch=fact.epoch, claim_offset=fact.offset)
            return _with(state, p, written, ReadToClaim(p, g, fact.offset))
        case ClaimWriteFailed(), Phase.CLAIMING:
            return _with(state, p, Hold(g, Phase.RECOVERING, hold.highest_epoch), ReadSnapshot(p, g, 1.0))
        case ClaimSettled(), Phase.CLAIMING:
            highest = max(hold.highest_epoch, fact.highest_epoch, fact.effective.epoch)
            if fact.effective.worker_id == state.worker_id and fact.effective.epoch == hold.claim_epoch:
                if hold.generation < state.generation:  # it won a partition no longer its own: done
                    holds = {q: h for q, h in state.holds.items() if q != p}
                    return OwnershipStep(replace(state, holds=holds))
                held = replace(hold, phase=Phase.RESENDING, highest_epoch=highest)
                return _with(state, p, held, ResendBarriers(p, g, hold.claim_epoch))
            # Lost: claim again, higher, whoever won and for whatever generation.
            again = replace(hold, highest_epoch=highest, claim_epoch=highest + 1, claim_offset=-1)
            return _with(state, p, again, WriteClaim(p, g, highest + 1))
        case BarriersResent(), Phase.RESENDING:
            deciding = replace(hold, phase=Phase.DECIDING)
            return _with(state, p, deciding, StartDeciding(p, hold.claim_epoch, hold.claim_offset))
        case ResendFailed(), Phase.RESENDING:
            again = Hold(g, Phase.RECOVERING, hold.highest_epoch)
            return _with(state, p, again, StopDeciding(p, "barriers failed"), ReadSnapshot(p, g, 1.0))
        case RecoveryFailed(), (Phase.RECOVERING | Phase.CLAIMING):
            again = Hold(g, Phase.RECOVERING, hold.highest_epoch)
            return _with(state, p, again, ReadSnapshot(p, g, fact.retry_after_s))
    return OwnershipStep(state)


def _with(state: Ownership, partition: int, hold: Hold, *commands: OwnershipCommand) -> OwnershipStep:
    holds = dict(state.holds)
    holds[partition] = hold
    return OwnershipStep(replace(state, holds=holds), commands)
