"""A deterministic simulator of the N-worker coordinator: ownership, fencing and bounded recovery.

From one seed (``random.Random(seed)``: no wall clock, no threads, no I/O) it runs 2-4
coordinator workers over a simulated consumer group and a simulated log, and checks the
invariants (docs/design.md, "Ownership and fencing") after every step. Each worker has its own
:class:`~coordinator.ownership.Ownership`, driven only through :func:`coordinator.ownership.step`,
and, for the partitions it decides, per-job states of the real checkpoint decider
(:func:`coordinator.decider.decide` then :func:`~coordinator.decider.evolve`).

Everything is a discrete step the rng chooses:

- **Group**: eager rebalances with strictly increasing generations. A rebalance revokes every
  partition of every responsive member (``PartitionsRevoked``), waits for members that do not
  answer (paused or killed) until a session timeout expels them, then assigns all partitions
  among the members (``PartitionsAssigned``, each member's whole assignment). Members join, leave,
  are paused (a paused worker takes no steps; resumed after being expelled, it first runs its
  queued work on its stale beliefs, then learns it lost its partitions and rejoins) and killed.
- **Log**: per journal partition an append-only list of :class:`Record` (the ``cutline.epoch``
  header, the writer for checking only, a claim or a decider's event); a snapshots topic (per
  partition, appended :class:`SnapshotEntry`, compacted at random to its last entry); input
  topics (per partition: job RUNNING statuses, ticks, acks of barriers).
- **Worker I/O is asynchronous**: the commands ``step`` returns go to the worker's executor
  (:data:`THREADS` in flight at most, each completing at a random later step of the worker;
  ``WriteClaim`` is guarded just before it is produced, then lands at a later random step).
  Completing a command reads or appends the simulated log and feeds the result back through
  ``step``. ``StartDeciding`` and ``StopDeciding`` are carried out at once (they swap in-memory
  state: the recovered fold becomes the live state, or the live state is dropped).
- **Watcher**: every step a running worker reads the new journal records of the partitions it
  has a settled claim in (from its claim on) and feeds each valid claim as ``ClaimRead``.
- **Deciding**: a worker consumes the inputs of each partition it decides, in order, from the
  position the journal reflects (one past the last input whose events are in the effective
  journal: an input whose decision a fenced worker wrote is decided again, one whose decision
  counts never is), decides them and appends the events under its claim epoch.
- **Broker pauses**: for some steps no I/O completes.

**The snapshot rule** (the one the real shell follows): a worker writes a snapshot of its fold
covering journal offset ``c`` only once its watcher has read the journal past ``c`` without a
newer claim. Every entry of the snapshots topic is then a valid base, whichever is last:
recovery reads that one entry and the journal after it, never anything older.

Invariants, checked after every step (a failure raises :class:`SimulationFailed` with the seed,
the step and the last steps' trace):

1. At most one worker's decisions count per partition: every valid non-claim journal record
   after a valid claim was written by that claim's worker.
2. A running worker deciding a partition whose claim a newer valid claim fenced has stepped down
   (``StopDeciding`` with ``fenced_by``) by the end of its first step whose watcher could read
   that claim.
3. Effective checkpoint ids of each job are unique and strictly increasing.
4. No completed checkpoint is lost: whenever a snapshot becomes a partition's last entry, it plus
   the journal after it folds to the effective fold (every completed checkpoint there, the same
   states, the same epoch: what a recovery would find never goes back), and the live states of
   the worker whose claim is current equal the effective fold of the partition.
5. A recovery reads one snapshot of its partition and the journal after it, nothing more.
6. Liveness: once the chaos stops (every worker resumed, no more faults), within
   :data:`SETTLE_STEPS` steps every partition is decided by exactly one worker, the one the group
   assigned it to, under the current claim, and every RUNNING job completes a new checkpoint.

``Rules.LEGACY`` swaps :func:`coordinator.ownership.step` for the old coordinator's rules
(:mod:`coordinator.ownership_legacy`) and drops the shell's generation guard, to show their bug
again (:data:`LEGACY_REGRESSION_SEED`).

Run it::

    uv run python -m coordinator.simulate_ownership --seed 7 -v        # one seed, every step
    uv run python -m coordinator.simulate_ownership --seeds 10000 --start 0 --processes 2
    uv run python -m coordinator.simulate_ownership --seed 7 --rules legacy

A million seeds overnight: ``--seeds 1000000 --start N --processes $(nproc)`` (one process per
core). A seed is about 150 steps, 14 faults and 1,100 invariant checks; seeds are independent,
so the rate grows with the processes. Give each night a new ``--start`` to cover new seeds.
A failing seed prints itself and the command that replays it exactly; the run exits 1.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import itertools
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from random import Random

from coordinator import ownership as own
from coordinator.commands import AcknowledgeCheckpoint, Tick
from coordinator.commands import Command as JobCommand
from coordinator.decider import InputRejected, decide, evolve
from coordinator.ownership_legacy import legacy_step
from coordinator.state import JobState, initial_state
from coordinator.testing import config, running
from events.wire.fencing import Fence
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointCompleted,
    CheckpointTriggered,
    JobStatus,
    JournalEvent,
)

__all__ = [
    "LEGACY_REGRESSION_SEED",
    "ClaimBody",
    "Deciding",
    "Oracle",
    "Record",
    "RecoveryReads",
    "Result",
    "Rules",
    "SimulationFailed",
    "Summary",
    "SnapshotEntry",
    "Violation",
    "check_live_state",
    "check_liveness",
    "check_recovery",
    "check_snapshot",
    "check_step_down",
    "main",
    "run_seeds",
    "simulate",
]

STEP_MS = 50
"""Simulated time per step."""
THREADS = 6
"""A worker's executor: at most this many commands in flight."""
SESSION_TIMEOUT = 10
"""Steps a member may not answer before the group expels it."""
SETTLE_STEPS = 500
"""Liveness bound: steps after the chaos stops within which everything must be decided."""
MAX_WORKERS = 4
TRACE_LINES = 30

LEGACY_REGRESSION_SEED = 979
"""A seed where the old rules fence the assigned worker while it goes on deciding (invariant 2):
w4 joins (generation 6 gives it p0) while w2 still has a claim of p0 for generation 5 under way;
that claim fails, the old rules retry it higher for the lost generation, it lands after w4's claim
and w4, which never watches the journal, goes on deciding p0 with all its records void. Under the
current rules the same seed keeps every invariant (the guard drops the queued claim)."""


class Rules(StrEnum):
    """Which ownership rules the workers follow."""

    CURRENT = "current"
    """:func:`coordinator.ownership.step`, and the shell's generation guard on claims."""
    LEGACY = "legacy"
    """The old coordinator's (:mod:`coordinator.ownership_legacy`), and no guard."""


# ----------------------------------------------------------------------- the log


@dataclass(frozen=True, slots=True)
class ClaimBody:
    """A ``CoordinatorClaimed`` record's value (its generation as the new shell writes it)."""

    epoch: int
    worker_id: str
    generation: int


@dataclass(frozen=True, slots=True)
class Record:
    """One journal record: its epoch header, its writer (for checking only) and its value."""

    epoch: int
    writer: str
    body: ClaimBody | JournalEvent
    source: int = -1
    """The input offset whose decision this event is (-1: a claim)."""


@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    """One entry of the snapshots topic: the fold of a partition's journal up to ``journal_offset``."""

    epoch: int
    """The fence's epoch at ``journal_offset`` (the writer's claim epoch)."""
    journal_offset: int
    next_input: int
    claim: own.Claim | None
    states: Mapping[str, JobState]
    writer: str


class _Fold:
    """A partition's journal folded in offset order under the fencing rule."""

    __slots__ = ("claim", "fence", "highest", "next_input", "pos", "states")

    def __init__(self, base: SnapshotEntry | None = None) -> None:
        self.states: dict[str, JobState] = dict(base.states) if base else {}
        self.next_input = base.next_input if base else 0
        self.fence = Fence(base.epoch if base else 0)
        self.claim = base.claim if base else None
        self.pos = base.journal_offset + 1 if base else 0
        self.highest = self.fence.epoch

    def apply(self, offset: int, record: Record) -> bool:
        """Fold one record; is it valid?"""
        body = record.body
        if record.epoch > self.highest:
            self.highest = record.epoch
        self.pos = offset + 1
        if isinstance(body, ClaimBody):
            ok, self.fence = self.fence.claim(record.epoch)
            if ok:
                self.claim = own.Claim(record.epoch, body.worker_id, body.generation, offset)
            return ok
        ok, self.fence = self.fence.admit(record.epoch)
        if ok:
            job = body.job_id
            state = self.states.get(job)
            self.states[job] = evolve(state if state is not None else initial_state(job), body)
            if record.source >= self.next_input:
                self.next_input = record.source + 1
        return ok


# --------------------------------------------------------------------- invariants


class Violation(AssertionError):
    """An invariant does not hold."""

    def __init__(self, invariant: int, message: str) -> None:
        super().__init__(f"invariant {invariant} ({INVARIANTS[invariant]}): {message}")
        self.invariant = invariant
        self.message = message


INVARIANTS = {
    1: "one worker's decisions count per partition",
    2: "a fenced worker steps down",
    3: "checkpoint ids unique and increasing",
    4: "no completed checkpoint lost",
    5: "bounded recovery",
    6: "liveness",
}


class Oracle:
    """The effective fold of one journal partition, advanced record by record, checking
    invariants 1, 3 and the first half of 4 on the way (what every reader agrees on)."""

    __slots__ = ("claim_at", "completed", "fold", "partition", "triggered")

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.fold = _Fold()
        self.claim_at = -1
        """The tick at which the current valid claim landed."""
        self.triggered: dict[str, int] = {}
        self.completed: dict[str, int] = {}

    def advance(self, journal: Sequence[Record], tick: int = 0) -> list[CheckpointTriggered]:
        """Fold the new records; the valid triggers among them (tasks answer those)."""
        fold, p = self.fold, self.partition
        triggers: list[CheckpointTriggered] = []
        for offset in range(fold.pos, len(journal)):
            record = journal[offset]
            valid = fold.apply(offset, record)
            body = record.body
            if isinstance(body, ClaimBody):
                if valid:
                    self.claim_at = tick
                continue
            if not valid:
                continue
            owner = fold.claim.worker_id if fold.claim is not None else None
            if owner is not None and record.writer != owner:
                raise Violation(
                    1,
                    f"partition {p} offset {offset}: {type(body).__name__} of {record.writer} (epoch "
                    f"{record.epoch}) counts, but the current claim is {owner}'s (epoch {fold.fence.epoch})",
                )
            if isinstance(body, CheckpointTriggered):
                last = self.triggered.get(body.job_id, 0)
                if body.checkpoint_id <= last:
                    raise Violation(
                        3,
                        f"partition {p} offset {offset}: {body.job_id} triggered checkpoint "
                        f"{body.checkpoint_id} after {last} (by {record.writer})",
                    )
                self.triggered[body.job_id] = body.checkpoint_id
                triggers.append(body)
            elif isinstance(body, CheckpointCompleted):
                last = self.completed.get(body.job_id, 0)
                if body.checkpoint_id <= last:
                    raise Violation(
                        3,
                        f"partition {p} offset {offset}: {body.job_id} completed checkpoint "
                        f"{body.checkpoint_id} after {last}",
                    )
                self.completed[body.job_id] = body.checkpoint_id
        return triggers


@dataclass(frozen=True, slots=True)
class Deciding:
    """A running worker deciding a partition, as the invariant 2 check sees it."""

    worker_id: str
    partition: int
    epoch: int
    polled_at: int
    """The tick of its latest watcher poll (a step of its own with the broker up)."""


def check_step_down(deciding: Iterable[Deciding], current: Mapping[int, tuple[int, int]]) -> None:
    """Invariant 2: ``current`` maps partition -> (valid claim epoch, tick it landed)."""
    for d in deciding:
        epoch, landed = current[d.partition]
        if d.epoch < epoch and d.polled_at > landed:
            raise Violation(
                2,
                f"{d.worker_id} still decides partition {d.partition} under epoch {d.epoch}, fenced by "
                f"epoch {epoch} (landed at tick {landed}, its watcher could read it at tick {d.polled_at})",
            )


def check_live_state(
    worker_id: str, partition: int, live: Mapping[str, JobState], effective: Mapping[str, JobState]
) -> None:
    """Invariant 4: the current claimer's live states are the effective fold of its partition."""
    if live != effective:
        jobs = sorted(j for j in live.keys() | effective.keys() if live.get(j) != effective.get(j))
        detail = ", ".join(
            f"{j}: live completed {_completed(live.get(j))} / effective {_completed(effective.get(j))}"
            for j in jobs
        )
        raise Violation(4, f"{worker_id}'s live state of partition {partition} is not its fold ({detail})")


def check_snapshot(partition: int, entry: SnapshotEntry, journal: Sequence[Record], oracle: Oracle) -> None:
    """Invariant 4, for what a recovery would find: the snapshot ``entry`` plus the journal after it
    is the effective fold (``oracle``, advanced to the journal's end), so no completed checkpoint is
    lost by recovering from it (every entry must be a valid base: the snapshot rule)."""
    fold = _Fold(entry)
    for offset in range(fold.pos, len(journal)):
        fold.apply(offset, journal[offset])
    effective = oracle.fold
    lost = [
        f"{job} completed {done} but recovers with {_completed(fold.states.get(job))}"
        for job, done in sorted(oracle.completed.items())
        if (fold.states[job].last_completed_id if job in fold.states else 0) < done
    ]
    if lost or fold.states != effective.states or fold.fence.epoch != effective.fence.epoch:
        detail = "; ".join(lost) or (
            f"epoch {fold.fence.epoch} / {effective.fence.epoch}, jobs "
            + ", ".join(
                f"{j}: {_completed(fold.states.get(j))} / {_completed(effective.states.get(j))}"
                for j in sorted(fold.states.keys() | effective.states.keys())
                if fold.states.get(j) != effective.states.get(j)
            )
        )
        raise Violation(
            4,
            f"the last snapshot of partition {partition} (by {entry.writer}, epoch {entry.epoch}, to offset "
            f"{entry.journal_offset}) is not a valid base: {detail}",
        )


def _completed(state: JobState | None) -> str:
    return "-" if state is None else f"{state.last_completed_id} (next id {state.next_checkpoint_id})"


@dataclass(slots=True)
class RecoveryReads:
    """What one recovery read: snapshot entries, and the lowest journal offset."""

    partition: int
    base_offset: int = -1
    """The journal offset the snapshot it loaded covers (-1: none)."""
    snapshot_reads: int = 0
    lowest_offset: int | None = None
    records: int = 0


def check_recovery(worker_id: str, reads: RecoveryReads) -> None:
    """Invariant 5: one snapshot read, then only the journal after it."""
    if reads.snapshot_reads != 1:
        raise Violation(
            5, f"{worker_id} recovered partition {reads.partition} reading {reads.snapshot_reads} snapshots"
        )
    if reads.lowest_offset is not None and reads.lowest_offset <= reads.base_offset:
        raise Violation(
            5,
            f"{worker_id} recovered partition {reads.partition} reading the journal from offset "
            f"{reads.lowest_offset}, at or before its snapshot's {reads.base_offset}",
        )


def check_liveness(
    assigned: Mapping[int, str],
    deciders: Mapping[int, Sequence[tuple[str, int]]],
    epochs: Mapping[int, int],
    behind: Iterable[str],
) -> list[str]:
    """Invariant 6's conditions: what is not yet so ([] once everything is decided and fresh).

    ``assigned``: partition -> its member; ``deciders``: partition -> (worker, epoch) of every
    running worker deciding it; ``epochs``: partition -> current claim epoch; ``behind``: the
    RUNNING jobs without a new completed checkpoint."""
    problems: list[str] = []
    for p in sorted(epochs):
        owner = assigned.get(p)
        ds = list(deciders.get(p, ()))
        if owner is None:
            problems.append(f"partition {p} is assigned to nobody")
        elif ds != [(owner, epochs[p])]:
            problems.append(f"partition {p} is assigned to {owner} but decided by {ds or 'nobody'}")
    problems.extend(f"job {job} completed no new checkpoint" for job in sorted(behind))
    return problems


# --------------------------------------------------------------------- the world


@dataclass(frozen=True, slots=True)
class Result:
    """One seed's run."""

    seed: int
    rules: Rules
    steps: int
    faults: int
    checks: int
    digest: str
    """SHA-256 of the whole trace: the same seed gives the same one."""
    trace: tuple[str, ...] = ()
    """Every step, when asked for."""
    recoveries: int = 0
    max_tail: int = 0
    """The longest journal tail a recovery folded after its snapshot."""


class SimulationFailed(AssertionError):
    """A seed broke an invariant."""

    def __init__(
        self, seed: int, rules: Rules, step: int, violation: Violation, trace: Sequence[str]
    ) -> None:
        self.seed, self.rules, self.step, self.violation = seed, rules, step, violation
        self.trace = tuple(trace)
        flag = "" if rules is Rules.CURRENT else f" --rules {rules.value}"
        super().__init__(
            f"seed {seed} ({rules.value} rules), step {step}: {violation}\n"
            f"last {len(self.trace)} steps:\n" + "\n".join(self.trace) + "\n"
            f"replay: uv run python -m coordinator.simulate_ownership --seed {seed}{flag} -v"
        )


@dataclass(slots=True)
class _Live:
    """A partition this worker decides: the state its decisions are made on."""

    epoch: int
    states: dict[str, JobState]
    next_input: int
    fold_next_input: int
    covered: int
    claim: own.Claim | None
    candidate: SnapshotEntry | None = None
    version: int = 0


@dataclass(slots=True)
class _Recovery:
    generation: int
    fold: _Fold
    reads: RecoveryReads


@dataclass(slots=True)
class _Op:
    command: own.Command
    ready_at: int = 0


@dataclass(slots=True)
class _Worker:
    wid: str
    ownership: own.Ownership
    status: str = "running"  # running | paused | killed | left
    member: bool = True
    since: int = 0
    """The step it was paused or killed at."""
    rejoin_in: int | None = None
    queue: deque[_Op] = field(default_factory=deque)
    flying: list[_Op] = field(default_factory=list)
    inbox: list[own.Fact] = field(default_factory=list)
    recoveries: dict[tuple[int, int], _Recovery] = field(default_factory=dict)
    """(partition, generation) -> its recovery under way."""
    live: dict[int, _Live] = field(default_factory=dict)
    watch: dict[int, tuple[int, int, Fence]] = field(default_factory=dict)
    """partition -> (claim epoch watched for, next offset, fence)."""
    polled_at: int = -1
    checked: dict[int, tuple[int, int]] = field(default_factory=dict)


class _Sim:
    """One seed's world. Imperative (it is the shell and the broker); the rules it drives are pure."""

    def __init__(self, seed: int, rules: Rules, keep_trace: bool, verbose: bool) -> None:
        self.seed, self.rules, self.verbose, self.keep = seed, rules, verbose, keep_trace
        self.rng = rng = Random(seed)
        self.decide_ownership: Callable[[own.Ownership, own.Fact], own.Step] = (
            own.step if rules is Rules.CURRENT else legacy_step
        )
        self.step_no = 0
        self.tick = 0
        self.now = 1_800_000_000_000
        self.faults = 0
        self.checks = 0
        self.recoveries = 0
        self.max_tail = 0
        self.lines: deque[str] = deque(maxlen=TRACE_LINES)
        self.all_lines: list[str] = []
        self.digest = hashlib.sha256()
        self.pending_line: list[str] = []
        self.seq = itertools.count()
        # The log.
        self.partitions = rng.randint(2, 4)
        self.journal: list[list[Record]] = [[] for _ in range(self.partitions)]
        self.snapshots: list[list[SnapshotEntry]] = [[] for _ in range(self.partitions)]
        self.inputs: list[list[JobCommand]] = [[] for _ in range(self.partitions)]
        self.landings: list[tuple[int, int, Callable[[], None]]] = []
        self.acks: list[tuple[int, int, int, str, int, int, str]] = []
        self.broker_down_until = -1
        self.oracles = [Oracle(p) for p in range(self.partitions)]
        self.new_base: set[int] = set()
        """Partitions whose last snapshot entry changed since the last check."""
        # The jobs: RUNNING from the start, ticked by their timer, acking every valid barrier.
        self.jobs: dict[str, tuple[int, tuple[str, ...]]] = {}
        self.tick_every = rng.choice((4, 6, 8))
        for p in range(self.partitions):
            for i in range(rng.randint(1, 2)):
                job = f"job-{p}-{i}"
                tasks = tuple(f"t{n}" for n in range(rng.randint(1, 3)))
                self.jobs[job] = (p, tasks)
                cfg = config(interval_ms=rng.choice((200, 400)), timeout_ms=rng.choice((3000, 5000)))
                self.inputs[p].append(
                    running(job_id=job, tasks=tasks, cfg=cfg, at=self.now, jitter=rng.random())
                )
        # The group.
        self.workers: dict[str, _Worker] = {}
        self.next_worker = 0
        self.generation = 0
        self.rebalancing = True
        self.revoked: set[str] = set()
        self.assignment: dict[int, str] = {}
        for _ in range(rng.randint(2, MAX_WORKERS)):
            self._new_worker()
        self.chaos_steps = rng.randint(60, 160)

    # ------------------------------------------------------------------ tracing

    def note(self, text: str) -> None:
        self.pending_line.append(text)

    def _end_line(self) -> None:
        line = f"{self.step_no:4d} " + "; ".join(self.pending_line)
        self.pending_line.clear()
        self.lines.append(line)
        self.digest.update(line.encode())
        self.digest.update(b"\n")
        if self.keep:
            self.all_lines.append(line)
        if self.verbose:
            print(line)

    # ------------------------------------------------------------------ group

    def _new_worker(self) -> _Worker:
        wid = f"w{self.next_worker}"
        self.next_worker += 1
        worker = _Worker(wid, own.initial_ownership(wid))
        self.workers[wid] = worker
        self.rebalancing = True
        return worker

    def _group(self) -> None:
        """Expel members that do not answer; carry a rebalance on as far as it can go."""
        for w in self.workers.values():
            if w.member and w.status in ("paused", "killed") and self.step_no - w.since >= SESSION_TIMEOUT:
                w.member = False
                self.rebalancing = True
                self.note(f"group expels {w.wid} ({w.status})")
        if not self.rebalancing:
            return
        members = [w for w in self.workers.values() if w.member]
        for w in members:
            if w.status == "running" and w.wid not in self.revoked:
                self.revoked.add(w.wid)
                self._feed(w, own.PartitionsRevoked(frozenset(w.ownership.holds)))
        if any(w.status != "running" for w in members):
            return  # waiting for a member that does not answer
        self.generation += 1
        self.rebalancing = False
        self.revoked.clear()
        order = list(range(self.partitions))
        self.rng.shuffle(order)
        ids = sorted((w.wid for w in members), key=lambda i: int(i[1:]))
        self.assignment = {p: ids[i % len(ids)] for i, p in enumerate(order)} if ids else {}
        self.note(
            f"generation {self.generation}: "
            + ", ".join(f"p{p}->{w}" for p, w in sorted(self.assignment.items()))
        )
        for w in members:
            mine = frozenset(p for p, owner in self.assignment.items() if owner == w.wid)
            self._feed(w, own.PartitionsAssigned(self.generation, mine))

    # ------------------------------------------------------------------ a worker

    def _feed(self, w: _Worker, fact: own.Fact) -> None:
        made = self.decide_ownership(w.ownership, fact)
        w.ownership = made.state
        if made.commands or not isinstance(fact, own.ClaimRead):
            self.note(f"{w.wid} <- {_short(fact)} -> {', '.join(_short(c) for c in made.commands) or '-'}")
        for command in made.commands:
            if isinstance(command, own.StartDeciding):
                self._start_deciding(w, command)
            elif isinstance(command, own.StopDeciding):
                if w.live.pop(command.partition, None) is not None:
                    why = f" fenced by {command.fenced_by.worker_id}" if command.fenced_by else ""
                    self.note(f"{w.wid} stops deciding p{command.partition}{why}")
                w.watch.pop(command.partition, None)
            else:
                w.queue.append(_Op(command))

    def _start_deciding(self, w: _Worker, command: own.StartDeciding) -> None:
        p = command.partition
        hold = w.ownership.holds.get(p)
        recovery = w.recoveries.pop((p, hold.generation), None) if hold is not None else None
        for key in [k for k in w.recoveries if k[0] == p]:
            del w.recoveries[key]
        if recovery is None:
            return
        check_recovery(w.wid, recovery.reads)
        self.checks += 1
        self.recoveries += 1
        self.max_tail = max(self.max_tail, recovery.reads.records)
        fold = recovery.fold
        w.live[p] = _Live(
            command.epoch, fold.states, fold.next_input, fold.next_input, command.claim_offset, fold.claim
        )
        self.note(f"{w.wid} decides p{p} (epoch {command.epoch})")

    def _worker_step(self, w: _Worker) -> None:
        rng = self.rng
        if w.rejoin_in is not None:
            w.rejoin_in -= 1
            if w.rejoin_in <= 0:
                w.rejoin_in = None
                self.note(f"{w.wid} learns it was expelled, rejoins")
                self._feed(w, own.PartitionsRevoked(frozenset(w.ownership.holds)))
                w.member = True
                self.rebalancing = True
                self.revoked.add(w.wid)
        inbox, w.inbox = w.inbox, []
        for fact in inbox:
            self._feed(w, fact)
        if self.step_no < self.broker_down_until:
            return
        # Commands whose I/O is done, then new ones on the free threads.
        done = sorted((op for op in w.flying if op.ready_at <= self.step_no), key=lambda op: op.ready_at)
        for op in done:
            w.flying.remove(op)
            self._complete(w, op.command)
        while w.queue and len(w.flying) < THREADS:
            op = w.queue.popleft()
            delay = 0
            if isinstance(op.command, own.ReadSnapshot):
                delay = int(op.command.delay_s * 4)
            op.ready_at = self.step_no + delay + rng.randint(0, 4)
            w.flying.append(op)
        self._poll(w)
        for p, live in list(w.live.items()):
            if w.live.get(p) is live:
                self._decide(w, p, live)

    def _poll(self, w: _Worker) -> None:
        """The watcher: new records of partitions it has a settled claim in; valid claims go in."""
        self.tick += 1
        w.polled_at = self.tick
        for p, hold in list(w.ownership.holds.items()):
            if hold.phase not in (own.Phase.RESENDING, own.Phase.DECIDING) or hold.claim_offset < 0:
                continue
            watched = w.watch.get(p)
            if watched is None or watched[0] != hold.claim_epoch:
                watched = (hold.claim_epoch, hold.claim_offset + 1, Fence(hold.claim_epoch))
            epoch, pos, fence = watched
            journal = self.journal[p]
            claims: list[own.Claim] = []
            for offset in range(pos, len(journal)):
                record = journal[offset]
                if isinstance(record.body, ClaimBody):
                    ok, fence = fence.claim(record.epoch)
                    if ok:
                        body = record.body
                        claims.append(own.Claim(record.epoch, body.worker_id, body.generation, offset))
            w.watch[p] = (epoch, len(journal), fence)
            if self.rules is Rules.LEGACY:
                continue  # the old shell did not watch
            for claim in claims:
                self.note(
                    f"{w.wid} reads claim e{claim.epoch} of {claim.worker_id} g{claim.generation} in p{p}"
                )
                self._feed(w, own.ClaimRead(p, claim))

    def _decide(self, w: _Worker, p: int, live: _Live) -> None:
        rng = self.rng
        inputs, journal = self.inputs[p], self.journal[p]
        todo = min(len(inputs) - live.next_input, rng.randint(4, 16))
        for _ in range(todo):
            command = inputs[live.next_input]
            job = command.job_id
            state = live.states.get(job)
            if state is None:
                state = initial_state(job)
            wrote = False
            for decision in decide(state, command):
                if isinstance(decision, InputRejected):
                    continue
                state = evolve(state, decision)
                journal.append(Record(live.epoch, w.wid, decision, live.next_input))
                live.covered = len(journal) - 1
                wrote = True
            if wrote:
                live.states[job] = state
                live.fold_next_input = live.next_input + 1
                live.version += 1
            live.next_input += 1
        # Snapshots: a candidate once in a while, written once the watcher read past it.
        candidate = live.candidate
        if candidate is not None:
            watched = w.watch.get(p)
            # The rule: the watcher read past the offset it covers, and no newer claim there.
            if (
                watched is not None
                and watched[0] == live.epoch
                and watched[2].epoch == live.epoch
                and watched[1] > candidate.journal_offset
            ):
                live.candidate = None
                self._land(rng.randint(0, 3), lambda: self._snapshot_lands(p, candidate))
        elif rng.random() < 0.15:
            live.candidate = SnapshotEntry(
                live.epoch, live.covered, live.fold_next_input, live.claim, dict(live.states), w.wid
            )

    def _snapshot_lands(self, p: int, entry: SnapshotEntry) -> None:
        self.snapshots[p].append(entry)
        self.new_base.add(p)
        self.note(f"snapshot of p{p} to offset {entry.journal_offset} by {entry.writer} lands")

    def _land(self, delay: int, action: Callable[[], None]) -> None:
        heapq.heappush(self.landings, (self.step_no + delay, next(self.seq), action))

    # ------------------------------------------------------------------ I/O

    def _complete(self, w: _Worker, command: own.Command) -> None:
        rng = self.rng
        match command:
            case own.ReadSnapshot(partition=p, generation=g):
                if rng.random() < 0.02:
                    self._feed(w, own.RecoveryFailed(p, g, "snapshot read timed out"))
                    return
                entries = self.snapshots[p]
                base = entries[-1] if entries else None  # the last entry: one, never all
                reads = RecoveryReads(p, base.journal_offset if base else -1, snapshot_reads=1)
                w.recoveries[p, g] = _Recovery(g, _Fold(base), reads)
                epoch = base.epoch if base else 0
                self._feed(w, own.SnapshotRead(p, g, epoch, base.journal_offset if base else -1))
            case own.FoldJournal(partition=p, generation=g):
                recovery = w.recoveries.get((p, g))
                if recovery is None:
                    return
                end = len(self.journal[p]) - 1
                self._read(recovery, p, end)
                self._feed(w, own.JournalFolded(p, g, end, recovery.fold.highest))
            case own.WriteClaim(partition=p, generation=g, epoch=epoch):
                hold = w.ownership.holds.get(p)
                if self.rules is Rules.CURRENT and (hold is None or hold.generation != g):
                    self.note(f"{w.wid} drops its claim of p{p} g{g} (the guard)")
                    return
                self.note(f"{w.wid} produces claim e{epoch} g{g} of p{p}")
                roll = rng.random()
                if roll >= 0.97:  # the produce times out but the claim is on its way: it lands later
                    w.inbox.append(own.ClaimWriteFailed(p, g, epoch, "timed out"))
                    self.note(f"{w.wid}'s claim e{epoch} of p{p} times out (still in flight)")
                self._land(
                    rng.randint(1, 12 if roll >= 0.97 else 6), lambda: self._claim_lands(w, p, g, epoch, roll)
                )
            case own.ReadToClaim(partition=p, generation=g, offset=offset):
                recovery = w.recoveries.get((p, g))
                if recovery is None:
                    return
                self._read(recovery, p, offset)
                fold = recovery.fold
                assert fold.claim is not None  # its own claim is there, valid or not
                self._feed(w, own.ClaimSettled(p, g, fold.claim, fold.highest))
            case own.ResendBarriers(partition=p, generation=g):
                if rng.random() < 0.02:
                    self._feed(w, own.ResendFailed(p, g, "barriers topic unavailable"))
                    return
                recovery = w.recoveries.get((p, g))
                if recovery is not None:
                    for state in recovery.fold.states.values():
                        for cid, pending in state.pending.items():
                            self._tasks_ack(p, pending.triggered.job_id, cid, pending.triggered.attempt)
                self._feed(w, own.BarriersResent(p, g))
            case _:
                pass

    def _read(self, recovery: _Recovery, p: int, to: int) -> None:
        fold, reads, journal = recovery.fold, recovery.reads, self.journal[p]
        for offset in range(fold.pos, to + 1):
            if reads.lowest_offset is None:
                reads.lowest_offset = offset
            reads.records += 1
            fold.apply(offset, journal[offset])

    def _claim_lands(self, w: _Worker, p: int, g: int, epoch: int, roll: float) -> None:
        if roll < 0.03:
            w.inbox.append(own.ClaimWriteFailed(p, g, epoch, "not written"))
            self.note(f"claim e{epoch} of {w.wid} in p{p} fails")
            return
        journal = self.journal[p]
        journal.append(Record(epoch, w.wid, ClaimBody(epoch, w.wid, g)))
        self.note(f"claim e{epoch} g{g} of {w.wid} lands in p{p} at {len(journal) - 1}")
        if roll >= 0.97:
            return  # its writer was told it timed out already
        if roll < 0.06:
            w.inbox.append(own.ClaimWriteFailed(p, g, epoch, "timed out (it landed)"))
        else:
            w.inbox.append(own.ClaimWritten(p, g, epoch, len(journal) - 1))

    def _tasks_ack(self, p: int, job: str, checkpoint_id: int, attempt: int) -> None:
        _, tasks = self.jobs[job]
        for task in tasks:
            at = self.step_no + self.rng.randint(1, 6)
            heapq.heappush(self.acks, (at, next(self.seq), p, job, checkpoint_id, attempt, task))

    # ------------------------------------------------------------------ the world

    def _world(self) -> None:
        """Time passes: ticks, acks due, I/O landing, the group."""
        self.step_no += 1
        self.now += STEP_MS
        if self.step_no % self.tick_every == 0:
            for job, (p, _) in self.jobs.items():
                self.inputs[p].append(Tick(job, self.now))
        while self.acks and self.acks[0][0] <= self.step_no:
            _, _, p, job, cid, attempt, task = heapq.heappop(self.acks)
            ack = CheckpointAcknowledged(job, cid, attempt, task, self.now)
            self.inputs[p].append(AcknowledgeCheckpoint(ack, self.now))
        if self.step_no >= self.broker_down_until:
            while self.landings and self.landings[0][0] <= self.step_no:
                heapq.heappop(self.landings)[2]()
        self._group()

    def _chaos(self) -> None:
        """One fault or one worker step, as the rng chooses."""
        rng = self.rng
        alive = [w for w in self.workers.values() if w.status in ("running", "paused")]
        runnable = [w for w in alive if w.status == "running"]
        paused = [w for w in alive if w.status == "paused"]
        roll = rng.random()
        if roll < 0.03 and len(runnable) >= 2:
            w = rng.choice(runnable)
            w.status, w.since = "paused", self.step_no
            self.note(f"FAULT {w.wid} paused")
        elif roll < 0.06 and paused:
            self._resume(rng.choice(paused))
        elif roll < 0.07 and len(alive) >= 2 and runnable:
            w = rng.choice(alive)
            w.status, w.since = "killed", self.step_no
            self.note(f"FAULT {w.wid} killed")
        elif roll < 0.085 and len(alive) < MAX_WORKERS:
            w = self._new_worker()
            self.note(f"FAULT {w.wid} joins")
        elif roll < 0.095 and len(runnable) >= 2:
            w = rng.choice(runnable)
            if w.member:
                self._feed(w, own.PartitionsRevoked(frozenset(w.ownership.holds)))
                w.status, w.member = "left", False
                self.rebalancing = True
                self.note(f"FAULT {w.wid} leaves")
            else:
                return
        elif roll < 0.11:
            self.broker_down_until = self.step_no + rng.randint(2, 6)
            self.note(f"FAULT broker paused until step {self.broker_down_until}")
        elif roll < 0.125:
            for entries in self.snapshots:
                del entries[:-1]
            self.note("FAULT snapshots compacted")
        else:
            if runnable:
                w = rng.choice(runnable)
                self.note(f"{w.wid} steps")
                self._worker_step(w)
            return
        self.faults += 1

    def _resume(self, w: _Worker) -> None:
        w.status = "running"
        if not w.member:
            w.rejoin_in = self.rng.randint(1, 3)  # its queued work runs first, on stale beliefs
        self.note(f"{w.wid} resumed{'' if w.member else ' (expelled)'}")

    # ------------------------------------------------------------------ checks

    def _check(self) -> None:
        for oracle in self.oracles:
            for trigger in oracle.advance(self.journal[oracle.partition], self.tick):
                self._tasks_ack(oracle.partition, trigger.job_id, trigger.checkpoint_id, trigger.attempt)
        self.checks += 2 * self.partitions
        for p in sorted(self.new_base):
            check_snapshot(p, self.snapshots[p][-1], self.journal[p], self.oracles[p])
            self.checks += 1
        self.new_base.clear()
        current = {o.partition: (o.fold.fence.epoch, o.claim_at) for o in self.oracles}
        deciding = [
            Deciding(w.wid, p, live.epoch, w.polled_at)
            for w in self.workers.values()
            if w.status == "running"
            for p, live in w.live.items()
        ]
        check_step_down(deciding, current)
        self.checks += 1
        for w in self.workers.values():
            for p, live in w.live.items():
                oracle = self.oracles[p]
                if live.epoch != oracle.fold.fence.epoch:
                    continue
                key = (live.version, oracle.fold.pos)
                if w.checked.get(p) == key:
                    continue
                w.checked[p] = key
                check_live_state(w.wid, p, live.states, oracle.fold.states)
                self.checks += 1

    def _settled(self, baseline: Mapping[str, int]) -> list[str]:
        deciders: dict[int, list[tuple[str, int]]] = {}
        for w in self.workers.values():
            if w.status == "running":
                for p, live in w.live.items():
                    deciders.setdefault(p, []).append((w.wid, live.epoch))
        behind = []
        for job, (p, _) in self.jobs.items():
            state = self.oracles[p].fold.states.get(job)
            if state is None or (
                state.status is JobStatus.RUNNING and state.last_completed_id <= baseline.get(job, 0)
            ):
                behind.append(job)
        assigned = {} if self.rebalancing else self.assignment
        epochs = {o.partition: o.fold.fence.epoch for o in self.oracles}
        return check_liveness(assigned, deciders, epochs, behind)

    # ------------------------------------------------------------------ run

    def run(self) -> Result:
        try:
            for _ in range(self.chaos_steps):
                self._world()
                self._chaos()
                self._check()
                self._end_line()
            self.note("CHAOS ENDS")
            for w in self.workers.values():
                if w.status == "paused":
                    self._resume(w)
            self.broker_down_until = -1
            baseline = {j: (s.last_completed_id if s else 0) for j, s in self._job_states().items()}
            problems: list[str] = ["not settled"]
            for _ in range(SETTLE_STEPS):
                self._world()
                runnable = [w for w in self.workers.values() if w.status == "running"]
                w = self.rng.choice(runnable)
                self.note(f"{w.wid} steps")
                self._worker_step(w)
                self._check()
                self._end_line()
                problems = self._settled(baseline)
                self.checks += 1
                if not problems:
                    break
            if problems:
                raise Violation(6, f"{SETTLE_STEPS} steps after the chaos: " + "; ".join(problems))
        except Violation as violation:
            if self.pending_line:
                self._end_line()
            raise SimulationFailed(self.seed, self.rules, self.step_no, violation, self.lines) from None
        return Result(
            self.seed,
            self.rules,
            self.step_no,
            self.faults,
            self.checks,
            self.digest.hexdigest(),
            tuple(self.all_lines),
            self.recoveries,
            self.max_tail,
        )

    def _job_states(self) -> dict[str, JobState | None]:
        return {job: self.oracles[p].fold.states.get(job) for job, (p, _) in self.jobs.items()}


def _short(item: object) -> str:
    """A fact or command, briefly, for the trace."""
    name = type(item).__name__
    p = getattr(item, "partition", None)
    g = getattr(item, "generation", None)
    parts = [f"p{p}" if p is not None else "", f"g{g}" if g is not None else ""]
    match item:
        case own.PartitionsAssigned() | own.PartitionsRevoked():
            parts[0] = "{" + ",".join(str(p) for p in sorted(item.partitions)) + "}"
        case own.WriteClaim() | own.ClaimWritten() | own.StartDeciding() | own.ClaimWriteFailed():
            parts.append(f"e{item.epoch}")
        case own.ClaimSettled():
            parts.append(f"effective e{item.effective.epoch} of {item.effective.worker_id}")
        case own.StopDeciding() if item.fenced_by is not None:
            parts.append(f"fenced by e{item.fenced_by.epoch} of {item.fenced_by.worker_id}")
        case _:
            pass
    return f"{name}({' '.join(x for x in parts if x)})"


def simulate(
    seed: int, rules: Rules = Rules.CURRENT, *, keep_trace: bool = False, verbose: bool = False
) -> Result:
    """Run one seed; raise :class:`SimulationFailed` when an invariant breaks."""
    return _Sim(seed, rules, keep_trace, verbose).run()


# ----------------------------------------------------------------------- CLI


@dataclass(frozen=True, slots=True)
class Summary:
    """Many seeds' runs, added up."""

    seeds: int = 0
    steps: int = 0
    faults: int = 0
    checks: int = 0
    failures: tuple[str, ...] = ()
    """Each failed seed's report (its seed, step, violation, trace and replay command)."""

    def __add__(self, other: Summary) -> Summary:
        return Summary(
            self.seeds + other.seeds,
            self.steps + other.steps,
            self.faults + other.faults,
            self.checks + other.checks,
            self.failures + other.failures,
        )


def _run_batch(args: tuple[int, int, str]) -> Summary:
    start, count, rules = args
    total = Summary()
    for seed in range(start, start + count):
        try:
            result = simulate(seed, Rules(rules))
        except SimulationFailed as failed:
            total += Summary(1, failed.step, 0, 0, (str(failed),))
            continue
        total += Summary(1, result.steps, result.faults, result.checks)
    return total


def run_seeds(
    start: int,
    count: int,
    rules: Rules = Rules.CURRENT,
    *,
    processes: int = 1,
    on_batch: Callable[[Summary], None] | None = None,
) -> Summary:
    """Run seeds ``start`` .. ``start + count - 1`` in ``processes`` processes; ``on_batch`` hears
    of each batch as it ends (in seed order)."""
    size = max(1, min(200, count // (processes * 8) or 1))
    batches = [
        (first, min(size, start + count - first), rules.value) for first in range(start, start + count, size)
    ]
    total = Summary()
    if processes <= 1:
        results: Iterable[Summary] = map(_run_batch, batches)
        for batch in results:
            total += batch
            if on_batch is not None:
                on_batch(batch)
        return total
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=processes) as pool:
        for batch in pool.map(_run_batch, batches):
            total += batch
            if on_batch is not None:
                on_batch(batch)
    return total


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m coordinator.simulate_ownership``: one seed exactly, or many."""
    parser = argparse.ArgumentParser(
        prog="python -m coordinator.simulate_ownership", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seed", type=int, help="replay this one seed exactly")
    parser.add_argument("--seeds", type=int, default=1000, help="how many consecutive seeds to run")
    parser.add_argument("--start", type=int, default=0, help="the first of them")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--rules", choices=[r.value for r in Rules], default=Rules.CURRENT.value)
    parser.add_argument("-v", "--verbose", action="store_true", help="print every step")
    args = parser.parse_args(argv)
    rules = Rules(args.rules)
    if args.seed is not None:
        try:
            result = simulate(args.seed, rules, verbose=args.verbose)
        except SimulationFailed as failed:
            print(f"FAILED: {failed}", file=sys.stderr)
            return 1
        print(
            f"seed {result.seed} ({rules.value} rules): {result.steps} steps, {result.faults} faults, "
            f"{result.checks} invariant checks, {result.recoveries} recoveries (longest tail "
            f"{result.max_tail} records), trace {result.digest[:16]}"
        )
        return 0
    return _many(args.start, args.seeds, args.processes, rules)


def _many(start: int, count: int, processes: int, rules: Rules) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    began = time.perf_counter()  # the progress bar's clock only: the simulation never reads one
    done = Summary()
    columns = (
        TextColumn("[bold]seeds"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} seeds/s, {task.fields[faults]} faults, {task.fields[failed]} failed"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("seeds", total=count, rate="-", faults=0, failed=0)

        def on_batch(batch: Summary) -> None:
            nonlocal done
            done += batch
            for failure in batch.failures:
                progress.console.print(f"FAILED {failure}", markup=False, highlight=False, soft_wrap=True)
            rate = done.seeds / max(time.perf_counter() - began, 1e-9)
            progress.update(
                task, advance=batch.seeds, rate=f"{rate:.0f}", faults=done.faults, failed=len(done.failures)
            )

        total = run_seeds(start, count, rules, processes=processes, on_batch=on_batch)
    elapsed = time.perf_counter() - began
    print(
        f"{total.seeds} seeds ({start}..{start + count - 1}, {rules.value} rules, {processes} processes) in "
        f"{elapsed:.1f} s ({total.seeds / max(elapsed, 1e-9):.0f} seeds/s): {total.steps} steps, "
        f"{total.faults} faults injected, {total.checks} invariant checks, {len(total.failures)} failed"
    )
    for failure in total.failures:
        first = failure.split("\n", 1)[0]
        replay = failure.rsplit("replay: ", 1)[-1]
        print(f"FAILED {first}\n  replay: {replay}")
    return 1 if total.failures else 0


if __name__ == "__main__":
    sys.exit(main())
