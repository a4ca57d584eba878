"""Run the coordinator service as a child process: for the demo, the tests and the benchmarks.

A real process (not a thread) so that it can be killed with SIGKILL in the
middle of a checkpoint and started again, as a crashed deployment would be.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self

from events.dev.broker import free_port

PORT_CHANCES = 3
"""Ports :meth:`CoordinatorProcess.start` tries for the worker's views when it chose them itself."""


class CoordinatorProcess:
    """``cutline coordinator`` in a child process, with its web views on a free local port."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str = "cutline.",
        *,
        web_port: int | None = None,
        log_path: Path | None = None,
        extra_args: tuple[str, ...] = (),
        watchdog: bool = True,
    ) -> None:
        """``watchdog``: as ``cutline coordinator`` runs by default, the worker in a child process
        of a watchdog (:mod:`coordinator.service.watchdog`); without it, the worker is the process."""
        self.bootstrap = bootstrap
        self.watchdog = watchdog
        self._worker_pid: int | None = None
        self.prefix = prefix
        self.web_port = web_port or free_port()
        self._port_chosen = web_port is None
        """Whether :attr:`web_port` is this object's choice, to choose again if taken meanwhile."""
        self.log_path = log_path or Path(tempfile.mkdtemp(prefix="cutline-coordinator-")) / "coordinator.log"
        self.extra_args = extra_args
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def pid(self) -> int | None:
        """The started process: the watchdog, or the worker itself without one."""
        return self._process.pid if self._process else None

    @property
    def worker_pid(self) -> int | None:
        """The process that runs the worker (known once it serves its views, :meth:`wait_ready`)."""
        if not self.watchdog:
            return self.pid
        return self._worker_pid

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "coordinator.cli",
            "coordinator",
            "--bootstrap",
            self.bootstrap,
            "--topic-prefix",
            self.prefix,
            "--web-port",
            str(self.web_port),
            "--data-dir",
            str(self.log_path.parent / "data"),
            *self.extra_args,
            "--watchdog" if self.watchdog else "--no-watchdog",
        ]

    def start(self, timeout: float = 60.0, abort: Callable[[], None] | None = None) -> Self:
        """Start the process and wait until it has recovered its journal and serves its views
        (``abort``: see :meth:`wait_ready`). A port it chose that another process took before the
        worker bound it (:func:`free_port` can only say what is free now) is chosen again."""
        for chance in range(1, PORT_CHANCES + 1):
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            self.launch()
            try:
                self.wait_ready(timeout, abort)
                return self
            except RuntimeError:
                if not (self._port_chosen and chance < PORT_CHANCES and self._port_taken(logged)):
                    raise
                self.web_port = free_port()
        raise AssertionError("unreachable: the last chance returns or raises")

    def _port_taken(self, logged: int) -> bool:
        """Whether the process exited because its web port was taken (in its log after ``logged``)."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(logged)
                return b"address already in use" in log.read().lower()
        except OSError:
            return False

    def launch(self) -> Self:
        """Start the process without waiting for it (then :meth:`wait_ready`): workers launched
        together join their group together, in one rebalance instead of one per worker."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return self

    def wait_ready(self, timeout: float = 60.0, abort: Callable[[], None] | None = None) -> None:
        """Wait until it serves its views, recovered; ``abort`` is called between two looks, and
        may raise to stop waiting (``events.stopping.StopSignals.check``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if abort is not None:
                abort()
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(
                    f"coordinator exited with {self._process.returncode}; log {self.log_path}:\n{self.tail()}"
                )
            try:
                ready = self.get("/ready")
                if ready.get("recovered"):
                    self._worker_pid = ready.get("pid")
                    return
            except (urllib.error.URLError, ConnectionError, OSError, json.JSONDecodeError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"coordinator not ready after {timeout:g}s; log {self.log_path}:\n{self.tail()}")

    def exit_code(self) -> int | None:
        """The process's exit code once it has exited (with a watchdog, 128 + the signal that ended
        its worker), else None."""
        return self._process.poll() if self._process is not None else None

    def get(self, path: str, timeout: float = 5.0) -> Any:
        """GET one of the coordinator's JSON views."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            return json.load(error)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to flush or commit anything. With a watchdog, of the
        watchdog (``kill -9`` of the ``cutline coordinator`` process): its worker exits at once
        and has its group told that it left (coordinator/service/watchdog.py)."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(10)

    def kill_all(self) -> None:
        """SIGKILL of the watchdog and its worker together, neither able to tell the group: as
        when the machine or the container is lost, the group notices only after the session
        timeout. The worker is stopped first, so that it cannot act on its watchdog's death.
        Without a watchdog, the same as :meth:`kill`."""
        worker = self._worker_pid if self.watchdog else None
        if worker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGSTOP)
        self.kill()
        if worker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)

    def kill_worker(self) -> None:
        """SIGKILL the worker only (its watchdog lives on to tell the group); then wait for the
        watchdog to exit. Without a watchdog, the same as :meth:`kill`."""
        if not self.watchdog:
            self.kill()
            return
        assert self._worker_pid is not None, "the worker's pid is known once it is ready"
        os.kill(self._worker_pid, signal.SIGKILL)
        if self._process is not None:
            self._process.wait(30)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it does not stop within ``grace`` seconds. Idempotent."""
        stop_all([self], grace)

    def _terminate(self) -> bool:
        """SIGTERM, without waiting; False when it is not running."""
        if self._process is None or self._process.poll() is not None:
            return False
        self._process.send_signal(signal.SIGTERM)
        return True

    def _wait_or_kill(self, deadline: float) -> None:
        assert self._process is not None
        try:
            self._process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_all(processes: Iterable[CoordinatorProcess], grace: float = 10.0) -> None:
    """Stop ``processes`` together: SIGTERM to each, then SIGKILL to those still running after
    ``grace`` seconds. Workers shut down in parallel, not one after another."""
    deadline = time.monotonic() + grace
    for process in [p for p in processes if p._terminate()]:
        process._wait_or_kill(deadline)
