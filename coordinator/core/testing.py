"""Given/when/then for the decider, and builders for commands: public, so every test suite
(decider, shell, Spark tasks) writes scenarios the same way.

    given(started("job", tasks=("a", "b"))).when(ack("job", 1, "a", at=5)).then(TaskAcknowledged(...))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, is_dataclass

from coordinator.core.commands import (
    AcknowledgeCheckpoint,
    CancelJob,
    ChangeJobStatus,
    ChangeTaskStatus,
    Command,
    DeclineCheckpoint,
    RecordHeartbeat,
    RequestCheckpoint,
    StopJob,
    Tick,
)
from coordinator.core.decider import Decision, InputRejected, Rejection, decide, fold
from coordinator.core.state import JobState, initial_state
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointConfig,
    CheckpointDeclined,
    CheckpointKind,
    CheckpointRequested,
    ExecutionState,
    JobCancelRequested,
    JobHeartbeat,
    JobStatus,
    JobStatusChanged,
    JobStopRequested,
    StateHandle,
    TaskStatusChanged,
)

JOB = "job-1"
LOCATION = "file:///tmp/cutline-checkpoints"


def config(**overrides: object) -> CheckpointConfig:
    """A checkpoint config: interval 1 s, timeout 10 s, the rest Flink's defaults."""
    values: dict[str, object] = {"interval_ms": 1000, "location": LOCATION, "timeout_ms": 10_000}
    values.update(overrides)
    return CheckpointConfig(**values)  # type: ignore[arg-type]


# ----------------------------------------------------------------- commands


def job_status(
    status: JobStatus,
    *,
    job_id: str = JOB,
    tasks: Iterable[str] = ("t0", "t1"),
    cfg: CheckpointConfig | None = None,
    attempt: int = 1,
    at: int = 0,
    jitter: float = 0.0,
    restored_from: int | None = None,
    error: str | None = None,
) -> ChangeJobStatus:
    """Report a job status (RUNNING gets the default config unless given one)."""
    if status is JobStatus.RUNNING and cfg is None:
        cfg = config()
    return ChangeJobStatus(
        JobStatusChanged(
            job_id=job_id,
            status=status,
            timestamp_ms=at,
            attempt=attempt,
            tasks=tuple(tasks),
            config=cfg,
            error=error,
            restored_checkpoint_id=restored_from,
        ),
        now_ms=at,
        jitter=jitter,
    )


def running(**kwargs: object) -> ChangeJobStatus:
    """Report the job RUNNING."""
    return job_status(JobStatus.RUNNING, **kwargs)  # type: ignore[arg-type]


def task_status(
    task_id: str, status: ExecutionState, *, job_id: str = JOB, attempt: int = 1, at: int = 0
) -> ChangeTaskStatus:
    return ChangeTaskStatus(TaskStatusChanged(job_id, task_id, attempt, status, timestamp_ms=at), now_ms=at)


def request(
    kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    *,
    job_id: str = JOB,
    request_id: str = "r1",
    target: str | None = None,
    at: int = 0,
    savepoint_roots: tuple[str, ...] = (),
) -> RequestCheckpoint:
    return RequestCheckpoint(
        CheckpointRequested(job_id, kind, timestamp_ms=at, request_id=request_id, target=target),
        now_ms=at,
        savepoint_roots=savepoint_roots,
    )


def stop(
    *,
    job_id: str = JOB,
    request_id: str = "stop-1",
    target: str | None = None,
    drain: bool = False,
    at: int = 0,
    savepoint_roots: tuple[str, ...] = (),
) -> StopJob:
    """Ask to stop the job with a savepoint (``cutline stop``)."""
    return StopJob(
        JobStopRequested(job_id, at, request_id, target, drain), now_ms=at, savepoint_roots=savepoint_roots
    )


def cancel(*, job_id: str = JOB, request_id: str = "cancel-1", at: int = 0) -> CancelJob:
    """Ask to cancel the job (``cutline cancel``)."""
    return CancelJob(JobCancelRequested(job_id, at, request_id), now_ms=at)


def ack(
    checkpoint_id: int,
    task_id: str,
    *,
    job_id: str = JOB,
    attempt: int = 1,
    at: int = 0,
    state: StateHandle | None = None,
    offsets: Mapping[str, int] | None = None,
) -> AcknowledgeCheckpoint:
    return AcknowledgeCheckpoint(
        CheckpointAcknowledged(
            job_id=job_id,
            checkpoint_id=checkpoint_id,
            attempt=attempt,
            task_id=task_id,
            timestamp_ms=at,
            state=state,
            offsets=dict(offsets or {}),
        ),
        now_ms=at,
    )


def decline(
    checkpoint_id: int,
    task_id: str,
    *,
    job_id: str = JOB,
    attempt: int = 1,
    at: int = 0,
    reason: str = "TASK_CHECKPOINT_FAILURE",
    message: str = "disk full",
) -> DeclineCheckpoint:
    return DeclineCheckpoint(
        CheckpointDeclined(job_id, checkpoint_id, attempt, task_id, at, reason, message), now_ms=at
    )


def tick(at: int, *, job_id: str = JOB, jitter: float = 0.0) -> Tick:
    return Tick(job_id, at, jitter)


def heartbeat(*, job_id: str = JOB, attempt: int = 1, at: int = 0) -> RecordHeartbeat:
    """The job's driver of ``attempt`` is alive at ``at``."""
    return RecordHeartbeat(JobHeartbeat(job_id, attempt, at), now_ms=at)


# ------------------------------------------------------------ given/when/then


def run_commands(
    commands: Iterable[Command], state: JobState | None = None
) -> tuple[JobState, list[Decision]]:
    """Decide and evolve each command in turn; the final state and every decision."""
    decisions: list[Decision] = []
    for command in commands:
        if state is None:
            state = initial_state(command.job_id)
        events = decide(state, command)
        decisions.extend(events)
        state = fold(events, state)
    assert state is not None, "run_commands() needs at least one command or a state"
    return state, decisions


@dataclass(frozen=True)
class Given:
    """The state after some commands (decided and evolved, as the coordinator would)."""

    state: JobState

    def when(self, command: Command) -> When:
        return When(self.state, command, decide(self.state, command))


@dataclass(frozen=True)
class When:
    """One command decided in a given state."""

    before: JobState
    command: Command
    events: list[Decision]

    @property
    def state(self) -> JobState:
        """The state after the command's events."""
        return fold(self.events, self.before)

    def then(self, *expected: Decision) -> When:
        """Exactly these events, in this order."""
        assert list(expected) == self.events
        return self

    def then_nothing(self) -> When:
        """No event at all: the command was a no-op (idempotent, late or not due)."""
        assert self.events == []
        return self

    def then_rejected(self, reason: Rejection) -> InputRejected:
        """The input was refused (dead letters) and nothing else happened."""
        assert len(self.events) == 1, self.events
        (rejected,) = self.events
        assert isinstance(rejected, InputRejected), rejected
        assert reason == rejected.reason, rejected
        return rejected

    def then_types(self, *types: type) -> When:
        """Events of exactly these types, in this order."""
        assert list(types) == [type(e) for e in self.events], self.events
        return self


def given(*commands: Command, job_id: str = JOB) -> Given:
    """The state after ``commands``; ``given()`` is a job nothing is known about."""
    state, _ = run_commands(commands, initial_state(job_id))
    return Given(state)


# ------------------------------------------------------------ exact comparison


def differences(expected: object, actual: object, path: str = "") -> list[str]:
    """Where ``actual`` is not exactly ``expected``; ``[]`` when it is.

    Stricter than ``==``: types count (a list is not a tuple, a str is not an enum member
    of the same value, a dict is not another mapping) and so does the order of a mapping's
    keys (the decider iterates its mappings). Dataclasses, mappings and sequences are
    compared member by member, so each difference names its path. A dataclass field that takes
    no part in ``==`` (``compare=False``: the statistics' transient task rows) is not compared.
    """
    where = path or "."
    if type(expected) is not type(actual):
        return [f"{where}: {type(expected).__name__} {expected!r} != {type(actual).__name__} {actual!r}"]
    if is_dataclass(expected) and not isinstance(expected, type):
        return [
            d
            for f in fields(expected)
            if f.compare
            for d in differences(getattr(expected, f.name), getattr(actual, f.name), f"{path}.{f.name}")
        ]
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        if list(expected) != list(actual):
            return [f"{where}: keys {list(expected)!r} != {list(actual)!r}"]
        return [d for k in expected for d in differences(expected[k], actual[k], f"{path}[{k!r}]")]
    if isinstance(expected, tuple | list) and isinstance(actual, tuple | list):
        if len(expected) != len(actual):
            return [f"{where}: {len(expected)} items != {len(actual)} items"]
        return [
            d
            for i, (e, a) in enumerate(zip(expected, actual, strict=True))
            for d in differences(e, a, f"{path}[{i}]")
        ]
    return [] if expected == actual else [f"{where}: {expected!r} != {actual!r}"]
