"""A Spark Connect server for the tests, started from the installed PySpark (docs/spark.md, "Spark Connect").

``spark-submit --class SparkConnectServer`` in the foreground, ``local[2]`` on loopback, on a free
port; its Python workers (the source, the tasks, a ``foreachBatch`` sink) run this interpreter, so
they import the project. :meth:`launch` does not wait, so the caller can start other things while
the JVM starts (15-30 s on 2 busy cores); :meth:`wait_ready` waits until its port accepts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Self

from support import eventually, pyspark_script

from events.dev.broker import HOST, free_port

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


PORT_CHANCES = 3
"""Ports :meth:`ConnectServer.wait_ready` tries."""


class PortTaken(RuntimeError):
    """The server could not bind the port chosen for it."""


class ConnectServer:
    """One Spark Connect server process, its log in ``directory/server.log``."""

    def __init__(self, directory: Path, memory: str = "1g") -> None:
        self.directory = directory
        self.memory = memory
        self.port = free_port()
        self.log_path = directory / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The ``sc://`` URL a client passes to ``SparkSession.builder.remote``."""
        return f"sc://{HOST}:{self.port}"

    def command(self) -> list[str]:
        spark_submit = pyspark_script("spark-submit")
        settings = {
            "spark.connect.grpc.binding.address": HOST,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
        }
        confs = [part for key, value in settings.items() for part in ("--conf", f"{key}={value}")]
        return [str(spark_submit), "--class", SERVER_CLASS, "--master", "local[2]",
                "--driver-memory", self.memory, *confs]  # fmt: skip

    def launch(self) -> Self:
        """Start the server without waiting for it (then :meth:`wait_ready`)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": HOST}
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self.command(),
                cwd=self.directory,  # its spark-warehouse and derby files, if any, go there
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends its Python workers too
            )
        return self

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Wait until the server says it started on its port and the port accepts; raise with its
        log's tail if it exits first. A port that another process took after :func:`free_port` chose
        it (a JVM binds seconds later) is chosen again, up to :data:`PORT_CHANCES` times."""
        for chance in range(1, PORT_CHANCES + 1):
            try:
                eventually(
                    self._ready, timeout=timeout, interval=0.2, what=f"the Spark Connect server at {self.url}"
                )
                return
            except PortTaken:
                if chance == PORT_CHANCES:
                    raise
                self.port = free_port()
                self.launch()

    def _ready(self) -> bool:
        process = self._process
        assert process is not None, "launch() first"
        if process.poll() is not None:
            tail = self.tail()
            failed = PortTaken if "java.net.BindException" in tail else RuntimeError
            raise failed(f"the Spark Connect server exited with {process.returncode}:\n{tail}")
        # its own line first: a port that accepts may be another process's that took it
        if f"Spark Connect server started at: {HOST}:{self.port}" not in self._log():
            return False
        with socket.socket() as probe:
            probe.settimeout(1)
            return probe.connect_ex((HOST, self.port)) == 0

    def _log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM to the server's process group, SIGKILL if it is still there after ``grace`` s."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
