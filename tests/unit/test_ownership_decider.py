"""Ownership of journal partitions, rule by rule: given some facts, when one more, then exactly
these commands and this hold."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given as hypothesis_given
from hypothesis import settings
from hypothesis import strategies as st

from coordinator.core.ownership import (
    UNKNOWN_GENERATION,
    BarriersResent,
    Claim,
    ClaimRead,
    ClaimSettled,
    ClaimWriteFailed,
    ClaimWritten,
    Fact,
    FoldJournal,
    Hold,
    JournalFolded,
    Ownership,
    OwnershipCommand,
    PartitionsAssigned,
    PartitionsRevoked,
    Phase,
    ReadSnapshot,
    ReadToClaim,
    RecoveryFailed,
    ResendBarriers,
    ResendFailed,
    SnapshotRead,
    StartDeciding,
    StopDeciding,
    WriteClaim,
    initial_ownership,
    step,
    steps,
)

ME = "worker-a"
OTHER = "worker-b"
P = 3


def claim_of(worker: str, epoch: int, generation: int, offset: int) -> Claim:
    return Claim(epoch, worker, generation, offset)


@dataclass(frozen=True)
class When:
    state: Ownership
    commands: tuple[OwnershipCommand, ...]

    def then(self, *expected: OwnershipCommand) -> When:
        assert list(expected) == list(self.commands)
        return self

    def holding(self, partition: int, hold: Hold | None) -> When:
        assert hold == self.state.holds.get(partition)
        return self


@dataclass(frozen=True)
class Given:
    state: Ownership

    def when(self, fact: Fact) -> When:
        made = step(self.state, fact)
        return When(made.state, made.commands)


def given(*facts: Fact) -> Given:
    return Given(steps(initial_ownership(ME), facts).state)


def deciding_facts(generation: int = 5, epoch: int = 4, offset: int = 100) -> tuple[Fact, ...]:
    """The facts that take partition P from assigned to deciding with a claim of ``epoch``."""
    return (
        PartitionsAssigned(generation, frozenset({P})),
        SnapshotRead(P, generation, epoch - 2, 40),
        JournalFolded(P, generation, 99, epoch - 1),
        ClaimWritten(P, generation, epoch, offset),
        ClaimSettled(P, generation, claim_of(ME, epoch, generation, offset), epoch),
        BarriersResent(P, generation),
    )


class TestRecovery:
    def test_an_assigned_partition_is_recovered_from_its_snapshot(self) -> None:
        """A newly assigned partition starts with its snapshot; nothing is decided yet."""
        given().when(PartitionsAssigned(5, frozenset({P, 1}))).then(
            ReadSnapshot(1, 5), ReadSnapshot(P, 5)
        ).holding(P, Hold(5, Phase.RECOVERING))

    def test_the_snapshot_is_followed_by_the_journal_after_it(self) -> None:
        """Once the snapshot is loaded, the journal after it is folded to its end."""
        given(PartitionsAssigned(5, frozenset({P}))).when(SnapshotRead(P, 5, 2, 40)).then(
            FoldJournal(P, 5)
        ).holding(P, Hold(5, Phase.RECOVERING, highest_epoch=2))

    def test_the_claim_is_one_above_the_highest_epoch_seen(self) -> None:
        """The claim's epoch is 1 + the highest epoch the snapshot and the fold saw."""
        given(PartitionsAssigned(5, frozenset({P})), SnapshotRead(P, 5, 2, 40)).when(
            JournalFolded(P, 5, 99, 3)
        ).then(WriteClaim(P, 5, 4)).holding(P, Hold(5, Phase.CLAIMING, highest_epoch=3, claim_epoch=4))

    def test_a_written_claim_is_read_up_to(self) -> None:
        """The journal is read on up to the claim's own offset (never 'until silence')."""
        given(*deciding_facts()[:3]).when(ClaimWritten(P, 5, 4, 100)).then(ReadToClaim(P, 5, 100))

    def test_a_claim_that_holds_resends_barriers_then_decides(self) -> None:
        """The worker's own claim is the effective one: barriers again, then deciding."""
        given(*deciding_facts()[:4]).when(ClaimSettled(P, 5, claim_of(ME, 4, 5, 100), 4)).then(
            ResendBarriers(P, 5, 4)
        )
        given(*deciding_facts()[:5]).when(BarriersResent(P, 5)).then(StartDeciding(P, 4, 100)).holding(
            P, Hold(5, Phase.DECIDING, highest_epoch=4, claim_epoch=4, claim_offset=100)
        )

    def test_a_failed_claim_write_recovers_again(self) -> None:
        """A claim whose write failed may have landed: the partition is folded again, after a pause,
        and its hold says why."""
        why = "its claim could not be written (timed out)"
        given(*deciding_facts()[:3]).when(ClaimWriteFailed(P, 5, 4, "timed out")).then(
            ReadSnapshot(P, 5, 1.0)
        ).holding(P, Hold(5, Phase.RECOVERING, highest_epoch=3, problem=why))

    def test_a_failed_read_is_tried_again_after_the_delay_it_names(self) -> None:
        """A recovery that failed (a changed partition count) waits as long as the failure says."""
        given(PartitionsAssigned(5, frozenset({P}))).when(RecoveryFailed(P, 5, "count changed", 30.0)).then(
            ReadSnapshot(P, 5, 30.0)
        )

    def test_failed_barriers_stop_and_recover_again(self) -> None:
        """Barriers that could not be resent: the partition is not decided and recovers again."""
        when = given(*deciding_facts()[:5]).when(ResendFailed(P, 5, "broker down"))
        assert isinstance(when.commands[0], StopDeciding)
        assert ReadSnapshot(P, 5, 1.0) == when.commands[1]
        assert Phase.RECOVERING == when.state.holds[P].phase


class TestGenerations:
    def test_work_of_a_revoked_generation_is_abandoned(self) -> None:
        """A fold that finishes after its partition was revoked writes no claim."""
        given(PartitionsAssigned(5, frozenset({P})), PartitionsRevoked(frozenset({P}))).when(
            JournalFolded(P, 5, 99, 3)
        ).then().holding(P, None)

    def test_work_of_an_older_generation_is_abandoned_after_a_new_assignment(self) -> None:
        """A claim queued for generation 5 is not written once generation 6 assigned the partition."""
        given(PartitionsAssigned(5, frozenset({P})), PartitionsAssigned(6, frozenset({P}))).when(
            JournalFolded(P, 5, 99, 3)
        ).then().holding(P, Hold(6, Phase.RECOVERING))

    def test_a_late_write_result_of_an_old_generation_changes_nothing(self) -> None:
        """The settle of a claim made for a lost generation is ignored."""
        before = given(
            *deciding_facts()[:4], PartitionsRevoked(frozenset({P})), PartitionsAssigned(6, frozenset({P}))
        )
        before.when(ClaimSettled(P, 5, claim_of(ME, 4, 5, 100), 4)).then().holding(
            P, Hold(6, Phase.RECOVERING)
        )

    def test_an_older_assignment_told_late_is_ignored(self) -> None:
        """Generations only move forward."""
        given(PartitionsAssigned(6, frozenset({P}))).when(PartitionsAssigned(5, frozenset({1}))).then()

    def test_the_same_assignment_told_twice_changes_nothing(self) -> None:
        """Faust may tell an assignment twice: the recovery under way goes on."""
        given(*deciding_facts()).when(PartitionsAssigned(5, frozenset({P}))).then()

    def test_revocation_stops_deciding_at_once(self) -> None:
        """A revoked partition is no longer decided, in the same step."""
        given(*deciding_facts()).when(PartitionsRevoked(frozenset({P}))).then(
            StopDeciding(P, "the group took the partition away")
        ).holding(P, None)

    def test_a_new_generation_recovers_a_decided_partition_again(self) -> None:
        """Assigned again in a new generation (no revocation told), a partition is claimed anew."""
        given(*deciding_facts()).when(PartitionsAssigned(6, frozenset({P}))).then(
            StopDeciding(P, "assigned again in a new generation"), ReadSnapshot(P, 6)
        )

    def test_a_partition_left_out_of_the_new_assignment_stops(self) -> None:
        """The assignment is the whole of it: a held partition not in it is let go."""
        given(*deciding_facts()).when(PartitionsAssigned(6, frozenset({1}))).then(
            StopDeciding(P, "not in the group's new assignment"), ReadSnapshot(1, 6)
        ).holding(P, None)


class TestLostClaims:
    def test_a_claim_lost_to_a_newer_generation_steps_down(self) -> None:
        """Another worker of a newer generation claimed: this one never claims again, higher."""
        theirs = claim_of(OTHER, 4, 6, 98)
        given(*deciding_facts()[:4]).when(ClaimSettled(P, 5, theirs, 4)).then().holding(
            P, Hold(5, Phase.STEPPED_DOWN, highest_epoch=4, claim_epoch=4, claim_offset=100, fenced_by=theirs)
        )

    def test_a_claim_lost_to_the_same_generation_steps_down(self) -> None:
        """Two claimers of one generation: the first in the log wins, the other steps down."""
        theirs = claim_of(OTHER, 4, 5, 98)
        when = given(*deciding_facts()[:4]).when(ClaimSettled(P, 5, theirs, 4)).then()
        assert Phase.STEPPED_DOWN == when.state.holds[P].phase

    def test_a_claim_lost_to_an_unknown_generation_steps_down(self) -> None:
        """A claim without a generation (an older release's) is never assumed to be a zombie's."""
        theirs = claim_of(OTHER, 4, UNKNOWN_GENERATION, 98)
        when = given(*deciding_facts()[:4]).when(ClaimSettled(P, 5, theirs, 4)).then()
        assert Phase.STEPPED_DOWN == when.state.holds[P].phase

    def test_a_claim_lost_to_an_older_generation_claims_again_higher(self) -> None:
        """A zombie of generation 4 wrote its claim first: the assigned worker claims above it."""
        theirs = claim_of(OTHER, 4, 4, 98)
        given(*deciding_facts()[:4]).when(ClaimSettled(P, 5, theirs, 4)).then(WriteClaim(P, 5, 5)).holding(
            P, Hold(5, Phase.CLAIMING, highest_epoch=4, claim_epoch=5)
        )


class TestNewerClaims:
    def test_a_newer_claim_stops_deciding_in_the_same_step(self) -> None:
        """The watcher read a newer claim of a newer generation: stop, say who, stay down."""
        theirs = claim_of(OTHER, 5, 6, 140)
        given(*deciding_facts()).when(ClaimRead(P, theirs)).then(
            StopDeciding(
                P,
                "worker worker-b claimed the partition with epoch 5 (generation 6) "
                "over this worker's epoch 4",
                theirs,
            )
        ).holding(
            P, Hold(5, Phase.STEPPED_DOWN, highest_epoch=5, claim_epoch=4, claim_offset=100, fenced_by=theirs)
        )

    def test_a_zombies_newer_claim_stops_deciding_and_claims_again(self) -> None:
        """A claim of an older generation fenced the assigned worker: it stops, then recovers anew."""
        theirs = claim_of(OTHER, 5, 4, 140)
        when = given(*deciding_facts()).when(ClaimRead(P, theirs))
        assert [StopDeciding, ReadSnapshot] == [type(c) for c in when.commands]
        assert ReadSnapshot(P, 5) == when.commands[1]
        why = "a late claim of generation 4 (epoch 5) fenced its own"
        assert Hold(5, Phase.RECOVERING, highest_epoch=5, problem=why) == when.state.holds[P]

    def test_its_own_claim_read_back_changes_nothing(self) -> None:
        """The watcher reads the worker's own claim first: nothing happens."""
        given(*deciding_facts()).when(ClaimRead(P, claim_of(ME, 4, 5, 100))).then().holding(
            P, Hold(5, Phase.DECIDING, highest_epoch=4, claim_epoch=4, claim_offset=100)
        )

    def test_a_claim_of_a_partition_not_held_changes_nothing(self) -> None:
        """Claims of other partitions are not this worker's business."""
        state = given(*deciding_facts()).state
        assert state == step(state, ClaimRead(7, claim_of(OTHER, 9, 6, 1))).state

    def test_a_stepped_down_partition_stays_down_until_assigned_anew(self) -> None:
        """Further claims change only what it knows; a new assignment recovers it."""
        theirs = claim_of(OTHER, 5, 6, 140)
        down = given(*deciding_facts(), ClaimRead(P, theirs))
        down.when(ClaimRead(P, claim_of(OTHER, 6, 7, 150))).then()
        down.when(PartitionsAssigned(7, frozenset({P}))).then(ReadSnapshot(P, 7))
        assert frozenset({P}) == down.state.stepped_down()


# ------------------------------------------------------------- properties

GENERATIONS = st.integers(min_value=1, max_value=4)
PARTITIONS = st.integers(min_value=0, max_value=2)
EPOCHS = st.integers(min_value=0, max_value=6)
WORKERS = st.sampled_from([ME, OTHER])
CLAIMS = st.builds(Claim, EPOCHS, WORKERS, st.integers(min_value=-1, max_value=4), st.integers(0, 50))
FACTS = st.one_of(
    st.builds(PartitionsAssigned, GENERATIONS, st.frozensets(PARTITIONS, max_size=3)),
    st.builds(PartitionsRevoked, st.frozensets(PARTITIONS, max_size=3)),
    st.builds(SnapshotRead, PARTITIONS, GENERATIONS, EPOCHS, st.integers(-1, 50)),
    st.builds(JournalFolded, PARTITIONS, GENERATIONS, st.integers(-1, 50), EPOCHS),
    st.builds(ClaimWritten, PARTITIONS, GENERATIONS, EPOCHS, st.integers(0, 50)),
    st.builds(ClaimWriteFailed, PARTITIONS, GENERATIONS, EPOCHS, st.just("x")),
    st.builds(ClaimSettled, PARTITIONS, GENERATIONS, CLAIMS, EPOCHS),
    st.builds(BarriersResent, PARTITIONS, GENERATIONS),
    st.builds(ResendFailed, PARTITIONS, GENERATIONS, st.just("x")),
    st.builds(RecoveryFailed, PARTITIONS, GENERATIONS, st.just("x")),
    st.builds(ClaimRead, PARTITIONS, CLAIMS),
)


class TestProperties:
    @settings(max_examples=300)
    @hypothesis_given(st.lists(FACTS, max_size=40))
    def test_claims_are_written_only_for_the_generation_that_assigned_the_partition(
        self, facts: list[Fact]
    ) -> None:
        """Every WriteClaim names the generation the partition is held in, higher than any epoch seen."""
        state = initial_ownership(ME)
        for fact in facts:
            made = step(state, fact)
            for command in made.commands:
                if isinstance(command, WriteClaim):
                    hold = made.state.holds[command.partition]
                    assert command.generation == hold.generation
                    assert command.epoch == hold.claim_epoch
                    assert command.epoch > state.holds[command.partition].highest_epoch
            state = made.state

    @settings(max_examples=300)
    @hypothesis_given(st.lists(FACTS, max_size=40))
    def test_no_command_for_a_partition_after_it_is_revoked(self, facts: list[Fact]) -> None:
        """After a revocation, nothing is done for the partition until it is assigned again."""
        state = initial_ownership(ME)
        revoked: set[int] = set()
        for fact in facts:
            made = step(state, fact)
            if isinstance(fact, PartitionsRevoked):
                revoked |= fact.partitions & state.holds.keys()
                revoked |= fact.partitions - state.holds.keys()
            if isinstance(fact, PartitionsAssigned) and fact.generation >= state.generation:
                revoked -= fact.partitions
            for command in made.commands:
                if not isinstance(command, StopDeciding):
                    assert command.partition not in revoked, (fact, command)
            state = made.state

    @settings(max_examples=300)
    @hypothesis_given(st.lists(FACTS, max_size=40))
    def test_deciding_only_under_the_workers_own_settled_claim(self, facts: list[Fact]) -> None:
        """A partition is decided only under a claim of this worker that the journal read settled."""
        state = initial_ownership(ME)
        settled: dict[int, tuple[int, int]] = {}
        for fact in facts:
            made = step(state, fact)
            if isinstance(fact, ClaimSettled) and fact.effective.worker_id == ME:
                settled[fact.partition] = (fact.generation, fact.effective.epoch)
            for command in made.commands:
                if isinstance(command, StartDeciding):
                    hold = made.state.holds[command.partition]
                    assert (hold.generation, command.epoch) == settled[command.partition]
            state = made.state

    @settings(max_examples=300)
    @hypothesis_given(st.lists(FACTS, max_size=40), CLAIMS)
    def test_a_newer_claim_never_leaves_the_partition_decided(self, facts: list[Fact], claim: Claim) -> None:
        """Whatever came before, a claim newer than its own stops the deciding in that step."""
        state = steps(initial_ownership(ME), facts).state
        for partition, hold in state.holds.items():
            newer = Claim(hold.claim_epoch + 1, OTHER, claim.generation, claim.offset)
            after = step(state, ClaimRead(partition, newer))
            assert partition not in after.state.deciding()
            if hold.phase in (Phase.DECIDING, Phase.RESENDING):
                assert isinstance(after.commands[0], StopDeciding)

    @settings(max_examples=200)
    @hypothesis_given(st.lists(FACTS, max_size=40), st.integers(0, 40))
    def test_stepping_in_pieces_equals_stepping_at_once(self, facts: list[Fact], cut: int) -> None:
        """Folding the facts in two pieces gives the state and commands of folding them at once."""
        whole = steps(initial_ownership(ME), facts)
        first = steps(initial_ownership(ME), facts[:cut])
        second = steps(first.state, facts[cut:])
        assert whole.state == second.state
        assert whole.commands == first.commands + second.commands
