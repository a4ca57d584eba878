"""The suite's CPU account (tests/cpu_account.py): what it charges a test, and its sum by file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cpu_account import CpuAccount, by_file, by_worker, read_lines, tree_cpu

BURN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"


def test_a_child_that_burns_the_cpu_and_is_reaped_is_charged_to_the_tree() -> None:
    before = tree_cpu(os.getpid())
    subprocess.run([sys.executable, "-c", BURN], check=True)
    assert tree_cpu(os.getpid()) - before >= 0.4


def test_a_live_child_s_cpu_is_charged_before_it_ends() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURN + "import time; time.sleep(30)"])
    try:
        before = tree_cpu(os.getpid())
        assert before >= 0
        deadline = 100
        while tree_cpu(os.getpid()) - before < 0.3 and deadline:
            deadline -= 1
            subprocess.run(["sleep", "0.05"], check=True)
        assert deadline, "the live child's CPU never showed in the tree"
    finally:
        child.kill()
        child.wait()


def test_the_sum_by_file_adds_each_file_s_tests_and_puts_the_dearest_first(tmp_path: Path) -> None:
    account = CpuAccount(tmp_path, "gw0")
    account.path.write_text("a.py::x\t1.50\t2.00\na.py::y\t0.50\t1.00\nb.py::z\t3.00\t3.00\n")
    (tmp_path / "gw1.tsv").write_text("a.py::w[1]\t0.25\t0.50\n")
    assert by_file(read_lines(tmp_path)) == [("b.py", 3.0, 3.0, 1), ("a.py", 2.25, 3.5, 3)]


def test_a_measured_test_notes_when_it_asked_for_its_turn_and_how_long_it_waited(tmp_path: Path) -> None:
    account = CpuAccount(tmp_path, "gw0")
    with account.measuring("a.py::x", asked=1000.0, waited=2.5):
        pass

    nodeid, cpu, wall, asked, waited = account.path.read_text().splitlines()[0].split("\t")
    assert ("a.py::x", "1000.000", "2.50") == (nodeid, asked, waited)
    assert 0 <= float(cpu) and 0 <= float(wall) < 1


def test_each_worker_s_span_is_split_into_running_tests_and_waiting_for_turns(tmp_path: Path) -> None:
    """gw0 asks at 100, waits 2 s, runs 3 s, asks again at 110 and runs 5 s: the run spans 100..115;
    gw1 ran 4 s from 101. Lines of the format without times count in the sums by file only."""
    (tmp_path / "gw0.tsv").write_text("a.py::x\t1\t3\t100\t2\na.py::y\t1\t5\t110\t0\n")
    (tmp_path / "gw1.tsv").write_text("b.py::z\t1\t4\t101\t0\n")

    assert by_worker(read_lines(tmp_path)) == [("gw0", 15.0, 8.0, 2.0), ("gw1", 15.0, 4.0, 0.0)]
    assert by_file(read_lines(tmp_path))[0] == ("a.py", 2.0, 8.0, 2)
