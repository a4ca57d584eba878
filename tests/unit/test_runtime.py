"""The coordinator's shell logic without a transport: bytes in, messages out."""

from __future__ import annotations

import random

import pytest

from coordinator.decider import fold_jobs
from coordinator.service.runtime import CAUSE_HEADER, Coordinator, parse_cause
from events.codec import decode, encode
from events.records import (
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointConfig,
    CheckpointTriggered,
    DeadLetter,
    JobStatus,
    JobStatusChanged,
    JournalEvent,
    StateHandle,
)
from events.topics import Topics

TOPICS = Topics("t.")
JOB = "job"
CONFIG = CheckpointConfig(interval_ms=100, location="file:///ckpt")


@pytest.fixture(name="coordinator")
def _coordinator() -> Coordinator:
    return Coordinator(TOPICS, rng=random.Random(1))


def running(coordinator: Coordinator, now: int = 0) -> None:
    record = JobStatusChanged(JOB, JobStatus.RUNNING, now, 1, ("a", "b"), CONFIG)
    coordinator.handle(TOPICS.job_status, 0, 0, JOB.encode(), encode(record), now)


class TestMessages:
    def test_a_trigger_journals_first_then_sends_the_barrier(self, coordinator: Coordinator) -> None:
        """A due tick journals CheckpointTriggered (with its cause) and then sends the barrier."""
        running(coordinator)

        outcome = coordinator.tick(JOB, 10_000)

        assert [TOPICS.checkpoints, TOPICS.barriers] == [m.topic for m in outcome.messages]
        assert outcome.has_barriers
        triggered, barrier = (decode(m.value) for m in outcome.messages)
        assert isinstance(triggered, CheckpointTriggered) and isinstance(barrier, CheckpointBarrier)
        assert (triggered.checkpoint_id, triggered.location) == (barrier.checkpoint_id, barrier.location)
        assert all(m.key == JOB.encode() for m in outcome.messages)

    def test_journal_messages_name_their_cause(self, coordinator: Coordinator) -> None:
        """Every journal message of an input carries the input's topic:partition:offset."""
        record = JobStatusChanged(JOB, JobStatus.RUNNING, 0, 1, ("a",), CONFIG)

        outcome = coordinator.handle(TOPICS.job_status, 3, 42, JOB.encode(), encode(record), 0)

        assert [((CAUSE_HEADER, f"{TOPICS.job_status}:3:42".encode()),)] == [
            m.headers for m in outcome.messages
        ]

    @pytest.mark.parametrize(
        ("topic", "key", "value", "reason"),
        [
            (TOPICS.acks, JOB.encode(), b"\x00garbage", "BAD_MAGIC"),
            (TOPICS.acks, JOB.encode(), None, "EMPTY_MESSAGE"),
            (TOPICS.acks, b"other", encode(CheckpointAcknowledged(JOB, 1, 1, "a", 0)), "KEY_MISMATCH"),
            (TOPICS.requests, JOB.encode(), encode(CheckpointAcknowledged(JOB, 1, 1, "a", 0)), "WRONG_TOPIC"),
            (TOPICS.acks, b"x", encode(CheckpointAcknowledged("x", 1, 1, "a", 0)), "UNKNOWN_JOB"),
            (
                TOPICS.acks,
                JOB.encode(),
                encode(CheckpointAcknowledged(JOB, 9, 1, "a", 0)),
                "UNKNOWN_CHECKPOINT",
            ),
        ],
    )
    def test_bad_input_becomes_a_dead_letter(
        self, coordinator: Coordinator, topic: str, key: bytes, value: bytes | None, reason: str
    ) -> None:
        """Bad input yields exactly one dead letter with its reason and the original bytes, nothing else."""
        running(coordinator)
        before = dict(coordinator.states)

        outcome = coordinator.handle(topic, 1, 7, key, value, 5)

        assert [TOPICS.dead_letters] == [m.topic for m in outcome.messages]
        letter = decode(outcome.messages[0].value)
        assert isinstance(letter, DeadLetter)
        assert (reason, topic, 1, 7, key, value) == (
            letter.reason,
            letter.topic,
            letter.partition,
            letter.offset,
            letter.key,
            letter.value,
        )
        assert before == coordinator.states


class TestRecovery:
    def test_recovering_from_the_journal_gives_the_same_states_and_positions(self) -> None:
        """A coordinator that folds another's journal holds the same states and knows which inputs
        it already decided."""
        live = Coordinator(TOPICS, rng=random.Random(1))
        journal: list[tuple[JournalEvent, str | None]] = []
        status = JobStatusChanged(JOB, JobStatus.RUNNING, 0, 1, ("a", "b"), CONFIG)
        outcome = live.handle(TOPICS.job_status, 0, 5, JOB.encode(), encode(status), 0)
        journal += [(e, f"{TOPICS.job_status}:0:5") for e in outcome.journal]
        journal += [(e, None) for e in live.tick(JOB, 10_000).journal]
        ack = CheckpointAcknowledged(JOB, 1, 1, "a", 0, StateHandle("file:///ckpt/job/chk-1/a", 1, "x"))
        outcome = live.handle(TOPICS.acks, 2, 17, JOB.encode(), encode(ack), 10_001)
        journal += [(e, f"{TOPICS.acks}:2:17") for e in outcome.journal]
        restarted = Coordinator(TOPICS)

        assert len(journal) == restarted.recover(journal)

        assert live.states == restarted.states
        assert fold_jobs(e for e, _ in journal) == restarted.states
        assert restarted.already_decided(TOPICS.acks, 2, 17)
        assert restarted.already_decided(TOPICS.job_status, 0, 5)
        assert not restarted.already_decided(TOPICS.acks, 2, 18)
        assert not restarted.already_decided(TOPICS.acks, 1, 0)

    def test_resume_resends_the_barriers_of_pending_checkpoints(self, coordinator: Coordinator) -> None:
        """After recovery, every pending checkpoint's barrier goes out again."""
        running(coordinator)
        coordinator.tick(JOB, 10_000)

        barriers = [decode(m.value) for m in coordinator.resume(20_000)]

        assert [1] == [b.checkpoint_id for b in barriers if isinstance(b, CheckpointBarrier)]


class TestCause:
    @pytest.mark.parametrize(
        ("text", "parsed"),
        [
            ("cutline.acks:3:42", ("cutline.acks", 3, 42)),
            (b"a:b:c:1:2", ("a:b:c", 1, 2)),
            ("nonsense", None),
            (None, None),
        ],
    )
    def test_parse_cause(self, text: str | bytes | None, parsed: tuple[str, int, int] | None) -> None:
        """topic:partition:offset parses even when the topic has colons; anything else is None."""
        assert parsed == parse_cause(text)
