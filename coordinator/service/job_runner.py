"""``cutline run``: supervise a job's driver process and carry out what the journal decides
(docs/design.md, "Job lifecycle").

The supervisor starts attempt N of the job's driver (``CMD ...``) with the attempt
and the checkpoint to restore in its environment, and follows the job's journal
(from its end, fenced, :class:`events.kafka.feed.JobFeed`) through the attempt's
:class:`events.task.ledger.JobLedger`, as every task-side reader does. The coordinator decides
restarts, never the supervisor: when the driver exits with an error the
supervisor reports the attempt FAILING; when the driver stops sending heartbeats
the coordinator notices by itself. Either way the restart strategy journals
``JobRestartScheduled`` (the supervisor waits the delay, stops what is left of
the old attempt and starts the next one) or ``JobFailedPermanently`` (the
supervisor exits non-zero with the reason). Ctrl-C or SIGTERM stops the driver
(SIGTERM, and SIGKILL to its process group after ``--stop-timeout-s``, or at once on a second
signal) and reports the job CANCELED.

The driver finds what it needs in its environment:

=============================  =================================================
``CUTLINE_JOB``                the job id
``CUTLINE_ATTEMPT``            the attempt to report RUNNING with
``CUTLINE_RESTORE``            the checkpoint id to restore ("" for none)
``CUTLINE_RESTORE_LOCATION``   where that checkpoint is ("" for none)
``CUTLINE_BOOTSTRAP``          the Kafka cluster
``CUTLINE_TOPIC_PREFIX``       cutline's topic prefix
``CUTLINE_RESTART_STRATEGY``   the ``--restart-strategy`` options as JSON (unset
                               without them); ``JobDriver.running`` applies it
=============================  =================================================
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import Console

from events.kafka.feed import JobFeed, read_job_partition
from events.stopping import StopSignals
from events.task.ledger import ConfirmRunning, Finish, GiveUp, JobLedger, Restart, Stop, attempt_after
from events.task.participant import RESTART_STRATEGY_ENV, JobDriver
from events.wire.codec import to_avro
from events.wire.records import (
    CheckpointCompleted,
    JobRestartScheduled,
    JobStatus,
    RestartStrategy,
    SchedulerStarted,
    SchedulerStopped,
)
from events.wire.topics import Topics

__all__ = ["EXIT_CANCELED", "EXIT_FAILED", "RunSettings", "next_attempt", "supervise"]

EXIT_FAILED = 1
"""``cutline run``'s exit code when the restart strategy gave up."""
EXIT_CANCELED = 130
"""``cutline run``'s exit code after Ctrl-C or SIGTERM (the job is CANCELED)."""
EXIT_CODES = {JobStatus.FINISHED: 0, JobStatus.FAILED: EXIT_FAILED, JobStatus.CANCELED: EXIT_CANCELED}
"""The exit code each final status of a job (:data:`events.task.ledger.FINAL_STATUSES`) gives
``cutline run``."""
FINAL_STATUS_WAIT_S = 5.0
"""After a clean exit, how long to wait for the driver's own final status in the journal."""
DECISION_HINT_S = 30.0
"""After reporting a failure, say after this long that no decision came (is a coordinator running?)."""


@dataclass(frozen=True)
class RunSettings:
    bootstrap: str
    topic_prefix: str
    job_id: str
    command: Sequence[str]
    strategy: RestartStrategy | None = None
    """None: the driver's own CheckpointConfig.restart_strategy."""
    stop_timeout_s: float = 8.0
    """How long a driver gets to stop after SIGTERM before SIGKILL (8 s: ``cutline run`` itself
    stops within 10 s of a SIGTERM)."""


def next_attempt(bootstrap: str, prefix: str, job_id: str, timeout: float = 30.0) -> int:
    """The attempt after every one the job's journal knows of (1 for a new job)."""
    topic = Topics(prefix).checkpoints
    kinds = {
        SchedulerStarted.__name__,
        SchedulerStopped.__name__,
        JobRestartScheduled.__name__,
        CheckpointCompleted.__name__,
    }
    records = read_job_partition(bootstrap, job_id, topic, claims_topic=topic, kinds=kinds, timeout=timeout)
    return attempt_after(entry.record for entry in records)


class _Attempt:
    """One started driver process of the job."""

    def __init__(self, settings: RunSettings, attempt: int, restore: JobRestartScheduled | None) -> None:
        self.attempt = attempt
        self.ledger = JobLedger(settings.job_id, attempt)
        """What the journal decided about this attempt (its lifecycle: running, restart, give up)."""
        env = {
            **os.environ,
            "CUTLINE_JOB": settings.job_id,
            "CUTLINE_ATTEMPT": str(attempt),
            "CUTLINE_RESTORE": "" if restore is None or restore.restore_checkpoint_id is None
            else str(restore.restore_checkpoint_id),
            "CUTLINE_RESTORE_LOCATION": (restore.restore_location or "") if restore is not None else "",
            "CUTLINE_BOOTSTRAP": settings.bootstrap,
            "CUTLINE_TOPIC_PREFIX": settings.topic_prefix,
        }  # fmt: skip
        if settings.strategy is not None:
            env[RESTART_STRATEGY_ENV] = json.dumps(to_avro(settings.strategy))
        # Its own process group: stopping an attempt stops what it started too (a Spark driver's JVM
        # and Python workers), and the terminal's Ctrl-C reaches only the supervisor, which stops it.
        self.process = subprocess.Popen(list(settings.command), env=env, start_new_session=True)
        self.reported = False
        """Its failure was reported to the coordinator (or the coordinator found it first)."""
        self.stopped = False
        """:meth:`stop` ran: nothing of this attempt's process group is left."""
        self.exited_at: float | None = None
        """When it was first seen exited with code 0 (its final status may still be on the way)."""

    def stop(self, timeout: float, stops: StopSignals | None = None) -> int:
        """SIGTERM to the driver, then SIGKILL to its process group after ``timeout`` s, or as soon
        as ``stops`` receives another signal; its exit code.

        Only the driver gets the SIGTERM: it stops what it started in order (a Spark driver its
        query, then its JVM); a JVM that got the signal as well would die under the driver's feet.
        """
        self.stopped = True
        if self.process.poll() is None:
            self.process.terminate()
            deadline = time.monotonic() + timeout
            signals = len(stops.received) if stops is not None else 0
            while self.process.poll() is None and time.monotonic() < deadline:
                if stops is None:
                    time.sleep(0.05)
                    continue
                if len(stops.received) > signals:
                    break
                stops.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
            if self.process.poll() is None:
                self._signal(signal.SIGKILL)
            code = self.process.wait()
        else:
            code = self.process.returncode
        self._signal(signal.SIGKILL)  # whatever of the group outlived its leader (a JVM, a worker)
        return code

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)


def supervise(
    settings: RunSettings, console: Console, *, stop_requested: Callable[[], bool] | None = None
) -> int:
    """Run the job under its restart strategy until it finishes, fails for good or is canceled;
    the exit code for ``cutline run``."""
    with StopSignals() as stops:
        topics = Topics(settings.topic_prefix)
        feed = JobFeed(
            settings.bootstrap, settings.job_id, (topics.checkpoints,), claims_topic=topics.checkpoints
        )
        try:
            with JobDriver(settings.bootstrap, settings.job_id, topics) as driver:
                return _loop(settings, console, feed, driver, stops, stop_requested or (lambda: False))
        finally:
            feed.close()


def _loop(
    settings: RunSettings,
    console: Console,
    feed: JobFeed,
    driver: JobDriver,
    stops: StopSignals,
    stop_requested: Callable[[], bool],
) -> int:
    job = settings.job_id
    attempt = next_attempt(settings.bootstrap, settings.topic_prefix, job)
    if stops.requested or stop_requested():
        console.print(f"job {job} canceled before attempt {attempt} started")
        return EXIT_CANCELED
    current = _start(settings, console, attempt, None)
    decided = _Decided()
    reported_at = 0.0
    while True:
        failed = _read_decisions(feed, current, decided, settings, console, stops)
        if failed is not None:
            return failed
        scheduled, final = decided.scheduled, decided.final
        if final is not None and current.process.poll() is not None:
            code = current.process.returncode
            console.print(
                f"attempt {current.attempt} of job {job} ended {final.status}"
                + (f" ({final.error})" if final.error else "")
                + f", exit code {code}"
            )
            return EXIT_CODES[final.status]
        if stops.requested or stop_requested() or decided.canceled is not None:
            stopped = current.stop(settings.stop_timeout_s, stops)
            why = "canceled by cutline run" if decided.canceled is None else decided.canceled
            driver.status(JobStatus.CANCELED, why, attempt=current.attempt)
            console.print(f"job {job} canceled: attempt {current.attempt} stopped (exit code {stopped})")
            return EXIT_CANCELED
        if scheduled is not None:
            if not current.stopped:
                if current.process.poll() is None:
                    console.print(
                        f"stopping what is left of attempt {current.attempt} (pid {current.process.pid})"
                    )
                current.stop(settings.stop_timeout_s, stops)
            wait_s = scheduled.restart_at_ms / 1000 - time.time()
            if wait_s > 0:
                stops.wait(min(wait_s, 0.1))
                continue
            current, decided = _start(settings, console, scheduled.attempt, scheduled), _Decided()
            continue
        code = current.process.poll()
        if code is None or current.reported:
            if current.reported and code is not None and time.monotonic() - reported_at > DECISION_HINT_S:
                console.print(
                    f"[yellow]no restart decision for attempt {current.attempt} after "
                    f"{DECISION_HINT_S:.0f} s[/]: is a `cutline coordinator` running for prefix "
                    f"{settings.topic_prefix!r}?"
                )
                reported_at = time.monotonic()
            continue
        if code == 0:
            current.exited_at = current.exited_at or time.monotonic()
            if final is None and time.monotonic() - current.exited_at < FINAL_STATUS_WAIT_S:
                continue  # its FINISHED may still be on the way to the journal
            console.print(f"attempt {current.attempt} of job {job} [green]finished[/] (exit code 0)")
            return 0
        current.reported, reported_at = True, time.monotonic()
        error = f"the driver of attempt {current.attempt} exited with code {code}"
        console.print(f"[yellow]{error}[/]: reported FAILING; the restart strategy decides")
        driver.status(JobStatus.FAILING, error, attempt=current.attempt)


@dataclass(slots=True)
class _Decided:
    """What the journal decided about the running attempt so far."""

    scheduled: JobRestartScheduled | None = None
    """The restart the strategy scheduled."""
    final: SchedulerStopped | None = None
    """The job's final status (the driver ended it itself: no strategy runs)."""
    canceled: str | None = None
    """``cutline cancel``: why the job is CANCELLING; the driver is stopped as after Ctrl-C."""


def _read_decisions(
    feed: JobFeed,
    current: _Attempt,
    decided: _Decided,
    settings: RunSettings,
    console: Console,
    stops: StopSignals,
) -> int | None:
    """Note the journal's news for the running attempt in ``decided``; the exit code of a job that
    failed for good."""
    for entry in feed.poll(0.1):
        decision = current.ledger.lifecycle(entry.record)
        if isinstance(decision, Restart):
            record = decision.scheduled
            decided.scheduled, current.reported = record, True
            restore = (
                "nothing"
                if record.restore_checkpoint_id is None
                else f"checkpoint {record.restore_checkpoint_id}"
            )
            console.print(
                f"[yellow]attempt {current.attempt} failed[/] ({record.failure}): the restart strategy "
                f"starts attempt {record.attempt} in {record.delay_ms / 1000:.1f} s, restoring {restore}"
            )
        elif isinstance(decision, GiveUp):
            current.stop(settings.stop_timeout_s, stops)
            failed = decision.failed
            console.print(
                f"[red]job {settings.job_id} failed for good[/] after attempt {failed.attempt} "
                f"({failed.failure}): {failed.reason}. Fix the cause, then start it again with `cutline "
                "run`; it restores the latest completed checkpoint."
            )
            return EXIT_FAILED
        elif isinstance(decision, ConfirmRunning):
            started = decision.started
            console.print(f"attempt {started.attempt} is [green]RUNNING[/] with {len(started.tasks)} tasks")
        elif isinstance(decision, Finish):
            decided.final = decision.stopped
        elif isinstance(decision, Stop) and decision.status is JobStatus.CANCELED:
            decided.canceled = "canceled (cutline cancel)"
    return None


def _start(
    settings: RunSettings, console: Console, attempt: int, restore: JobRestartScheduled | None
) -> _Attempt:
    started = _Attempt(settings, attempt, restore)
    what = (
        ""
        if restore is None or restore.restore_checkpoint_id is None
        else f", restoring checkpoint {restore.restore_checkpoint_id}"
    )
    console.print(f"attempt {attempt} of job {settings.job_id} started (pid {started.process.pid}{what})")
    return started
