"""The coordinator's shell logic without a transport: bytes in, messages out."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.core import fold_state, inbox
from coordinator.core.commands import AcknowledgeCheckpoint
from coordinator.core.decider import InputRejected, Rejection, decide_steps, due_at, fold_jobs, trusted_roots
from coordinator.core.links import Below, questions
from coordinator.service import runtime
from coordinator.service.runtime import Coordinator, Outcome, parse_cause
from events.wire.codec import decode, encode
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointKind,
    CheckpointRequested,
    CheckpointTriggered,
    DeadLetter,
    JobStatus,
    JobStatusChanged,
    JournalEvent,
    StateHandle,
    TaskAcknowledged,
)
from events.wire.sizes import TopicLimits
from events.wire.topics import Topics
from events.wire.vocabulary import CAUSE_HEADER

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

    def test_every_journal_record_of_acks_is_its_encoding(self, coordinator: Coordinator) -> None:
        """The journal records of acks, made from the acks' frames (Codec.acknowledged), are the
        records' encodings: the first ack's TaskAcknowledged, the last one's and the completion."""
        running(coordinator)
        coordinator.tick(JOB, 10_000)
        records = []
        for offset, task in enumerate(("a", "b")):
            ack = CheckpointAcknowledged(
                JOB, 1, 1, task, 3, StateHandle(f"file:///ckpt/job/chk-1/{task}", 1, "x")
            )
            outcome = coordinator.handle(TOPICS.acks, 0, offset, JOB.encode(), encode(ack), 10_010 + offset)
            journal = [m.value for m in outcome.messages if m.topic == TOPICS.checkpoints]
            records += list(zip(outcome.journal, journal, strict=True))

        assert [TaskAcknowledged, TaskAcknowledged, CheckpointCompleted] == [type(e) for e, _ in records]
        assert [10_010, 10_011] == [e.timestamp_ms for e, _ in records[:2] if isinstance(e, TaskAcknowledged)]
        assert [encode(event, TOPICS.checkpoints) for event, _ in records] == [value for _, value in records]

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


CHK_1 = "file:///ckpt/job/chk-1"


class TestStatistics:
    def test_the_views_see_an_in_progress_checkpoint_s_acks(self, coordinator: Coordinator) -> None:
        """After one of two acks, the statistics the views read show checkpoint 1 with 1 of 2 acks,
        its size and time; once the second ack completes it, the completed entry has both."""
        running(coordinator)
        coordinator.tick(JOB, 10_000)
        first = CheckpointAcknowledged(JOB, 1, 1, "a", 10_005, StateHandle(f"{CHK_1}/a", 40, "x"))
        coordinator.handle(TOPICS.acks, 0, 0, JOB.encode(), encode(first), 10_005)

        shown = coordinator.checkpoint_stats(JOB)

        assert shown is not None and shown.history
        entry = shown.history[0]
        assert (1, "IN_PROGRESS", 2, 1, 40) == (
            entry.id,
            entry.status,
            entry.num_subtasks,
            entry.num_acknowledged_subtasks,
            entry.state_size,
        )
        second = CheckpointAcknowledged(JOB, 1, 1, "b", 10_009, StateHandle(f"{CHK_1}/b", 2, "x"))
        coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), encode(second), 10_009)
        done = coordinator.checkpoint_stats(JOB)
        assert done is not None and done.latest_completed is not None
        assert ("COMPLETED", 2, 42) == (
            done.latest_completed.status,
            done.latest_completed.num_acknowledged_subtasks,
            done.latest_completed.state_size,
        )
        assert coordinator.checkpoint_stats("nobody") is None


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
        partition = coordinator.partition_of(JOB) if coordinator.partitions else 0  # where a producer puts it
        coordinator.handle(TOPICS.job_status, partition, 0, JOB.encode(), encode(record), 0, epoch=epoch)
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

    @pytest.mark.parametrize(
        ("headers", "reason"),
        [
            ([("other", b"x"), ("cutline.epoch", b"2")], None),
            ([("cutline.epoch", b"1")], "STALE_EPOCH"),
            ([("other", b"x"), ("cutline.epoch", b"1"), ("cutline.epoch", b"2")], "VOID_EPOCH"),
            ([("cutline.epoch", b"2"), ("cutline.epoch", b"2")], "VOID_EPOCH"),  # two, even equal
            ([("cutline.epoch", b"two")], "VOID_EPOCH"),
            ([("cutline.epoch", b"")], "VOID_EPOCH"),
            ([("cutline.epoch", None)], "VOID_EPOCH"),
            ([("other", b"1")], None),  # a writer that echoes no epoch: the decider's checks apply
        ],
    )
    def test_an_ack_answers_the_epoch_its_headers_name(
        self, coordinator: Coordinator, headers: list[tuple[str, bytes | None]], reason: str | None
    ) -> None:
        """The epoch an ack answers is read as every reader reads one (``header_epoch``): two epoch
        headers or a malformed one make it void, a dead letter that says why."""
        triggered = self._triggered(coordinator, epoch=2)

        outcome = coordinator.handle(
            TOPICS.acks, 0, 7, JOB.encode(), self._ack(triggered.checkpoint_id), 10_001, headers, epoch=2
        )

        letters = [decode(m.value) for m in outcome.messages if m.topic == TOPICS.dead_letters]
        assert ([reason] if reason else []) == [x.reason for x in letters if isinstance(x, DeadLetter)]
        assert (reason is None) == ("a" in coordinator.states[JOB].pending[triggered.checkpoint_id].acks)
        if reason == "VOID_EPOCH":
            assert "cutline.epoch header" in letters[0].message  # type: ignore[union-attr]

    def test_a_void_ack_of_a_checkpoint_that_is_over_is_a_dead_letter(self, coordinator: Coordinator) -> None:
        """A doubly-headed answer is void even where a stale one would be left to the decider."""
        triggered = self._triggered(coordinator, epoch=1)
        coordinator.trigger_epochs.clear()  # as after a checkpoint is over

        outcome = coordinator.handle(
            TOPICS.acks, 0, 7, JOB.encode(), self._ack(triggered.checkpoint_id), 10_001,
            headers=[("cutline.epoch", b"1"), ("cutline.epoch", b"1")], epoch=1,
        )  # fmt: skip

        (letter,) = [decode(m.value) for m in outcome.messages]
        assert isinstance(letter, DeadLetter) and "VOID_EPOCH" == letter.reason

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

    def test_a_late_answer_to_a_finished_valid_checkpoint_is_discarded_not_stale(
        self, coordinator: Coordinator
    ) -> None:
        """A checkpoint of epoch 1 completed; a second ack (answering a barrier the epoch-1 owner
        sent, after a new owner resent it) is late, not stale: the decider discards it, as Flink
        discards a late message of a checkpoint that is over."""
        triggered = self._triggered(coordinator, epoch=1)
        for offset, task in enumerate(("a", "b")):
            coordinator.handle(
                TOPICS.acks, 0, offset, JOB.encode(), self._ack(triggered.checkpoint_id, task), 10_001,
                headers=[("cutline.epoch", b"2")], epoch=2,
            )  # fmt: skip

        outcome = coordinator.handle(
            TOPICS.acks, 0, 9, JOB.encode(), self._ack(triggered.checkpoint_id), 10_002,
            headers=[("cutline.epoch", b"1")], epoch=2,
        )  # fmt: skip

        assert [] == outcome.messages
        assert [triggered.checkpoint_id] == [c.checkpoint_id for c in coordinator.states[JOB].completed]

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


def letter_of(outcome: Outcome) -> DeadLetter:
    """The one dead letter an outcome holds (and nothing else)."""
    assert [TOPICS.dead_letters] == [m.topic for m in outcome.messages]
    letter = decode(outcome.messages[0].value)
    assert isinstance(letter, DeadLetter)
    return letter


def ack_bytes(uri: str | None, checkpoint_id: int = 1, task: str = "a") -> bytes:
    state = StateHandle(uri, 1, "0" * 64) if uri is not None else None
    return encode(CheckpointAcknowledged(JOB, checkpoint_id, 1, task, 0, state))


class TestIsolation:
    def test_an_exception_becomes_a_dead_letter_and_the_batch_goes_on(
        self, coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Given a decider that raises on one ack, when a batch of three acks is handled, then that
        ack is an INTERNAL_ERROR dead letter naming the exception, and the other two complete."""
        running(coordinator)
        coordinator.tick(JOB, 10_000)
        decide = runtime.decide_steps

        def explode(state: object, command: object) -> object:
            if isinstance(command, AcknowledgeCheckpoint) and command.ack.task_id == "b":
                raise ZeroDivisionError("boom")
            return decide(state, command)  # type: ignore[arg-type]

        monkeypatch.setattr(runtime, "decide_steps", explode)
        before = coordinator.states[JOB]

        failed = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_bytes(None, task="b"), 10_001)
        assert before is coordinator.states[JOB]
        monkeypatch.setattr(runtime, "decide_steps", decide)
        first = coordinator.handle(TOPICS.acks, 0, 2, JOB.encode(), ack_bytes(None, task="a"), 10_002)
        second = coordinator.handle(TOPICS.acks, 0, 3, JOB.encode(), ack_bytes(None, task="b"), 10_003)

        letter = letter_of(failed)
        assert ("INTERNAL_ERROR", "builtins.ZeroDivisionError: boom") == (letter.reason, letter.message)
        assert [TaskAcknowledged] == [type(e) for e in first.journal]
        assert [TaskAcknowledged, CheckpointCompleted] == [type(e) for e in second.journal]

    def test_an_encoding_failure_leaves_state_and_statistics_as_they_were(
        self, coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Given an encoder that fails on the second event of a decision, when the deciding ack comes,
        then neither the state nor the statistics hold any part of that decision."""
        running(coordinator)
        coordinator.tick(JOB, 10_000)
        coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_bytes(None, task="a"), 10_001)
        state, stats = coordinator.states[JOB], coordinator.stats[JOB]
        encode_event = coordinator.codec.encode

        def fail_on_completed(record: object, topic: str | None = None) -> bytes:
            if isinstance(record, CheckpointCompleted):
                raise OverflowError("long too big")
            return encode_event(record, topic)  # type: ignore[arg-type]

        monkeypatch.setattr(coordinator.codec, "encode", fail_on_completed)

        outcome = coordinator.handle(TOPICS.acks, 0, 2, JOB.encode(), ack_bytes(None, task="b"), 10_002)

        assert "OverflowError: long too big" in letter_of(outcome).message
        assert (state, stats) == (coordinator.states[JOB], coordinator.stats[JOB])

    def test_a_failing_tick_is_a_dead_letter(
        self, coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Given a decider that raises on ticks, when the job ticks, then a dead letter names the job
        and the state is unchanged; the next tick works again."""
        running(coordinator)
        before = coordinator.states[JOB]
        decide = runtime.decide_steps
        monkeypatch.setattr(runtime, "decide_steps", lambda state, command: 1 / 0)

        outcome = coordinator.tick(JOB, 10_000)
        monkeypatch.setattr(runtime, "decide_steps", decide)

        letter = letter_of(outcome)
        assert ("INTERNAL_ERROR", JOB, TOPICS.ticks) == (
            letter.reason,
            letter.job_id,
            letter.topic,
        )
        assert before is coordinator.states[JOB]
        assert coordinator.tick(JOB, 10_000).has_barriers

    def test_a_broken_state_uri_is_refused_not_raised(self, coordinator: Coordinator) -> None:
        """Given a pending checkpoint, when an ack's state URI is file://[x, then it is a dead letter
        (STATE_OUTSIDE_LOCATION) and a valid ack right after it is accepted."""
        running(coordinator)
        coordinator.tick(JOB, 10_000)

        refused = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_bytes("file://[x"), 10_001)
        accepted = coordinator.handle(
            TOPICS.acks, 0, 2, JOB.encode(), ack_bytes("file:///ckpt/job/chk-1/a"), 1
        )

        assert "STATE_OUTSIDE_LOCATION" == letter_of(refused).reason
        assert [TaskAcknowledged] == [type(e) for e in accepted.journal]

    def test_a_message_without_key_is_refused(self, coordinator: Coordinator) -> None:
        """Given a valid record without a key, when handled, then it is a MISSING_KEY dead letter."""
        running(coordinator)
        coordinator.tick(JOB, 10_000)

        outcome = coordinator.handle(TOPICS.acks, 0, 1, None, ack_bytes(None), 10_001)

        assert ("MISSING_KEY", JOB) == (letter_of(outcome).reason, letter_of(outcome).job_id)

    def test_an_input_in_another_partition_than_its_jobs_is_refused(self) -> None:
        """Given a worker that knows the topics have 8 partitions, when an ack of a job arrives in a
        partition its key does not hash to (a producer without a murmur2 partitioner), then it is a
        WRONG_PARTITION dead letter naming both partitions and the partitioner to use, and nothing
        is journaled; in the job's own partition it is decided."""
        coordinator = Coordinator(TOPICS, rng=random.Random(1), partitions=8)
        home = coordinator.partition_of(JOB)
        running_record = JobStatusChanged(JOB, JobStatus.RUNNING, 0, 1, ("a", "b"), CONFIG)
        coordinator.handle(TOPICS.job_status, home, 0, JOB.encode(), encode(running_record), 0)
        coordinator.tick(JOB, 10_000)
        elsewhere = (home + 1) % 8

        refused = coordinator.handle(TOPICS.acks, elsewhere, 1, JOB.encode(), ack_bytes(None), 10_001)
        accepted = coordinator.handle(TOPICS.acks, home, 1, JOB.encode(), ack_bytes(None), 10_001)

        letter = letter_of(refused)
        assert ("WRONG_PARTITION", JOB) == (letter.reason, letter.job_id)
        assert f"arrived in partition {elsewhere}, but the job's partition is {home} of 8" in letter.message
        assert '"partitioner": "murmur2_random"' in letter.message
        assert [] == refused.journal
        assert [TaskAcknowledged] == [type(e) for e in accepted.journal]

    def test_a_huge_value_is_cut_in_its_dead_letter(self, coordinator: Coordinator) -> None:
        """Given a 1 MiB value of garbage, when handled, then its dead letter keeps the first 512 KiB."""
        value = b"\x00" * (1024 * 1024)

        letter = letter_of(coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), value, 0))

        assert letter.value == value[: inbox.MAX_DEAD_LETTER_VALUE]
        assert "cut to its first 524288 of 1048576 bytes" in letter.message

    def test_invalid_savepoint_roots_are_refused_at_start(self) -> None:
        """Given a savepoint root that is not a canonical storage URI, the coordinator does not start."""
        with pytest.raises(ValueError, match="file:///absolute/path"):
            Coordinator(TOPICS, savepoint_roots=("file:/backups",))


class TestSymbolicLinks:
    @pytest.fixture(autouse=True, params=["per ack", "in one batch"])
    def _mode(self, request: pytest.FixtureRequest) -> Iterator[None]:
        """Each case twice: acks handled one by one (``lstat`` per name) and inside
        ``Coordinator.batch`` with every directory listed at once (coordinator/service/file_view.py)."""
        self.in_one_batch = request.param == "in one batch"
        with contextlib.ExitStack() as stack:
            self.stack = stack
            yield

    @pytest.fixture(name="tree")
    def _tree(self, tmp_path: Path) -> Path:
        (tmp_path / "checkpoints" / JOB / "chk-1").mkdir(parents=True)
        (tmp_path / "outside").mkdir()
        (tmp_path / "outside" / "secret").write_text("secret")
        return tmp_path

    def started(self, tree: Path, **kwargs: Any) -> Coordinator:
        coordinator = Coordinator(TOPICS, rng=random.Random(1), **kwargs)
        cfg = CheckpointConfig(interval_ms=100, location=(tree / "checkpoints").as_uri())
        record = JobStatusChanged(JOB, JobStatus.RUNNING, 0, 1, ("a", "b"), cfg)
        coordinator.handle(TOPICS.job_status, 0, 0, JOB.encode(), encode(record), 0)
        coordinator.tick(JOB, 10_000)
        if self.in_one_batch:
            self.stack.enter_context(coordinator.batch(scan_after=1))
        return coordinator

    def test_a_state_handle_linked_outside_the_location_is_refused(self, tree: Path) -> None:
        """Given a symbolic link in the checkpoint directory to a file outside, when a task acks it,
        then it is STATE_OUTSIDE_LOCATION and the checkpoint has no ack."""
        coordinator = self.started(tree)
        link = tree / "checkpoints" / JOB / "chk-1" / "a"
        link.symlink_to(tree / "outside" / "secret")

        outcome = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_bytes(link.as_uri()), 10_001)

        letter = letter_of(outcome)
        assert "STATE_OUTSIDE_LOCATION" == letter.reason
        assert str(tree / "outside" / "secret") in letter.message
        assert {} == dict(coordinator.states[JOB].pending[1].acks)

    def test_a_linked_file_is_refused_after_another_ack_of_its_checkpoint(self, tree: Path) -> None:
        """Given one task's file and another task's link to a file outside, when both ack (in one
        batch, the walk down to the checkpoint directory is remembered after the first), then the
        first counts and the link is still refused."""
        coordinator = self.started(tree)
        checkpoint = tree / "checkpoints" / JOB / "chk-1"
        (checkpoint / "a").write_text("x")
        (checkpoint / "b").symlink_to(tree / "outside" / "secret")

        first = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_bytes((checkpoint / "a").as_uri()), 1)
        second = coordinator.handle(
            TOPICS.acks, 0, 2, JOB.encode(), ack_bytes((checkpoint / "b").as_uri(), task="b"), 1
        )

        assert [TaskAcknowledged] == [type(e) for e in first.journal]
        assert "STATE_OUTSIDE_LOCATION" == letter_of(second).reason

    def test_a_linked_directory_on_the_way_is_refused_too(self, tree: Path) -> None:
        """Given a directory link inside the checkpoint directory that leads outside, a handle below it
        is refused."""
        coordinator = self.started(tree)
        (tree / "checkpoints" / JOB / "chk-1" / "sub").symlink_to(tree / "outside")
        uri = (tree / "checkpoints" / JOB / "chk-1" / "sub").as_uri() + "/secret"

        outcome = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_bytes(uri), 10_001)

        assert "STATE_OUTSIDE_LOCATION" == letter_of(outcome).reason

    def test_a_checkpoint_directory_that_is_a_link_is_refused(self, tree: Path) -> None:
        """Given a checkpoint directory that is itself a link to a directory outside, a handle in it
        is refused, although it is below the directory's own real path."""
        coordinator = self.started(tree)
        checkpoint = tree / "checkpoints" / JOB / "chk-1"
        checkpoint.rmdir()
        checkpoint.symlink_to(tree / "outside")

        outcome = coordinator.handle(
            TOPICS.acks, 0, 1, JOB.encode(), ack_bytes(f"{checkpoint.as_uri()}/secret"), 1
        )

        assert "STATE_OUTSIDE_LOCATION" == letter_of(outcome).reason

    def test_links_above_the_checkpoint_location_are_fine(self, tmp_path: Path) -> None:
        """Given a checkpoint location reached through a link set up by the operator (above the
        location), handles inside it are accepted."""
        (tmp_path / "disk" / "checkpoints").mkdir(parents=True)
        (tmp_path / "data").symlink_to(tmp_path / "disk")
        coordinator = self.started(tmp_path / "data")
        uri = (tmp_path / "data" / "checkpoints" / JOB / "chk-1").as_uri() + "/a"

        outcome = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_bytes(uri), 10_001)

        assert [TaskAcknowledged] == [type(e) for e in outcome.journal]

    def test_links_that_stay_inside_are_fine(self, tree: Path) -> None:
        """Given a link from one file of the checkpoint directory to another inside it, the ack counts."""
        coordinator = self.started(tree)
        target = tree / "checkpoints" / JOB / "chk-1" / "real"
        target.write_text("x")
        (tree / "checkpoints" / JOB / "chk-1" / "a").symlink_to(target)
        uri = (tree / "checkpoints" / JOB / "chk-1" / "a").as_uri()

        outcome = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_bytes(uri), 10_001)

        assert [TaskAcknowledged] == [type(e) for e in outcome.journal]

    def test_a_metadata_object_is_not_written_through_a_link_out_of_the_location(self, tree: Path) -> None:
        """Given a completion too large for the journal (so it goes to ``<location>/_metadata``) of a
        checkpoint directory that is a link to a directory outside, when the last ack comes, then it
        is a STATE_OUTSIDE_LOCATION dead letter and nothing is written outside (issue 53)."""
        coordinator = self.started(tree, limits=TopicLimits({TOPICS.checkpoints: 16_000}))
        checkpoint = tree / "checkpoints" / JOB / "chk-1"
        checkpoint.rmdir()
        checkpoint.symlink_to(tree / "outside")

        def ack_of(task: str, first: int) -> bytes:
            offsets = {f"words:{p}": p for p in range(first, first + 700)}
            return encode(CheckpointAcknowledged(JOB, 1, 1, task, 0, None, offsets))

        first = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_of("a", 0), 10_001)
        last = coordinator.handle(TOPICS.acks, 0, 2, JOB.encode(), ack_of("b", 700), 10_002)

        assert [TaskAcknowledged] == [type(e) for e in first.journal]
        assert "STATE_OUTSIDE_LOCATION" == letter_of(last).reason
        assert "symbolic link" in letter_of(last).message
        assert not (tree / "outside" / "_metadata").exists()

    def test_a_savepoint_target_linked_outside_its_root_is_refused(self, tree: Path) -> None:
        """Given a savepoint root holding a link to a directory outside it, when a savepoint targets the
        link, then it is a SAVEPOINT_TARGET_NOT_ALLOWED dead letter and nothing is triggered."""
        (tree / "savepoints").mkdir()
        (tree / "savepoints" / "evil").symlink_to(tree / "outside")
        coordinator = self.started(tree, savepoint_roots=((tree / "savepoints").as_uri(),))
        pending = dict(coordinator.states[JOB].pending)
        request = CheckpointRequested(
            JOB, CheckpointKind.SAVEPOINT, 0, "r1", target=(tree / "savepoints" / "evil").as_uri()
        )

        outcome = coordinator.handle(TOPICS.requests, 0, 1, JOB.encode(), encode(request), 10_001)

        assert "SAVEPOINT_TARGET_NOT_ALLOWED" == letter_of(outcome).reason
        assert pending == dict(coordinator.states[JOB].pending)


class TestLinksAreInputs:
    """The file system is asked before deciding (coordinator/core/links.py); the decider refuses on its
    answers where its rules would accept the input, so nothing after ``decide`` vetoes it."""

    def test_the_last_ack_asks_for_its_handle_and_the_completion_s_metadata_object(
        self, coordinator: Coordinator
    ) -> None:
        """Given checkpoint 1 of tasks a and b, task a acked, then b's ack asks about its handle and
        about ``<location>/_metadata``; a repeated ack of a asks nothing."""
        running(coordinator)
        coordinator.tick(JOB, 10_000)
        coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_bytes("file:///ckpt/job/chk-1/a"), 10_001)
        state = coordinator.states[JOB]
        last = AcknowledgeCheckpoint(decode_ack(ack_bytes("file:///ckpt/job/chk-1/b", task="b")), 10_002)
        again = AcknowledgeCheckpoint(decode_ack(ack_bytes("file:///ckpt/job/chk-1/a")), 10_002)

        roots = trusted_roots("file:///ckpt", ())
        assert (
            Below("file:///ckpt/job/chk-1/b", "file:///ckpt/job/chk-1", roots),
            Below("file:///ckpt/job/chk-1/_metadata", "file:///ckpt/job/chk-1", roots),
        ) == questions(state, last, ())
        assert () == questions(state, again, ())

    def test_a_repeated_ack_reported_linked_out_is_still_nothing(self, coordinator: Coordinator) -> None:
        """Given task a's ack counted, when the same ack comes again with its handle reported to lead
        out through a link, then the decider decides nothing (a duplicate), as before any link check;
        the first such ack is refused STATE_OUTSIDE_LOCATION."""
        running(coordinator)
        coordinator.tick(JOB, 10_000)
        uri = "file:///ckpt/job/chk-1/a"
        ack = decode_ack(ack_bytes(uri))
        linked = {uri: "/etc/passwd"}
        state = coordinator.states[JOB]

        (refused,) = decide_steps(state, AcknowledgeCheckpoint(ack, 10_001, linked))
        coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_bytes(uri), 10_001)
        repeated = decide_steps(coordinator.states[JOB], AcknowledgeCheckpoint(ack, 10_002, linked))

        assert isinstance(refused[0], InputRejected)
        assert Rejection.STATE_OUTSIDE_LOCATION == refused[0].reason
        assert "/etc/passwd" in refused[0].message
        assert [] == repeated


def decode_ack(value: bytes) -> CheckpointAcknowledged:
    ack = decode(value)
    assert isinstance(ack, CheckpointAcknowledged)
    return ack


class TestDue:
    """``Coordinator.due``: the jobs a tick can change, as ``due_at`` of each job's state says."""

    @staticmethod
    def expected(coordinator: Coordinator, now: int) -> list[str]:
        return [j for j, s in coordinator.states.items() if (at := due_at(s)) is not None and at <= now]

    def test_due_follows_the_state_through_triggers_acks_and_completions(
        self, coordinator: Coordinator
    ) -> None:
        running(coordinator)
        steps = [
            lambda: coordinator.tick(JOB, 10_000),  # checkpoint 1 triggered
            lambda: coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_bytes(None, 1, "a"), 10_001),
            lambda: coordinator.tick(JOB, 20_000),  # checkpoint 2 triggered (two pending)
            lambda: coordinator.handle(TOPICS.acks, 0, 2, JOB.encode(), ack_bytes(None, 1, "b"), 20_001),
            lambda: coordinator.handle(TOPICS.acks, 0, 3, JOB.encode(), ack_bytes(None, 2, "a"), 20_002),
        ]
        instants = (0, 10_000, 20_001, 10**9)
        assert [self.expected(coordinator, now) for now in instants] == [
            coordinator.due(now) for now in instants
        ]
        for step in steps:
            step()
            assert [self.expected(coordinator, now) for now in instants] == [
                coordinator.due(now) for now in instants
            ]

    def test_the_next_due_time_is_the_earliest_of_the_jobs_due_times(self, coordinator: Coordinator) -> None:
        """Given no job, nothing is due until a state changes; given a job that runs from 0 and one
        that runs from 5,000 (and so triggers later), the next due time is the first job's, and
        ``due`` names that job then and no job a millisecond before."""
        assert None is coordinator.next_due_at()

        running(coordinator)
        later = JobStatusChanged("later", JobStatus.RUNNING, 5_000, 1, ("a",), CONFIG)
        coordinator.handle(TOPICS.job_status, 0, 1, b"later", encode(later), 5_000)

        first = coordinator.next_due_at()
        assert first is not None
        assert first == min(due_at(state) or 2**63 for state in coordinator.states.values())
        assert first < (due_at(coordinator.states["later"]) or 0)
        assert ([JOB], []) == (coordinator.due(first), coordinator.due(first - 1))

    def test_an_ack_does_not_walk_the_pending_checkpoints_again(
        self, coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Given the due time of a job with a checkpoint pending, when a task acknowledges it (and
        it is not yet complete), then the next ``due`` reuses that time; a completion is worked out
        again."""
        running(coordinator)
        coordinator.tick(JOB, 10_000)
        before = coordinator.due(10**9)
        walks: list[object] = []
        counted = fold_state.due_at
        monkeypatch.setattr(fold_state, "due_at", lambda state: walks.append(state) or counted(state))

        coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), ack_bytes(None, 1, "a"), 10_001)

        assert before == coordinator.due(10**9)
        assert [] == walks
        coordinator.handle(TOPICS.acks, 0, 2, JOB.encode(), ack_bytes(None, 1, "b"), 10_002)  # completes
        assert self.expected(coordinator, 10**9) == coordinator.due(10**9)
        assert [coordinator.states[JOB]] == walks

    def test_jobs_no_longer_held_are_forgotten(self, coordinator: Coordinator) -> None:
        running(coordinator)
        coordinator.due(0)
        coordinator.states.clear()  # as when the job's partition is revoked

        assert [] == coordinator.due(10**9)
        assert {} == coordinator.fold._due_at
