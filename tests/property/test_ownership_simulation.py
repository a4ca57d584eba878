"""The deterministic simulator (coordinator/simulation/): the production worker, input loop, ticker,
runtime and decider of up to four workers, under one seeded scheduler over a simulated group and
log. Thousands of seeds keep every invariant, a seed replays exactly, the black-box runs of
issues 52 and 53 hold, and each invariant checker catches a hand-made violation."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.core.ownership import Claim
from coordinator.core.testing import config
from coordinator.service.claims import generation_header
from coordinator.simulation.run import (
    SEED_ENV,
    Deciding,
    Oracle,
    RecoveryReads,
    Summary,
    Violation,
    Window,
    Written,
    check_inputs_decided,
    check_live_state,
    check_liveness,
    check_recovery,
    check_step_down,
    check_window,
    main,
    rebalance_storm,
    run_seeds,
    simulate,
)
from coordinator.simulation.world import Rules, SimulationFailed, World, late_claim, unrecoverable_partition
from events.kafka.log import LogMessage
from events.wire.codec import default_codec
from events.wire.fencing import HeaderDict, epoch_header
from events.wire.records import (
    CheckpointKind,
    CheckpointTriggered,
    CoordinatorClaimed,
    JournalEvent,
    SchedulerStarted,
)
from events.wire.topics import Topics
from events.wire.vocabulary import CAUSE_HEADER

SEEDS = 2_000
"""The consecutive seeds the whole suite runs (CI): the fast lane's, then the slow test's."""
FAST_LANE_SEEDS = 250
"""The first seeds, the fast lane's share (``-m "not slow"``): a sample of every fault, in seconds."""


def assert_every_invariant_kept(summary: Summary, seeds: int) -> None:
    assert () == summary.failures, summary.failures[0]
    assert seeds == summary.seeds
    assert summary.faults > seeds  # chaos happened: several faults per seed
    assert summary.windows > seeds // 2  # and many rebalances were followed by a quiet window
    assert summary.checks > 50 * seeds


class TestSeeds:
    """The whole suite runs seeds 0-1,999, in two tests: the fast lane the first 250."""

    def test_the_first_250_seeds_keep_every_invariant(self) -> None:
        """Seeds 0-249: the fast lane's sample of the faults below."""
        assert_every_invariant_kept(run_seeds(0, FAST_LANE_SEEDS, processes=2), FAST_LANE_SEEDS)

    @pytest.mark.slow
    def test_the_rest_of_two_thousand_consecutive_seeds_keep_every_invariant(self) -> None:
        """Seeds 250-1,999 (with the test above, 2,000 consecutive seeds) of rebalances (back to back
        too), pauses (in the middle of a claim too), kills, joins, leaves, broker pauses, failing
        writes, slow and failing snapshot reads, long journals and compaction: no invariant breaks.
        (Its speed is a benchmark's business: ``python -m coordinator.simulation.run --seeds 2000
        --processes 2`` prints it; a timed assertion fails on a busy machine, not on slow code.)"""
        rest = SEEDS - FAST_LANE_SEEDS
        assert_every_invariant_kept(run_seeds(FAST_LANE_SEEDS, rest, processes=2), rest)

    def test_a_seed_replays_exactly(self) -> None:
        """The same seed gives the same trace, line by line; another seed another one."""
        first = simulate(7, keep_trace=True)
        again = simulate(7, keep_trace=True)

        assert first.trace == again.trace
        assert first.digest == again.digest
        assert first.digest != simulate(8).digest

    def test_a_failure_names_its_seed_time_trace_and_replay_command(self) -> None:
        """The shell of before the fix of issue 52 (a batch waited for every partition in it) in a
        world where one partition cannot be recovered: the seed says where it failed, the last
        lines, and how to replay it."""
        with pytest.raises(SimulationFailed) as failed, _waiting_for_every_partition():
            simulate(3, scenario=unrecoverable_partition())
        report = str(failed.value)

        assert 6 == failed.value.violation.invariant
        assert f"seed 3 (current rules), step {failed.value.step}" in report
        assert 0 < len(failed.value.trace) <= 40
        assert "replay: uv run python -m coordinator.simulation.run --seed 3 -v" in report

    def test_the_command_line_replays_one_seed(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``--seed N`` (or CUTLINE_SIM_SEED=N) runs that seed and says what it did."""
        assert 0 == main(["--seed", "3"])
        by_flag = capsys.readouterr().out
        monkeypatch.setenv(SEED_ENV, "3")
        assert 0 == main([])
        by_env = capsys.readouterr().out

        assert by_flag.startswith("seed 3 (current rules):")
        assert by_flag == by_env

    def test_the_legacy_rules_are_caught(self) -> None:
        """The old coordinator's ownership rules (a lost claim retried higher for any generation,
        no step-down on a newer claim) break an invariant within a few seeds; the current rules
        keep them all (the test above)."""
        broken = [seed for seed in range(40) if _fails(seed, Rules.LEGACY)]

        assert broken, "no seed of 40 caught the legacy rules"


class TestScenarios:
    @pytest.mark.slow
    def test_a_join_while_64_claims_are_queued_then_ten_rebalances_back_to_back(self) -> None:
        """Issue 52's black-box run: one worker claims 64 partitions on a long journal with slow
        snapshot reads, a second joins while the claims are queued, then nine more rebalances
        follow one another; after each, every one of the 40 jobs completes a checkpoint within the
        session timeout + 5 s (simulated)."""
        result = simulate(1, scenario=rebalance_storm())

        assert 10 <= result.rebalances
        assert 10 == result.windows_checked

    def test_a_partition_that_cannot_be_recovered_holds_up_no_other_and_says_why(self) -> None:
        """One worker holds two partitions; the first's snapshot reads time out for 12 s. The second
        partition's job checkpoints all along (before the fix of issue 52 it got nothing: a batch
        waited for every partition in it); the first says why it is not decided."""
        world = World(1, Rules.CURRENT, unrecoverable_partition(), False, False)
        world.begin()
        world.run_until(world.start + 5.0)
        views = {view.partition: view for view in world.nodes["w0"].worker.views()}
        completed = world.oracles[1].completions

        assert "RECOVERING" == views[0].phase
        assert views[0].why is not None and "do not answer" in views[0].why
        assert 4.5 < views[0].undecided_seconds
        assert views[1].why is None
        assert 3 <= len(next(iter(completed.values())))
        assert 1 == simulate(1, scenario=unrecoverable_partition()).windows_checked

    def test_a_late_claim_of_an_older_generation_loses_no_input(self) -> None:
        """Issue 53's late claim: a worker paused in the middle of a recovery, expelled, resumed,
        claims higher for the generation that is gone; the owner's decisions are void until it
        reads that claim and claims again. Every input committed was decided by a worker whose
        decisions counted (invariant 8), in order, once (invariant 7)."""
        late = 0
        for seed in range(12):
            result = simulate(seed, scenario=late_claim(), keep_trace=True)
            late += any("fenced by" in line and "ReadSnapshot" in line for line in result.trace)

        assert late > 0, "no seed had a late claim fence the owner"


def _fails(seed: int, rules: Rules) -> bool:
    try:
        simulate(seed, rules)
    except SimulationFailed:
        return True
    return False


class _waiting_for_every_partition:
    """The input loop as it was before issue 52's fix: a batch waits until every partition in it
    is decided here, and is then acked whole."""

    def __enter__(self) -> None:
        from coordinator.service import inputs

        self.inputs, self.saved = inputs, inputs.InputLoop.decide_batch
        original = self.saved

        async def waiting(loop: Any, records: Any) -> Any:
            import asyncio

            from coordinator.core.ownership import Phase

            holds = loop.worker.ownership.holds
            while any(holds.get(r.partition) is not None and holds[r.partition].phase is not Phase.DECIDING
                      for r in records):  # fmt: skip
                await asyncio.sleep(0.05)
                holds = loop.worker.ownership.holds
            await original(loop, records)
            return list(records)

        inputs.InputLoop.decide_batch = waiting  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        self.inputs.InputLoop.decide_batch = self.saved  # type: ignore[method-assign]


# ------------------------------------------------------------ the checkers catch violations

TOPICS = Topics("sim.")
JOB = "job-0-0"
CODEC = default_codec()


def claim(offset: int, epoch: int, worker: str, generation: int = 1) -> Written:
    value = CODEC.encode(CoordinatorClaimed(0, epoch, worker, 0), TOPICS.checkpoints)
    headers = HeaderDict([epoch_header(epoch), generation_header(generation)])
    return Written(LogMessage(TOPICS.checkpoints, 0, offset, 0, None, value, headers), worker)


def event(offset: int, record: JournalEvent, epoch: int, worker: str, cause: int | None = None) -> Written:
    pairs = [epoch_header(epoch)]
    if cause is not None:
        pairs.append((CAUSE_HEADER, f"{TOPICS.acks}:0:{cause}".encode()))
    value = CODEC.encode(record, TOPICS.checkpoints)
    return Written(
        LogMessage(TOPICS.checkpoints, 0, offset, 0, JOB.encode(), value, HeaderDict(pairs)), worker
    )


def started() -> SchedulerStarted:
    return SchedulerStarted(JOB, 1, 0, ("t0",), config(), 1000)


def triggered(checkpoint_id: int) -> CheckpointTriggered:
    return CheckpointTriggered(
        JOB, checkpoint_id, 1, CheckpointKind.CHECKPOINT, 1000, "file:///c", ("t0",), 5000
    )


def journal(*written: Written) -> list[Written]:
    return list(written)


def violation(invariant: int) -> Any:
    return pytest.raises(Violation, match=f"^invariant {invariant} ")


class TestCheckers:
    def test_a_record_of_another_worker_counting_breaks_invariant_1(self) -> None:
        """After w0's claim, a valid record by w1 (its epoch not lower) means two deciders count."""
        with violation(1):
            Oracle(0).advance(journal(claim(0, 1, "w0"), event(1, started(), 1, "w1")))

    def test_a_fenced_workers_record_is_void_and_keeps_invariant_1(self) -> None:
        """The same record under a lower epoch than the claim is void: nothing to report."""
        Oracle(0).advance(journal(claim(0, 2, "w0"), event(1, started(), 1, "w1")))

    def test_a_checkpoint_id_triggered_twice_breaks_invariant_3(self) -> None:
        records = journal(claim(0, 1, "w0"), event(1, started(), 1, "w0"))
        records += [event(2, triggered(1), 1, "w0"), event(3, triggered(1), 1, "w0")]
        with violation(3):
            Oracle(0).advance(records)

    def test_an_input_decided_again_after_a_later_one_breaks_invariant_7(self) -> None:
        """Inputs of one partition count in order, each once: ack 5's decision after ack 6's."""
        records = journal(
            claim(0, 1, "w0"), event(1, started(), 1, "w0", cause=6), event(2, started(), 1, "w0", cause=5)
        )
        with violation(7):
            Oracle(0).advance(records)

    def test_one_inputs_several_records_keep_invariant_7(self) -> None:
        records = journal(
            claim(0, 1, "w0"), event(1, started(), 1, "w0", cause=4), event(2, started(), 1, "w0", cause=4)
        )
        oracle = Oracle(0)
        oracle.advance(records)

        assert {(TOPICS.acks, 0): {4}} == oracle.valid_inputs

    def test_a_deciding_worker_that_read_a_newer_claim_breaks_invariant_2(self) -> None:
        """w0 decides under epoch 1 and its watcher read the partition after epoch 2 landed."""
        with violation(2):
            check_step_down([Deciding("w0", 0, 1, polled_at=5.0)], {0: (2, 3.0)})
        check_step_down([Deciding("w0", 0, 1, polled_at=3.0)], {0: (2, 3.0)})  # could not read it yet
        check_step_down([Deciding("w0", 0, 2, polled_at=9.0)], {0: (2, 3.0)})  # its own claim

    def test_live_states_that_are_not_the_journals_fold_break_invariant_4(self) -> None:
        records = journal(claim(0, 1, "w0"), event(1, started(), 1, "w0"), event(2, triggered(1), 1, "w0"))
        oracle, stale = Oracle(0), Oracle(0)
        oracle.advance(records)
        stale.advance(records[:-1])
        with violation(4):
            check_live_state("w0", 0, stale.states, oracle.states)
        check_live_state("w0", 0, dict(oracle.states), oracle.states)

    def test_a_recovery_reading_more_than_one_snapshot_or_old_journal_breaks_invariant_5(self) -> None:
        with violation(5):
            check_recovery("w0", RecoveryReads(0, base_offset=10, snapshot_reads=2, lowest_offset=11))
        with violation(5):
            check_recovery("w0", RecoveryReads(0, base_offset=10, snapshot_reads=1, lowest_offset=3))
        check_recovery("w0", RecoveryReads(0, base_offset=10, snapshot_reads=1, lowest_offset=11))

    def test_a_job_without_a_checkpoint_in_a_quiet_window_breaks_invariant_6(self) -> None:
        """After the rebalance at 10 s, partition 0 decided from 10.5 s: its job must complete a
        checkpoint by 17 s; a partition decided too late in the window is not held to it."""
        window = Window(4, 10.0, 7.0, deciding_since={0: 10.5, 1: 16.0})
        with violation(6):
            check_window(window, {"a": 0, "b": 1}, ["a", "b"], {"a": [9.0], "b": []}, slack=3.0)
        check_window(window, {"a": 0, "b": 1}, ["a", "b"], {"a": [12.0], "b": []}, slack=3.0)

    def test_what_keeps_invariant_6_from_holding_once_the_faults_stop_is_named(self) -> None:
        assert [
            "partition 0 is assigned to w0 but decided by [('w0', 2), ('w1', 3)]",
            "partition 1 is assigned to w1 but decided by nobody",
            "partition 2 is assigned to nobody",
            "job job-1 completed no new checkpoint",
        ] == check_liveness({0: "w0", 1: "w1"}, {0: [("w0", 2), ("w1", 3)]}, {0: 3, 1: 1, 2: 2}, ["job-1"])
        assert [] == check_liveness({0: "w0"}, {0: [("w0", 3)]}, {0: 3}, [])

    def test_an_input_committed_undecided_breaks_invariant_8(self) -> None:
        """Offsets 0-4 committed: 3 was decided only by a worker whose decisions were void."""
        tp = (TOPICS.acks, 0)
        with violation(8):
            check_inputs_decided({tp: 5}, {tp: {0, 1, 2}}, {tp: {4}})
        check_inputs_decided({tp: 5}, {tp: {0, 1, 2}}, {tp: {3, 4}})


def test_claims_are_read_as_the_ownership_machine_sees_them() -> None:
    oracle = Oracle(0)
    oracle.advance(journal(claim(0, 3, "w2", generation=7)))

    assert Claim(3, "w2", 7, 0) == oracle.claim
    assert 3 == oracle.epoch
