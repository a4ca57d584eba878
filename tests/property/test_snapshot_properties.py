"""Bounded recovery (docs/design.md, "Ownership and fencing"): a decoded snapshot plus the journal tail is
the whole journal.

The scenarios are the decider properties' (realistic command sequences of a few jobs);
each property snapshots the coordinator's folded state at a drawn point of the journal,
encodes and decodes it, and carries on from the decoded snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import given
from hypothesis import strategies as st
from test_decider_properties import PROPERTY, Scenario, play, scenarios

from coordinator.core.decider import InputRejected, evolve
from coordinator.core.snapshot import PartitionSnapshot, decode_snapshot, encode_snapshot, trigger_key
from coordinator.core.state import JobState, initial_state
from coordinator.core.stats import CheckpointStats, track
from coordinator.core.testing import differences
from events.wire.codec import default_codec
from events.wire.records import JournalEvent

Folded = tuple[dict[str, JobState], dict[str, CheckpointStats]]


def fold_with_stats(
    events: Sequence[JournalEvent],
    states: Mapping[str, JobState] | None = None,
    stats: Mapping[str, CheckpointStats] | None = None,
) -> Folded:
    """States and statistics after ``events``, as the coordinator's recovery folds them."""
    states, stats = dict(states or {}), dict(stats or {})
    for event in events:
        before = states.get(event.job_id) or initial_state(event.job_id)
        stats[event.job_id] = track(stats.get(event.job_id), before, event)
        states[event.job_id] = evolve(before, event)
    return states, stats


def snapshot(folded: Folded, journal_offset: int) -> PartitionSnapshot:
    """What a worker would write after folding the journal up to ``journal_offset``."""
    states, stats = folded
    return PartitionSnapshot(
        partition=0,
        epoch=1 + journal_offset % 3,
        journal_offset=journal_offset,
        positions={f"cutline.acks:{p}": journal_offset + p for p in range(2)},
        trigger_epochs={trigger_key(j, c): 1 for j, s in states.items() for c in s.pending},
        states=states,
        stats=stats,
        timestamp_ms=journal_offset,
    )


def through_the_wire(journal: Sequence[JournalEvent]) -> list[JournalEvent]:
    """The journal as a recovering coordinator reads it back from Kafka."""
    codec = default_codec()
    return [codec.decode(codec.encode(event)) for event in journal]  # type: ignore[misc]


class TestRecoveryFromSnapshot:
    @PROPERTY
    @given(scenarios(), st.data())
    def test_folding_the_tail_from_a_decoded_snapshot_equals_folding_the_whole_journal(
        self, scenario: Scenario, data: st.DataObject
    ) -> None:
        """Snapshot after any event, decode, fold the rest: the states and statistics of the whole fold."""
        journal = scenario.journal
        cut = data.draw(st.integers(0, len(journal)), label="snapshot after")
        written = snapshot(fold_with_stats(journal[:cut]), cut - 1)

        decoded = decode_snapshot(encode_snapshot(written))
        recovered = fold_with_stats(journal[cut:], decoded.states, decoded.stats)

        assert written == decoded
        assert fold_with_stats(journal) == recovered

    @PROPERTY
    @given(scenarios(), st.data())
    def test_a_snapshot_of_the_journal_read_back_decodes_identically(
        self, scenario: Scenario, data: st.DataObject
    ) -> None:
        """From the journal as Kafka gives it back, a snapshot keeps every value, type and key order."""
        journal = through_the_wire(scenario.journal)
        cut = data.draw(st.integers(0, len(journal)), label="snapshot after")
        written = snapshot(fold_with_stats(journal[:cut]), cut - 1)

        decoded = decode_snapshot(encode_snapshot(written))
        recovered = fold_with_stats(journal[cut:], decoded.states, decoded.stats)

        assert [] == differences(written, decoded)
        assert [] == differences(fold_with_stats(journal), recovered)

    @PROPERTY
    @given(scenarios(), st.data())
    def test_a_coordinator_recovered_from_a_snapshot_decides_the_rest_the_same(
        self, scenario: Scenario, data: st.DataObject
    ) -> None:
        """After a crash anywhere, a coordinator recovered from a snapshot decides the rest the same."""
        crash = data.draw(st.integers(0, len(scenario.steps)), label="crash after")
        before = [d for s in scenario.steps[:crash] for d in s.decisions if not isinstance(d, InputRejected)]
        decoded = decode_snapshot(encode_snapshot(snapshot(fold_with_stats(before), len(before) - 1)))

        resumed = play(scenario.commands[crash:], dict(decoded.states))

        assert [s.decisions for s in scenario.steps[crash:]] == [s.decisions for s in resumed]
