"""A whole journal file replayed by two processes, each with a share of the jobs
(coordinator/replay/split.py), on real journal files: the states and the verdict are always the
one-process ones."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.cli import Cut, _Selection
from coordinator.core.decider import fold_jobs
from coordinator.core.state import JobState
from coordinator.replay.file_check import FirstViolation, check_file
from coordinator.replay.journal import FileTally, read_journal_share, write_journal
from coordinator.replay.split import _first, replay_file, replay_share, share_taker
from coordinator.simulation.traffic import simulate
from events.wire.records import (
    CheckpointCompleted,
    CheckpointTriggered,
    JobFailedPermanently,
    JournalEvent,
    TaskAcknowledged,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(name="events", scope="module")
def _events() -> list[JournalEvent]:
    return list(itertools.islice(simulate(random.Random(5), jobs=4), 4000))


def folded(events: list[JournalEvent]) -> dict[str, JobState]:
    return fold_jobs(events)


def without_an_ack_of(events: list[JournalEvent], job_id: str, after: int = 0) -> list[JournalEvent]:
    """The journal without ``job_id``'s last ack before one of its completions past ``after``: that
    completion then breaks complete-after-every-ack."""
    completed = next(
        i
        for i, e in enumerate(events)
        if i > after and isinstance(e, CheckpointCompleted) and e.job_id == job_id
    )
    dropped = max(
        i
        for i, e in enumerate(events[:completed])
        if isinstance(e, TaskAcknowledged)
        and e.job_id == job_id
        and e.checkpoint_id == events[completed].checkpoint_id
    )
    return events[:dropped] + events[dropped + 1 :]


def one_process_verdict(path: Path) -> FirstViolation:
    return check_file(path, _Selection(Cut()))


class TestShares:
    def test_the_jobs_are_dealt_out_in_turn_in_the_order_they_first_appear(self) -> None:
        first, second = share_taker(0), share_taker(1)

        assert [first(j) for j in ("a", "b", "c", "d", "e")] == [True, False, True, False, True]
        assert [second(j) for j in ("a", "b", "c", "d", "e")] == [False, True, False, True, False]
        assert all(share_taker(None)(j) for j in ("a", "b"))

    def test_a_share_reads_only_its_jobs_and_tallies_the_whole_file(
        self, tmp_path: Path, events: list[JournalEvent]
    ) -> None:
        path = tmp_path / "journal.avro"
        write_journal(path, events)
        order = list(dict.fromkeys(e.job_id for e in events))
        tally = FileTally()

        taken = list(read_journal_share(path, share_taker(1), tally))

        assert [e for e in events if e.job_id in order[1::2]] == [event for event, _, _, _ in taken]
        assert [i for i, e in enumerate(events) if e.job_id in order[1::2]] == [i for _, _, _, i in taken]
        assert len(events) == tally.records and set(order) == tally.jobs


class TestReplayFile:
    def test_the_states_are_those_of_folding_every_event(
        self, tmp_path: Path, events: list[JournalEvent]
    ) -> None:
        path = tmp_path / "journal.avro"
        write_journal(path, events)

        for verify in (False, True):
            replayed = replay_file(path, verify=verify)

            assert folded(events) == replayed.states
            assert len(events) == replayed.records
            assert {e.job_id for e in events} == replayed.jobs
            assert FirstViolation(None) == replayed.verdict

    def test_a_violation_in_either_share_is_the_one_process_verdict(
        self, tmp_path: Path, events: list[JournalEvent]
    ) -> None:
        order = list(dict.fromkeys(e.job_id for e in events))
        for job_id in order:  # jobs of both shares
            path = tmp_path / f"bad-{job_id}.avro"
            write_journal(path, without_an_ack_of(events, job_id, after=500))

            verdict = replay_file(path, verify=True).verdict

            assert verdict.violation is not None and job_id == verdict.violation.job_id
            assert one_process_verdict(path) == verdict

    def test_of_violations_in_both_shares_the_earlier_in_the_file_is_the_verdict(
        self, tmp_path: Path, events: list[JournalEvent]
    ) -> None:
        first_job, second_job = list(dict.fromkeys(e.job_id for e in events))[:2]  # one of each share
        for early, late in ((first_job, second_job), (second_job, first_job)):
            journal = without_an_ack_of(without_an_ack_of(events, late, after=2000), early, after=300)
            path = tmp_path / f"bad-{early}-{late}.avro"
            write_journal(path, journal)

            verdict = replay_file(path, verify=True).verdict

            assert verdict.violation is not None and early == verdict.violation.job_id
            assert one_process_verdict(path) == verdict

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        seed=st.integers(0, 2**16),
        length=st.integers(1, 600),
        holes=st.lists(st.integers(0, 599), max_size=3),
    )
    def test_any_journal_with_events_missing_gets_the_one_process_verdict_from_its_shares(
        self, seed: int, length: int, holes: list[int]
    ) -> None:
        """Cut short and with events left out, a journal breaks rules of events and of its end
        (triggers never resolved) in any share; the shares' merged verdict is still the first."""
        journal = list(itertools.islice(simulate(random.Random(seed), jobs=3), length))
        journal = [e for i, e in enumerate(journal) if i not in holes]
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "journal.avro"
            write_journal(path, journal)

            shares = [replay_share(path, share, verify=True) for share in (0, 1)]

            assert one_process_verdict(path) == _first(shares)
            assert folded(journal) == {**shares[0].states, **shares[1].states}

    def test_an_event_s_violation_comes_before_an_earlier_trigger_s_end_of_journal_one(
        self, tmp_path: Path
    ) -> None:
        """As in one process: every event is checked before the end-of-journal rule, so a share whose
        only violation is a trigger left unresolved (job-0's first, index 12) loses to the other
        share's event (job-1's completion without one of its acks, index 113). The bad journal is
        made from a simulated one: job-0 fails for good right after its first trigger (a
        ``JobFailedPermanently`` that no decider writes before the scheduler stopped), and job-1 loses
        an acknowledgement."""
        simulated = list(itertools.islice(simulate(random.Random(55444), jobs=3), 194))
        first = next(
            i for i, e in enumerate(simulated) if isinstance(e, CheckpointTriggered) and e.job_id == "job-0"
        )
        assert (12, "job-1") == (first, simulated[119].job_id)
        gave_up = JobFailedPermanently("job-0", 1, 0, "the restart strategy gave up", "a crafted failure")
        later = (e for i, e in enumerate(simulated) if i > first and e.job_id != "job-0" and i != 119)
        journal = [*simulated[: first + 1], gave_up, *later]
        path = tmp_path / "journal.avro"
        write_journal(path, journal)
        shares = [replay_share(path, share, verify=True) for share in (0, 1)]
        ends_only = next(one for one in shares if one.first_at_event is None)
        other = next(one for one in shares if one is not ends_only)
        assert ends_only.first_at_end is not None and other.first_at_event is not None
        assert ends_only.first_at_end.position < other.first_at_event.position  # type: ignore[operator]

        verdict = replay_file(path, verify=True).verdict

        assert other.first_at_event == verdict
        assert one_process_verdict(path) == verdict

    def test_in_a_threaded_process_one_pass_does_it_all(
        self, tmp_path: Path, events: list[JournalEvent]
    ) -> None:
        """Forking a process with other threads could copy a held lock: no helper, the same result."""
        path = tmp_path / "bad.avro"
        write_journal(path, without_an_ack_of(events, events[0].job_id, after=500))
        stop = threading.Event()
        other = threading.Thread(target=stop.wait)
        other.start()
        try:
            replayed = replay_file(path, verify=True)
        finally:
            stop.set()
            other.join()

        assert one_process_verdict(path) == replayed.verdict

    def test_in_a_helper_the_result_is_the_same_even_if_the_helper_dies(
        self, tmp_path: Path, events: list[JournalEvent]
    ) -> None:
        """In a fresh single-threaded process one share is replayed by a forked helper; a helper
        that dies before it answers is replaced by a pass in the process itself."""
        journal = without_an_ack_of(events, list(dict.fromkeys(e.job_id for e in events))[1], after=500)
        path = tmp_path / "bad.avro"
        write_journal(path, journal)
        script = f"""
import json, os
from pathlib import Path
import coordinator.replay.split as split
helpers = []
dying = []
class Counted(split.ForkedCall):
    def __init__(self, function, name):
        super().__init__((lambda: os._exit(3)) if dying else function, name)
        helpers.append(self.pid)
split.ForkedCall = Counted
path = Path({str(path)!r})
def answer(replayed):
    v = replayed.verdict
    return [v.violation.rule, v.violation.index, list(v.position), sorted(replayed.states), replayed.records]
answers = {{"verdict": answer(split.replay_file(path, verify=True))}}
answers["helper_is_another_process"] = len(helpers) == 1 and helpers[0] != os.getpid()
dying.append(True)
answers["after_death"] = answer(split.replay_file(path, verify=True))
answers["helpers"] = len(helpers)
print(json.dumps(answers))
"""
        completed = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
        )
        assert 0 == completed.returncode, completed.stderr
        answers = json.loads(completed.stdout)
        expected = one_process_verdict(path)
        assert expected.violation is not None and expected.position is not None
        wanted = [
            expected.violation.rule,
            expected.violation.index,
            list(expected.position),
            sorted({e.job_id for e in journal}),
            len(journal),
        ]

        assert answers["helper_is_another_process"] and 2 == answers["helpers"]
        assert wanted == answers["verdict"]
        assert wanted == answers["after_death"]
