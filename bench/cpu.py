"""CPU accounting for the benchmarks, from /proc (Linux only).

Hand-written rather than psutil: the figures need ``cutime``/``cstime`` (the CPU of
children that ended and were reaped, e.g. Spark's short-lived Python workers) summed
over a process tree, and reading a few /proc files is all it takes.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import time
from collections.abc import Callable, Mapping
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _fields(path: Path) -> list[str] | None:
    """The fields of a /proc/.../stat file after the command name (None if it is gone)."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _stat_cpu(path: Path, children: bool = False) -> float:
    """utime + stime (+ cutime + cstime with ``children``) of a stat file, in seconds (0 if gone)."""
    fields = _fields(path)
    if fields is None:
        return 0.0
    try:
        used = int(fields[11]) + int(fields[12])
        if children:
            used += int(fields[13]) + int(fields[14])
    except (IndexError, ValueError):
        return 0.0
    return used / TICK


def cpu_and_start(pid: int) -> tuple[float, int] | None:
    """CPU seconds used so far by ``pid`` and its start time (clock ticks after boot: with the pid,
    it names one process); None if it is gone."""
    fields = _fields(Path(f"/proc/{pid}/stat"))
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK, int(fields[19])


def process_cpu(pid: int | None) -> float:
    """CPU seconds used so far by every thread of ``pid`` (0 if None or gone)."""
    return 0.0 if pid is None else _stat_cpu(Path(f"/proc/{pid}/stat"))


def main_thread_cpu(pid: int | None) -> float:
    """CPU seconds used so far by the main thread of ``pid`` alone."""
    return 0.0 if pid is None else _stat_cpu(Path(f"/proc/{pid}/task/{pid}/stat"))


def machine_busy() -> float:
    """CPU seconds all cores have been busy so far (/proc/stat, without idle and iowait)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    return (sum(fields) - fields[3] - fields[4]) / TICK


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _fields(entry / "stat")
        if fields is None:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the threads of ``pid`` by thread name, digits dropped (``Executor task launch
    worker for task 12`` and ``... 13`` count together)."""
    found: dict[str, float] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        name = "".join(c for c in name if not c.isdigit()).strip(" -#") or "?"
        found[name] = found.get(name, 0.0) + _stat_cpu(task / "stat")
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class TreeMeter:
    """CPU seconds of this process and of each kind of process below it, over a span.

    ``classify`` names the kind of a descendant from its command line (None: "other
    children"). A descendant counts with its reaped children (``cutime``), so
    workers that come and go inside a kind are not lost; this process counts alone.
    "other processes" is the rest of the machine's busy time.
    """

    def __init__(
        self,
        classify: Callable[[str], str | None],
        self_name: str = "this process",
        threads_of: frozenset[str] = frozenset(),
    ) -> None:
        self.classify = classify
        self.self_name = self_name
        self.threads_of = threads_of
        """Kinds whose threads are also counted, as ``kind: thread name`` (digits in names dropped)."""
        self._kinds: dict[int, str] = {}
        self._before = self._read()
        self._wall = time.monotonic()

    def _kind(self, pid: int) -> str:
        kind = self._kinds.get(pid)
        if kind is None:
            kind = self._kinds[pid] = self.classify(command_line(pid)) or "other children"
        return kind

    def _read(self) -> dict[str, float]:
        me = os.getpid()
        found: dict[str, float] = {self.self_name: _stat_cpu(Path(f"/proc/{me}/stat"))}
        for pid in [me, *descendants(me)]:
            kind = self.self_name if pid == me else self._kind(pid)
            if pid != me:
                found[kind] = found.get(kind, 0.0) + _stat_cpu(Path(f"/proc/{pid}/stat"), children=True)
            if kind in self.threads_of:
                for name, used in thread_cpu(pid).items():
                    key = f"{kind}: {name}"
                    found[key] = found.get(key, 0.0) + used
        found["machine"] = machine_busy()
        return found

    def stop(self) -> dict[str, float]:
        """CPU seconds by kind since construction, plus ``other processes`` and ``wall``."""
        after = self._read()
        used = {
            k: max(0.0, after.get(k, 0.0) - self._before.get(k, 0.0))
            for k in after.keys() | self._before.keys()
        }
        ours = sum(v for k, v in used.items() if k != "machine" and ": " not in k)
        used["other processes"] = max(0.0, used["machine"] - ours)
        used["wall"] = time.monotonic() - self._wall
        return used


def summed(spans: list[Mapping[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for span in spans:
        for key, value in span.items():
            total[key] = total.get(key, 0.0) + value
    return total


def cpu_model() -> str:
    """The processor's model name from /proc/cpuinfo ("unknown" where it says none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return "unknown"


def reference_ns_per_loop(iterations: int = 2_000_000, repeats: int = 3) -> float:
    """Nanoseconds per iteration of a plain Python loop (best of ``repeats``): a yardstick for
    comparing figures taken on different machines of the same kind, where the model name alone
    does not tell (the same "Intel Xeon Processor" ran ``handle()`` 27 % slower on 2026-11-26 than
    on 2026-11-25). About 0.4 s."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        total = 0
        for i in range(iterations):
            total += i
        best = min(best, time.perf_counter() - started)
    return best / iterations * 1e9


def code_checked() -> str:
    """The checkout this process imports ``coordinator`` from, for a benchmark that starts coordinator
    workers. They run as ``python -m coordinator.cli``, which puts the working directory first on
    the path: started from another checkout's directory, with this one on ``PYTHONPATH`` (an A/B of
    two trees), the workers would run the other checkout's code, and the comparison would be of
    one tree with itself. Exits with a message in that case."""
    spec = importlib.util.find_spec("coordinator")
    imported = Path(spec.origin if spec and spec.origin else ".").resolve().parent.parent
    here = Path.cwd().resolve()
    if (here / "coordinator" / "__init__.py").is_file() and here != imported:
        raise SystemExit(
            f"this benchmark imports the coordinator from {imported}, but the workers it starts "
            f"(python -m, from the working directory) would import it from {here}: run it from {imported}"
        )
    return str(imported)


def machine_line() -> str:
    """Cores, processor, architecture, Python and the yardstick, for a benchmark's header."""
    return (
        f"{os.cpu_count()} cores ({cpu_model()}), {platform.machine()}, Python {platform.python_version()}, "
        f"reference loop {reference_ns_per_loop():.0f} ns"
    )
