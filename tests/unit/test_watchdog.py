"""The coordinator's watchdog (coordinator/service/watchdog.py), with real child processes.

The group is not a broker here: ``leave`` is a function that records what it was asked to send.
tests/integration/test_ownership.py::TestWatchdog runs the real thing with three workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from support import eventually

from coordinator.service.watchdog import (
    MEMBER_FILE_ENV,
    WATCHDOG_PID_ENV,
    Membership,
    die_with_watchdog,
    exit_code,
    leave_for,
    membership_of,
    process_state,
    read_membership,
    record_membership,
    running,
    watch,
)

MEMBERSHIP = Membership("cutline-coordinator", "aiokafka-0-1c2d", 4)


def child(body: str) -> list[str]:
    """A worker stand-in: Python running ``body``, with the watchdog module importable."""
    return [sys.executable, "-c", textwrap.dedent(body)]


RECORDS_THEN_DIES = child(
    """
    import os, signal
    from pathlib import Path
    from coordinator.service.watchdog import MEMBER_FILE_ENV, Membership, record_membership
    membership = Membership("cutline-coordinator", "aiokafka-0-1c2d", 4)
    record_membership(Path(os.environ[MEMBER_FILE_ENV]), membership)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


class Group:
    """Stands in for the group coordinator: the LeaveGroups it got, and what it answers."""

    def __init__(self, answer: int | Exception = 0) -> None:
        self.left: list[Membership] = []
        self.answer = answer

    def leave(self, membership: Membership) -> int:
        self.left.append(membership)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_a_worker_killed_after_its_assignment_is_reported_to_its_group_as_gone() -> None:
    group, said = Group(), []

    code = watch(RECORDS_THEN_DIES, group.leave, said.append)

    assert group.left == [MEMBERSHIP]
    assert code == 128 + signal.SIGKILL
    assert "was killed by SIGKILL" in said[0] and "member aiokafka-0-1c2d left" in said[0]


def test_a_worker_that_exits_cleanly_left_by_itself_and_nothing_is_sent() -> None:
    group, said = Group(), []
    body = """
        import os
        from pathlib import Path
        from coordinator.service.watchdog import MEMBER_FILE_ENV, Membership, record_membership
        record_membership(Path(os.environ[MEMBER_FILE_ENV]), Membership("g", "m", 1))
        """

    code = watch(child(body), group.leave, said.append)

    assert (code, group.left, said) == (0, [], [])


def test_a_worker_that_fails_before_joining_has_nothing_to_leave() -> None:
    """It said why it exits itself (a finite retention, say); the watchdog adds nothing."""
    group, said = Group(), []

    code = watch(child("raise SystemExit(2)"), group.leave, said.append)

    assert (code, group.left, said) == (2, [], [])


def test_a_worker_killed_before_joining_has_nothing_to_leave() -> None:
    group, said = Group(), []

    code = watch(child("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), group.leave, said.append)

    assert (code, group.left) == (128 + signal.SIGKILL, [])
    assert "was killed by SIGKILL" in said[0] and "had not joined its group" in said[0]


def test_an_unreachable_group_leaves_the_handover_to_the_session_timeout() -> None:
    group, said = Group(answer=TimeoutError("no broker")), []

    code = watch(RECORDS_THEN_DIES, group.leave, said.append)

    assert code == 128 + signal.SIGKILL and group.left == [MEMBERSHIP]
    assert "failed (TimeoutError: no broker)" in said[0] and "after the session timeout" in said[0]


def test_an_error_from_the_group_is_reported() -> None:
    group, said = Group(answer=25), []  # UNKNOWN_MEMBER_ID

    watch(RECORDS_THEN_DIES, group.leave, said.append)

    assert "answered error 25" in said[0]


def test_the_worker_gets_its_member_file_and_the_watchdog_s_pid() -> None:
    body = f"""
        import os, sys
        sys.exit(0 if os.environ[{WATCHDOG_PID_ENV!r}] == str(os.getppid())
                 and os.environ[{MEMBER_FILE_ENV!r}].endswith("membership.json") else 9)
        """
    assert watch(child(body), Group().leave, print) == 0


def test_sigterm_to_the_watchdog_is_passed_on_and_its_exit_code_is_the_worker_s(tmp_path: Path) -> None:
    started = tmp_path / "started"
    body = f"""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
        time.sleep(0.2)  # the watchdog's handlers are in place by now
        open({str(started)!r}, "w").close()
        time.sleep(30)
        """

    def terminate_when_started() -> None:
        try:
            eventually(started.exists, timeout=20, interval=0.02, what="the worker to start")
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_when_started, daemon=True).start()
    group, said = Group(), []
    handler, began = signal.getsignal(signal.SIGTERM), time.monotonic()

    code = watch(child(body), group.leave, said.append)

    assert code == 3 and time.monotonic() - began < 20
    assert (group.left, said) == ([], [])
    assert signal.getsignal(signal.SIGTERM) == handler  # this process's own handler is back


LINUX_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def kill_the_watchdog_of(worker: str, tmp_path: Path, env: str = "", stderr: Path | None = None) -> int:
    """Start a watchdog stand-in whose child runs ``worker`` (which writes its pid to
    ``tmp_path / "worker.pid"``) with ``env`` lines adding to its environment, SIGKILL the
    watchdog, and wait for the worker to end; its pid."""
    pid_file = tmp_path / "worker.pid"
    out = "None" if stderr is None else f"open({str(stderr)!r}, 'w')"
    watchdog = f"""
        import os, subprocess, sys
        env = {{**os.environ, {WATCHDOG_PID_ENV!r}: str(os.getpid())}}
        {env}
        subprocess.Popen([sys.executable, "-c", {textwrap.dedent(worker)!r}], env=env, stderr={out}).wait()
        """
    parent = subprocess.Popen(child(watchdog))
    worker_pid = int(
        eventually(
            lambda: pid_file.exists() and pid_file.read_text(),
            timeout=20,
            interval=0.02,
            what="the worker to start (its pid file)",
        )
    )

    parent.kill()
    parent.wait(10)

    eventually(lambda: not running(worker_pid), timeout=10, interval=0.02, what=f"worker {worker_pid} to end")
    return worker_pid


@LINUX_ONLY
def test_a_killed_watchdog_takes_its_worker_with_it(tmp_path: Path) -> None:
    """The worker asks the kernel for SIGKILL when its parent dies (Linux)."""
    worker = f"""
        import os, time
        from coordinator.service.watchdog import die_with_watchdog
        assert die_with_watchdog()
        open({str(tmp_path / "worker.pid")!r}, "w").write(str(os.getpid()))
        time.sleep(60)
        """

    kill_the_watchdog_of(worker, tmp_path)


@LINUX_ONLY
def test_a_killed_watchdog_has_its_orphaned_worker_tell_the_group(tmp_path: Path) -> None:
    """Given a worker that recorded its membership under a watchdog (with the broker's address, as
    ``cutline coordinator`` starts it), when the watchdog is SIGKILLed, then the worker exits, and
    a process it started sends the LeaveGroup of that membership once the worker is gone, and
    removes the dead watchdog's scratch directory. (The broker here is unreachable: what the
    leaver says shows it tried, for the right member, and that the session timeout still holds.)"""
    scratch = tmp_path / "cutline-watchdog-x"
    scratch.mkdir()
    member_file, said = scratch / "membership.json", tmp_path / "said"
    worker = f"""
        import os, time
        from pathlib import Path
        from coordinator.service.watchdog import Membership, die_with_watchdog, record_membership
        record_membership(Path({str(member_file)!r}), Membership("cutline-coordinator", "aiokafka-0-1c2d", 4))
        assert die_with_watchdog(bootstrap="127.0.0.1:9")
        open({str(tmp_path / "worker.pid")!r}, "w").write(str(os.getpid()))
        time.sleep(60)
        """

    worker_pid = kill_the_watchdog_of(
        worker, tmp_path, env=f"env[{MEMBER_FILE_ENV!r}] = {str(member_file)!r}", stderr=said
    )

    # the leaver's one line ends so; aiokafka's own "Connect call failed" may come before it
    told = eventually(
        said.read_text,
        lambda text: "after the session timeout instead" in text,
        timeout=30,
        what="the leaver to say that telling the group failed",
    )
    assert f"the coordinator's watchdog was killed, and its worker (pid {worker_pid}) exited" in told
    assert "telling group 'cutline-coordinator' that it left failed" in told
    assert "after the session timeout instead" in told
    assert not scratch.exists()


def test_the_leaver_waits_for_the_worker_to_be_gone_before_it_tells_the_group(tmp_path: Path) -> None:
    """The LeaveGroup goes out only once the orphaned worker's process has ended; then the dead
    watchdog's scratch directory is removed."""
    scratch = tmp_path / "cutline-watchdog-x"
    scratch.mkdir()
    record_membership(scratch / "membership.json", MEMBERSHIP)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    reaper = threading.Thread(target=worker.wait)  # the worker's parent reaps it, as init would
    reaper.start()
    group, said, alive_when_told = Group(), [], []

    def leave(membership: Membership) -> int:
        alive_when_told.append(running(worker.pid))
        return group.leave(membership)

    leave_for(worker.pid, scratch / "membership.json", leave, said.append)
    reaper.join()

    assert (group.left, alive_when_told) == ([MEMBERSHIP], [False])
    assert f"its worker (pid {worker.pid}) exited; told group 'cutline-coordinator'" in said[0]
    assert [] == list(tmp_path.iterdir())


def test_the_leaver_counts_a_dead_worker_not_yet_reaped_as_gone(tmp_path: Path) -> None:
    """An orphaned worker is reaped by init, perhaps late; dead, it can neither heartbeat nor write."""
    record_membership(tmp_path / "membership.json", MEMBERSHIP)
    worker = subprocess.Popen([sys.executable, "-c", "pass"])  # not waited for: a zombie once it exits
    try:
        eventually(
            lambda: process_state(worker.pid),
            lambda state: state == "Z",
            timeout=20,
            interval=0.02,
            what="the stand-in worker to exit",
        )
        group, started = Group(), time.monotonic()

        leave_for(worker.pid, tmp_path / "membership.json", group.leave, [].append, wait=10.0)

        assert group.left == [MEMBERSHIP] and time.monotonic() - started < 5.0
    finally:
        worker.wait()


def test_the_leaver_removes_only_a_watchdog_s_scratch_directory(tmp_path: Path) -> None:
    """A member file elsewhere (a path given by hand) is read, and its directory kept."""
    record_membership(tmp_path / "membership.json", MEMBERSHIP)
    group = Group()

    leave_for(2**22 + 1, tmp_path / "membership.json", group.leave, [].append)

    assert group.left == [MEMBERSHIP]
    assert (tmp_path / "membership.json").exists()


def test_the_leaver_tells_nothing_while_the_worker_still_runs(tmp_path: Path) -> None:
    record_membership(tmp_path / "membership.json", MEMBERSHIP)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    group, said = Group(), []
    try:
        leave_for(worker.pid, tmp_path / "membership.json", group.leave, said.append, wait=0.3)
    finally:
        worker.kill()
        worker.wait()

    assert group.left == []
    assert "did not exit; its group was not told" in said[0]


def test_the_leaver_of_a_worker_that_never_joined_sends_nothing(tmp_path: Path) -> None:
    (tmp_path / "scratch").mkdir()
    group, said = Group(), []

    leave_for(2**22 + 1, tmp_path / "scratch" / "membership.json", group.leave, said.append)

    assert (group.left, said) == ([], [])


def test_a_worker_whose_watchdog_is_already_gone_does_not_start() -> None:
    with pytest.raises(SystemExit, match="watchdog .* is gone"):
        die_with_watchdog({WATCHDOG_PID_ENV: str(os.getppid() + 1_000_000)})


def test_an_unwatched_worker_is_not_tied_to_its_parent() -> None:
    assert die_with_watchdog({}) is False


def test_a_membership_is_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "membership.json"
    record_membership(path, MEMBERSHIP)
    assert read_membership(path) == MEMBERSHIP


@pytest.mark.parametrize("content", [None, "", "{", '{"group_id": "g"}', '["g", "m", 1]'])
def test_no_membership_is_read_from_a_missing_or_broken_file(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "membership.json"
    if content is not None:
        path.write_text(content)
    assert read_membership(path) is None


class _Coordinator:
    def __init__(self, member_id: str, generation: int) -> None:
        self.group_id, self.member_id, self.generation = "cutline-coordinator", member_id, generation


class _Holder:
    def __init__(self, **attributes: object) -> None:
        self.__dict__.update(attributes)


def test_membership_is_read_from_faust_s_consumer_thread_once_joined() -> None:
    joined = _Holder(_thread=_Holder(_consumer=_Holder(_coordinator=_Coordinator("aiokafka-0-1c2d", 4))))
    assert membership_of(joined) == MEMBERSHIP


@pytest.mark.parametrize(
    "consumer",
    [
        _Holder(),  # no consumer thread yet
        _Holder(_thread=_Holder(_consumer=None)),  # not started
        _Holder(_thread=_Holder(_consumer=_Holder(_coordinator=_Coordinator("", -1)))),  # not joined
    ],
)
def test_no_membership_before_the_consumer_joined(consumer: object) -> None:
    assert membership_of(consumer) is None


def test_the_private_parts_it_reads_are_there_in_the_installed_faust_and_aiokafka() -> None:
    """membership_of reads Faust's ``Consumer._thread._consumer`` and aiokafka's group coordinator."""
    import inspect

    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer

    assert "self._thread" in inspect.getsource(Consumer)
    assert "self._consumer = self._create_consumer" in inspect.getsource(AIOKafkaConsumerThread)
    coordinator_source = inspect.getsource(GroupCoordinator)
    for attribute in ("self.group_id", "self.member_id", "self.generation"):
        assert attribute in coordinator_source, attribute


@pytest.mark.parametrize(("returncode", "expected"), [(0, 0), (2, 2), (-9, 137), (-15, 143)])
def test_exit_codes_are_reported_as_a_shell_does(returncode: int, expected: int) -> None:
    assert exit_code(returncode) == expected


def test_the_worker_is_started_with_every_option_the_watchdog_was_given() -> None:
    """Each parameter of ``cutline coordinator`` (but ``--watchdog``) reaches the worker, and the
    worker's command line parses back to the same values: an option added later and not passed on
    fails here."""
    import inspect

    import typer

    from coordinator import cli

    given = {
        "bootstrap": "broker:9092",
        "topic_prefix": "p.",
        "web_host": "0.0.0.0",
        "web_port": 6067,
        "data_dir": Path("/var/cutline"),
        "loglevel": "info",
        "snapshot_interval": 2.5,
        "savepoint_root": ["file:///a", "file:///b"],
        "session_timeout": 9.0,
        "fetch_wait_ms": 500,
        "partitions": 3,
        "web_advertised_host": "coordinator-1",
        "web_allowed_host": ["dashboard.example", "cutline.internal"],
        "latency_granularity": "subtask",
    }
    assert set(inspect.signature(cli.coordinator).parameters) - {"watchdog"} == set(given)

    command = cli._worker_command(**given)

    assert command[:5] == [sys.executable, "-m", "coordinator.cli", "coordinator", "--no-watchdog"]
    group = typer.main.get_command(cli.app)
    coordinator = group.commands["coordinator"]  # type: ignore[attr-defined]
    parsed = coordinator.make_context("coordinator", command[4:]).params
    assert parsed == {**given, "watchdog": False}
