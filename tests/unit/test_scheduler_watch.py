"""A Spark job's driver says so when no coordinator runs its attempt (spark_tasks/scheduler_watch.py).

The watch waits on the attempt's ``scheduled`` event; these tests set it (or close the watch) from the
event's own waits, so that each wait's outcome is given, not raced."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from spark_tasks.scheduler_watch import SchedulerWatch, late_message, unscheduled_message

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
    caplog.set_level(logging.INFO, "spark_tasks.scheduler_watch")
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
    caplog.set_level(logging.INFO, "spark_tasks.scheduler_watch")
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
