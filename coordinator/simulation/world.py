"""One seed's world: simulated workers running the production shell over a simulated group and log.

Each worker (:class:`Node`) is the code that ships, built as :mod:`coordinator.service.app`
builds it: a :class:`~coordinator.service.worker.Worker`, an
:class:`~coordinator.service.inputs.InputLoop` and a :class:`~coordinator.service.inputs.Ticker`
around a :class:`~coordinator.service.runtime.Coordinator` (the real decider inside), on an
event loop of its own (:class:`~coordinator.simulation.loop.SimLoop`), with the ports of
:mod:`coordinator.simulation.broker`. The world around them, chosen by ``random.Random(seed)``:

- **the jobs**: RUNNING from the start; each task answers every barrier that lands with an ack
  that echoes the barrier's epoch, after a delay;
- **the group**: eager rebalances with increasing generations; a rebalance revokes every member's
  partitions, waits for members that do not answer (paused, killed) until the session timeout
  expels them, then assigns every partition; members join, leave, are paused and resumed (a
  resumed member that was expelled runs what it had queued on its stale beliefs, then rejoins),
  killed (the watchdog tells the group at once, or not);
- **the broker**: writes land after a delay, or fail (a flaky spell); pauses; the snapshots topic
  compacted; slow snapshot reads and long journals (recovery steps that take seconds, so that
  claims queue on a worker's threads);
- **scripted faults** for the black-box runs of issue 52: a worker joining while dozens of claims
  are queued on a long journal, rebalances back to back.

After every event the invariants of :mod:`coordinator.simulation.oracle` are checked; the first
that breaks raises :class:`SimulationFailed` with the seed, the time, the last lines of the trace
and the command that replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from random import Random
from typing import Any

from coordinator.core import ownership as own
from coordinator.core.snapshot import decode_snapshot
from coordinator.core.testing import config
from coordinator.service.inputs import InputLoop, Ticker
from coordinator.service.runtime import Coordinator
from coordinator.service.worker import Rules as OwnershipRules
from coordinator.service.worker import Worker
from coordinator.simulation.broker import (
    Entry,
    Group,
    Log,
    SimConsumer,
    SimRecovery,
    SimWatch,
    SimWrites,
)
from coordinator.simulation.files import SimFiles, SimMetadata
from coordinator.simulation.legacy_ownership import legacy_step
from coordinator.simulation.loop import BusyLoop, Job, Scheduler, SimClock, SimExecutor, SimLoop
from coordinator.simulation.oracle import (
    TP,
    Deciding,
    Oracle,
    Violation,
    Window,
    Written,
    check_inputs_decided,
    check_live_state,
    check_liveness,
    check_recovered,
    check_recovery,
    check_step_down,
    check_window,
)
from events.kafka.clients import job_key, partition_for
from events.wire.codec import default_codec
from events.wire.fencing import EPOCH_HEADER
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointBarrier,
    JobHeartbeat,
    JobStatus,
    JobStatusChanged,
)
from events.wire.topics import Topics

SESSION_TIMEOUT_S = 1.5
"""A member that does not answer for this long is expelled from the group."""
WINDOW_S = SESSION_TIMEOUT_S + 5.0
"""After a rebalance, every job of a decided partition completes a checkpoint within this."""
WINDOW_SLACK_S = 3.0
"""A partition first decided later than this before its window ends is not held to the window."""
THREADS = 6
"""A worker's executor threads (asyncio's default pool on two cores)."""
HEARTBEAT_S = 2.0
"""Each job's driver sends a heartbeat this often (so every job's partition has input all the time)."""
COMMIT_INTERVAL_S = 1.0
SNAPSHOT_INTERVAL_S = 3.0
TICK_INTERVAL_S = 0.01
FETCH_TIMEOUT_S = 1.0
MAX_BATCH = 50
SETTLE_S = 60.0
"""Once the faults stop, everything must be decided and caught up within this."""
CHECK_EVERY_S = 0.25
TRACE_LINES = 40
PREFIX = "sim."


HARMLESS = frozenset({"compact", "slow-snapshots", "unreadable", "unreadable-0"})
"""Faults after which every job of a partition decided by its owner still checkpoints in time
(a partition that cannot be recovered is not decided: it says why, and holds no other back)."""


class Rules(StrEnum):
    """Which ownership rules the workers follow."""

    CURRENT = "current"
    """:func:`coordinator.core.ownership.step`."""
    LEGACY = "legacy"
    """The old coordinator's (:mod:`coordinator.simulation.legacy_ownership`)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """What one seed's world looks like."""

    partitions: int
    workers: int
    jobs: int
    chaos_s: float
    fault_rate: float
    """Faults per simulated second while the chaos lasts."""
    slow_snapshots: bool = False
    long_journal: bool = False
    max_workers: int = 4
    script: tuple[tuple[float, str], ...] = ()
    """Faults at given times (``join``, ``leave``, ``pause-claiming``...), besides the random ones."""
    slow_watcher: bool = False
    """The journal watcher reads what landed only after 0.3-0.8 s (a busy broker)."""
    tasks: tuple[int, int] = (1, 3)
    """How many tasks a job has (at least, at most)."""


def random_scenario(rng: Random) -> Scenario:
    """Mostly a few partitions and workers under many faults; sometimes many partitions whose
    claims queue on slow reads."""
    if rng.random() < 0.1:
        partitions = rng.choice((8, 16))
        return Scenario(
            partitions,
            workers=rng.randint(1, 2),
            jobs=rng.randint(2, 4),
            chaos_s=rng.uniform(8, 16),
            fault_rate=rng.uniform(0.2, 0.5),
            slow_snapshots=rng.random() < 0.5,
            long_journal=rng.random() < 0.5,
            max_workers=3,
        )
    partitions = rng.randint(2, 4)
    return Scenario(
        partitions,
        workers=rng.randint(2, 4),
        jobs=rng.randint(max(1, partitions - 1), partitions + 1),
        chaos_s=rng.uniform(4, 10),
        fault_rate=rng.uniform(0.8, 2.0),
        slow_snapshots=rng.random() < 0.2,
        long_journal=rng.random() < 0.2,
    )


def unrecoverable_partition() -> Scenario:
    """One worker holds two partitions; one of them cannot be recovered for 12 s (its snapshot reads
    time out): the other's jobs checkpoint all along, and the first says why it is not decided."""
    return Scenario(2, workers=1, jobs=2, chaos_s=14.0, fault_rate=0.0, script=((0.0, "unreadable-0"),))


def late_claim() -> Scenario:
    """Issue 53's late claim: the owner of the one partition is paused in the middle of recovering
    it (after a rebalance), past the session timeout; the other worker claims it and decides;
    resumed, the first finishes its fold (it now reads the second's claim) and claims higher for
    the generation that is gone. Until the second worker's (slow) watcher reads that claim, its
    decisions are void; it claims again, and the inputs of that window must be decided again."""
    return Scenario(
        1,
        workers=2,
        jobs=2,
        chaos_s=12.0,
        fault_rate=0.0,
        script=((1.5, "flaky"), (1.5, "pause-next-recovery"), (7.0, "resume")),
        slow_watcher=True,
        tasks=(3, 3),
    )


def rebalance_storm(rebalances: int = 10, partitions: int = 64, jobs: int = 40) -> Scenario:
    """The black-box run of issue 52: one worker claims ``partitions`` on a long journal with slow
    reads; a second joins while its claims are queued; then one rebalance after another (the
    second leaves, a third joins, ...), each followed by a quiet window."""
    gap = WINDOW_S + 3.0
    script = [(1.0, "join"), (3.0, "slow-snapshots")]
    script += [(1.0 + gap * i, "leave-one" if i % 2 else "join") for i in range(1, rebalances)]
    return Scenario(
        partitions,
        workers=1,
        jobs=jobs,
        chaos_s=1.0 + gap * rebalances,
        fault_rate=0.0,
        slow_snapshots=True,
        long_journal=True,
        max_workers=3,
        script=tuple(script),
    )


# ---------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class Result:
    """One seed's run."""

    seed: int
    rules: Rules
    steps: int
    """World events handled."""
    faults: int
    checks: int
    digest: str
    """SHA-256 of the whole trace: the same seed gives the same one."""
    trace: tuple[str, ...] = ()
    recoveries: int = 0
    max_tail: int = 0
    """The longest journal tail a recovery folded after its snapshot."""
    simulated_s: float = 0.0
    rebalances: int = 0
    windows_checked: int = 0


class SimulationFailed(AssertionError):
    """A seed broke an invariant."""

    def __init__(
        self, seed: int, rules: Rules, step: int, at: float, violation: Violation, trace: Sequence[str]
    ) -> None:
        self.seed, self.rules, self.step, self.at, self.violation = seed, rules, step, at, violation
        self.trace = tuple(trace)
        flag = "" if rules is Rules.CURRENT else f" --rules {rules.value}"
        super().__init__(
            f"seed {seed} ({rules.value} rules), step {step} ({at:.3f} s): {violation}\n"
            f"last {len(self.trace)} lines:\n" + "\n".join(self.trace) + "\n"
            f"replay: uv run python -m coordinator.simulation.run --seed {seed}{flag} -v"
        )


# ---------------------------------------------------------------------- a worker


@dataclass(eq=False)
class Node:
    """One simulated coordinator worker: the production shell on its own loop."""

    wid: str
    loop: SimLoop
    executor: SimExecutor
    runtime: Coordinator
    worker: Worker
    inputs: InputLoop
    ticker: Ticker
    consumer: SimConsumer
    watch: SimWatch
    writes: SimWrites
    status: str = "running"  # running | paused | killed | left
    member: bool = True
    since: float = 0.0
    """When it was paused or killed."""
    pauses: int = 0
    deferred: list[Callable[[], None]] = field(default_factory=list)
    """Its threads' work that came due while it was paused."""
    owners: frozenset[int] = frozenset()
    recoveries: list[SimRecovery] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def alive(self) -> bool:
        return self.status in ("running", "paused")


class World:
    """One seed's world (see the module doc). Imperative: it is the broker, the group and the jobs;
    the workers in it run the production code."""

    def __init__(self, seed: int, rules: Rules, scenario: Scenario | None, keep: bool, verbose: bool) -> None:
        self.seed, self.rules, self.keep, self.verbose = seed, rules, keep, verbose
        self.rng = rng = Random(seed)
        self.scenario = scenario or random_scenario(rng)
        self.clock = SimClock()
        self.start = self.clock.now
        self.scheduler = Scheduler(self.clock)
        self.topics = Topics(PREFIX)
        self.log = Log(self.topics, self.scenario.partitions, self.clock)
        self.log.listeners.append(self._landed)
        self.group = Group()
        self.codec = default_codec()
        self.oracles = [Oracle(p) for p in range(self.scenario.partitions)]
        self.journal: list[list[Written]] = [[] for _ in range(self.scenario.partitions)]
        self.nodes: dict[str, Node] = {}
        self.next_id = 0
        self.generation = 0
        self.rebalancing = False
        self.answered: set[str] = set()
        self.assignment: dict[int, str] = {}
        self.windows: list[Window] = []
        self.decided: dict[TP, set[int]] = {}
        """Inputs acked by a worker whose claim was the partition's current one."""
        self.steps = self.faults = self.checks = self.recoveries = self.max_tail = 0
        self.rebalances = self.windows_checked = 0
        self.lines: deque[str] = deque(maxlen=TRACE_LINES)
        self.all_lines: list[str] = []
        self.digest = hashlib.sha256()
        self.chaos = True
        self.broker_down_until = 0.0
        self.flaky_until = 0.0
        self.pause_next_recovery = False
        self.unreadable: dict[int, float] = {}
        """Partition -> until when its recovery's reads fail (its claims fail and are tried again)."""
        self.slow_snapshots = self.scenario.slow_snapshots
        self.long_journal = self.scenario.long_journal
        self.jobs = self._jobs()
        for _ in range(self.scenario.workers):
            self._new_node()

    # ------------------------------------------------------------ tracing

    def note(self, text: str) -> None:
        line = f"{self.clock.now - self.start:9.3f} {text}"
        self.lines.append(line)
        self.digest.update(line.encode())
        self.digest.update(b"\n")
        if self.keep:
            self.all_lines.append(line)
        if self.verbose:
            print(line)

    # ------------------------------------------------------------ the jobs

    def _jobs(self) -> dict[str, tuple[int, tuple[str, ...]]]:
        """Job id -> (partition, tasks), each RUNNING from the start (on the job-status topic)."""
        rng, partitions = self.rng, self.scenario.partitions
        jobs: dict[str, tuple[int, tuple[str, ...]]] = {}
        for i in range(self.scenario.jobs):
            want = i % partitions if self.scenario.jobs <= partitions else rng.randrange(partitions)
            name = _job_name(i, want, partitions)
            tasks = tuple(f"t{n}" for n in range(rng.randint(*self.scenario.tasks)))
            jobs[name] = (want, tasks)
            cfg = config(
                interval_ms=rng.choice((500, 1000)),
                timeout_ms=rng.choice((2000, 4000)),
                tolerable_failures=1_000_000,
                heartbeat_interval_ms=int(HEARTBEAT_S * 1000),
                heartbeat_timeout_ms=600_000,
            )
            status = JobStatusChanged(
                job_id=name,
                status=JobStatus.RUNNING,
                timestamp_ms=self.clock.now_ms(),
                attempt=1,
                tasks=tasks,
                config=cfg,
            )
            self.log.append(
                self.topics.job_status,
                want,
                name.encode(),
                self.codec.encode(status, self.topics.job_status),
                (),
                "job",
            )
            self.scheduler.after(rng.uniform(0, HEARTBEAT_S), lambda name=name: self._heartbeat(name))  # type: ignore[misc]
        return jobs

    def _heartbeat(self, job: str) -> None:
        """The job's driver says it is alive, every :data:`HEARTBEAT_S`."""
        partition, _ = self.jobs[job]
        value = self.codec.encode(JobHeartbeat(job, 1, self.clock.now_ms()), self.topics.job_status)
        self.log.append(self.topics.job_status, partition, job.encode(), value, (), "job")
        self.scheduler.after(HEARTBEAT_S, lambda: self._heartbeat(job))

    def _answer(self, entry: Entry) -> None:
        """Each task of a barrier's job acks it after a while, echoing its epoch header."""
        message = entry.message
        barrier = self.codec.decode(message.value or b"")
        assert isinstance(barrier, CheckpointBarrier)
        job = self.jobs.get(barrier.job_id)
        if job is None:
            return
        partition, tasks = job
        epoch = message.headers.get(EPOCH_HEADER)
        headers = () if epoch is None else ((EPOCH_HEADER, epoch),)
        for task in tasks:
            delay = self.rng.uniform(0.005, 0.08)

            def ack(task: str = task) -> None:
                value = CheckpointAcknowledged(
                    barrier.job_id, barrier.checkpoint_id, barrier.attempt, task, self.clock.now_ms()
                )
                encoded = self.codec.encode(value, self.topics.acks)
                self.log.append(self.topics.acks, partition, barrier.job_id.encode(), encoded, headers, "job")

            self.scheduler.after(self._broker_delay(delay), ack)

    # ------------------------------------------------------------ a worker

    def _new_node(self) -> Node:
        wid = f"w{self.next_id}"
        self.next_id += 1
        loop = SimLoop(self.clock, wid)
        holder: list[Node] = []

        def schedule(delay: float, action: Callable[[], None]) -> None:
            self.scheduler.after(delay, lambda: self._on_node(holder[0], action))

        executor = SimExecutor(loop, THREADS, schedule, lambda job: self._started(holder[0], job))
        runtime = Coordinator(
            self.topics, rng=Random(self.rng.random()), partitions=self.scenario.partitions, files=SimFiles()
        )

        def home(key: bytes | None) -> int:
            return runtime.partition_of(key.decode()) if key else 0

        writes = SimWrites(self.log, wid, home, self.scheduler.after, self._landing, loop)

        def new_recovery(partition: int) -> SimRecovery:
            recovery = SimRecovery(self.log, wid, partition, self.clock, self._unreadable)
            holder[0].recoveries.append(recovery)
            return recovery

        worker_ref: list[Worker] = []
        ticker_ref: list[Ticker] = []

        def told(partition: int, claims: list[own.Claim], position: int) -> None:
            worker_ref[0].journal_read(partition, claims, position)

        watch = SimWatch(self.log, schedule, self._watch_latency, told, loop)
        worker = Worker(
            wid,
            runtime,
            asyncio.Lock(),
            writes,
            new_recovery,
            executor,
            self.clock,
            watch,
            rules=self._rules(wid),
            on_jobs_changed=lambda: ticker_ref[0].due_moved.set(),
            metadata=SimMetadata(),
        )
        worker_ref.append(worker)
        ticker = Ticker(worker, self.clock, self._send_tick, TICK_INTERVAL_S)
        ticker_ref.append(ticker)
        consumer = SimConsumer(
            self.log, self.group, [*self.topics.inputs, self.topics.ticks], loop, MAX_BATCH
        )
        inputs = InputLoop(
            worker,
            self.clock,
            self.topics,
            consumer=consumer,
            on_decided=ticker.due_moved.set,
            on_tick=ticker.decided,
        )
        node = Node(wid, loop, executor, runtime, worker, inputs, ticker, consumer, watch, writes)
        holder.append(node)
        self.nodes[wid] = node
        for work in (self._drain(node), ticker.run(lambda: False), self._timer(node)):
            loop.create_task(work)
        self.note(f"{wid} starts")
        self._start_rebalance(f"{wid} joins")
        return node

    def _rules(self, wid: str) -> OwnershipRules:
        rules: OwnershipRules = own.step if self.rules is Rules.CURRENT else legacy_step

        def traced(state: own.Ownership, fact: own.Fact) -> own.OwnershipStep:
            made = rules(state, fact)
            if made.commands or not isinstance(fact, own.ClaimRead):
                done = ", ".join(_short(c) for c in made.commands) or "-"
                self.note(f"{wid} <- {_short(fact)} -> {done}")
            return made

        return traced

    async def _drain(self, node: Node) -> None:
        """The consumer's fetch loop (``DirectConsumer._drain_messages``): each batch, or none
        when a fetch found nothing, to the input loop; the records it returns acked."""
        consumer = node.consumer
        while True:
            batch = await consumer.fetch(FETCH_TIMEOUT_S)
            if not batch and not consumer.flowing:
                continue
            self._acked(node, await node.inputs.decide_batch(batch))

    def _acked(self, node: Node, records: Sequence[Any]) -> None:
        node.consumer.ack(records)
        for record in records:
            if record.topic == self.topics.ticks:
                continue
            epoch = node.worker.epoch_of(record.partition)
            if epoch is not None and epoch == self.oracles[record.partition].epoch:
                self.decided.setdefault((record.topic, record.partition), set()).add(record.offset)

    async def _timer(self, node: Node) -> None:
        """Faust's timers: commits and fold snapshots."""
        elapsed = 0.0
        while True:
            await asyncio.sleep(COMMIT_INTERVAL_S)
            elapsed += COMMIT_INTERVAL_S
            node.consumer.commit(node.member and node.consumer.generation == self.generation)
            if elapsed >= SNAPSHOT_INTERVAL_S:
                elapsed = 0.0
                await node.worker.write_snapshots()

    async def _send_tick(self, job_id: str, now: int) -> None:
        partition = _partition_of(job_id, self.scenario.partitions)

        def land() -> None:
            self.log.append(self.topics.ticks, partition, job_id.encode(), str(now).encode(), (), "tick")

        self.scheduler.after(self._broker_delay(self.rng.uniform(0.001, 0.01)), land)

    def _on_node(self, node: Node, action: Callable[[], None]) -> None:
        """A worker's threads' work: it waits while the worker is paused, and dies with it."""
        if node.status == "paused":
            node.deferred.append(action)
        elif node.status != "killed":
            action()

    # ------------------------------------------------------------ the broker

    def _broker_delay(self, delay: float) -> float:
        down = self.broker_down_until - self.clock.now
        return delay + max(0.0, down)

    def _unreadable(self, partition: int) -> bool:
        return self.clock.now < self.unreadable.get(partition, 0.0)

    def _watch_latency(self) -> float:
        """How long the watcher takes to read what landed (now and then a slow fetch)."""
        rng = self.rng
        slow = self.scenario.slow_watcher or rng.random() < 0.1
        return self._broker_delay(rng.uniform(0.3, 0.8) if slow else rng.uniform(0.005, 0.06))

    def _landing(self, topic: str, partition: int) -> tuple[float, str | None]:
        delay = self._broker_delay(self.rng.uniform(0.001, 0.012))
        if self.clock.now < self.flaky_until and self.rng.random() < 0.25:
            return delay, self.rng.choice(("lost", "unanswered"))
        return delay, None

    def _started(self, node: Node, job: Job) -> float:
        """A job starts on one of ``node``'s threads: how long it takes (and the trap of
        ``pause-next-recovery``: the worker is paused as its next recovery starts)."""
        if self.pause_next_recovery and job.kind == "read_snapshot" and node.running:
            self.pause_next_recovery = False
            self.scheduler.after(0.0, lambda: self._pause(node) if node.running else None)
        return self._cost(job)

    def _cost(self, job: Job) -> float:
        rng = self.rng
        cost = rng.uniform(0.001, 0.015)
        match job.kind:
            case "read_snapshot" if self.slow_snapshots:
                cost += rng.uniform(0.5, 1.0)
            case "fold_journal":
                recovery = getattr(job.work, "__self__", None)
                if isinstance(recovery, SimRecovery):
                    start = recovery.next_offset or 0
                    cost += 0.00002 * (self.log.end(self.topics.checkpoints, recovery.partition) - start)
                if self.long_journal:
                    cost += rng.uniform(0.05, 0.3)
            case "close":
                cost = 0.0005
        return self._broker_delay(cost)

    def _landed(self, entry: Entry) -> None:
        message = entry.message
        topic, partition = message.topic, message.partition
        if topic == self.topics.checkpoints:
            self.journal[partition].append(Written(message, entry.writer))
            self.oracles[partition].advance(self.journal[partition], self.clock.now)
            for node in self.nodes.values():
                node.watch.poll_soon(partition)
        elif topic == self.topics.barriers:
            self._answer(entry)
        elif topic == self.topics.snapshots:
            self._check_snapshot(entry)
        elif topic in self.topics.inputs or topic == self.topics.ticks:
            for node in self.nodes.values():
                node.consumer.landed((topic, partition))

    def _check_snapshot(self, entry: Entry) -> None:
        """Invariant 4: what the production recovery finds from this snapshot now."""
        # The recovery reads this snapshot (the partition's last message) and says what it covers:
        # decoded once, not twice. Should it not load it, the snapshot is decoded here, as it was.
        partition = entry.message.partition
        recovery = SimRecovery(self.log, "checker", partition, self.clock)
        recovery.read_snapshot(0)
        covered = recovery.snapshot_offset
        if covered is None:
            snapshot = decode_snapshot(entry.message.value or b"")
            partition, covered = snapshot.partition, snapshot.journal_offset
            recovery = SimRecovery(self.log, "checker", partition, self.clock)
            recovery.read_snapshot(0)
        recovery.fold_journal(0)
        oracle = self.oracles[partition]
        recovered = {j: s for j, s in recovery.coordinator.states.items()}
        check_recovered(partition, entry.writer, covered, recovered, oracle)
        self.checks += 1

    # ------------------------------------------------------------ the group

    def _members(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.member]

    def _start_rebalance(self, reason: str) -> None:
        self.note(f"rebalance: {reason}")
        self._disturb()
        self.rebalancing = True
        self.rebalances += 1
        self.answered = set()
        for node in self._members():
            node.loop.call_soon(self._revoke, node)
        self._maybe_assign()

    def _revoke(self, node: Node) -> None:
        """Faust's revocation, on the worker's loop: every partition it was assigned."""
        held = {p for _, p in node.consumer.assigned} | set(node.worker.ownership.holds)
        node.consumer.revoke()
        node.worker.revoked(held)
        if node.member:
            self.answered.add(node.wid)
            self._maybe_assign()

    def _maybe_assign(self) -> None:
        if not self.rebalancing:
            return
        members = self._members()
        if any(n.wid not in self.answered for n in members):
            return  # waiting for a member that does not answer
        self.generation += 1
        self.rebalancing = False
        order = list(range(self.scenario.partitions))
        self.rng.shuffle(order)
        ids = sorted((n.wid for n in members), key=lambda i: int(i[1:]))
        self.assignment = {p: ids[i % len(ids)] for i, p in enumerate(order)} if ids else {}
        counts = {w: sum(1 for o in self.assignment.values() if o == w) for w in ids}
        self.note(
            f"generation {self.generation}: " + ", ".join(f"{w} {c} partitions" for w, c in counts.items())
        )
        generation = self.generation
        for node in members:
            mine = frozenset(p for p, owner in self.assignment.items() if owner == node.wid)
            node.loop.call_soon(self._assign, node, generation, mine)
        window = Window(generation, self.clock.now, WINDOW_S)
        self.windows.append(window)
        self.scheduler.after(WINDOW_S, lambda: self._close_window(window))

    def _assign(self, node: Node, generation: int, partitions: frozenset[int]) -> None:
        if not node.member or generation != self.generation:
            return  # expelled meanwhile, or a newer rebalance began: it rejoins
        node.consumer.assign(generation, partitions)
        node.worker.assigned(generation, partitions)

    def _disturb(self) -> None:
        now = self.clock.now
        for window in self.windows:
            if window.start <= now <= window.start + window.length:
                window.clean = False

    def _close_window(self, window: Window) -> None:
        self.windows.remove(window)
        if not window.clean:
            return
        # Every job reported RUNNING from the start: one the journal does not know yet is behind too.
        running = [
            job for job, (p, _) in self.jobs.items()
            if (state := self.oracles[p].states.get(job)) is None or state.status is JobStatus.RUNNING
        ]  # fmt: skip
        completions = {job: self.oracles[p].completions.get(job, []) for job, (p, _) in self.jobs.items()}
        partitions = {job: p for job, (p, _) in self.jobs.items()}
        check_window(window, partitions, running, completions, WINDOW_SLACK_S)
        self.windows_checked += 1
        self.checks += 1

    def _expel_later(self, node: Node, pauses: int) -> None:
        def expel() -> None:
            if node.member and node.pauses == pauses and node.status in ("paused", "killed"):
                node.member = False
                self.note(f"group expels {node.wid} ({node.status})")
                if self.rebalancing:
                    self._maybe_assign()
                else:
                    self._start_rebalance(f"{node.wid} expelled")

        self.scheduler.after(SESSION_TIMEOUT_S, expel)

    # ------------------------------------------------------------ faults

    def _fault(self) -> None:
        """One fault the rng chooses, then the next one's time."""
        if not self.chaos:
            return
        self._random_fault()
        rng = self.rng
        if rng.random() < 0.3:  # a quiet spell, in which a rebalance's window can hold
            gap = rng.uniform(WINDOW_S, 2 * WINDOW_S)
        else:
            gap = rng.expovariate(self.scenario.fault_rate)
        self.scheduler.after(gap, self._fault)

    def _random_fault(self) -> None:
        rng = self.rng
        alive = [n for n in self.nodes.values() if n.alive]
        running = [n for n in alive if n.running]
        paused = [n for n in alive if n.status == "paused"]
        kinds = ["broker-pause", "compact", "flaky", "slow-snapshots", "unreadable"]
        if len(running) >= 2:
            kinds += ["pause", "pause", "pause-claiming", "leave", "kill"]
        if paused:
            kinds += ["resume", "resume", "resume"]
        if len(alive) < self.scenario.max_workers:
            kinds += ["join", "join-then-leave"]
        self._do(rng.choice(kinds))

    def _do(self, kind: str) -> None:
        """One fault by name (the rng's, or a scenario's script)."""
        self.faults += 1
        if kind not in HARMLESS:
            self._disturb()
        if not (self._group_fault(kind) or self._broker_fault(kind)):
            self.faults -= 1  # not possible now (a pause with one worker running, say)

    def _group_fault(self, kind: str) -> bool:
        rng = self.rng
        alive = [n for n in self.nodes.values() if n.alive]
        running = [n for n in alive if n.running]
        paused = [n for n in alive if n.status == "paused"]
        match kind:
            case "join":
                self._new_node()
            case "join-then-leave":
                self._new_node()
                self.scheduler.after(rng.uniform(0.05, 1.0), lambda: self._do("leave-one"))
            case "leave" | "leave-one" if len(running) >= 2:
                self._leave(rng.choice(running))
            case "pause" if len(running) >= 2:
                self._pause(rng.choice(running))
            case "pause-claiming" | "pause-recovering" if len(running) >= 2:
                steps = ("write_claim",) if kind == "pause-claiming" else ("read_snapshot", "fold_journal")
                busy = [n for n in running if any(j.kind in steps for j in n.executor.threads.started)]
                self._pause(rng.choice(busy or running))
            case "pause-next-recovery":
                self.pause_next_recovery = True
            case "resume" if paused:
                self._resume(rng.choice(paused))
            case "kill" if len(running) >= 2:
                self._kill(rng.choice(running))
            case _:
                return False
        return True

    def _broker_fault(self, kind: str) -> bool:
        rng, now = self.rng, self.clock.now
        match kind:
            case "broker-pause":
                self.broker_down_until = now + rng.uniform(0.1, 1.5)
                self.note(f"FAULT broker paused until {self.broker_down_until - self.start:.3f}")
            case "compact":
                self.log.compact_snapshots()
                self.note("FAULT snapshots compacted")
            case "flaky":
                self.flaky_until = now + rng.uniform(0.2, 2.0)
                self.note(f"FAULT writes fail now and then until {self.flaky_until - self.start:.3f}")
            case "slow-snapshots":
                self.slow_snapshots = not self.slow_snapshots
                self.note(f"FAULT snapshot reads {'slow' if self.slow_snapshots else 'quick again'}")
            case "unreadable" | "unreadable-0":
                partition = 0 if kind == "unreadable-0" else rng.randrange(self.scenario.partitions)
                self.unreadable[partition] = now + (
                    12.0 if kind == "unreadable-0" else rng.uniform(3.0, 12.0)
                )
                self.note(
                    f"FAULT partition {partition} cannot be recovered until {self.unreadable[partition]:.3f}"
                )
            case _:
                return False
        return True

    def _leave(self, node: Node) -> None:
        self.note(f"FAULT {node.wid} leaves")

        def leave() -> None:
            node.member, node.status = False, "left"
            self._revoke(node)
            self._start_rebalance(f"{node.wid} left")

        node.loop.call_soon(leave)

    def _pause(self, node: Node) -> None:
        node.status, node.since = "paused", self.clock.now
        node.pauses += 1
        started = [j.kind for j in node.executor.threads.started]
        self.note(f"FAULT {node.wid} paused{' (' + ', '.join(started) + ' under way)' if started else ''}")
        self._expel_later(node, node.pauses)

    def _resume(self, node: Node) -> None:
        node.status = "running"
        self.note(f"FAULT {node.wid} resumed{'' if node.member else ' (expelled: it rejoins)'}")
        deferred, node.deferred = node.deferred, []
        for action in deferred:
            action()
        if not node.member:
            self.scheduler.after(self.rng.uniform(0.05, 0.3), lambda: self._rejoin(node))

    def _rejoin(self, node: Node) -> None:
        if node.running and not node.member:
            node.loop.call_soon(self._revoke, node)
            node.member = True
            self._start_rebalance(f"{node.wid} rejoins")

    def _kill(self, node: Node) -> None:
        node.status, node.since = "killed", self.clock.now
        node.pauses += 1
        if self.rng.random() < 0.5:  # its watchdog tells the group at once
            node.member = False
            self.note(f"FAULT {node.wid} killed (the watchdog tells the group)")
            self._start_rebalance(f"{node.wid} killed")
        else:
            self.note(f"FAULT {node.wid} killed")
            self._expel_later(node, node.pauses)

    # ------------------------------------------------------------ running

    def _run_loops(self) -> None:
        """Run every running worker's loop until none has anything to do at this instant."""
        nodes = [n for n in self.nodes.values() if n.status == "running"]
        while True:
            runnable = [n for n in nodes if n.loop.runnable()]
            if not runnable:
                return
            if len(runnable) > 1:
                self.rng.shuffle(runnable)
            for node in runnable:
                node.loop.run_once()
                self._after_run(node)

    def _after_run(self, node: Node) -> None:
        if node.loop.errors:
            raise Violation(6, f"{node.wid}'s shell raised: {node.loop.errors[0]}")
        if node.worker.owners.keys() == node.owners:  # (runs after every iteration: no copy made)
            return
        owners = frozenset(node.worker.owners)
        for p in owners - node.owners:
            self.note(f"{node.wid} decides p{p} (epoch {node.worker.owners[p].epoch})")
            self._check_recoveries(node, p)
            hold = node.worker.ownership.holds.get(p)
            for window in self.windows:
                if (
                    hold is not None
                    and hold.generation == window.generation
                    and self.assignment.get(p) == node.wid
                ):
                    window.deciding_since.setdefault(p, self.clock.now)
        for p in node.owners - owners:  # it stopped (a failed write, a claim): held from its next start
            for window in self.windows:
                if self.assignment.get(p) == node.wid:
                    window.deciding_since.pop(p, None)
        node.owners = owners

    def _check_recoveries(self, node: Node, partition: int) -> None:
        done = [r for r in node.recoveries if r.partition == partition]
        for recovery in done:
            check_recovery(node.wid, recovery.reads)
            self.max_tail = max(self.max_tail, recovery.reads.records)
            self.checks += 1
        self.recoveries += 1
        node.recoveries = [r for r in node.recoveries if r.partition != partition]

    def _next_time(self) -> float | None:
        first = self.scheduler.next_time()
        for node in self.nodes.values():
            if node.status == "running":
                t = node.loop.next_timer()
                if t is not None and (first is None or t < first):
                    first = t
        return first

    def run_until(self, end: float, done: Callable[[], bool] = lambda: False) -> bool:
        """Run the world until ``end`` (simulated seconds since the epoch), or until ``done`` (asked
        every :data:`CHECK_EVERY_S`)."""
        asked = -1.0
        while True:
            self._run_loops()
            if self.clock.now - asked >= CHECK_EVERY_S:
                asked = self.clock.now
                if done():
                    return True
            when = self._next_time()
            if when is None or when > end:
                self.clock.now = max(self.clock.now, end)
                return False
            self.clock.now = max(self.clock.now, when)
            while (action := self.scheduler.pop_due()) is not None:
                self.steps += 1
                action()
                self._run_loops()

    def _checks(self) -> None:
        """Invariants 2 and 4 (what workers believe against the effective journal), periodically."""
        current = {o.partition: (o.epoch, o.claim_landed) for o in self.oracles}
        deciding = [
            Deciding(n.wid, p, owner.epoch, n.watch.polled_at.get(p, -1.0))
            for n in self.nodes.values() if n.running
            for p, owner in n.worker.owners.items()
        ]  # fmt: skip
        check_step_down(deciding, current)
        for node in self.nodes.values():
            if not node.running or node.writes.in_flight or node.worker.publish_lock.locked():
                continue
            for p, owner in node.worker.owners.items():
                oracle = self.oracles[p]
                if owner.epoch == oracle.epoch:
                    live = {j: node.runtime.states[j] for j in node.runtime.jobs_of(p)}
                    check_live_state(node.wid, p, live, oracle.states)
        self.checks += 2
        self.scheduler.after(CHECK_EVERY_S, self._checks)

    def begin(self) -> None:
        """Schedule the checks and the faults (once)."""
        if self._begun:
            return
        self._begun = True
        scenario = self.scenario
        self.scheduler.after(CHECK_EVERY_S, self._checks)
        if scenario.fault_rate > 0:
            self.scheduler.after(self.rng.expovariate(scenario.fault_rate), self._fault)
        for at, kind in scenario.script:
            self.scheduler.at(self.start + at, lambda kind=kind: self._do(kind))  # type: ignore[misc]

    _begun = False

    def run(self) -> Result:
        """The whole seed: the chaos, then the settling (see :meth:`_settle`)."""
        try:
            with _quiet(self.verbose):
                self.begin()
                self.run_until(self.start + self.scenario.chaos_s)
                self._settle()
        except (Violation, BusyLoop) as failure:
            violation = failure if isinstance(failure, Violation) else Violation(6, str(failure))
            raise SimulationFailed(
                self.seed, self.rules, self.steps, self.clock.now - self.start, violation, tuple(self.lines)
            ) from None
        finally:
            self._tear_down()
        return Result(
            self.seed,
            self.rules,
            self.steps,
            self.faults,
            self.checks,
            self.digest.hexdigest(),
            tuple(self.all_lines),
            self.recoveries,
            self.max_tail,
            self.clock.now - self.start,
            self.rebalances,
            self.windows_checked,
        )

    def _tear_down(self) -> None:
        """Cancel every worker's tasks (a killed worker's too) and close their loops."""
        for node in self.nodes.values():
            loop = node.loop
            for task in asyncio.all_tasks(loop):
                task.cancel()
            with contextlib.suppress(Exception):
                for _ in range(100):
                    if not loop.runnable():
                        break
                    loop.run_once()
            loop.close()

    def _settle(self) -> None:
        """The faults stop; within :data:`SETTLE_S` every partition is decided by its worker, every
        job checkpoints again, and every input is decided and committed (invariants 6 and 8)."""
        self.chaos = False
        self.note("CHAOS ENDS")
        self.broker_down_until = self.flaky_until = 0.0
        for node in self.nodes.values():
            if node.status == "paused":
                self._resume(node)
        baseline = {job: self.oracles[p].completed.get(job, 0) for job, (p, _) in self.jobs.items()}
        ends = {
            (topic, p): self.log.end(topic, p)
            for topic in self.topics.inputs
            for p in range(self.scenario.partitions)
        }
        problems: list[str] = []

        def settled() -> bool:
            nonlocal problems
            problems = self._problems(baseline, ends)
            return not problems

        if not self.run_until(self.clock.now + SETTLE_S, settled):
            raise Violation(6, f"{SETTLE_S:.0f} s after the faults stopped: " + "; ".join(problems[:6]))
        if self.windows:  # the last rebalance's window too
            self.run_until(max(w.start + w.length for w in self.windows) + 0.001)
        committed = {tp: self.group.committed.get(tp, 0) for tp in ends}
        valid: dict[TP, set[int]] = {}
        for oracle in self.oracles:
            for tp, offsets in oracle.valid_inputs.items():
                valid.setdefault(tp, set()).update(offsets)
        check_inputs_decided(committed, self.decided, valid)
        self.checks += 1

    def _problems(self, baseline: dict[str, int], ends: dict[TP, int]) -> list[str]:
        deciders: dict[int, list[tuple[str, int]]] = {}
        for node in self.nodes.values():
            if node.running:
                for p, owner in node.worker.owners.items():
                    deciders.setdefault(p, []).append((node.wid, owner.epoch))
        behind = []
        for job, (p, _) in self.jobs.items():
            state = self.oracles[p].states.get(job)
            if state is None or (
                state.status is JobStatus.RUNNING and state.last_completed_id <= baseline[job]
            ):
                behind.append(job)
        assigned = {} if self.rebalancing else self.assignment
        epochs = {o.partition: o.epoch for o in self.oracles}
        problems = check_liveness(assigned, deciders, epochs, behind)
        problems += [
            f"input {tp[0]}[{tp[1]}] committed to {self.group.committed.get(tp, 0)} of {end}"
            for tp, end in sorted(ends.items())
            if self.group.committed.get(tp, 0) < end
        ]
        return problems


@functools.lru_cache(maxsize=4096)
def _job_name(i: int, partition: int, partitions: int) -> str:
    """The ``i``-th job's id, chosen so that its key hashes to ``partition``."""
    names = (f"job-{i}-{k}" for k in range(10_000))
    return next(name for name in names if partition_for(job_key(name), partitions) == partition)


@functools.lru_cache(maxsize=4096)
def _partition_of(job_id: str, partitions: int) -> int:
    """The partition of ``job_id``'s ticks, remembered (murmur2 in Python, and a job ticks often)."""
    return partition_for(job_key(job_id), partitions)


@contextlib.contextmanager
def _quiet(verbose: bool) -> Iterator[None]:
    """The workers' log lines are the trace's business only when asked for (-v)."""
    logger = logging.getLogger("cutline.coordinator")
    level = logger.level
    if not verbose:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


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
        case own.RecoveryFailed() | own.ResendFailed() | own.JournalWriteFailed():
            parts.append(item.error[:60])
        case _:
            pass
    return f"{name}({' '.join(x for x in parts if x)})"


def simulate(
    seed: int,
    rules: Rules = Rules.CURRENT,
    *,
    scenario: Scenario | None = None,
    keep_trace: bool = False,
    verbose: bool = False,
) -> Result:
    """Run one seed (in ``scenario``, or one the seed chooses); raise :class:`SimulationFailed`
    when an invariant breaks."""
    return World(seed, rules, scenario, keep_trace, verbose).run()


__all__ = [
    "Result",
    "Rules",
    "Scenario",
    "SimulationFailed",
    "rebalance_storm",
    "random_scenario",
    "simulate",
]
