"""What a worker holds of the journal partitions it decides: the fold of their journal.

Per job its state (always equal to folding the journal) and checkpoint statistics; per input
partition the position of the last input a journal record names (a redelivered input is
recognised by it: the journal is written before input offsets are committed); per pending
checkpoint the claim epoch its trigger was journaled in (an answer to an older epoch's barrier is
a zombie's). Partitions come and go whole (:meth:`FoldState.merge`, :meth:`FoldState.drop_partition`,
:meth:`FoldState.load` of a snapshot). Pure: the shell (:mod:`coordinator.service.runtime`) owns one,
and a recovery folds another (:mod:`coordinator.service.claims`).
"""

from __future__ import annotations

from collections.abc import Callable

from coordinator.core.decider import due_at, evolve
from coordinator.core.snapshot import PartitionSnapshot, trigger_key
from coordinator.core.state import JobState, initial_state
from coordinator.core.stats import CheckpointStats, track, with_progress
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointTriggered,
    JournalEvent,
    TaskAcknowledged,
)

__all__ = ["FoldState", "parse_cause"]


def parse_cause(value: bytes | str | None) -> tuple[str, int, int] | None:
    """``topic:partition:offset`` back into its parts (None when absent or malformed)."""
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    topic, _, rest = text.rpartition(":")
    topic, _, partition = topic.rpartition(":")
    try:
        return topic, int(partition), int(rest)
    except ValueError:
        return None


class FoldState:
    """The fold of the journal partitions held; ``partition_of`` names a job's partition."""

    def __init__(self, partition_of: Callable[[str], int]) -> None:
        self.partition_of = partition_of
        self.states: dict[str, JobState] = {}
        self.stats: dict[str, CheckpointStats] = {}
        self.positions: dict[tuple[str, int], int] = {}
        """(input topic, partition) -> the offset of the last input a journal record names."""
        self.trigger_epochs: dict[tuple[str, int], int] = {}
        """(job, checkpoint id) of each pending checkpoint -> the epoch its trigger was journaled in."""
        self._due_at: dict[str, int | None] = {}
        """job -> ``due_at`` of its current state, where known: see :meth:`due`. Every change of a
        state goes through :meth:`_set_state`, which forgets it unless the change keeps it."""

    # ------------------------------------------------------------------ folding

    def apply(self, event: JournalEvent, cause: str | bytes | None, epoch: int) -> None:
        """Fold one valid journal event (of ``epoch``, with its cause header) in."""
        job_id = event.job_id
        state = self.states.get(job_id) or initial_state(job_id)
        self._set_state(job_id, evolve(state, event))
        self.stats[job_id] = track(self.stats.get(job_id), state, event)
        self._track_epoch(event, epoch)
        self.advance(parse_cause(cause))

    def keep(
        self,
        job_id: str,
        after: JobState,
        stats: CheckpointStats,
        journal: list[JournalEvent],
        epoch: int,
    ) -> None:
        """Take a decision's state and statistics (its ``journal``, under ``epoch``, leads to them)."""
        self.stats[job_id] = stats
        if len(journal) == 1 and type(journal[0]) is TaskAcknowledged:
            # The usual ack: it moves no deadline (see due()) and triggers or ends nothing.
            self._set_state(job_id, after, keeps_deadline=True)
            return
        self._set_state(job_id, after, keeps_deadline=all(type(e) is TaskAcknowledged for e in journal))
        for event in journal:
            self._track_epoch(event, epoch)

    def advance(self, position: tuple[str, int, int] | None) -> None:
        """The journal now names the input at ``position`` (topic, partition, offset)."""
        if position is not None:
            tp, offset = position[:2], position[2]
            if offset > self.positions.get(tp, -1):
                self.positions[tp] = offset

    def already_decided(self, topic: str, partition: int, offset: int) -> bool:
        """Did the journal already record this input's decision (a redelivery after a crash)?"""
        return offset <= self.positions.get((topic, partition), -1)

    def checkpoint_stats(self, job_id: str) -> CheckpointStats | None:
        """The job's statistics as the views show them: in-progress checkpoints with their acks."""
        return with_progress(self.stats.get(job_id), self.states.get(job_id))

    def _track_epoch(self, event: JournalEvent, epoch: int) -> None:
        if isinstance(event, CheckpointTriggered):
            self.trigger_epochs[(event.job_id, event.checkpoint_id)] = epoch
        elif isinstance(event, (CheckpointCompleted, CheckpointAborted)):
            self.trigger_epochs.pop((event.job_id, event.checkpoint_id), None)

    def _set_state(self, job_id: str, state: JobState, *, keeps_deadline: bool = False) -> None:
        """The one way a job's state changes: forgets its remembered ``due_at`` unless the change
        is known to move no deadline (acknowledgements only)."""
        self.states[job_id] = state
        if not keeps_deadline:
            self._due_at.pop(job_id, None)

    # --------------------------------------------------------------- partitions

    def jobs_of(self, partition: int) -> list[str]:
        """The jobs held here whose events live in ``partition``."""
        return [job_id for job_id in self.states if self.partition_of(job_id) == partition]

    def drop_partition(self, partition: int) -> None:
        """Forget everything of ``partition``: its jobs, their statistics and epochs, and the
        positions of its inputs (it was revoked, or is about to be recovered again)."""
        jobs = set(self.jobs_of(partition))
        for job_id in jobs:
            self.states.pop(job_id, None)
            self._due_at.pop(job_id, None)
            self.stats.pop(job_id, None)
        for key in [k for k in self.trigger_epochs if k[0] in jobs]:
            del self.trigger_epochs[key]
        for tp in [tp for tp in self.positions if tp[1] == partition]:
            del self.positions[tp]

    def merge(self, other: FoldState, partition: int) -> None:
        """Take ``partition``'s jobs, statistics, epochs and input positions from ``other`` (a fold
        of that partition made elsewhere), replacing what this one had of it."""
        self.drop_partition(partition)
        for job_id in other.jobs_of(partition):  # in the other's order: ticks follow it
            self._set_state(job_id, other.states[job_id])
            if job_id in other.stats:
                self.stats[job_id] = other.stats[job_id]
        jobs = set(other.jobs_of(partition))
        self.trigger_epochs.update({k: v for k, v in other.trigger_epochs.items() if k[0] in jobs})
        self.positions.update({tp: o for tp, o in other.positions.items() if tp[1] == partition})

    def snapshot(self, partition: int, epoch: int, journal_offset: int, now_ms: int) -> PartitionSnapshot:
        """What this fold holds of ``partition``, as a snapshot covering the journal up to
        ``journal_offset`` (the caller's last write there)."""
        jobs = set(self.jobs_of(partition))
        return PartitionSnapshot(
            partition=partition,
            epoch=epoch,
            journal_offset=journal_offset,
            positions={f"{t}:{p}": o for (t, p), o in self.positions.items() if p == partition},
            trigger_epochs={trigger_key(j, c): e for (j, c), e in self.trigger_epochs.items() if j in jobs},
            states={j: self.states[j] for j in sorted(jobs)},
            stats={j: self.stats[j] for j in sorted(jobs) if j in self.stats},
            timestamp_ms=now_ms,
        )

    def load(self, snapshot: PartitionSnapshot) -> None:
        """Take a snapshot's jobs, statistics, epochs and positions (replacing the partition's)."""
        self.drop_partition(snapshot.partition)
        for job_id, state in snapshot.states.items():
            self._set_state(job_id, state)
        self.stats.update(snapshot.stats)
        for key, epoch in snapshot.trigger_epochs.items():
            job_id, _, checkpoint_id = key.rpartition("\x00")
            self.trigger_epochs[(job_id, int(checkpoint_id))] = epoch
        for key, offset in snapshot.positions.items():
            topic, _, partition = key.rpartition(":")
            self.positions[(topic, int(partition))] = offset

    # ---------------------------------------------------------------------- due

    def due(self, now_ms: int) -> list[str]:
        """Jobs for which a tick at ``now_ms`` can change something.

        ``due_at`` walks every pending checkpoint, and the shell asks every 10 ms: with hundreds
        pending, that walk is repeated work in an ack flood. So each job's answer is remembered
        with the state it was worked out for, and an acknowledgement (which moves no deadline:
        ``due_at`` of the state after a ``TaskAcknowledged`` is that of the state before,
        ``tests/property/test_decider_properties.py``) carries it on to the new state
        (:meth:`keep`). Any other change of the state forgets it (:meth:`_set_state`)."""
        return [job_id for job_id, at in self._due_times() if at is not None and at <= now_ms]

    def next_due_at(self) -> int | None:
        """The earliest time (ms) at which a tick can change something for a job, as :meth:`due`
        works it out; None: no job has anything due until its state changes."""
        return min((at for _, at in self._due_times() if at is not None), default=None)

    def _due_times(self) -> list[tuple[str, int | None]]:
        remembered = self._due_at
        if len(remembered) > len(self.states):
            for job_id in remembered.keys() - self.states.keys():
                del remembered[job_id]
        times = []
        for job_id, state in self.states.items():
            if job_id in remembered:
                at = remembered[job_id]
            else:
                at = remembered[job_id] = due_at(state)
            times.append((job_id, at))
        return times
