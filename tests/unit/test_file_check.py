"""replay --verify's check of a journal file in a helper process (coordinator/replay/file_check.py), on
real journal files: the verdict is always the one-process verdict."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from coordinator.cli import Cut, _Selection
from coordinator.core.invariants import first_violation
from coordinator.replay.file_check import FileCheck, FirstViolation, check_file
from coordinator.replay.journal import write_journal
from coordinator.simulation.traffic import simulate
from events.wire.records import CheckpointCompleted, JournalEvent, TaskAcknowledged

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(name="events", scope="module")
def _events() -> list[JournalEvent]:
    return list(itertools.islice(simulate(random.Random(3), jobs=3), 3000))


def planted(events: list[JournalEvent]) -> tuple[list[JournalEvent], int, TaskAcknowledged]:
    """The journal without the last ack before a completion; the completion's new index; the ack."""
    completed = next(i for i, e in enumerate(events) if isinstance(e, CheckpointCompleted) and i > 100)
    dropped = events[completed - 1]
    assert isinstance(dropped, TaskAcknowledged)
    return events[: completed - 1] + events[completed:], completed - 1, dropped


@pytest.fixture(name="bad_journal")
def _bad_journal(tmp_path: Path, events: list[JournalEvent]) -> tuple[Path, int, TaskAcknowledged]:
    journal, at, dropped = planted(events)
    path = tmp_path / "bad.avro"
    write_journal(path, journal)
    return path, at, dropped


class TestCheckFile:
    def test_a_good_journal_has_no_violation(self, tmp_path: Path, events: list[JournalEvent]) -> None:
        path = tmp_path / "good.avro"
        write_journal(path, events)

        assert FirstViolation(None) == check_file(path, _Selection(Cut()))

    def test_a_violation_is_the_in_memory_one_and_says_where_it_stands(
        self, bad_journal: tuple[Path, int, TaskAcknowledged], events: list[JournalEvent]
    ) -> None:
        path, at, dropped = bad_journal

        verdict = check_file(path, _Selection(Cut()))

        assert first_violation(planted(events)[0]) == verdict.violation
        assert verdict.violation is not None and "complete-after-every-ack" == verdict.violation.rule
        assert (-1, at) == verdict.position  # write_journal gives bare events their index as offset

    def test_the_selection_decides_what_is_checked(
        self, bad_journal: tuple[Path, int, TaskAcknowledged]
    ) -> None:
        """Another job's events, or a cut before the violation, verify; the job's own do not."""
        path, at, dropped = bad_journal
        other = next(j for j in ("job-1", "job-2", "job-3") if j != dropped.job_id)

        assert FirstViolation(None) == check_file(path, _Selection(Cut(), other))
        assert FirstViolation(None) == check_file(path, _Selection(Cut(offset=at - 1)))
        own = check_file(path, _Selection(Cut(), dropped.job_id))
        assert own.violation is not None and (-1, at) == own.position


class TestFileCheck:
    def test_in_a_threaded_process_it_checks_here(
        self, bad_journal: tuple[Path, int, TaskAcknowledged]
    ) -> None:
        """Forking a process with other threads could copy a held lock, so the check runs here."""
        path, _, _ = bad_journal
        stop = threading.Event()
        other = threading.Thread(target=stop.wait)
        other.start()
        try:
            with FileCheck(path, _Selection(Cut())) as check:
                assert not check.in_helper
                verdict = check.verdict()
        finally:
            stop.set()
            other.join()

        assert check_file(path, _Selection(Cut())) == verdict

    def test_in_a_helper_the_verdict_is_the_same_even_if_the_helper_dies(
        self, bad_journal: tuple[Path, int, TaskAcknowledged]
    ) -> None:
        """In a fresh single-threaded process the check runs in a forked helper; a helper killed
        before it answers is replaced by a check in the process itself."""
        path, _, _ = bad_journal
        script = f"""
import json, os
from pathlib import Path
from coordinator.cli import Cut, _Selection
from coordinator.replay.file_check import FileCheck
path = Path({str(path)!r})
answers = {{}}
with FileCheck(path, _Selection(Cut())) as check:
    answers["in_helper"] = check.in_helper
    answers["helper_is_another_process"] = check._helper.pid != os.getpid()
    verdict = check.verdict()
answers["verdict"] = [verdict.violation.rule, verdict.violation.index, list(verdict.position)]
with FileCheck(path, _Selection(Cut())) as check:
    check._helper.kill()
    verdict = check.verdict()
answers["after_kill"] = [verdict.violation.rule, verdict.violation.index, list(verdict.position)]
print(json.dumps(answers))
"""
        completed = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
        )
        assert 0 == completed.returncode, completed.stderr
        answers = json.loads(completed.stdout)
        expected = check_file(path, _Selection(Cut()))
        assert expected.violation is not None and expected.position is not None
        wanted = [expected.violation.rule, expected.violation.index, list(expected.position)]

        assert answers["in_helper"] and answers["helper_is_another_process"]
        assert wanted == answers["verdict"]
        assert wanted == answers["after_kill"]
