"""The journal's fencing rule (DESIGN §4a), as every reader applies it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.codec import encode
from events.fencing import Fence, epoch_header, epoch_of
from events.log import LogMessage, fenced_journal
from events.records import CoordinatorClaimed, JobStatus, SchedulerStopped


class TestEpochOf:
    @pytest.mark.parametrize(
        ("headers", "epoch"),
        [
            (None, 0),
            ({}, 0),
            ({"other": b"7"}, 0),
            ({"cutline.epoch": b"7"}, 7),
            ([("cutline.epoch", b"12")], 12),
            ({"cutline.epoch": b"-1"}, -1),
            ({"cutline.epoch": b"\xd9\xa3"}, -1),
            ({"cutline.epoch": b"\xc2\xb2"}, -1),
            ({"cutline.epoch": b""}, -1),
            ({"cutline.epoch": b"1" * 40}, -1),
            ({"cutline.epoch": None}, -1),
            ({"cutline.epoch": "9"}, 9),
            ([("cutline.epoch", bytearray(b"5"))], 5),
            ([("cutline.epoch", memoryview(b"x5"))], -1),
            ([("cutline.epoch", b"3"), ("cutline.epoch", b"4")], 3),
        ],
    )
    def test_reads_the_header(self, headers: object, epoch: int) -> None:
        """No header is epoch 0; anything but plain ASCII digits is malformed (-1, lower than any claim)."""
        assert epoch == epoch_of(headers)  # type: ignore[arg-type]

    def test_round_trip(self) -> None:
        """What a writer puts is what a reader reads."""
        assert 42 == epoch_of([epoch_header(42)])


class TestFence:
    def test_a_higher_claim_is_valid_and_voids_lower_records(self) -> None:
        """After claim 2, records of epoch 1 are void and records of epoch 2 count."""
        valid, fence = Fence(1).claim(2)

        assert valid
        assert (False, True) == (fence.admit(1)[0], fence.admit(2)[0])

    def test_a_claim_not_higher_than_the_current_epoch_is_void(self) -> None:
        """Two workers claiming the same epoch: the second claim in the log is void."""
        assert (False, Fence(3)) == Fence(3).claim(3)

    def test_a_reader_from_the_middle_learns_the_epoch_from_valid_records(self) -> None:
        """A tail reader that missed the claim takes a newer record's epoch as proof of it."""
        _, fence = Fence(1, learning=True).admit(3)

        assert (3, False) == (fence.epoch, fence.admit(2)[0])

    @given(st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=5)), max_size=40))
    def test_no_valid_record_is_below_the_latest_valid_claim(self, records: list[tuple[bool, int]]) -> None:
        """Whatever is appended, valid claims strictly increase and no valid record has an epoch
        below the latest valid claim before it."""
        fence = Fence()
        claims: list[int] = []
        for is_claim, epoch in records:
            valid, fence = fence.claim(epoch) if is_claim else fence.admit(epoch)
            if valid and is_claim:
                claims.append(epoch)
            if valid and claims:
                assert epoch >= claims[-1]
        assert sorted(set(claims)) == claims


def _message(offset: int, record: object, epoch: int | None) -> LogMessage:
    headers = {} if epoch is None else dict([epoch_header(epoch)])
    return LogMessage("j", 0, offset, 0, b"job", encode(record), headers)  # type: ignore[arg-type]


class TestFencedJournal:
    def test_a_zombies_records_after_a_newer_claim_are_void(self) -> None:
        """Given claims 1 and 2, the epoch-1 writer's records after claim 2 are left out."""
        stopped = SchedulerStopped("job", 1, 0, JobStatus.CANCELED)
        messages = [
            _message(0, CoordinatorClaimed(0, 1, "w1", 0), 1),
            _message(1, stopped, 1),
            _message(2, CoordinatorClaimed(0, 2, "w2", 0), 2),
            _message(3, stopped, 1),
            _message(4, CoordinatorClaimed(0, 2, "w1", 0), 2),
            _message(5, stopped, 2),
            _message(6, stopped, None),
        ]
        void: list[int] = []

        kept = [
            m.offset
            for _, m in fenced_journal(messages, pytest.fail, on_void=lambda m, *_: void.append(m.offset))
        ]

        assert ([0, 1, 2, 5], [3, 4, 6]) == (kept, void)
