"""A whole journal file replayed by two processes, each folding (and checking) the jobs of its share.

A job's events depend only on that job's earlier events: the fold (``evolve``) and the invariants
(:mod:`coordinator.core.invariants`) keep one state per job. So ``cutline replay -f F --quiet`` of a
whole file deals its jobs out in two shares: a forked helper takes one, this process the other.
Each reads the whole file (the Avro reading cannot be split without moving events between
processes, which costs about as much as decoding them: docs/benchmarks.md), but builds, folds and
checks only its own jobs' events, the larger part of the work with ``--verify``.
Only the results cross over: the helper's final job states and its first
violations, placed by their index in the file.

The result is the one-process result: the same states, and the same first violation (an event's
violation comes before any end-of-journal one, the earliest in the file first; among
end-of-journal ones, the earliest trigger first, as :func:`~coordinator.core.invariants.violations`
orders them). If the helper cannot be started (not Linux, a threaded process), fails or dies,
this process replays the other share itself afterwards. A replay of one job, up to a cut, with a
timeline or a plot goes the one-process way (``coordinator/cli/replay.py``).
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from coordinator.core.decider import fold_jobs
from coordinator.core.invariants import END_RULE, Violation, violations
from coordinator.core.state import JobState
from coordinator.replay.file_check import FirstViolation, ForkedCall, can_fork
from coordinator.replay.journal import FileTally, read_journal_share
from events.wire.records import JournalEvent

SHARES = 2
"""Processes a whole-file replay is split over (two cores: this one and a helper)."""


def share_taker(share: int | None) -> Callable[[str], bool]:
    """Whether a job belongs to ``share`` (None: every job), asked once per job in the order the
    jobs first appear in the file (:func:`~coordinator.replay.journal.read_journal_share`): the jobs are
    dealt out in turn, the same way in every process that reads the file, and evenly however few
    they are (a hash of four ids can put all four in one share)."""
    if share is None:
        return lambda job_id: True
    dealt = itertools.count()
    return lambda job_id: next(dealt) % SHARES == share


@dataclass
class ShareReplay:
    """One share's pass over a whole journal file.

    ``first_at_event`` is the share's first violation by an event, ``first_at_end`` its first
    end-of-journal violation; their indices are the events' indices in the file."""

    states: dict[str, JobState] = field(default_factory=dict)
    tally: FileTally = field(default_factory=FileTally)
    first_at_event: FirstViolation | None = None
    first_at_end: FirstViolation | None = None


@dataclass(frozen=True)
class SplitReplay:
    """A whole file's replay: every job's final state, the file's records and job ids, and the
    verdict of the invariants (``FirstViolation(None)`` without ``verify``)."""

    states: dict[str, JobState]
    records: int
    jobs: set[str]
    verdict: FirstViolation


def replay_share(path: Path, share: int | None, *, verify: bool) -> ShareReplay:
    """Fold (and with ``verify`` check) the events of the jobs of ``share`` (None: every job)."""
    result = ShareReplay()
    events = read_journal_share(path, share_taker(share), result.tally)
    states = result.states
    if not verify:
        states.update(fold_jobs(event for event, _, _, _ in events))
        return result
    indices, partitions, offsets = array("q"), array("i"), array("q")

    def taken() -> Iterator[JournalEvent]:
        for event, partition, offset, index in events:
            indices.append(index)
            partitions.append(partition)
            offsets.append(offset)
            yield event

    def placed(violation: Violation) -> FirstViolation:
        at = violation.index
        return FirstViolation(replace(violation, index=indices[at]), (partitions[at], offsets[at]))

    for violation in violations(taken(), folded=states):  # every one: the states come at the end
        if violation.rule == END_RULE:
            if result.first_at_end is None:
                result.first_at_end = placed(violation)
        elif result.first_at_event is None:
            result.first_at_event = placed(violation)
    return result


def replay_file(path: Path, *, verify: bool) -> SplitReplay:
    """Replay the whole journal file at ``path`` over this process and a helper (see the module);
    raises what reading the file raises."""
    helper = (
        ForkedCall(lambda: replay_share(path, 1, verify=verify), "cutline-replay") if can_fork() else None
    )
    try:
        if helper is None:
            passes = [replay_share(path, None, verify=verify)]
        else:
            mine = replay_share(path, 0, verify=verify)
            theirs = helper.answer()  # None if it failed or died: share 1 is replayed here
            passes = [
                mine,
                theirs if isinstance(theirs, ShareReplay) else replay_share(path, 1, verify=verify),
            ]
    finally:
        if helper is not None:
            helper.close()
    states: dict[str, JobState] = {}
    for one in passes:
        states.update(one.states)
    return SplitReplay(states, passes[0].tally.records, passes[0].tally.jobs, _first(passes))


def _first(passes: list[ShareReplay]) -> FirstViolation:
    """The one-process verdict from the shares': an event's violation before any end-of-journal one,
    the earliest in the file first."""
    for found in (
        [one.first_at_event for one in passes if one.first_at_event is not None],
        [one.first_at_end for one in passes if one.first_at_end is not None],
    ):
        if found:
            return min(found, key=_index)
    return FirstViolation(None)


def _index(verdict: FirstViolation) -> int:
    return verdict.violation.index if verdict.violation is not None else -1
