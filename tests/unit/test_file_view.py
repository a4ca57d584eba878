"""The batch's view of the file system for the symbolic-link check (coordinator/service/file_view.py),
on real directories: the same answers as ``lstat``, with one listing per directory and batch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coordinator.service.file_view import BatchFileView, is_link


@pytest.fixture(name="checkpoint")
def _checkpoint(tmp_path: Path) -> Path:
    """A checkpoint directory with five state files, a link to a file outside, and a file outside."""
    directory = tmp_path / "job" / "chk-7"
    directory.mkdir(parents=True)
    for task in ("t0", "t1", "t2", "t3", "t4"):
        (directory / task).write_bytes(b"state")
    (tmp_path / "secret").write_text("secret")
    (directory / "evil").symlink_to(tmp_path / "secret")
    return directory


def test_it_answers_as_lstat_does(checkpoint: Path) -> None:
    names = ["t0", "evil", "missing", "t1", "t2", "t3", "t4"]
    expected = [is_link(str(checkpoint / name)) for name in names]
    view = BatchFileView(scan_after=2)

    answers = [view.is_link(str(checkpoint / name)) for name in names]

    assert [False, True, None, False, False, False, False] == expected
    assert expected == answers


def test_a_directory_asked_often_in_a_batch_is_listed_once(checkpoint: Path) -> None:
    """Given scan_after=2, the first name is asked with lstat, the second starts the listing, and
    every later name of the directory (and every repeated path) comes from the listing."""
    view = BatchFileView(scan_after=2)

    for name in ("t0", "t1", "t2", "t3", "t4", "evil", "t2"):
        view.is_link(str(checkpoint / name))

    assert (1, 1) == (view.lstat_calls, view.listings)


def test_a_few_names_are_asked_with_lstat(checkpoint: Path) -> None:
    """Below ``scan_after`` names, a directory is never listed (a batch of a few acks)."""
    view = BatchFileView(scan_after=4)

    for name in ("t0", "t1", "t0"):
        view.is_link(str(checkpoint / name))

    assert (2, 0) == (view.lstat_calls, view.listings)


def test_a_name_that_came_after_the_listing_is_asked_with_lstat(checkpoint: Path) -> None:
    view = BatchFileView(scan_after=1)
    assert view.is_link(str(checkpoint / "t0")) is False  # lists the directory
    (checkpoint / "late").symlink_to(checkpoint.parent.parent / "secret")

    assert view.is_link(str(checkpoint / "late")) is True
    assert (1, 1) == (view.lstat_calls, view.listings)


def test_the_check_holds_as_of_the_batch_and_the_next_batch_sees_a_new_link(checkpoint: Path) -> None:
    """A file swapped for a link after its directory was listed is still a file to this batch (the
    check holds as of the batch); the next batch's view sees the link."""
    this_batch = BatchFileView(scan_after=1)
    assert this_batch.is_link(str(checkpoint / "t0")) is False
    (checkpoint / "t1").unlink()
    (checkpoint / "t1").symlink_to(checkpoint.parent.parent / "secret")

    assert this_batch.is_link(str(checkpoint / "t1")) is False
    assert BatchFileView(scan_after=1).is_link(str(checkpoint / "t1")) is True


def test_a_directory_that_cannot_be_listed_is_asked_name_by_name(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory one may enter but not read (write and search rights only) cannot be listed;
    ``lstat`` still sees its names. (Root reads every directory, so the refusal is simulated.)"""

    def refuse(path: str) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "scandir", refuse)
    view = BatchFileView(scan_after=1)

    answers = [view.is_link(str(checkpoint / name)) for name in ("t0", "evil", "missing")]

    assert [False, True, None] == answers
    assert (3, 1) == (view.lstat_calls, view.listings)


def test_names_in_a_missing_directory_are_not_there(tmp_path: Path) -> None:
    view = BatchFileView(scan_after=1)

    assert view.is_link(str(tmp_path / "gone" / "t0")) is None


def test_a_view_lists_only_after_at_least_one_ask() -> None:
    with pytest.raises(ValueError, match="scan_after must be at least 1"):
        BatchFileView(scan_after=0)


def test_a_walk_says_whether_every_name_on_the_way_is_there_and_no_link(checkpoint: Path) -> None:
    """Given the names from a root down to a checkpoint directory, a walk is True when each is there
    and none is a link, None when one is not there, False when one is a link."""
    root = str(checkpoint.parent.parent)
    (checkpoint.parent / "chk-8").symlink_to(checkpoint)
    view = BatchFileView()

    assert view.walk(root, ["job", "chk-7"]) is True
    assert view.walk(root, ["job", "chk-9"]) is None
    assert view.walk(root, ["job", "chk-8"]) is False
    assert view.walk(root, ["job", "chk-8", "t0"]) is False  # stops at the link


def test_a_walk_is_remembered_for_the_batch(checkpoint: Path) -> None:
    """Given a walk made once in a batch, when the same names are walked again (every ack of the
    checkpoint), then the file system is not asked again; the next batch asks anew."""
    root = str(checkpoint.parent.parent)
    view = BatchFileView()
    assert view.walk(root, ["job", "chk-7"]) is True
    asked = view.lstat_calls

    checkpoint.rename(checkpoint.parent / "chk-7-moved")
    checkpoint.parent.joinpath("chk-7").symlink_to(checkpoint.parent / "chk-7-moved")

    assert view.walk(root, ["job", "chk-7"]) is True
    assert asked == view.lstat_calls
    assert BatchFileView().walk(root, ["job", "chk-7"]) is False
