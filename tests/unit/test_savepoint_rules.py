"""Which savepoints the journal lists, which locations a restore may still need, and which
savepoints may be disposed of (only inside a savepoint root, never a checkpoint, never one a
restore may need), and whether one is still on disk."""

from __future__ import annotations

from coordinator.core.savepoints import (
    Disposal,
    Refused,
    Root,
    needed_locations,
    plan_disposal,
    presence,
    real_below,
    refuse_needed,
    refuse_outside_roots,
    savepoints,
    state_files,
    why_needed,
)
from coordinator.core.state import JobState
from events.wire.records import (
    CheckpointCompleted,
    CheckpointKind,
    CheckpointRestored,
    JobRestartScheduled,
    JobStatus,
    StateHandle,
)
from events.wire.validation import parse_uri


def completed(job: str, checkpoint_id: int, kind: CheckpointKind, location: str) -> CheckpointCompleted:
    return CheckpointCompleted(job, checkpoint_id, kind, 1_000 * checkpoint_id, 10, {}, 0, {}, 1, location)


def test_savepoints_are_the_completed_savepoints_of_the_job_in_journal_order() -> None:
    journal = [
        completed("a", 1, CheckpointKind.SAVEPOINT, "file:///sp/a1"),
        completed("a", 2, CheckpointKind.CHECKPOINT, "file:///ck/a/chk-2"),
        completed("b", 1, CheckpointKind.SAVEPOINT, "file:///sp/b1"),
        completed("a", 3, CheckpointKind.SAVEPOINT, "file:///sp/a3"),
    ]

    assert [1, 3] == [s.checkpoint_id for s in savepoints(journal, "a")]
    assert ["file:///sp/a1", "file:///sp/b1", "file:///sp/a3"] == [s.location for s in savepoints(journal)]


def test_retained_checkpoints_are_needed_and_an_old_savepoint_is_not() -> None:
    """Given a job with two retained checkpoints that started from a savepoint, the checkpoints
    are needed (a restore may name them) and the savepoint no longer is."""
    state = JobState(
        "a",
        JobStatus.RUNNING,
        attempt=1,
        completed=(
            completed("a", 4, CheckpointKind.CHECKPOINT, "file:///ck/a/chk-4"),
            completed("a", 5, CheckpointKind.CHECKPOINT, "file:///ck/a/chk-5"),
        ),
        restored=CheckpointRestored("a", 3, 1, 0, "file:///sp/a3"),
    )

    needed = needed_locations({"a": state})

    assert {"file:///ck/a/chk-4", "file:///ck/a/chk-5"} == set(needed)
    assert why_needed("file:///sp/a3", {"a": state}) is None
    assert "checkpoint 5 of job a is retained" == why_needed("file:///ck/a/chk-5/", {"a": state})


def test_what_a_job_restored_is_needed_until_it_completes_a_checkpoint() -> None:
    state = JobState(
        "b", JobStatus.RUNNING, attempt=1, restored=CheckpointRestored("b", 3, 1, 0, "file:///sp/a3")
    )

    reason = why_needed("file:///sp/%61%33", {"b": state})  # the same location, spelled otherwise

    assert reason is not None and "job b restored it in attempt 1" in reason


def test_the_restore_point_of_a_scheduled_restart_is_needed() -> None:
    restart = JobRestartScheduled(
        "c", 2, 0, 1_000, "boom", 1, restore_checkpoint_id=7, restore_location="file:///x/7"
    )
    state = JobState("c", JobStatus.RESTARTING, attempt=1, restart=restart)

    assert "job c's scheduled restart (attempt 2) restores it" == why_needed("file:///x/7", {"c": state})


def root(uri: str, real: str | None = None) -> Root:
    parsed = parse_uri(uri)
    return Root(parsed, real if real is not None else parsed.path)


def with_handles(
    location: str, kind: CheckpointKind = CheckpointKind.SAVEPOINT, **uris: str
) -> CheckpointCompleted:
    handles = {task: StateHandle(uri, 10, "0" * 64) for task, uri in uris.items()}
    return CheckpointCompleted("a", 7, kind, 7_000, 10, handles, 20, {}, attempt=1, location=location)


class TestRefuseOutsideRoots:
    def test_a_directory_inside_a_root_may_be_disposed_of(self) -> None:
        """Given a root, a directory below it (as given and as its real path lies) passes."""
        where = parse_uri("file:///sp/a7")

        assert refuse_outside_roots(where, "/sp/a7", [root("file:///other"), root("file:///sp")]) is None

    def test_a_directory_outside_every_root_is_refused(self) -> None:
        """The refusal names the roots, and says that symbolic links were resolved."""
        refused = refuse_outside_roots(parse_uri("file:///data/a7"), "/data/a7", [root("file:///sp")])

        assert isinstance(refused, Refused)
        assert "file:///data/a7 is not inside a savepoint root (file:///sp, symbolic links resolved)" in (
            refused.reason
        )

    def test_no_root_given_refuses_everything(self) -> None:
        refused = refuse_outside_roots(parse_uri("file:///sp/a7"), "/sp/a7", [])

        assert refused is not None and "none given" in refused.reason

    def test_a_symbolic_link_out_of_the_root_is_refused(self) -> None:
        """Given a directory inside the root whose real path lies elsewhere, it is refused."""
        refused = refuse_outside_roots(parse_uri("file:///sp/a7"), "/etc/a7", [root("file:///sp")])

        assert refused is not None

    def test_the_root_itself_is_not_inside_it(self) -> None:
        assert refuse_outside_roots(parse_uri("file:///sp"), "/sp", [root("file:///sp")]) is not None


class TestPlanDisposal:
    def test_a_savepoint_disposes_of_its_own_state_files(self) -> None:
        """Given a savepoint with a file handle and an inline one, only the file is deleted (inline
        state lives in _metadata and the journal)."""
        completed = with_handles("file:///sp/a7", t0="file:///sp/a7/t0/state", t1="file:///sp/a7/t1")
        inline = StateHandle("file:///sp/a7/t2", 3, "0" * 64, inline=b"abc")
        completed = CheckpointCompleted(
            "a", 7, CheckpointKind.SAVEPOINT, 7_000, 10, {**completed.handles, "t2": inline}, 20, {},
            attempt=1, location="file:///sp/a7",
        )  # fmt: skip

        plan = plan_disposal(parse_uri("file:///sp/a7"), completed)

        assert Disposal("a", 7, "file:///sp/a7", (("t0", "state"), ("t1",))) == plan

    def test_a_checkpoint_is_refused(self) -> None:
        """A job retains and discards its own checkpoints."""
        completed = with_handles("file:///ck/a/chk-7", CheckpointKind.CHECKPOINT)

        plan = plan_disposal(parse_uri("file:///ck/a/chk-7"), completed)

        assert isinstance(plan, Refused)
        assert "holds checkpoint 7 of job a" in plan.reason and "dispose only of savepoints" in plan.reason

    def test_a_state_handle_outside_the_location_is_refused(self) -> None:
        """Nothing outside the savepoint's location is ever deleted, even if its _metadata names it."""
        completed = with_handles("file:///sp/a7", t0="file:///sp/a7/t0", t1="file:///etc/passwd")

        plan = plan_disposal(parse_uri("file:///sp/a7"), completed)

        assert (
            Refused(
                "the state handle of t1 (file:///etc/passwd) is outside file:///sp/a7; nothing was deleted"
            )
            == plan
        )

    def test_a_location_that_is_not_a_storage_uri_is_refused(self) -> None:
        plan = plan_disposal(parse_uri("file:///sp/a7"), with_handles("file:///sp/../a7"))

        assert isinstance(plan, Refused) and "/sp/a7/_metadata names location" in plan.reason

    def test_a_keyed_savepoint_disposes_of_its_pieces_before_its_manifests(self) -> None:
        """Given a keyed savepoint whose manifest lists a piece, the piece goes first (a disposal that
        stops half way leaves the manifest that names what is left)."""
        completed = with_handles("file:///sp/a7", **{"keyed-0": "file:///sp/a7/keyed-0"})

        plan = plan_disposal(
            parse_uri("file:///sp/a7"), completed, {"keyed-0": ["file:///sp/a7/keyed-0.full"]}
        )

        assert Disposal("a", 7, "file:///sp/a7", (("keyed-0.full",), ("keyed-0",))) == plan

    def test_a_piece_outside_the_location_is_refused(self) -> None:
        completed = with_handles("file:///sp/a7", **{"keyed-0": "file:///sp/a7/keyed-0"})

        plan = plan_disposal(
            parse_uri("file:///sp/a7"), completed, {"keyed-0": ["file:///sp/a7/%2e%2e/other/keyed-0.full"]}
        )

        assert isinstance(plan, Refused) and plan.reason.startswith(
            "the piece of keyed-0 is not a storage URI"
        )

    def test_without_a_location_the_directory_is_the_location(self) -> None:
        plan = plan_disposal(parse_uri("file:///sp/a7"), with_handles("", t0="file:///sp/a7/t0"))

        assert Disposal("a", 7, "file:///sp/a7", (("t0",),)) == plan


class TestRefuseNeeded:
    def test_a_savepoint_no_restore_needs_may_go(self) -> None:
        state = JobState(
            "a", JobStatus.RUNNING, attempt=1, restored=CheckpointRestored("a", 3, 1, 0, "file:///sp/a3")
        )
        disposal = Disposal("a", 9, "file:///sp/a9", ())

        assert refuse_needed(parse_uri("file:///sp/a9"), disposal, {"a": state}) is None

    def test_the_savepoint_a_restart_would_restore_stays(self) -> None:
        """Given a job that restored a savepoint and completed no checkpoint since, it stays."""
        state = JobState(
            "a", JobStatus.RUNNING, attempt=1, restored=CheckpointRestored("a", 3, 1, 0, "file:///sp/a3")
        )
        disposal = Disposal("a", 3, "file:///sp/a3", ())

        refused = refuse_needed(parse_uri("file:///sp/a3"), disposal, {"a": state})

        assert refused is not None
        assert refused.reason.startswith("file:///sp/a3 is still needed: job a restored it in attempt 1")
        assert refused.reason.endswith("Nothing was deleted.")

    def test_a_savepoint_moved_since_is_needed_under_its_recorded_location(self) -> None:
        """The location its _metadata names counts as well as the directory it is found in."""
        state = JobState(
            "a", JobStatus.RUNNING, attempt=1, restored=CheckpointRestored("a", 3, 1, 0, "file:///old/a3")
        )
        disposal = Disposal("a", 3, "file:///old/a3", ())

        assert refuse_needed(parse_uri("file:///sp/a3"), disposal, {"a": state}) is not None


def test_real_below_is_strictly_below() -> None:
    assert real_below("/sp/a7", "/sp/")
    assert not real_below("/sp", "/sp")
    assert not real_below("/spare/a7", "/sp")


class TestPresence:
    """``cutline savepoints list``'s "on disk": its ``_metadata``, or else every state file the
    journal names."""

    def test_a_savepoint_with_its_metadata_is_on_disk(self) -> None:
        assert ("yes", True) == (presence(True, []).shown, presence(True, []).on_disk)

    def test_without_metadata_it_is_on_disk_when_every_state_file_is(self) -> None:
        """A savepoint older than its tasks' writing ``_metadata``, or whose tasks did not see each
        other's files: its files are there."""
        present = presence(False, [True, True])

        assert (True, False, "yes, no _metadata") == (present.on_disk, present.metadata, present.shown)

    def test_a_missing_state_file_means_not_on_disk(self) -> None:
        assert "no" == presence(False, [True, False]).shown
        assert "no" == presence(False, [None, False]).shown

    def test_what_cannot_be_told_here_is_a_question_mark(self) -> None:
        """Not on the local file system, or no state file named (journaled by reference, inline)."""
        for metadata, files in ((None, []), (False, []), (False, [True, None])):
            assert "?" == presence(metadata, files).shown

    def test_state_files_are_the_journal_s_handles_that_are_not_inline(self) -> None:
        handles = {
            "t1": StateHandle("file:///sp/a1/t1", 3, "ab"),
            "t0": StateHandle("file:///sp/a1/t0", 3, "cd"),
            "t2": StateHandle("file:///sp/a1/t2", 3, "ef", b"abc"),
        }
        journal = [
            CheckpointCompleted("a", 1, CheckpointKind.SAVEPOINT, 1, 1, handles, 9, {}, 1, "file:///sp/a1")
        ]
        [savepoint] = savepoints(journal, "a")

        assert ("file:///sp/a1/t0", "file:///sp/a1/t1") == state_files(journal, savepoint)
