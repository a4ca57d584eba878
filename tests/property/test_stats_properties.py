"""The checkpoint statistics as the views show them count exactly the acks the journal holds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from test_decider_properties import PROPERTY, Scenario, scenarios
from test_snapshot_properties import fold_with_stats

from coordinator.core.stats import with_progress
from events.wire.records import TaskAcknowledged


class TestShownStatistics:
    @PROPERTY
    @given(scenarios(), st.data())
    def test_an_unfinished_or_failed_entry_counts_the_acks_journaled_for_it(
        self, scenario: Scenario, data: st.DataObject
    ) -> None:
        """At any point of the journal, every in-progress or failed entry shows as many acks as
        tasks acknowledged its checkpoint before then (never more than its tasks), their summed
        state size and the latest ack's time."""
        journal = scenario.journal
        cut = data.draw(st.integers(0, len(journal)), label="shown after")
        states, stats = fold_with_stats(journal[:cut])

        for job_id, tracked in stats.items():
            shown = with_progress(tracked, states[job_id])
            assert shown is not None
            for entry in shown.history:
                if entry.status == "COMPLETED":
                    continue  # its figures come from the CheckpointCompleted record itself
                acks = {
                    e.task_id: e
                    for e in journal[:cut]
                    if isinstance(e, TaskAcknowledged) and (e.job_id, e.checkpoint_id) == (job_id, entry.id)
                }
                assert len(acks) == entry.num_acknowledged_subtasks <= entry.num_subtasks
                assert sum(a.state.size_bytes for a in acks.values() if a.state) == entry.state_size
                latest = max((a.timestamp_ms for a in acks.values()), default=None)
                assert latest == entry.latest_ack_timestamp
