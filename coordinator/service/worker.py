"""The worker: ownership, recovery and fold snapshots of journal partitions, independent of Faust.

It holds this worker's :class:`coordinator.ownership.Ownership`, turns what the transport tells it
(assignments, revocations, the claims the journal watcher reads) into the state machine's facts,
and carries out the commands that come back: recovery steps in threads
(:class:`coordinator.service.claims.PartitionRecovery`), barriers resent and partitions merged
into or dropped from the runtime (:class:`coordinator.service.runtime.Coordinator`) under the
publish lock, the watcher told what to read. The Faust shell (:mod:`coordinator.service.app`)
asks it only which partitions it decides, under which epoch.

No decision about ownership is taken here: they are all :func:`coordinator.ownership.step`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from coordinator.ownership import (
    BarriersResent,
    Claim,
    ClaimRead,
    ClaimWriteFailed,
    Command,
    Fact,
    FoldJournal,
    JournalWriteFailed,
    Ownership,
    PartitionsAssigned,
    PartitionsRevoked,
    Phase,
    ReadSnapshot,
    ReadToClaim,
    RecoveryFailed,
    ResendBarriers,
    ResendFailed,
    StartDeciding,
    StopDeciding,
    WriteClaim,
    initial_ownership,
    step,
)
from coordinator.service.claims import PartitionRecovery
from coordinator.service.metrics import PartitionView
from coordinator.service.runtime import Coordinator, Outcome
from coordinator.snapshot import PartitionSnapshot

log = logging.getLogger("cutline.coordinator")

SNAPSHOT_WAIT_S = 5.0
"""How long a fold snapshot waits for the journal watcher to read past the offset it covers."""


@dataclass(slots=True)
class Owner:
    """This worker's hold on a partition it decides."""

    epoch: int
    journal_offset: int
    """The last journal offset this worker has written (or read to) in the partition."""
    recovery_seconds: float
    snapshot_offset: int = -1
    """The journal offset the last snapshot it wrote covers."""
    watched_to: int = -1
    """The journal offset the watcher reads next: every claim before it has been told."""


Publish = Callable[[Sequence[Outcome]], Awaitable[set[int]]]
"""Writes outcomes (journal first); the partitions whose writes failed."""
WriteSnapshot = Callable[[PartitionSnapshot], Awaitable[bool]]
RecoveryFactory = Callable[[int], PartitionRecovery]
Clock = Callable[[], int]


class Worker:
    """Owns journal partitions for one coordinator worker (see the module doc)."""

    def __init__(
        self,
        worker_id: str,
        runtime: Coordinator,
        publish_lock: asyncio.Lock,
        publish: Publish,
        write_snapshot: WriteSnapshot,
        new_recovery: RecoveryFactory,
        now_ms: Clock,
    ) -> None:
        self.worker_id = worker_id
        self.ownership: Ownership = initial_ownership(worker_id)
        self.runtime = runtime
        self.owners: dict[int, Owner] = {}
        """The partitions this worker decides now."""
        self.assignment_pending = True
        """No assignment told yet, or a rebalance revoked partitions and has not assigned yet."""
        self.stepped_down_total = 0
        """Times a newer claim made this worker stop deciding a partition (for metrics)."""
        self._lock, self._publish, self._write_snapshot = publish_lock, publish, write_snapshot
        self._new_recovery, self._now_ms = new_recovery, now_ms
        self._recoveries: dict[int, PartitionRecovery] = {}
        self._tasks: set[asyncio.Future[None]] = set()
        self._changed = asyncio.Event()
        self.watch: Callable[[int, int], None] = lambda partition, start: None
        self.unwatch: Callable[[int], None] = lambda partition: None

    # ------------------------------------------------------------ told by the transport

    def assigned(self, generation: int, partitions: Iterable[int]) -> None:
        self.assignment_pending = False
        self.tell(PartitionsAssigned(generation, frozenset(partitions)))

    def revoked(self, partitions: Iterable[int]) -> None:
        self.assignment_pending = True  # a rebalance: the next assignment is on its way
        self.tell(PartitionsRevoked(frozenset(partitions)))

    def journal_read(self, partition: int, claims: list[Claim], position: int) -> None:
        """The watcher read ``partition`` up to ``position`` and found ``claims`` (see watcher.py)."""
        for claim in claims:
            self.tell(ClaimRead(partition, claim))
        owner = self.owners.get(partition)
        if owner is not None:
            owner.watched_to = max(owner.watched_to, position)

    def written(self, partition: int, offset: int) -> None:
        """This worker's journal write to ``partition`` landed at ``offset``."""
        owner = self.owners.get(partition)
        if owner is not None:
            owner.journal_offset = max(owner.journal_offset, offset)

    def write_failed(self, partition: int, error: str) -> None:
        hold = self.ownership.holds.get(partition)
        if hold is not None:
            self.tell(JournalWriteFailed(partition, hold.generation, error))

    def tell(self, fact: Fact) -> None:
        """Step the ownership state machine and carry out what it asks for, in order."""
        made = step(self.ownership, fact)
        self.ownership = made.state
        for command in made.commands:
            self._carry_out(command)
        self._changed.set()
        self._changed = asyncio.Event()

    # ------------------------------------------------------------ asked by the shell

    def epoch_of(self, partition: int) -> int | None:
        """The claim epoch this worker decides ``partition`` under; None when it does not."""
        owner = self.owners.get(partition)
        return None if owner is None else owner.epoch

    def holds(self, partition: int) -> bool:
        """Is ``partition`` assigned to this worker (decided, recovering or stepped down)?"""
        return partition in self.ownership.holds

    def recovered(self) -> bool:
        """Assigned, and every held partition is decided (none recovering, none stepped down)."""
        return not self.assignment_pending and all(
            h.phase is Phase.DECIDING for h in self.ownership.holds.values()
        )

    async def settle(self, partitions: set[int], pending: Callable[[int], bool], patience: float) -> None:
        """Wait until each of ``partitions`` is decided here or is not this worker's.

        A partition being recovered, or stepped down while still held (its revocation is on its
        way), is waited for; so is one ``pending`` says the consumer holds before the assignment
        was told (Faust may hand over messages first). Waiting is bounded by ``patience`` seconds
        per change, after which the caller skips what it does not decide."""
        while True:
            waiting = [p for p in partitions if self._unsettled(p, pending)]
            if not waiting:
                return
            try:
                await asyncio.wait_for(self._changed.wait(), patience)
            except TimeoutError:
                log.warning("journal partitions %s not settled after %.0f s; going on", waiting, patience)
                return

    def _unsettled(self, partition: int, pending: Callable[[int], bool]) -> bool:
        hold = self.ownership.holds.get(partition)
        if hold is None:
            return pending(partition)
        return hold.phase is not Phase.DECIDING

    def views(self) -> list[PartitionView]:
        views = []
        for partition, hold in sorted(self.ownership.holds.items()):
            owner = self.owners.get(partition)
            views.append(
                PartitionView(
                    partition,
                    hold.claim_epoch,
                    owner is not None,
                    owner.journal_offset if owner else hold.claim_offset,
                    owner.recovery_seconds if owner else None,
                    hold.phase.value,
                )
            )
        return views

    async def write_snapshots(self) -> None:
        """Bounded recovery: a snapshot of each decided partition whose journal moved since its last."""
        for partition, owner in list(self.owners.items()):
            if owner.journal_offset > owner.snapshot_offset:
                await self._snapshot(partition, owner)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for recovery in self._recoveries.values():
            await asyncio.get_running_loop().run_in_executor(None, recovery.close)

    # ------------------------------------------------------------ carrying out commands

    def _carry_out(self, command: Command) -> None:
        match command:
            case ReadSnapshot(partition=p, generation=g, delay_s=delay):
                # A recovery it replaces is in the middle of a step: it closes itself after it.
                recovery = self._recoveries[p] = self._new_recovery(p)
                self._spawn(self._io(recovery, g, delay, lambda: recovery.read_snapshot(g)))
            case FoldJournal(partition=p, generation=g):
                recovery = self._recoveries[p]
                self._spawn(self._io(recovery, g, 0.0, lambda: recovery.fold_journal(g)))
            case WriteClaim(partition=p, generation=g, epoch=epoch):
                recovery = self._recoveries[p]
                self._spawn(self._io(recovery, g, 0.0, lambda: self._claim(recovery, g, epoch)))
            case ReadToClaim(partition=p, generation=g, offset=offset):
                recovery = self._recoveries[p]
                self._spawn(self._io(recovery, g, 0.0, lambda: recovery.read_to_claim(g, offset)))
            case ResendBarriers(partition=p, generation=g, epoch=epoch):
                self._spawn(self._resend(p, g, epoch))
            case StartDeciding(partition=p, epoch=epoch, claim_offset=offset):
                self._start(p, epoch, offset)
            case StopDeciding(partition=p, reason=reason, fenced_by=claim):
                self._stop(p, reason, claim)

    def _claim(self, recovery: PartitionRecovery, generation: int, epoch: int) -> Fact:
        """Write the claim, unless the generation it is for is gone by now (checked in the thread,
        just before the write: a claim queued behind others must not outlive its generation)."""
        partition = recovery.partition
        hold = self.ownership.holds.get(partition)
        if hold is None or (hold.generation, hold.phase, hold.claim_epoch) != (
            generation,
            Phase.CLAIMING,
            epoch,
        ):
            return ClaimWriteFailed(partition, generation, epoch, "abandoned: its generation is gone")
        return recovery.write_claim(generation, epoch)

    async def _io(
        self, recovery: PartitionRecovery, generation: int, delay: float, work: Callable[[], Fact]
    ) -> None:
        """One recovery step in a thread; its fact told; the recovery closed if nothing follows."""
        partition = recovery.partition
        if delay:
            await asyncio.sleep(delay)
        try:
            fact = await asyncio.get_running_loop().run_in_executor(None, work)
        except Exception as exc:
            log.exception("recovering journal partition %d failed; trying again", partition)
            fact = RecoveryFailed(partition, generation, f"{type(exc).__name__}: {exc}")
        self.tell(fact)
        hold = self.ownership.holds.get(partition)
        if self._recoveries.get(partition) is not recovery:
            await self._close(recovery)  # replaced (a new generation) or taken (deciding)
        elif hold is None or hold.generation != generation or hold.phase is Phase.STEPPED_DOWN:
            del self._recoveries[partition]  # abandoned, or lost to another worker's claim
            await self._close(recovery)

    async def _resend(self, partition: int, generation: int, epoch: int) -> None:
        recovery = self._recoveries[partition]
        async with self._lock:
            hold = self.ownership.holds.get(partition)
            if hold is None or hold.generation != generation or hold.phase is not Phase.RESENDING:
                if self._recoveries.get(partition) is recovery:
                    del self._recoveries[partition]
                await self._close(recovery)
                return  # abandoned meanwhile
            self.runtime.merge(recovery.coordinator, partition)
            resent = self.runtime.resume(self._now_ms(), partition, epoch)
            failed = await self._publish([Outcome(messages=resent)])
        if partition in failed:
            self.tell(ResendFailed(partition, generation, "a barrier could not be written"))
        else:
            self.tell(BarriersResent(partition, generation))

    def _start(self, partition: int, epoch: int, claim_offset: int) -> None:
        recovery = self._recoveries.pop(partition)
        seconds = time.monotonic() - recovery.started
        owner = self.owners[partition] = Owner(epoch, claim_offset, seconds, watched_to=claim_offset + 1)
        self.watch(partition, claim_offset + 1)
        log.info(
            "claimed journal partition %d with epoch %d at offset %d: %d records folded%s in %.2fs",
            partition,
            epoch,
            claim_offset,
            recovery.folded,
            "" if recovery.snapshot_offset is None else f" after the snapshot at {recovery.snapshot_offset}",
            seconds,
        )
        self._spawn(self._close(recovery))
        # The fold up to the claim is valid (read to the claim): the next recovery starts here.
        self._spawn(self._snapshot(partition, owner))

    def _stop(self, partition: int, reason: str, fenced_by: Claim | None) -> None:
        self.owners.pop(partition, None)
        self.unwatch(partition)
        if fenced_by is not None:
            self.stepped_down_total += 1
            log.warning("journal partition %d: stepped down, decides nothing of it: %s", partition, reason)
        else:
            log.info("journal partition %d: no longer decided here (%s)", partition, reason)
        self._spawn(self._drop(partition))

    async def _drop(self, partition: int) -> None:
        async with self._lock:
            if partition not in self.owners:
                self.runtime.drop_partition(partition)

    async def _snapshot(self, partition: int, owner: Owner) -> None:
        """Write a snapshot of ``partition``'s fold once the watcher has read past what it covers
        and the worker still decides it under the same claim (so the snapshot is a valid base)."""
        async with self._lock:  # no decision half-published: the state is the journal's fold
            if self.owners.get(partition) is not owner:
                return
            snapshot = self.runtime.snapshot(partition, owner.epoch, owner.journal_offset, self._now_ms())
        deadline = time.monotonic() + SNAPSHOT_WAIT_S
        while owner.watched_to <= snapshot.journal_offset and self.owners.get(partition) is owner:
            if time.monotonic() > deadline:
                return  # the watcher lags: the next round tries again
            await asyncio.sleep(0.02)
        if self.owners.get(partition) is owner and await self._write_snapshot(snapshot):
            owner.snapshot_offset = max(owner.snapshot_offset, snapshot.journal_offset)

    async def _close(self, recovery: PartitionRecovery) -> None:
        await asyncio.get_running_loop().run_in_executor(None, recovery.close)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
