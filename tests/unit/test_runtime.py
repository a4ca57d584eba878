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
        """Every journal message of an input carries the decider's epoch and the input's
        topic:partition:offset."""
        record = JobStatusChanged(JOB, JobStatus.RUNNING, 0, 1, ("a",), CONFIG)

        outcome = coordinator.handle(TOPICS.job_status, 3, 42, JOB.encode(), encode(record), 0, epoch=5)

        assert [(("cutline.epoch", b"5"), (CAUSE_HEADER, f"{TOPICS.job_status}:3:42".encode()))] == [
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


class TestEpochs:
    """Acks and declines that answer a barrier of a superseded coordinator epoch are refused."""

    def _triggered(self, coordinator: Coordinator, epoch: int) -> CheckpointTriggered:
        record = JobStatusChanged(JOB, JobStatus.RUNNING, 0, 1, ("a", "b"), CONFIG)
        coordinator.handle(TOPICS.job_status, 0, 0, JOB.encode(), encode(record), 0, epoch=epoch)
        outcome = coordinator.tick(JOB, 10_000, epoch=epoch)
        triggered = decode(outcome.messages[0].value)
        assert isinstance(triggered, CheckpointTriggered)
        return triggered

    def _ack(self, checkpoint_id: int, task: str = "a") -> bytes:
        uri = f"file:///ckpt/{JOB}/chk-{checkpoint_id}/{task}"
        return encode(
            CheckpointAcknowledged(JOB, checkpoint_id, 1, task, 10_001, StateHandle(uri, 1, "00"), {}, {})
        )

    def test_barriers_and_journal_records_carry_the_deciders_epoch(self, coordinator: Coordinator) -> None:
        """Every message a decision publishes names the epoch it was decided in."""
        self._triggered(coordinator, epoch=3)

        outcome = coordinator.tick(JOB, 20_000, epoch=3)
        resent = coordinator.resume(30_000, epoch=4)

        assert all(("cutline.epoch", b"3") in m.headers for m in outcome.messages)
        assert [(("cutline.epoch", b"4"),)] == [m.headers for m in resent]

    def test_an_ack_of_an_older_epoch_than_the_trigger_is_a_dead_letter(
        self, coordinator: Coordinator
    ) -> None:
        """A zombie's barrier for an id the new owner triggered again is not an ack of the new one."""
        triggered = self._triggered(coordinator, epoch=2)

        outcome = coordinator.handle(
            TOPICS.acks,
            0,
            7,
            JOB.encode(),
            self._ack(triggered.checkpoint_id),
            10_001,
            headers=[("cutline.epoch", b"1")],
            epoch=2,
        )

        (letter,) = [decode(m.value) for m in outcome.messages]
        assert isinstance(letter, DeadLetter) and "STALE_EPOCH" == letter.reason
        assert {} == dict(coordinator.states[JOB].pending[triggered.checkpoint_id].acks)

    def test_an_ack_of_an_unknown_checkpoint_from_an_older_epoch_is_a_dead_letter(
        self, coordinator: Coordinator
    ) -> None:
        """An ack for a checkpoint only a superseded coordinator triggered names the reason."""
        self._triggered(coordinator, epoch=2)

        outcome = coordinator.handle(
            TOPICS.acks, 0, 7, JOB.encode(), self._ack(99), 10_001, headers=[("cutline.epoch", b"1")], epoch=2
        )

        (letter,) = [decode(m.value) for m in outcome.messages]
        assert isinstance(letter, DeadLetter) and "STALE_EPOCH" == letter.reason

    def test_an_ack_of_the_triggers_epoch_or_a_resent_barrier_counts(self, coordinator: Coordinator) -> None:
        """Acks of the trigger's epoch, or of a later owner's resent barrier, are acks."""
        triggered = self._triggered(coordinator, epoch=1)

        for task, epoch in (("a", b"1"), ("b", b"2")):
            coordinator.handle(
                TOPICS.acks,
                0,
                7,
                JOB.encode(),
                self._ack(triggered.checkpoint_id, task),
                10_001,
                headers=[("cutline.epoch", epoch)],
                epoch=2,
            )

        assert [triggered.checkpoint_id] == [c.checkpoint_id for c in coordinator.states[JOB].completed]

    def test_drop_partition_forgets_its_jobs_and_input_positions(self) -> None:
        """A revoked partition leaves nothing behind: jobs, statistics, epochs and positions."""
        coordinator = Coordinator(TOPICS, rng=random.Random(1), partitions=4)
        self._triggered(coordinator, epoch=1)
        partition = coordinator.partition_of(JOB)
        coordinator.positions[(TOPICS.acks, partition)] = 9
        coordinator.positions[(TOPICS.acks, partition + 1)] = 9

        coordinator.drop_partition(partition)

        assert ({}, {}, {}) == (coordinator.states, coordinator.stats, coordinator.trigger_epochs)
        assert {(TOPICS.acks, partition + 1): 9} == {
            tp: offset for tp, offset in coordinator.positions.items() if tp[0] == TOPICS.acks
        }
        assert not [tp for tp in coordinator.positions if tp[1] == partition]
