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

The watchdog killed outright (``kill -9`` of the ``cutline coordinator`` process) cannot tell the
group. Its worker has it told instead: the kernel signals a watched worker when its watchdog dies
(``PR_SET_PDEATHSIG``); the worker starts a small process that waits for it to be gone and then
sends the same LeaveGroup, and exits at once (:func:`die_with_watchdog`). So no worker runs on
without its watchdog, and killing either process moves the jobs at once.

This is safe because the member is certainly dead: the watchdog has reaped its process (the
small process has seen it gone), so it can neither heartbeat nor write again. Any record a dead
member's last writes left half-way is fenced by the epochs (docs/design.md, "Ownership and fencing") as
before. What neither
can see still takes the session timeout: a whole machine lost, the watchdog and its worker
killed at the same moment (a container's processes), a network partition, a worker that hangs
without dying (the group notices that one by its missing heartbeats).

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
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from events.stopping import StopSignals
from events.task.storage import write_atomic

log = logging.getLogger("cutline.coordinator")

MEMBER_FILE_ENV = "CUTLINE_MEMBER_FILE"
"""Where a watched worker records its group membership after each assignment."""
WATCHDOG_PID_ENV = "CUTLINE_WATCHDOG_PID"
"""The watchdog's pid, in a watched worker's environment."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LEAVE_TIMEOUT_S = 10.0
"""How long the watchdog tries to reach the group coordinator before leaving it to the timeout."""
PR_SET_PDEATHSIG = 1
SCRATCH_PREFIX = "cutline-watchdog-"
"""The watchdog's scratch directory (its worker's membership file) is named so."""
ORPHANED = getattr(signal, "SIGRTMIN", 34) + 2
"""The signal a watched worker gets from the kernel when its watchdog dies (Linux). A real-time
one: Faust's worker (mode) takes SIGUSR1 and SIGUSR2 for itself."""


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


def die_with_watchdog(environ: Mapping[str, str] | None = None, bootstrap: str | None = None) -> bool:
    """In a watched worker: end this process when the watchdog dies (Linux), so that no worker runs
    on without its watchdog. False when not watched or not on Linux.

    With ``bootstrap``, the kernel sends :data:`ORPHANED`, and the worker has its group told what
    the dead watchdog cannot (:func:`_orphaned`); without it, SIGKILL.
    Raises SystemExit when the watchdog is gone already (it died before this was set)."""
    environ = os.environ if environ is None else environ
    watchdog = environ.get(WATCHDOG_PID_ENV)
    if not watchdog or not sys.platform.startswith("linux"):
        return False
    sent: int = signal.SIGKILL
    member_file = environ.get(MEMBER_FILE_ENV)
    if bootstrap and member_file:
        signal.signal(ORPHANED, _orphaned(bootstrap, Path(member_file)))
        sent = ORPHANED
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sent, 0, 0, 0) != 0:
        log.warning("could not tie the worker to its watchdog: %s", os.strerror(ctypes.get_errno()))
        return False
    if os.getppid() != int(watchdog):
        raise SystemExit(f"the coordinator's watchdog (pid {watchdog}) is gone; not starting")
    return True


def _orphaned(bootstrap: str, member_file: Path) -> Callable[[int, FrameType | None], None]:
    """The handler of :data:`ORPHANED`: the watchdog is dead, so it will tell the group nothing.

    The worker starts a process that waits for the worker to be gone and then sends the LeaveGroup
    the watchdog would have sent (``python -m coordinator.service.watchdog leave-for``), and exits
    at once, in the handler, on the thread that decides: it decides and writes nothing more, and
    the LeaveGroup comes only once it is certainly dead, as from the watchdog (a LeaveGroup sent
    by a member still alive would have its consumer thread join the group again)."""

    def on_orphaned(signum: int, frame: FrameType | None) -> None:
        # posix_spawn rather than subprocess: no Python-level lock that the interrupted thread
        # could be holding.
        try:
            leaver = ["-m", "coordinator.service.watchdog", "leave-for", str(os.getpid()), str(member_file)]
            os.posix_spawn(sys.executable, [sys.executable, *leaver, bootstrap], os.environ, setsid=True)
        finally:
            os._exit(128 + signum)

    return on_orphaned


def leave_for(
    pid: int, member_file: Path, leave: Leave, say: Callable[[str], None], wait: float = 10.0
) -> None:
    """Once process ``pid`` (a worker whose watchdog died) is gone, tell its group that the member
    it recorded in ``member_file`` left; then remove the dead watchdog's scratch directory."""
    deadline = time.monotonic() + wait
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    membership = read_membership(member_file)
    if member_file.parent.name.startswith(SCRATCH_PREFIX):  # nobody else will remove it
        shutil.rmtree(member_file.parent, ignore_errors=True)
    if running(pid):
        say(f"the coordinator worker (pid {pid}) lost its watchdog but did not exit; its group was not told")
        return
    how = f"the coordinator's watchdog was killed, and its worker (pid {pid}) exited"
    _tell_the_group(how, membership, leave, say, say_unjoined=False)


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` in ``/proc/<pid>/stat`` (Linux: R, S, T stopped by a
    signal, Z dead and not yet reaped, ...); None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def running(pid: int) -> bool:
    """Process ``pid`` exists and has not ended (Linux). Dead and not yet reaped counts as ended:
    an orphaned worker waits for init to reap it, which may take a while."""
    return process_state(pid) not in (None, "Z")


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


def group_leaver(bootstrap: str) -> Leave:
    """:func:`leave_group` through the broker at ``bootstrap``, with the client settings (TLS, SASL)
    of this process's environment, as the worker's own."""
    from events.kafka.client_config import aiokafka_security, client_properties

    security = aiokafka_security(client_properties())

    def leave(membership: Membership) -> int:
        return asyncio.run(leave_group(bootstrap, membership, security))

    return leave


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
    with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX) as scratch, StopSignals(FORWARDED) as stops:
        member_file = Path(scratch) / "membership.json"
        env = {**os.environ, MEMBER_FILE_ENV: str(member_file), WATCHDOG_PID_ENV: str(os.getpid())}
        signum = stops.signum
        if signum is not None:  # stopped before it started a worker
            return 128 + signum
        # Its own session: a terminal's Ctrl-C reaches only the watchdog, which passes it on once.
        child = subprocess.Popen(list(command), env=env, start_new_session=True)
        returncode = _wait_forwarding(child, stops)
        if returncode != 0:
            how = f"the coordinator worker (pid {child.pid}) {describe_exit(returncode)}"
            # An exit with an error has said why itself.
            _tell_the_group(how, read_membership(member_file), leave, say, say_unjoined=returncode < 0)
        return exit_code(returncode)


def _wait_forwarding(child: subprocess.Popen[bytes], stops: StopSignals) -> int:
    """Wait for ``child`` to exit, passing on each signal ``stops`` receives (SIGHUP as SIGTERM);
    its return code. The passing on happens here, not in the signal handler (which takes no lock:
    ``events.stopping``)."""
    pidfd: int | None = None
    with contextlib.suppress(AttributeError, OSError):  # Linux 5.3 and later
        pidfd = os.pidfd_open(child.pid)
    forwarded = 0
    stopping_since: float | None = None
    try:
        while True:
            for signum in stops.received[forwarded:]:
                forwarded += 1
                stopping_since = stopping_since or time.monotonic()
                if child.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        child.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)
            code = child.poll()
            if code is not None:
                return code
            if stopping_since is not None and time.monotonic() - stopping_since > STOP_GRACE_S:
                _kill_late(child)
            # the timeout: a signal whose number woke the sleep before its handler ran
            stops.sleep(0.5 if pidfd is not None else 0.1, fds=() if pidfd is None else (pidfd,))
    finally:
        if pidfd is not None:
            os.close(pidfd)


STOP_GRACE_S = 8.0
"""Seconds the worker has to stop in order after the first stop signal; then it is killed, so that
``cutline coordinator`` stops within 10 s whatever the broker does. The worker's Kafka consumer waits
up to a minute for a broker that is gone before it gives up: nothing is lost by not waiting, since
an input's offset is committed only after its journal writes were acknowledged."""


def _kill_late(child: subprocess.Popen[bytes]) -> None:
    log.warning(
        "the coordinator worker (pid %d) did not stop within %g s of the stop signal (an unreachable "
        "broker holds its Kafka clients): killed; its uncommitted input is decided again by the next owner",
        child.pid,
        STOP_GRACE_S,
    )
    with contextlib.suppress(ProcessLookupError):
        child.kill()


def _tell_the_group(
    how: str, membership: Membership | None, leave: Leave, say: Callable[[str], None], *, say_unjoined: bool
) -> None:
    """Send ``membership``'s LeaveGroup and say what happened (``how`` the worker ended, first)."""
    if membership is None:
        if say_unjoined:
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


def main(argv: Sequence[str]) -> int:
    """``python -m coordinator.service.watchdog leave-for PID MEMBER_FILE BOOTSTRAP``: the LeaveGroup
    of a worker whose watchdog died (:func:`_orphaned` starts it), with the worker's client
    settings (TLS, SASL) from the same environment."""
    if len(argv) != 4 or argv[0] != "leave-for":
        print(
            "usage: python -m coordinator.service.watchdog leave-for PID MEMBER_FILE BOOTSTRAP",
            file=sys.stderr,
        )
        return 2
    pid, member_file, bootstrap = int(argv[1]), Path(argv[2]), argv[3]
    leave_for(
        pid, member_file, group_leaver(bootstrap), lambda message: print(message, file=sys.stderr, flush=True)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
