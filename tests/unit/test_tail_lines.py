"""``cutline tail``'s lines: a record carrying inline state has its bytes counted on the line, and
given whole (base64) in ``--json``; a journal record shows its position once and says what happened."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from coordinator.replay.timeline import describe, describe_record, record_json, timeline_line
from events.wire.codec import Codec
from events.wire.records import (
    JOURNAL_RECORDS,
    CheckpointAcknowledged,
    CheckpointCompleted,
    CheckpointKind,
    JobFailedPermanently,
    JobHeartbeatRecorded,
    JobRestartScheduled,
    StateHandle,
)

CODEC = Codec()
VECTORS = Path(__file__).resolve().parents[1] / "vectors"
STATE = bytes(range(256)) * 80  # 20 KiB, the size Flink's default memory threshold allows
ACK = CheckpointAcknowledged(
    "job-1",
    7,
    1,
    "t0",
    1_767_225_600_000,
    StateHandle("file:///c/job-1/chk-7/t0", len(STATE), hashlib.sha256(STATE).hexdigest(), STATE),
    {"in:0": 42},
)


def test_a_line_shows_how_many_bytes_ride_inline_not_the_bytes() -> None:
    line = describe_record(CODEC, 0, 12, CODEC.encode(ACK)).plain

    assert "'inline': <20480 bytes>" in line
    assert len(line) < 600


def test_json_carries_the_inline_bytes_whole() -> None:
    body = record_json(CODEC, "cutline.acks", 0, 12, b"job-1", CODEC.encode(ACK))

    record = body["record"]
    assert isinstance(record, dict)
    assert STATE == base64.b64decode(record["state"]["inline"])


class TestVoidEpochs:
    """``cutline tail`` marks a record whose epoch cannot be read as void, and says why."""

    def test_a_line_with_two_epoch_headers_is_marked_void(self) -> None:
        """Given two ``cutline.epoch`` headers, the line says VOID and that there are two."""
        line = describe_record(
            CODEC, 0, 12, CODEC.encode(ACK), [("cutline.epoch", b"1"), ("cutline.epoch", b"2")]
        ).plain

        assert "VOID: 2 cutline.epoch headers (b'1', b'2')" in line

    def test_a_line_with_a_malformed_epoch_is_marked_void(self) -> None:
        """Given an epoch header that is not ASCII digits, the line says VOID and why."""
        line = describe_record(CODEC, 0, 12, CODEC.encode(ACK), [("cutline.epoch", "²".encode())]).plain

        assert "VOID: a malformed cutline.epoch header" in line

    def test_a_line_with_one_epoch_header_is_not_marked(self) -> None:
        """A well-formed epoch, or none, marks nothing."""
        for headers in ([("cutline.epoch", b"3")], [], None):
            assert "VOID" not in describe_record(CODEC, 0, 12, CODEC.encode(ACK), headers).plain

    def test_json_says_why_a_record_is_void(self) -> None:
        """``--json`` carries ``void`` with the reason, only for a void record."""
        void = record_json(CODEC, "t", 0, 12, b"job-1", CODEC.encode(ACK), [("cutline.epoch", b"")])
        valid = record_json(CODEC, "t", 0, 12, b"job-1", CODEC.encode(ACK), [("cutline.epoch", b"1")])

        assert ("an empty cutline.epoch header", None) == (void["void"], valid.get("void"))


class TestJournalLines:
    """``cutline tail``'s line of a journal record: its position once, and what happened."""

    COMPLETED = CheckpointCompleted(
        "job-1", 7, CheckpointKind.CHECKPOINT, 1_767_225_600_000, 12, {}, 0, {}, 1, "file:///c/job-1/chk-7"
    )

    def test_the_position_is_the_message_s_only(self) -> None:
        """The line starts with the message's partition:offset and shows no second position (a
        stray ``-1`` used to follow the time)."""
        line = describe_record(CODEC, 0, 12, CODEC.encode(self.COMPLETED)).plain

        assert line.startswith("0:12 ")
        assert " -1 " not in line
        assert "2026-01-01T00:00:00.000Z job-1 CheckpointCompleted" in line

    def test_replay_keeps_the_journal_position(self) -> None:
        """``cutline replay``'s timeline gives the position: partition:offset, or the offset alone in
        a journal file (no partition)."""
        assert "   3:41 job-1" in timeline_line(self.COMPLETED, 41, 3).plain
        assert "      41 job-1" in timeline_line(self.COMPLETED, 41).plain

    def test_a_restart_says_which_attempt_when_what_it_restores_and_why(self) -> None:
        scheduled = JobRestartScheduled(
            "job-1", 2, 1_767_225_600_000, 1_000, "the driver exited with code -9", 1, 0, 3, "file:///c/chk-3"
        )

        assert describe(scheduled) == (
            "attempt 2 in 1000 ms, restoring #3 at file:///c/chk-3 (restart 1) after: "
            "the driver exited with code -9"
        )

    def test_a_restart_of_a_job_without_a_checkpoint_says_it_restores_nothing(self) -> None:
        scheduled = JobRestartScheduled("job-1", 2, 1_767_225_600_000, 1_500, "TASK_FAILURE", 2, 1_500)

        assert describe(scheduled) == (
            "attempt 2 in 1500 ms, restoring nothing (no completed checkpoint) "
            "(restart 2, backoff 1500 ms) after: TASK_FAILURE"
        )

    def test_a_permanent_failure_says_why_the_strategy_gave_up(self) -> None:
        failed = JobFailedPermanently(
            "job-1", 3, 1_767_225_600_000, "fixed-delay: 3 attempts used", "the driver exited with code 1"
        )

        assert describe(failed) == (
            "attempt 3 failed for good: fixed-delay: 3 attempts used; "
            "it failed with the driver exited with code 1"
        )

    def test_a_heartbeat_says_when_the_next_is_due(self) -> None:
        beat = JobHeartbeatRecorded("job-1", 2, 1_767_225_600_000, 1_767_225_650_000)

        assert describe(beat) == "attempt 2, next heartbeat due +50000 ms"

    @pytest.mark.parametrize("name", [kind.__name__ for kind in JOURNAL_RECORDS])
    def test_every_journal_record_has_a_description(self, name: str) -> None:
        """Each journal record of the newest golden vectors gets a line with words after its name."""
        newest = max(VECTORS.glob("v*"), key=lambda path: int(path.name[1:]))
        record = CODEC.decode((newest / f"{name}.bin").read_bytes())

        assert describe(record).strip()
        assert describe_record(CODEC, 0, 1, CODEC.encode(record)).plain.rstrip().split(name, 1)[1].strip()
