"""One log line per key and interval (coordinator/service/log_throttle.py), and the coordinator logging a
flood
of dead letters through it (coordinator/service/runtime.py, throttled_log.py): pure logic, no Kafka."""

from __future__ import annotations

import logging

import pytest

from coordinator.service.log_throttle import Admission, HeldBack, LogThrottle
from coordinator.service.runtime import Coordinator
from coordinator.service.throttled_log import ThrottledLog
from events.wire.codec import encode
from events.wire.records import CheckpointAcknowledged
from events.wire.topics import Topics

TOPICS = Topics("t.")


def admit_all(throttle: LogThrottle, events: list[tuple[str, int]]) -> tuple[LogThrottle, list[Admission]]:
    admissions = []
    for key, now_ms in events:
        throttle, admission = throttle.admit(key, now_ms)
        admissions.append(admission)
    return throttle, admissions


class TestLogThrottle:
    def test_the_first_event_of_a_key_is_logged_and_the_rest_of_its_interval_only_counted(self) -> None:
        _, admissions = admit_all(LogThrottle(10_000), [("A", 0), ("A", 1), ("A", 9_999)])

        assert [True, False, False] == [a.log for a in admissions]
        assert [None, None, None] == [a.ended for a in admissions]

    def test_the_next_event_after_the_interval_is_logged_after_the_count_held_back(self) -> None:
        _, admissions = admit_all(LogThrottle(10_000), [("A", 0), ("A", 5), ("A", 6), ("A", 10_000)])

        assert Admission(log=True, ended=HeldBack("A", 2, 10_000)) == admissions[-1]

    def test_keys_have_windows_of_their_own(self) -> None:
        _, admissions = admit_all(LogThrottle(10_000), [("A", 0), ("B", 1), ("A", 2), ("B", 3)])

        assert [True, True, False, False] == [a.log for a in admissions]

    def test_a_window_that_held_nothing_back_ends_with_no_count(self) -> None:
        _, admissions = admit_all(LogThrottle(10_000), [("A", 0), ("A", 20_000)])

        assert Admission(log=True) == admissions[-1]

    def test_a_clock_that_went_back_opens_a_new_window(self) -> None:
        _, admissions = admit_all(LogThrottle(10_000), [("A", 50_000), ("A", 50_001), ("A", 1_000)])

        assert Admission(log=True, ended=HeldBack("A", 1, 10_000)) == admissions[-1]

    def test_due_gives_the_counts_of_ended_windows_and_forgets_them(self) -> None:
        throttle, _ = admit_all(
            LogThrottle(10_000), [("A", 0), ("A", 1), ("B", 2), ("C", 9_000), ("C", 9_001)]
        )

        throttle, ended = throttle.due(10_002)

        assert [HeldBack("A", 1, 10_000)] == ended  # B held nothing back; C's window is still open
        assert ["C"] == list(throttle.windows)
        assert Admission(log=True) == throttle.admit("A", 10_003)[1]  # A's count was given once

    def test_the_count_reads_as_a_sentence(self) -> None:
        line = HeldBack("UNKNOWN_TASK", 9_999, 10_000).line("dead letters")

        assert "... and 9,999 more dead letters (UNKNOWN_TASK) in the 10 s after the last one logged" == line


def test_a_throttled_log_writes_the_count_then_the_line_and_flushes_on_a_timer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("test.throttled")
    log = ThrottledLog(logger, "dead letters", interval_ms=10_000)

    with caplog.at_level(logging.WARNING, logger="test.throttled"):
        for now in range(0, 5_000, 1_000):
            log.warning("R", now, "letter %d", now)
        log.flush(9_999)
        log.flush(10_000)
        log.flush(20_000)

    assert ["letter 0", "... and 4 more dead letters (R) in the 10 s after the last one logged"] == [
        r.getMessage() for r in caplog.records
    ]


def test_a_flood_of_10_000_dead_letters_logs_one_line_and_writes_every_letter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Given 10,000 acks of an unknown job within 10 s, the coordinator writes 10,000 dead letters
    and counts them, but logs one line; the first letter after the interval logs the count of the
    9,999 held back, and a letter of another reason is logged at once."""
    coordinator = Coordinator(TOPICS)
    ack = encode(CheckpointAcknowledged("ghost", 1, 1, "t", 0))

    with caplog.at_level(logging.WARNING, logger="cutline.coordinator"):
        letters = sum(
            len(coordinator.handle(TOPICS.acks, 0, offset, b"ghost", ack, offset).messages)
            for offset in range(10_000)
        )
        flood = [r.getMessage() for r in caplog.records]
        caplog.clear()
        coordinator.handle(TOPICS.acks, 0, 10_000, b"ghost", ack, 10_000)
        coordinator.handle(TOPICS.acks, 0, 10_001, None, ack, 10_001)
        after = [r.getMessage() for r in caplog.records]

    assert (10_000, 10_001) == (letters, coordinator.dead_letters["UNKNOWN_JOB"])
    assert 1 == len(flood) and "dead letter from t.acks[0]@0: UNKNOWN_JOB" in flood[0]
    assert 3 == len(after)
    assert "... and 9,999 more dead letters (UNKNOWN_JOB) in the 10 s after the last one logged" == after[0]
    assert after[1].startswith("dead letter from t.acks[0]@10000: UNKNOWN_JOB: ")
    assert after[2].startswith("dead letter from t.acks[0]@10001: MISSING_KEY: ")
