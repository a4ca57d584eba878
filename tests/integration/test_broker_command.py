"""``cutline broker`` says so when its broker process dies under it (issue 51: it said nothing, and
printed a bootstrap nobody answered at)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import eventually

CUTLINE = str(Path(sys.executable).parent / "cutline")


def _children(pid: int) -> list[int]:
    """The process ids whose parent is ``pid`` (from /proc: no psutil here)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.tansu
def test_cutline_broker_exits_1_saying_its_broker_died(tmp_path: Path) -> None:
    command = subprocess.Popen([CUTLINE, "broker"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        tansu = eventually(lambda: _children(command.pid), timeout=30, what="the broker process")
        assert command.stdout is not None
        assert command.stdout.readline().startswith("bootstrap: ")
        for pid in tansu:
            os.kill(pid, signal.SIGKILL)
        code = command.wait(15)
    finally:
        if command.poll() is None:
            command.kill()
    stderr = command.stderr.read() if command.stderr else ""

    assert 1 == code
    assert "exited by itself (killed by signal 9" in stderr and "its data is lost" in stderr
