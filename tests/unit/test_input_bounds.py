"""Every field of every input has a bound, and no admitted input wedges a job (issue 53).

Given/when/then over the decider: a field past its bound is refused where it is admitted
(``INVALID_REQUEST``, a dead letter), and every decision a tick, a status or an ack derives names a
bounded part of what it quotes, so that it always fits the journal. Savepoints of different jobs
never share a directory.
"""

from __future__ import annotations

from coordinator.core.checks import Rejection
from coordinator.core.decider import MAX_QUOTED_MESSAGE_CHARS, NAMED_TASKS, savepoint_name
from coordinator.core.snapshot import PartitionSnapshot, encode_snapshot
from coordinator.core.state import MAX_CONCURRENT_CHECKPOINTS, MAX_PENDING_SAVEPOINTS, MAX_QUEUED_REQUESTS
from coordinator.core.testing import (
    JOB,
    ack,
    cancel,
    config,
    given,
    job_status,
    request,
    running,
    stop,
    task_status,
    tick,
)
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointKind,
    CheckpointTriggered,
    ExecutionState,
    JobStatus,
    SchedulerStopped,
    TaskAcknowledged,
    TriggerRejected,
)
from events.wire.validation import MAX_REQUEST_ID_BYTES, MAX_TARGET_BYTES

SAVEPOINT = CheckpointKind.SAVEPOINT
ROOT = "file:///tmp"
NEAR_1_MB = "r" * 1_000_000
MESSAGE_BOUND = 4 * 1024 + 2 * 1024
"""Characters a decision's message may have at most, whatever its input quoted."""


def pending_checkpoint_1() -> tuple:  # type: ignore[type-arg]
    """A running job (max one checkpoint at a time) whose checkpoint 1 waits for t1's ack."""
    return (running(at=0), tick(1000), ack(1, "t0", at=1001))


class TestRequestIds:
    def test_a_near_1_mb_request_id_is_refused_where_it_is_admitted(self) -> None:
        """Checkpoint 1 is pending, so the request would queue; its id is refused instead: the
        trigger it would become, and every rejection quoting it, could not be journaled."""
        when = given(*pending_checkpoint_1()).when(request(request_id=NEAR_1_MB, at=1100))

        refused = when.then_rejected(Rejection.INVALID_REQUEST)
        assert f"at most {MAX_REQUEST_ID_BYTES}" in refused.message and len(refused.message) < 200
        assert when.state.queue == ()

    def test_the_job_keeps_checkpointing_and_can_be_canceled_after_the_refusal(self) -> None:
        """The refusal changed nothing: the pending checkpoint completes, the next one triggers,
        and a cancel stops the job."""
        refused = given(*pending_checkpoint_1(), request(request_id=NEAR_1_MB, at=1100))

        completed = refused.when(ack(1, "t1", at=1200)).then_types(TaskAcknowledged, CheckpointCompleted)
        after = given(*pending_checkpoint_1(), request(request_id=NEAR_1_MB, at=1100), ack(1, "t1", at=1200))
        after.when(tick(2000)).then_types(CheckpointTriggered)
        canceled = after.when(cancel(at=2100)).state

        assert isinstance(completed.events[-1], CheckpointCompleted)
        assert JobStatus.CANCELLING is canceled.status

    def test_an_id_at_the_bound_is_admitted(self) -> None:
        """The bound is in UTF-8 bytes: an id of exactly that many bytes queues as any other."""
        at_bound = "é" * (MAX_REQUEST_ID_BYTES // 2)

        when = given(*pending_checkpoint_1()).when(request(request_id=at_bound, at=1100))

        assert [at_bound] == [q.request_id for q in when.state.queue]

    def test_stop_and_cancel_with_oversized_ids_are_refused(self) -> None:
        """Stop and cancel quote their id in the aborts they decide: the same bound."""
        job = given(*pending_checkpoint_1())

        job.when(stop(request_id=NEAR_1_MB, at=1100)).then_rejected(Rejection.INVALID_REQUEST)
        job.when(cancel(request_id=NEAR_1_MB, at=1100)).then_rejected(Rejection.INVALID_REQUEST)


class TestTargets:
    def test_a_checkpoint_request_takes_no_target(self) -> None:
        """Only a savepoint goes to a target; a plain checkpoint's target would sit in the queue
        unused (and unbounded)."""
        when = given(running(at=0)).when(request(target=f"{ROOT}/x" * 100_000, at=5))

        refused = when.then_rejected(Rejection.INVALID_REQUEST)
        assert "takes no target" in refused.message and len(refused.message) < 1000

    def test_a_savepoint_target_over_its_bound_is_refused(self) -> None:
        target = f"{ROOT}/" + "d" * MAX_TARGET_BYTES

        when = given(running(at=0)).when(request(SAVEPOINT, target=target, savepoint_roots=(ROOT,), at=5))

        assert f"at most {MAX_TARGET_BYTES}" in when.then_rejected(Rejection.INVALID_REQUEST).message


class TestTickDecisionsOfLargeJobs:
    TASKS = tuple(f"task-{i:06d}" for i in range(60_000))

    def test_the_expiry_of_a_checkpoint_names_a_few_missing_tasks_and_counts_the_rest(self) -> None:
        """A checkpoint of 60,000 tasks expires with a message naming the first few missing ones:
        naming all of them made the abort 1.1 MB, over the journal's limit, so it never expired."""
        job = given(running(tasks=self.TASKS, cfg=config(timeout_ms=500), at=0), tick(1000))

        when = job.when(tick(1500))

        aborted = when.events[0]
        assert isinstance(aborted, CheckpointAborted) and aborted.checkpoint_id == 1
        assert len(aborted.message) < MESSAGE_BOUND
        assert "60000 tasks, the first 10: task-000000" in aborted.message
        assert 1 not in when.state.pending

    def test_a_periodic_rejection_names_a_few_tasks_that_are_not_running(self) -> None:
        """With 50,000 of its tasks FINISHED before the first trigger, the periodic rejection names
        ten of them and their count."""
        commands = [running(tasks=self.TASKS, at=0)]
        commands += [task_status(t, ExecutionState.FINISHED, at=10) for t in self.TASKS[:50_000]]

        when = given(*commands).when(tick(1000))

        (rejected,) = when.events
        assert isinstance(rejected, TriggerRejected)
        assert rejected.reason.name == "NOT_ALL_REQUIRED_TASKS_RUNNING"
        assert len(rejected.message) < MESSAGE_BOUND
        assert rejected.message.count(" is FINISHED") == NAMED_TASKS


class TestQuotedMessages:
    def test_a_failing_status_with_a_huge_error_is_decided_with_a_bounded_quote(self) -> None:
        """A FAILING status is never refused for its error's length: the decision quotes it cut,
        in the scheduler's stop and in the abort of the pending checkpoint alike."""
        huge = "x" * 1_000_000

        when = given(*pending_checkpoint_1()).when(job_status(JobStatus.FAILING, error=huge, at=1100))

        stopped = next(e for e in when.events if isinstance(e, SchedulerStopped))
        aborted = next(e for e in when.events if isinstance(e, CheckpointAborted))
        assert stopped.error is not None and len(stopped.error) < MAX_QUOTED_MESSAGE_CHARS + 100
        assert len(aborted.message) < MESSAGE_BOUND


class TestSavepointDirectories:
    def test_two_jobs_saving_into_one_target_with_equal_ids_get_their_own_directories(self) -> None:
        """Flink's savepoint-<jobid>-<random>: equal ids, one target, two directories."""
        roots = (ROOT,)
        first = given(running(at=0, job_id="orders"), job_id="orders").when(
            request(SAVEPOINT, job_id="orders", target=f"{ROOT}/sp", savepoint_roots=roots, at=5)
        )
        second = given(running(at=0, job_id="payments"), job_id="payments").when(
            request(SAVEPOINT, job_id="payments", target=f"{ROOT}/sp", savepoint_roots=roots, at=5)
        )

        (a,), (b,) = first.events, second.events
        assert isinstance(a, CheckpointTriggered) and isinstance(b, CheckpointTriggered)
        assert (1, 1) == (a.checkpoint_id, b.checkpoint_id)
        assert a.location != b.location
        assert a.location.startswith(f"{ROOT}/sp/savepoint-orders-1-")
        assert b.location.startswith(f"{ROOT}/sp/savepoint-payments-1-")

    def test_a_job_id_run_again_gets_a_new_directory_for_the_same_id(self) -> None:
        """The digest covers attempt and time too: a job id reused later never overwrites."""
        assert savepoint_name(JOB, 1, 1, 5) != savepoint_name(JOB, 1, 1, 6)
        assert savepoint_name(JOB, 1, 1, 5) != savepoint_name(JOB, 1, 2, 5)

    def test_the_name_keeps_only_safe_characters_of_the_job_id(self) -> None:
        """``zürich orders/1`` cannot put a space, a slash or a non-ASCII letter in a directory name;
        jobs that differ only there still get different names."""
        name = savepoint_name("zürich orders/1", 3, 1, 5)
        other = savepoint_name("z_rich_orders_1", 3, 1, 5)

        assert name.startswith("savepoint-z_rich_orders_1-3-") and name != other
        assert name.isascii() and " " not in name and "/" not in name


class TestTheJobsStateInTheSnapshot:
    def test_savepoints_past_the_bound_are_rejected(self) -> None:
        """Savepoints skip max_concurrent; the 17th pending one is a journaled rejection, so that
        savepoint requests cannot grow the job's pending state without bound."""
        requests = [
            request(SAVEPOINT, request_id=f"sp{i}", target=f"{ROOT}/sp", savepoint_roots=(ROOT,), at=5 + i)
            for i in range(MAX_PENDING_SAVEPOINTS)
        ]
        job = given(running(cfg=config(interval_ms=0), at=0), *requests)
        assert MAX_PENDING_SAVEPOINTS == job.state.pending_savepoints

        (rejected,) = job.when(
            request(SAVEPOINT, request_id="one-more", target=f"{ROOT}/sp", savepoint_roots=(ROOT,), at=100)
        ).events

        assert isinstance(rejected, TriggerRejected)
        assert rejected.reason.name == "TOO_MANY_CHECKPOINT_REQUESTS" and rejected.request_id == "one-more"

    def test_max_concurrent_has_a_bound(self) -> None:
        refused = given().when(running(cfg=config(max_concurrent=MAX_CONCURRENT_CHECKPOINTS + 1), at=0))

        assert (
            f"between 1 and {MAX_CONCURRENT_CHECKPOINTS}"
            in refused.then_rejected(Rejection.INVALID_CONFIG).message
        )

    def test_a_job_at_every_request_bound_fits_its_partition_snapshot_many_times_over(self) -> None:
        """A full queue of ids at their bound and every savepoint pending with a target at its bound:
        the job's state in the partition snapshot stays a few hundred KB (70 queued requests with
        1 MB targets once made a 72.8 MB snapshot, over the 64 MB limit)."""
        target = f"{ROOT}/" + "t" * (MAX_TARGET_BYTES - len(ROOT) - 1)
        commands = [running(cfg=config(max_concurrent=1), at=0), tick(1000)]
        commands += [
            request(
                SAVEPOINT, request_id="s" * 250 + f"{i:06d}", target=target, savepoint_roots=(ROOT,), at=1001
            )
            for i in range(MAX_PENDING_SAVEPOINTS)
        ]
        commands += [request(request_id="q" * 250 + f"{i:06d}", at=1002) for i in range(MAX_QUEUED_REQUESTS)]
        state = given(*commands).state
        assert (MAX_QUEUED_REQUESTS, MAX_PENDING_SAVEPOINTS) == (len(state.queue), state.pending_savepoints)

        snapshot = PartitionSnapshot(
            partition=0, epoch=1, journal_offset=0, positions={}, trigger_epochs={},
            states={JOB: state}, stats={}, timestamp_ms=0,
        )  # fmt: skip
        size = len(encode_snapshot(snapshot))

        assert size < 600_000
