"""What a checkpointed Spark job deletes when its ledger discards a checkpoint (spark_tasks/retention.py):
given (what retention remembers, the files in each directory) / when (a checkpoint completes or aborts)
/ then (the files deleted, in order). The rule: never delete what a restore may need."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from events.task.ledger import Discard
from spark_tasks.retention import (
    DeleteFile,
    DirectoryFiles,
    DiscardAborted,
    RemoveIfEmpty,
    RetainCompleted,
    RetentionCommand,
    RetentionPlan,
    RetentionState,
    directories_to_read,
    plan_retention,
)

ROOT = "file:///checkpoints/wc"


def chk(checkpoint_id: int) -> str:
    return f"{ROOT}/chk-{checkpoint_id}"


def piece(checkpoint_id: int, name: str) -> str:
    return f"{chk(checkpoint_id)}/{name}"


def when(
    state: RetentionState, command: RetentionCommand, files: Mapping[str, DirectoryFiles]
) -> RetentionPlan:
    """Plan ``command``, after checking that it reads only directories it asked for."""
    asked = set(directories_to_read(state, command))
    assert set(files) <= asked, f"the test gives {sorted(set(files) - asked)}, which the plan never asks for"
    return plan_retention(state, command, files)


class TestPerPartitionJob:
    def test_a_discarded_checkpoint_loses_this_runs_snapshots_and_its_metadata(self) -> None:
        """Checkpoint 3 completes and the ledger discards checkpoint 1: its snapshots and _metadata go,
        then its directory if nothing else is in it."""
        state = RetentionState(keyed=False)
        files = {chk(1): DirectoryFiles(snapshots=("words-0.a0-r.cut-40", "words-1.a0-r.cut-60"))}

        plan = when(state, RetainCompleted(3, (Discard(1, chk(1)),)), files)

        assert (
            DeleteFile(piece(1, "words-0.a0-r.cut-40")),
            DeleteFile(piece(1, "words-1.a0-r.cut-60")),
            DeleteFile(piece(1, "_metadata")),
            RemoveIfEmpty(chk(1)),
        ) == plan.steps
        assert state == plan.state

    def test_a_checkpoint_outside_the_location_is_never_touched(self) -> None:
        """The ledger knows no directory of the checkpoint (not inside the job's location): nothing
        of it is the job's to delete."""
        plan = when(RetentionState(keyed=False), DiscardAborted(Discard(4, None)), {})

        assert () == plan.steps

    def test_an_aborted_checkpoint_goes_at_once(self) -> None:
        """Without pieces there is nothing to wait for: an aborted checkpoint's snapshots go now."""
        files = {chk(4): DirectoryFiles(snapshots=("words-0.a0-r.cut-90",))}

        plan = when(RetentionState(keyed=False), DiscardAborted(Discard(4, chk(4))), files)

        assert (
            DeleteFile(piece(4, "words-0.a0-r.cut-90")),
            DeleteFile(piece(4, "_metadata")),
            RemoveIfEmpty(chk(4)),
        ) == plan.steps
        assert () == plan.state.aborted


class TestKeyedJob:
    def test_a_piece_a_retained_chain_lists_stays_and_its_directory_is_remembered(self) -> None:
        """Checkpoint 2's chain lists checkpoint 1's full piece; when 1 is discarded, its delta goes
        but the full piece stays, and the directory is kept for a later sweep."""
        state = RetentionState(keyed=True, needed={1: frozenset({piece(1, "keyed-0.full")})})
        files = {chk(1): DirectoryFiles(pieces=("keyed-0.full", "keyed-0.delta"))}
        chain = frozenset({piece(1, "keyed-0.full"), piece(2, "keyed-0.delta")})

        plan = when(state, RetainCompleted(2, (Discard(1, chk(1)),), chain), files)

        assert (
            DeleteFile(piece(1, "_metadata")),
            DeleteFile(piece(1, "keyed-0.delta")),
            RemoveIfEmpty(chk(1)),
        ) == plan.steps
        assert {2: chain} == dict(plan.state.needed)
        assert frozenset({chk(1)}) == plan.state.kept

    def test_a_kept_piece_goes_once_no_retained_chain_lists_it(self) -> None:
        """Checkpoint 3 completes with a fresh full snapshot and discards 2: no retained chain lists
        checkpoint 1's piece any more, so the sweep deletes it and forgets the directory."""
        state = RetentionState(
            keyed=True,
            needed={2: frozenset({piece(1, "keyed-0.full"), piece(2, "keyed-0.delta")})},
            kept=frozenset({chk(1)}),
        )
        files = {
            chk(1): DirectoryFiles(pieces=("keyed-0.full",)),
            chk(2): DirectoryFiles(pieces=("keyed-0.delta",)),
        }

        plan = when(
            state, RetainCompleted(3, (Discard(2, chk(2)),), frozenset({piece(3, "keyed-0.full")})), files
        )

        assert (
            DeleteFile(piece(2, "_metadata")),
            DeleteFile(piece(2, "keyed-0.delta")),
            RemoveIfEmpty(chk(2)),
            RemoveIfEmpty(chk(2)),
            DeleteFile(piece(1, "keyed-0.full")),
            RemoveIfEmpty(chk(1)),
        ) == plan.steps
        assert frozenset() == plan.state.kept

    def test_an_aborted_checkpoints_pieces_wait_for_a_later_completion(self) -> None:
        """Checkpoint 5 aborts: its snapshots' _metadata goes, its pieces wait (a pending chain may
        list them). Checkpoint 6 completes listing one of them: only the other goes."""
        files = {chk(5): DirectoryFiles(pieces=("keyed-0.delta", "keyed-1.delta"))}

        aborted = when(RetentionState(keyed=True), DiscardAborted(Discard(5, chk(5))), files)
        chain = frozenset({piece(5, "keyed-0.delta")})
        completed = when(aborted.state, RetainCompleted(6, (), chain), files)

        assert (DeleteFile(piece(5, "_metadata")), RemoveIfEmpty(chk(5))) == aborted.steps
        assert ((5, chk(5)),) == aborted.state.aborted
        assert (DeleteFile(piece(5, "keyed-1.delta")),) == completed.steps
        assert () == completed.state.aborted
        assert frozenset({chk(5)}) == completed.state.kept

    def test_a_newer_aborted_checkpoint_outlives_an_older_completion(self) -> None:
        """Checkpoint 7 aborted while 6 was still pending: 6's completion does not sweep 7's pieces."""
        state = RetentionState(keyed=True, aborted=((7, chk(7)),))

        plan = when(state, RetainCompleted(6, (), frozenset()), {})

        assert chk(7) not in directories_to_read(state, RetainCompleted(6, (), frozenset()))
        assert () == plan.steps
        assert ((7, chk(7)),) == plan.state.aborted

    def test_a_savepoint_keeps_no_chain_and_sweeps_nothing(self) -> None:
        """A keyed savepoint (no pieces: retention never discards it) leaves the waiting pieces waiting."""
        state = RetentionState(keyed=True, aborted=((5, chk(5)),))

        plan = when(state, RetainCompleted(9, ()), {})

        assert () == plan.steps
        assert state == plan.state


@st.composite
def journals(draw: st.DrawFn) -> tuple[int, list[tuple[bool, int]]]:
    """How many checkpoints the ledger retains, and checkpoints 1..n in order: each completes or
    aborts, and a completed one's chain reaches back ``depth`` checkpoints."""
    retained = draw(st.integers(1, 3))
    outcomes = draw(st.lists(st.tuples(st.booleans(), st.integers(0, 4)), min_size=1, max_size=14))
    return retained, outcomes


@settings(max_examples=300, deadline=None)
@given(journals())
def test_no_piece_a_retained_checkpoint_needs_is_ever_deleted(
    journal: tuple[int, list[tuple[bool, int]]],
) -> None:
    """Given a keyed job's storage (each checkpoint writes a full and a delta piece, and a completed
    checkpoint's chain lists its own pieces and pieces of the checkpoints ``depth`` back that still
    exist), when the checkpoints complete or abort in order and retention carries out every plan,
    then every piece a retained checkpoint's chain lists still exists after every step; and every
    piece left is needed, in a retained checkpoint's directory, or an aborted one's that waits."""
    retained, outcomes = journal
    storage: dict[str, set[str]] = {}
    state = RetentionState(keyed=True)
    kept_ids: list[int] = []
    chains: dict[int, frozenset[str]] = {}
    for checkpoint_id, (completes, depth) in enumerate(outcomes, start=1):
        storage[chk(checkpoint_id)] = {"keyed-0.full", "keyed-0.delta"}
        if completes:
            reach = range(max(1, checkpoint_id - depth), checkpoint_id + 1)
            chain = frozenset(f"{chk(i)}/{name}" for i in reach for name in sorted(storage.get(chk(i), ())))
            chains[checkpoint_id] = chain
            kept_ids.append(checkpoint_id)
            discards = []
            while len(kept_ids) > retained:
                old = kept_ids.pop(0)
                discards.append(Discard(old, chk(old)))
            command: RetentionCommand = RetainCompleted(checkpoint_id, tuple(discards), chain)
        else:
            command = DiscardAborted(Discard(checkpoint_id, chk(checkpoint_id)))
        files = {
            d: DirectoryFiles(pieces=tuple(sorted(storage.get(d, ()))))
            for d in directories_to_read(state, command)
        }
        plan = plan_retention(state, command, files)
        for step in plan.steps:
            if isinstance(step, DeleteFile):
                directory, name = step.uri.rsplit("/", 1)
                storage.get(directory, set()).discard(name)
        state = plan.state

        existing = {f"{d}/{name}" for d, names in storage.items() for name in names}
        needed = frozenset().union(*(chains[i] for i in kept_ids))
        assert needed <= existing, f"deleted what checkpoints {kept_ids} need: {sorted(needed - existing)}"
        assert needed == state.needed_pieces
        last_completed = max(kept_ids, default=0)
        waiting = {
            chk(i)
            for i, (done, _) in enumerate(outcomes[:checkpoint_id], 1)
            if not done and i > last_completed
        }
        owned = {chk(i) for i in kept_ids} | waiting
        left = {uri for uri in existing if uri not in needed and uri.rsplit("/", 1)[0] not in owned}
        assert set() == left, "left behind for good"
