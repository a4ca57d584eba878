"""The journal's fencing rule (docs/design.md, "Ownership and fencing"), as every reader applies it."""

from __future__ import annotations

import pytest
from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from coordinator.core.decider import fold_jobs
from events.kafka.log import LogMessage, fenced_journal, log_message
from events.wire.codec import encode
from events.wire.fencing import (
    VOID_EPOCH,
    Fence,
    HeaderDict,
    Headers,
    HeaderValue,
    epoch_header,
    epoch_of,
    epoch_problem,
    header_epoch,
)
from events.wire.records import (
    CheckpointConfig,
    CoordinatorClaimed,
    JobStatus,
    SchedulerStarted,
    SchedulerStopped,
)


class TestHeaderEpoch:
    """One function reads a record's epoch for every reader (docs/design.md, "Ownership and fencing")."""

    @pytest.mark.parametrize("headers", [None, [], {}, [("other", b"7")], {"other": b"7"}, HeaderDict()])
    def test_no_epoch_header_is_epoch_0(self, headers: Headers) -> None:
        """Given a record without a ``cutline.epoch`` header, when it is read, then it has no
        header epoch and belongs to epoch 0."""
        assert (None, 0, None) == (header_epoch(headers), epoch_of(headers), epoch_problem(headers))

    @pytest.mark.parametrize(
        ("headers", "epoch"),
        [
            ([("cutline.epoch", b"7")], 7),  # confluent-kafka and aiokafka: a list of pairs
            ((("cutline.epoch", b"7"),), 7),  # aiokafka: a tuple of pairs
            ({"cutline.epoch": b"12"}, 12),  # a mapping by name
            ([("cutline.epoch", "9")], 9),  # a str value
            ({"cutline.epoch": "9"}, 9),
            ([("cutline.epoch", bytearray(b"5"))], 5),
            ([("cutline.epoch", memoryview(b"5"))], 5),
            ([("cutline.epoch", b"0")], 0),
            ([("cutline.epoch", b"007")], 7),
            ([("cutline.epoch", b"9" * 18)], 10**18 - 1),
            ([("other", b"x"), ("cutline.epoch", b"3"), ("cutline.cause", b"y")], 3),
            (HeaderDict([("cutline.epoch", b"4")]), 4),
        ],
    )
    def test_one_well_formed_header_names_the_epoch(self, headers: Headers, epoch: int) -> None:
        """Given exactly one header of ASCII decimal digits, when it is read, then its value is
        the record's epoch."""
        assert (epoch, epoch, None) == (header_epoch(headers), epoch_of(headers), epoch_problem(headers))

    @pytest.mark.parametrize(
        "headers",
        [
            [("cutline.epoch", b"3"), ("cutline.epoch", b"3")],  # two equal
            [("cutline.epoch", b"3"), ("cutline.epoch", b"4")],  # two different
            [("cutline.epoch", b"4"), ("other", b"x"), ("cutline.epoch", b"3")],
            [("cutline.epoch", b"3"), ("cutline.epoch", None)],
            [("cutline.epoch", "3"), ("cutline.epoch", b"3")],
            HeaderDict([("cutline.epoch", b"3"), ("cutline.epoch", b"4")]),
        ],
    )
    def test_two_epoch_headers_make_the_record_void(self, headers: Headers) -> None:
        """Given two or more ``cutline.epoch`` headers, equal or not, when the record is read,
        then it is void: which epoch its writer meant is unknowable."""
        assert (VOID_EPOCH, VOID_EPOCH) == (header_epoch(headers), epoch_of(headers))
        assert "cutline.epoch headers" in (epoch_problem(headers) or "")

    @pytest.mark.parametrize(
        "value",
        [
            b"",
            "",
            None,
            b"-1",
            b"+1",
            b" 1",
            b"1 ",
            b"1_000",
            b"0x1",
            b"1.0",
            b"two",
            "²",  # str.isdigit says yes, int() says no
            "²".encode(),
            "٣",  # int() reads it as 3
            "٣".encode(),
            "３",  # a full-width three
            b"1" * 19,  # longer than a long's digits
            b"1" * 4000,
            memoryview(b"x5"),
        ],
    )
    def test_an_empty_or_malformed_header_makes_the_record_void(self, value: HeaderValue) -> None:
        """Given one header whose value is not 1 to 18 ASCII decimal digits, when the record is
        read, then it is void, as a list of pairs and as a mapping."""
        for headers in ([("cutline.epoch", value)], {"cutline.epoch": value}):
            assert (VOID_EPOCH, VOID_EPOCH) == (header_epoch(headers), epoch_of(headers))
            assert "cutline.epoch header" in (epoch_problem(headers) or "")

    def test_a_header_dict_keeps_what_a_dict_cannot(self) -> None:
        """A HeaderDict reads as the last value by name, yet remembers a doubled or null header."""
        doubled = HeaderDict([("cutline.epoch", b"3"), ("cutline.epoch", b"4"), ("x", None)])

        assert ({"cutline.epoch": b"4"}, VOID_EPOCH) == (dict(doubled), epoch_of(doubled))
        assert VOID_EPOCH == epoch_of(HeaderDict([("cutline.epoch", None)]))

    def test_round_trip(self) -> None:
        """What a writer puts is what a reader reads."""
        assert 42 == epoch_of([epoch_header(42)])

    def test_the_problem_says_why(self) -> None:
        """The reason a record is void names the headers."""
        assert "2 cutline.epoch headers (b'3', b'4')" in (
            epoch_problem([("cutline.epoch", b"3"), ("cutline.epoch", b"4")]) or ""
        )
        assert "an empty cutline.epoch header" == epoch_problem([("cutline.epoch", b"")])
        assert "malformed cutline.epoch header b'x'" in (epoch_problem([("cutline.epoch", b"x")]) or "")


class TestFence:
    def test_a_higher_claim_is_valid_and_voids_lower_records(self) -> None:
        """After claim 2, records of epoch 1 are void and records of epoch 2 count."""
        valid, fence = Fence(1).claim(2)

        assert valid
        assert (False, True) == (fence.admit(1)[0], fence.admit(2)[0])

    def test_a_claim_not_higher_than_the_current_epoch_is_void(self) -> None:
        """Two workers claiming the same epoch: the second claim in the log is void."""
        assert (False, Fence(3)) == Fence(3).claim(3)

    @pytest.mark.parametrize("fence", [Fence(), Fence(3), Fence(learning=True), Fence(2, learning=True)])
    def test_a_void_epoch_is_void_under_every_fence(self, fence: Fence) -> None:
        """A record that cannot say its epoch is void, in a never-claimed partition too, and
        moves no fence."""
        assert (False, fence) == fence.admit(VOID_EPOCH)

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

    def test_a_record_with_an_unreadable_epoch_is_void_in_a_never_claimed_partition(self) -> None:
        """Given no claim at all, a record whose epoch header is malformed is void; one
        without the header (epoch 0) counts."""
        stopped = SchedulerStopped("job", 1, 0, JobStatus.CANCELED)
        messages = [
            LogMessage("j", 0, 0, 0, b"job", encode(stopped), HeaderDict([("cutline.epoch", b"")])),
            LogMessage("j", 0, 1, 0, b"job", encode(stopped), HeaderDict()),
        ]
        void: list[tuple[int, int]] = []

        kept = [
            m.offset
            for _, m in fenced_journal(
                messages, pytest.fail, on_void=lambda m, _r, epoch, _c: void.append((m.offset, epoch))
            )
        ]

        assert ([1], [(0, VOID_EPOCH)]) == (kept, void)

    def test_a_claim_with_two_epoch_headers_is_void(self) -> None:
        """A claim whose epoch header is doubled does not move the fence."""
        stopped = SchedulerStopped("job", 1, 0, JobStatus.CANCELED)
        doubled = HeaderDict([epoch_header(5), epoch_header(5)])
        messages = [
            LogMessage("j", 0, 0, 0, None, encode(CoordinatorClaimed(0, 5, "w", 0)), doubled),
            _message(1, stopped, 1),
        ]

        kept = [m.offset for _, m in fenced_journal(messages, pytest.fail, on_void=lambda *_: None)]

        assert [1] == kept


class TestFoldVoidsDoubledHeaders:
    """The coordinator's fold reads the journal through log_message and fenced_journal."""

    def test_a_doubly_headed_record_is_void_in_the_fold(self) -> None:
        """Given a claim of epoch 1 and then a record with two epoch headers (1 and 2), when the
        partition is folded as the coordinator folds it, then the record is void and the job's
        state does not have it."""
        running = SchedulerStarted("job", 1, 0, ("a",), CheckpointConfig(1_000, "file:///c"))
        stopped = SchedulerStopped("job", 1, 0, JobStatus.CANCELED)
        raw = [
            Message(topic="j", partition=0, offset=0, value=encode(CoordinatorClaimed(0, 1, "w", 0)),
                    headers=[epoch_header(1)], timestamp=(1, 0)),
            Message(topic="j", partition=0, offset=1, key=b"job", value=encode(running),
                    headers=[epoch_header(1)], timestamp=(1, 0)),
            Message(topic="j", partition=0, offset=2, key=b"job", value=encode(stopped),
                    headers=[epoch_header(1), epoch_header(2)], timestamp=(1, 0)),
        ]  # fmt: skip
        void: list[int] = []

        records = [
            r
            for r, _ in fenced_journal(
                (log_message(m) for m in raw), pytest.fail, on_void=lambda m, *_: void.append(m.offset)
            )
            if not isinstance(r, CoordinatorClaimed)
        ]
        states = fold_jobs(records)

        assert ([2], [running]) == (void, records)
        assert states["job"].scheduler is not None
