"""What one attempt of a task-side journal reader makes of its job's journal: pure decisions, no I/O.

Every reader on the task side (a :class:`~events.task.participant.Participant`, the driver of a
checkpointed Spark job, ``cutline run``) hands each decoded journal record of its job to a
:class:`JobLedger` (:meth:`JobLedger.fold`) and carries out the decision that comes back: commit,
write ``_metadata``, discard snapshots, stop, restart. The ledger reads the journal with suspicion,
because a journal can hold records the coordinator never meant (a replayed or forged record, an
id reused after a reset) (docs/design.md, "The task side"):

- a completion is acted on once, by id and attempt, only with offsets that
  :func:`events.wire.validation.parse_offsets` accepts, and its offsets are committed only when no newer
  checkpoint of the attempt completed before it;
- a reader that knows the job's checkpoint location (``location``) acts on a completion only for a
  checkpoint this attempt saw triggered, at the location of its trigger, with handles of the job's
  tasks directly in that directory and offsets of the job's partitions; it writes and deletes only
  inside that location (a savepoint's ``_metadata`` goes to the directory its trigger named);
- only this attempt's completed checkpoints beyond ``retained`` and its aborted checkpoints are
  discarded: never the latest completed one, never a completed savepoint, never a checkpoint of
  another attempt;
- ``CheckpointFailureThresholdExceeded`` fails the job only for a counted failure of a checkpoint
  of this attempt that nothing has superseded since;
- the restart strategy's decisions (``JobRestartScheduled``, ``JobFailedPermanently``) and the
  scheduler's start and stop count only for the attempt they are about;
- anything that contradicts what the ledger knows (a second completion of an id, an abort of a
  completed one, a trigger outside the location, ...) comes back as an :class:`Ignore` with the
  reason, which the reader logs once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointTriggered,
    JobFailedPermanently,
    JobRestartScheduled,
    JobStatus,
    SchedulerStarted,
    SchedulerStopped,
)
from events.wire.validation import InvalidUri, StorageUri, parse_offsets, parse_uri

__all__ = [
    "FINAL_STATUSES",
    "FOLDED_RECORDS",
    "Abort",
    "Complete",
    "ConfirmRunning",
    "LedgerAction",
    "Discard",
    "Fail",
    "Finish",
    "GiveUp",
    "Ignore",
    "JobLedger",
    "Restart",
    "Stop",
    "attempt_after",
    "completion_problem",
]

FINAL_STATUSES = frozenset({JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED})
"""Statuses with which a job's driver ends the job itself: no restart strategy runs after them."""


@dataclass(frozen=True)
class Ignore:
    """The record is ignored; ``reason`` says why (the reader logs it once)."""

    reason: str


@dataclass(frozen=True)
class Discard:
    """Delete this reader's snapshots of checkpoint ``checkpoint_id`` (and its ``_metadata``).

    ``directory`` is where they are, a canonical storage URI (``file:///…``, ``s3://bucket/…``), or
    None when the reader does not know it (a participant finds its own snapshot by id)."""

    checkpoint_id: int
    directory: str | None


@dataclass(frozen=True)
class Stop:
    """The job stops (docs/usage.md, "Stop with a savepoint"): FINISHED once its stop savepoint
    completed (``drain``: Flink's end of input, the input ends at the cut), CANCELED after a
    cancel (the scheduler stopped CANCELLING). The reader stops reading and ends the job."""

    status: JobStatus
    drain: bool = False


@dataclass(frozen=True)
class Complete:
    """An accepted completion of this attempt: commit ``commit`` (topic, partition, offset; empty
    when a newer checkpoint completed first), write ``_metadata`` into ``metadata`` (unless None),
    then carry out ``discard``, then ``stop`` if it was the stop savepoint."""

    completed: CheckpointCompleted
    commit: tuple[tuple[str, int, int], ...]
    metadata: str | None
    discard: tuple[Discard, ...]
    stop: Stop | None = None


@dataclass(frozen=True)
class Abort:
    """An accepted abort; ``discard`` its snapshots if it was this attempt's checkpoint."""

    aborted: CheckpointAborted
    discard: Discard | None


@dataclass(frozen=True)
class Fail:
    """Too many checkpoints of this attempt failed: stop the query."""

    exceeded: CheckpointFailureThresholdExceeded


@dataclass(frozen=True)
class ConfirmRunning:
    """The coordinator runs this attempt: its scheduler started."""

    started: SchedulerStarted


@dataclass(frozen=True)
class Restart:
    """The restart strategy answered this attempt's failure: start ``scheduled.attempt`` at
    ``scheduled.restart_at_ms``, restoring the checkpoint it names."""

    scheduled: JobRestartScheduled


@dataclass(frozen=True)
class GiveUp:
    """The restart strategy gave up on the job: stop for good."""

    failed: JobFailedPermanently


@dataclass(frozen=True)
class Finish:
    """This attempt ended its job itself (FINISHED, FAILED or CANCELED): no restart comes."""

    stopped: SchedulerStopped


LedgerAction = Complete | Abort | Fail | ConfirmRunning | Restart | GiveUp | Finish | Stop | Ignore
"""What a reader does about one journal record (None from :meth:`JobLedger.fold`: nothing)."""


@dataclass(frozen=True)
class _Trigger:
    kind: CheckpointKind
    location: str
    directory: str | None
    """Its directory (a canonical storage URI), if the reader may write and delete there."""


def completion_problem(completed: CheckpointCompleted, known: set[int] | frozenset[int]) -> str | None:
    """Why a journal reader must ignore ``completed``, or None: its id is ``known`` as completed
    already, or its offsets are malformed (:func:`events.wire.validation.parse_offsets`)."""
    if completed.checkpoint_id in known:
        return "it completed already (a duplicate record)"
    try:
        parse_offsets(completed.offsets)
    except ValueError as exc:
        return f"malformed offsets: {exc}"
    return None


def attempt_after(records: Iterable[object]) -> int:
    """The attempt after every one a job's journal ``records`` know of (1 for a new job): past every
    started or stopped scheduler and completion, and past the attempt before every scheduled restart
    (a stop names the attempt it stops: one canceled before it started, too)."""
    latest = 0
    for record in records:
        if isinstance(record, JobRestartScheduled):
            latest = max(latest, record.attempt - 1)
        elif isinstance(record, SchedulerStarted | SchedulerStopped | CheckpointCompleted):
            latest = max(latest, record.attempt)
    return latest + 1


FOLDED_RECORDS: tuple[type, ...] = (
    CheckpointTriggered,
    CheckpointCompleted,
    CheckpointAborted,
    CheckpointFailureThresholdExceeded,
    SchedulerStarted,
    SchedulerStopped,
    JobRestartScheduled,
    JobFailedPermanently,
)
"""The journal records :meth:`JobLedger.fold` acts on; it returns None for every other record. A reader
may leave the others undecoded: ``TaskAcknowledged``, one per task and checkpoint, is most of a job's
journal (docs/benchmarks.md, "Latency under load")."""


class JobLedger:
    """What one attempt knows from its job's journal (see the module docstring).

    What the reader knows of its job decides how much the ledger checks: ``location`` (the job's
    checkpoint location, where its checkpoints are confined; None: not known, as for a
    participant, which then needs no trigger and finds its own snapshots by id), ``tasks`` and
    ``partitions`` (None: not known). ``retained`` is how many completed checkpoints are kept;
    None takes it from this attempt's ``SchedulerStarted`` (1 until it is seen). ``history`` is the
    job's completions before this attempt (already free of duplicates and malformed ones:
    :func:`completion_problem`).
    """

    def __init__(
        self,
        job_id: str,
        attempt: int,
        *,
        retained: int | None = 1,
        location: str | None = None,
        tasks: Iterable[str] | None = None,
        partitions: Iterable[tuple[str, int]] | None = None,
        history: Iterable[CheckpointCompleted] = (),
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.location = location
        self.retained = 1 if retained is None else retained
        self._retained_from_journal = retained is None
        self.tasks = None if tasks is None else frozenset(tasks)
        self.partitions = None if partitions is None else frozenset(partitions)
        self.root: StorageUri | None = None if location is None else _parsed(location)
        self._triggered: dict[int, _Trigger] = {}
        self._completed: set[int] = {c.checkpoint_id for c in history}
        """Every id the journal completed, any attempt: a second completion or an abort contradicts."""
        self._mine: list[int] = []
        """This attempt's completed checkpoints (not savepoints) not discarded yet, ascending."""
        self._last_completed = 0
        """The highest id this attempt completed (checkpoint or savepoint)."""
        self._aborted: dict[int, CheckpointAborted] = {}
        self._failed = False
        self.stop_savepoint: CheckpointTriggered | None = None
        """This attempt's stop-with-savepoint trigger, until its savepoint completes or aborts."""
        self._canceled = False

    @property
    def aborted_ids(self) -> frozenset[int]:
        """The ids the journal aborted (and the ledger accepted)."""
        return frozenset(self._aborted)

    def fold(self, record: object) -> LedgerAction | None:
        """The decision on one journal record of the job, in journal order (None: nothing to do)."""
        if isinstance(record, CheckpointTriggered):
            return self.triggered(record)
        if isinstance(record, CheckpointCompleted):
            return self.completed(record)
        if isinstance(record, CheckpointAborted):
            return self.aborted(record)
        if isinstance(record, CheckpointFailureThresholdExceeded):
            return self.threshold(record)
        return self.lifecycle(record)

    # ---------------------------------------------------------- checkpoints

    def triggered(self, record: CheckpointTriggered) -> Ignore | None:
        """Remember where a checkpoint of this attempt writes; other attempts' triggers are not news."""
        if record.attempt != self.attempt:
            return None
        if record.stop and record.checkpoint_id not in self._completed:
            self.stop_savepoint = record
        known = self._triggered.get(record.checkpoint_id)
        if known is not None:
            if known.location == record.location and known.kind == record.kind:
                return None  # the same trigger again
            return Ignore(f"triggered already at {known.location} ({known.kind})")
        if record.checkpoint_id in self._completed:
            return Ignore("that id completed before, and ids are never reused")
        directory: str | None = None
        if record.kind is CheckpointKind.CHECKPOINT and self.location is not None:
            directory = self._checkpoint_directory(record.location)
            if directory is None and self.root is not None:
                return Ignore(
                    f"location {record.location} is outside the checkpoint location {self.location}"
                )
        else:
            parsed = _parsed(record.location)
            directory = None if parsed is None else str(parsed)
        self._triggered[record.checkpoint_id] = _Trigger(record.kind, record.location, directory)
        return None

    def completed(self, record: CheckpointCompleted) -> Complete | Ignore | None:
        """What to do on a completion: act (this attempt's), note it (another attempt's), or ignore it."""
        problem = completion_problem(record, self._completed)
        if problem is not None:
            return Ignore(problem)
        if record.checkpoint_id in self._aborted:
            return Ignore("the journal aborted it before")
        if record.attempt != self.attempt:
            self._completed.add(record.checkpoint_id)
            return None
        trigger = self._triggered.get(record.checkpoint_id)
        problem = self._trigger_problem(record, trigger) or self._offsets_problem(record.offsets)
        if problem is None and trigger is not None:
            problem = self._handles_problem(record, trigger)
        if problem is not None:
            return Ignore(problem)
        self._completed.add(record.checkpoint_id)
        newest = record.checkpoint_id > self._last_completed
        self._last_completed = max(self._last_completed, record.checkpoint_id)
        commit = tuple(
            sorted(
                (topic, partition, offset)
                for (topic, partition), offset in parse_offsets(record.offsets).items()
            )
        )
        directory = None if trigger is None else trigger.directory
        discard = self._retain(record) if record.kind is CheckpointKind.CHECKPOINT else ()
        stop = None
        if self.stop_savepoint is not None and self.stop_savepoint.checkpoint_id == record.checkpoint_id:
            stop = Stop(JobStatus.FINISHED, self.stop_savepoint.drain)
            self.stop_savepoint = None
        return Complete(record, commit if newest else (), directory, discard, stop)

    def aborted(self, record: CheckpointAborted) -> Abort | Ignore:
        """What to do on an abort: discard this attempt's snapshots of it, unless it completed."""
        if record.checkpoint_id in self._completed:
            return Ignore("it completed already; a completed checkpoint is never discarded by an abort")
        if record.checkpoint_id in self._aborted:
            return Ignore("it was aborted already")
        self._aborted[record.checkpoint_id] = record
        if self.stop_savepoint is not None and self.stop_savepoint.checkpoint_id == record.checkpoint_id:
            self.stop_savepoint = None  # the stop failed: the job keeps running
        trigger = self._triggered.get(record.checkpoint_id)
        if self.location is None:  # the reader finds its own snapshots of the id, of any kind
            directory = None if trigger is None else trigger.directory
            return Abort(record, Discard(record.checkpoint_id, directory))
        if trigger is None or trigger.kind is not CheckpointKind.CHECKPOINT or trigger.directory is None:
            return Abort(record, None)
        return Abort(record, Discard(record.checkpoint_id, trigger.directory))

    def threshold(self, record: CheckpointFailureThresholdExceeded) -> Fail | Ignore:
        """Fail the job once, for a counted failure of this attempt that nothing superseded."""
        checkpoint_id = record.checkpoint_id
        if checkpoint_id not in self._triggered:
            return Ignore("not a checkpoint of this attempt")
        if checkpoint_id in self._completed:
            return Ignore("that checkpoint completed")
        aborted = self._aborted.get(checkpoint_id)
        if aborted is None or not aborted.counts_as_failure:
            return Ignore("the journal has no counted failure of that checkpoint")
        if checkpoint_id < self._last_completed:
            return Ignore(f"stale: checkpoint {self._last_completed} completed after it")
        if self._failed:
            return Ignore("the job failed already")
        self._failed = True
        return Fail(record)

    # ------------------------------------------------------------ lifecycle

    def lifecycle(self, record: object) -> ConfirmRunning | Restart | GiveUp | Finish | Stop | None:
        """The scheduler's start and stop of this attempt and the restart strategy's decision on its
        failure (a restart names the attempt it starts; the one that started this attempt is about
        the one before); None for any other record. ``cutline run``, which follows no checkpoint,
        folds the journal through this alone."""
        if isinstance(record, SchedulerStarted) and record.attempt == self.attempt:
            if self._retained_from_journal:
                self.retained = max(1, record.config.retained)
            return ConfirmRunning(record)
        if isinstance(record, JobRestartScheduled) and record.attempt > self.attempt:
            return Restart(record)
        if isinstance(record, JobFailedPermanently) and record.attempt >= self.attempt:
            return GiveUp(record)
        if isinstance(record, SchedulerStopped) and record.attempt == self.attempt:
            if record.status is JobStatus.CANCELLING:
                if self._canceled:
                    return None  # a repeated record: the reader stops once
                self._canceled = True
                return Stop(JobStatus.CANCELED)
            if record.status in FINAL_STATUSES:
                return Finish(record)
        return None

    # --------------------------------------------------------------- checks

    def _retain(self, record: CheckpointCompleted) -> tuple[Discard, ...]:
        """Keep the newest ``retained`` completed checkpoints of this attempt; discard the older ones
        (the latest one always stays)."""
        trigger = self._triggered.get(record.checkpoint_id)
        if self.location is not None and (trigger is None or trigger.directory is None):
            return ()  # nothing of it may be deleted: it is not inside the job's location
        self._mine.append(record.checkpoint_id)
        self._mine.sort()
        discard: list[Discard] = []
        while len(self._mine) > max(1, self.retained):
            old = self._mine.pop(0)
            known = self._triggered.get(old)
            discard.append(Discard(old, None if known is None else known.directory))
        return tuple(discard)

    def _trigger_problem(self, record: CheckpointCompleted, trigger: _Trigger | None) -> str | None:
        """A reader that confines checkpoints to a location needs the trigger, at the same place."""
        if self.location is None:
            return None
        if trigger is None:
            return "this attempt never saw it triggered"
        if (record.kind, record.location) != (trigger.kind, trigger.location):
            return (
                f"it was triggered as {trigger.kind} at {trigger.location}, "
                f"not as {record.kind} at {record.location}"
            )
        return None

    def _checkpoint_directory(self, location: str) -> str | None:
        """The directory (canonical URI) of a checkpoint location inside the job's checkpoint
        location, or None."""
        directory = _parsed(location)
        if directory is None or self.root is None or not directory.within(self.root):
            return None
        return str(directory)

    def _offsets_problem(self, offsets: Mapping[str, int]) -> str | None:
        if self.partitions is None:
            return None
        foreign = sorted(f"{t}:{p}" for t, p in parse_offsets(offsets) if (t, p) not in self.partitions)
        if foreign:
            return f"offsets of partitions that are not the job's: {', '.join(foreign)}"
        return None

    def _handles_problem(self, record: CheckpointCompleted, trigger: _Trigger) -> str | None:
        foreign = [] if self.tasks is None else sorted(set(record.handles) - self.tasks)
        if foreign:
            return f"state of tasks that are not the job's: {', '.join(foreign)}"
        if trigger.directory is None or self.location is None:
            return None
        for task, handle in sorted(record.handles.items()):
            parsed = _parsed(handle.uri)
            parent = None if parsed is None else parsed.parent
            if parent is None or str(parent) != trigger.directory:
                return f"the state of {task} ({handle.uri}) is not in {record.location}"
        return None


def _parsed(uri: str) -> StorageUri | None:
    """``uri`` parsed the one way every reader parses it (:func:`events.wire.validation.parse_uri`), or
    None when it is not a storage URI cutline accepts."""
    try:
        return parse_uri(uri)
    except InvalidUri:
        return None
