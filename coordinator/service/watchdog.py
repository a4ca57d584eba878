"""The coordinator worker in a child process, and the group told at once when it dies.

A worker that is killed outright (SIGKILL, the kernel's OOM killer, a crash in native code) sends
no LeaveGroup. The group keeps the dead member, and its partitions, until the session timeout has
passed without a heartbeat from it; only then does the rebalance start (on the embedded broker,
half the session timeout later still: ``docs/embedded-broker.md``). Flink does not wait for a
heartbeat timeout when a TaskManager's process exits: YARN or Kubernetes tells its ResourceManager
at once. ``cutline coordinator`` does the same for its worker: it runs the worker as a child
process and waits for it. When the child dies of a signal, or exits with an error, the watchdog
sends the group a LeaveGroup for the member id the worker recorded after its last assignment
(:func:`record_membership`). The other workers' next heartbeat then starts the rebalance, and
the dead worker's jobs move without waiting for the session timeout.

This is safe because the member is certainly dead: the watchdog has reaped its process, so it
can neither heartbeat nor write again. Any record a dead member's last writes left half-way is
fenced by the epochs of DESIGN §4a as before. What the watchdog cannot see still takes the
session timeout: a whole machine lost, a network partition, a worker that hangs without dying
(the group notices that one by its missing heartbeats). The watchdog itself killed
(SIGKILL) takes its worker with it (``PR_SET_PDEATHSIG``), so no worker is ever left running
without one, and that case, too, is noticed after the session timeout.

SIGINT, SIGTERM and SIGHUP sent to the watchdog are passed on to the worker, which stops in order
and leaves the group itself; the watchdog then exits with the worker's exit code (128 + the
signal's number when a signal ended it, as a shell reports it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from events.storage import write_atomic

log = logging.getLogger("cutline.coordinator")

MEMBER_FILE_ENV = "CUTLINE_MEMBER_FILE"
"""Where a watched worker records its group membership after each assignment."""
WATCHDOG_PID_ENV = "CUTLINE_WATCHDOG_PID"
"""The watchdog's pid, in a watched worker's environment."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LEAVE_TIMEOUT_S = 10.0
"""How long the watchdog tries to reach the group coordinator before leaving it to the timeout."""
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Membership:
    """A worker's place in its consumer group, as of its last assignment."""

    group_id: str
    member_id: str
    generation: int


def record_membership(path: Path, membership: Membership) -> None:
    """Write ``membership`` for the watchdog (whole or not at all; no fsync: it lives as long as
    the watchdog)."""
    write_atomic(path, json.dumps(asdict(membership)).encode(), durable=False)


def read_membership(path: Path) -> Membership | None:
    """The membership a worker recorded at ``path``; None when it recorded none (it never got an
    assignment) or the file is not one."""
    try:
        fields = json.loads(path.read_text())
        return Membership(str(fields["group_id"]), str(fields["member_id"]), int(fields["generation"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def membership_of(consumer: Any) -> Membership | None:
    """The group membership of a Faust aiokafka consumer (``app.consumer``); None before it joined.

    Reads aiokafka's group coordinator, which Faust keeps private (``Consumer._thread._consumer``):
    the faust-streaming and aiokafka versions are bounded in ``pyproject.toml``, and
    ``tests/unit/test_watchdog.py`` checks these attributes on the installed versions."""
    inner = getattr(getattr(consumer, "_thread", None), "_consumer", None)
    group = getattr(inner, "_coordinator", None)
    member_id = getattr(group, "member_id", "")
    generation = getattr(group, "generation", -1)
    if not member_id or not isinstance(generation, int) or generation < 0:
        return None
    return Membership(str(group.group_id), str(member_id), generation)  # type: ignore[union-attr]


def die_with_watchdog(environ: Mapping[str, str] | None = None) -> bool:
    """In a watched worker: have the kernel SIGKILL this process when the watchdog dies (Linux), so
    that no worker runs on without its watchdog. False when not watched or not on Linux.

    Raises SystemExit when the watchdog is gone already (it died before this was set)."""
    environ = os.environ if environ is None else environ
    watchdog = environ.get(WATCHDOG_PID_ENV)
    if not watchdog or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning("could not tie the worker to its watchdog: %s", os.strerror(ctypes.get_errno()))
        return False
    if os.getppid() != int(watchdog):
        raise SystemExit(f"the coordinator's watchdog (pid {watchdog}) is gone; not starting")
    return True


async def leave_group(
    bootstrap: str, membership: Membership, security: Mapping[str, Any], timeout: float = LEAVE_TIMEOUT_S
) -> int:
    """Send the group coordinator a LeaveGroup for ``membership``'s member; the error code it
    answered (0: none; brokers answering LeaveGroup v0 and v1 give no code per member)."""
    from aiokafka.client import AIOKafkaClient, CoordinationType
    from aiokafka.protocol.group import LeaveGroupRequest

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000), **security)
    try:
        async with asyncio.timeout(timeout):
            await client.bootstrap()
            node = await client.coordinator_lookup(CoordinationType.GROUP, membership.group_id)
            response = await client.send(node, LeaveGroupRequest(membership.group_id, membership.member_id))
            return int(response.error_code)
    finally:
        await client.close()


def exit_code(returncode: int) -> int:
    """A child's ``returncode`` as a shell reports it: 128 + the signal's number for a signal."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


Leave = Callable[[Membership], int]
"""Sends the LeaveGroup of a dead worker's membership; returns the broker's error code."""


def watch(command: Sequence[str], leave: Leave, say: Callable[[str], None] = print) -> int:
    """Run the worker ``command`` as a child and wait for it; tell its group when it dies.

    Returns the exit code for the watchdog: the worker's (:func:`exit_code`)."""
    with tempfile.TemporaryDirectory(prefix="cutline-watchdog-") as scratch:
        member_file = Path(scratch) / "membership.json"
        env = {**os.environ, MEMBER_FILE_ENV: str(member_file), WATCHDOG_PID_ENV: str(os.getpid())}
        # Its own session: a terminal's Ctrl-C reaches only the watchdog, which passes it on once.
        child = subprocess.Popen(list(command), env=env, start_new_session=True)

        def forward(signum: int, frame: FrameType | None) -> None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
        try:
            returncode = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if returncode != 0:
            _tell_the_group(child.pid, returncode, read_membership(member_file), leave, say)
        return exit_code(returncode)


def _tell_the_group(
    pid: int, returncode: int, membership: Membership | None, leave: Leave, say: Callable[[str], None]
) -> None:
    how = f"the coordinator worker (pid {pid}) {describe_exit(returncode)}"
    if membership is None:
        if returncode < 0:  # an exit with an error has said why itself
            say(f"{how}; it had not joined its group, so no other worker waits for it")
        return
    try:
        code = leave(membership)
    except Exception as exc:  # the broker unreachable, a timeout: the session timeout still applies
        say(
            f"{how}; telling group {membership.group_id!r} that it left failed ({type(exc).__name__}: "
            f"{exc}): its partitions move to the other workers after the session timeout instead"
        )
        return
    if code == 0:
        say(
            f"{how}; told group {membership.group_id!r} that member {membership.member_id} left: its "
            "partitions move to the other workers now, not after the session timeout"
        )
    else:
        say(
            f"{how}; group {membership.group_id!r} answered error {code} to the LeaveGroup of member "
            f"{membership.member_id} (it may have left or been removed already)"
        )
