"""Says so when the coordinator does not run a job's attempt.

A driver (a Python app's :class:`events.task.participant.JobDriver`, a Spark job's
``CheckpointedJob``) publishes RUNNING, and the coordinator that decides the job's ``job-status`` partition
journals ``SchedulerStarted`` and triggers its checkpoints. Where no coordinator decides it (none
runs on the job's topic prefix, the prefix is mistyped, or the partition is stuck), the job would
run on with no checkpoint, silently: a restore then goes back to the last checkpoint before it.
:class:`SchedulerWatch` warns once when the attempt has not been run :data:`UNSCHEDULED_WARNING_S`
after its RUNNING, and says when it is run after all. A Spark job sets its ``scheduled`` event from
the journal it follows; a :class:`JobDriver` follows none, so its :class:`JournalScheduled` reads the
job's journal when a wait ends (a driver whose attempt is run in time reads it once, 30 s in).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = [
    "UNSCHEDULED_WARNING_S",
    "JournalScheduled",
    "Scheduled",
    "SchedulerWatch",
    "late_message",
    "unscheduled_message",
]

log = logging.getLogger(__name__)

UNSCHEDULED_WARNING_S = 30.0
"""How long after its RUNNING an attempt may wait for the coordinator before its driver warns: five
times the 6 s session timeout in which a lost coordinator's partitions move to another worker."""


def unscheduled_message(job_id: str, attempt: int, topic_prefix: str, bootstrap: str, waited_s: float) -> str:
    """The warning of an attempt the coordinator has not run ``waited_s`` after its RUNNING."""
    return (
        f"job {job_id} attempt {attempt}: no coordinator has run it {waited_s:.0f} s after its RUNNING "
        f"(no SchedulerStarted in its journal), so none of its checkpoints is triggered. Is `cutline "
        f"coordinator` running with topic prefix {topic_prefix!r}? `cutline doctor --bootstrap {bootstrap} "
        f"--topic-prefix {topic_prefix}` checks"
    )


def late_message(job_id: str, attempt: int, waited_s: float) -> str:
    """The note that the coordinator runs the attempt after all, ``waited_s`` after its RUNNING."""
    return f"job {job_id} attempt {attempt}: the coordinator runs it now, {waited_s:.0f} s after its RUNNING"


class Scheduled(Protocol):
    """Whether the coordinator runs the attempt: a :class:`threading.Event` set by a journal follower,
    or :class:`JournalScheduled`."""

    def wait(self, timeout: float | None = None) -> bool: ...

    def is_set(self) -> bool: ...


class JournalScheduled:
    """:class:`Scheduled` for a driver that follows no journal: each wait sleeps its whole time (or
    until ``stopped``), then asks ``run_in_journal`` (does the journal hold the attempt's
    ``SchedulerStarted``?) once; an error reading it counts as not yet."""

    def __init__(self, run_in_journal: Callable[[], bool], stopped: threading.Event) -> None:
        self.run_in_journal, self.stopped = run_in_journal, stopped
        self._found = False

    def wait(self, timeout: float | None = None) -> bool:
        if not self.stopped.wait(timeout) and not self._found:
            try:
                self._found = self.run_in_journal()
            except Exception:  # the broker unreachable, say: the next wait asks again
                log.debug("the journal could not be read", exc_info=True)
        return self._found

    def is_set(self) -> bool:
        return self._found


class SchedulerWatch:
    """Waits for ``scheduled`` (set when the job reads its attempt's ``SchedulerStarted``) from the
    RUNNING it was made at: warns once if it is not set within ``after_s``, and notes it when it is
    set later. :meth:`close` ends the wait (the attempt ended). :meth:`run` is the whole wait, which
    :meth:`start` runs in a daemon thread; ``clock`` is a seam for the tests."""

    def __init__(
        self,
        scheduled: Scheduled,
        job_id: str,
        attempt: int,
        topic_prefix: str,
        bootstrap: str,
        *,
        after_s: float = UNSCHEDULED_WARNING_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scheduled, self.job_id, self.attempt = scheduled, job_id, attempt
        self.topic_prefix, self.bootstrap, self.after_s = topic_prefix, bootstrap, after_s
        self.clock = clock
        self.published = clock()
        self.closed = threading.Event()

    def start(self) -> SchedulerWatch:
        threading.Thread(target=self.run, name=f"cutline-scheduler-watch-{self.job_id}", daemon=True).start()
        return self

    def run(self) -> None:
        if self._wait(self.after_s):
            return
        log.warning(
            unscheduled_message(
                self.job_id, self.attempt, self.topic_prefix, self.bootstrap, self.clock() - self.published
            )
        )
        while not self._wait(self.after_s):
            pass
        if self.scheduled.is_set():
            log.info(late_message(self.job_id, self.attempt, self.clock() - self.published))

    def _wait(self, seconds: float) -> bool:
        """Whether the wait is over: the attempt was run, or the watch closed."""
        self.scheduled.wait(seconds)
        return self.scheduled.is_set() or self.closed.is_set()

    def close(self) -> None:
        self.closed.set()
