"""JobRecords: which messages of a job's partitions count, and as what (no broker: built messages)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Message

from events.kafka.clients import job_key
from events.kafka.feed import JobRecords
from events.wire.codec import encode
from events.wire.fencing import epoch_header
from events.wire.records import CheckpointAborted, CheckpointBarrier, CheckpointKind, CoordinatorClaimed

JOB = "job-1"
JOURNAL, BARRIERS = "cutline.checkpoints", "cutline.barriers"


def barrier(checkpoint_id: int, job_id: str = JOB) -> CheckpointBarrier:
    return CheckpointBarrier(job_id, checkpoint_id, 1, CheckpointKind.CHECKPOINT, 1_000, "file:///c")


def message(
    value: bytes | None,
    *,
    topic: str = BARRIERS,
    offset: int = 0,
    key: bytes | None = job_key(JOB),
    epoch: int | None = None,
    error: KafkaError | None = None,
) -> Message:
    headers = None if epoch is None else [epoch_header(epoch)]
    return Message(
        topic=topic, partition=3, offset=offset, key=key, value=value, headers=headers,
        timestamp=(1, 1_234), error=error,
    )  # fmt: skip


def claim(epoch: int, offset: int = 0) -> Message:
    return message(encode(CoordinatorClaimed(3, epoch, "w", 1)), topic=JOURNAL, offset=offset, key=None)


class TestWhatCounts:
    def test_a_record_of_the_job_comes_decoded_with_where_it_was_and_its_epoch(self) -> None:
        records = JobRecords(JOB)

        got = records.admit(message(encode(barrier(7)), offset=12, epoch=2))

        assert got is not None
        assert (BARRIERS, 3, 12, 2, "CheckpointBarrier", 1_234) == (
            got.topic, got.partition, got.offset, got.epoch, got.name, got.timestamp_ms,
        )  # fmt: skip
        assert barrier(7) == got.record

    def test_records_of_other_jobs_are_left_out_by_key_and_by_job_id(self) -> None:
        records = JobRecords(JOB)

        assert records.admit(message(encode(barrier(7, "job-2")), key=job_key("job-2"))) is None
        assert records.admit(message(encode(barrier(7, "job-2")))) is None  # the right key, another job
        assert records.admit(message(encode(barrier(7)), key=None)) is None  # keyless: only claims

    def test_an_undecodable_frame_is_counted_not_raised(self) -> None:
        records = JobRecords(JOB)

        assert records.admit(message(b"\x00garbage")) is None
        assert records.admit(message(encode(barrier(7))[:-3])) is None  # truncated

        assert 2 == records.undecodable

    def test_offsets_below_the_start_of_their_partition_are_left_out(self) -> None:
        records = JobRecords(JOB, starts={(BARRIERS, 3): 10})

        assert records.admit(message(encode(barrier(7)), offset=9)) is None
        assert records.admit(message(encode(barrier(8)), offset=10)) is not None

    def test_kinds_keep_only_those_records_and_skip_the_others_undecoded(self) -> None:
        records = JobRecords(JOB, kinds={"CheckpointAborted"})
        aborted = CheckpointAborted(JOB, 7, 1, "CHECKPOINT_EXPIRED", "late")

        assert records.admit(message(encode(barrier(7))[:-3])) is None  # not even decoded
        got = records.admit(message(encode(aborted)))

        assert 0 == records.undecodable
        assert got is not None and aborted == got.record

    def test_without_decoding_a_record_is_named_from_its_fingerprint(self) -> None:
        got = JobRecords(JOB, decode=False).admit(message(encode(barrier(7))))

        assert got is not None and ("CheckpointBarrier", None) == (got.name, got.record)

    def test_partition_eof_is_skipped_and_a_fatal_error_raises(self) -> None:
        records = JobRecords(JOB)

        assert records.admit(message(None, error=KafkaError(KafkaError._PARTITION_EOF))) is None
        with pytest.raises(Exception, match="fatal"):
            records.admit(message(None, error=KafkaError(KafkaError._FATAL, "fatal", fatal=True)))


class TestFencing:
    def test_a_claim_on_the_journal_voids_the_records_of_older_epochs_after_it(self) -> None:
        records = JobRecords(JOB, claims_topic=JOURNAL)

        assert records.admit(claim(2)) is None
        void = records.admit(message(encode(barrier(7)), epoch=1))
        valid = records.admit(message(encode(barrier(8)), epoch=2))

        assert void is None and valid is not None
        assert 2 == records.fence.epoch
        assert {BARRIERS: 1} == dict(records.void)

    def test_a_claim_on_another_topic_moves_nothing(self) -> None:
        records = JobRecords(JOB, claims_topic=JOURNAL)

        records.admit(message(encode(CoordinatorClaimed(3, 5, "w", 1)), key=None))

        assert 0 == records.fence.epoch
        assert records.admit(message(encode(barrier(7)), epoch=1)) is not None

    def test_a_reader_that_starts_in_the_middle_learns_the_epoch_from_valid_records(self) -> None:
        learning, from_start = JobRecords(JOB, learning=True), JobRecords(JOB)

        for records in (learning, from_start):
            records.admit(message(encode(barrier(7)), epoch=3))

        assert learning.admit(message(encode(barrier(8)), epoch=2)) is None  # a zombie's, after epoch 3
        assert from_start.admit(message(encode(barrier(8)), epoch=2)) is not None  # no claim seen: valid

    def test_a_header_less_record_is_void_once_the_partition_was_claimed(self) -> None:
        records = JobRecords(JOB, claims_topic=JOURNAL)
        records.admit(claim(1))

        assert records.admit(message(encode(barrier(7)), topic=JOURNAL)) is None
        assert {JOURNAL: 1} == dict(records.void)
