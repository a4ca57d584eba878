"""The worker: ownership, recovery and fold snapshots of journal partitions, independent of Faust.

It holds this worker's :class:`coordinator.core.ownership.Ownership`, turns what the transport tells it
(assignments, revocations, the claims the journal watcher reads) into the state machine's facts,
and carries out the commands that come back: recovery steps on the executor (a
:class:`~coordinator.service.ports.Recovery` per partition and generation), barriers resent and
partitions merged into or dropped from the runtime (:class:`coordinator.service.runtime.Coordinator`)
under the publish lock, the watcher told what to read. The input loop
(:mod:`coordinator.service.inputs`) asks it only which partitions it decides, under which epoch.

Everything it does outside itself goes through the ports of :mod:`coordinator.service.ports`
(recoveries, the executor, the clock, the writes, the watcher): the Faust shell passes Kafka and
threads, the deterministic simulator (:mod:`coordinator.simulation`) its in-memory log and seeded
scheduler, and runs this same class.

No decision about ownership is taken here: they are all :func:`coordinator.core.ownership.step`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.core.ownership import (
    BarriersResent,
    Claim,
    ClaimRead,
    ClaimWriteFailed,
    Fact,
    FoldJournal,
    Hold,
    JournalWriteFailed,
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
    StartDeciding,
    StopDeciding,
    WriteClaim,
    initial_ownership,
    step,
)
from coordinator.core.state import JobState
from coordinator.core.stats import CheckpointStats
from coordinator.service.metrics import PartitionView
from coordinator.service.ports import (
    Clock,
    Executor,
    MetadataObjects,
    Recovery,
    RecoveryFactory,
    StoredMetadata,
    Watch,
    Writes,
)
from coordinator.service.runtime import Coordinator, Outcome
from coordinator.service.writer import Written

log = logging.getLogger("cutline.coordinator")

SNAPSHOT_WAIT_S = 5.0
"""How long a fold snapshot waits for the journal watcher to read past the offset it covers."""

UNDECIDED_WARN_S = 10.0
"""A partition held this long without being decided here is logged, with why (then every minute)."""
UNDECIDED_REPEAT_S = 60.0

Rules = Callable[[Ownership, Fact], OwnershipStep]
"""The ownership rules: :func:`coordinator.core.ownership.step` (the simulator can show older ones)."""


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
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when :attr:`watched_to` moves (or the partition is no longer decided here)."""


@dataclass(frozen=True, slots=True)
class LastKnownJob:
    """A job of a partition this worker holds but decides no longer, since a journal write failed,
    as it stood then (its decisions up to the failed batch): the views keep listing it, saying why,
    until the partition is decided again or leaves this worker."""

    job_id: str
    state: JobState
    stats: CheckpointStats | None
    why: str


class _NoWatch:
    def watch(self, partition: int, start: int) -> None:
        pass

    def unwatch(self, partition: int) -> None:
        pass


class Worker:
    """Owns journal partitions for one coordinator worker (see the module doc)."""

    def __init__(
        self,
        worker_id: str,
        runtime: Coordinator,
        publish_lock: asyncio.Lock,
        writes: Writes,
        new_recovery: RecoveryFactory,
        executor: Executor,
        clock: Clock,
        watch: Watch | None = None,
        *,
        rules: Rules = step,
        on_jobs_changed: Callable[[], object] = lambda: None,
        metadata: MetadataObjects | None = None,
    ) -> None:
        """``on_jobs_changed`` hears that the jobs held here changed (a partition merged or dropped):
        their due times moved without a decision; ``metadata`` takes the outcomes' ``_metadata``
        objects (:class:`~coordinator.service.ports.StoredMetadata`: through the storage layer)."""
        self.worker_id = worker_id
        self.ownership: Ownership = initial_ownership(worker_id)
        self.runtime = runtime
        self.owners: dict[int, Owner] = {}
        """The partitions this worker decides now."""
        self.assignment_pending = True
        """No assignment told yet, or a rebalance revoked partitions and has not assigned yet."""
        self.stepped_down_total = 0
        """Times a newer claim made this worker stop deciding a partition (for metrics)."""
        self.publish_lock = publish_lock
        self._writes, self._new_recovery, self._executor, self._clock = writes, new_recovery, executor, clock
        self._watch: Watch = watch or _NoWatch()
        self._rules, self._on_jobs_changed = rules, on_jobs_changed
        self._metadata: MetadataObjects = metadata or StoredMetadata()
        self._recoveries: dict[int, Recovery] = {}
        self._recovery_started: dict[int, float] = {}
        self._undecided_since: dict[int, float] = {}
        """Held partitions not decided here -> since when."""
        self._undecided_logged: dict[int, float] = {}
        self._last_known: dict[int, tuple[tuple[JobState, CheckpointStats | None], ...]] = {}
        """Held partitions recovering again after a failed write -> their jobs as they stood."""

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
        if owner is not None and position > owner.watched_to:
            owner.watched_to = position
            owner.moved.set()

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
        made = self._rules(self.ownership, fact)
        self.ownership = made.state
        for command in made.commands:
            self._carry_out(command)
        self._note_undecided()

    def _note_undecided(self) -> None:
        holds, since = self.ownership.holds, self._undecided_since
        for partition in [p for p in since if holds.get(p) is None or holds[p].phase is Phase.DECIDING]:
            del since[partition]
            self._undecided_logged.pop(partition, None)
        now = None
        for partition, hold in holds.items():
            if hold.phase is not Phase.DECIDING and partition not in since:
                since[partition] = now = now if now is not None else self._clock.monotonic()
        for partition in [p for p in self._last_known if not self._recovering_again(p)]:
            del self._last_known[partition]

    def _recovering_again(self, partition: int) -> bool:
        """Held here, not decided and not fenced: recovering (again, where it was decided before)."""
        hold = self.ownership.holds.get(partition)
        return hold is not None and hold.phase is not Phase.STEPPED_DOWN and partition not in self.owners

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

    def last_known_jobs(self) -> list[LastKnownJob]:
        """The jobs of partitions held here and recovering again after a failed write, as they stood
        when their fold was dropped, each with why its partition is not decided (for the views)."""
        known: list[LastKnownJob] = []
        for partition, jobs in sorted(self._last_known.items()):
            if self._recovering_again(partition):
                hold = self.ownership.holds[partition]
                why = why_undecided(hold) or hold.phase.value
                known.extend(LastKnownJob(state.job_id, state, stats, why) for state, stats in jobs)
        return known

    def views(self) -> list[PartitionView]:
        views = []
        now = self._clock.monotonic()
        for partition, hold in sorted(self.ownership.holds.items()):
            owner = self.owners.get(partition)
            since = self._undecided_since.get(partition)
            views.append(
                PartitionView(
                    partition,
                    hold.claim_epoch,
                    owner is not None,
                    owner.journal_offset if owner else hold.claim_offset,
                    owner.recovery_seconds if owner else None,
                    hold.phase.value,
                    why_undecided(hold),
                    0.0 if since is None else now - since,
                )
            )
        return views

    def log_undecided(self) -> None:
        """Log each partition held here and not decided for :data:`UNDECIDED_WARN_S` or more, with
        why (its jobs get no checkpoints meanwhile), once a minute while it lasts."""
        now = self._clock.monotonic()
        for partition, since in sorted(self._undecided_since.items()):
            hold = self.ownership.holds.get(partition)
            last = self._undecided_logged.get(partition)
            if (
                hold is None
                or now - since < UNDECIDED_WARN_S
                or (last is not None and now - last < UNDECIDED_REPEAT_S)
            ):
                continue
            self._undecided_logged[partition] = now
            log.warning(
                "journal partition %d: assigned here %.0f s ago and not decided: %s; its jobs get no "
                "checkpoints until it is",
                partition,
                now - since,
                why_undecided(hold),
            )

    async def publish(self, outcomes: Sequence[Outcome]) -> set[int]:
        """Metadata objects first, then the journal; barriers and dead letters once the broker holds
        the journal records.

        Every write is awaited: input offsets are committed (acked) only after every journal
        write of the input is acknowledged. A partition whose metadata object could not be written
        writes nothing of the batch (its journal records would refer to a missing object): like a
        failed journal write, it recovers and its inputs come again. Returns the partitions whose
        writes failed."""
        journal_topic = self.runtime.topics.checkpoints
        failed = await self._write_metadata(outcomes) if any(o.metadata for o in outcomes) else set()
        journal = [m for o in outcomes for m in o.messages if m.topic == journal_topic]
        others = [m for o in outcomes for m in o.messages if m.topic != journal_topic]
        if failed:
            journal = [m for m in journal if self._home(m.key) not in failed]
        if journal:
            failed |= self._note(await self._writes.write(journal))
        if others:
            kept = [m for m in others if self._home(m.key) not in failed]
            failed |= self._note(await self._writes.write(kept))
        return failed

    async def _write_metadata(self, outcomes: Sequence[Outcome]) -> set[int]:
        """Write the outcomes' metadata objects (on the executor: storage blocks); the partitions
        of the jobs whose object could not be written."""
        failed: set[int] = set()
        for outcome in outcomes:
            for written in outcome.metadata:
                partition = self.runtime.partition_of(outcome.job_id) if outcome.job_id else -1
                if partition in failed:
                    continue
                try:
                    await self._executor.call(self._metadata.write, written.uri, written.frame)
                except Exception as exc:
                    log.error(
                        "metadata object %s of job %r could not be written (%s: %s); journal "
                        "partition %d recovers and its inputs come again",
                        written.uri,
                        outcome.job_id,
                        type(exc).__name__,
                        exc,
                        partition,
                    )
                    failed.add(partition)
        return failed

    async def write_snapshots(self) -> None:
        """Bounded recovery: a snapshot of each decided partition whose journal moved since its last."""
        for partition, owner in list(self.owners.items()):
            if owner.journal_offset > owner.snapshot_offset:
                await self._snapshot(partition, owner)

    async def close(self) -> None:
        await self._executor.close()
        for recovery in self._recoveries.values():
            await self._executor.call(recovery.close)

    # ------------------------------------------------------------ carrying out commands

    def _carry_out(self, command: OwnershipCommand) -> None:
        match command:
            case ReadSnapshot(partition=p, generation=g, delay_s=delay):
                # A recovery it replaces is in the middle of a step: it closes itself after it.
                recovery = self._recoveries[p] = self._new_recovery(p)
                self._recovery_started[p] = self._clock.monotonic()
                self._spawn(self._io(recovery, g, delay, recovery.read_snapshot, g))
            case FoldJournal(partition=p, generation=g):
                recovery = self._recoveries[p]
                self._spawn(self._io(recovery, g, 0.0, recovery.fold_journal, g))
            case WriteClaim(partition=p, generation=g, epoch=epoch):
                recovery = self._recoveries[p]
                guard = self._claim_guard(p, g, epoch)
                self._spawn(self._io(recovery, g, 0.0, recovery.write_claim, g, epoch, guard=guard))
            case ReadToClaim(partition=p, generation=g, offset=offset):
                recovery = self._recoveries[p]
                self._spawn(self._io(recovery, g, 0.0, recovery.read_to_claim, g, offset))
            case ResendBarriers(partition=p, generation=g, epoch=epoch):
                self._spawn(self._resend(p, g, epoch))
            case StartDeciding(partition=p, epoch=epoch, claim_offset=offset):
                self._start(p, epoch, offset)
            case StopDeciding(partition=p, reason=reason, fenced_by=claim):
                self._stop(p, reason, claim)

    def _claim_guard(self, partition: int, generation: int, epoch: int) -> Callable[[], Fact | None]:
        """Asked on the executor just before the claim is written: a claim queued behind others
        must not outlive its generation (None: still wanted, write it)."""

        def guard() -> Fact | None:
            hold = self.ownership.holds.get(partition)
            if hold is None or (hold.generation, hold.phase, hold.claim_epoch) != (
                generation,
                Phase.CLAIMING,
                epoch,
            ):
                return ClaimWriteFailed(partition, generation, epoch, "abandoned: its generation is gone")
            return None

        return guard

    async def _io(
        self,
        recovery: Recovery,
        generation: int,
        delay: float,
        work: Callable[..., Fact],
        *args: Any,
        guard: Callable[[], Fact | None] | None = None,
    ) -> None:
        """One recovery step on the executor; its fact told; the recovery closed if nothing follows."""
        partition = recovery.partition
        if delay:
            await asyncio.sleep(delay)
        try:
            fact = await self._executor.call(work, *args, guard=guard)
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
        async with self.publish_lock:
            hold = self.ownership.holds.get(partition)
            if hold is None or hold.generation != generation or hold.phase is not Phase.RESENDING:
                if self._recoveries.get(partition) is recovery:
                    del self._recoveries[partition]
                await self._close(recovery)
                return  # abandoned meanwhile
            self.runtime.merge(recovery.coordinator, partition)
            self._on_jobs_changed()
            resent = self.runtime.resume(self._clock.now_ms(), partition, epoch)
            failed = await self.publish([Outcome(messages=resent)])
        if partition in failed:
            self.tell(ResendFailed(partition, generation, "a barrier could not be written"))
        else:
            self.tell(BarriersResent(partition, generation))

    def _start(self, partition: int, epoch: int, claim_offset: int) -> None:
        recovery = self._recoveries.pop(partition)
        seconds = self._clock.monotonic() - self._recovery_started.pop(partition, self._clock.monotonic())
        owner = self.owners[partition] = Owner(epoch, claim_offset, seconds, watched_to=claim_offset + 1)
        self._watch.watch(partition, claim_offset + 1)
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
        owner = self.owners.pop(partition, None)
        if owner is not None:
            owner.moved.set()
        self._watch.unwatch(partition)
        if fenced_by is not None:
            self.stepped_down_total += 1
            log.warning("journal partition %d: stepped down, decides nothing of it: %s", partition, reason)
        else:
            log.info("journal partition %d: no longer decided here (%s)", partition, reason)
        self._spawn(self._drop(partition))

    async def _drop(self, partition: int) -> None:
        async with self.publish_lock:
            if partition not in self.owners:
                if self._recovering_again(partition):  # a write failed: the views keep its jobs
                    runtime = self.runtime
                    self._last_known[partition] = tuple(
                        (runtime.states[job_id], runtime.stats.get(job_id))
                        for job_id in runtime.jobs_of(partition)
                    )
                self.runtime.drop_partition(partition)
                self._on_jobs_changed()

    async def _snapshot(self, partition: int, owner: Owner) -> None:
        """Write a snapshot of ``partition``'s fold once the watcher has read past what it covers
        and the worker still decides it under the same claim (so the snapshot is a valid base)."""
        async with self.publish_lock:  # no decision half-published: the state is the journal's fold
            if self.owners.get(partition) is not owner:
                return
            now = self._clock.now_ms()
            snapshot = self.runtime.snapshot(partition, owner.epoch, owner.journal_offset, now)
        deadline = self._clock.monotonic() + SNAPSHOT_WAIT_S
        while owner.watched_to <= snapshot.journal_offset and self.owners.get(partition) is owner:
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return  # the watcher lags: the next round tries again
            owner.moved.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(owner.moved.wait(), remaining)
        if self.owners.get(partition) is owner and await self._writes.write_snapshot(snapshot):
            owner.snapshot_offset = max(owner.snapshot_offset, snapshot.journal_offset)

    def _note(self, written: Written) -> set[int]:
        """The partitions whose writes failed; the journal offsets of the others move on."""
        journal_topic = self.runtime.topics.checkpoints
        for (topic, partition), error in written.failed.items():
            log.error("write to %s[%d] failed: %s; the partition recovers", topic, partition, error)
        for (topic, partition), offset in written.last_offsets.items():
            if topic == journal_topic:
                self.written(partition, offset)
        return {partition for _, partition in written.failed if partition >= 0}  # -1: no job to recover

    def _home(self, key: bytes | None) -> int:
        """The partition of the job a record is keyed by (-1 for no key)."""
        return self.runtime.partition_of(key.decode("utf-8", "replace")) if key else -1

    async def _close(self, recovery: Recovery) -> None:
        await self._executor.call(recovery.close)

    def _spawn(self, work: Any) -> None:
        self._executor.spawn(work)


def why_undecided(hold: Hold) -> str | None:
    """Why a partition held here is not decided (None: it is), for people (``/ready``, the log)."""
    failed = "" if hold.problem is None else f"; the last try: {hold.problem}"
    match hold.phase:
        case Phase.DECIDING:
            return None
        case Phase.RECOVERING:
            return f"recovering: reading its snapshot and the journal after it{failed}"
        case Phase.CLAIMING:
            return (
                f"claiming it with epoch {hold.claim_epoch} and reading the journal up to that claim{failed}"
            )
        case Phase.RESENDING:
            return "claimed: sending the barriers of its pending checkpoints again"
        case Phase.STEPPED_DOWN:
            claim = hold.fenced_by
            if claim is None:
                return "stepped down"
            return (
                f"stepped down: worker {claim.worker_id} claimed it with epoch {claim.epoch} (generation "
                f"{claim.generation}); decided here again once the group assigns it anew"
            )
    return None
