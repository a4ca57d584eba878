"""Every decision derived from admitted inputs fits the journal (docs/wire-format.md, "Bounds").

Hypothesis builds a job as large as the journal admits (its RUNNING status's records within the
limit less ``TRIGGER_HEADROOM``, as the runtime checks) and sends it hostile inputs at every bound:
request ids and savepoint targets of the largest size admitted, errors and decline messages of
nearly a megabyte, tasks that stop, checkpoints that expire, stops and cancels. Every record every
decision writes, encoded as the coordinator encodes it, must fit Apache Kafka's default
``max.message.bytes``; the inputs themselves must fit their own topics.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from coordinator.core.admission import TRIGGER_HEADROOM
from coordinator.core.checks import InputRejected
from coordinator.core.commands import Command
from coordinator.core.decider import decide, fold
from coordinator.core.state import JobState, initial_state
from coordinator.core.testing import (
    ack,
    cancel,
    config,
    decline,
    job_status,
    request,
    running,
    stop,
    task_status,
    tick,
)
from events.wire.codec import encode
from events.wire.records import CheckpointKind, ExecutionState, JobStatus, SchedulerStarted
from events.wire.sizes import DEFAULT_MAX_MESSAGE_BYTES, record_size
from events.wire.validation import MAX_REQUEST_ID_BYTES, MAX_TARGET_BYTES

LIMIT = DEFAULT_MAX_MESSAGE_BYTES
HEADERS = (("cutline-epoch", b"9" * 18), ("cutline-cause", b"x" * 64))
"""The largest headers the runtime puts on a journal record."""
ROOT = "file:///savepoints"
JOB = "job-" + "j" * 200
HUGE_TEXT = "e" * 1_000_000
"""A message as long as an input record may carry."""

ACTIONS = st.lists(
    st.sampled_from(
        [
            "tick",
            "request",
            "savepoint",
            "stop",
            "cancel",
            "decline",
            "task-failed",
            "failing",
            "ack",
            "expire",
        ]
    ),
    min_size=1,
    max_size=12,
)


def _largest(length: int, tag: str) -> str:
    return (tag * length)[:length]


def _target() -> str:
    """A savepoint target of exactly ``MAX_TARGET_BYTES`` inside the root."""
    return ROOT + "/" + _largest(MAX_TARGET_BYTES - len(ROOT) - 1, "t")


def _request_id(n: int) -> str:
    return _largest(MAX_REQUEST_ID_BYTES - 4, "q") + f"{n:04d}"


def _commands(action: str, n: int, now: int, state: JobState) -> list[Command]:
    """What ``action`` means now: the n-th hostile input at its bound (half the tasks finishing:
    one status each)."""
    if action == "half-finished":
        half = state.tasks[: len(state.tasks) // 2]
        return [task_status(t, ExecutionState.FINISHED, job_id=JOB, at=now) for t in half]
    return [_command(action, n, now, state)]


def _command(action: str, n: int, now: int, state: JobState) -> Command:
    pending = min(state.pending, default=max(1, state.next_checkpoint_id - 1))
    first_task = state.tasks[0] if state.tasks else "t"
    match action:
        case "tick":
            return tick(now, job_id=JOB)
        case "expire":
            return tick(now + 60_000, job_id=JOB)
        case "request":
            return request(job_id=JOB, request_id=_request_id(n), at=now)
        case "savepoint":
            return request(
                CheckpointKind.SAVEPOINT,
                job_id=JOB,
                request_id=_request_id(n),
                target=_target(),
                savepoint_roots=(ROOT,),
                at=now,
            )
        case "stop":
            return stop(
                job_id=JOB, request_id=_request_id(n), target=_target(), savepoint_roots=(ROOT,), at=now
            )
        case "cancel":
            return cancel(job_id=JOB, request_id=_request_id(n), at=now)
        case "decline":
            return decline(pending, first_task, job_id=JOB, at=now, message=HUGE_TEXT)
        case "task-failed":
            return task_status(first_task, ExecutionState.FAILED, job_id=JOB, at=now)
        case "failing":
            return job_status(JobStatus.FAILING, job_id=JOB, error=HUGE_TEXT, at=now)
        case _:
            return ack(pending, state.tasks[-1] if state.tasks else "t", job_id=JOB, at=now)


def _fits(record: object) -> int:
    return record_size(JOB.encode(), encode(record), HEADERS)  # type: ignore[arg-type]


@settings(
    max_examples=200 if os.environ.get("CUTLINE_PROPERTY_PROFILE") == "thorough" else 15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@example(tasks=100_000, fill=1.0, actions=["tick", "expire"])
@example(tasks=100_000, fill=1.0, actions=["half-finished", "tick"])
@example(tasks=2, fill=1.0, actions=["tick", "request", "failing", "stop"])
@given(
    tasks=st.sampled_from([2, 40, 20_000, 100_000]),
    fill=st.floats(0.5, 1.0),
    actions=ACTIONS,
)
def test_every_decision_from_inputs_at_their_bounds_fits_the_journal(
    tasks: int, fill: float, actions: list[str]
) -> None:
    """A job whose RUNNING status fills the journal's budget up to ``fill``, then hostile inputs at
    their bounds: no decision writes a record over the limit."""
    budget = LIMIT - TRIGGER_HEADROOM
    id_length = max(7, int(fill * (budget - 4_000) / tasks) - 1)
    task_ids = tuple(f"{i:06d}-" + "x" * max(0, id_length - 7) for i in range(tasks))
    cfg = config(interval_ms=1000, location="file:///data/" + "l" * 3000, max_concurrent=1)
    state = initial_state(JOB)
    started = decide(state, running(job_id=JOB, tasks=task_ids, cfg=cfg, at=0))
    assume(all(_fits(e) <= budget for e in started if isinstance(e, SchedulerStarted)))
    state = fold(started, state)

    now, oversized = 0, []
    for n, action in enumerate(actions):
        now += 700
        for command in _commands(action, n, now, state):
            decisions = decide(state, command)
            for decision in decisions:
                if isinstance(decision, InputRejected):
                    continue
                size = _fits(decision)
                if size > LIMIT:
                    oversized.append((action, type(decision).__name__, size))
            state = fold(decisions, state)

    assert [] == oversized
