"""The barrier entry (events/wire/barrier_entry.py) is one exact codec: a barrier and the epoch that
sent it survive the entry and its JSON, the JSON is one text per entry, and a malformed entry is a
``ValueError`` that names its key (docs/spark.md, "Barrier alignment")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.wire.barrier_entry import (
    barrier_entry,
    barrier_json,
    entry_barrier,
    entry_key,
    parse_barrier_json,
)
from events.wire.records import CheckpointBarrier, CheckpointKind

JOB = "job-1"

barriers = st.builds(
    CheckpointBarrier,
    job_id=st.text(min_size=1, max_size=12),
    checkpoint_id=st.integers(1, 2**62),
    attempt=st.integers(0, 2**31),
    kind=st.sampled_from(CheckpointKind),
    timestamp_ms=st.integers(0, 2**50),
    location=st.text(max_size=40),
    inline_limit_bytes=st.integers(0, 2**20),
    stop=st.booleans(),
    drain=st.booleans(),
)
epochs = st.integers(0, 10**18)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
entry_keys = st.sampled_from(
    ["id", "attempt", "epoch", "kind", "location", "timestamp_ms", "stop", "drain", "inline_limit_bytes"]
)


@given(barriers, epochs)
def test_an_entry_gives_back_its_barrier_and_epoch(barrier: CheckpointBarrier, epoch: int) -> None:
    """Given any barrier sent by any epoch, when it is written as an entry and read back for its job,
    then it is the same barrier, and the entry names the epoch."""
    entry = barrier_entry(barrier, epoch)

    assert barrier == entry_barrier(barrier.job_id, entry)
    assert (barrier.checkpoint_id, barrier.attempt, epoch) == entry_key(entry)


@given(barriers, epochs)
def test_an_entry_read_back_is_written_the_same(barrier: CheckpointBarrier, epoch: int) -> None:
    """An entry is its barrier's one form: read back and written again, it is equal, key for key."""
    entry = barrier_entry(barrier, epoch)

    assert entry == barrier_entry(entry_barrier(JOB, entry), entry["epoch"])


@given(barriers, epochs)
def test_the_json_gives_back_the_entry_and_is_one_text(barrier: CheckpointBarrier, epoch: int) -> None:
    """The column's text reads back as the entry, and does not depend on the order of the entry's keys
    (Spark compares offsets by their JSON text)."""
    entry = barrier_entry(barrier, epoch)
    reversed_entry = dict(reversed(list(entry.items())))

    assert entry == parse_barrier_json(barrier_json(entry))
    assert barrier_json(entry) == barrier_json(reversed_entry)


@given(barriers, epochs, entry_keys, json_values)
def test_a_damaged_entry_is_refused_by_name_or_read(
    barrier: CheckpointBarrier, epoch: int, key: str, value: Any
) -> None:
    """Given an entry with one key set to any JSON value, reading it either gives a barrier or raises a
    ``ValueError`` that names the key; nothing else escapes."""
    entry = {**barrier_entry(barrier, epoch), key: value}

    try:
        entry_barrier(JOB, entry)
        entry_key(entry)
    except ValueError as refused:
        assert repr(key) in str(refused)


def test_a_plain_barrier_keeps_the_six_keys_of_every_offset_log() -> None:
    """A barrier without stop or inline limit is the six keys Spark offset logs have always held."""
    barrier = CheckpointBarrier(JOB, 7, 1, CheckpointKind.CHECKPOINT, 5, "file:///c/chk-7")

    assert (
        '{"attempt":1,"epoch":3,"id":7,"kind":"CHECKPOINT","location":"file:///c/chk-7","timestamp_ms":5}'
        == barrier_json(barrier_entry(barrier, 3))
    )


def test_a_stop_barrier_keeps_its_stop_and_drain_keys() -> None:
    """A stop-with-savepoint barrier's entry names stop and drain, as its offset JSON always has."""
    barrier = CheckpointBarrier(JOB, 8, 1, CheckpointKind.SAVEPOINT, 5, "file:///s", stop=True)

    assert {"stop": True, "drain": False} == {k: barrier_entry(barrier)[k] for k in ("stop", "drain")}


def test_an_entry_without_kind_time_or_epoch_is_a_checkpoint_at_zero_from_epoch_zero() -> None:
    """The optional keys have their defaults."""
    entry = {"id": 4, "attempt": 2, "location": "file:///c/chk-4"}

    assert CheckpointBarrier(JOB, 4, 2, CheckpointKind.CHECKPOINT, 0, "file:///c/chk-4") == entry_barrier(
        JOB, entry
    )
    assert (4, 2, 0) == entry_key(entry)


@pytest.mark.parametrize("text", ["", "[1]", '"id"', "{"])
def test_a_cell_that_is_no_entry_says_so(text: str) -> None:
    """A ``cutline_barrier`` cell that is not a JSON object is a ``ValueError`` naming the column."""
    with pytest.raises(ValueError, match="cutline_barrier"):
        parse_barrier_json(text)


def test_an_entry_without_its_id_names_the_missing_key() -> None:
    """What to fix is in the message."""
    with pytest.raises(ValueError, match="no 'id'"):
        entry_barrier(JOB, json.loads('{"attempt": 1, "location": "file:///c"}'))
