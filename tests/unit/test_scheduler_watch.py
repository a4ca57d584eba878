"""A job's driver says so when no coordinator runs its attempt (events/task/scheduler_watch.py).

The watch waits on the attempt's ``scheduled`` event; these tests set it (or close the watch) from the
event's own waits, so that each wait's outcome is given, not raced."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from events.task.scheduler_watch import JournalScheduled, SchedulerWatch, late_message, unscheduled_message

JOB, ATTEMPT, PREFIX, BOOTSTRAP = "payments", 2, "prod.", "kafka:9092"


class Waits(threading.Event):
    """An event whose ``n``-th wait (from 1) runs ``then[n]`` first: what happened meanwhile."""

    def __init__(self, then: dict[int, Callable[[], object]]) -> None:
        super().__init__()
        self.then, self.waits = then, 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        self.then.get(self.waits, lambda: None)()
        return self.is_set()


def _clock(*readings: float) -> Callable[[], float]:
    times: Iterator[float] = iter(readings)
    return lambda: next(times)


def _watch(scheduled: threading.Event, *readings: float) -> SchedulerWatch:
    return SchedulerWatch(scheduled, JOB, ATTEMPT, PREFIX, BOOTSTRAP, after_s=30, clock=_clock(*readings))


def test_an_attempt_run_in_time_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    scheduled = threading.Event()
    scheduled.set()

    _watch(scheduled, 0.0).run()

    assert [] == caplog.records


def test_an_attempt_not_run_in_time_warns_once_then_notes_when_it_is_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "events.task.scheduler_watch")
    scheduled = Waits({4: lambda: scheduled.set()})  # three waits of 30 s pass before it is run

    _watch(scheduled, 0.0, 30.2, 120.5).run()

    assert [
        ("WARNING", unscheduled_message(JOB, ATTEMPT, PREFIX, BOOTSTRAP, 30.2)),
        ("INFO", late_message(JOB, ATTEMPT, 120.5)),
    ] == [(r.levelname, r.getMessage()) for r in caplog.records]


def test_the_warning_names_the_prefix_and_the_check_to_run() -> None:
    message = unscheduled_message(JOB, ATTEMPT, PREFIX, BOOTSTRAP, 30.2)

    assert message.startswith("job payments attempt 2: no coordinator has run it 30 s after its RUNNING")
    assert "with topic prefix 'prod.'?" in message
    assert "`cutline doctor --bootstrap kafka:9092 --topic-prefix prod.` checks" in message


def test_a_watch_closed_before_the_attempt_is_run_says_nothing_more(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "events.task.scheduler_watch")
    watch: SchedulerWatch
    scheduled = Waits({2: lambda: watch.close()})
    watch = _watch(scheduled, 0.0, 30.0)

    watch.run()

    assert ["WARNING"] == [r.levelname for r in caplog.records]
    assert 2 == scheduled.waits


def test_a_watch_closed_in_time_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    watch: SchedulerWatch
    scheduled = Waits({1: lambda: watch.close()})
    watch = _watch(scheduled, 0.0)

    watch.run()

    assert [] == caplog.records


# ---------------------------------------------------------------- a driver that follows no journal


class Journal:
    """The answers of ``run_in_journal``, one a read (an exception is raised), and the reads made."""

    def __init__(self, *answers: bool | Exception) -> None:
        self.answers, self.reads = list(answers), 0

    def __call__(self) -> bool:
        self.reads += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Stopped(threading.Event):
    """A stop event whose waits return at once (as if their time passed), or stopped."""

    def wait(self, timeout: float | None = None) -> bool:
        return self.is_set()


def test_a_journal_wait_reads_the_journal_when_its_time_is_up_and_keeps_a_run_attempt() -> None:
    journal = Journal(False, True)
    scheduled = JournalScheduled(journal, Stopped())

    assert (False, False) == (scheduled.wait(30), scheduled.is_set())
    assert (True, True) == (scheduled.wait(30), scheduled.is_set())
    assert scheduled.wait(30)
    assert 2 == journal.reads  # found: not read again


def test_a_journal_that_cannot_be_read_counts_as_not_run_yet() -> None:
    journal = Journal(RuntimeError("broker down"), True)
    scheduled = JournalScheduled(journal, Stopped())

    assert not scheduled.wait(30)
    assert scheduled.wait(30)


def test_a_stopped_journal_wait_reads_nothing() -> None:
    journal = Journal()
    stopped = Stopped()
    stopped.set()

    assert not JournalScheduled(journal, stopped).wait(30)
    assert 0 == journal.reads


def test_a_driver_s_attempt_found_in_the_journal_at_the_second_read_warns_then_notes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "events.task.scheduler_watch")
    journal = Journal(False, True)

    _watch(JournalScheduled(journal, Stopped()), 0.0, 30.1, 60.3).run()

    assert [
        ("WARNING", unscheduled_message(JOB, ATTEMPT, PREFIX, BOOTSTRAP, 30.1)),
        ("INFO", late_message(JOB, ATTEMPT, 60.3)),
    ] == [(r.levelname, r.getMessage()) for r in caplog.records]
