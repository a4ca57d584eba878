"""The invariants the simulator checks, and the effective journal every reader agrees on.

:class:`Oracle` folds one journal partition of the simulated log in offset order under the
fencing rule (:func:`events.kafka.log.fenced_journal`, the production readers' own) and the
decider's ``evolve``, checking on the way what must hold of the log itself. The other checks
compare what the workers believe with it. Each failure is a :class:`Violation` naming its
invariant:

1. At most one worker's decisions count per partition: every valid journal record after a valid
   claim was written by that claim's worker.
2. A fenced worker steps down: a running worker that decides a partition under an epoch a newer
   valid claim fenced has stopped once its watcher could read that claim.
3. Checkpoint ids of each job are unique and strictly increasing in the effective journal.
4. No completed checkpoint is lost: every snapshot, when it lands, plus the journal after it
   recovers (with the production recovery) to the effective fold; the states a worker decides
   on under the current claim are the effective fold.
5. Bounded recovery: a recovery reads one snapshot message and the journal after it, no more.
6. Liveness: after a rebalance, every job of a partition its owner decides completes a checkpoint
   within the session timeout + 5 s; once the faults stop, every partition is decided by the
   worker the group assigned it to.
7. Inputs are decided in order, each once: the inputs named by valid journal records
   (``cutline-cause``) never go back within an input partition.
8. No input is lost: every input below a partition's committed offset was decided by a worker
   whose decisions counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from coordinator.core.decider import evolve
from coordinator.core.ownership import Claim
from coordinator.core.state import JobState, initial_state
from coordinator.service.claims import claim_of
from coordinator.service.runtime import parse_cause
from events.kafka.log import JournalRecord, LogMessage, fenced_journal
from events.wire.fencing import Fence, epoch_of
from events.wire.records import CheckpointCompleted, CheckpointTriggered, CoordinatorClaimed
from events.wire.vocabulary import CAUSE_HEADER

INVARIANTS = {
    1: "one worker's decisions count per partition",
    2: "a fenced worker steps down",
    3: "checkpoint ids unique and increasing",
    4: "no completed checkpoint lost",
    5: "bounded recovery",
    6: "liveness",
    7: "inputs decided in order, once",
    8: "no input lost",
}


class Violation(AssertionError):
    """An invariant does not hold."""

    def __init__(self, invariant: int, message: str) -> None:
        super().__init__(f"invariant {invariant} ({INVARIANTS[invariant]}): {message}")
        self.invariant = invariant
        self.message = message


TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Written:
    """A journal message and, for checking only, who wrote it."""

    message: LogMessage
    writer: str


class Oracle:
    """The effective fold of one journal partition, advanced message by message, checking
    invariants 1, 3 and 7 on the way (see the module doc)."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.fences: dict[int, Fence] = {}
        self.claim: Claim | None = None
        self.claim_landed = 0.0
        self.states: dict[str, JobState] = {}
        self.pos = 0
        self.triggered: dict[str, int] = {}
        self.completed: dict[str, int] = {}
        self.completions: dict[str, list[float]] = {}
        """Job -> when each of its valid completions landed."""
        self.last_cause: dict[TP, int] = {}
        self.valid_inputs: dict[TP, set[int]] = {}
        """Input partition -> the inputs that valid journal records name as their cause."""
        self.inputs_with_records: set[tuple[TP, int]] = set()
        """Inputs whose decision wrote journal records (valid or void)."""
        self._previous_cause: tuple[TP, int] | None = None

    @property
    def epoch(self) -> int:
        """The partition's current epoch (of its latest valid claim)."""
        fence = self.fences.get(self.partition)
        return 0 if fence is None else fence.epoch

    def advance(self, written: Sequence[Written], now: float = 0.0) -> None:
        """Fold the messages from :attr:`pos` on (the partition's journal so far)."""
        new = written[self.pos :]
        if not new:
            return
        writers = {w.message.offset: w.writer for w in new}
        causes = {w.message.offset: parse_cause(w.message.headers.get(CAUSE_HEADER)) for w in new}
        for cause in causes.values():
            if cause is not None:
                self.inputs_with_records.add(((cause[0], cause[1]), cause[2]))
        for record, message in fenced_journal((w.message for w in new), _foreign, self.fences, _void):
            self._valid(record, message, writers[message.offset], now, causes[message.offset])
        self.pos = len(written)

    def _valid(
        self,
        record: JournalRecord,
        message: LogMessage,
        writer: str,
        now: float,
        cause: tuple[str, int, int] | None,
    ) -> None:
        p = self.partition
        if isinstance(record, CoordinatorClaimed):
            self.claim = claim_of(record, message)
            self.claim_landed = now
            self._previous_cause = None
            return
        owner = self.claim.worker_id if self.claim is not None else None
        if owner is not None and writer != owner:
            raise Violation(
                1,
                f"partition {p} offset {message.offset}: {type(record).__name__} of {writer} (epoch "
                f"{epoch_of(message.headers)}) counts, but the current claim is {owner}'s "
                f"(epoch {self.epoch})",
            )
        self._in_order(message, cause)
        job = record.job_id
        state = self.states.get(job)
        self.states[job] = evolve(state if state is not None else initial_state(job), record)
        if isinstance(record, CheckpointTriggered):
            last = self.triggered.get(job, 0)
            if record.checkpoint_id <= last:
                raise Violation(
                    3,
                    f"partition {p} offset {message.offset}: {job} triggered checkpoint "
                    f"{record.checkpoint_id} after {last} (by {writer})",
                )
            self.triggered[job] = record.checkpoint_id
        elif isinstance(record, CheckpointCompleted):
            last = self.completed.get(job, 0)
            if record.checkpoint_id <= last:
                raise Violation(
                    3,
                    f"partition {p} offset {message.offset}: {job} completed {record.checkpoint_id} "
                    f"after {last}",
                )
            self.completed[job] = record.checkpoint_id
            self.completions.setdefault(job, []).append(now)

    def _in_order(self, message: LogMessage, cause: tuple[str, int, int] | None) -> None:
        """``cause``: the message's parsed cause header (:meth:`advance` parsed it already)."""
        if cause is None:
            self._previous_cause = None
            return
        tp, offset = (cause[0], cause[1]), cause[2]
        last = self.last_cause.get(tp, -1)
        if offset < last or (offset == last and self._previous_cause != (tp, offset)):
            raise Violation(
                7,
                f"partition {self.partition} offset {message.offset}: a decision of input {tp[0]}[{tp[1]}]@"
                f"{offset} counts after one of input @{last}",
            )
        self.last_cause[tp] = offset
        self.valid_inputs.setdefault(tp, set()).add(offset)
        self._previous_cause = (tp, offset)


def _foreign(message: LogMessage, problem: str) -> None:
    raise Violation(
        1, f"journal {message.topic}[{message.partition}]@{message.offset} is no journal record: {problem}"
    )


def _void(message: LogMessage, record: JournalRecord, epoch: int, current: int) -> None:
    pass


# ------------------------------------------------------------------ the other checks


@dataclass(frozen=True, slots=True)
class Deciding:
    """A running worker deciding a partition, as the invariant 2 check sees it."""

    worker_id: str
    partition: int
    epoch: int
    polled_at: float
    """When its watcher last read the partition."""


def check_step_down(deciding: Iterable[Deciding], current: Mapping[int, tuple[int, float]]) -> None:
    """Invariant 2: ``current`` maps partition -> (valid claim epoch, when it landed); a worker whose
    watcher read the partition after a newer claim landed must not decide it any more."""
    for d in deciding:
        epoch, landed = current[d.partition]
        if d.epoch < epoch and d.polled_at > landed:
            raise Violation(
                2,
                f"{d.worker_id} still decides partition {d.partition} under epoch {d.epoch}, fenced by "
                f"epoch {epoch} (landed at {landed:.3f} s, its watcher read the partition at "
                f"{d.polled_at:.3f} s)",
            )


def check_live_state(
    worker_id: str, partition: int, live: Mapping[str, JobState], effective: Mapping[str, JobState]
) -> None:
    """Invariant 4: the current claimer's live states are the effective fold of its partition."""
    if live != effective:
        jobs = sorted(j for j in live.keys() | effective.keys() if live.get(j) != effective.get(j))
        detail = ", ".join(
            f"{j}: live completed {_completed(live.get(j))} / effective {_completed(effective.get(j))}"
            for j in jobs
        )
        raise Violation(4, f"{worker_id}'s live state of partition {partition} is not its fold ({detail})")


def check_recovered(
    partition: int, writer: str, journal_offset: int, recovered: Mapping[str, JobState], oracle: Oracle
) -> None:
    """Invariant 4, for what a recovery finds from the snapshot that just landed (by ``writer``,
    covering ``journal_offset``): the effective fold, every completed checkpoint in it."""
    effective = oracle.states
    lost = [
        f"{job} completed {done} but recovers with {_completed(recovered.get(job))}"
        for job, done in sorted(oracle.completed.items())
        if (recovered[job].last_completed_id if job in recovered else 0) < done
    ]
    if lost or dict(recovered) != effective:
        detail = "; ".join(lost) or ", ".join(
            f"{j}: {_completed(recovered.get(j))} / {_completed(effective.get(j))}"
            for j in sorted(recovered.keys() | effective.keys())
            if recovered.get(j) != effective.get(j)
        )
        raise Violation(
            4,
            f"the last snapshot of partition {partition} (by {writer}, to offset {journal_offset}) is not a "
            f"valid base: {detail}",
        )


def _completed(state: JobState | None) -> str:
    return "-" if state is None else f"{state.last_completed_id} (next id {state.next_checkpoint_id})"


@dataclass(slots=True)
class RecoveryReads:
    """What one recovery read: snapshot messages, and the lowest journal offset."""

    partition: int
    base_offset: int = -1
    """The journal offset the snapshot it loaded covers (-1: none)."""
    snapshot_reads: int = 0
    lowest_offset: int | None = None
    records: int = 0


def check_recovery(worker_id: str, reads: RecoveryReads) -> None:
    """Invariant 5: at most one snapshot message read, then only the journal after it."""
    if reads.snapshot_reads > 1:
        raise Violation(
            5, f"{worker_id} recovered partition {reads.partition} reading {reads.snapshot_reads} snapshots"
        )
    if reads.lowest_offset is not None and reads.lowest_offset <= reads.base_offset:
        raise Violation(
            5,
            f"{worker_id} recovered partition {reads.partition} reading the journal from offset "
            f"{reads.lowest_offset}, at or before its snapshot's {reads.base_offset}",
        )


def check_liveness(
    assigned: Mapping[int, str],
    deciders: Mapping[int, Sequence[tuple[str, int]]],
    epochs: Mapping[int, int],
    behind: Iterable[str],
) -> list[str]:
    """Invariant 6's conditions once the faults stopped: what is not yet so ([] once every
    partition is decided by its assigned worker under the current claim and no job is behind).

    ``assigned``: partition -> its member; ``deciders``: partition -> (worker, epoch) of every
    running worker deciding it; ``epochs``: partition -> current claim epoch; ``behind``: the
    RUNNING jobs without a new completed checkpoint."""
    problems: list[str] = []
    for p in sorted(epochs):
        owner = assigned.get(p)
        ds = list(deciders.get(p, ()))
        if owner is None:
            problems.append(f"partition {p} is assigned to nobody")
        elif ds != [(owner, epochs[p])]:
            problems.append(f"partition {p} is assigned to {owner} but decided by {ds or 'nobody'}")
    problems.extend(f"job {job} completed no new checkpoint" for job in sorted(behind))
    return problems


@dataclass(slots=True)
class Window:
    """A rebalance's liveness window: every job of a partition decided by its owner completes a
    checkpoint within ``length`` seconds (invariant 6)."""

    generation: int
    start: float
    length: float
    clean: bool = True
    """No fault and no other rebalance happened in it (only then does the bound apply)."""
    deciding_since: dict[int, float] = field(default_factory=dict)


def check_window(
    window: Window,
    jobs: Mapping[str, int],
    running: Iterable[str],
    completions: Mapping[str, Sequence[float]],
    slack: float,
) -> None:
    """Invariant 6 after a rebalance: each RUNNING job (``jobs``: job -> partition) whose partition
    its owner decided from early enough (``window.deciding_since``, at least ``slack`` seconds
    before the window ends) completed a checkpoint after that, within the window."""
    end = window.start + window.length
    late = []
    for job in sorted(running):
        since = window.deciding_since.get(jobs[job])
        if since is None or since > end - slack:
            continue  # not decided in time: its partition says why (/ready, the log, a gauge)
        start = max(since, window.start)
        if not any(start < t <= end for t in completions.get(job, ())):
            late.append(f"{job} (partition {jobs[job]}, decided from {since:.2f} s)")
    if late:
        raise Violation(
            6,
            f"after the rebalance to generation {window.generation} at {window.start:.2f} s, no checkpoint "
            f"completed within {window.length:.1f} s for " + ", ".join(late),
        )


def check_inputs_decided(
    committed: Mapping[TP, int], decided: Mapping[TP, set[int]], valid: Mapping[TP, set[int]]
) -> None:
    """Invariant 8: every input below its partition's committed offset was decided validly
    (``decided``: acked by a worker whose claim was current; ``valid``: named by valid records)."""
    for tp, end in sorted(committed.items()):
        missing = [o for o in range(end) if o not in decided.get(tp, ()) and o not in valid.get(tp, ())]
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (
                f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            )
            raise Violation(
                8,
                f"{tp[0]}[{tp[1]}] is committed to offset {end}, but inputs {shown} were never decided by a "
                "worker whose decisions counted",
            )
