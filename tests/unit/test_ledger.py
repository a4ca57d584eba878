"""The one ledger of the task side (events.task.ledger): what a reader of a job's journal (a Spark job's
driver, a participant, ``cutline run``) makes of it, hostile records included. No Spark, no broker,
no files: exact decisions, and Hypothesis for the invariants."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.simulation.traffic import Rates, simulate
from events.task.ledger import (
    FOLDED_RECORDS,
    Abort,
    Complete,
    ConfirmRunning,
    Discard,
    Fail,
    Finish,
    GiveUp,
    Ignore,
    JobLedger,
    Restart,
    attempt_after,
    completion_problem,
)
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointTriggered,
    JobFailedPermanently,
    JobHeartbeatRecorded,
    JobRestartScheduled,
    JobStatus,
    Record,
    SchedulerStarted,
    SchedulerStopped,
    StateHandle,
    TaskAcknowledged,
    TaskStatusRecorded,
)

JOB = "wc"
ROOT = Path("/data/checkpoints")
TASKS = ("words-0", "words-1")
PARTITIONS = (("words", 0), ("words", 1))
SAVEPOINTS = Path("/data/savepoints")


def _ledger(
    retained: int = 1,
    attempt: int = 2,
    history: tuple[CheckpointCompleted, ...] = (),
    location: str = ROOT.as_uri(),
) -> JobLedger:
    return JobLedger(
        JOB,
        attempt,
        retained=retained,
        location=location,
        tasks=TASKS,
        partitions=PARTITIONS,
        history=history,
    )


def _directory(checkpoint_id: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> Path:
    if kind is CheckpointKind.SAVEPOINT:
        return SAVEPOINTS / f"savepoint-{checkpoint_id}"
    return ROOT / JOB / f"chk-{checkpoint_id}"


def _triggered(
    checkpoint_id: int,
    kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    attempt: int = 2,
    location: str | None = None,
) -> CheckpointTriggered:
    where = location or _directory(checkpoint_id, kind).as_uri()
    return CheckpointTriggered(JOB, checkpoint_id, attempt, kind, 1, where, TASKS, 9)


def _completed(
    checkpoint_id: int,
    kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    attempt: int = 2,
    offsets: dict[str, int] | None = None,
    location: str | None = None,
    handles: dict[str, StateHandle] | None = None,
) -> CheckpointCompleted:
    directory = _directory(checkpoint_id, kind)
    if handles is None:
        handles = {
            task: StateHandle((directory / f"{task}.a{attempt}-r1.cut-5").as_uri(), 2, "00" * 32)
            for task in TASKS
        }
    return CheckpointCompleted(
        job_id=JOB,
        checkpoint_id=checkpoint_id,
        kind=kind,
        timestamp_ms=2,
        duration_ms=1,
        handles=handles,
        size_bytes=4,
        offsets={"words:0": 5, "words:1": 7} if offsets is None else offsets,
        attempt=attempt,
        location=location or directory.as_uri(),
    )


def _aborted(checkpoint_id: int, counted: bool = True) -> CheckpointAborted:
    return CheckpointAborted(
        JOB, checkpoint_id, 3, "CHECKPOINT_DECLINED", "declined", counts_as_failure=counted
    )


def _exceeded(checkpoint_id: int) -> CheckpointFailureThresholdExceeded:
    return CheckpointFailureThresholdExceeded(JOB, checkpoint_id, 4, 2, 1, "CHECKPOINT_DECLINED")


def _complete(ledger: JobLedger, *ids: int) -> list[Complete]:
    decisions = []
    for checkpoint_id in ids:
        assert None is ledger.triggered(_triggered(checkpoint_id))
        decision = ledger.completed(_completed(checkpoint_id))
        assert isinstance(decision, Complete)
        decisions.append(decision)
    return decisions


class TestCompletions:
    def test_an_accepted_completion_commits_its_offsets_and_writes_metadata_in_its_directory(self) -> None:
        """A completion of a checkpoint this attempt triggered is acted on."""
        [decision] = _complete(_ledger(), 1)

        assert (("words", 0, 5), ("words", 1, 7)) == decision.commit
        assert _directory(1).as_uri() == decision.metadata
        assert () == decision.discard

    def test_retention_keeps_the_newest_and_discards_the_older_ones_once(self) -> None:
        """With retained=1 each completion discards the one before it, and nothing else."""
        decisions = _complete(_ledger(retained=1), 1, 2, 3)

        assert [(), (Discard(1, _directory(1).as_uri()),), (Discard(2, _directory(2).as_uri()),)] == [
            d.discard for d in decisions
        ]

    def test_retention_keeps_as_many_as_retained(self) -> None:
        """With retained=2 the third completion discards the first."""
        decisions = _complete(_ledger(retained=2), 1, 2, 3)

        assert [(), (), (Discard(1, _directory(1).as_uri()),)] == [d.discard for d in decisions]

    def test_a_second_completion_of_an_id_is_ignored_and_discards_nothing(self) -> None:
        """A duplicate completion of the latest checkpoint cannot push it out of retention."""
        ledger = _ledger(retained=1)
        _complete(ledger, 1, 2)

        assert Ignore("it completed already (a duplicate record)") == ledger.completed(_completed(2))
        assert isinstance(ledger.completed(_completed(1)), Ignore)

    def test_a_completion_known_from_the_history_is_ignored(self) -> None:
        """An id completed by an earlier attempt is never completed (or triggered) again."""
        ledger = _ledger(history=(_completed(4, attempt=1),))

        assert isinstance(ledger.triggered(_triggered(4)), Ignore)
        assert isinstance(ledger.completed(_completed(4)), Ignore)

    def test_a_completion_never_triggered_by_this_attempt_is_ignored(self) -> None:
        """A completion of this attempt needs the trigger this attempt saw."""
        assert Ignore("this attempt never saw it triggered") == _ledger().completed(_completed(99))

    def test_a_completion_of_another_attempt_is_noted_but_not_acted_on(self) -> None:
        """Another attempt's completion does nothing, but a second one of the same id is news."""
        ledger = _ledger()

        assert None is ledger.completed(_completed(3, attempt=1))
        assert isinstance(ledger.completed(_completed(3, attempt=1)), Ignore)
        assert isinstance(ledger.aborted(_aborted(3)), Ignore)

    def test_a_completion_elsewhere_than_its_trigger_is_ignored(self) -> None:
        """The location (and kind) of a completion must be its trigger's."""
        ledger = _ledger()
        ledger.triggered(_triggered(1))

        decision = ledger.completed(_completed(1, location="file:///etc"))

        assert isinstance(decision, Ignore) and "not as CHECKPOINT at file:///etc" in decision.reason
        assert isinstance(ledger.completed(_completed(1, kind=CheckpointKind.SAVEPOINT)), Ignore)

    @pytest.mark.parametrize(
        ("offsets", "problem"),
        [
            ({"words:²": 5}, "malformed offsets"),
            ({"words:-1": 5}, "malformed offsets"),
            ({"words:0": -5}, "malformed offsets"),
            ({"other:0": 5}, "not the job's: other:0"),
        ],
    )
    def test_a_completion_with_bad_offsets_is_ignored(self, offsets: dict[str, int], problem: str) -> None:
        """Offsets keys are parsed strictly, and must be the job's partitions; nothing is committed."""
        ledger = _ledger()
        ledger.triggered(_triggered(1))

        decision = ledger.completed(_completed(1, offsets=offsets))

        assert isinstance(decision, Ignore) and problem in decision.reason

    @pytest.mark.parametrize(
        "uri",
        [
            "file:///etc/passwd",
            (ROOT / JOB / "chk-1" / ".." / "chk-2" / "words-0").as_uri(),
            (ROOT / JOB / "chk-1" / "sub" / "words-0").as_uri(),
            "s3://bucket/chk-1/words-0",
        ],
    )
    def test_a_completion_whose_state_is_elsewhere_is_ignored(self, uri: str) -> None:
        """Every handle must name a file directly in the checkpoint's directory."""
        ledger = _ledger()
        ledger.triggered(_triggered(1))

        decision = ledger.completed(_completed(1, handles={"words-0": StateHandle(uri, 1, "00" * 32)}))

        assert isinstance(decision, Ignore) and "is not in" in decision.reason

    def test_a_completion_with_the_state_of_a_foreign_task_is_ignored(self) -> None:
        """Handles name the job's tasks only."""
        ledger = _ledger()
        ledger.triggered(_triggered(1))
        handle = StateHandle((_directory(1) / "x").as_uri(), 1, "00" * 32)

        decision = ledger.completed(_completed(1, handles={"other-0": handle}))

        assert isinstance(decision, Ignore) and "other-0" in decision.reason


class TestLocations:
    def test_a_trigger_outside_the_checkpoint_location_is_ignored_and_nothing_of_it_is_touched(self) -> None:
        """A checkpoint elsewhere than under config.location is neither completed nor discarded."""
        ledger = _ledger()

        ignored = ledger.triggered(_triggered(1, location="file:///etc/cutline"))
        completed = ledger.completed(_completed(1, location="file:///etc/cutline"))
        aborted = ledger.aborted(_aborted(1))

        assert isinstance(ignored, Ignore) and "outside the checkpoint location" in ignored.reason
        assert isinstance(completed, Ignore)
        assert Abort(_aborted(1), None) == aborted

    def test_a_trigger_that_escapes_with_dot_dot_is_outside(self) -> None:
        """``..`` in a location is refused, wherever it would lead."""
        location = (ROOT / JOB / ".." / ".." / "elsewhere").as_uri()

        assert isinstance(_ledger().triggered(_triggered(1, location=location)), Ignore)

    def test_a_second_trigger_of_an_id_elsewhere_is_ignored(self) -> None:
        """The first trigger of an id says where it writes; a contradicting one is ignored."""
        ledger = _ledger()
        ledger.triggered(_triggered(1))

        assert None is ledger.triggered(_triggered(1))
        assert isinstance(ledger.triggered(_triggered(1, location=(ROOT / "x").as_uri())), Ignore)

    def test_savepoints_write_metadata_in_their_target_and_are_never_discarded(self) -> None:
        """A savepoint's _metadata goes to the directory its trigger named; retention skips it."""
        ledger = _ledger(retained=1)
        ledger.triggered(_triggered(2, CheckpointKind.SAVEPOINT))
        _complete(ledger, 1)

        savepoint = ledger.completed(_completed(2, CheckpointKind.SAVEPOINT))
        later = _complete(ledger, 3, 4)

        assert (
            isinstance(savepoint, Complete)
            and _directory(2, CheckpointKind.SAVEPOINT).as_uri() == savepoint.metadata
        )
        assert [(Discard(1, _directory(1).as_uri()),), (Discard(3, _directory(3).as_uri()),)] == [
            d.discard for d in later
        ]

    @pytest.mark.parametrize(
        ("location", "inside"),
        [
            ((ROOT / "wc" / "chk-1").as_uri(), True),
            (ROOT.as_uri(), False),
            ("file:///data/checkpoints-2/wc", False),
            ("file:///data/checkpoints/../x", False),
            ("file:relative/chk-1", False),
            ("s3://bucket/data/checkpoints/wc/chk-1", False),
        ],
    )
    def test_a_checkpoint_is_inside_the_location_only_strictly_below_it_as_written(
        self, location: str, inside: bool
    ) -> None:
        assert (_ledger().triggered(_triggered(1, location=location)) is None) == inside

    def test_on_an_object_store_metadata_and_retention_work_the_same(self) -> None:
        """Given a checkpoint location on S3, completions write _metadata into the checkpoint's
        directory and older checkpoints are discarded, as on a file system."""
        root = "s3://bucket/checkpoints"
        ledger = _ledger(location=root)

        def complete(checkpoint_id: int) -> Complete | Ignore | None:
            where = f"{root}/{JOB}/chk-{checkpoint_id}"
            handles = {t: StateHandle(f"{where}/{t}.a2-r1.cut-5", 2, "00" * 32) for t in TASKS}
            ledger.triggered(_triggered(checkpoint_id, location=where))
            return ledger.completed(_completed(checkpoint_id, location=where, handles=handles))

        first, second = complete(1), complete(2)

        assert isinstance(first, Complete) and first.metadata == f"{root}/{JOB}/chk-1"
        assert isinstance(second, Complete) and second.discard == (Discard(1, f"{root}/{JOB}/chk-1"),)
        outside = ledger.triggered(_triggered(3, location="s3://other-bucket/checkpoints/wc/chk-3"))
        assert isinstance(outside, Ignore)


class TestAborts:
    def test_an_abort_of_this_attempts_checkpoint_discards_its_snapshots(self) -> None:
        """An aborted checkpoint of this attempt is discarded."""
        ledger = _ledger()
        ledger.triggered(_triggered(1))

        assert Abort(_aborted(1), Discard(1, _directory(1).as_uri())) == ledger.aborted(_aborted(1))

    def test_an_abort_of_a_completed_checkpoint_is_ignored(self) -> None:
        """A forged abort of the latest completed checkpoint cannot discard it."""
        ledger = _ledger()
        _complete(ledger, 1)

        decision = ledger.aborted(_aborted(1))

        assert isinstance(decision, Ignore) and "completed already" in decision.reason

    def test_an_abort_of_another_attempts_checkpoint_discards_nothing(self) -> None:
        """The previous attempt's pending checkpoints abort when this one starts; none is ours."""
        assert Abort(_aborted(7), None) == _ledger().aborted(_aborted(7))

    def test_a_savepoints_abort_discards_nothing(self) -> None:
        """Savepoints are never deleted by the job."""
        ledger = _ledger()
        ledger.triggered(_triggered(1, CheckpointKind.SAVEPOINT))

        assert Abort(_aborted(1), None) == ledger.aborted(_aborted(1))

    def test_a_second_abort_and_a_completion_after_an_abort_are_ignored(self) -> None:
        """An aborted id stays aborted."""
        ledger = _ledger()
        ledger.triggered(_triggered(1))
        ledger.aborted(_aborted(1))

        assert isinstance(ledger.aborted(_aborted(1)), Ignore)
        assert isinstance(ledger.completed(_completed(1)), Ignore)


class TestThreshold:
    def test_a_counted_failure_of_this_attempt_fails_the_job_once(self) -> None:
        """The threshold after a counted abort of this attempt's checkpoint stops the query, once."""
        ledger = _ledger()
        ledger.triggered(_triggered(1))
        ledger.aborted(_aborted(1))

        assert Fail(_exceeded(1)) == ledger.threshold(_exceeded(1))
        assert Ignore("the job failed already") == ledger.threshold(_exceeded(1))

    def test_a_threshold_of_another_attempt_is_ignored(self) -> None:
        """A crashed attempt's checkpoints that expire while this one starts are not its fault."""
        ledger = _ledger()
        ledger.aborted(_aborted(1))

        assert Ignore("not a checkpoint of this attempt") == ledger.threshold(_exceeded(1))

    def test_a_threshold_of_a_completed_checkpoint_is_ignored(self) -> None:
        """A completed checkpoint did not fail."""
        ledger = _ledger()
        _complete(ledger, 1)

        assert Ignore("that checkpoint completed") == ledger.threshold(_exceeded(1))

    def test_a_threshold_without_a_counted_failure_is_ignored(self) -> None:
        """The coordinator sends the threshold right after the counted abort; without it, it is forged."""
        ledger = _ledger()
        ledger.triggered(_triggered(1))
        ledger.triggered(_triggered(2))
        ledger.aborted(_aborted(2, counted=False))

        assert isinstance(ledger.threshold(_exceeded(1)), Ignore)
        assert isinstance(ledger.threshold(_exceeded(2)), Ignore)

    def test_a_stale_threshold_after_a_later_completion_is_ignored(self) -> None:
        """A completion resets the failure count: a threshold about an older checkpoint is stale."""
        ledger = _ledger()
        ledger.triggered(_triggered(1))
        ledger.aborted(_aborted(1))
        _complete(ledger, 2)

        assert Ignore("stale: checkpoint 2 completed after it") == ledger.threshold(_exceeded(1))


class TestCommits:
    def test_a_completion_after_a_newer_one_commits_nothing(self) -> None:
        """Offsets never go back: a savepoint completing after a newer checkpoint commits nothing,
        but is acted on otherwise."""
        ledger = _ledger()
        ledger.triggered(_triggered(1, CheckpointKind.SAVEPOINT))
        _complete(ledger, 2)

        savepoint = ledger.completed(_completed(1, CheckpointKind.SAVEPOINT))

        assert (
            Complete(
                _completed(1, CheckpointKind.SAVEPOINT),
                (),
                _directory(1, CheckpointKind.SAVEPOINT).as_uri(),
                (),
            )
            == savepoint
        )


class TestReaderWithoutLocation:
    """A participant knows neither the job's checkpoint location, nor its tasks, nor its triggers:
    it finds its own snapshots by id."""

    @staticmethod
    def _participant(retained: int | None = None) -> JobLedger:
        return JobLedger(JOB, 2, retained=retained)

    def test_a_completion_of_this_attempt_is_acted_on_without_a_trigger(self) -> None:
        """Given no trigger seen, when this attempt's checkpoint completes, then its offsets are committed."""
        completed = _completed(1, location="")

        assert Complete(completed, (("words", 0, 5), ("words", 1, 7)), None, ()) == (
            self._participant().completed(completed)
        )

    def test_retention_discards_the_older_completed_checkpoints_by_id(self) -> None:
        """With retained=1 each completion discards the one before it; the directory is not known."""
        ledger = self._participant(retained=1)

        decisions = [ledger.completed(_completed(i, location="")) for i in (1, 2)]

        assert [(), (Discard(1, None),)] == [d.discard for d in decisions if isinstance(d, Complete)]

    def test_retained_comes_from_this_attempts_scheduler_start_unless_given(self) -> None:
        """Given retained=None, the SchedulerStarted of this attempt sets it; another attempt's does not."""
        ledger = self._participant()
        config = CheckpointConfig(interval_ms=1000, location=ROOT.as_uri(), retained=3)

        ledger.fold(SchedulerStarted(JOB, 1, 1, TASKS, CheckpointConfig(1000, ROOT.as_uri(), retained=7)))
        ledger.fold(SchedulerStarted(JOB, 2, 1, TASKS, config))
        given = self._participant(retained=1)
        given.fold(SchedulerStarted(JOB, 2, 1, TASKS, config))

        assert (3, 1) == (ledger.retained, given.retained)

    def test_an_abort_discards_its_snapshot_whatever_its_kind(self) -> None:
        """The participant deletes what it wrote for an aborted id, savepoint or not."""
        ledger = self._participant()

        assert Abort(_aborted(4), Discard(4, None)) == ledger.fold(_aborted(4))
        assert frozenset({4}) == ledger.aborted_ids

    def test_a_completed_checkpoint_is_never_discarded_by_a_forged_abort(self) -> None:
        ledger = self._participant()
        ledger.completed(_completed(1, location=""))

        assert isinstance(ledger.aborted(_aborted(1)), Ignore)


class TestLifecycle:
    """What the scheduler and the restart strategy decided about this attempt (attempt 2)."""

    def test_this_attempts_scheduler_start_confirms_it_runs(self) -> None:
        config = CheckpointConfig(interval_ms=1000, location=ROOT.as_uri())
        started = SchedulerStarted(JOB, 2, 1, TASKS, config)

        assert ConfirmRunning(started) == _ledger().fold(started)
        assert None is _ledger().fold(SchedulerStarted(JOB, 1, 1, TASKS, config))

    def test_a_restart_of_a_later_attempt_answers_this_attempts_failure(self) -> None:
        """The restart that started this attempt (attempt 2) is about attempt 1: not news."""
        later = JobRestartScheduled(JOB, 3, 5, 1000, "boom", 2)

        assert Restart(later) == _ledger().fold(later)
        assert None is _ledger().fold(JobRestartScheduled(JOB, 2, 5, 1000, "boom", 1))

    def test_giving_up_on_this_or_a_later_attempt_ends_it(self) -> None:
        failed = JobFailedPermanently(JOB, 2, 5, "too many failures", "boom")

        assert GiveUp(failed) == _ledger().fold(failed)
        assert None is _ledger().fold(JobFailedPermanently(JOB, 1, 5, "too many failures", "boom"))

    @pytest.mark.parametrize(
        ("status", "final"),
        [
            (JobStatus.FINISHED, True),
            (JobStatus.CANCELED, True),
            (JobStatus.FAILED, True),
            (JobStatus.FAILING, False),
        ],
    )
    def test_a_final_status_of_this_attempt_finishes_it(self, status: JobStatus, final: bool) -> None:
        """FINISHED, FAILED and CANCELED end the job without a restart; FAILING waits for the strategy."""
        stopped = SchedulerStopped(JOB, 2, 5, status)

        assert (Finish(stopped) if final else None) == _ledger().fold(stopped)
        assert None is _ledger().fold(SchedulerStopped(JOB, 1, 5, status))


class TestAttemptAfter:
    def test_a_new_job_starts_with_attempt_1(self) -> None:
        assert 1 == attempt_after([])

    def test_the_next_attempt_is_past_every_started_completed_and_scheduled_one(self) -> None:
        """A scheduled restart of attempt 4 means attempt 3 ran: the next one is 4."""
        config = CheckpointConfig(interval_ms=1000, location=ROOT.as_uri())
        records = [
            SchedulerStarted(JOB, 1, 1, TASKS, config),
            _completed(1, attempt=2),
            JobRestartScheduled(JOB, 4, 5, 1000, "boom", 3),
        ]

        assert 4 == attempt_after(records)
        assert 3 == attempt_after(records[:2])

    def test_an_attempt_stopped_before_it_started_counts_too(self) -> None:
        """Attempt 2 started after a cancel and was told to stop (no scheduler ever started for it):
        the next run is attempt 3, not 2 again (which the canceled job would ignore)."""
        config = CheckpointConfig(interval_ms=1000, location=ROOT.as_uri())
        records = [
            SchedulerStarted(JOB, 1, 1, TASKS, config),
            JobRestartScheduled(JOB, 2, 5, 1000, "boom", 1),
            SchedulerStopped(JOB, 2, 20, JobStatus.CANCELLING),
            SchedulerStopped(JOB, 2, 30, JobStatus.CANCELED),
        ]

        assert 3 == attempt_after(records)


class TestCompletionProblem:
    def test_a_known_id_and_malformed_offsets_are_problems(self) -> None:
        assert "it completed already (a duplicate record)" == completion_problem(_completed(1), {1})
        assert "malformed offsets" in str(completion_problem(_completed(1, offsets={"words": 1}), set()))
        assert None is completion_problem(_completed(1), {2})


# ------------------------------------------------------------------ properties

_IDS = st.integers(min_value=1, max_value=6)
_KINDS = st.sampled_from((CheckpointKind.CHECKPOINT, CheckpointKind.CHECKPOINT, CheckpointKind.SAVEPOINT))
_STEPS = st.lists(
    st.one_of(
        st.builds(lambda i, k: [_triggered(i, k), _completed(i, k)], _IDS, _KINDS),  # a checkpoint completes
        st.builds(lambda i, k: [_triggered(i, k)], _IDS, _KINDS),  # one stays pending
        st.builds(lambda i: [_aborted(i)], _IDS),  # an abort, maybe forged
        st.builds(lambda i: [_completed(i, attempt=1)], _IDS),  # another attempt's completion
    ),
    max_size=20,
)
_RECORDS = _STEPS.map(lambda steps: [record for step in steps for record in step])
"""Journals of this attempt (2) and another (1): checkpoints that complete, stay pending or abort, and
forged or foreign records about the same few ids, in any order."""


def _discarded(decision: object) -> tuple[Discard, ...]:
    if isinstance(decision, Complete):
        return decision.discard
    if isinstance(decision, Abort) and decision.discard is not None:
        return (decision.discard,)
    return ()


@given(records=_RECORDS, retained=st.integers(min_value=1, max_value=3))
@settings(max_examples=50, deadline=None)
def test_a_snapshot_a_retained_completion_names_is_never_discarded(
    records: list[Record], retained: int
) -> None:
    """Whatever the journal says, in any order: no discard names one of the newest ``retained``
    completed checkpoints of this attempt, a completed savepoint, a completed checkpoint (by an
    abort) or a checkpoint this attempt did not trigger as one; and each id is completed at most once."""
    ledger = _ledger(retained=retained)
    mine: list[int] = []
    acted: list[int] = []
    savepoints: set[int] = set()
    discarded: set[int] = set()
    for record in records:
        decision = ledger.fold(record)
        if isinstance(decision, Complete):
            acted.append(decision.completed.checkpoint_id)
            if decision.completed.kind is CheckpointKind.SAVEPOINT:
                savepoints.add(decision.completed.checkpoint_id)
            else:
                mine.append(decision.completed.checkpoint_id)
        if isinstance(decision, Abort) and decision.discard is not None:
            assert decision.discard.checkpoint_id not in acted
        discarded.update(d.checkpoint_id for d in _discarded(decision))
        kept = set(sorted(mine)[-retained:])
        assert set() == discarded & (kept | savepoints)
    first_triggers: dict[int, CheckpointTriggered] = {}
    for record in records:
        if isinstance(record, CheckpointTriggered):
            first_triggers.setdefault(record.checkpoint_id, record)
    triggered = {i for i, r in first_triggers.items() if r.kind is CheckpointKind.CHECKPOINT}
    assert discarded <= triggered
    assert len(acted) == len(set(acted))


@given(history=st.lists(_IDS, unique=True, max_size=4), records=_RECORDS)
@settings(max_examples=50, deadline=None)
def test_folding_in_pieces_equals_folding_at_once(history: list[int], records: list[Record]) -> None:
    """A ledger given the earlier attempts' completions as its history decides every later record as a
    ledger that folded those completions first; and folding the records in two runs decides as one."""
    earlier = [_completed(i, attempt=1) for i in history]
    given_history = _ledger(history=tuple(earlier))
    folded = _ledger()
    for record in earlier:
        folded.fold(record)
    cut = len(records) // 2
    in_pieces = [given_history.fold(r) for r in records[:cut]] + [
        given_history.fold(r) for r in records[cut:]
    ]

    assert [folded.fold(r) for r in records] == in_pieces


def test_a_reader_that_leaves_out_the_records_the_ledger_does_not_fold_decides_the_same() -> None:
    """Given a simulated journal with every kind of record and trouble, when one ledger per job and
    attempt folds all of it and another only the FOLDED_RECORDS (as a participant's feed keeps them),
    then the records left out decided nothing and both ledgers decide alike."""
    rates = Rates(decline=0.05, stuck=0.03, task_failure=0.03, savepoint_every_ms=3000, manual_every_ms=2000)
    journal: list[Record] = list(itertools.islice(simulate(random.Random(2), jobs=3, rates=rates), 20_000))
    last = max(r.timestamp_ms for r in journal if isinstance(r, SchedulerStarted))
    # the simulation only restarts its jobs: a cancel and a finish of their own
    ends = [
        SchedulerStopped("job-0", 1, last + 1, JobStatus.CANCELLING),
        SchedulerStopped("job-1", 2, last + 1, JobStatus.FINISHED),
    ]
    journal += ends
    left_out = {type(r) for r in journal} - set(FOLDED_RECORDS)
    readers = {(r.job_id, r.attempt) for r in journal if isinstance(r, SchedulerStarted)}

    for job_id, attempt in sorted(readers):
        everything, folded_only = JobLedger(job_id, attempt), JobLedger(job_id, attempt)
        mine = [r for r in journal if r.job_id == job_id]
        decisions = [everything.fold(r) for r in mine]
        kept = [folded_only.fold(r) for r in mine if isinstance(r, FOLDED_RECORDS)]

        assert [None] * len(mine) == [d if not isinstance(r, FOLDED_RECORDS) else None
                                      for r, d in zip(mine, decisions, strict=True)]  # fmt: skip
        assert [d for r, d in zip(mine, decisions, strict=True) if isinstance(r, FOLDED_RECORDS)] == kept
    assert {TaskAcknowledged, JobHeartbeatRecorded, TaskStatusRecorded} <= left_out
    assert all(JobLedger(e.job_id, e.attempt).fold(e) is not None for e in ends)  # they decide something
