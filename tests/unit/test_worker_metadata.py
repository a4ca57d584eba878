"""The worker writes an outcome's ``_metadata`` objects before the journal records that refer to them
(issue 52): the runtime only encodes them; a partition whose object cannot be written writes nothing
of the batch and recovers, as after a failed journal write."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path

from coordinator.core.snapshot import PartitionSnapshot
from coordinator.service.ports import StoredMetadata, SystemClock, ThreadExecutor
from coordinator.service.runtime import Coordinator, MetadataObject, Outcome, Outgoing
from coordinator.service.worker import Worker
from coordinator.service.writer import Written
from events.kafka.clients import job_key, partition_for
from events.task.completion_metadata import resolve_completion
from events.wire.codec import encode
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointCompleted,
    CheckpointConfig,
    JobStatus,
    JobStatusChanged,
)
from events.wire.sizes import TopicLimits
from events.wire.topics import Topics

TOPICS = Topics("m.")
PARTITIONS = 4


class Recorded:
    """The writes and metadata objects, in the order they happened."""

    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.order: list[str] = []
        self.failing = failing
        self.objects: dict[str, bytes] = {}

    def write(self, uri: str, frame: bytes) -> None:
        """:class:`~coordinator.service.ports.MetadataObjects`."""
        if uri in self.failing:
            raise OSError(f"no space left for {uri}")
        self.objects[uri] = frame
        self.order.append(f"metadata {uri}")

    async def write_messages(self, messages: Sequence[Outgoing]) -> Written:
        written = Written()
        for offset, message in enumerate(messages):
            self.order.append(f"{message.topic} {message.key.decode()}")
            home = partition_for(job_key(message.key.decode()), PARTITIONS)
            written.last_offsets[(message.topic, home)] = offset
        return written


class Writes:
    def __init__(self, recorded: Recorded) -> None:
        self.write = recorded.write_messages

    async def write_snapshot(self, snapshot: PartitionSnapshot) -> bool:
        return True


def worker_over(recorded: Recorded) -> Worker:
    runtime = Coordinator(TOPICS, partitions=PARTITIONS)
    nothing: object = None
    return Worker(
        "w0",
        runtime,
        asyncio.Lock(),
        Writes(recorded),
        nothing,  # type: ignore[arg-type]
        ThreadExecutor(),
        SystemClock(),
        metadata=recorded,
    )


def outcome_of(job: str, uri: str | None) -> Outcome:
    journal = Outgoing(TOPICS.checkpoints, job.encode(), b"record")
    barrier = Outgoing(TOPICS.barriers, job.encode(), b"barrier")
    metadata = [MetadataObject(uri, b"frame")] if uri else []
    return Outcome(job_id=job, messages=[journal, barrier], metadata=metadata)


def jobs_in_two_partitions() -> tuple[str, str]:
    names = [f"job-{i}" for i in range(20)]
    first = names[0]
    home = partition_for(job_key(first), PARTITIONS)
    second = next(n for n in names if partition_for(job_key(n), PARTITIONS) != home)
    return first, second


class TestPublish:
    def test_metadata_objects_are_written_before_the_journal(self) -> None:
        """Given an outcome with a metadata object, when published, then the object is written first,
        then the journal record, then the barrier."""
        recorded = Recorded()
        worker = worker_over(recorded)

        failed = asyncio.run(worker.publish([outcome_of("a", "file:///c/a/chk-1/_metadata")]))

        assert set() == failed
        assert [
            "metadata file:///c/a/chk-1/_metadata",
            f"{TOPICS.checkpoints} a",
            f"{TOPICS.barriers} a",
        ] == recorded.order

    def test_a_metadata_object_not_written_holds_back_its_partition_only(self) -> None:
        """Given two jobs in two partitions, one of whose metadata objects cannot be written, when
        published, then that partition writes nothing and is reported failed (it recovers); the
        other's records are written."""
        lost, kept = jobs_in_two_partitions()
        recorded = Recorded(failing=frozenset({"file:///c/lost/_metadata"}))
        worker = worker_over(recorded)

        failed = asyncio.run(
            worker.publish([outcome_of(lost, "file:///c/lost/_metadata"), outcome_of(kept, None)])
        )

        assert {partition_for(job_key(lost), PARTITIONS)} == failed
        assert [f"{TOPICS.checkpoints} {kept}", f"{TOPICS.barriers} {kept}"] == recorded.order


class TestRuntimeWritesNoFile:
    def test_a_completion_too_large_for_the_journal_carries_its_object_in_the_outcome(
        self, tmp_path: Path
    ) -> None:
        """Given a journal of 16 KB and two tasks whose offsets make a larger completion, when the
        last ack is decided, then the outcome carries the metadata object (the full completion) and
        the journal its reference, and nothing is written to the file system until the worker
        writes it."""
        coordinator = Coordinator(
            TOPICS, rng=random.Random(1), limits=TopicLimits({TOPICS.checkpoints: 16_000})
        )
        config = CheckpointConfig(interval_ms=100, location=tmp_path.as_uri())
        status = JobStatusChanged("j", JobStatus.RUNNING, 0, 1, ("a", "b"), config)
        coordinator.handle(TOPICS.job_status, 0, 0, b"j", encode(status), 0)
        coordinator.tick("j", 10_000)

        def ack(task: str, first: int) -> bytes:
            return encode(
                CheckpointAcknowledged(
                    "j", 1, 1, task, 0, None, {f"words:{p}": p for p in range(first, first + 700)}
                )
            )

        coordinator.handle(TOPICS.acks, 0, 1, b"j", ack("a", 0), 10_001)
        outcome = coordinator.handle(TOPICS.acks, 0, 2, b"j", ack("b", 700), 10_002)

        (completed,) = [e for e in outcome.journal if isinstance(e, CheckpointCompleted)]
        (written,) = outcome.metadata
        assert completed.metadata is not None and written.uri == completed.metadata.uri
        assert [] == list(tmp_path.rglob("_metadata"))
        (tmp_path / "j" / "chk-1").mkdir(parents=True)
        StoredMetadata().write(written.uri, written.frame)  # as the worker does
        assert 1400 == len(resolve_completion(completed).offsets)
