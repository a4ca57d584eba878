"""What a restore brings back, or why it refuses (pure: decided from a checkpoint's completion and
its keyed manifests, with no I/O). See docs/spark.md, "Restoring exactly or refusing".

A job restores exactly or not at all, as Flink does:

- **All of its state or nothing.** A keyed job needs every key group in the checkpoint's
  manifests; a per-partition job needs the state of every partition the checkpoint has an offset
  of. A gap is :attr:`Refusal.INCOMPLETE` (the checkpoint is broken: an older one may do).
- **Key groups line up.** Manifests of another max parallelism are :attr:`Refusal.MAX_PARALLELISM`.
- **Nothing left behind unless allowed.** State the job does not map (a keyed checkpoint in a
  per-partition job or the other way round, tasks or offsets of partitions it does not read) is
  :attr:`Refusal.NOT_RESTORED`, unless the job allows it (``allow_non_restored_state``, Flink's
  ``--allowNonRestoredState``): then it is left behind and the job's own state starts empty, at the
  checkpoint's offsets where it has them.
- **The same step.** A keyed checkpoint records its step's identity (uid and key function);
  another step's state is :attr:`Refusal.STEP_CHANGED` unless allowed (then the step starts empty).
  A checkpoint written before identities were recorded restores into any step.
- **The same state type.** A step that declares its state's type (``KeyedStep.state_type``) refuses
  keyed state recorded with another (:attr:`Refusal.STATE_TYPE_CHANGED`, even when non-restored
  state is allowed: the states would not decode). State recorded without a type restores as before.

:func:`refusal_message` turns refusals into one screen: the three newest, why, and advice that works.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from events.task.manifest import Manifest, StepIdentity, is_keyed_task
from events.wire.records import CheckpointCompleted
from events.wire.sizes import excerpt
from events.wire.validation import parse_offsets_key

__all__ = [
    "JobShape",
    "LeftBehind",
    "Refusal",
    "Refused",
    "RestorePlan",
    "owner_problem",
    "plan_restore",
    "refusal_message",
    "restore_step",
]

Partition = tuple[str, int]

SHOWN = 3
"""Refused checkpoints an error lists (the newest)."""


class Refusal(Enum):
    """Why a checkpoint cannot be restored exactly; each has its own advice."""

    UNREADABLE = "unreadable"
    INCOMPLETE = "incomplete"
    MAX_PARALLELISM = "max parallelism"
    NOT_RESTORED = "not restored"
    STEP_CHANGED = "step changed"
    STATE_TYPE_CHANGED = "state type changed"
    OTHER_JOB = "another job's"


ADVICE = {
    Refusal.UNREADABLE: "restore an older checkpoint (restore=ID) or a savepoint (restore=DIR), or start "
    "empty (restore=None)",
    Refusal.INCOMPLETE: "restore an older checkpoint (restore=ID) or a savepoint (restore=DIR), or start "
    "empty (restore=None)",
    Refusal.MAX_PARALLELISM: "run the job with the max parallelism its state was taken with "
    "(JobSettings.max_parallelism and KeyedStep.max_parallelism): key groups cannot be remapped, and "
    "every checkpoint and savepoint of that state has the same key groups",
    Refusal.NOT_RESTORED: "restore into a job that maps that state (the same topics; keyed_partitions "
    "for keyed state, none for per-partition state), or pass allow_non_restored_state=True to leave it "
    "behind (Flink's --allowNonRestoredState)",
    Refusal.OTHER_JOB: "restore a savepoint or checkpoint of this job, or name the job it belongs to "
    "(JobSettings(restore_from_job=...), --restore-from-job) to restore it on purpose",
    Refusal.STATE_TYPE_CHANGED: "restore into a step whose state_type is the state's, or migrate the "
    "state to the new type first (spark_tasks.state_writer.transform_savepoint with rewrite=, into the "
    "new step; docs/state.md)",
    Refusal.STEP_CHANGED: "give the step the uid and key function its state was written with "
    "(KeyedStep(uid=...)), or pass allow_non_restored_state=True to start the step's state empty",
}


@dataclass(frozen=True)
class Refused:
    """A checkpoint this job cannot restore exactly, and why."""

    checkpoint_id: int
    refusal: Refusal
    reason: str


def owner_problem(
    checkpoint_id: int, owner: str, job_id: str, restore_from_job: str | None
) -> Refused | None:
    """A directory's ``_metadata`` of job ``owner`` restores into job ``job_id`` only when it is the
    job's own, or the job the user named (``restore_from_job``): a shared or mistyped directory must
    never hand a job another job's offsets and state."""
    expected = restore_from_job or job_id
    if owner == expected:
        return None
    named = f"restore_from_job={restore_from_job!r}" if restore_from_job else f"job {job_id!r}"
    return Refused(
        checkpoint_id,
        Refusal.OTHER_JOB,
        f"its _metadata belongs to job {excerpt(owner)!r}, not {excerpt(named)}",
    )


@dataclass(frozen=True)
class JobShape:
    """What a job maps state to: its input partitions, and its shuffle partitions if keyed."""

    partitions: tuple[Partition, ...]
    keyed_partitions: int | None
    max_parallelism: int
    allow_non_restored_state: bool = False


@dataclass(frozen=True)
class RestorePlan:
    """What restoring a checkpoint brings back."""

    checkpoint_id: int
    offsets: Mapping[Partition, int]
    """Where each partition the checkpoint knows starts reading."""
    partition_state: Mapping[Partition, str]
    """A per-partition job: the task whose snapshot is each partition's first state."""
    keyed_state: bool
    """A keyed job: read its key groups from the checkpoint's manifests (False: start empty)."""
    steps: frozenset[StepIdentity | None] = frozenset()
    """The step identities the manifests record (None: a manifest from before they were recorded)."""
    left_behind: tuple[str, ...] = ()
    """State in the checkpoint this job does not map (only with ``allow_non_restored_state``)."""
    new_partitions: tuple[Partition, ...] = field(default=())
    """Partitions the checkpoint knows nothing of: they start at ``startingOffsets``."""


@dataclass(frozen=True)
class LeftBehind:
    """The checkpoint's keyed state belongs to another step; allowed, the step starts empty."""

    reason: str


def plan_restore(
    completed: CheckpointCompleted, job: JobShape, manifests: Mapping[str, Manifest]
) -> RestorePlan | Refused:
    """What restoring ``completed`` into ``job`` brings back, or why it refuses. ``manifests`` are the
    checkpoint's keyed tasks' manifests (read only for a keyed job)."""
    offsets: dict[Partition, int] = {}
    for key, offset in completed.offsets.items():
        try:
            offsets[parse_offsets_key(key)] = offset
        except ValueError as exc:
            return Refused(completed.checkpoint_id, Refusal.INCOMPLETE, str(exc))
    wanted = set(job.partitions)
    foreign = sorted(p for p in offsets if p not in wanted)
    unmapped = [f"the offsets of {_partitions(foreign)}, which this job does not read"] if foreign else []
    own_offsets = {p: o for p, o in offsets.items() if p in wanted}
    new = tuple(p for p in job.partitions if p not in offsets)
    if job.keyed_partitions is None:
        planned = _plan_per_partition(completed, job, own_offsets, unmapped)
    else:
        planned = _plan_keyed(completed, job, own_offsets, manifests, unmapped)
    if isinstance(planned, Refused):
        return planned
    if unmapped and not job.allow_non_restored_state:
        return Refused(
            completed.checkpoint_id,
            Refusal.NOT_RESTORED,
            "it holds state this job does not map: " + "; ".join(unmapped),
        )
    return RestorePlan(
        planned.checkpoint_id,
        own_offsets,
        planned.partition_state,
        planned.keyed_state,
        planned.steps,
        tuple(unmapped),
        new,
    )


def _plan_per_partition(
    completed: CheckpointCompleted, job: JobShape, offsets: Mapping[Partition, int], unmapped: list[str]
) -> RestorePlan | Refused:
    by_task = {f"{topic}-{partition}": (topic, partition) for topic, partition in job.partitions}
    keyed = sorted(t for t in completed.handles if is_keyed_task(t))
    foreign = sorted(t for t in completed.handles if t not in by_task and not is_keyed_task(t))
    if keyed:
        unmapped.append(f"the keyed state of {_tasks(keyed)} (this job has no keyed_partitions)")
    if foreign:
        unmapped.append(f"the state of {_tasks(foreign)}, partitions this job does not read")
    state = {by_task[t]: t for t in completed.handles if t in by_task}
    without_offset = sorted(p for p in state if p not in offsets)
    if without_offset:
        return Refused(
            completed.checkpoint_id,
            Refusal.INCOMPLETE,
            f"it has the state of {_partitions(without_offset)} but not the offset it is the state at",
        )
    without_state = sorted(p for p in offsets if p not in state)
    if (state or not completed.handles) and without_state:
        return Refused(
            completed.checkpoint_id,
            Refusal.INCOMPLETE,
            f"it has the offsets of {_partitions(without_state)} but not their state (a task acknowledged "
            "without it)",
        )
    # No per-partition state, but keyed state (left behind if allowed): the partitions start at the
    # checkpoint's offsets with the step's initial state, as Flink's sources resume. Offsets with no
    # state of any task are a gap (refused above): restoring them would start every step empty.
    return RestorePlan(completed.checkpoint_id, offsets, state, keyed_state=False)


def _plan_keyed(
    completed: CheckpointCompleted,
    job: JobShape,
    offsets: Mapping[Partition, int],
    manifests: Mapping[str, Manifest],
    unmapped: list[str],
) -> RestorePlan | Refused:
    others = sorted(t for t in completed.handles if not is_keyed_task(t))
    if others:
        unmapped.append(f"the per-partition state of {_tasks(others)} (this job is keyed)")
    keyed = {t: m for t, m in manifests.items() if is_keyed_task(t) and t in completed.handles}
    if not keyed and not others:
        return Refused(
            completed.checkpoint_id,
            Refusal.INCOMPLETE,
            f"it holds no state at all: key groups 0-{job.max_parallelism - 1} are in none of its manifests",
        )
    if not keyed:
        if not job.allow_non_restored_state:
            return Refused(
                completed.checkpoint_id,
                Refusal.NOT_RESTORED,
                "it holds no keyed state"
                + (f", only {'; '.join(unmapped)}" if unmapped else "")
                + ": a keyed job restores only a keyed job's checkpoint or savepoint",
            )
        return RestorePlan(completed.checkpoint_id, offsets, {}, keyed_state=False)
    problem = _key_group_problem(keyed, job.max_parallelism)
    if problem is not None:
        refusal, reason = problem
        return Refused(completed.checkpoint_id, refusal, reason)
    steps = frozenset(m.step for m in keyed.values())
    return RestorePlan(completed.checkpoint_id, offsets, {}, keyed_state=True, steps=steps)


def _key_group_problem(manifests: Mapping[str, Manifest], max_parallelism: int) -> tuple[Refusal, str] | None:
    """Why the manifests do not give each of the job's key groups exactly once (None: they do)."""
    others = sorted({m.max_parallelism for m in manifests.values()} - {max_parallelism})
    if others:
        return (
            Refusal.MAX_PARALLELISM,
            f"its keyed state was taken with max parallelism {', '.join(map(str, others))}, the job has "
            f"{max_parallelism}",
        )
    owner: dict[int, str] = {}
    for task, manifest in sorted(manifests.items()):
        for group in manifest.key_groups:
            if group in owner or not 0 <= group < max_parallelism:
                return (
                    Refusal.INCOMPLETE,
                    f"key group {group} is claimed by {task}"
                    + (f" and {owner[group]}" if group in owner else f", outside 0-{max_parallelism - 1}"),
                )
            owner[group] = task
    missing = [g for g in range(max_parallelism) if g not in owner]
    if missing:
        return (
            Refusal.INCOMPLETE,
            f"key groups {_ranges(missing)} ({len(missing)} of {max_parallelism}) are in none of its "
            f"manifests ({_tasks(sorted(manifests))}): a shuffle task acknowledged without its state",
        )
    return None


def restore_step(
    plan: RestorePlan, step: StepIdentity, *, allow_non_restored_state: bool
) -> None | LeftBehind | Refused:
    """Whether the planned keyed state is ``step``'s: None (restore it), :class:`LeftBehind` (another
    step's, allowed: start empty), or :class:`Refused` (another step's)."""
    recorded = {s for s in plan.steps if s is not None}
    if not plan.keyed_state or not recorded:
        return None
    changed_type = _state_type_problem(plan, step)
    if changed_type is not None:
        return changed_type
    if recorded == {step}:
        return None
    written = " and ".join(sorted(s.describe() for s in recorded))
    reason = f"its keyed state was written by the step with {written}; this step has {step.describe()}"
    if allow_non_restored_state:
        return LeftBehind(reason)
    return Refused(plan.checkpoint_id, Refusal.STEP_CHANGED, reason)


def _state_type_problem(plan: RestorePlan, step: StepIdentity) -> Refused | None:
    """Refused when ``step`` declares a state type and the planned state was recorded with another
    (state recorded without one restores into any)."""
    recorded = sorted({s.state_type for s in plan.steps if s is not None and s.state_type is not None})
    if step.state_type is None or not recorded or recorded == [step.state_type]:
        return None
    from events.task.keyed_pieces import state_type_name

    held = " and ".join(state_type_name(t) for t in recorded)
    wanted = state_type_name(step.state_type)
    return Refused(
        plan.checkpoint_id,
        Refusal.STATE_TYPE_CHANGED,
        f"its keyed state has state type {held}; this step's state type is {wanted}",
    )


def refusal_message(job_id: str, refused: Sequence[Refused], *, latest: bool) -> str:
    """One screen: which checkpoints were refused (the :data:`SHOWN` newest) and why, and what to do.
    ``latest``: they are every completed checkpoint of the job (``restore="latest"``)."""
    newest = sorted(refused, key=lambda r: r.checkpoint_id, reverse=True)
    if latest:
        head = f"job {job_id} cannot restore any of its {len(newest)} completed checkpoints exactly"
    else:
        head = f"job {job_id} cannot restore checkpoint {newest[0].checkpoint_id} exactly"
    lines = [head + ":"]
    lines += [f"  checkpoint {r.checkpoint_id}: {excerpt(r.reason, 300)}" for r in newest[:SHOWN]]
    if len(newest) > SHOWN:
        lines.append(f"  ({len(newest) - SHOWN} older ones refused too)")
    kinds = list(dict.fromkeys(r.refusal for r in newest[:SHOWN]))
    lines += [f"To restore: {ADVICE[kind]}." for kind in kinds]
    return "\n".join(lines)


def _tasks(tasks: Sequence[str]) -> str:
    shown = ", ".join(tasks[:4])
    more = f" and {len(tasks) - 4} more" if len(tasks) > 4 else ""
    return f"task{'s' if len(tasks) > 1 else ''} {shown}{more}"


def _partitions(partitions: Sequence[Partition]) -> str:
    shown = ", ".join(f"{t}[{p}]" for t, p in partitions[:4])
    more = f" and {len(partitions) - 4} more" if len(partitions) > 4 else ""
    return f"{shown}{more}"


def _ranges(groups: Iterable[int]) -> str:
    """``0-3, 7, 9-12`` (at most four runs shown)."""
    runs: list[list[int]] = []
    for group in sorted(groups):
        if runs and runs[-1][1] == group - 1:
            runs[-1][1] = group
        else:
            runs.append([group, group])
    spelled = [f"{a}-{b}" if a != b else str(a) for a, b in runs]
    return ", ".join(spelled[:4]) + (f" and {len(spelled) - 4} more runs" if len(spelled) > 4 else "")
