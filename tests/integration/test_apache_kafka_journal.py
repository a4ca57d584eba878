"""The journal and its snapshots on Apache Kafka: what only a real broker shows (issue 47, step 3).

One Apache Kafka node serves the module, its log cleaner looking for work every 100 ms
(``log.cleaner.backoff.ms``; 15 s by default). A journal write retried after its connection was
dropped must land once (the coordinator's writer is idempotent with ``acks=all`` where the broker
grants it, as Apache Kafka does), and the compacted snapshots topic must really be compacted with
recovery still finding its snapshot: neither can happen on the embedded broker, which grants no
idempotent producer to aiokafka and never compacts (docs/embedded-broker.md).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from random import Random

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from support import eventually
from test_ownership_races import Checkpointing, spread_jobs

from coordinator.core.decider import fold_jobs
from coordinator.core.state import state_json
from coordinator.service.app import Settings, broker_supports_idempotence, ensure_topics
from coordinator.service.claims import claim_partition, snapshot_key
from coordinator.service.runtime import Outgoing
from coordinator.service.supervisor import CoordinatorProcess
from coordinator.service.writer import Writer, Written
from coordinator.simulation.traffic import simulate
from events.dev.apache_kafka import ApacheKafka
from events.dev.broker import create_topics
from events.kafka.clients import consumer_config, job_key, watermark_offsets
from events.kafka.log import LogMessage, read_journal_topic, read_to_end
from events.wire.codec import encode
from events.wire.records import CheckpointCompleted, JournalEvent
from events.wire.topics import Topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLEANER_BACKOFF = {"log.cleaner.backoff.ms": "100"}
"""The broker's log cleaner looks for a log to clean every 100 ms (Kafka's default: 15 s)."""

FAST_COMPACTION = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"}
"""The snapshots topic rolls a segment at its first write after 100 ms (only closed segments are
cleaned) and is cleaned as soon as anything in it is dirty."""

REQUEST_TIMEOUT_MS = "1000"
"""``socket.timeout.ms`` of the writer under test (``CUTLINE_KAFKA_SOCKET_TIMEOUT_MS``, as a user
sets any client property): librdkafka gives up on an unanswered request after it, drops the
connection and sends the batch again on a new one."""


@pytest.fixture(name="kafka", scope="module")
def _kafka() -> Iterator[ApacheKafka]:
    with ApacheKafka(heap="384m", config=CLEANER_BACKOFF) as kafka:
        yield kafka


@pytest.fixture(autouse=True)
def _settings_of_a_real_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apache Kafka refuses a session timeout under 6 s (``group.min.session.timeout.ms``)."""
    monkeypatch.setenv("CUTLINE_SESSION_TIMEOUT", "6")


def _foreign(message: LogMessage, problem: str) -> None:
    raise AssertionError(f"journal {message.partition}@{message.offset}: {problem}")


# ------------------------------------------------------------ a write retried after a dropped connection


class RequestTimeouts(logging.Handler):
    """librdkafka's reports of a request it gave up waiting for (``REQTMOUT``), as logged by the
    clients' logger."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "Timed out" in message and "in-flight" in message:
            self.seen.append(message)


def _write_through_a_broker_pause(
    kafka: ApacheKafka, topics: Topics, events: list[JournalEvent], paused_at: int, idempotent: bool
) -> Written:
    """Write ``events`` to the journal as the coordinator does (its :class:`Writer`, one batch at a
    time, each awaited), the broker paused (SIGSTOP) while the event at ``paused_at`` is in flight
    until the writer has timed its request out and dropped the connection; what the broker
    answered for that event."""
    timeouts = RequestTimeouts()
    clients_log = logging.getLogger("events.kafka.clients")
    clients_log.addHandler(timeouts)
    writer = Writer(kafka.bootstrap, idempotent=idempotent, home=lambda key: 0)
    outgoing = [Outgoing(topics.checkpoints, job_key(e.job_id), encode(e)) for e in events]

    async def write() -> Written:
        assert not (await writer.write(outgoing[:paused_at])).failed
        kafka.pause(1)
        try:
            retried = writer.write(outgoing[paused_at : paused_at + 1])
            await asyncio.to_thread(
                eventually, lambda: timeouts.seen, timeout=30, what="the writer to time its request out"
            )
        finally:
            kafka.resume(1)
        answered = await retried
        assert not (await writer.write(outgoing[paused_at + 1 :])).failed
        return answered

    try:
        return asyncio.run(write())
    finally:
        writer.close()
        clients_log.removeHandler(timeouts)


def _replay_verify(bootstrap: str, topics: Topics) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "replay", "--bootstrap", bootstrap, "--topic-prefix",
         topics.prefix, "--verify", "--quiet"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture(name="journal")
def _journal(kafka: ApacheKafka, topic_prefix: str, monkeypatch: pytest.MonkeyPatch) -> Topics:
    """A journal of one partition, and writers that give up on a request after 1 s."""
    monkeypatch.setenv("CUTLINE_KAFKA_SOCKET_TIMEOUT_MS", REQUEST_TIMEOUT_MS)
    topics = Topics(topic_prefix)
    create_topics(kafka.bootstrap, [topics.checkpoints], partitions=1, config={"retention.ms": "-1"})
    return topics


SIMULATED = list(islice(simulate(Random(5), jobs=1), 40))
"""Forty journal events of one job: a start, heartbeats, checkpoints triggered, acknowledged and
completed."""

FIRST_COMPLETION = next(i for i, e in enumerate(SIMULATED) if isinstance(e, CheckpointCompleted))


def test_a_journal_write_retried_after_the_broker_dropped_out_lands_once(
    kafka: ApacheKafka, journal: Topics
) -> None:
    """The coordinator's writer, idempotent as the broker allows (it does), writes a completion
    while the broker is stopped: the request times out, the connection is dropped, and the batch
    is sent again once the broker is back, which has meanwhile stored the first attempt. The
    retry is answered with the first attempt's offset, the journal holds every event once, in
    order, and ``cutline replay --verify`` passes."""
    idempotent, why = broker_supports_idempotence(kafka.bootstrap)
    assert idempotent, why

    answered = _write_through_a_broker_pause(kafka, journal, SIMULATED, FIRST_COMPLETION, idempotent)

    assert {(journal.checkpoints, 0): FIRST_COMPLETION} == answered.last_offsets
    stored = [m.value for m in read_to_end(kafka.bootstrap, journal.checkpoints)]
    assert [encode(e) for e in SIMULATED] == stored
    replay = _replay_verify(kafka.bootstrap, journal)
    assert 0 == replay.returncode, replay.stdout + replay.stderr


def test_without_idempotence_the_same_retry_lands_twice(kafka: ApacheKafka, journal: Topics) -> None:
    """The same pause with the writer the coordinator uses where a broker refuses idempotence (one
    request in flight, retried): the completion is stored twice, and ``cutline replay --verify``
    refuses the journal. (What the test above would see if the coordinator's writes were not
    idempotent.)"""
    answered = _write_through_a_broker_pause(kafka, journal, SIMULATED, FIRST_COMPLETION, idempotent=False)

    assert {(journal.checkpoints, 0): FIRST_COMPLETION + 1} == answered.last_offsets
    stored = [m.value for m in read_to_end(kafka.bootstrap, journal.checkpoints)]
    assert len(SIMULATED) + 1 == len(stored)
    assert stored[FIRST_COMPLETION] == stored[FIRST_COMPLETION + 1] == encode(SIMULATED[FIRST_COMPLETION])
    replay = _replay_verify(kafka.bootstrap, journal)
    assert 0 != replay.returncode
    assert "complete-only-pending" in replay.stdout + replay.stderr


# ------------------------------------------------------------ the snapshots topic, compacted


def _alter(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    admin = AdminClient(consumer_config(bootstrap))
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in config.items()]
    (future,) = admin.incremental_alter_configs(
        [ConfigResource("topic", topic, incremental_configs=entries)]
    ).values()
    future.result(timeout=30)


def _kept(bootstrap: str, topic: str, partition: int) -> tuple[int, int, list[int]]:
    """The partition's log start and end offsets, and the offsets of the records it still holds."""
    from confluent_kafka import Consumer

    consumer = Consumer(consumer_config(bootstrap))
    try:
        low, high = watermark_offsets(consumer, TopicPartition(topic, partition))
    finally:
        consumer.close()
    kept = [m.offset for m in read_to_end(bootstrap, topic, [partition], timeout=10)]
    return low, high, kept


def test_the_snapshots_topic_is_compacted_and_recovery_reads_one_snapshot_per_partition(
    kafka: ApacheKafka, topic_prefix: str, tmp_path: Path
) -> None:
    """A worker snapshots each journal partition every 0.2 s while two jobs checkpoint; the broker's
    log cleaner compacts the snapshots topic (created by cutline, made to roll and clean quickly):
    of the dozens of snapshots written to each partition it keeps a few, the latest among them,
    and the log still starts at 0 (compaction, not retention). After the worker is killed, a
    recovery of each partition reads one snapshot and folds only the journal after it, to the
    state a fold of the whole journal gives."""
    settings = Settings(kafka.bootstrap, topic_prefix, partitions=2)
    ensure_topics(settings)
    bootstrap, topics = settings.bootstrap, settings.topics
    _alter(bootstrap, topics.snapshots, FAST_COMPACTION)
    coordinator = CoordinatorProcess(bootstrap, topic_prefix, extra_args=("--snapshot-interval", "0.2"))
    jobs = Checkpointing(bootstrap, topics, tmp_path, spread_jobs(2, 2), 2)

    def compacted(seen: list[tuple[int, int, list[int]]]) -> bool:
        return all(
            low == 0 and high >= 30 and len(kept) <= 3 and kept[-1] == high - 1 for low, high, kept in seen
        )

    try:
        coordinator.start()
        jobs.start()
        seen = eventually(
            lambda: [_kept(bootstrap, topics.snapshots, p) for p in (0, 1)],
            compacted,
            timeout=90,
            interval=0.5,
            what="each snapshots partition compacted: (log start, end, offsets kept)",
        )
        coordinator.kill_all()
    finally:
        jobs.close()
        coordinator.stop()
    print(f"snapshots kept of those written, per partition: {[(len(k), h) for _, h, k in seen]}")
    keys = {m.key for m in read_to_end(bootstrap, topics.snapshots)}
    assert {snapshot_key(0), snapshot_key(1)} == keys

    for partition in (0, 1):
        claimed = claim_partition(bootstrap, topics, topics.snapshots, 2, partition, "after-compaction")

        assert 1 == claimed.snapshots_read
        assert claimed.snapshot_offset is not None
        journal = [e for e, _ in read_journal_topic(bootstrap, topics.checkpoints, _foreign, [partition])]
        assert claimed.folded < len(journal) / 2, "the fold started at the snapshot, not at offset 0"
        expected = {job: state_json(state) for job, state in fold_jobs(journal).items()}
        assert expected == {job: state_json(s) for job, s in claimed.coordinator.states.items()}
