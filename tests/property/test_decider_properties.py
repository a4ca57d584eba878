"""Properties of the pure coordinator: what holds for every realistic command sequence.

The strategy draws *abstract* actions ("acknowledge pending checkpoint #i by
task #j", "let time jump past the timeout", "restart from the latest
savepoint", some garbage) and maps each onto a concrete command against the
state the coordinator holds at that moment, so checkpoints really complete,
expire, get subsumed and fail jobs. Each test states one property (docs/design.md, "The checkpoint decider";
style anchors lessons 11-13); ``coordinator.core.invariants`` states the journal
rules once, for these tests and for ``cutline replay --verify``.

Set ``CUTLINE_PROPERTY_PROFILE=thorough`` for a long run.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, find, given, settings
from hypothesis import strategies as st

from coordinator.core.commands import (
    AcknowledgeCheckpoint,
    ChangeJobStatus,
    ChangeTaskStatus,
    Command,
    DeclineCheckpoint,
    RequestCheckpoint,
    Tick,
)
from coordinator.core.decider import (
    Decision,
    InputRejected,
    decide,
    decide_steps,
    due_at,
    evolve,
    fold,
    fold_jobs,
    inline_limit,
)
from coordinator.core.invariants import Violation, first_violation, violations
from coordinator.core.state import JobState, Reason, initial_state
from coordinator.core.testing import (
    LOCATION,
    ack,
    config,
    decline,
    job_status,
    request,
    running,
    task_status,
    tick,
)
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointRequestQueued,
    CheckpointRestored,
    CheckpointTriggered,
    ExecutionState,
    JobStatus,
    JournalEvent,
    SchedulerStarted,
    SchedulerStopped,
    StateHandle,
    TaskAcknowledged,
    TriggerRejected,
)
from events.wire.validation import INLINE_BUDGET_BYTES, MAX_INLINE_THRESHOLD_BYTES, MAX_TASKS

settings.register_profile(
    "cutline-quick",
    max_examples=100,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("cutline-thorough", settings.get_profile("cutline-quick"), max_examples=2_000)
PROPERTY = settings.get_profile("cutline-" + os.environ.get("CUTLINE_PROPERTY_PROFILE", "quick"))
"""Settings of every property here; a named profile so a long run needs no code change."""

GHOST = "ghost-job"
SAVEPOINTS = "file:///tmp/cutline-savepoints"


# =============================================================== the strategy


@dataclass(frozen=True)
class JobSetup:
    """One job of a scenario: its tasks and the configs its attempts run with."""

    job_id: str
    tasks: tuple[str, ...]
    configs: tuple[CheckpointConfig, CheckpointConfig]


@dataclass(frozen=True)
class Step:
    """One command, the job's state before it, what was decided, and the state after."""

    command: Command
    before: JobState
    decisions: tuple[Decision, ...]
    after: JobState


@dataclass(frozen=True)
class Scenario:
    """Commands as the coordinator received them, and (not shown) how it handled each."""

    commands: tuple[Command, ...]
    steps: tuple[Step, ...] = field(repr=False, compare=False)

    def __repr__(self) -> str:
        return "scenario_of(\n" + "".join(f"    {render(c)},\n" for c in self.commands) + ")"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints falsifying examples with this: the commands, not every state."""
        printer.text(repr(self))

    @property
    def journal(self) -> list[JournalEvent]:
        """Every accepted event of every job, in journal order."""
        return [d for s in self.steps for d in s.decisions if not isinstance(d, InputRejected)]

    @property
    def final_states(self) -> dict[str, JobState]:
        """What the coordinator holds for each job after the last command."""
        return {s.command.job_id: s.after for s in self.steps}


def render(command: Command) -> str:
    """A command as the ``coordinator.core.testing`` builder call that makes it: short, and pastes into
    a test."""
    match command:
        case ChangeJobStatus(changed=c):
            cfg = ""
            if c.config is not None:
                diff = {k: v for k, v in asdict(c.config).items() if asdict(config())[k] != v}
                cfg = ", cfg=config(" + ", ".join(f"{k}={v!r}" for k, v in diff.items()) + ")"
            extra = "".join(
                f", {k}={v!r}"
                for k, v in (
                    ("restored_from", c.restored_checkpoint_id),
                    ("error", c.error),
                    ("jitter", command.jitter or None),
                )
                if v is not None
            )
            head = "running(" if c.status is JobStatus.RUNNING else f"job_status(JobStatus.{c.status.name}, "
            return (
                f"{head}job_id={c.job_id!r}, tasks={c.tasks!r}{cfg}, attempt={c.attempt}, "
                f"at={command.now_ms}{extra})"
            )
        case ChangeTaskStatus(changed=c):
            return (
                f"task_status({c.task_id!r}, ExecutionState.{c.status.name}, job_id={c.job_id!r}, "
                f"attempt={c.attempt}, at={command.now_ms})"
            )
        case RequestCheckpoint(request=r):
            kind = "CheckpointKind.SAVEPOINT, " if r.kind is CheckpointKind.SAVEPOINT else ""
            target = f", target={r.target!r}" if r.target else ""
            return (
                f"request({kind}job_id={r.job_id!r}, request_id={r.request_id!r}{target}, "
                f"at={command.now_ms})"
            )
        case AcknowledgeCheckpoint(ack=a):
            state = f", state={a.state!r}" if a.state else ""
            offsets = f", offsets={dict(a.offsets)!r}" if a.offsets else ""
            return (
                f"ack({a.checkpoint_id}, {a.task_id!r}, job_id={a.job_id!r}, attempt={a.attempt}, "
                f"at={command.now_ms}{state}{offsets})"
            )
        case DeclineCheckpoint(decline=d):
            return (
                f"decline({d.checkpoint_id}, {d.task_id!r}, job_id={d.job_id!r}, attempt={d.attempt}, "
                f"at={command.now_ms})"
            )
        case Tick():
            return f"tick({command.now_ms}, job_id={command.job_id!r})"
    return repr(command)


def scenario_of(*commands: Command) -> Scenario:
    """A scenario of exactly these commands, e.g. pasted from a falsifying example."""
    return Scenario(commands, tuple(play(commands)))


def play(commands: Sequence[Command], states: dict[str, JobState] | None = None) -> list[Step]:
    """Decide each command in the state the coordinator holds, then evolve it: the shell's loop."""
    states = dict(states or {})
    steps = []
    for command in commands:
        before = states.get(command.job_id) or initial_state(command.job_id)
        decisions = tuple(decide(before, command))
        after = fold(decisions, before)
        states[command.job_id] = after
        steps.append(Step(command, before, decisions, after))
    return steps


class Driver:
    """Turns abstract actions into concrete commands against the current state, and runs them."""

    def __init__(self, jobs: Sequence[JobSetup]) -> None:
        self.jobs = jobs
        self.now = 0
        self.requests = 0
        self.states: dict[str, JobState] = {}
        self.commands: list[Command] = []
        self.steps: list[Step] = []

    def send(self, command: Command) -> None:
        (step,) = play([command], self.states)
        self.states[command.job_id] = step.after
        self.commands.append(command)
        self.steps.append(step)

    def state(self, job: JobSetup) -> JobState:
        return self.states.get(job.job_id) or initial_state(job.job_id)

    def run(self, action: tuple[str, int, int, int]) -> None:
        kind, a, b, c = action
        job = self.jobs[a % len(self.jobs)]
        getattr(self, f"do_{kind}")(job, b, c)

    # -- acknowledgements and declines

    def _ack(self, job: JobSetup, checkpoint_id: int, task: str, c: int, **overrides: object) -> None:
        s = self.state(job)
        pending = s.pending.get(checkpoint_id)
        handle = None
        if pending is not None and c % 3 == 0:
            handle = StateHandle(f"{pending.triggered.location}/{task}.snap", 100 + c % 50, f"{c:064x}")
        elif pending is not None and c % 3 == 1:  # inline, sometimes above the checkpoint's limit
            data = bytes(c % 251 for _ in range(c % 50))
            digest = hashlib.sha256(data).hexdigest()
            handle = StateHandle(f"{pending.triggered.location}/{task}.snap", len(data), digest, data)
        self.now += c % 5
        values: dict[str, object] = {
            "job_id": job.job_id,
            "attempt": s.attempt,
            "at": self.now,
            "state": handle,
            "offsets": {f"events:{c % 4}": c},
        }
        values.update(overrides)
        self.send(ack(checkpoint_id, task, **values))  # type: ignore[arg-type]

    def do_ack(self, job: JobSetup, b: int, c: int) -> None:
        """Acknowledge pending checkpoint #b by a task that has not yet (sometimes by one that has)."""
        s = self.state(job)
        if s.next_checkpoint_id == 1:  # nothing to acknowledge yet: let time pass instead
            self.do_tick(job, b, c)
            return
        if not s.pending:
            late = max(1, s.next_checkpoint_id - 1 - b % 3)
            self._ack(job, late, job.tasks[c % len(job.tasks)], c)
            return
        pending = s.pending[sorted(s.pending)[b % len(s.pending)]]
        tasks = pending.triggered.tasks
        missing = [t for t in tasks if t not in pending.acks]
        task = missing[c % len(missing)] if missing and c % 6 else tasks[c % len(tasks)]
        self._ack(job, pending.checkpoint_id, task, c)

    def do_ack_rest(self, job: JobSetup, b: int, c: int) -> None:
        """Every task that has not yet acknowledged pending checkpoint #b does so."""
        s = self.state(job)
        if s.pending:
            pending = s.pending[sorted(s.pending)[b % len(s.pending)]]
            for task in pending.triggered.tasks:
                if task not in pending.acks:
                    self._ack(job, pending.checkpoint_id, task, c)

    def do_decline(self, job: JobSetup, b: int, c: int) -> None:
        """A task declines pending checkpoint #b (or one that is no longer pending)."""
        s = self.state(job)
        if s.pending:
            pending = s.pending[sorted(s.pending)[b % len(s.pending)]]
            checkpoint_id, task = (
                pending.checkpoint_id,
                pending.triggered.tasks[c % len(pending.triggered.tasks)],
            )
        else:
            checkpoint_id, task = max(1, s.next_checkpoint_id - 1), job.tasks[c % len(job.tasks)]
        self.send(decline(checkpoint_id, task, job_id=job.job_id, attempt=s.attempt, at=self.now))

    # -- time

    def do_tick(self, job: JobSetup, b: int, c: int) -> None:
        """A little time passes (maybe none): periodic triggers fire."""
        self.now += c % 300
        self.send(tick(self.now, job_id=job.job_id))

    def do_timer(self, job: JobSetup, b: int, c: int) -> None:
        """The timer fires a few times, one checkpoint interval apart, with no other input between."""
        s = self.state(job)
        interval = s.config.base_interval_ms if s.config and s.config.base_interval_ms > 0 else 100
        for _ in range(2 + b % 3):
            self.now += interval
            self.send(tick(self.now, job_id=job.job_id))

    def do_jump(self, job: JobSetup, b: int, c: int) -> None:
        """Time jumps, often past every timeout."""
        self.now += 400 + c % 2_500
        self.send(tick(self.now, job_id=job.job_id))

    # -- requests

    def do_request(self, job: JobSetup, b: int, c: int) -> None:
        """An operator asks for a manual checkpoint."""
        self.requests += 1
        self.send(request(job_id=job.job_id, request_id=f"r{self.requests}", at=self.now))

    def do_savepoint(self, job: JobSetup, b: int, c: int) -> None:
        """An operator asks for a savepoint, to the default location or a target."""
        self.requests += 1
        target = SAVEPOINTS if c % 2 else None
        self.send(
            request(
                CheckpointKind.SAVEPOINT,
                job_id=job.job_id,
                request_id=f"s{self.requests}",
                target=target,
                at=self.now,
            )
        )

    # -- task and job status

    def _task_status(self, job: JobSetup, status: ExecutionState, c: int) -> None:
        s = self.state(job)
        tasks = s.tasks or job.tasks
        self.send(
            task_status(tasks[c % len(tasks)], status, job_id=job.job_id, attempt=s.attempt, at=self.now)
        )

    def do_task_fail(self, job: JobSetup, b: int, c: int) -> None:
        """A task fails, is canceled or is canceling."""
        statuses = (ExecutionState.FAILED, ExecutionState.CANCELED, ExecutionState.CANCELING)
        self._task_status(job, statuses[b % 3], c)

    def do_task_recover(self, job: JobSetup, b: int, c: int) -> None:
        """A task that is down runs again (or any task reports RUNNING)."""
        down = sorted(self.state(job).tasks_not_running)
        if down:
            s = self.state(job)
            self.send(
                task_status(
                    down[c % len(down)],
                    ExecutionState.RUNNING,
                    job_id=job.job_id,
                    attempt=s.attempt,
                    at=self.now,
                )
            )
            return
        self._task_status(job, ExecutionState.RUNNING, c)

    def do_task_other(self, job: JobSetup, b: int, c: int) -> None:
        """A task is deploying, initializing, scheduled or finished."""
        statuses = (
            ExecutionState.DEPLOYING,
            ExecutionState.INITIALIZING,
            ExecutionState.SCHEDULED,
            ExecutionState.FINISHED,
        )
        self._task_status(job, statuses[b % 4], c)

    def do_restart(self, job: JobSetup, b: int, c: int) -> None:
        """The job runs again: usually a new attempt, maybe rescaled, maybe restored from a checkpoint."""
        s = self.state(job)
        attempt = s.attempt if b % 4 == 0 else s.attempt + 1
        tasks = job.tasks[:-1] if b % 3 == 0 and len(job.tasks) > 1 else job.tasks
        restore: int | None = None
        if b % 5 == 2 and s.latest_completed is not None:
            restore = s.latest_completed.checkpoint_id
        elif b % 5 == 3 and s.latest_savepoint is not None:
            restore = s.latest_savepoint.checkpoint_id
        elif b % 5 == 4:
            restore = 1 + c % 40  # anything: an old checkpoint, or another job's savepoint far ahead
        self.send(
            running(
                job_id=job.job_id,
                tasks=tasks,
                cfg=job.configs[b % 2],
                attempt=attempt,
                at=self.now,
                jitter=(c % 1000) / 1000,
                restored_from=restore,
            )
        )

    def do_status(self, job: JobSetup, b: int, c: int) -> None:
        """The job leaves RUNNING (fails, is canceled, restarts, ...), in this attempt or the next."""
        statuses = [s for s in JobStatus if s is not JobStatus.RUNNING]
        s = self.state(job)
        self.send(
            job_status(
                statuses[b % len(statuses)],
                job_id=job.job_id,
                attempt=s.attempt + c % 2,
                at=self.now,
                error="boom" if c % 3 else None,
            )
        )

    # -- garbage

    def do_garbage(self, job: JobSetup, b: int, c: int) -> None:
        """Input the coordinator must refuse or ignore: unknown jobs, stale attempts, bad ids and data."""
        s, now, j = self.state(job), self.now, job.job_id
        some_id = max(sorted(s.pending) or [max(1, s.next_checkpoint_id - 1)])
        task = (s.tasks or job.tasks)[c % len(s.tasks or job.tasks)]
        garbage: list[Callable[[], Command]] = [
            lambda: ack(1, "t0", job_id=GHOST, at=now),
            lambda: request(job_id=GHOST, request_id="ghost", at=now),
            lambda: tick(now, job_id=GHOST),
            lambda: decline(1, "t0", job_id=GHOST, at=now),
            lambda: task_status("t0", ExecutionState.FAILED, job_id=GHOST, at=now),
            lambda: job_status(JobStatus.FAILED, job_id=GHOST, attempt=c % 3, at=now),
            lambda: ack(some_id, task, job_id=j, attempt=s.attempt - 1, at=now),
            lambda: ack(some_id, task, job_id=j, attempt=s.attempt + 1, at=now),
            lambda: ack(some_id, "no-such-task", job_id=j, attempt=s.attempt, at=now),
            lambda: ack(-(c % 3), task, job_id=j, attempt=s.attempt, at=now),
            lambda: ack(s.next_checkpoint_id + c % 5, task, job_id=j, attempt=s.attempt, at=now),
            lambda: ack(some_id, task, job_id=j, attempt=s.attempt, at=now, offsets={"no-partition": 1}),
            lambda: ack(some_id, task, job_id=j, attempt=s.attempt, at=now, offsets={"events:0": -1}),
            lambda: ack(
                some_id,
                task,
                job_id=j,
                attempt=s.attempt,
                at=now,
                state=StateHandle("file:///etc/passwd", 1, "0" * 64),
            ),
            lambda: ack(
                some_id,
                task,
                job_id=j,
                attempt=s.attempt,
                at=now,
                state=StateHandle(f"{LOCATION}/{j}/chk-{some_id}/../../x", 1, "0" * 64),
            ),
            lambda: decline(s.next_checkpoint_id + 3, task, job_id=j, attempt=s.attempt, at=now),
            lambda: decline(some_id, task, job_id=j, attempt=s.attempt - 1, at=now),
            lambda: task_status("no-such-task", ExecutionState.FAILED, job_id=j, attempt=s.attempt, at=now),
            lambda: task_status(task, ExecutionState.FAILED, job_id=j, attempt=s.attempt - 1, at=now),
            lambda: job_status(JobStatus.CANCELED, job_id=j, attempt=s.attempt - 1, at=now),
            lambda: running(job_id=j, attempt=s.attempt + 1, cfg=config(max_concurrent=0), at=now),
            lambda: running(job_id=j, attempt=s.attempt + 1, cfg=config(timeout_ms=0), at=now),
            lambda: running(job_id=j, attempt=s.attempt + 1, tasks=(), at=now),
            lambda: running(job_id=j, attempt=s.attempt + 1, tasks=("t0", "t0"), at=now),
            lambda: running(job_id=j, attempt=s.attempt + 1, restored_from=0, at=now),
            lambda: running(job_id=j, attempt=-1, at=now),
        ]
        self.send(garbage[b % len(garbage)]())


ACTIONS = (
    *["ack"] * 6,
    *["ack_rest"] * 3,
    *["tick"] * 4,
    "timer",
    "jump",
    *["request"] * 2,
    "savepoint",
    "decline",
    "task_fail",
    "task_other",
    *["task_recover"] * 2,
    "restart",
    "status",
    *["garbage"] * 2,
)
"""Abstract actions, repeated to weight them: acks and ticks are the common traffic."""

configs = st.builds(
    config,
    interval_ms=st.sampled_from([0, 100, 250, 1_000]),
    timeout_ms=st.sampled_from([50, 300, 2_000, 10_000]),
    min_pause_ms=st.sampled_from([0, 0, 80, 400]),
    max_concurrent=st.integers(1, 3),
    tolerable_failures=st.integers(0, 2),
    retained=st.integers(1, 3),
    inline_threshold_bytes=st.sampled_from([0, 0, 8, 40]),
)
actions = st.tuples(st.sampled_from(ACTIONS), st.integers(0, 7), st.integers(0, 29), st.integers(0, 9_999))


@st.composite
def job_setups(draw: st.DrawFn) -> list[JobSetup]:
    """One to three jobs with one to three tasks and two configs each."""
    count = draw(st.integers(1, 3))
    return [
        JobSetup(
            job_id=f"job-{i}",
            tasks=tuple(f"t{k}" for k in range(draw(st.integers(1, 3)))),
            configs=(draw(configs), draw(configs)),
        )
        for i in range(count)
    ]


@st.composite
def scenarios(draw: st.DrawFn, max_actions: int = 60) -> Scenario:
    """Every job reported RUNNING, then abstract actions mapped onto the state as they run."""
    jobs = draw(job_setups())
    driver = Driver(jobs)
    for job in jobs:
        jitter = draw(st.floats(0, 1, exclude_max=True))
        driver.send(running(job_id=job.job_id, tasks=job.tasks, cfg=job.configs[0], jitter=jitter))
    for _ in range(draw(st.integers(0, max_actions), label="actions")):
        driver.run(draw(actions))
    return Scenario(tuple(driver.commands), tuple(driver.steps))


# ================================================================== helpers


def by_job(events: Sequence[JournalEvent]) -> dict[str, list[JournalEvent]]:
    """The journal split by job, each in journal order."""
    jobs: dict[str, list[JournalEvent]] = {}
    for event in events:
        jobs.setdefault(event.job_id, []).append(event)
    return jobs


def interim_states(step: Step) -> Iterator[JobState]:
    """The states after each event of one step, as the coordinator evolves them one by one."""
    state = step.before
    for decision in step.decisions:
        state = evolve(state, decision)
        yield state


def recovered(events: Sequence[JournalEvent], job_id: str) -> JobState:
    """What a restarted coordinator recovers for ``job_id`` by folding the journal."""
    return fold_jobs(events).get(job_id) or initial_state(job_id)


# ================================================================ properties


class TestInvariants:
    @PROPERTY
    @given(scenarios())
    def test_decided_journal_breaks_no_rule(self, scenario: Scenario) -> None:
        """The invariants module finds no violation in any journal the decider produces."""
        assert [] == list(violations(scenario.journal))

    @PROPERTY
    @given(scenarios(), st.data())
    def test_checking_from_a_folded_state_finds_nothing_either(
        self, scenario: Scenario, data: st.DataObject
    ) -> None:
        """Checking the rest of a journal from the folded states of its start finds no violation."""
        journal = scenario.journal
        cut = data.draw(st.integers(0, len(journal)), label="cut")
        assert [] == list(violations(journal[cut:], fold_jobs(journal[:cut])))


class TestCheckpointIds:
    @PROPERTY
    @given(scenarios())
    def test_ids_strictly_increase_per_job(self, scenario: Scenario) -> None:
        """A job's checkpoint and savepoint ids strictly increase, starting at 1 or later."""
        for events in by_job(scenario.journal).values():
            ids = [e.checkpoint_id for e in events if isinstance(e, CheckpointTriggered)]
            assert sorted(set(ids)) == ids
            assert all(i >= 1 for i in ids)

    @PROPERTY
    @given(scenarios())
    def test_ids_are_never_reused_across_restarts_and_restores(self, scenario: Scenario) -> None:
        """Every trigger uses an id above every id triggered or restored before it in that job."""
        for events in by_job(scenario.journal).values():
            used = 0
            for event in events:
                if isinstance(event, CheckpointTriggered):
                    assert event.checkpoint_id > used, event
                if isinstance(event, CheckpointTriggered | CheckpointRestored):
                    used = max(used, event.checkpoint_id)


class TestCompletion:
    @PROPERTY
    @given(scenarios())
    def test_never_complete_without_every_ack_of_the_current_attempt(self, scenario: Scenario) -> None:
        """A completion follows an accepted ack from every task of its trigger, all of the current attempt."""
        for events in by_job(scenario.journal).values():
            attempt = 0
            triggered: dict[int, CheckpointTriggered] = {}
            acks: dict[int, dict[str, int]] = {}
            for event in events:
                match event:
                    case SchedulerStarted() | SchedulerStopped():
                        attempt = event.attempt
                    case CheckpointTriggered():
                        triggered[event.checkpoint_id] = event
                        acks[event.checkpoint_id] = {}
                    case TaskAcknowledged():
                        acks[event.checkpoint_id][event.task_id] = event.attempt
                    case CheckpointCompleted():
                        trigger = triggered[event.checkpoint_id]
                        assert set(trigger.tasks) == set(acks[event.checkpoint_id]), event
                        assert {attempt} == {trigger.attempt, *acks[event.checkpoint_id].values()}, event
                        assert trigger.kind is event.kind

    @PROPERTY
    @given(scenarios())
    def test_a_fully_acknowledged_checkpoint_completes_at_once(self, scenario: Scenario) -> None:
        """After every command, no pending checkpoint has an ack from all of its tasks."""
        for step in scenario.steps:
            assert [] == [p.checkpoint_id for p in step.after.pending.values() if p.fully_acknowledged]

    @PROPERTY
    @given(scenarios())
    def test_inline_state_stays_within_its_checkpoints_limit(self, scenario: Scenario) -> None:
        """Every journaled inline snapshot fits its trigger's limit and matches its digest."""
        limits: dict[tuple[str, int], int] = {}
        for event in scenario.journal:
            match event:
                case CheckpointTriggered():
                    limits[event.job_id, event.checkpoint_id] = event.inline_limit_bytes
                case TaskAcknowledged(state=StateHandle(inline=bytes() as data) as handle):
                    assert len(data) <= limits[event.job_id, event.checkpoint_id], event
                    assert (len(data), hashlib.sha256(data).hexdigest()) == (handle.size_bytes, handle.sha256)

    @PROPERTY
    @given(st.integers(0, MAX_INLINE_THRESHOLD_BYTES), st.integers(1, MAX_TASKS))
    def test_the_inline_limit_keeps_every_completion_within_the_budget(
        self, threshold: int, tasks: int
    ) -> None:
        """All tasks' inline state together fits INLINE_BUDGET_BYTES (one Kafka record), and the
        threshold is cut only when it must be."""
        limit = inline_limit(threshold, tasks)

        assert 0 <= limit <= threshold
        assert tasks * limit <= INLINE_BUDGET_BYTES
        assert limit == threshold or tasks * (limit + 1) > INLINE_BUDGET_BYTES


class TestConcurrency:
    @PROPERTY
    @given(scenarios())
    def test_never_more_than_max_concurrent_pending(self, scenario: Scenario) -> None:
        """After every event, at most max_concurrent checkpoints (savepoints aside) are pending."""
        for step in scenario.steps:
            for state in interim_states(step):
                limit = state.config.max_concurrent if state.config else 1
                assert state.pending_checkpoints <= limit


class TestFold:
    @PROPERTY
    @given(scenarios(), st.data())
    def test_folding_in_pieces_equals_folding_at_once(self, scenario: Scenario, data: st.DataObject) -> None:
        """Folding a journal piece by piece, each from the last piece's states, gives the same states."""
        journal = scenario.journal
        cuts = sorted(data.draw(st.lists(st.integers(0, len(journal)), max_size=4), label="cuts"))
        states: dict[str, JobState] = {}
        for start, end in zip([0, *cuts], [*cuts, len(journal)], strict=True):
            states = fold_jobs(journal[start:end], states)
        assert fold_jobs(journal) == states

    @PROPERTY
    @given(scenarios())
    def test_journal_reproduces_what_the_coordinator_holds(self, scenario: Scenario) -> None:
        """After each command, folding the journal so far gives the state the coordinator evolved."""
        journal: list[JournalEvent] = []
        for step in scenario.steps:
            journal.extend(d for d in step.decisions if not isinstance(d, InputRejected))
            assert step.after == fold(step.decisions, step.before)
            assert step.after == recovered(journal, step.command.job_id)

    @PROPERTY
    @given(scenarios())
    def test_decide_steps_pairs_each_decision_with_the_folded_state(self, scenario: Scenario) -> None:
        """``decide_steps`` gives ``decide``'s decisions, each with the state folding them up to it gives."""
        for step in scenario.steps:
            steps = decide_steps(step.before, step.command)
            assert step.decisions == tuple(d for d, _ in steps)
            for i, (_, state) in enumerate(steps):
                assert fold(step.decisions[: i + 1], step.before) == state

    @PROPERTY
    @given(scenarios(), st.data())
    def test_recovery_mid_way_continues_identically(self, scenario: Scenario, data: st.DataObject) -> None:
        """A coordinator that crashes after any command and recovers by folding decides the rest the same."""
        crash = data.draw(st.integers(0, len(scenario.steps)), label="crash after")
        before = [d for s in scenario.steps[:crash] for d in s.decisions if not isinstance(d, InputRejected)]
        resumed = play(scenario.commands[crash:], fold_jobs(before))
        assert [s.decisions for s in scenario.steps[crash:]] == [s.decisions for s in resumed]


class TestDeterminism:
    @PROPERTY
    @given(scenarios())
    def test_decide_is_deterministic(self, scenario: Scenario) -> None:
        """Deciding the same commands from scratch again gives the same decisions and states."""
        again = play(scenario.commands)
        assert [s.decisions for s in scenario.steps] == [s.decisions for s in again]
        assert [s.after for s in scenario.steps] == [s.after for s in again]
        for step in scenario.steps:
            assert step.decisions == tuple(decide(step.before, step.command))

    @PROPERTY
    @given(scenarios())
    def test_redelivered_inputs_change_nothing(self, scenario: Scenario) -> None:
        """Any command but a request, delivered twice in a row, decides nothing new the second time."""
        for step in scenario.steps:
            if isinstance(step.command, RequestCheckpoint):
                continue
            again = tuple(decide(step.after, step.command))
            rejected = tuple(d for d in step.decisions if isinstance(d, InputRejected))
            assert again in ((), rejected), (step.command, again)


class TestTotality:
    @PROPERTY
    @given(scenarios())
    def test_evolve_takes_every_decided_event(self, scenario: Scenario) -> None:
        """Evolve takes every decision, rejections included, and the timer's due time is always defined."""
        for step in scenario.steps:
            for state in interim_states(step):
                due = due_at(state)
                assert due is None or isinstance(due, int)

    @PROPERTY
    @given(scenarios(max_actions=30), st.data())
    def test_evolve_is_total_on_reordered_subsequences(self, scenario: Scenario, data: st.DataObject) -> None:
        """Evolve and the invariant checker never raise on any reordering or repetition of decided events."""
        decisions = [d for s in scenario.steps for d in s.decisions]
        if not decisions:
            return
        picks = data.draw(st.lists(st.integers(0, len(decisions) - 1), max_size=60), label="picks")
        shuffled = data.draw(st.permutations(decisions), label="shuffled")
        starts = [
            initial_state("job-0"),
            *(s.after for s in scenario.steps[:: max(1, len(scenario.steps) // 5)]),
        ]
        for start in starts:
            for events in ([decisions[i] for i in picks], shuffled):
                state = fold(events, start)
                due_at(state)
                list(violations([e for e in events if not isinstance(e, InputRejected)]))


class TestFailuresAndRetention:
    @PROPERTY
    @given(scenarios())
    def test_a_failure_beyond_the_tolerable_is_reported_at_once(self, scenario: Scenario) -> None:
        """After a counted failure the count is never above tolerable_failures: the threshold resets it."""
        for step in scenario.steps:
            if any(isinstance(d, CheckpointAborted) and d.counts_as_failure for d in step.decisions):
                assert step.after.config is not None
                assert step.after.failures <= step.after.config.tolerable_failures

    @PROPERTY
    @given(scenarios())
    def test_completion_keeps_the_last_retained_checkpoints(self, scenario: Scenario) -> None:
        """A completed checkpoint leaves at most `retained` checkpoints kept (no savepoints), oldest first."""
        for step in scenario.steps:
            kinds = {d.kind for d in step.decisions if isinstance(d, CheckpointCompleted)}
            if CheckpointKind.CHECKPOINT in kinds:  # a savepoint is not stored, so it trims nothing
                state = step.after
                assert state.config is not None
                ids = [c.checkpoint_id for c in state.completed]
                assert len(ids) <= state.config.retained
                assert sorted(set(ids)) == ids
                assert all(c.kind is CheckpointKind.CHECKPOINT for c in state.completed)


class TestTimer:
    @PROPERTY
    @given(scenarios())
    def test_nothing_happens_before_due_at(self, scenario: Scenario) -> None:
        """A tick before due_at decides nothing, and a tick at due_at decides something."""
        for step in scenario.steps:
            due = due_at(step.after)
            if due is not None:
                job_id = step.command.job_id
                assert [] == decide(step.after, tick(due - 1, job_id=job_id))
                assert [] != decide(step.after, tick(due, job_id=job_id))

    @PROPERTY
    @given(scenarios())
    def test_an_acknowledgement_moves_no_deadline(self, scenario: Scenario) -> None:
        """``due_at`` after a TaskAcknowledged is ``due_at`` before it (in any state: decided or not),
        so the shell carries a job's due time across acks instead of walking its pending checkpoints
        again (``Coordinator.due``)."""
        acks = [d for s in scenario.steps for d in s.decisions if isinstance(d, TaskAcknowledged)]
        for step in scenario.steps:
            state = step.before
            for decision in step.decisions:
                after = evolve(state, decision)
                if isinstance(decision, TaskAcknowledged):
                    assert due_at(state) == due_at(after)
                state = after
            for (
                acknowledged
            ) in acks:  # also acks this state never decided: of other checkpoints, repeated, stale
                assert due_at(step.after) == due_at(evolve(step.after, acknowledged))


class TestQueue:
    @PROPERTY
    @given(scenarios())
    def test_requests_wait_only_while_there_is_no_room(self, scenario: Scenario) -> None:
        """After every command, requests are queued only while max_concurrent checkpoints are pending."""
        for step in scenario.steps:
            state = step.after
            limit = state.config.max_concurrent if state.config else 1
            assert not state.queue or state.pending_checkpoints >= limit, state.queue

    @PROPERTY
    @given(scenarios())
    @example(
        scenario_of(  # the tick at 300 once dropped the waiting periodic request (fixed in fd3948f)
            running(job_id="job-0", tasks=("t0", "t1"), cfg=config(interval_ms=100), attempt=1, at=0),
            tick(100, job_id="job-0"),  # triggers checkpoint 1
            tick(200, job_id="job-0"),  # 1 is pending (max_concurrent 1): a periodic request waits
            tick(300, job_id="job-0"),  # a newer periodic request takes its place
        )
    )
    def test_waiting_requests_leave_only_when_the_queue_moves(self, scenario: Scenario) -> None:
        """A request stops waiting only after a completion or abort, or when the scheduler stops or restarts.

        The periodic request is one slot: a newer periodic request may take the older one's place.
        """
        moves = (CheckpointCompleted, CheckpointAborted, SchedulerStarted, SchedulerStopped)
        for step in scenario.steps:
            left = waiting(step.before) - waiting(step.after)
            if left:
                assert any(isinstance(d, moves) for d in step.decisions), (render(step.command), left)


def waiting(state: JobState) -> set[str | None]:
    """What waits in the queue: the periodic request (one slot) and manual requests by id."""
    return {"<periodic>" if q.periodic else q.request_id for q in state.queue}


class TestLifecycle:
    @PROPERTY
    @given(scenarios())
    def test_every_trigger_ends_completed_aborted_or_still_pending(self, scenario: Scenario) -> None:
        """Each triggered checkpoint ends exactly one way: completed once, aborted once, or still pending."""
        final = scenario.final_states
        for job_id, events in by_job(scenario.journal).items():
            ends: dict[int, list[str]] = {}
            for event in events:
                if isinstance(event, CheckpointTriggered):
                    ends[event.checkpoint_id] = []
                elif isinstance(event, CheckpointCompleted | CheckpointAborted):
                    ends[event.checkpoint_id].append(type(event).__name__)
            for checkpoint_id in final[job_id].pending:
                ends[checkpoint_id].append("pending")
            assert {} == {i: e for i, e in ends.items() if len(e) != 1}

    @PROPERTY
    @given(scenarios())
    def test_rejected_inputs_never_change_state(self, scenario: Scenario) -> None:
        """A refused input decides only its rejection and leaves the state exactly as it was."""
        for step in scenario.steps:
            if any(isinstance(d, InputRejected) for d in step.decisions):
                assert 1 == len(step.decisions)
                assert step.before == step.after


# ========================================================= the strategy reaches


def _aborted(reason: Reason) -> Callable[[Scenario], bool]:
    return lambda s: any(isinstance(e, CheckpointAborted) and e.reason == reason for e in s.journal)


def _completed(kind: CheckpointKind) -> Callable[[Scenario], bool]:
    return lambda s: any(isinstance(e, CheckpointCompleted) and e.kind is kind for e in s.journal)


def _restored_then_triggered(s: Scenario) -> bool:
    journal = s.journal
    return any(
        isinstance(e, CheckpointRestored)
        and any(isinstance(f, CheckpointTriggered) and f.job_id == e.job_id for f in journal[i:])
        for i, e in enumerate(journal)
    )


def _concurrent(s: Scenario) -> bool:
    return any(st.pending_checkpoints >= 2 for step in s.steps for st in interim_states(step))


REACHED: dict[str, Callable[[Scenario], bool]] = {
    "a completed checkpoint": _completed(CheckpointKind.CHECKPOINT),
    "a completed savepoint": _completed(CheckpointKind.SAVEPOINT),
    "a subsumed checkpoint": _aborted(Reason.CHECKPOINT_SUBSUMED),
    "an expired checkpoint": _aborted(Reason.CHECKPOINT_EXPIRED),
    "a declined checkpoint": _aborted(Reason.CHECKPOINT_DECLINED),
    "a task failure abort": _aborted(Reason.TASK_FAILURE),
    "a suspended checkpoint": _aborted(Reason.CHECKPOINT_COORDINATOR_SUSPEND),
    "an exceeded failure threshold": lambda s: any(
        isinstance(e, CheckpointFailureThresholdExceeded) for e in s.journal
    ),
    "a restore followed by a trigger": _restored_then_triggered,
    "a queued request": lambda s: any(isinstance(e, CheckpointRequestQueued) for e in s.journal),
    "a min-pause rejection": lambda s: any(
        isinstance(e, TriggerRejected) and e.reason == Reason.MINIMUM_TIME_BETWEEN_CHECKPOINTS
        for e in s.journal
    ),
    "two concurrent checkpoints": _concurrent,
    "a waiting periodic request replaced by a newer one": lambda s: any(
        any(q.periodic for q in step.before.queue)
        and any(isinstance(d, CheckpointRequestQueued) and d.periodic for d in step.decisions)
        for step in s.steps
    ),
    "four kinds of rejected input": lambda s: (
        len({d.reason for step in s.steps for d in step.decisions if isinstance(d, InputRejected)}) >= 4
    ),
}


class TestStrategy:
    @pytest.mark.parametrize("situation", REACHED)
    def test_scenarios_reach(self, situation: str) -> None:
        """The strategy is realistic: it reaches each interesting situation within a few thousand tries."""
        found = find(
            scenarios(),
            REACHED[situation],
            settings=settings(
                PROPERTY, max_examples=2_000, phases=[Phase.generate], database=None, derandomize=True
            ),
        )
        assert REACHED[situation](found)


# ============================================================ rules can fail


def _trigger(
    checkpoint_id: int, *, kind: CheckpointKind = CheckpointKind.CHECKPOINT, attempt: int = 1
) -> CheckpointTriggered:
    return CheckpointTriggered(
        "job", checkpoint_id, attempt, kind, 10, f"{LOCATION}/job/chk-{checkpoint_id}", ("a", "b"), 1_000
    )


def _ack(checkpoint_id: int, task: str, attempt: int = 1) -> TaskAcknowledged:
    return TaskAcknowledged("job", checkpoint_id, attempt, task, 20)


def _completion(
    checkpoint_id: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT, **handles: StateHandle
) -> CheckpointCompleted:
    return CheckpointCompleted("job", checkpoint_id, kind, 30, 20, handles, 0, {}, attempt=1)


def _inline(data: bytes, size: int | None = None) -> StateHandle:
    digest = hashlib.sha256(data).hexdigest()
    return StateHandle(f"{LOCATION}/job/chk-1/a", len(data) if size is None else size, digest, data)


def _ack_with(checkpoint_id: int, task: str, state: StateHandle) -> TaskAcknowledged:
    return TaskAcknowledged("job", checkpoint_id, 1, task, 20, state)


def _abort(checkpoint_id: int, reason: Reason, counted: bool = False) -> CheckpointAborted:
    return CheckpointAborted("job", checkpoint_id, 40, reason, "because", counts_as_failure=counted)


def _started(max_concurrent: int = 1, tolerable: int = 0) -> SchedulerStarted:
    cfg = config(max_concurrent=max_concurrent, tolerable_failures=tolerable)
    return SchedulerStarted("job", 1, 0, ("a", "b"), cfg, 1_000)


BAD_JOURNALS: dict[str, tuple[list[JournalEvent], str, int]] = {
    "a completion missing an ack": (
        [_started(), _trigger(1), _ack(1, "a"), _completion(1)],
        "complete-after-every-ack",
        3,
    ),
    "a completion with an ack of another attempt": (
        [_started(), _trigger(1), _ack(1, "a"), _ack(1, "b", attempt=2), _completion(1)],
        "ack-of-trigger-attempt",
        3,
    ),
    "a completion of a checkpoint never triggered": (
        [_started(), _completion(7)],
        "complete-only-pending",
        1,
    ),
    "a reused id": (
        [_started(2), _trigger(1), _abort(1, Reason.CHECKPOINT_EXPIRED), _trigger(1)],
        "ids-strictly-increase",
        3,
    ),
    "an id at or below a restored checkpoint": (
        [_started(2), _trigger(1), CheckpointRestored("job", 9, 1, 15), _trigger(5)],
        "ids-never-reused",
        3,
    ),
    "too many pending": ([_started(2), _trigger(1), _trigger(2), _trigger(3)], "max-concurrent", 3),
    "a trigger before any attempt started": ([_trigger(1)], "trigger-in-started-attempt", 0),
    "a trigger of another attempt than the one started": (
        [_started(), _trigger(1, attempt=2)],
        "trigger-in-started-attempt",
        1,
    ),
    "a trigger after the scheduler stopped": (
        [_started(), SchedulerStopped("job", 1, 50, JobStatus.FAILED), _trigger(1)],
        "trigger-in-started-attempt",
        2,
    ),
    "an ack of a checkpoint not pending": ([_started(), _ack(4, "a")], "ack-only-pending", 1),
    "an ack from a task not asked": ([_started(), _trigger(1), _ack(1, "zz")], "ack-from-required-task", 2),
    "a duplicate ack": ([_started(), _trigger(1), _ack(1, "a"), _ack(1, "a")], "ack-not-duplicate", 3),
    "inline state its checkpoint does not allow": (
        [_started(), _trigger(1), _ack_with(1, "a", _inline(b"abc"))],
        "ack-inline-state-fits",
        2,
    ),
    "inline state that is not its handle's": (
        [_started(), replace(_trigger(1), inline_limit_bytes=64), _ack_with(1, "a", _inline(b"abc", size=4))],
        "ack-inline-state-fits",
        2,
    ),
    "a completion with other state than acknowledged": (
        [
            _started(),
            replace(_trigger(1), inline_limit_bytes=64),
            _ack_with(1, "a", _inline(b"abc")),
            _ack(1, "b"),
            _completion(1, a=_inline(b"abd")),
        ],
        "complete-with-acknowledged-state",
        4,
    ),
    "an abort of a checkpoint not pending": (
        [_started(), _abort(3, Reason.CHECKPOINT_DECLINED)],
        "abort-only-pending",
        1,
    ),
    "a subsumed savepoint": (
        [_started(), _trigger(1, kind=CheckpointKind.SAVEPOINT), _abort(1, Reason.CHECKPOINT_SUBSUMED)],
        "savepoint-never-subsumed",
        2,
    ),
    "a failure counted for a subsumed checkpoint": (
        [_started(), _trigger(1), _abort(1, Reason.CHECKPOINT_SUBSUMED, counted=True)],
        "failure-counted-by-rules",
        2,
    ),
    "a threshold exceeded too early": (
        [
            _started(tolerable=1),
            _trigger(1),
            _abort(1, Reason.CHECKPOINT_EXPIRED, counted=True),
            CheckpointFailureThresholdExceeded("job", 1, 40, 1, 1, Reason.CHECKPOINT_EXPIRED),
        ],
        "threshold-only-when-exceeded",
        3,
    ),
    "a restart that leaves a checkpoint pending": (
        [_started(), _trigger(1), SchedulerStopped("job", 2, 50, JobStatus.RESTARTING)],
        "scheduler-change-after-aborts",
        2,
    ),
}


class TestInvariantsCanFail:
    @pytest.mark.parametrize("case", BAD_JOURNALS)
    def test_bad_journal_breaks_its_rule(self, case: str) -> None:
        """A hand-built bad journal breaks exactly the rule it was built to break, at the bad event."""
        journal, rule, index = BAD_JOURNALS[case]
        found = first_violation(journal)

        assert found is not None
        assert (rule, index, "job") == (found.rule, found.index, found.job_id)
        assert [found] == [v for v in violations(journal) if v.rule == rule]

    def test_a_trigger_left_pending_by_a_stopped_job_is_unresolved(self) -> None:
        """At the journal's end, a checkpoint still pending though its job stopped is reported."""
        journal: list[JournalEvent] = [
            _started(),
            _trigger(1),
            SchedulerStopped("job", 1, 50, JobStatus.FAILED),
        ]

        assert ["scheduler-change-after-aborts", "trigger-ends-resolved"] == [
            v.rule for v in violations(journal)
        ]
        assert Violation(1, "job", "trigger-ends-resolved", "") == _without_message(
            list(violations(journal))[-1]
        )

    def test_a_good_journal_breaks_nothing(self) -> None:
        """A trigger, both acks and the completion keep every rule."""
        journal = [_started(), _trigger(1), _ack(1, "a"), _ack(1, "b"), _completion(1)]

        assert None is first_violation(journal)

    def test_starting_states_are_respected(self) -> None:
        """Checking from a folded state knows what was pending and which ids were used."""
        start = fold_jobs([_started(), _trigger(1), _ack(1, "a")])

        assert None is first_violation([_ack(1, "b"), _completion(1)], start)
        assert "ids-strictly-increase" == _rule(first_violation([_trigger(1)], start))
        assert "ack-not-duplicate" == _rule(first_violation([_ack(1, "a")], start))

    @PROPERTY
    @given(scenarios())
    def test_dropping_an_accepted_ack_is_caught(self, scenario: Scenario) -> None:
        """Dropping an ack that led to a completion from a decided journal breaks a completion rule."""
        journal = scenario.journal
        completed = {(e.job_id, e.checkpoint_id) for e in journal if isinstance(e, CheckpointCompleted)}
        for i, event in enumerate(journal):
            if isinstance(event, TaskAcknowledged) and (event.job_id, event.checkpoint_id) in completed:
                found = first_violation(journal[:i] + journal[i + 1 :])
                assert found is not None
                assert "complete-after-every-ack" == found.rule
                break


def _rule(violation: Violation | None) -> str | None:
    return violation.rule if violation else None


def _without_message(violation: Violation) -> Violation:
    return Violation(violation.index, violation.job_id, violation.rule, "")
