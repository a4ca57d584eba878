"""The participant library against a real broker; each test plays the coordinator itself."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition
from support import eventually

from events.dev.broker import create_topics
from events.dev.example_app import WordCount
from events.kafka.clients import (
    consumer_config,
    job_key,
    murmur2,
    partition_for,
    produce_record,
    producer_config,
)
from events.kafka.feed import SharedJobFeed, read_job_partition
from events.task.participant import (
    JobDriver,
    Participant,
    SnapshotCorrupted,
    load_task_snapshot,
    shared_feed,
    snapshot_uri,
    write_atomic,
)
from events.task.reply import fits_inline
from events.wire.codec import decode, encode
from events.wire.fencing import epoch_header, epoch_of
from events.wire.records import (
    CheckpointAborted,
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointDeclined,
    CheckpointKind,
    CheckpointTriggered,
    CoordinatorClaimed,
    JobHeartbeat,
    JobStatus,
    JobStatusChanged,
    Record,
    SchedulerStarted,
    StateHandle,
    TaskAcknowledged,
)
from events.wire.topics import Topics

JOB = "job-1"
TASK = "task-0"
PARTITIONS = 8

Reply = CheckpointAcknowledged | CheckpointDeclined


def same_partition_job(job_id: str) -> str:
    """Another job id whose events share ``job_id``'s partition (so only the key tells them apart)."""
    target = partition_for(job_key(job_id), PARTITIONS)
    return next(
        f"other-{i}" for i in range(1000) if partition_for(job_key(f"other-{i}"), PARTITIONS) == target
    )


@pytest.fixture
def topics(bootstrap: str, topic_prefix: str) -> Topics:
    """The seven cutline topics plus an input topic ``<prefix>words``, created fresh."""
    t = Topics(topic_prefix)
    create_topics(bootstrap, [*t.all, f"{topic_prefix}words"], partitions=PARTITIONS)
    return t


class Coordinator:
    """Plays the coordinator: writes barriers and journal events, reads acks and declines."""

    def __init__(self, bootstrap: str, topics: Topics, job_id: str = JOB) -> None:
        self.topics = topics
        self.job_id = job_id
        self.producer = Producer(producer_config(bootstrap))
        self.consumer = Consumer(consumer_config(bootstrap))
        partition = partition_for(job_key(job_id), PARTITIONS)
        self.consumer.assign(
            [TopicPartition(t, partition, OFFSET_BEGINNING) for t in (topics.acks, topics.declines)]
        )
        self.replies: list[Reply] = []

    def send(self, topic: str, *records: Record) -> None:
        for record in records:
            produce_record(self.producer, topic, record)
        assert 0 == self.producer.flush(10)

    def barrier(
        self, checkpoint_id: int, location: str, attempt: int = 1, job_id: str = JOB, inline_limit: int = 0
    ) -> CheckpointBarrier:
        barrier = CheckpointBarrier(
            job_id, checkpoint_id, attempt, CheckpointKind.CHECKPOINT, 1, location, inline_limit
        )
        self.send(self.topics.barriers, barrier)
        return barrier

    def journal(self, *records: Record) -> None:
        self.send(self.topics.checkpoints, *records)

    def collect(self, participant: Participant | None, count: int, timeout: float = 10) -> list[Reply]:
        """Poll ``participant`` (if any) until ``count`` replies in total have arrived."""

        def replies() -> list[Reply]:
            if len(self.replies) < count:
                if participant is not None:
                    participant.poll(0.005)
                msg = self.consumer.poll(0.005)
                if msg is not None:
                    self.replies.append(self._reply(msg))
            return list(self.replies)

        eventually(
            replies, lambda got: len(got) >= count, timeout=timeout, interval=0, what=f"{count} replies"
        )
        return self.replies

    def _reply(self, msg: Message) -> Reply:
        if msg.error() is not None or job_key(self.job_id) != msg.key() or msg.value() is None:
            pytest.fail(f"not a reply of {self.job_id}: {msg.error()}, key {msg.key()!r}")
        record = decode(msg.value() or b"")
        if not isinstance(record, CheckpointAcknowledged | CheckpointDeclined):
            pytest.fail(f"not an ack or a decline: {record}")
        return record

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture
def coordinator(bootstrap: str, topics: Topics) -> Iterator[Coordinator]:
    c = Coordinator(bootstrap, topics)
    yield c
    c.close()


def pump(participant: Participant, until: Callable[[], bool], timeout: float = 10) -> None:
    """Poll ``participant`` until ``until()`` holds."""

    def pumped() -> bool:
        if until():
            return True
        participant.poll(0.005)
        raise AssertionError(f"stats {participant.stats}")

    eventually(pumped, timeout=timeout, interval=0, what="the condition, polling the participant")


class App:
    """A fake app: fixed state bytes and offsets, and a record of every snapshot call."""

    def __init__(self, state: bytes = b"state", offsets: Mapping[str, int] | None = None) -> None:
        self.state = state
        self.cut: dict[str, int] = dict(offsets or {"words:3": 42})
        self.barriers: list[CheckpointBarrier] = []
        self.completed: list[CheckpointCompleted] = []
        self.fail: Exception | None = None

    def snapshot(self, barrier: CheckpointBarrier) -> bytes:
        self.barriers.append(barrier)
        if self.fail is not None:
            raise self.fail
        return self.state

    def offsets(self) -> dict[str, int]:
        return dict(self.cut)

    def participant(self, bootstrap: str, topics: Topics, **kwargs: object) -> Participant:
        return Participant(
            bootstrap,
            JOB,
            TASK,
            1,
            topics,
            snapshot=self.snapshot,
            offsets=self.offsets,
            on_complete=self.completed.append,
            **kwargs,  # type: ignore[arg-type]
        )


def completed(
    checkpoint_id: int, offsets: Mapping[str, int], job_id: str = JOB, **kw: object
) -> CheckpointCompleted:
    fields: dict[str, object] = {
        "kind": CheckpointKind.CHECKPOINT,
        "timestamp_ms": 2,
        "duration_ms": 1,
        "handles": {},
        "size_bytes": 0,
        "attempt": 1,
        **kw,
    }
    return CheckpointCompleted(job_id, checkpoint_id, offsets=dict(offsets), **fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------- barriers


def test_barrier_writes_snapshot_under_location_and_acks_with_handle_and_offsets(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path
) -> None:
    """Given a participant, when a barrier arrives, then the snapshot lands under its location
    and the ack names it with its digest and the offsets of the cut."""
    app = App(state=b"counts: a=1 b=2", offsets={f"{topics.prefix}words:3": 42})
    location = (tmp_path / JOB / "chk-1").as_uri()
    with app.participant(bootstrap, topics) as participant:
        barrier = coordinator.barrier(1, location)
        [ack] = coordinator.collect(participant, 1)

    assert [barrier] == app.barriers
    assert isinstance(ack, CheckpointAcknowledged)
    assert (JOB, 1, 1, TASK) == (ack.job_id, ack.checkpoint_id, ack.attempt, ack.task_id)
    assert {f"{topics.prefix}words:3": 42} == ack.offsets
    assert (
        StateHandle(
            uri=f"{location}/{TASK}", size_bytes=len(app.state), sha256=hashlib.sha256(app.state).hexdigest()
        )
        == ack.state
    )
    assert app.state == (tmp_path / JOB / "chk-1" / TASK).read_bytes()
    assert [TASK] == [p.name for p in (tmp_path / JOB / "chk-1").iterdir()]  # no temp file left behind
    assert {"snapshot_ms", "write_ms", "bytes"} <= set(ack.metrics)
    assert len(app.state) == ack.metrics["bytes"]
    assert [1] == participant.stats.acked


def test_state_within_the_barriers_inline_limit_rides_in_the_ack_and_no_file_is_written(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path
) -> None:
    """Given barriers allowing exactly the state's size and one byte less, then the first ack carries
    the bytes inline (no file, nothing to discard on abort) and the second writes a file as before."""
    app = App(state=b"counts: a=1 b=2")
    size = len(app.state)
    at_limit, below = (tmp_path / JOB / "chk-1").as_uri(), (tmp_path / JOB / "chk-2").as_uri()
    with app.participant(bootstrap, topics) as participant:
        coordinator.barrier(1, at_limit, inline_limit=size)
        coordinator.barrier(2, below, inline_limit=size - 1)
        inline, written = coordinator.collect(participant, 2)
        coordinator.journal(CheckpointAborted(JOB, 1, 3, "CHECKPOINT_EXPIRED", "test"))
        pump(participant, lambda: 1 in participant.ledger.aborted_ids)

    digest = hashlib.sha256(app.state).hexdigest()
    assert isinstance(inline, CheckpointAcknowledged) and isinstance(written, CheckpointAcknowledged)
    assert StateHandle(f"{at_limit}/{TASK}", size, digest, inline=app.state) == inline.state
    assert not (tmp_path / JOB / "chk-1").exists()
    assert (size, size) == (inline.metrics["bytes"], inline.metrics["inline_bytes"])
    assert StateHandle(f"{below}/{TASK}", size, digest) == written.state
    assert app.state == (tmp_path / JOB / "chk-2" / TASK).read_bytes()
    assert 0 == written.metrics["inline_bytes"]
    assert [] == participant.stats.discarded  # the aborted checkpoint 1 had no file to delete
    assert app.state == load_task_snapshot(inline.state)


def test_duplicate_barrier_resends_the_same_ack_without_a_second_snapshot(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path
) -> None:
    """Given an acked barrier, when it is sent again, then the same ack goes out again
    and snapshot() is not called a second time."""
    app = App()
    with app.participant(bootstrap, topics) as participant:
        coordinator.barrier(1, (tmp_path / "chk-1").as_uri())
        coordinator.collect(participant, 1)
        app.cut = {"words:3": 99}  # the app moved on; a re-ack must still report the cut
        coordinator.barrier(1, (tmp_path / "chk-1").as_uri())
        first, second = coordinator.collect(participant, 2)

    assert 1 == len(app.barriers)
    assert first == second
    assert [1] == participant.stats.resent


def test_barriers_of_another_job_or_attempt_or_from_before_start_are_ignored(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path
) -> None:
    """Given old barriers in one batch, when barriers of another job and attempt follow,
    then only the job's own attempt is snapshotted."""
    # one batch of ten old barriers: ListOffsets "latest" on the embedded broker says 1, not 10
    batcher = Producer(producer_config(bootstrap, {"linger.ms": 100}))
    for checkpoint_id in range(1, 11):
        produce_record(
            batcher,
            topics.barriers,
            CheckpointBarrier(JOB, checkpoint_id, 1, CheckpointKind.CHECKPOINT, 1, tmp_path.as_uri()),
        )
    assert 0 == batcher.flush(10)
    other = same_partition_job(JOB)
    app = App()
    with app.participant(bootstrap, topics) as participant:
        coordinator.barrier(11, (tmp_path / "x").as_uri(), job_id=other)
        coordinator.barrier(12, (tmp_path / "y").as_uri(), attempt=2)
        coordinator.barrier(13, (tmp_path / "chk-13").as_uri())
        [ack] = coordinator.collect(participant, 1)
        participant.poll(0.2)

    assert [13] == [b.checkpoint_id for b in app.barriers]
    assert 13 == ack.checkpoint_id
    assert 1 == participant.stats.ignored_barriers  # attempt 2; the other job is filtered by key
    assert ["chk-13"] == [p.name for p in tmp_path.iterdir()]


def test_failed_snapshots_are_declined_with_a_reason_and_the_next_barrier_is_acked(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path
) -> None:
    """Given an unwritable location, a scheme without an installed file system and a failing
    snapshot, when their barriers arrive, then each is declined with a reason and the next barrier
    is acked."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    app = App()
    with app.participant(bootstrap, topics) as participant:
        coordinator.barrier(1, (blocker / "chk-1").as_uri())  # parent is a regular file, even for root
        coordinator.collect(participant, 1)
        coordinator.barrier(2, "gs://bucket/chk-2")  # s3 works (events/task/storage.py); gcsfs is not here
        coordinator.collect(participant, 2)
        app.fail = RuntimeError("state backend exploded")
        coordinator.barrier(3, (tmp_path / "chk-3").as_uri())
        coordinator.collect(participant, 3)
        app.fail = None
        coordinator.barrier(4, (tmp_path / "chk-4").as_uri())
        io, scheme, failure, ack = coordinator.collect(participant, 4)

    assert isinstance(io, CheckpointDeclined)
    assert ("IO_EXCEPTION", 1, TASK) == (io.reason, io.checkpoint_id, io.task_id)
    assert "NotADirectoryError" in io.message
    assert isinstance(scheme, CheckpointDeclined)
    assert "TASK_CHECKPOINT_FAILURE" == scheme.reason
    assert "no file system for 'gs' is installed (Please install gcsfs" in scheme.message
    assert isinstance(failure, CheckpointDeclined)
    assert ("TASK_CHECKPOINT_FAILURE", "RuntimeError: state backend exploded") == (
        failure.reason,
        failure.message,
    )
    assert isinstance(ack, CheckpointAcknowledged)
    assert 4 == ack.checkpoint_id
    assert ([1, 2, 3], [4]) == (participant.stats.declined, participant.stats.acked)
    assert app.state == (tmp_path / "chk-4" / TASK).read_bytes()


# -------------------------------------------------------------------- journal


def test_completion_commits_exactly_the_checkpoint_offsets_of_the_task(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path
) -> None:
    """Given an acked checkpoint, when the journal says it completed, then exactly its offsets of
    this task's partitions are committed to the group and on_complete runs."""
    words = f"{topics.prefix}words"
    group = f"{topics.prefix}group"
    app = App(offsets={f"{words}:0": 5, f"{words}:1": 7})
    commit_consumer = Consumer(consumer_config(bootstrap, group))
    try:
        with app.participant(bootstrap, topics, commit_consumer=commit_consumer) as participant:
            coordinator.barrier(1, (tmp_path / "chk-1").as_uri())
            coordinator.collect(participant, 1)
            app.cut = {f"{words}:0": 6, f"{words}:1": 8}  # the app read on after the cut
            done = completed(1, {f"{words}:0": 5, f"{words}:1": 7, f"{words}:2": 9})  # :2 is another task's
            coordinator.journal(
                CheckpointTriggered(JOB, 1, 1, CheckpointKind.CHECKPOINT, 1, "x", (TASK,), 9), done
            )
            pump(participant, lambda: bool(app.completed))
    finally:
        commit_consumer.close()

    reader = Consumer(consumer_config(bootstrap, group))
    try:
        committed = reader.committed([TopicPartition(words, p) for p in range(3)], timeout=10)
    finally:
        reader.close()
    assert [5, 7, -1001] == [tp.offset for tp in committed]
    assert [done] == app.completed
    assert ([1], [1]) == (participant.stats.completed, participant.stats.committed)


def test_abort_discards_the_snapshot_but_never_that_of_a_completed_checkpoint(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path
) -> None:
    """Given two acked checkpoints, when the first aborts and the second completes then aborts,
    then only the first snapshot is deleted and a re-sent barrier of it is stale."""
    app = App()
    with app.participant(bootstrap, topics) as participant:
        coordinator.barrier(1, (tmp_path / "chk-1").as_uri())
        coordinator.barrier(2, (tmp_path / "chk-2").as_uri())
        coordinator.collect(participant, 2)
        assert (tmp_path / "chk-1" / TASK).exists()
        coordinator.journal(
            CheckpointAborted(JOB, 1, 3, "CHECKPOINT_SUBSUMED", "subsumed by checkpoint 2"),
            completed(2, {}),
            CheckpointAborted(JOB, 2, 4, "CHECKPOINT_DECLINED", "should not happen"),
        )
        pump(participant, lambda: bool(app.completed))
        participant.poll(0.2)
        coordinator.barrier(1, (tmp_path / "chk-1").as_uri())  # re-sent after the abort: stale now
        participant.poll(0.3)

    assert not (tmp_path / "chk-1" / TASK).exists()
    assert (tmp_path / "chk-2" / TASK).exists()
    assert ([1], [2]) == (participant.stats.aborted, participant.stats.completed)
    assert 1 == participant.stats.ignored_records  # the abort of completed checkpoint 2
    assert 2 == len(coordinator.collect(None, 2))
    assert 2 == len(app.barriers)


def test_retention_keeps_the_newest_completed_snapshots_and_savepoints_and_deletes_the_rest(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path
) -> None:
    """Given retained=2 from the job's SchedulerStarted, when checkpoints 1-6 are acked and 3 aborts
    and 5 is a savepoint, then the participant keeps its snapshots of 4, 5 and 6 only, and forged
    records (a second completion of 6, aborts of 6 and 4) delete nothing."""
    app = App()
    config = CheckpointConfig(interval_ms=1000, location=tmp_path.as_uri(), retained=2)
    with app.participant(bootstrap, topics) as participant:
        coordinator.journal(SchedulerStarted(JOB, 1, 1, (TASK,), config))
        for checkpoint_id in range(1, 7):
            kind = CheckpointKind.SAVEPOINT if checkpoint_id == 5 else CheckpointKind.CHECKPOINT
            location = (tmp_path / f"chk-{checkpoint_id}").as_uri()
            coordinator.send(topics.barriers, CheckpointBarrier(JOB, checkpoint_id, 1, kind, 1, location))
        coordinator.collect(participant, 6)
        assert all((tmp_path / f"chk-{i}" / TASK).exists() for i in range(1, 7))
        coordinator.journal(
            completed(1, {}),
            completed(2, {}),
            CheckpointAborted(JOB, 3, 3, "CHECKPOINT_DECLINED", "declined by another task"),
            completed(4, {}),
            completed(5, {}, kind=CheckpointKind.SAVEPOINT),
            completed(6, {}),
        )
        pump(participant, lambda: len(app.completed) == 5)
        assert 2 == participant.retained
        coordinator.journal(
            completed(6, {}),  # a duplicate: the latest completed must survive it
            CheckpointAborted(JOB, 6, 7, "CHECKPOINT_EXPIRED", "forged"),
            CheckpointAborted(JOB, 4, 7, "CHECKPOINT_EXPIRED", "forged"),
        )
        pump(participant, lambda: participant.stats.ignored_records == 3)

    kept = sorted(p.parent.name for p in tmp_path.glob(f"chk-*/{TASK}"))
    assert ["chk-4", "chk-5", "chk-6"] == kept
    assert ([1, 2], [3]) == (participant.stats.discarded, participant.stats.aborted)
    assert [1, 2, 4, 5, 6] == [c.checkpoint_id for c in app.completed]  # on_complete once per id


def test_a_participant_given_retained_ignores_the_config_in_the_journal(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path
) -> None:
    """Given retained=1 passed to the participant, when the journal's config says 5,
    then only the latest completed snapshot is kept."""
    app = App()
    config = CheckpointConfig(interval_ms=1000, location=tmp_path.as_uri(), retained=5)
    with app.participant(bootstrap, topics, retained=1) as participant:
        coordinator.journal(SchedulerStarted(JOB, 1, 1, (TASK,), config))
        coordinator.barrier(1, (tmp_path / "chk-1").as_uri())
        coordinator.barrier(2, (tmp_path / "chk-2").as_uri())
        coordinator.collect(participant, 2)
        coordinator.journal(completed(1, {}), completed(2, {}))
        pump(participant, lambda: len(app.completed) == 2)

    assert (1, [1]) == (participant.retained, participant.stats.discarded)
    assert [tmp_path / "chk-2" / TASK] == list(tmp_path.glob(f"chk-*/{TASK}"))
    with pytest.raises(ValueError, match="retained must be at least 1"):
        app.participant(bootstrap, topics, retained=0)


def test_malformed_and_foreign_completions_are_ignored_without_raising_out_of_poll(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path
) -> None:
    """Given acked checkpoints, when the journal completes one with the offsets key 'words:²' and
    another for attempt 2, then poll() does not raise, neither is committed, and a well-formed
    completion after them is; an app whose own offsets key is malformed declines."""
    words = f"{topics.prefix}words"
    group = f"{topics.prefix}group"
    app = App(offsets={f"{words}:0": 5})
    commit_consumer = Consumer(consumer_config(bootstrap, group))
    try:
        with app.participant(bootstrap, topics, commit_consumer=commit_consumer) as participant:
            for checkpoint_id in (1, 2, 3):
                coordinator.barrier(checkpoint_id, (tmp_path / f"chk-{checkpoint_id}").as_uri())
            coordinator.collect(participant, 3)
            coordinator.journal(
                completed(1, {f"{words}:²": 5}),  # str.isdigit() accepts '²', int() does not
                completed(2, {f"{words}:0": 5}, attempt=2),
                completed(3, {f"{words}:0": 5}),
            )
            pump(participant, lambda: bool(app.completed))
            app.cut = {f"{words}:-1": 6}
            coordinator.barrier(4, (tmp_path / "chk-4").as_uri())
            *_, declined = coordinator.collect(participant, 4)
    finally:
        commit_consumer.close()

    assert [3] == [c.checkpoint_id for c in app.completed]
    assert ([3], [3], 1) == (
        participant.stats.completed,
        participant.stats.committed,
        participant.stats.ignored_records,
    )
    assert isinstance(declined, CheckpointDeclined)
    assert ("TASK_CHECKPOINT_FAILURE", 4) == (declined.reason, declined.checkpoint_id)
    assert "ValueError" in declined.message and "-1" in declined.message


def test_load_snapshot_returns_the_bytes_and_detects_corruption(tmp_path: Path) -> None:
    """Given a written snapshot, when it is read back intact and after a changed byte,
    then the first read returns its bytes and the second fails."""
    data = b'{"counts":{"a":1}}'
    uri = snapshot_uri((tmp_path / "chk-1").as_uri(), "words:0")
    path = tmp_path / "chk-1" / "words:0"
    write_atomic(path, data)
    handle = StateHandle(uri, len(data), hashlib.sha256(data).hexdigest())

    assert data == load_task_snapshot(handle)
    path.write_bytes(data.replace(b"1", b"2"))
    with pytest.raises(SnapshotCorrupted, match="corrupt: expected 18 bytes with sha256"):
        load_task_snapshot(handle)


@pytest.mark.parametrize(
    ("size", "limit", "inline"),
    [(0, 0, False), (0, 1, True), (1, 1, True), (2, 1, False), (20_480, 20_480, True)],
)
def test_a_snapshot_rides_inline_only_within_a_limit_above_zero(size: int, limit: int, inline: bool) -> None:
    """A limit of 0 means no inline state at all, not even an empty snapshot."""
    barrier = CheckpointBarrier(JOB, 1, 1, CheckpointKind.CHECKPOINT, 1, "file:///c/chk-1", limit)

    assert inline is fits_inline(b"x" * size, barrier)


def test_load_snapshot_returns_inline_bytes_after_checking_them() -> None:
    """Inline state is read from the handle, never from its URI, and checked like a file."""
    data = b'{"counts":{"a":1}}'
    handle = StateHandle("file:///nowhere/chk-1/t0", len(data), hashlib.sha256(data).hexdigest(), data)

    assert data == load_task_snapshot(handle)
    with pytest.raises(SnapshotCorrupted, match="corrupt: expected 18 bytes with sha256"):
        load_task_snapshot(
            StateHandle(handle.uri, handle.size_bytes, handle.sha256, data.replace(b"1", b"2"))
        )


# ----------------------------------------------------------------- job driver


def test_murmur2_places_keys_as_the_java_client_does() -> None:
    """Given job ids, when partitioned over 8 partitions, then they land where the Java client,
    Faust and aiokafka put them."""
    assert [5, 4, 6, 4, 3, 6, 5, 5] == [partition_for(f"job-{i}".encode(), 8) for i in range(8)]
    kafka_vectors = {  # org.apache.kafka.common.utils.UtilsTest#testMurmur2 (Java ints are signed)
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    assert {k: v & 0xFFFFFFFF for k, v in kafka_vectors.items()} == {k: murmur2(k) for k in kafka_vectors}


def test_running_publishes_a_decodable_status_keyed_by_job_on_the_journal_partition(
    bootstrap: str, topics: Topics
) -> None:
    """Given a driver, when it publishes RUNNING and FAILED, then both decode and sit keyed by
    the job on its murmur2 partition (heartbeats off: they travel there too, see below)."""
    config = CheckpointConfig(interval_ms=1000, location="file:///tmp/ckpt")
    with JobDriver(bootstrap, JOB, topics) as driver:
        sent = driver.running(["t0", "t1"], config, attempt=3, restored_checkpoint_id=7, heartbeats=False)
        failed = driver.status(JobStatus.FAILED, error="boom")

    reader = Consumer(consumer_config(bootstrap))
    try:
        reader.assign([TopicPartition(topics.job_status, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        messages: list[Message] = []

        def read_two() -> bool:
            msg = reader.poll(0.05)
            if msg is not None:
                messages.append(msg)
            return len(messages) >= 2

        eventually(read_two, timeout=10, interval=0, what="two job-status records")
    finally:
        reader.close()
    assert [sent, failed] == [decode(m.value() or b"") for m in messages]
    assert isinstance(sent, JobStatusChanged)
    assert (JobStatus.RUNNING, ("t0", "t1"), config, 3, 7) == (
        sent.status,
        sent.tasks,
        sent.config,
        sent.attempt,
        sent.restored_checkpoint_id,
    )
    assert (3, "boom") == (failed.attempt, failed.error)
    assert {(job_key(JOB), partition_for(job_key(JOB), PARTITIONS))} == {
        (m.key(), m.partition()) for m in messages
    }
    assert 4 == partition_for(job_key(JOB), PARTITIONS)


def test_latest_completed_finds_the_newest_completed_checkpoint_of_the_job(
    bootstrap: str, topics: Topics
) -> None:
    """Given a journal of several jobs and kinds, when the driver looks,
    then it finds the job's newest CHECKPOINT completion."""
    coordinator = Coordinator(bootstrap, topics)
    other = same_partition_job(JOB)
    handle = StateHandle("file:///c/job-1/chk-3/t0", 3, "ab" * 32)
    coordinator.journal(
        completed(1, {"w:0": 1}),
        TaskAcknowledged(JOB, 3, 1, "t0", 5, handle, {"w:0": 3}),
        completed(2, {"w:0": 2}, kind=CheckpointKind.SAVEPOINT),
        completed(3, {"w:0": 3}, handles={"t0": handle}, size_bytes=3),
        CheckpointAborted(JOB, 4, 6, "CHECKPOINT_EXPIRED", "late"),
        completed(9, {"w:0": 9}, job_id=other),
    )
    coordinator.close()
    driver = JobDriver(bootstrap, JOB, topics)
    started = time.monotonic()

    latest = driver.latest_completed()
    assert latest is not None
    assert (3, {"w:0": 3}, {"t0": handle}) == (latest.checkpoint_id, latest.offsets, latest.handles)
    assert time.monotonic() - started < 0.5  # reached the end by the high watermark, not by waiting
    savepoint = driver.completed_checkpoint(2)
    assert savepoint is not None
    assert CheckpointKind.SAVEPOINT == savepoint.kind
    assert driver.completed_checkpoint(4) is None
    assert 3 == getattr(driver.latest_completed(kind=None), "checkpoint_id", None)
    assert JobDriver(bootstrap, "job-0", topics).latest_completed() is None  # an empty partition


# ---------------------------------------------------------------- example app


def test_example_word_count_restores_from_its_checkpoint_and_ends_with_exact_counts(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Given a word count checkpointed mid-stream, when a new run restores after more input,
    then it resumes at the cut and the counts equal one run over all input."""
    words = f"{topics.prefix}words"
    group = f"{topics.prefix}wc"
    lines = [f"the cat {i % 3} sat on the mat" for i in range(30)]
    producer = Producer(producer_config(bootstrap))

    def feed(batch: list[str]) -> None:
        for line in batch:
            producer.produce(words, value=line.encode(), partition=2)
        assert 0 == producer.flush(10)

    def app() -> WordCount:
        return WordCount(bootstrap, "wc", "wc-2", words, 2, topics=topics, group=group)

    feed(lines[:18])
    crashed = app()
    crashed.run(threading.Event(), max_records=12)  # counts 12 records, leaves without a checkpoint
    assert 12 == crashed.records

    coordinator = Coordinator(bootstrap, topics, job_id="wc")
    checkpointed, stop = app(), threading.Event()
    runner = threading.Thread(target=checkpointed.run, args=(stop,))
    runner.start()
    try:
        eventually(lambda: checkpointed.participant, timeout=10, interval=0.01, what="the app's participant")
        coordinator.barrier(1, (tmp_path / "wc" / "chk-1").as_uri(), job_id="wc")
        [ack] = coordinator.collect(None, 1)
        assert isinstance(ack, CheckpointAcknowledged) and ack.state is not None
        coordinator.journal(
            completed(
                1, ack.offsets, job_id="wc", handles={"wc-2": ack.state}, size_bytes=ack.state.size_bytes
            )
        )
        eventually(
            lambda: checkpointed.participant is None or checkpointed.participant.stats.committed,
            timeout=10,
            interval=0.01,
            what="checkpoint 1 committed",
        )
    finally:
        stop.set()
        runner.join(10)
        coordinator.close()
    cut = ack.offsets[f"{words}:2"]
    assert 0 <= cut <= 18
    feed(lines[18:])

    restored = app()
    counts = restored.run(threading.Event(), idle_exit=1.0)
    reader = Consumer(consumer_config(bootstrap, group))
    [committed_tp] = reader.committed([TopicPartition(words, 2)], timeout=10)
    reader.close()
    assert restored.restored is not None and 1 == restored.restored.checkpoint_id
    assert (len(lines) - cut, 2) == (restored.records, restored.attempt)  # resumed exactly at the cut
    assert Counter(" ".join(lines).split()) == counts
    assert cut == committed_tp.offset


# ------------------------------------------ fencing (docs/design.md, "Ownership and fencing")


def test_the_driver_reads_the_journal_through_the_fencing_rule(bootstrap: str, topics: Topics) -> None:
    """Given claims 1 and 2 and a zombie's completion of epoch 1 after claim 2, the driver's view of
    the journal leaves the zombie's record out."""
    producer = Producer(producer_config(bootstrap))
    partition = partition_for(job_key(JOB), PARTITIONS)

    def append(record: Record, epoch: int) -> None:
        key = None if isinstance(record, CoordinatorClaimed) else job_key(JOB)
        producer.produce(
            topics.checkpoints,
            key=key,
            value=encode(record),
            partition=partition,
            headers=[epoch_header(epoch)],
        )

    append(CoordinatorClaimed(partition, 1, "w1", 0), 1)
    append(completed(1, {"w:0": 1}), 1)
    append(CoordinatorClaimed(partition, 2, "w2", 0), 2)
    append(completed(2, {"w:0": 2}), 1)  # the zombie of epoch 1
    append(completed(3, {"w:0": 3}), 2)
    assert 0 == producer.flush(10)

    completions = JobDriver(bootstrap, JOB, topics).completions()

    assert [1, 3] == [c.checkpoint_id for c in completions]


def test_a_participant_ignores_a_superseded_epochs_barriers_and_echoes_the_epoch_it_answers(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Once a participant has seen epoch 2, a barrier of epoch 1 is a zombie's and gets no answer; its
    ack of an epoch-2 barrier names epoch 2 (the coordinator refuses answers to stale epochs)."""
    coordinator = Coordinator(bootstrap, topics)
    participant = Participant(bootstrap, JOB, "t0", 1, topics, lambda b: b"s", lambda: {"w:0": 1})
    location = f"file://{tmp_path}/{JOB}"
    produce = coordinator.producer.produce
    for checkpoint_id, epoch in ((1, 2), (2, 1), (3, 2)):
        barrier = CheckpointBarrier(
            JOB, checkpoint_id, 1, CheckpointKind.CHECKPOINT, 1, f"{location}/chk-{checkpoint_id}"
        )
        produce(topics.barriers, key=job_key(JOB), value=encode(barrier), headers=[epoch_header(epoch)])
    assert 0 == coordinator.producer.flush(10)
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topics.acks, partition_for(job_key(JOB), PARTITIONS), OFFSET_BEGINNING)])

    replies = coordinator.collect(participant, 2)
    echoed = []
    while len(echoed) < 2:
        message = consumer.poll(5)
        assert message is not None and message.error() is None
        echoed.append(epoch_of(message.headers()))

    assert [1, 3] == [r.checkpoint_id for r in replies]
    assert [2, 2] == echoed
    consumer.close()
    coordinator.close()
    participant.close()


def test_a_running_driver_sends_heartbeats_until_its_next_status(bootstrap: str, topics: Topics) -> None:
    """RUNNING starts a heartbeat every heartbeat_interval_ms on job-status; another status stops them."""
    config = CheckpointConfig(interval_ms=1000, location="file:///tmp/ckpt", heartbeat_interval_ms=100)
    with JobDriver(bootstrap, JOB, topics) as driver:
        driver.running(["t0"], config, attempt=2)
        time.sleep(0.55)
        driver.status(JobStatus.CANCELED)
        time.sleep(0.3)  # a heartbeat after CANCELED would show up now

    records = [r.record for r in read_job_partition(bootstrap, JOB, topics.job_status, timeout=10)]
    kinds = [type(r).__name__ for r in records]
    beats = [r for r in records if isinstance(r, JobHeartbeat)]
    assert kinds[0] == "JobStatusChanged" and kinds[-1] == "JobStatusChanged"
    assert 4 <= len(beats) <= 7 and {2} == {b.attempt for b in beats}
    assert kinds == ["JobStatusChanged", *["JobHeartbeat"] * len(beats), "JobStatusChanged"]


# ---------------------------------------------------------------- shared feed


def test_participants_sharing_one_feed_and_producer_each_answer_every_barrier_once(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path
) -> None:
    """Given four tasks of a job in one process sharing a feed and a producer, when barriers and a
    completion arrive, then each task snapshots and acks each barrier once with its own offsets,
    each sees the completion once, and a task that closes leaves the others (and the feed) running."""
    producer = Producer(producer_config(bootstrap))
    apps = [App(state=f"state {i}".encode(), offsets={f"{topics.prefix}words:{i}": 10 * i}) for i in range(4)]
    with SharedJobFeed(
        bootstrap, JOB, (topics.barriers, topics.checkpoints), claims_topic=topics.checkpoints
    ) as feed:
        participants = [
            Participant(
                bootstrap,
                JOB,
                f"task-{i}",
                1,
                topics,
                app.snapshot,
                app.offsets,
                on_complete=app.completed.append,
                feed=feed,
                producer=producer,
            )  # fmt: skip
            for i, app in enumerate(apps)
        ]
        for participant in participants:
            participant.run_in_thread(0.005)
        coordinator.barrier(1, (tmp_path / "chk-1").as_uri())
        first = coordinator.collect(None, 4)
        acks = {r.task_id: r for r in first if isinstance(r, CheckpointAcknowledged)}
        coordinator.journal(completed(1, {k: v for a in acks.values() for k, v in a.offsets.items()}))

        def each_completed() -> bool:
            assert all(app.completed for app in apps), [p.stats for p in participants]
            return True

        eventually(each_completed, timeout=10, interval=0.01, what="each task to see the completion")

        participants[0].close()  # one task ends; the feed goes on for the others
        coordinator.barrier(2, (tmp_path / "chk-2").as_uri())
        second = coordinator.collect(None, 4 + 3)[4:]
        for participant in participants[1:]:
            participant.close()

    assert sorted(acks) == [f"task-{i}" for i in range(4)]
    assert all((tmp_path / "chk-1" / f"task-{i}").read_bytes() == f"state {i}".encode() for i in range(4))
    assert [[1], [1, 2], [1, 2], [1, 2]] == [[b.checkpoint_id for b in app.barriers] for app in apps]
    assert [{f"{topics.prefix}words:{i}": 10 * i} == acks[f"task-{i}"].offsets for i in range(4)] == [
        True
    ] * 4
    assert sorted(r.task_id for r in second) == ["task-1", "task-2", "task-3"]
    assert all(isinstance(r, CheckpointAcknowledged) and r.checkpoint_id == 2 for r in second)
    assert [[1]] * 4 == [[c.checkpoint_id for c in app.completed] for app in apps]
    assert [[1]] * 4 == [p.stats.completed for p in participants]


def test_the_feed_participants_share_hands_out_what_they_act_on_and_not_the_tasks_acknowledgements(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path
) -> None:
    """Given the feed a job's participants share (shared_feed), when a barrier goes out and the journal
    holds its trigger, a TaskAcknowledged of each task and the completion, then a subscriber gets the
    barrier, the trigger and the completion, and no TaskAcknowledged."""
    location = (tmp_path / "chk-1").as_uri()
    acknowledged = [TaskAcknowledged(JOB, 1, 1, f"task-{i}", 2) for i in range(4)]
    trigger = CheckpointTriggered(JOB, 1, 1, CheckpointKind.CHECKPOINT, 1, location, ("task-0",), 10_000)
    with shared_feed(bootstrap, JOB, topics) as feed:
        subscriber = feed.subscribe()
        coordinator.barrier(1, location)
        coordinator.journal(trigger, *acknowledged, completed(1, {}))
        got: list[str] = []

        def until_completed() -> list[str]:
            got.extend(r.name for r in subscriber.poll(0.1))
            return got

        eventually(
            until_completed, lambda names: "CheckpointCompleted" in names, timeout=10, what="completion"
        )

    assert ["CheckpointBarrier", "CheckpointCompleted", "CheckpointTriggered"] == sorted(got)


def test_a_shared_feed_of_another_job_is_refused(bootstrap: str, topics: Topics) -> None:
    """A participant must not read another job's barriers: a shared feed of another job is refused."""
    feed = SharedJobFeed(bootstrap, "another-job", (topics.barriers, topics.checkpoints))
    with feed, pytest.raises(ValueError, match="follows job 'another-job'"):
        App().participant(bootstrap, topics, feed=feed)


def test_a_driver_whose_attempt_no_coordinator_runs_warns_and_notes_when_one_runs_it(
    bootstrap: str, topics: Topics, coordinator: Coordinator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # given: a driver that published RUNNING on a prefix no coordinator runs on
    caplog.set_level(logging.INFO, "events.task.scheduler_watch")
    config = CheckpointConfig(interval_ms=1000, location=tmp_path.as_uri())

    def said(level: str, text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelname == level and text in r.getMessage()]

    with JobDriver(bootstrap, JOB, topics, unscheduled_warning_s=1.0) as driver:
        driver.running((TASK,), config, attempt=1)
        # then: after the wait, it warns once, naming the prefix and the check to run
        warned = eventually(lambda: said("WARNING", "no coordinator has run it"), timeout=20)
        assert f"with topic prefix {topics.prefix!r}?" in warned[0]
        assert f"cutline doctor --bootstrap {bootstrap} --topic-prefix {topics.prefix}" in warned[0]
        # when: the coordinator runs the attempt after all
        coordinator.journal(SchedulerStarted(JOB, 1, 1, (TASK,), config))
        # then: the driver says so, reading it from the journal
        eventually(lambda: said("INFO", f"job {JOB} attempt 1: the coordinator runs it now"), timeout=20)
    assert 1 == len(said("WARNING", "no coordinator has run it"))
