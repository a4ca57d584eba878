"""The tests' Spark Connect server (connect_server.py) chooses its port again when another process took
it, and never takes another process's listener on its port for its own. Played by a small Python
server in its place: what is tested is the helper's waiting, not Spark."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from connect_server import PORT_CHANCES, ConnectServer, PortTaken

from events.dev.broker import HOST

FAKE = """
import socket, sys, time
port = int(sys.argv[1])
server = socket.socket()
try:
    server.bind((sys.argv[2], port))
except OSError:
    print("java.net.BindException: Failed to bind to address", flush=True)
    sys.exit(255)
server.listen()
print(f"INFO SparkConnectServer: Spark Connect server started at: {sys.argv[2]}:{port}", flush=True)
time.sleep(60)
"""


class FakeServer(ConnectServer):
    def command(self) -> list[str]:
        return [sys.executable, "-c", FAKE, str(self.port), HOST]


def taken() -> socket.socket:
    """A port another process listens on."""
    holder = socket.socket()
    holder.bind((HOST, 0))
    holder.listen()
    return holder


def test_a_port_taken_before_the_server_bound_it_is_chosen_again(tmp_path: Path) -> None:
    with taken() as holder:
        server = FakeServer(tmp_path)
        server.port = holder.getsockname()[1]  # what free_port chose, taken since
        try:
            server.launch().wait_ready(timeout=30)
            assert server.port != holder.getsockname()[1]
            assert server.url == f"sc://{HOST}:{server.port}"
        finally:
            server.stop(grace=5)


def test_a_port_taken_at_every_chance_fails_naming_the_bind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holders = [taken() for _ in range(PORT_CHANCES)]
    ports = iter(h.getsockname()[1] for h in holders)
    monkeypatch.setattr("connect_server.free_port", lambda: next(ports))
    server = FakeServer(tmp_path)
    try:
        with pytest.raises(PortTaken, match="BindException"):
            server.launch().wait_ready(timeout=30)
    finally:
        server.stop(grace=5)
        for holder in holders:
            holder.close()
