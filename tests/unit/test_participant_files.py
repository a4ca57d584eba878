"""The files a participant removes besides its snapshots: the directories of the checkpoints it
discards."""

from __future__ import annotations

from events.task.participant import METADATA_FILE, leftover_metadata_only


def test_a_directory_left_with_only_its_metadata_is_the_last_snapshot_gone() -> None:
    assert leftover_metadata_only([METADATA_FILE])
    assert not leftover_metadata_only([METADATA_FILE, "task-1"])
    assert not leftover_metadata_only([])
