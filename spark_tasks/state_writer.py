"""Write a keyed step's savepoint from data (Flink's ``SavepointWriter``): bootstrap a job's state from
a batch DataFrame or an Arrow table, or transform a savepoint's state (drop keys, rewrite states,
re-key it for a new key function or a new max parallelism), with any number of tasks::

    history = spark.table("word_totals").selectExpr("word AS key", "total AS state")
    write_new_savepoint(history, KEYED_WORD_COUNT, "/savepoints/bootstrap", job_id="wordcount",
                        offsets={"words:0": 1200, "words:1": 1187})   # the input the totals hold
    # then JobSettings(restore="/savepoints/bootstrap", ...): the job counts on from there

    transform_savepoint("/savepoints/sp-7", "/savepoints/sp-7-upper", KEYED_WORD_COUNT,
                        rekey=Rekeying(UPPER_WORD_COUNT, str.upper))

The states are the step's own: each is encoded with the step's encoder (``KeyedStep.serialize``,
``KeyedBatchStep.encode_states``) and must decode back to itself, or the write is refused (a state
column of another type than the step keeps). Keys are grouped by the step's max parallelism
(:func:`spark_tasks.keyed.key_groups`) and the savepoint records the step's identity (uid and key
function): a job restores it exactly as a savepoint it took, with the same refusals. A transform
keeps the source's step unless it re-keys explicitly (:class:`Rekeying`), so state keyed by an old
key function never reaches a step with a new one unnoticed: restoring it there is refused.

The data is gathered on the driver (``DataFrame.toArrow``) and written from there
(:mod:`events.task.state_writer`): the state must fit in the driver's memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from events.clock import now_ms
from events.task.keyed_pieces import KeyedState
from events.task.state_view import StateDoesNotFit, typed_states
from events.task.state_writer import (
    SavepointTarget,
    SavepointWriteRefused,
    StoredState,
    read_savepoint_state,
    savepoint_files,
    write_savepoint,
)
from events.wire.records import CheckpointCompleted
from spark_tasks.keyed import AnyKeyedStep, KeyedStep, key_group_range, key_groups

__all__ = [
    "Rekeying",
    "SavepointWriteRefused",
    "keyed_state_of",
    "transform_savepoint",
    "write_new_savepoint",
]


@dataclass(frozen=True)
class Rekeying:
    """A transform's explicit re-keying for another step: ``step`` is the new step (the savepoint
    records its uid and key function, and its keys are grouped by its max parallelism),
    ``key_of(old_key)`` the key the new key function gives what the old one keyed ``old_key``
    (``lambda key: key`` when the keys are the same: a new max parallelism, say). Old keys that
    become one new key are refused unless ``merge(states)`` makes one state of their states
    (decoded, in old-key order)."""

    step: AnyKeyedStep
    key_of: Callable[[str], str]
    merge: Callable[[Sequence[Any]], Any] | None = None


def _as_uri(location: str | Path) -> str:
    """A local directory as a ``file:`` URI (as ``CheckpointedJob.savepoint`` names them); a URI as is."""
    if isinstance(location, str) and "://" in location:
        return location.rstrip("/")
    return Path(location).resolve().as_uri()


def _encode(step: AnyKeyedStep, states: pa.Array | Sequence[Any]) -> list[bytes]:
    """``states`` as the step stores them, refused unless each decodes back to itself."""
    if isinstance(step, KeyedStep):
        values = states.to_pylist() if isinstance(states, pa.Array) else list(states)
        encoded = [step.serialize(value) for value in values]
        back = [step.deserialize(data) for data in encoded]
    else:
        column = states if isinstance(states, pa.Array) else pa.array(states)
        stored = step.encode_states(column).cast(pa.binary())
        encoded, values = stored.to_pylist(), column.to_pylist()
        back = step.decode_states(stored).to_pylist()
    for value, again in zip(values, back, strict=True):
        if value != again:
            kind = states.type if isinstance(states, pa.Array) else type(value).__name__
            raise SavepointWriteRefused(
                f"the state {value!r} ({kind}) comes back from the step's encoder as {again!r}: "
                "give the states as the step keeps them (the type its update returns)"
            )
    return encoded


def _decode(step: AnyKeyedStep, stored: Sequence[bytes]) -> list[Any]:
    if isinstance(step, KeyedStep):
        return [step.deserialize(data) for data in stored]
    return list(step.decode_states(pa.array(stored, pa.binary())).to_pylist())


def keyed_state_of(keys: pa.Array, states: pa.Array | Sequence[Any], step: AnyKeyedStep) -> KeyedState:
    """``keys`` and their ``states`` (an Arrow column, or the step's values) as the step's keyed
    state: key group → key → stored bytes. Keys must be distinct, non-null strings; a null state is
    refused (leave the key out)."""
    if not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
        raise SavepointWriteRefused(f"keys must be strings, not {keys.type}")
    null_states = states.null_count if isinstance(states, pa.Array) else sum(s is None for s in states)
    if keys.null_count or null_states:
        raise SavepointWriteRefused(
            f"{keys.null_count} null keys and {null_states} null states: every row needs both "
            "(a key without state is a key left out)"
        )
    if pc.count_distinct(keys).as_py() != len(keys):
        counts = pc.value_counts(keys)
        twice = [str(v["values"]) for v in counts.to_pylist() if v["counts"] > 1][:3]
        raise SavepointWriteRefused(f"keys occur more than once ({', '.join(twice)}): one state per key")
    groups = key_groups(keys, step.max_parallelism).tolist()
    encoded = _encode(step, states)
    _check_state_type(step, keys, encoded)
    state: KeyedState = {}
    for group, key, data in zip(groups, keys.to_pylist(), encoded, strict=True):
        state.setdefault(group, {})[key] = data
    return state


def _check_state_type(step: AnyKeyedStep, keys: pa.Array, encoded: list[bytes]) -> None:
    """A step that declares its state type (recorded in the savepoint) stores that type's JSON:
    refused otherwise, as ``cutline-state`` could not read the states as it."""
    if step.state_type is None:
        return
    try:
        typed_states(pa.array(encoded, pa.binary()), step.state_type, keys, "the savepoint")
    except StateDoesNotFit as exc:
        raise SavepointWriteRefused(
            f"the step declares state_type {step.state_type}, but its encoder stores another: {exc}"
        ) from None


def _columns(data: Any, key: str, state: str) -> tuple[pa.Array, pa.Array]:
    table = data if isinstance(data, pa.Table) else data.toArrow()
    missing = [name for name in (key, state) if name not in table.column_names]
    if missing:
        raise SavepointWriteRefused(
            f"the data has no column {', '.join(missing)} (it has {', '.join(table.column_names)}): "
            "name the key and state columns (key=..., state=...)"
        )
    return table.column(key).combine_chunks(), table.column(state).combine_chunks()


def _write(
    state: KeyedState,
    step: AnyKeyedStep,
    location: str | Path,
    job_id: str,
    offsets: Mapping[str, int],
    parallelism: int,
    checkpoint_id: int,
) -> CheckpointCompleted:
    maximum = step.max_parallelism
    if not 0 < parallelism <= maximum:
        raise SavepointWriteRefused(f"parallelism {parallelism}: give 1 to max parallelism {maximum}")
    target = SavepointTarget(
        job_id=job_id,
        location=_as_uri(location),
        step=step.identity,
        max_parallelism=maximum,
        task_groups=[key_group_range(i, parallelism, maximum) for i in range(parallelism)],
        offsets=offsets,
        checkpoint_id=checkpoint_id,
        timestamp_ms=now_ms(),
    )
    return write_savepoint(savepoint_files(state, target))


def write_new_savepoint(
    data: Any,
    step: AnyKeyedStep,
    location: str | Path,
    *,
    job_id: str,
    offsets: Mapping[str, int] | None = None,
    parallelism: int = 1,
    key: str = "key",
    state: str = "state",
) -> CheckpointCompleted:
    """Bootstrap ``step``'s state: a savepoint at ``location`` (a new directory) for job ``job_id``
    holding, for each row of ``data`` (a DataFrame or an Arrow table), the state ``state`` of key
    ``key``, in ``parallelism`` tasks (any: it restores into any number of shuffle partitions).
    ``offsets`` (``topic:partition`` → offset) are where the job reads on: the input the states
    already count ends there (none: the job reads its input from the earliest offset)."""
    keys, states = _columns(data, key, state)
    keyed = keyed_state_of(keys, states, step)
    return _write(keyed, step, location, job_id, offsets or {}, parallelism, 1)


def _check_source(stored: StoredState, step: AnyKeyedStep, source: str) -> None:
    if stored.step is not None and stored.step != step.identity:
        raise SavepointWriteRefused(
            f"{source} holds the state of the step with {stored.step.describe()}, not of the step given "
            f"({step.identity.describe()}): give the step that wrote it, and re-key explicitly "
            "(rekey=Rekeying(new_step, key_of)) to write it for another key function"
        )
    if stored.max_parallelism != step.max_parallelism:
        raise SavepointWriteRefused(
            f"{source} was written with max parallelism {stored.max_parallelism}, the step has "
            f"{step.max_parallelism}: key groups cannot be remapped"
        )


def _rekeyed(rows: list[tuple[str, Any]], rekey: Rekeying) -> list[tuple[str, Any]]:
    """``rows`` under their new keys; old keys that meet are merged, or refused without ``merge``."""
    met: dict[str, list[tuple[str, Any]]] = {}
    for old, value in sorted(rows, key=lambda row: row[0]):
        met.setdefault(rekey.key_of(old), []).append((old, value))
    merged: list[tuple[str, Any]] = []
    for new, olds in met.items():
        if len(olds) == 1:
            merged.append((new, olds[0][1]))
        elif rekey.merge is None:
            names = ", ".join(repr(old) for old, _ in olds[:3])
            raise SavepointWriteRefused(
                f"keys {names} all become {new!r}: give Rekeying(merge=...) to make one state of theirs"
            )
        else:
            merged.append((new, rekey.merge([value for _, value in olds])))
    return merged


def transform_savepoint(
    source: str | Path,
    location: str | Path,
    step: AnyKeyedStep,
    *,
    keep: Callable[[str, Any], bool] | None = None,
    rewrite: Callable[[str, Any], Any] | None = None,
    rekey: Rekeying | None = None,
    job_id: str | None = None,
    parallelism: int | None = None,
) -> CheckpointCompleted:
    """A new savepoint at ``location`` from the savepoint or checkpoint at ``source`` (its
    ``_metadata``; every piece checked), whose keyed state is ``step``'s (refused otherwise): the
    keys ``keep(key, state)`` keeps, their states rewritten by ``rewrite(key, state)`` (None drops
    the key), then re-keyed for ``rekey.step`` if given (its identity recorded; else ``step``'s).
    States are given decoded by ``step``. The source's offsets and checkpoint id carry over; its job
    id and number of tasks unless given."""
    origin = _as_uri(source)
    stored = read_savepoint_state(origin)
    _check_source(stored, step, origin)
    keys = [
        (key, data) for group in sorted(stored.state) for key, data in sorted(stored.state[group].items())
    ]
    values = _decode(step, [data for _, data in keys])
    rows = [(key, value) for (key, _), value in zip(keys, values, strict=True)]
    if keep is not None:
        rows = [(key, value) for key, value in rows if keep(key, value)]
    if rewrite is not None:
        rows = [(key, new) for key, value in rows if (new := rewrite(key, value)) is not None]
    target = step if rekey is None else rekey.step
    if rekey is not None:
        rows = _rekeyed(rows, rekey)
    keyed = keyed_state_of(pa.array([key for key, _ in rows], pa.string()), [v for _, v in rows], target)
    return _write(
        keyed,
        target,
        location,
        job_id or stored.completed.job_id,
        stored.completed.offsets,
        parallelism or len(stored.completed.handles),
        stored.completed.checkpoint_id,
    )
