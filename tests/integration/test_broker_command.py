"""``cutline broker`` as a user runs it: it says so when its broker process dies under it (issue 51:
it said nothing, and printed a bootstrap nobody answered at); ``--kafka --sasl`` prints a client
properties file per principal and the commands that use them, which work (issue 47); a SIGTERM
leaves no process of its tree; without Java or Maven it says what to install."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
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


def _tree(pid: int) -> list[int]:
    """``pid``'s descendants, children first."""
    found, parents = [], [pid]
    while parents:
        children = [child for parent in parents for child in _children(parent)]
        found += children
        parents = children
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


@pytest.mark.parametrize(
    "options",
    [
        pytest.param([], marks=pytest.mark.tansu, id="embedded"),
        pytest.param(["--kafka", "--heap", "256m"], marks=pytest.mark.slow, id="apache-kafka"),
    ],
)
def test_a_sigkilled_cutline_broker_leaves_no_broker_running(options: list[str]) -> None:
    """Given ``cutline broker`` serving, when the command is SIGKILLed (no chance to clean up), then
    every process of its tree ends too (the kernel sends them SIGTERM: events/dev/parent_death.py)."""
    command = subprocess.Popen(
        [CUTLINE, "broker", *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        printed = Printed(command)
        eventually(
            lambda: any(line.startswith("bootstrap: ") for line in printed.lines),
            timeout=180,
            what="the broker serving",
        )
        tree = _tree(command.pid)
        assert tree, "the broker runs as a child of the command"

        command.kill()
        command.wait(15)

        eventually(
            lambda: not [pid for pid in tree if _alive(pid)], timeout=60, what="the broker's processes ending"
        )
    finally:
        for pid in _tree(command.pid) if command.poll() is None else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if command.poll() is None:
            command.kill()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _stop_tree(command: subprocess.Popen[str]) -> None:
    """After a failure: SIGTERM the command, then SIGKILL what is left of its tree (its JVMs run each
    in a session of its own)."""
    if command.poll() is not None:
        return
    tree = _tree(command.pid)
    command.terminate()
    try:
        command.wait(60)
    except subprocess.TimeoutExpired:
        for pid in [command.pid, *tree]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        command.wait()


class Printed:
    """What a running command has printed so far, line by line (read by a thread: a readline that
    waits for ever cannot hang the test)."""

    def __init__(self, command: subprocess.Popen[str]) -> None:
        assert command.stdout is not None
        self.lines: list[str] = []
        self._stdout = command.stdout
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._stdout:
            self.lines.append(line.rstrip("\n"))

    def after(self, heading: str) -> list[str]:
        """The indented lines that follow ``heading``."""
        lines = self.lines[self.lines.index(heading) + 1 :]
        return [
            line.strip() for line in lines[: next((i for i, x in enumerate(lines) if x[:1] != " "), None)]
        ]


def _run_printed(line: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A ``cutline ...`` line the broker printed, run as printed (this environment's cutline)."""
    words = shlex.split(line)
    assert "cutline" == words[0], line
    return subprocess.run([CUTLINE, *words[1:]], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.integration
@pytest.mark.slow
def test_cutline_broker_kafka_sasl_prints_each_principal_s_client_properties_and_commands_that_work() -> None:
    """Given ``cutline broker --kafka --sasl`` run as a user runs it, when its printed next commands
    are run as printed, then the administrator's properties file creates the topics and the
    operator's reads the journal, while the coordinator's principal is refused Write on the requests
    by the ACLs it applied, naming the ACL; and ``cutline doctor --role operator`` with the operator's file
    finds every ACL an operator needs. SIGTERM stops it: exit 0, no process of its tree left, the
    properties files deleted."""
    env = {**os.environ, "COLUMNS": "300", "CUTLINE_SESSION_TIMEOUT": "6"}
    command = subprocess.Popen(
        [CUTLINE, "broker", "--kafka", "--sasl"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    printed = Printed(command)
    try:
        eventually(
            lambda: printed.lines,
            lambda lines: (
                any(line.startswith("  export CUTLINE_KAFKA_CONFIG=") for line in lines)
                or command.poll() is not None
            ),
            timeout=180,
            what="the commands it prints once the broker is secured",
        )
        assert command.poll() is None, "\n".join(printed.lines) + (
            command.stderr.read() if command.stderr else ""
        )
        (heading,) = [line for line in printed.lines if line.startswith("client properties (SASL_SSL")]
        files = {words[0]: Path(words[1]) for words in map(str.split, printed.after(heading))}
        assert ["admin", "coordinator", "driver", "task", "operator"] == list(files)
        assert all(0o600 == path.stat().st_mode & 0o777 for path in files.values())
        export, create, _coordinator, tail, _list, _task = printed.after("next, in another shell:")
        env["CUTLINE_BOOTSTRAP"] = export.removeprefix("export CUTLINE_BOOTSTRAP=")
        tree = {pid: _cmdline(pid) for pid in _tree(command.pid)}

        created = _run_printed(create, env)
        assert 0 == created.returncode, created.stdout + created.stderr
        assert "created  cutline.checkpoints" in created.stdout
        read = _run_printed(f"{tail} --idle 2", env)
        assert 0 == read.returncode, read.stdout + read.stderr
        refused = _run_printed(f"cutline --kafka-config {files['coordinator']} trigger job --timeout 60", env)
        assert 0 != refused.returncode
        assert "User:coordinator may not Write topic cutline.requests" in refused.stdout + refused.stderr
        doctor = _run_printed(
            f"cutline --kafka-config {files['operator']} doctor --role operator --json", env
        )
        (acls,) = [c for c in map(json.loads, doctor.stdout.splitlines()) if c["name"] == "Kafka ACLs"]
        assert "ok" == acls["verdict"], acls

        command.send_signal(signal.SIGTERM)
        code = command.wait(60)
    finally:
        _stop_tree(command)
    assert 0 == code
    assert any(b"kafka.Kafka" in cmdline for cmdline in tree.values()), "the JVM was not in its tree"
    assert [] == [pid for pid in tree if Path(f"/proc/{pid}").exists()]
    assert [] == [path for path in files.values() if path.exists()]


@pytest.mark.parametrize("missing", ["java", "mvn"])
def test_cutline_broker_kafka_sasl_without_java_or_maven_says_what_to_install(
    missing: str, tmp_path: Path
) -> None:
    """Without ``java`` on the PATH (nor in $JAVA_HOME), or with Java but without ``mvn`` and no
    cached jars, ``cutline broker --kafka --sasl`` exits 2 at once, naming what is missing and the
    command that installs it."""
    tools = tmp_path / "bin"
    tools.mkdir()
    if missing == "mvn":
        (tools / "java").symlink_to(shutil.which("java") or "java")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{tools}", "JAVA_HOME": ""}
    env["CUTLINE_KAFKA_CACHE"] = str(tmp_path / "cache")  # no jars: Maven would fetch them
    env.pop("CUTLINE_KAFKA_LIBS", None)
    done = subprocess.run(
        [CUTLINE, "broker", "--kafka", "--sasl"], capture_output=True, text=True, timeout=60, env=env
    )

    assert 2 == done.returncode, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert f"no `{missing}` is on the PATH" in said
    assert "apt-get install maven openjdk-17-jre-headless" in said
