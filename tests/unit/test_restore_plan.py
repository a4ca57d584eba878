"""Restores that refuse what they cannot restore exactly (spark_tasks/restore.py): the rules as
given (a checkpoint, its manifests, the job) / when (plan the restore) / then (what comes back, or
why not)."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from events.task.manifest import Manifest, Piece, StepIdentity
from events.wire.records import CheckpointCompleted, CheckpointKind, StateHandle
from spark_tasks.restore import (
    SHOWN,
    JobShape,
    LeftBehind,
    Refusal,
    Refused,
    RestorePlan,
    owner_problem,
    plan_restore,
    refusal_message,
    restore_step,
)

TOPIC = "words"
PARTITIONS = ((TOPIC, 0), (TOPIC, 1))
LOCATION = "file:///checkpoints/wc/chk-7"
COUNTS = StepIdentity("counts", "app.words_of")


def handle(task: str) -> StateHandle:
    return StateHandle(f"{LOCATION}/{task}", 10, "0" * 64)


def checkpoint(
    tasks: list[str], offsets: Mapping[str, int] | None = None, checkpoint_id: int = 7
) -> CheckpointCompleted:
    """A completed checkpoint with a handle for each of ``tasks`` and ``offsets`` (default: both
    partitions of ``words``)."""
    return CheckpointCompleted(
        job_id="wc",
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.SAVEPOINT,
        timestamp_ms=0,
        duration_ms=0,
        handles={task: handle(task) for task in tasks},
        size_bytes=0,
        offsets={f"{TOPIC}:0": 40, f"{TOPIC}:1": 60} if offsets is None else offsets,
        location=LOCATION,
    )


def manifests(
    parallelism: int,
    *,
    max_parallelism: int = 128,
    step: StepIdentity | None = COUNTS,
    skip: int | None = None,
) -> dict[str, Manifest]:
    """The manifests of ``parallelism`` shuffle partitions (but ``skip``), each owning its key groups."""
    out = {}
    for i in range(parallelism):
        start = (i * max_parallelism + parallelism - 1) // parallelism
        stop = ((i + 1) * max_parallelism - 1) // parallelism + 1
        piece = Piece(f"{LOCATION}/keyed-{i}.full", 1, "0" * 64, "full", 1)
        if i != skip:
            out[f"keyed-{i}"] = Manifest(f"keyed-{i}", max_parallelism, range(start, stop), 3, (piece,), step)
    return out


def keyed_job(parallelism: int = 3, *, allow: bool = False) -> JobShape:
    return JobShape(PARTITIONS, parallelism, 128, allow)


def partition_job(*, allow: bool = False) -> JobShape:
    return JobShape(PARTITIONS, None, 128, allow)


class TestKeyedCoverage:
    def test_a_keyed_checkpoint_restores_into_any_number_of_partitions(self) -> None:
        """Every key group is in exactly one manifest: the keyed state and the offsets come back."""
        given = manifests(4)

        plan = plan_restore(checkpoint(list(given)), keyed_job(3), given)

        assert RestorePlan(7, {(TOPIC, 0): 40, (TOPIC, 1): 60}, {}, True, frozenset({COUNTS})) == plan

    def test_a_completion_without_one_shuffle_tasks_handle_is_refused(self) -> None:
        """A shuffle task acknowledged without state: its key groups are in no manifest, so the
        checkpoint is refused as incomplete (it used to restore 287 of 400 keys, silently)."""
        given = manifests(4, skip=2)

        plan = plan_restore(checkpoint(list(given)), keyed_job(4, allow=True), given)

        assert isinstance(plan, Refused)
        assert (Refusal.INCOMPLETE, 7) == (plan.refusal, plan.checkpoint_id)
        assert "key groups 64-95 (32 of 128) are in none of its manifests" in plan.reason

    def test_a_key_group_claimed_twice_is_refused(self) -> None:
        given = {**manifests(2), "keyed-9": manifests(1)["keyed-0"]}

        plan = plan_restore(checkpoint(list(given)), keyed_job(), given)

        assert isinstance(plan, Refused) and plan.refusal is Refusal.INCOMPLETE
        assert "key group 0 is claimed by keyed-9 and keyed-0" in plan.reason

    def test_another_max_parallelism_is_refused_with_advice_that_works(self) -> None:
        """Key groups of max parallelism 256 cannot map onto 128: the advice is to run with 256,
        never to restore a savepoint (which has the same key groups)."""
        given = manifests(2, max_parallelism=256)

        plan = plan_restore(checkpoint(list(given)), keyed_job(), given)

        assert isinstance(plan, Refused) and plan.refusal is Refusal.MAX_PARALLELISM
        message = refusal_message("wc", [plan], latest=False)
        assert "max parallelism 256, the job has 128" in message
        assert "savepoint (restore=DIR)" not in message
        assert "JobSettings.max_parallelism and KeyedStep.max_parallelism" in message


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 128), st.integers(1, 128), st.data())
def test_a_keyed_checkpoint_restores_exactly_when_whole_and_refuses_any_gap(
    old: int, new: int, data: st.DataObject
) -> None:
    """For any old and new number of shuffle partitions, the manifests of every old partition
    restore; without any one of them, the restore is refused as incomplete."""
    whole = manifests(old)
    missing = data.draw(st.integers(0, old - 1))
    gap = manifests(old, skip=missing)

    assert isinstance(plan_restore(checkpoint(list(whole)), keyed_job(new), whole), RestorePlan)
    refused = plan_restore(checkpoint(list(gap)), keyed_job(new, allow=True), gap)
    assert isinstance(refused, Refused) and refused.refusal is Refusal.INCOMPLETE


class TestNonRestoredState:
    def test_a_keyed_savepoint_into_a_job_without_keys_is_refused(self) -> None:
        """It used to start every partition empty, at earliest, with a warning."""
        plan = plan_restore(checkpoint(["keyed-0", "keyed-1"]), partition_job(), {})

        assert isinstance(plan, Refused) and plan.refusal is Refusal.NOT_RESTORED
        assert "the keyed state of tasks keyed-0, keyed-1 (this job has no keyed_partitions)" in plan.reason

    def test_allowed_the_keyed_state_stays_behind_and_the_offsets_are_restored(self) -> None:
        """With allow_non_restored_state the partitions start at the savepoint's offsets with the
        step's initial state (as Flink's sources resume while the dropped operator starts empty)."""
        plan = plan_restore(checkpoint(["keyed-0", "keyed-1"]), partition_job(allow=True), {})

        assert isinstance(plan, RestorePlan)
        assert ({(TOPIC, 0): 40, (TOPIC, 1): 60}, {}) == (plan.offsets, plan.partition_state)
        assert 1 == len(plan.left_behind) and "keyed-0" in plan.left_behind[0]

    def test_a_savepoint_of_other_topics_is_refused(self) -> None:
        other = checkpoint(["clicks-0", "clicks-1"], {"clicks:0": 5, "clicks:1": 6})

        plan = plan_restore(other, partition_job(), {})

        assert isinstance(plan, Refused) and plan.refusal is Refusal.NOT_RESTORED
        assert "the offsets of clicks[0], clicks[1], which this job does not read" in plan.reason
        assert "the state of tasks clicks-0, clicks-1, partitions this job does not read" in plan.reason

    def test_allowed_a_savepoint_of_other_topics_leaves_everything_behind(self) -> None:
        other = checkpoint(["clicks-0"], {"clicks:0": 5})

        plan = plan_restore(other, partition_job(allow=True), {})

        assert isinstance(plan, RestorePlan)
        assert ({}, PARTITIONS) == (plan.offsets, plan.new_partitions)

    def test_a_checkpoint_without_keyed_state_into_a_keyed_job_is_refused(self) -> None:
        plan = plan_restore(checkpoint([f"{TOPIC}-0", f"{TOPIC}-1"]), keyed_job(), {})

        assert isinstance(plan, Refused) and plan.refusal is Refusal.NOT_RESTORED
        assert "it holds no keyed state" in plan.reason

    def test_a_partition_the_checkpoint_does_not_know_starts_empty(self) -> None:
        """A partition added since (no offset, no state) is new: it starts at startingOffsets."""
        plan = plan_restore(checkpoint([f"{TOPIC}-0"], {f"{TOPIC}:0": 40}), partition_job(), {})

        assert isinstance(plan, RestorePlan)
        assert ({(TOPIC, 0): f"{TOPIC}-0"}, ((TOPIC, 1),)) == (plan.partition_state, plan.new_partitions)


class TestPerPartitionCoverage:
    def test_every_partition_with_an_offset_needs_its_state(self) -> None:
        """An offset without state (a task acknowledged without it) is a gap, allowed or not."""
        plan = plan_restore(checkpoint([f"{TOPIC}-0"]), partition_job(allow=True), {})

        assert isinstance(plan, Refused) and plan.refusal is Refusal.INCOMPLETE
        assert f"offsets of {TOPIC}[1] but not their state" in plan.reason

    def test_offsets_without_any_state_are_refused_not_restored_empty(self) -> None:
        """Every task acknowledged offsets and no snapshot (issue 53): it restored silently empty."""
        plan = plan_restore(checkpoint([]), partition_job(allow=True), {})

        assert isinstance(plan, Refused) and plan.refusal is Refusal.INCOMPLETE
        assert f"offsets of {TOPIC}[0], {TOPIC}[1] but not their state" in plan.reason

    def test_state_without_an_offset_is_refused(self) -> None:
        plan = plan_restore(checkpoint([f"{TOPIC}-0"], {}), partition_job(), {})

        assert isinstance(plan, Refused) and plan.refusal is Refusal.INCOMPLETE


class TestStepIdentity:
    def plan(self, step: StepIdentity | None) -> RestorePlan:
        given = manifests(2, step=step)
        plan = plan_restore(checkpoint(list(given)), keyed_job(2), given)
        assert isinstance(plan, RestorePlan)
        return plan

    def test_the_same_step_restores(self) -> None:
        assert restore_step(self.plan(COUNTS), COUNTS, allow_non_restored_state=False) is None

    def test_a_changed_key_function_is_refused(self) -> None:
        """It used to be accepted: the new keys counted from zero, the old ones stranded."""
        changed = StepIdentity("counts", "app.words_of_lower")

        decision = restore_step(self.plan(COUNTS), changed, allow_non_restored_state=False)

        assert isinstance(decision, Refused) and decision.refusal is Refusal.STEP_CHANGED
        assert "key function app.words_of; this step has uid 'counts', key function app.words_of_lower" in (
            decision.reason
        )

    def test_another_uid_is_refused(self) -> None:
        decision = restore_step(
            self.plan(COUNTS), StepIdentity("totals", COUNTS.key_by), allow_non_restored_state=False
        )

        assert isinstance(decision, Refused) and decision.refusal is Refusal.STEP_CHANGED

    def test_allowed_another_steps_state_is_left_behind(self) -> None:
        changed = StepIdentity(None, "app.words_of_lower")

        decision = restore_step(self.plan(COUNTS), changed, allow_non_restored_state=True)

        assert isinstance(decision, LeftBehind)

    def test_a_checkpoint_from_before_identities_restores_into_any_step(self) -> None:
        """Old manifests record no step: their state restores as it did before."""
        changed = StepIdentity("anything", "app.other")

        assert restore_step(self.plan(None), changed, allow_non_restored_state=False) is None


class TestRefusalMessage:
    def test_it_lists_the_newest_three_with_advice_once_per_kind(self) -> None:
        refused = [
            Refused(i, Refusal.INCOMPLETE if i % 2 else Refusal.UNREADABLE, f"reason {i}")
            for i in range(1, 9)
        ]

        message = refusal_message("wc", refused, latest=True)

        lines = message.splitlines()
        assert "job wc cannot restore any of its 8 completed checkpoints exactly:" == lines[0]
        assert ["  checkpoint 8: reason 8", "  checkpoint 7: reason 7", "  checkpoint 6: reason 6"] == lines[
            1 : 1 + SHOWN
        ]
        assert "  (5 older ones refused too)" == lines[1 + SHOWN]
        assert 2 == sum(line.startswith("To restore:") for line in lines)
        assert len(lines) <= 24 and all(len(line) <= 400 for line in lines)

    def test_a_long_reason_is_cut(self) -> None:
        message = refusal_message("wc", [Refused(3, Refusal.NOT_RESTORED, "x" * 5000)], latest=False)

        assert max(len(line) for line in message.splitlines()) < 400
        assert "allow_non_restored_state=True" in message


class TestAnotherJobsSavepoint:
    def test_a_directory_of_the_job_itself_restores(self) -> None:
        assert owner_problem(7, "orders", "orders", None) is None

    def test_another_jobs_metadata_is_refused_with_what_to_do(self) -> None:
        """Two jobs sharing a savepoint directory must never restore each other's offsets and
        state: the refusal names the owner and how to restore it on purpose."""
        refused = owner_problem(7, "payments", "orders", None)

        assert refused is not None and Refusal.OTHER_JOB is refused.refusal
        message = refusal_message("orders", [refused], latest=False)
        assert "belongs to job 'payments', not job 'orders'" in message
        assert "restore_from_job" in message

    def test_naming_the_owner_restores_it_and_naming_another_does_not(self) -> None:
        assert owner_problem(7, "payments", "orders", "payments") is None
        assert owner_problem(7, "payments", "orders", "invoices") is not None
