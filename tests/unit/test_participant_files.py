"""The files a participant writes and removes besides its snapshots: a savepoint's ``_metadata``,
and the directories of the checkpoints it discards."""

from __future__ import annotations

import hashlib
from pathlib import Path

from events.task.ledger import Complete
from events.task.participant import (
    METADATA_FILE,
    leftover_metadata_only,
    missing_state,
    savepoint_metadata_directory,
)
from events.wire.records import CheckpointCompleted, CheckpointKind, StateHandle


def completion(kind: CheckpointKind, handles: dict[str, StateHandle] | None = None) -> CheckpointCompleted:
    return CheckpointCompleted("job", 4, kind, 1, 1, handles or {}, 0, {}, 1, "file:///sp/savepoint-job-4")


def decision(kind: CheckpointKind, directory: str | None = "file:///sp/savepoint-job-4") -> Complete:
    return Complete(completion(kind), (), directory, ())


class TestSavepointMetadata:
    def test_a_savepoint_gets_its_metadata_where_its_trigger_said(self) -> None:
        assert "file:///sp/savepoint-job-4" == savepoint_metadata_directory(
            decision(CheckpointKind.SAVEPOINT), metadata_written=False
        )

    def test_a_checkpoint_gets_none_from_a_participant(self) -> None:
        """The journal has a checkpoint's completion; a restore reads it there."""
        assert (
            savepoint_metadata_directory(decision(CheckpointKind.CHECKPOINT), metadata_written=False) is None
        )

    def test_none_over_the_coordinator_s_metadata_of_a_completion_too_large_for_the_journal(self) -> None:
        assert savepoint_metadata_directory(decision(CheckpointKind.SAVEPOINT), metadata_written=True) is None

    def test_none_without_the_trigger_s_directory(self) -> None:
        """A participant that started after the trigger does not know where it went."""
        assert savepoint_metadata_directory(decision(CheckpointKind.SAVEPOINT, None), False) is None

    def test_it_is_written_only_once_every_snapshot_file_is_there_at_its_size(self, tmp_path: Path) -> None:
        data = b"state"
        digest = hashlib.sha256(data).hexdigest()
        (tmp_path / "t0").write_bytes(data)
        handles = {
            "t0": StateHandle((tmp_path / "t0").as_uri(), len(data), digest),
            "t1": StateHandle((tmp_path / "t1").as_uri(), len(data), digest),
            "t2": StateHandle((tmp_path / "t2").as_uri(), len(data), digest, data),  # inline: no file
        }

        missing = missing_state(completion(CheckpointKind.SAVEPOINT, handles))
        (tmp_path / "t1").write_bytes(b"stat")
        short = missing_state(completion(CheckpointKind.SAVEPOINT, handles))
        (tmp_path / "t1").write_bytes(data)

        assert missing is not None and missing.startswith(
            f"the state of t1 ({handles['t1'].uri}) cannot be read"
        )
        assert f"the state of t1 ({handles['t1'].uri}) is 4 bytes, not 5" == short
        assert missing_state(completion(CheckpointKind.SAVEPOINT, handles)) is None


def test_a_directory_left_with_only_its_metadata_is_the_last_snapshot_gone() -> None:
    assert leftover_metadata_only([METADATA_FILE])
    assert not leftover_metadata_only([METADATA_FILE, "task-1"])
    assert not leftover_metadata_only([])
