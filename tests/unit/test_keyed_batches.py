"""The vectorized keyed path without Spark (spark_tasks/keyed.py, spark_tasks/wordcount.py): key groups
hashed from a key column, the word count's pairs cut by Arrow compute, and batches folded by key
through ``update_batch``, each against the record-by-record and key-by-key path it replaces."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema

from spark_tasks.kafka_source.reading import BARRIER_COLUMN, MARKER_COLUMN, kafka_schema
from spark_tasks.keyed import (
    KeyedBatchStep,
    KeyedState,
    KeyedStep,
    _take_rows,
    apply_changes,
    fold_pairs,
    key_group,
    key_group_range,
    key_groups,
    route_step,
)
from spark_tasks.latency import Measurements
from spark_tasks.state import KafkaRecord
from spark_tasks.wordcount import KEYED_WORD_COUNT, _words, words_of

SOURCE = to_arrow_schema(kafka_schema(barriers=True, markers=True), timezone="UTC")
BARRIER = json.dumps(
    {"attempt": 1, "id": 3, "kind": "CHECKPOINT", "location": "file:///c", "timestamp_ms": 1}
)


def per_record_words(record: KafkaRecord) -> list[tuple[str, int]]:
    return [(word, 1) for word in _words(record.value)]


def add_up_one(word: str, count: int | None, ones: list[int]) -> tuple[int, list[tuple[str, int, int]]]:
    total = (count or 0) + sum(ones)
    return total, [(word, total, sum(ones))]


PER_KEY_WORD_COUNT: KeyedStep[int] = KeyedStep(
    key_by=per_record_words,
    update=add_up_one,
    output_schema=KEYED_WORD_COUNT.output_schema,
    serialize=lambda count: str(count).encode(),
    deserialize=int,
)
"""The word count as it was written before the keyed path took whole batches: record by record, key
by key."""


def source_batch(values: list[bytes | None], partition: int = 0, first: int = 0) -> pa.RecordBatch:
    """Rows of the source: one record per value, offsets from ``first``."""
    n = len(values)
    return pa.RecordBatch.from_pydict(
        {
            "key": [None] * n,
            "value": values,
            "topic": ["words"] * n,
            "partition": [partition] * n,
            "offset": list(range(first, first + n)),
            "timestamp": [None] * n,
            "timestampType": [0] * n,
            BARRIER_COLUMN: [None] * n,
            MARKER_COLUMN: [None] * n,
        },
        schema=SOURCE,
    )


def with_barrier(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` after its partition's barrier row (first, at the batch's start offset)."""
    first = batch.slice(0, 1).to_pylist()[0]
    row = {**first, "value": None, BARRIER_COLUMN: BARRIER}
    return (
        pa.Table.from_batches([pa.RecordBatch.from_pylist([row], schema=SOURCE), batch])
        .combine_chunks()
        .to_batches()[0]
    )


def shuffled(step: Any, batches: list[pa.RecordBatch], parallelism: int) -> list[list[pa.RecordBatch]]:
    """What each shuffle partition receives from routing ``batches`` (one map task each)."""
    routed = [out for batch in batches for out in route_step(step, parallelism)([batch])]
    if not routed:
        return [[] for _ in range(parallelism)]
    table = pa.Table.from_batches(routed)
    return [table.filter(pc.equal(table["cutline_target"], i)).to_batches() for i in range(parallelism)]


def fold_all(step: Any, state: list[KeyedState], batches: list[pa.RecordBatch]) -> list[Any]:
    """One micro-batch folded into every partition's ``state``; the rows, as dicts, in output order."""
    parallelism = len(state)
    rows: list[Any] = []
    for index, arrived in enumerate(shuffled(step, batches, parallelism)):
        _, pairs = _take_rows(arrived, Measurements("j", 0, "keyed", index))
        changes, out = fold_pairs(
            step.batched(), state[index], pairs, key_group_range(index, parallelism), index
        )
        apply_changes(state[index], changes)
        if isinstance(out, pa.Table):
            rows.extend(out.to_pylist())
        else:
            rows.extend(dict(zip(("word", "count", "added"), row, strict=True)) for row in out)
    return rows


# ------------------------------------------------------------------ key groups


@settings(deadline=None)  # a shared machine makes single examples slow
@given(st.lists(st.text(max_size=40) | st.text(min_size=250, max_size=300), max_size=60), st.integers(0, 5))
def test_a_key_column_lands_in_the_key_groups_each_key_would(keys: list[str], skip: int) -> None:
    """Hashing a whole (sliced) string column gives each key's murmur3 key group, long keys too."""
    column = pa.array(["ignored"] * skip + keys, pa.string()).slice(skip)

    assert [key_group(key) for key in keys] == key_groups(column).tolist()
    assert [key_group(key, 7) for key in keys] == key_groups(pa.chunked_array([column]), 7).tolist()


def test_a_null_key_is_refused() -> None:
    """Keys are strings: a null key is a bug in the key function, said so."""
    with pytest.raises(ValueError, match="non-null strings"):
        key_groups(pa.array(["a", None]))


# ------------------------------------------------------------ the word count's pairs

VALUES = st.lists(
    st.none()
    | st.binary(max_size=20)
    | st.text(alphabet=st.sampled_from("ab CD\t\n\x0b\x0c\r\x1c\x1f\u00a0\u2003éİ"), max_size=20).map(
        str.encode
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(VALUES)
def test_the_word_counts_pairs_are_the_words_python_cuts(values: list[bytes | None]) -> None:
    """For any values (ASCII or not, invalid UTF-8, separators only Python splits on, nulls), the
    vectorized key function gives the pairs of the record-by-record one, in the same order."""
    batch = source_batch(values)
    expected = [(row, word, 1) for row, value in enumerate(values) for word in _words(value)]

    pairs = words_of(batch)

    assert expected == list(
        zip(*(pairs.column(name).to_pylist() for name in ("row", "key", "value")), strict=True)
    )


# ------------------------------------------------------------------------ folding

LINES = st.lists(
    st.lists(st.sampled_from(["a", "b", "Kafka", "kafka", "x y", "é", "\x1cz"]), max_size=4), max_size=25
)


@settings(max_examples=50, deadline=None)
@given(st.lists(LINES, min_size=1, max_size=3), st.integers(1, 5))
def test_batches_folded_by_key_count_what_the_per_key_step_counts(
    micro_batches: list[list[list[str]]], parallelism: int
) -> None:
    """Given the same micro-batches, the vectorized word count and the per-key one leave the same
    state in every partition and write the same rows, batch after batch."""
    vectorized: list[KeyedState] = [{} for _ in range(parallelism)]
    per_key: list[KeyedState] = [{} for _ in range(parallelism)]
    for number, lines in enumerate(micro_batches):
        batches = [
            source_batch([" ".join(words).encode() for words in lines[p::2]], p, 100 * number)
            for p in range(2)
        ]

        rows = fold_all(KEYED_WORD_COUNT, vectorized, batches)

        assert fold_all(PER_KEY_WORD_COUNT, per_key, batches) == rows
        assert per_key == vectorized


def test_a_barrier_goes_to_every_partition_and_never_into_the_fold() -> None:
    """Given a map task's batch whose first row is its partition's barrier, every shuffle partition
    gets the barrier with the cut's offset, and only the records after it are folded."""
    batch = with_barrier(source_batch([b"a b", b"b"], first=7))

    received = shuffled(KEYED_WORD_COUNT, [batch], 3)

    state: list[KeyedState] = [{} for _ in range(3)]
    for index, arrived in enumerate(received):
        barriers, pairs = _take_rows(arrived, Measurements("j", 0, "keyed", index))
        assert {("words", 0): (BARRIER, 7)} == barriers
        changes, _ = fold_pairs(KEYED_WORD_COUNT, state[index], pairs, key_group_range(index, 3), index)
        apply_changes(state[index], changes)
    assert {"a": b"1", "b": b"2"} == {
        key: count for part in state for keys in part.values() for key, count in keys.items()
    }


def test_a_pair_in_a_key_group_another_partition_owns_is_a_routing_bug() -> None:
    """The shuffle side refuses a pair outside its key groups instead of folding it."""
    (arrived,) = shuffled(KEYED_WORD_COUNT, [source_batch([b"a"])], 1)
    _, pairs = _take_rows(arrived, Measurements("j", 0, "keyed", 0))

    with pytest.raises(RuntimeError, match="key 'a' .* reached partition 1"):
        fold_pairs(KEYED_WORD_COUNT, {}, pairs, range(0, 0), 1)


def test_update_batch_must_give_one_state_per_key() -> None:
    """An ``update_batch`` that loses a key's state fails the batch rather than deleting the key."""
    step = KeyedBatchStep(
        pairs_of=words_of,
        update_batch=lambda keys, values, states: (states.slice(1), []),
        output_schema="word string",
        value_type=pa.int64(),
    )
    (arrived,) = shuffled(step, [source_batch([b"a b"])], 1)
    _, pairs = _take_rows(arrived, Measurements("j", 0, "keyed", 0))

    with pytest.raises(ValueError, match="1 states for 2 keys"):
        fold_pairs(step, {}, pairs, range(128), 0)


def test_a_keyed_step_folds_its_pickled_values_key_by_key() -> None:
    """The per-key convenience gets each key's values unpickled, in input order, and its state."""
    seen: list[tuple[str, Any, list[Any]]] = []

    def remember(key: str, state: Any, values: list[Any]) -> tuple[Any, list[Any]]:
        seen.append((key, state, values))
        return values, []

    step = KeyedStep(
        key_by=lambda record: [(record.value.decode(), {"at": record.offset})],
        update=remember,
        output_schema="k string",
    )
    (arrived,) = shuffled(step, [source_batch([b"k", b"j", b"k"], first=4)], 1)
    _, pairs = _take_rows(arrived, Measurements("j", 0, "keyed", 0))
    state: KeyedState = {}

    changes, _ = fold_pairs(step.batched(), state, pairs, range(128), 0)

    assert [("j", None, [{"at": 5}]), ("k", None, [{"at": 4}, {"at": 6}])] == sorted(seen)
    assert {"j": b'[{"at":5}]', "k": b'[{"at":4},{"at":6}]'} == {
        key: stored for keys in changes.values() for key, stored in keys.items()
    }
