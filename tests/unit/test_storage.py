"""``events.task.storage.write_atomic``: all or nothing for readers, durable, and nothing left behind."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from events.task.storage import write_atomic


def test_a_file_is_written_with_its_missing_directories_and_no_temporary_file(tmp_path: Path) -> None:
    """Given a path whose directories do not exist, when it is written, then it holds the bytes
    and its directory holds nothing else."""
    path = tmp_path / "job" / "chk-1" / "task-0"

    write_atomic(path, b"snapshot")

    assert b"snapshot" == path.read_bytes()
    assert ["task-0"] == os.listdir(path.parent)


def test_a_file_is_replaced_whole(tmp_path: Path) -> None:
    """Given a file, when it is written again with fewer bytes, then it holds only the new ones."""
    path = tmp_path / "state.json"
    write_atomic(path, b'{"old": 1, "padding": "xxxxxxxx"}')

    write_atomic(path, b'{"new":2}', durable=False)

    assert b'{"new":2}' == path.read_bytes()
    assert ["state.json"] == os.listdir(tmp_path)


def test_a_new_file_gets_the_modes_open_would_give_it(tmp_path: Path) -> None:
    """The file is created as ``open(path, "wb")`` creates one: 0o666 less the umask."""
    umask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a", b"x")
        expected = tmp_path / "b"
        expected.write_bytes(b"x")
    finally:
        os.umask(umask)

    assert stat.S_IMODE(expected.stat().st_mode) == stat.S_IMODE((tmp_path / "a").stat().st_mode)


def test_a_failed_rename_leaves_the_old_state_and_no_temporary_file(tmp_path: Path) -> None:
    """Given a directory where the file should go, when the write fails at the rename, then the
    error is raised, the directory is untouched and no temporary file is left."""
    target = tmp_path / "taken"
    (target / "inside").mkdir(parents=True)

    with pytest.raises(OSError):
        write_atomic(target, b"data")

    assert ["taken"] == os.listdir(tmp_path)
    assert ["inside"] == os.listdir(target)


def test_a_large_file_is_written_whole(tmp_path: Path) -> None:
    """More bytes than one ``write`` call may take at once all reach the file."""
    data = os.urandom(3 * 1024 * 1024) + b"end"

    write_atomic(tmp_path / "big", data)

    assert data == (tmp_path / "big").read_bytes()


def test_threads_writing_one_directory_at_once_each_get_their_file(tmp_path: Path) -> None:
    """Eight tasks of one process write their snapshots into one new checkpoint directory at the
    same moment (as the participants of a shared feed do): every file is whole, none is lost."""
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def write(i: int) -> None:
        start.wait()
        try:
            for checkpoint in range(20):
                write_atomic(tmp_path / f"chk-{checkpoint}" / f"task-{i}", f"{i}:{checkpoint}".encode())
        except BaseException as exc:  # noqa: BLE001 - reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [] == errors
    for checkpoint in range(20):
        directory = tmp_path / f"chk-{checkpoint}"
        assert sorted(f"task-{i}" for i in range(8)) == sorted(os.listdir(directory))
        assert all((directory / f"task-{i}").read_bytes() == f"{i}:{checkpoint}".encode() for i in range(8))
