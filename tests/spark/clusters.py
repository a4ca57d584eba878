"""What the cluster tests (test_cluster.py) need besides Spark: moto's S3 server with a gate that stops
a keyed job in the middle of a checkpoint, a standalone Spark cluster started from the installed
PySpark, and finding processes (an executor JVM, the one holding a socket) in ``/proc``.

Linux only (``/proc``), as the tests' CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import eventually, pyspark_script

from events.dev.broker import free_port

BUCKET = "cutline-checkpoints"
AWS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")
"""The variables that point s3fs (botocore) at moto's server: executors get them through
``spark.executorEnv`` (the word count's ``--executor-env``)."""

EXECUTOR_CLASS = "CoarseGrainedExecutorBackend"
"""The main class of an executor JVM, in its command line (local-cluster and standalone alike)."""

HOLD_LIMIT_S = 60.0
"""The gate never holds a request longer (botocore's read timeout is 60 s: it would retry it)."""

MANIFEST_PATH = re.compile(r"/chk-(\d+)/keyed-(\d+)\.a\d+-[0-9a-f]+\.cut-(\d+)$")
"""A keyed task's snapshot manifest: checkpoint id, shuffle partition, micro-batch (the cut)."""
STATE_DELTA_PATH = re.compile(r"/keyed-[0-9a-f]+/p(\d+)/(\d{20})\.delta$")
"""A keyed state store's delta: shuffle partition, version (micro-batch + 1)."""


# --------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    pgid: int
    cmdline: str
    started: int
    """When it started, in clock ticks since the machine booted: pids wrap around (at 32,768 on the
    tests' machine), so a lower pid is not an older process."""


def processes() -> list[Process]:
    """Every process of the machine (that is still there while it is read)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...; [19] starttime
        found.append(Process(int(entry.name), int(fields[1]), int(fields[2]), cmdline, int(fields[19])))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def executors(where: Callable[[Process], bool]) -> list[Process]:
    """The executor JVMs for which ``where`` holds."""
    return [p for p in processes() if EXECUTOR_CLASS in p.cmdline and where(p)]


def socket_owner(local_port: int, remote_port: int) -> int:
    """The pid of the process whose TCP socket on 127.0.0.1 goes from ``local_port`` to ``remote_port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, remote = (int(address.rsplit(":", 1)[1], 16) for address in fields[1:3])
                if (local, remote) == (local_port, remote_port):
                    inodes.add(fields[9])
    links = {f"socket:[{inode}]" for inode in inodes if inode != "0"}
    for process in processes():
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{process.pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in links:
                        return process.pid
    raise LookupError(f"no process holds a socket from port {local_port} to {remote_port}")


def executor_of(pid: int) -> Process:
    """The executor JVM that ``pid`` (a Python worker, its daemon) descends from."""
    table = {p.pid: p for p in processes()}
    current = table.get(pid)
    while current is not None:
        if EXECUTOR_CLASS in current.cmdline:
            return current
        current = table.get(current.ppid)
    raise LookupError(f"process {pid} runs under no executor JVM")


# ---------------------------------------------------------------------- moto's S3 and the gate


@dataclass(frozen=True)
class Stopped:
    """Where the gate stopped a keyed task: after its ack, while it saved its state."""

    checkpoint_id: int
    partition: int
    """The shuffle partition: the task is ``keyed-<partition>``."""
    batch: int
    client: int
    """The pid of the Python worker that sent the held request."""


class SnapshotGate:
    """WSGI middleware in front of moto's S3 server: stops a keyed job in the middle of a checkpoint.

    Once armed (:meth:`arm`) for checkpoints above an id, the first snapshot manifest written there
    names task A and its micro-batch b. The gate then holds every other task's manifest of that
    checkpoint (so none of them can ack: the checkpoint stays pending) and A's state save of batch b
    (which A does after sending its ack). :attr:`stopped` says where A is held; :meth:`release`
    lets the other manifests through and refuses A's held save (503: its executor is dead by then).
    """

    def __init__(self, app: Callable[..., Any], port: int) -> None:
        self.app = app
        self.port = port
        """The server's port (the held request's socket goes there)."""
        self._lock = threading.Lock()
        self._after: int | None = None
        self._first: tuple[int, int, int] | None = None
        self.stopped: Stopped | None = None
        self.manifests: dict[tuple[int, int], int] = {}
        """Manifest PUTs of the armed checkpoints, by (checkpoint id, shuffle partition)."""
        self._released = threading.Event()

    def arm(self, after_checkpoint: int) -> None:
        """Stop the first checkpoint above ``after_checkpoint`` whose task A saves state after its
        ack, and forget an earlier test's stop."""
        with self._lock:
            self._after, self._first, self.stopped, self.manifests = after_checkpoint, None, None, {}
            self._released = threading.Event()

    def release(self) -> None:
        self._released.set()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") == "PUT":
            action = self._decide(environ.get("PATH_INFO", ""), int(environ.get("REMOTE_PORT", 0)))
            if action is not None:
                released = self._released
                released.wait(HOLD_LIMIT_S)
            if action == "refuse":
                start_response("503 Service Unavailable", [("Content-Length", "0")])
                return [b""]
        return self.app(environ, start_response)  # type: ignore[no-any-return]

    def _decide(self, path: str, port: int) -> str | None:
        """What to do with a PUT: None (let it through), "hold" (then let it through) or "refuse"
        (after holding it: the task's state save)."""
        with self._lock:
            manifest = MANIFEST_PATH.search(path)
            if manifest is not None:
                return self._manifest(*(int(g) for g in manifest.groups()))
            delta = STATE_DELTA_PATH.search(path)
            if delta is None or self._first is None or self.stopped is not None:
                return None
            checkpoint_id, partition, batch = self._first
            if (int(delta.group(1)), int(delta.group(2))) != (partition, batch + 1):
                return None
            self.stopped = Stopped(checkpoint_id, partition, batch, socket_owner(port, self.port))
            return "refuse"

    def _manifest(self, checkpoint_id: int, partition: int, batch: int) -> str | None:
        key = (checkpoint_id, partition)
        self.manifests[key] = self.manifests.get(key, 0) + 1
        if self._after is None or checkpoint_id <= self._after or self._released.is_set():
            return None
        if self._first is None or (checkpoint_id > self._first[0] and self.stopped is None):
            # task A of the next checkpoint (A of an earlier one saved no state: its batch had no
            # records of its keys; what the gate held of that one went on after HOLD_LIMIT_S)
            self._first = (checkpoint_id, partition, batch)
            return None
        if checkpoint_id != self._first[0] or partition == self._first[1]:
            return None
        return "hold"


@contextlib.contextmanager
def gated_s3() -> Iterator[SnapshotGate]:
    """moto's S3 server behind a :class:`SnapshotGate` on a free port, with the bucket ``BUCKET``; the
    ``AWS_*`` variables point at it (in this process and its children) while it runs. Yields the
    gate."""
    import s3fs
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    port = free_port()
    gate = SnapshotGate(DomainDispatcherApplication(create_backend_app), port)
    server = make_server("127.0.0.1", port, gate, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    variables = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        # moto keeps its buckets in this process, across servers: start from none, as a new S3 would.
        reset = urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST")
        urllib.request.urlopen(reset, timeout=10).close()
        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem().mkdir(BUCKET)
        yield gate
    finally:
        gate.release()
        server.shutdown()
        s3fs.S3FileSystem.clear_instance_cache()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ------------------------------------------------------------------------ standalone Spark


class StandaloneCluster:
    """A standalone Spark master and workers on loopback, each ``bin/spark-class`` of the installed
    PySpark in its own process group (a worker's executors are its children), logs under ``work``.

    Workers get this process's environment without ``AWS_*``: an executor sees moto's S3 only if the
    application passes it (``spark.executorEnv``), as on a real cluster.
    """

    def __init__(self, work: Path) -> None:
        self.spark_class = pyspark_script("spark-class")
        self.work = work
        # Ports are bound by the master itself (port 0) and read from its log: a port picked here
        # and passed on can be taken by another JVM in between, and Spark then moves to the next one
        # silently (a CI run once read another Spark's web page as the master's view).
        self.url = ""
        self.web_port = 0
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.environment = {
            **{k: v for k, v in os.environ.items() if k not in AWS},
            "SPARK_LOCAL_IP": "127.0.0.1",
            # no REST submission server: it takes a fixed port (6066), and nothing here submits
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.work / f"{name}.log").open("ab") as log:
            return subprocess.Popen(
                ["bash", str(self.spark_class), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment,
                start_new_session=True,
            )

    def start(self, workers: int) -> StandaloneCluster:
        self.work.mkdir(parents=True, exist_ok=True)
        self.master = self._start(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", "0", "--webui-port", "0",
        )  # fmt: skip
        eventually(self._bound, timeout=120, what="the standalone master's ports in master.log")
        eventually(self._answers, timeout=120, what=f"the standalone master at {self.url}")
        self.add_workers(workers)
        return self

    def add_workers(self, count: int) -> None:
        """Start ``count`` more workers of 1 core and 1024 MB each, and wait until they are ALIVE."""
        for _ in range(count):
            index = len(self.workers)
            work_dir = self.work / f"worker-{index}"
            work_dir.mkdir(exist_ok=True)
            args = [
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--webui-port", "0", "--cores", "1", "--memory", "1024M",
                "--work-dir", str(work_dir), self.url,
            ]  # fmt: skip
            self.workers.append(self._start(f"worker-{index}", *args))
        expected = len(self.workers)
        eventually(
            lambda: self._answers() and self.state().get("aliveworkers") == expected,
            timeout=120,
            what=f"{expected} workers ALIVE at the master",
        )

    def _bound(self) -> bool:
        """Whether the master logged its RPC URL and its web UI's port (and remember them)."""
        log = (self.work / "master.log").read_text(errors="replace")
        url = re.search(r"Starting Spark master at (spark://\S+)", log)
        web = re.search(r"Successfully started service 'MasterUI' on port (\d+)", log)
        if url is None or web is None:
            return False
        self.url, self.web_port = url.group(1), int(web.group(1))
        return True

    def _answers(self) -> bool:
        """Whether the master's ``/json/`` view answers JSON: just after its web UI binds, it may
        answer the HTML page before the JSON view is attached."""
        try:
            self.state()
        except (OSError, ValueError):
            return False
        return True

    def state(self) -> dict[str, Any]:
        """The master's ``/json/`` view: workers, applications and the cores they use."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/json/", timeout=5) as response:
            state: dict[str, Any] = json.load(response)
        return state

    def executors(self) -> list[Process]:
        """The executor JVMs the workers run."""
        workers = {worker.pid for worker in self.workers}
        return executors(lambda p: p.pgid in workers)

    def close(self) -> None:
        """SIGTERM to each process group (workers first, with their executors), SIGKILL after 10 s."""
        for process in [*self.workers, *([self.master] if self.master else [])]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in [*self.workers, *([self.master] if self.master else [])]:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
