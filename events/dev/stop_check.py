"""Send a command SIGTERM at a chosen moment and check that it stops in time, leaving nothing behind.

The command runs as a background job of a non-interactive shell (``bash -c 'cmd & ...'``), so
it starts with SIGINT and SIGQUIT ignored, as a script's ``cutline broker &`` does. Every
process it starts inherits a marker in its environment, by which the processes left behind
are found afterwards (whatever session or process group they moved to). Linux only (``/proc``).

Used by ``tests/integration/test_sigterm.py`` and ``bench/bench_sigterm.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MARK_ENV", "StopResult", "marked_processes", "sigterm_at"]

MARK_ENV = "CUTLINE_STOP_CHECK"
"""The environment variable that marks every process of one checked run."""

_SCRIPT = '"$@" >"$CUTLINE_STOP_CHECK_LOG" 2>&1 & echo $!; wait $!; echo "exit $?"'


@dataclass(frozen=True)
class StopResult:
    """What one SIGTERM did."""

    moment: float
    """Seconds after the launch when the SIGTERM was sent."""
    exited_after: float | None
    """Seconds from the SIGTERM until the process had exited; None if it had not within the limit."""
    exit_code: int | None
    sigint_ignored: bool
    """The process started with SIGINT ignored (a background job of a non-interactive shell)."""
    exited_before: bool
    """It had exited by itself before the SIGTERM (the check proves nothing then)."""
    left: list[str] = field(default_factory=list)
    """The processes of the run still there 2 s after the exit: ``pid cmdline`` each (all killed)."""
    log: Path | None = None

    @property
    def ok(self) -> bool:
        return self.exited_after is not None and not self.left


def sigterm_at(
    argv: Sequence[str],
    moment: float,
    *,
    limit: float = 10.0,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    log: Path | None = None,
) -> StopResult:
    """Start ``argv`` in the background of ``bash -c``, SIGTERM it (the command's own process,
    not bash) ``moment`` s later and wait up to ``limit`` s for it to exit; its output goes to
    ``log``."""
    mark = uuid.uuid4().hex
    log = log or Path(os.devnull)
    environ = {**(os.environ if env is None else env), MARK_ENV: mark, "CUTLINE_STOP_CHECK_LOG": str(log)}
    launched = time.monotonic()
    shell = subprocess.Popen(
        ["bash", "-c", _SCRIPT, "bash", *argv],
        stdout=subprocess.PIPE,
        env=environ,
        cwd=cwd,
        start_new_session=True,
        text=True,
    )
    try:
        assert shell.stdout is not None
        pid = int(shell.stdout.readline())
        shell_exe = _exe(shell.pid)
        while _exe(pid) == shell_exe and time.monotonic() - launched < 5:  # not exec'd yet
            time.sleep(0.001)
        sigint_ignored = _ignores(pid, signal.SIGINT)
        time.sleep(max(0.0, launched + moment - time.monotonic()))
        exited_before = _state(pid) in (None, "Z")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        sent = time.monotonic()
        exited_after: float | None = None
        while time.monotonic() - sent < limit:
            if _state(pid) in (None, "Z"):
                exited_after = time.monotonic() - sent
                break
            time.sleep(0.01)
        exit_code = None
        if exited_after is not None:
            with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
                out, _ = shell.communicate(timeout=5)
                exit_code = int(out.strip().rsplit("exit ", 1)[1])
        deadline = time.monotonic() + 2.0
        left = marked_processes(mark)
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = marked_processes(mark)
    finally:
        for pid_left in marked_processes(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid_left, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
        if shell.stdout is not None:
            shell.stdout.close()
    return StopResult(
        round(moment, 3),
        exited_after,
        exit_code,
        sigint_ignored,
        exited_before,
        [f"{p} {_cmdline(p)}" for p in left],
        None if str(log) == os.devnull else log,
    )


def marked_processes(mark: str) -> list[int]:
    """The live (not zombie) processes whose environment has ``MARK_ENV=mark``."""
    needle = f"{MARK_ENV}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and _state(int(entry.name)) not in (None, "Z"):
            found.append(int(entry.name))
    return found


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _ignores(pid: int, signum: int) -> bool:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    except OSError:
        pass
    return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"
