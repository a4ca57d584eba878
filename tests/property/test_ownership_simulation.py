"""The deterministic simulator of N coordinator workers (coordinator.simulate_ownership): thousands
of seeds keep every invariant, the old rules' bug stays caught, a seed replays exactly, and each
invariant checker does catch a hand-made violation."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from coordinator.commands import Command
from coordinator.decider import InputRejected, decide, evolve
from coordinator.ownership import Claim
from coordinator.simulate_ownership import (
    LEGACY_REGRESSION_SEED,
    ClaimBody,
    Deciding,
    Oracle,
    Record,
    RecoveryReads,
    Rules,
    SimulationFailed,
    SnapshotEntry,
    Violation,
    check_live_state,
    check_liveness,
    check_recovery,
    check_snapshot,
    check_step_down,
    main,
    run_seeds,
    simulate,
)
from coordinator.state import JobState, initial_state
from coordinator.testing import ack, running, tick
from events.wire.records import CheckpointKind, CheckpointTriggered

SEEDS = 2_000


class TestSeeds:
    @pytest.mark.slow
    def test_thousands_of_consecutive_seeds_keep_every_invariant(self) -> None:
        """2,000 seeds of rebalances, pauses, kills, delayed claims, broker pauses and compaction:
        no invariant breaks. (Its speed is a benchmark's business: ``python -m
        coordinator.simulate_ownership --seeds 2000`` prints it; a timed assertion fails on a busy
        machine, not on slow code.)"""
        summary = run_seeds(0, SEEDS, processes=2)
        assert () == summary.failures, summary.failures[0]
        assert SEEDS == summary.seeds
        assert summary.faults > SEEDS  # chaos happened: several faults per seed
        assert summary.checks > 100 * SEEDS

    def test_the_legacy_rules_fence_the_assigned_worker_and_the_current_ones_do_not(self) -> None:
        """The regression seed: under the old rules, a worker with a claim under way when another
        rejoins claims (again, higher) the partition the group gave to the other, which is fenced
        and goes on deciding; under the current rules the same seed keeps every invariant."""
        with pytest.raises(SimulationFailed) as failed:
            simulate(LEGACY_REGRESSION_SEED, Rules.LEGACY)
        assert 2 == failed.value.violation.invariant
        assert "still decides partition" in failed.value.violation.message
        assert LEGACY_REGRESSION_SEED == simulate(LEGACY_REGRESSION_SEED).seed

    def test_a_seed_replays_exactly(self) -> None:
        """The same seed gives the same trace, step by step; another seed another one."""
        first = simulate(7, keep_trace=True)
        again = simulate(7, keep_trace=True)
        assert first.trace == again.trace
        assert first.digest == again.digest
        assert len(first.trace) == first.steps
        assert first.digest != simulate(8).digest

    def test_a_failure_names_its_seed_step_trace_and_replay_command(self) -> None:
        """A failing seed says where it failed, the last steps, and how to replay it."""
        with pytest.raises(SimulationFailed) as failed:
            simulate(LEGACY_REGRESSION_SEED, Rules.LEGACY)
        report = str(failed.value)
        assert f"seed {LEGACY_REGRESSION_SEED} (legacy rules), step {failed.value.step}" in report
        assert 0 < len(failed.value.trace) <= 30
        replay = "uv run python -m coordinator.simulate_ownership"
        assert f"{replay} --seed {LEGACY_REGRESSION_SEED} --rules legacy -v" in report

    def test_the_command_line_replays_one_seed(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``--seed N`` runs that seed and says what it did; a failure exits 1."""
        assert 0 == main(["--seed", "3"])
        assert "seed 3 (current rules):" in capsys.readouterr().out
        assert 1 == main(["--seed", str(LEGACY_REGRESSION_SEED), "--rules", "legacy"])
        assert "replay:" in capsys.readouterr().err


# ------------------------------------------------------------ the checkers catch violations

JOB = "job-0-0"


def claim(epoch: int, worker: str, generation: int = 1) -> Record:
    return Record(epoch, worker, ClaimBody(epoch, worker, generation))


def decided(
    worker: str, epoch: int, commands: Iterable[Command], state: JobState | None = None
) -> list[Record]:
    """The records ``worker`` appends deciding ``commands`` in turn."""
    state = state or initial_state(JOB)
    records = []
    for source, command in enumerate(commands):
        for event in decide(state, command):
            if not isinstance(event, InputRejected):
                state = evolve(state, event)
                records.append(Record(epoch, worker, event, source))
    return records


def completed_once() -> list[Record]:
    """w0 claims, runs the job, triggers checkpoint 1 and completes it."""
    return [claim(1, "w0"), *decided("w0", 1, [running(job_id=JOB, tasks=("t0",)), tick(5000, job_id=JOB),
                                                 ack(1, "t0", job_id=JOB, at=5001)])]  # fmt: skip


def violation(invariant: int) -> Any:
    return pytest.raises(Violation, match=f"^invariant {invariant} ")


class TestCheckers:
    def test_a_record_of_another_worker_counting_breaks_invariant_1(self) -> None:
        """After w0's claim, a valid record by w1 (its epoch not lower) means two deciders count."""
        journal = [claim(1, "w0"), *decided("w1", 1, [running(job_id=JOB)])]
        with violation(1):
            Oracle(0).advance(journal)

    def test_a_fenced_workers_record_is_void_and_keeps_invariant_1(self) -> None:
        """The same record under a lower epoch than the claim is void: nothing to report."""
        journal = [claim(2, "w0"), *decided("w1", 1, [running(job_id=JOB)])]
        Oracle(0).advance(journal)

    def test_a_checkpoint_id_used_twice_breaks_invariant_3(self) -> None:
        """A checkpoint id triggered twice in the effective journal."""
        triggered = CheckpointTriggered(JOB, 1, 1, CheckpointKind.CHECKPOINT, 0, "file:///c", ("t0",), 10)
        journal = [claim(1, "w0"), Record(1, "w0", triggered, 0), Record(1, "w0", triggered, 1)]
        with violation(3):
            Oracle(0).advance(journal)

    def test_a_deciding_worker_that_read_a_newer_claim_breaks_invariant_2(self) -> None:
        """w0 decides under epoch 1 and polled after epoch 2 landed: it should have stepped down."""
        with violation(2):
            check_step_down([Deciding("w0", 0, 1, polled_at=5)], {0: (2, 3)})
        check_step_down([Deciding("w0", 0, 1, polled_at=3)], {0: (2, 3)})  # could not read it yet
        check_step_down([Deciding("w0", 0, 2, polled_at=9)], {0: (2, 3)})  # its own claim

    def test_live_states_that_are_not_the_journals_fold_break_invariant_4(self) -> None:
        """A deciding worker whose state missed a completion."""
        journal = completed_once()
        oracle = Oracle(0)
        oracle.advance(journal)
        stale = Oracle(0)
        stale.advance(journal[:-1])
        with violation(4):
            check_live_state("w0", 0, stale.fold.states, oracle.fold.states)
        check_live_state("w0", 0, dict(oracle.fold.states), oracle.fold.states)

    def test_a_snapshot_that_loses_a_completed_checkpoint_breaks_invariant_4(self) -> None:
        """A snapshot claiming to cover the completion but holding the state before it."""
        journal = completed_once()
        oracle = Oracle(0)
        oracle.advance(journal)
        before = Oracle(0)
        before.advance(journal[:-1])
        owner = Claim(1, "w0", 1, 0)
        bad = SnapshotEntry(1, len(journal) - 1, 3, owner, dict(before.fold.states), "w0")
        with pytest.raises(Violation, match="completed 1 but recovers with 0"):
            check_snapshot(0, bad, journal, oracle)
        good = SnapshotEntry(1, len(journal) - 2, 2, owner, dict(before.fold.states), "w0")
        check_snapshot(0, good, journal, oracle)

    def test_a_recovery_reading_more_than_one_snapshot_or_old_journal_breaks_invariant_5(self) -> None:
        """Two snapshot entries read, or journal records at or before the snapshot's offset."""
        with violation(5):
            check_recovery("w0", RecoveryReads(0, base_offset=10, snapshot_reads=2, lowest_offset=11))
        with violation(5):
            check_recovery("w0", RecoveryReads(0, base_offset=10, snapshot_reads=1, lowest_offset=3))
        check_recovery("w0", RecoveryReads(0, base_offset=10, snapshot_reads=1, lowest_offset=11))

    def test_what_keeps_invariant_6_from_holding_is_named(self) -> None:
        """Two deciders, a partition decided by nobody, a stale epoch, a job without a new checkpoint."""
        assert [
            "partition 0 is assigned to w0 but decided by [('w0', 2), ('w1', 3)]",
            "partition 1 is assigned to w1 but decided by nobody",
            "partition 2 is assigned to w1 but decided by [('w1', 1)]",
            "partition 3 is assigned to nobody",
            "job job-1 completed no new checkpoint",
        ] == check_liveness(
            {0: "w0", 1: "w1", 2: "w1"},
            {0: [("w0", 2), ("w1", 3)], 2: [("w1", 1)]},
            {0: 3, 1: 1, 2: 2, 3: 1},
            ["job-1"],
        )
        assert [] == check_liveness({0: "w0"}, {0: [("w0", 3)]}, {0: 3}, [])
