"""Realistic coordinator traffic, decided by the real decider: journals for tests and benchmarks.

A small discrete-event simulation of ``jobs`` RUNNING jobs (2-8 tasks each):
the shell's timer ticks when :func:`~coordinator.core.decider.due_at` says so, tasks
acknowledge every barrier after a random latency, and now and then a task
declines, a task never answers (the checkpoint expires), a task fails (the job
restarts with a new attempt and restores its latest checkpoint), the failure
threshold is exceeded (the job fails over), a driver dies without a word (its
heartbeats stop, the coordinator fails the job and the restart strategy
restarts it, as ``cutline run`` would, or gives up until an operator submits the
job again), or an operator asks for a manual checkpoint or a savepoint.

Everything random comes from the :class:`random.Random` passed in, and time is
simulated, so one seed always gives the same journal. The generators never
end on their own: take what you need with :func:`itertools.islice`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from random import Random

from coordinator.core.commands import (
    AcknowledgeCheckpoint,
    ChangeJobStatus,
    ChangeTaskStatus,
    Command,
    DeclineCheckpoint,
    RecordHeartbeat,
    RequestCheckpoint,
    Tick,
)
from coordinator.core.decider import Decision, InputRejected, decide, due_at, evolve
from coordinator.core.state import JobState, initial_state
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointConfig,
    CheckpointDeclined,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointRequested,
    CheckpointTriggered,
    ExecutionState,
    JobFailedPermanently,
    JobHeartbeat,
    JobRestartScheduled,
    JobStatus,
    JobStatusChanged,
    JournalEvent,
    RestartStrategy,
    RestartStrategyKind,
    StateHandle,
    TaskStatusChanged,
)

__all__ = ["START_MS", "Rates", "HandledCommand", "simulate", "simulate_steps"]

START_MS = int(datetime(2026, 11, 22, 9, 0, tzinfo=UTC).timestamp() * 1000)
"""Where simulated time starts: 2026-11-22T09:00:00Z."""

CHECKPOINT_ROOT = "file:///tmp/cutline/checkpoints"
SAVEPOINT_ROOT = "file:///tmp/cutline/savepoints"


@dataclass(frozen=True, slots=True)
class Rates:
    """How often things go wrong: probabilities per checkpoint, mean times in simulated ms."""

    decline: float = 0.01
    """A task declines the checkpoint (CHECKPOINT_DECLINED)."""
    stuck: float = 0.005
    """A task never acknowledges: the checkpoint expires (CHECKPOINT_EXPIRED)."""
    task_failure: float = 0.002
    """A task fails while the checkpoint is in flight: TASK_FAILURE, then the job restarts."""
    driver_crash: float = 0.002
    """The job's driver dies silently: no more heartbeats or acks of that attempt."""
    resubmit_after_ms: int = 5_000
    """An operator submits a job the restart strategy gave up on again after this long."""
    savepoint_every_ms: float = 120_000
    manual_every_ms: float = 45_000


@dataclass(frozen=True, slots=True)
class HandledCommand:
    """One command the coordinator handled and what it decided."""

    command: Command
    decisions: list[Decision]


class _Job:
    """What the simulated job driver and its tasks know about one job."""

    __slots__ = ("alive", "attempt", "config", "job_id", "restarting", "state", "tasks", "tick_at", "topic")

    def __init__(self, job_id: str, tasks: tuple[str, ...], config: CheckpointConfig) -> None:
        self.job_id = job_id
        self.tasks = tasks
        self.config = config
        self.topic = f"{job_id}-input"
        self.attempt = 1
        self.state: JobState = initial_state(job_id)
        self.tick_at: int | None = None
        self.restarting = False
        self.alive = True
        """The driver of ``attempt`` runs: it sends heartbeats and its tasks answer barriers."""


class _Simulation:
    __slots__ = ("heap", "jobs", "now", "rates", "rng", "seq")

    def __init__(self, rng: Random, jobs: int, start_ms: int, rates: Rates) -> None:
        self.rng = rng
        self.rates = rates
        self.now = start_ms
        self.seq = itertools.count()
        self.heap: list[tuple[int, int, Command]] = []
        self.jobs: dict[str, _Job] = {}
        for i in range(jobs):
            job = self._new_job(f"job-{i}")
            self.jobs[job.job_id] = job
            self._running(job, start_ms + rng.randint(0, 50))
            self._request(job, CheckpointKind.SAVEPOINT, start_ms)
            self._request(job, CheckpointKind.CHECKPOINT, start_ms)

    def _new_job(self, job_id: str) -> _Job:
        rng = self.rng
        interval = rng.choice((200, 500, 1000))
        config = CheckpointConfig(
            interval_ms=interval,
            location=CHECKPOINT_ROOT,
            timeout_ms=rng.choice((2_000, 5_000, 10_000)),
            min_pause_ms=rng.choice((0, 0, 50, interval // 2)),
            max_concurrent=rng.choice((1, 1, 2)),
            tolerable_failures=rng.choice((0, 1, 3)),
            retained=rng.choice((1, 2, 3)),
            heartbeat_interval_ms=1_000,
            heartbeat_timeout_ms=rng.choice((3_000, 5_000)),
            restart_strategy=rng.choice(
                (
                    RestartStrategy(),
                    RestartStrategy(),
                    RestartStrategy(RestartStrategyKind.FIXED_DELAY, attempts=3, delay_ms=500),
                    RestartStrategy(RestartStrategyKind.FAILURE_RATE, max_failures_per_interval=2),
                    RestartStrategy(RestartStrategyKind.NONE),
                )
            ),
        )
        tasks = tuple(f"t{n}" for n in range(rng.randint(2, 8)))
        return _Job(job_id, tasks, config)

    # ---------------------------------------------------------------- scheduling

    def _at(self, time_ms: int, command: Command) -> None:
        heapq.heappush(self.heap, (time_ms, next(self.seq), command))

    def _running(self, job: _Job, at: int) -> None:
        latest = job.state.latest_completed
        changed = JobStatusChanged(
            job_id=job.job_id,
            status=JobStatus.RUNNING,
            timestamp_ms=at,
            attempt=job.attempt,
            tasks=job.tasks,
            config=job.config,
            restored_checkpoint_id=latest.checkpoint_id if latest else None,
            restored_location=latest.location if latest else None,
        )
        self._at(at, ChangeJobStatus(changed, now_ms=at, jitter=self.rng.random()))

    def _restart(self, job: _Job, status: JobStatus, error: str) -> None:
        """The job driver fails over: a non-RUNNING status now, a new attempt RUNNING soon (it
        restarts itself after RESTARTING; after FAILING the restart strategy decides)."""
        if job.restarting:
            return
        job.restarting = True
        at = self.now + self.rng.randint(1, 20)
        changed = JobStatusChanged(job.job_id, status, at, job.attempt, error=error)
        self._at(at, ChangeJobStatus(changed, now_ms=at))
        if status is not JobStatus.FAILING:
            job.attempt += 1
            self._running(job, at + self.rng.randint(100, 2_000))

    def _heartbeat(self, job: _Job, attempt: int, at: int) -> None:
        """The driver of ``attempt`` says it is alive at ``at`` (the next one follows if it still is)."""
        self._at(at, RecordHeartbeat(JobHeartbeat(job.job_id, attempt, at), now_ms=at))

    def _start_attempt(self, job: _Job, attempt: int, at: int) -> None:
        """A supervisor (``cutline run``, or an operator) starts ``attempt`` of the job at ``at``."""
        job.attempt, job.restarting = attempt, True
        self._running(job, at)

    def _request(self, job: _Job, kind: CheckpointKind, after: int) -> None:
        """An operator asks for a savepoint or a manual checkpoint, some time after ``after``."""
        savepoint = kind is CheckpointKind.SAVEPOINT
        mean = self.rates.savepoint_every_ms if savepoint else self.rates.manual_every_ms
        at = after + 1 + int(self.rng.expovariate(1 / mean))
        request = CheckpointRequested(
            job.job_id,
            kind,
            timestamp_ms=at,
            request_id=f"{'sp' if savepoint else 'req'}-{next(self.seq)}",
            target=f"{SAVEPOINT_ROOT}/{job.job_id}" if savepoint else None,
        )
        self._at(at, RequestCheckpoint(request, now_ms=at))

    # ------------------------------------------------------------------ reactions

    def _barrier(self, job: _Job, triggered: CheckpointTriggered) -> None:
        """The tasks got the barrier: each acknowledges after a while, or misbehaves."""
        rng, rates = self.rng, self.rates
        now = triggered.timestamp_ms
        odd_task = rng.choice(triggered.tasks)
        roll = rng.random()
        if job.alive and rng.random() < rates.driver_crash:
            job.alive = False  # silently: the coordinator learns it from the missing heartbeats
        for task_id in triggered.tasks:
            at = now + 2 + int(rng.expovariate(1 / 15))
            if task_id == odd_task and roll < rates.decline:
                declined = CheckpointDeclined(
                    job.job_id,
                    triggered.checkpoint_id,
                    triggered.attempt,
                    task_id,
                    at,
                    "TASK_CHECKPOINT_FAILURE",
                    rng.choice(("snapshot write failed: disk full", "state backend timeout")),
                )
                self._at(at, DeclineCheckpoint(declined, now_ms=at))
                continue
            if task_id == odd_task and roll < rates.decline + rates.stuck:
                continue  # the task hangs: the checkpoint will expire
            if not job.alive:
                continue  # the driver died: nothing of its attempt answers
            if task_id == odd_task and roll < rates.decline + rates.stuck + rates.task_failure:
                failed = TaskStatusChanged(
                    job.job_id,
                    task_id,
                    triggered.attempt,
                    ExecutionState.FAILED,
                    at,
                    error=rng.choice(("java.lang.OutOfMemoryError", "KafkaException: broker unavailable")),
                )
                self._at(at, ChangeTaskStatus(failed, now_ms=at))
                continue
            partition = int(task_id[1:])
            handle = StateHandle(
                uri=f"{triggered.location}/{task_id}.state",
                size_bytes=rng.randint(1_000, 4_000_000),
                sha256=f"{rng.getrandbits(256):064x}",
            )
            ack = CheckpointAcknowledged(
                job_id=job.job_id,
                checkpoint_id=triggered.checkpoint_id,
                attempt=triggered.attempt,
                task_id=task_id,
                timestamp_ms=at,
                state=handle,
                offsets={f"{job.topic}:{partition}": (at - START_MS) // 3 + partition},
                metrics={"sync_ms": rng.randint(0, 5), "async_ms": at - now},
            )
            self._at(at, AcknowledgeCheckpoint(ack, now_ms=at))

    def _react(self, job: _Job, events: list[JournalEvent]) -> None:
        for event in events:
            if isinstance(event, CheckpointTriggered):
                self._barrier(job, event)
            elif isinstance(event, CheckpointFailureThresholdExceeded):
                self._restart(job, JobStatus.FAILING, f"checkpoint failure threshold: {event.reason}")
            elif isinstance(event, JobRestartScheduled):
                self._start_attempt(job, event.attempt, event.restart_at_ms)
            elif isinstance(event, JobFailedPermanently):
                self._start_attempt(job, event.attempt + 1, event.timestamp_ms + self.rates.resubmit_after_ms)

    def _after(self, job: _Job, command: Command) -> None:
        """Follow-ups of a handled command: restarts, the next operator request, the timer."""
        match command:
            case ChangeTaskStatus() if command.changed.status is ExecutionState.FAILED:
                self._restart(job, JobStatus.RESTARTING, f"task {command.changed.task_id} failed")
            case ChangeJobStatus() if command.changed.status is JobStatus.RUNNING:
                job.restarting, job.alive = False, True
                self._heartbeat(job, command.changed.attempt, command.now_ms + 1)
            case RecordHeartbeat() if job.alive and command.heartbeat.attempt == job.attempt:
                self._heartbeat(job, job.attempt, command.now_ms + job.config.heartbeat_interval_ms)
            case RequestCheckpoint():
                self._request(job, command.request.kind, command.now_ms)
            case _:
                pass
        due = due_at(job.state)
        if due is not None and due != job.tick_at:
            job.tick_at = due
            at = max(due, self.now)
            self._at(at, Tick(job.job_id, at, jitter=self.rng.random()))

    # ----------------------------------------------------------------------- run

    def steps(self) -> Iterator[HandledCommand]:
        heap, jobs = self.heap, self.jobs
        while heap:
            now, _, command = heapq.heappop(heap)
            self.now = now
            job = jobs[command.job_id]
            if isinstance(command, Tick):
                if job.tick_at is None or job.tick_at > now:
                    continue  # superseded by an earlier tick
                job.tick_at = None
            decisions = decide(job.state, command)
            state = job.state
            events: list[JournalEvent] = []
            for decision in decisions:
                if not isinstance(decision, InputRejected):
                    events.append(decision)
                    state = evolve(state, decision)
            job.state = state
            self._react(job, events)
            self._after(job, command)
            yield HandledCommand(command, decisions)


def simulate_steps(
    rng: Random, *, jobs: int = 4, start_ms: int = START_MS, rates: Rates | None = None
) -> Iterator[HandledCommand]:
    """Every command the simulated coordinator handles, with its decisions (rejections included)."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    return _Simulation(rng, jobs, start_ms, rates or Rates()).steps()


def simulate(
    rng: Random, *, jobs: int = 4, start_ms: int = START_MS, rates: Rates | None = None
) -> Iterator[JournalEvent]:
    """The journal of the simulated coordinator, event by event (endless: slice it)."""
    for step in simulate_steps(rng, jobs=jobs, start_ms=start_ms, rates=rates):
        for decision in step.decisions:
            if not isinstance(decision, InputRejected):
                yield decision
