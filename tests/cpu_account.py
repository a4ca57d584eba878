"""The CPU each test costs, for finding where the whole suite's time goes (issue 52's lanes; docs/
benchmarks.md, "The tests' lanes"): with ``CUTLINE_TEST_CPU=DIR`` every pytest process (each xdist
worker) appends one line per test to ``DIR/<worker>.tsv``: the test's id, the CPU seconds its
worker's process tree spent while it set up, ran and tore down, its wall seconds, when it asked for
its turn (seconds since the epoch) and how long it waited for it (:mod:`alone`).
``python tests/cpu_account.py DIR`` sums them by file, and says of each worker how long it ran
tests, waited for turns and did neither (starting, collecting, waiting for work at the end).

The tree is the worker and every process below it, read from ``/proc`` (Linux): their user and
system time, and that of the children they have reaped (a broker or a Spark driver that the test
stopped and waited for). A process shared by the worker's tests (its broker, a module's coordinator)
is charged to the tests that run while it spends. Written by hand: psutil would walk the same
``/proc`` files, and it is not a dependency of the project.
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

VARIABLE = "CUTLINE_TEST_CPU"
TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> tuple[int, float] | None:
    """The parent of ``pid`` and the CPU seconds it and its reaped children spent, or None (gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after the command's name, which may hold spaces
    # fields[1] is the parent; fields[11:15] are utime, stime, cutime, cstime
    return int(fields[1]), sum(int(f) for f in fields[11:15]) / TICKS


def tree_cpu(root: int) -> float:
    """The CPU seconds of ``root`` and all its descendants, alive or not yet reaped."""
    parents: dict[int, int] = {}
    spent: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(entry)) is not None:
            parents[int(entry)], spent[int(entry)] = stat
    children: dict[int, list[int]] = defaultdict(list)
    for pid, parent in parents.items():
        children[parent].append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += spent.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return total


class CpuAccount:
    """Measures each test of this process (tests/conftest.py: :meth:`measuring` around each test's
    protocol)."""

    def __init__(self, directory: Path, worker: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{worker}.tsv"

    @contextmanager
    def measuring(self, nodeid: str, asked: float, waited: float) -> Iterator[None]:
        """Note the CPU and wall seconds spent inside as one line of test ``nodeid``, which asked for
        its turn at ``asked`` (``time.time()``) and got it ``waited`` seconds later."""
        cpu, wall = tree_cpu(os.getpid()), time.monotonic()
        try:
            yield
        finally:
            cpu, wall = tree_cpu(os.getpid()) - cpu, time.monotonic() - wall
            with self.path.open("a") as lines:
                lines.write(f"{nodeid}\t{cpu:.2f}\t{wall:.2f}\t{asked:.3f}\t{waited:.2f}\n")


Lines = dict[str, list[list[str]]]
"""Each worker's lines, split into their fields (:func:`read_lines`)."""


def read_lines(directory: Path) -> Lines:
    """Each worker's lines measured in ``directory``, split into their fields."""
    return {
        path.stem: [line.split("\t") for line in path.read_text().splitlines()]
        for path in sorted(directory.glob("*.tsv"))
    }


def by_file(lines: Lines) -> list[tuple[str, float, float, int]]:
    """(file, CPU s, wall s, tests) of every file measured in ``lines``, dearest first."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for fields in lines.values():
        for nodeid, cpu, wall, *_ in fields:
            row = sums[nodeid.split("::", 1)[0]]
            row[0], row[1], row[2] = row[0] + float(cpu), row[1] + float(wall), row[2] + 1
    rows = [(name, cpu, wall, int(n)) for name, (cpu, wall, n) in sums.items()]
    return sorted(rows, key=lambda row: -row[1])


def by_worker(lines: Lines) -> list[tuple[str, float, float, float]]:
    """(worker, seconds from the run's first turn asked to its last test's end, seconds running
    tests, seconds waiting for turns) of every worker measured in ``lines``: what is left is time
    the worker did neither."""
    timed = {worker: rows for worker, rows in lines.items() if rows and len(rows[0]) >= 5}
    if not timed:
        return []
    first = min(float(row[3]) for rows in timed.values() for row in rows)
    last = max(float(row[3]) + float(row[4]) + float(row[2]) for rows in timed.values() for row in rows)
    return [
        (worker, last - first, sum(float(r[2]) for r in rows), sum(float(r[4]) for r in rows))
        for worker, rows in timed.items()
    ]


def main(directory: str, top: int = 40) -> None:
    lines = read_lines(Path(directory))
    for worker, span, running, waiting in by_worker(lines):
        print(
            f"{worker}: {span:.0f} s from the first turn to the last test's end: running tests "
            f"{running:.0f}, waiting for turns {waiting:.0f}, neither {span - running - waiting:.0f}"
        )
    rows = by_file(lines)
    total_cpu, total_wall = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"{len(rows)} files: {total_cpu:.0f} CPU s, {total_wall:.0f} wall s (summed over workers)")
    print(f"{'CPU s':>8} {'wall s':>8} {'tests':>6}  file")
    for name, cpu, wall, n in rows[:top]:
        print(f"{cpu:8.1f} {wall:8.1f} {n:6d}  {name}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
