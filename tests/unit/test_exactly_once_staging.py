"""The staged copy of a sink's output (docs/exactly-once.md, step 2), version 2: whatever mix of topics
and partitions a checkpoint's records have, the file reads back as the records that were sent, with
the staged schema, so that recovery (``decode_staged``) sends them as they were."""

from __future__ import annotations

import pytest

from events.task.exactly_once import (
    ANY_PARTITION,
    OutputColumns,
    OutputRecord,
    StagedOutput,
    decode_staged,
    encode_staged,
)


def staged(records: list[OutputRecord]) -> StagedOutput:
    return StagedOutput("job", "sink", "task-0", 4, 1, OutputColumns.of(records))


@pytest.mark.parametrize(
    "records",
    [
        pytest.param(
            [OutputRecord("out", f"v{i}".encode()) for i in range(5)], id="one topic, the partitioner's"
        ),
        pytest.param([OutputRecord("out", b"v", partition=3)] * 3, id="one topic, one partition"),
        pytest.param(
            [OutputRecord("a", b"1"), OutputRecord("b", b"2", b"k", 0), OutputRecord("a", None, partition=1)],
            id="topics and partitions mixed",
        ),
        pytest.param([OutputRecord("out", b"v", headers=(("h", b"1"),))], id="one record with headers"),
    ],
)
def test_a_staged_checkpoint_reads_back_as_the_records_sent(records: list[OutputRecord]) -> None:
    # when: a checkpoint's records are staged and read back as recovery reads them
    back = decode_staged(encode_staged(staged(records)), "chk-4/task-0.sink.out")
    # then: the same records, in order, each to its topic and partition (None: the partitioner's)
    assert records == list(back.records)


def test_the_partitioners_choice_is_kept_apart_from_a_partition() -> None:
    # given: records to one topic, the partitioner choosing for all but one
    records = [OutputRecord("out", b"a"), OutputRecord("out", b"b", partition=0), OutputRecord("out", b"c")]
    # when
    back = decode_staged(encode_staged(staged(records)), "chk-4/task-0.sink.out").records
    # then
    assert isinstance(back, OutputColumns)
    assert [ANY_PARTITION, 0, ANY_PARTITION] == list(back.partitions)
