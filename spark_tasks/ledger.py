"""What one attempt of a checkpointed Spark job makes of its journal: pure decisions, no I/O.

The driver's journal thread (:mod:`spark_tasks.job`) hands every decoded record of
its job to a :class:`JobLedger` and carries out what comes back. The ledger reads
the journal with suspicion, because a journal can hold records the coordinator
never meant (a replayed or forged record, an id reused after a reset):

- a completion is acted on once, by id and attempt, and only for a checkpoint this
  attempt saw triggered, at the location of its trigger, with offsets of the job's
  own partitions that :func:`events.validation.parse_offsets` accepts;
- files are written and deleted only inside the job's checkpoint location
  (``config.location``, any storage URI :func:`events.validation.parse_uri` accepts:
  ``file:``, ``s3:``, ...), except a savepoint's ``_metadata``, which goes to the
  directory its trigger named; only this attempt's completed checkpoints beyond
  ``config.retained`` and its aborted checkpoints are deleted: never the latest
  completed one, never a savepoint, never a checkpoint of another attempt;
- ``CheckpointFailureThresholdExceeded`` fails the job only for a counted failure of
  a checkpoint of this attempt that nothing has superseded since;
- anything that contradicts what the ledger knows (a second completion of an id, an
  abort of a completed one, a trigger outside the location, ...) comes back as an
  :class:`Ignore` with the reason, which the driver logs once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from events.task.participant import completion_problem
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointTriggered,
)
from events.wire.validation import InvalidUri, StorageUri, parse_offsets, parse_uri

__all__ = ["Abort", "Complete", "Discard", "Fail", "Ignore", "JobLedger"]


@dataclass(frozen=True)
class Ignore:
    """The record is ignored; ``reason`` says why (the driver logs it once)."""

    reason: str


@dataclass(frozen=True)
class Discard:
    """Delete this run's snapshots of checkpoint ``checkpoint_id`` in ``directory`` (and ``_metadata``).

    ``directory`` is a canonical storage URI (``file:///…``, ``s3://bucket/…``)."""

    checkpoint_id: int
    directory: str


@dataclass(frozen=True)
class Complete:
    """An accepted completion of this attempt: commit ``commit`` (topic, partition, offset), write
    ``_metadata`` into ``metadata`` (unless None), then carry out ``discard``."""

    completed: CheckpointCompleted
    commit: tuple[tuple[str, int, int], ...]
    metadata: str | None
    discard: tuple[Discard, ...]


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
class _Trigger:
    record: CheckpointTriggered
    directory: str | None
    """Its directory (a canonical storage URI), if the job may write and delete there."""


class JobLedger:
    """What one attempt of a job knows from its journal (see the module docstring).

    ``history`` is the job's completions before this attempt (already free of
    duplicates and malformed ones: :func:`events.participant.completion_problem`);
    ``partitions`` are the job's input partitions, ``tasks`` its task ids.
    """

    def __init__(
        self,
        job_id: str,
        attempt: int,
        config: CheckpointConfig,
        tasks: Iterable[str],
        partitions: Iterable[tuple[str, int]],
        history: Iterable[CheckpointCompleted] = (),
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.config = config
        self.tasks = frozenset(tasks)
        self.partitions = frozenset(partitions)
        self.root: StorageUri | None = _parsed(config.location)
        self._triggered: dict[int, _Trigger] = {}
        self._completed: set[int] = {c.checkpoint_id for c in history}
        """Every id the journal completed, any attempt: a second completion or an abort contradicts."""
        self._mine: list[int] = []
        """This attempt's completed checkpoints (not savepoints) not discarded yet, ascending."""
        self._last_completed = 0
        """The highest id this attempt completed (checkpoint or savepoint)."""
        self._aborted: dict[int, CheckpointAborted] = {}
        self._failed = False

    # ---------------------------------------------------------------- records

    def triggered(self, record: CheckpointTriggered) -> Ignore | None:
        """Remember where a checkpoint of this attempt writes; other attempts' triggers are not news."""
        if record.attempt != self.attempt:
            return None
        known = self._triggered.get(record.checkpoint_id)
        if known is not None:
            if known.record.location == record.location and known.record.kind == record.kind:
                return None  # the same trigger again
            return Ignore(f"triggered already at {known.record.location} ({known.record.kind})")
        if record.checkpoint_id in self._completed:
            return Ignore("that id completed before, and ids are never reused")
        directory: str | None = None
        if record.kind is CheckpointKind.CHECKPOINT:
            directory = self._checkpoint_directory(record.location)
            if directory is None and self.root is not None:
                return Ignore(
                    f"location {record.location} is outside the checkpoint location {self.config.location}"
                )
        else:
            parsed = _parsed(record.location)
            directory = None if parsed is None else str(parsed)
        self._triggered[record.checkpoint_id] = _Trigger(record, directory)
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
        if trigger is None:
            return Ignore("this attempt never saw it triggered")
        if (record.kind, record.location) != (trigger.record.kind, trigger.record.location):
            return Ignore(
                f"it was triggered as {trigger.record.kind} at {trigger.record.location}, "
                f"not as {record.kind} at {record.location}"
            )
        problem = self._offsets_problem(record.offsets) or self._handles_problem(record, trigger)
        if problem is not None:
            return Ignore(problem)
        self._completed.add(record.checkpoint_id)
        self._last_completed = max(self._last_completed, record.checkpoint_id)
        commit = tuple(
            sorted(
                (topic, partition, offset)
                for (topic, partition), offset in parse_offsets(record.offsets).items()
            )
        )
        discard: list[Discard] = []
        if record.kind is CheckpointKind.CHECKPOINT and trigger.directory is not None:
            self._mine.append(record.checkpoint_id)
            self._mine.sort()
            while len(self._mine) > max(1, self.config.retained):  # the latest one always stays
                old = self._mine.pop(0)
                directory = self._triggered[old].directory
                if directory is not None:
                    discard.append(Discard(old, directory))
        return Complete(record, commit, trigger.directory, tuple(discard))

    def aborted(self, record: CheckpointAborted) -> Abort | Ignore:
        """What to do on an abort: discard this attempt's snapshots of it, unless it completed."""
        if record.checkpoint_id in self._completed:
            return Ignore("it completed already; a completed checkpoint is never discarded by an abort")
        if record.checkpoint_id in self._aborted:
            return Ignore("it was aborted already")
        self._aborted[record.checkpoint_id] = record
        trigger = self._triggered.get(record.checkpoint_id)
        if (
            trigger is None
            or trigger.record.kind is not CheckpointKind.CHECKPOINT
            or trigger.directory is None
        ):
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

    # ----------------------------------------------------------------- checks

    def _checkpoint_directory(self, location: str) -> str | None:
        """The directory (canonical URI) of a checkpoint location inside the job's checkpoint
        location, or None."""
        directory = _parsed(location)
        if directory is None or self.root is None or not directory.within(self.root):
            return None
        return str(directory)

    def _offsets_problem(self, offsets: Mapping[str, int]) -> str | None:
        try:
            parsed = parse_offsets(offsets)
        except ValueError as exc:
            return f"malformed offsets: {exc}"
        foreign = sorted(f"{t}:{p}" for t, p in parsed if (t, p) not in self.partitions)
        if foreign:
            return f"offsets of partitions that are not the job's: {', '.join(foreign)}"
        return None

    def _handles_problem(self, record: CheckpointCompleted, trigger: _Trigger) -> str | None:
        foreign = sorted(set(record.handles) - self.tasks)
        if foreign:
            return f"state of tasks that are not the job's: {', '.join(foreign)}"
        if trigger.directory is None:
            return None
        for task, handle in sorted(record.handles.items()):
            parsed = _parsed(handle.uri)
            parent = None if parsed is None else parsed.parent
            if parent is None or str(parent) != trigger.directory:
                return f"the state of {task} ({handle.uri}) is not in {record.location}"
        return None


def _parsed(uri: str) -> StorageUri | None:
    """``uri`` parsed the one way every reader parses it (:func:`events.validation.parse_uri`), or
    None when it is not a storage URI cutline accepts."""
    try:
        return parse_uri(uri)
    except InvalidUri:
        return None
