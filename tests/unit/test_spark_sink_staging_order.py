"""When the Spark exactly-once sink stages, against the barrier, the ack and the completion
(docs/exactly-once.md, "The Spark sink"): the rule that tells a sink called first in ``foreachBatch``
from one called after something ran the barrier batch, whose checkpoint may already be complete.

A barrier is folded into the end offset of the batch it opens; Spark writes that offset, then calls
``foreachBatch``. Called first, the sink stages the output before the cut, then runs the batch, whose
tasks snapshot into the checkpoint's location and ack; only then can the journal complete it. That
order holds for every kind of barrier: a periodic checkpoint, a savepoint, a stop-with-savepoint with
or without ``--drain`` (its batch holds no records, but its tasks still snapshot and ack while it
runs). So a task snapshot already in the location when the sink stages means the batch ran first.
"""

from __future__ import annotations

import pytest

from events.wire.records import CheckpointBarrier, CheckpointKind
from spark_tasks.kafka_sink import staged_late_problem, task_snapshots

ATTEMPT = 2


def barrier(
    kind: CheckpointKind = CheckpointKind.CHECKPOINT, *, stop: bool = False, drain: bool = False
) -> CheckpointBarrier:
    return CheckpointBarrier("wc", 7, ATTEMPT, kind, 0, "file:///chk/wc/chk-7", stop=stop, drain=drain)


KINDS = [
    pytest.param(barrier(), id="periodic-checkpoint"),
    pytest.param(barrier(CheckpointKind.SAVEPOINT), id="savepoint"),
    pytest.param(barrier(CheckpointKind.SAVEPOINT, stop=True), id="stop-with-savepoint"),
    pytest.param(barrier(CheckpointKind.SAVEPOINT, stop=True, drain=True), id="stop-with-savepoint-drain"),
]


class TestTaskSnapshots:
    def test_the_snapshots_manifests_and_pieces_of_the_attempts_tasks_count(self) -> None:
        """A per-partition snapshot, a keyed manifest and its piece are what tasks write before they ack."""
        names = ["words-0.a2-r1.cut-40", "keyed-1.a2-r1.cut-3", "keyed-1.a2-r1.cut-3.full"]

        assert tuple(sorted(names)) == task_snapshots(names, ATTEMPT)

    def test_the_sinks_own_file_metadata_and_another_attempts_snapshots_do_not(self) -> None:
        """The staged output, the checkpoint's metadata and an earlier attempt's files are no sign
        that this attempt's batch ran."""
        names = ["driver.counts.out", "_metadata", "words-0.a1-r0.cut-40", "words-0.a12-r3.cut-40"]

        assert () == task_snapshots(names, ATTEMPT)


class TestStagedLateProblem:
    @pytest.mark.parametrize("given", KINDS)
    def test_a_sink_called_first_stages_before_any_task_snapshots(self, given: CheckpointBarrier) -> None:
        """Given a barrier batch of any kind, when the sink is called first in foreachBatch (no task
        has snapshotted: none can have acked, the journal cannot have completed it), then all is well."""
        assert staged_late_problem("counts", given, task_snapshots(["driver.counts.out"], ATTEMPT)) is None

    @pytest.mark.parametrize("given", KINDS)
    def test_a_sink_called_after_the_batch_ran_is_a_misuse(self, given: CheckpointBarrier) -> None:
        """Given a barrier batch whose tasks already snapshotted (collect() ran before the sink), when
        the sink stages, then it is refused, saying what to do; a stop savepoint is no exception."""
        problem = staged_late_problem("counts", given, ("words-0.a2-r1.cut-40",))

        assert problem is not None
        assert "Call sink(batch_df, batch_id) first in foreachBatch" in problem
        assert "words-0.a2-r1.cut-40" in problem

    def test_the_error_names_the_barriers_kind(self) -> None:
        """The error says which checkpoint it is about, stop and drain included."""
        stop = barrier(CheckpointKind.SAVEPOINT, stop=True, drain=True)

        problem = staged_late_problem("counts", stop, ("words-0.a2-r1.cut-40",))

        assert problem is not None
        assert "stop-with-savepoint --drain 7" in problem

    def test_a_long_list_of_snapshots_is_shortened(self) -> None:
        """Dozens of tasks do not make a message of dozens of names."""
        snapshots = tuple(f"words-{p}.a2-r1.cut-40" for p in range(10))

        problem = staged_late_problem("counts", barrier(), snapshots)

        assert problem is not None
        assert "words-2.a2-r1.cut-40, ..." in problem
        assert "words-3." not in problem
