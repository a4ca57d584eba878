"""The one barrier-to-reply flow of the task side (events.task.reply): a barrier and the outcome of a
task's snapshot in, the exact ack or decline out. No broker, no files, no clock."""

from __future__ import annotations

import hashlib

import pytest

from events.task.reply import Answer, Failed, Snapshotted, answer, barrier_epoch, failure, fits_inline
from events.wire.fencing import epoch_header
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointDeclined,
    CheckpointKind,
    StateHandle,
)
from events.wire.topics import Topics

LOCATION = "file:///data/checkpoints/wc/chk-7"
BARRIER = CheckpointBarrier("wc", 7, 2, CheckpointKind.CHECKPOINT, 1, LOCATION, inline_limit_bytes=4)
DATA = b'{"a":1}'
NOW = 1_700_000_000_000


def _ack(uri: str, inline: bool = False) -> CheckpointAcknowledged:
    handle = StateHandle(uri, len(DATA), hashlib.sha256(DATA).hexdigest(), DATA if inline else None)
    return CheckpointAcknowledged("wc", 7, 2, "words-1", NOW, handle, {"words:1": 42}, {"bytes": 7})


def _declined(reason: str, message: str) -> CheckpointDeclined:
    return CheckpointDeclined("wc", 7, 2, "words-1", NOW, reason, message)


class TestAcks:
    def test_a_written_snapshot_is_acknowledged_with_its_handle_and_cut(self) -> None:
        """Given a snapshot written in the barrier's location, the ack names the barrier's job, id and
        attempt, the handle (size, sha256) and the cut's offsets."""
        uri = f"{LOCATION}/words-1"

        answered = answer(BARRIER, 3, "words-1", Snapshotted(uri, DATA, {"words:1": 42}, {"bytes": 7}), NOW)

        assert Answer(_ack(uri), 3) == answered

    def test_inline_state_rides_in_the_handle(self) -> None:
        """Given a small snapshot and a barrier allowing it inline, the ack carries the bytes."""
        barrier = CheckpointBarrier("wc", 7, 2, CheckpointKind.CHECKPOINT, 1, LOCATION, inline_limit_bytes=7)
        uri = f"{LOCATION}/words-1"
        snapshot = Snapshotted(uri, DATA, {"words:1": 42}, {"bytes": 7}, inline=True)

        assert _ack(uri, inline=True) == answer(barrier, 0, "words-1", snapshot, NOW).reply

    def test_an_answer_goes_to_acks_or_declines_with_the_barriers_epoch(self) -> None:
        topics = Topics("t.")
        ack = Answer(_ack(f"{LOCATION}/words-1"), 5)
        decline = Answer(_declined("IO_EXCEPTION", "x"), None)

        assert ("t.acks", [epoch_header(5)]) == (ack.topic(topics), ack.headers)
        assert ("t.declines", []) == (decline.topic(topics), decline.headers)


class TestDeclines:
    def test_a_failure_is_declined_with_its_reason(self) -> None:
        failed = Failed("TASK_CHECKPOINT_FAILURE", "no state of words[1]")

        assert Answer(_declined("TASK_CHECKPOINT_FAILURE", "no state of words[1]"), None) == answer(
            BARRIER, None, "words-1", failed, NOW
        )

    @pytest.mark.parametrize(
        ("exc", "declined"),
        [
            (NotADirectoryError("chk-7"), Failed("IO_EXCEPTION", "NotADirectoryError: chk-7")),
            (RuntimeError("boom"), Failed("TASK_CHECKPOINT_FAILURE", "RuntimeError: boom")),
        ],
    )
    def test_an_exception_becomes_a_failure_with_flinks_reason(
        self, exc: Exception, declined: Failed
    ) -> None:
        """The storage failing is IO_EXCEPTION; anything else TASK_CHECKPOINT_FAILURE."""
        assert declined == failure(exc)

    @pytest.mark.parametrize(
        "uri",
        [
            "file:///data/checkpoints/wc/chk-8/words-1",
            f"{LOCATION}/../chk-8/words-1",
            LOCATION,
            "s3://bucket/data/checkpoints/wc/chk-7/words-1",
        ],
    )
    def test_a_snapshot_outside_the_barriers_location_is_declined(self, uri: str) -> None:
        """The location rule: the coordinator refuses a handle not strictly inside the checkpoint's
        location, so the task declines it first, saying so."""
        reply = answer(BARRIER, 0, "words-1", Snapshotted(uri, DATA, {"words:1": 42}), NOW).reply

        assert isinstance(reply, CheckpointDeclined) and "TASK_CHECKPOINT_FAILURE" == reply.reason
        assert "is not inside the checkpoint location" in reply.message

    def test_a_cut_with_a_malformed_offsets_key_is_declined(self) -> None:
        snapshot = Snapshotted(f"{LOCATION}/words-1", DATA, {"words:-1": 42})

        reply = answer(BARRIER, 0, "words-1", snapshot, NOW).reply

        assert isinstance(reply, CheckpointDeclined) and "TASK_CHECKPOINT_FAILURE" == reply.reason
        assert reply.message.startswith("ValueError: ") and "-1" in reply.message

    def test_inline_state_over_the_barriers_limit_is_declined(self) -> None:
        snapshot = Snapshotted(f"{LOCATION}/words-1", DATA, {"words:1": 42}, inline=True)

        reply = answer(BARRIER, 0, "words-1", snapshot, NOW).reply

        assert (
            _declined(
                "TASK_CHECKPOINT_FAILURE",
                "7 bytes of inline state, but the barrier allows 4: write the snapshot to its uri",
            )
            == reply
        )


class TestChecks:
    @pytest.mark.parametrize(
        ("epoch", "named"), [(0, 0), (7, 7), (-1, None), (True, None), ("3", None), (None, None)]
    )
    def test_only_a_non_negative_int_is_an_epoch(self, epoch: object, named: int | None) -> None:
        assert named == barrier_epoch(epoch)

    @pytest.mark.parametrize(
        ("size", "limit", "inline"), [(4, 4, True), (5, 4, False), (0, 0, False), (1, 0, False)]
    )
    def test_state_fits_inline_up_to_the_barriers_limit(self, size: int, limit: int, inline: bool) -> None:
        barrier = CheckpointBarrier(
            "wc", 7, 2, CheckpointKind.CHECKPOINT, 1, LOCATION, inline_limit_bytes=limit
        )

        assert inline is fits_inline(b"x" * size, barrier)
