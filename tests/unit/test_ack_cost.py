"""The work of one ack does not grow with the job's tasks (docs/design.md, "Performance targets"), counted
in bytes, not time.

Copying a map of n acks allocates memory in proportion to n, so the most memory that handling
one ack has allocated at any moment (``tracemalloc``'s peak) shows such a copy in a way a
clock never does reliably on a shared machine. ``bench/bench_ack_cost.py`` measures the time.
"""

from __future__ import annotations

import random
import statistics
import tracemalloc

from coordinator.core.decider import fold
from coordinator.service.runtime import Coordinator
from events.wire.codec import encode
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointConfig,
    CheckpointKind,
    CheckpointRequested,
    CheckpointTriggered,
    JobStatus,
    JobStatusChanged,
    StateHandle,
    TaskAcknowledged,
)
from events.wire.topics import Topics

TOPICS = Topics("t.")
JOB = "job"
MEASURED = 40
"""Acks measured per job: the last ones before the checkpoint completes, when the acks map is
fullest (the completing ack itself does O(tasks) work once per checkpoint)."""


def ack(triggered: CheckpointTriggered, task_id: str, index: int) -> CheckpointAcknowledged:
    return CheckpointAcknowledged(
        job_id=JOB,
        checkpoint_id=triggered.checkpoint_id,
        attempt=1,
        task_id=task_id,
        timestamp_ms=2,
        state=StateHandle(f"{triggered.location}/{task_id}", 1024, "0" * 64),
        offsets={f"input:{index}": 100},
    )


def peak_bytes_per_ack(tasks: int) -> float:
    """Median peak of bytes allocated while ``Coordinator.handle`` decides one ack of a job of ``tasks``.

    Two checkpoints are pending; every task but the last ``MEASURED + 1`` has acknowledged the
    first. Those earlier acks are folded into the state directly (what ``handle`` would leave,
    minus the statistics), so that building a large job takes no longer than a small one.
    """
    core = Coordinator(TOPICS, rng=random.Random(1))
    task_ids = [f"task-{i:05d}" for i in range(tasks)]
    config = CheckpointConfig(interval_ms=0, location="file:///ckpt", max_concurrent=2)
    running = JobStatusChanged(JOB, JobStatus.RUNNING, 0, 1, tuple(task_ids), config)
    core.handle(TOPICS.job_status, 0, 0, JOB.encode(), encode(running), 0)
    triggered: list[CheckpointTriggered] = []
    for i in range(2):
        request = CheckpointRequested(JOB, CheckpointKind.CHECKPOINT, 1, f"r{i}")
        outcome = core.handle(TOPICS.requests, 0, i, JOB.encode(), encode(request), 1)
        triggered += [e for e in outcome.journal if isinstance(e, CheckpointTriggered)]
    first = triggered[0]
    done = tasks - MEASURED - 1
    core.states[JOB] = fold(
        (TaskAcknowledged(JOB, first.checkpoint_id, 1, t, 2) for t in task_ids[:done]), core.states[JOB]
    )
    values = [encode(ack(first, task_ids[i], i)) for i in range(done, tasks - 1)]
    core.handle(TOPICS.acks, 0, 0, JOB.encode(), values[0], 2)  # anything remembered is built now

    peaks = []
    tracemalloc.start()
    try:
        for offset, value in enumerate(values[1:], start=1):
            tracemalloc.reset_peak()
            before, _ = tracemalloc.get_traced_memory()
            outcome = core.handle(TOPICS.acks, 0, offset, JOB.encode(), value, 2)
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
            assert [TaskAcknowledged] == [type(e) for e in outcome.journal]
    finally:
        tracemalloc.stop()
    # the median: tracemalloc counts every thread, and a test run may leave threads that allocate now
    # and then (a Spark session's py4j threads, a journal follower): a mean would count them in
    return statistics.median(peaks)


class TestAckCost:
    def test_memory_allocated_per_ack_does_not_grow_with_tasks(self) -> None:
        """An ack of a 10,000-task job allocates about what one of a 50-task job does.

        The acks map used to be copied per ack: about 200 KB for an ack at 10,000 tasks
        against 6 KB at 50. A persistent map copies O(log n) of it.
        """
        small, large = peak_bytes_per_ack(MEASURED + 10), peak_bytes_per_ack(10_000)

        assert large < 1.5 * small, f"{large:,.0f} bytes per ack at 10,000 tasks, {small:,.0f} at 50"
