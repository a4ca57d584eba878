"""What only a real broker shows: cutline on Apache Kafka itself (events/dev/apache_kafka.py).

One Apache Kafka node (KRaft, :data:`~events.dev.apache_kafka.KAFKA_VERSION`) serves the module; its
jars are fetched with Maven the first time on a machine (``~/.cache/cutline``). Each finding is
one that the embedded broker cannot show (docs/embedded-broker.md): the broker's own record-size
limit, its report of every topic setting, a compacted topic, and its group protocol under the
coordinator.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, ConfigEntry, ConfigResource, NewTopic
from support import eventually

from coordinator.service.app import (
    JournalRetentionError,
    Settings,
    broker_supports_idempotence,
    check_journal_retention,
    ensure_topics,
)
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.apache_kafka import ApacheKafka
from events.dev.broker import create_topics, max_message_bytes, topic_config
from events.kafka.clients import producer_config
from events.kafka.log import read_journal_topic
from events.task.participant import JobDriver, Participant
from events.wire.records import CheckpointBarrier, CheckpointCompleted, CheckpointConfig, JobStatus
from events.wire.sizes import DEFAULT_MAX_MESSAGE_BYTES, RECORD_OVERHEAD
from events.wire.topics import Topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSION_TIMEOUT = "6"
"""The coordinator's session timeout here: Apache Kafka refuses less than its
``group.min.session.timeout.ms`` (6 s) by default, and this module's broker keeps Kafka's defaults;
the suite's brokers lower it to 1 s for the suite's 3 s (``support.TEST_KAFKA_CONFIG``)."""


@pytest.fixture(name="kafka", scope="module")
def _kafka() -> Iterator[ApacheKafka]:
    """One Apache Kafka node for the module."""
    with ApacheKafka() as kafka:
        yield kafka


@pytest.fixture(name="settings")
def _settings(kafka: ApacheKafka, topic_prefix: str) -> Settings:
    """The protocol's topics of the test's own, made as ``cutline topics create`` makes them."""
    settings = Settings(kafka.bootstrap, topic_prefix, partitions=2)
    ensure_topics(settings)
    return settings


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _produce(bootstrap: str, topic: str, value: bytes) -> KafkaError | None:
    """Produce one record, alone in its batch, with no client-side size limit in the way; the
    delivery report's error (None when the broker took it)."""
    producer = Producer(
        producer_config(
            bootstrap, {"message.max.bytes": 4 * DEFAULT_MAX_MESSAGE_BYTES, "compression.type": "none"}
        )
    )
    reports: list[KafkaError | None] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        reports.append(error)

    producer.produce(topic, value=value, on_delivery=delivered)
    assert 0 == producer.flush(30)
    (error,) = reports
    return error


def test_the_broker_starts_serves_metadata_and_stops_leaving_no_process() -> None:
    """A node of its own: it answers with its cluster id and one broker within seconds, and after
    stop() its JVM is gone and its temp dir deleted."""
    started = time.monotonic()
    kafka = ApacheKafka(heap="256m")
    with kafka:
        took = time.monotonic() - started
        metadata = _admin(kafka.bootstrap).list_topics(timeout=10)
        assert kafka.cluster_id == metadata.cluster_id
        assert [1] == sorted(metadata.brokers)
        (pid,) = kafka.pids.values()
        directory = kafka.nodes[0].directory
        assert directory.is_dir()
    assert took < 60, f"Apache Kafka took {took:.1f}s to start"
    assert not Path(f"/proc/{pid}").exists(), "the broker's JVM is still there"
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # nothing is left of its process group
    assert not directory.exists()
    assert {} == kafka.pids


def test_topics_cutline_creates_have_the_settings_it_relies_on(settings: Settings) -> None:
    """The broker reports every topic setting (with its source), not only those given at creation:
    the protocol topics have Apache Kafka's default limit, the journal keeps every record, the
    snapshots are compacted, and the coordinator's retention check passes on what the broker says."""
    topics = settings.topics
    limits = max_message_bytes(settings.bootstrap, [*topics.all, topics.ticks])
    assert {DEFAULT_MAX_MESSAGE_BYTES} == set(limits.values()), limits
    journal = topic_config(settings.bootstrap, topics.checkpoints)
    assert ("-1", "-1") == (journal["retention.ms"], journal["retention.bytes"])
    assert "delete" == journal["cleanup.policy"]
    assert "segment.bytes" in journal  # a broker default, reported as Tansu does not
    check_journal_retention(settings)
    snapshots = topic_config(settings.bootstrap, topics.snapshots)
    assert "compact" == snapshots["cleanup.policy"]


def test_a_journal_made_without_cutline_s_settings_is_refused(kafka: ApacheKafka, topic_prefix: str) -> None:
    """A journal created with the broker's defaults (as ``create_topics`` alone makes it) has
    Apache Kafka's 7-day retention, which the coordinator refuses; on the embedded broker, which
    reports no default, the check passed."""
    settings = Settings(kafka.bootstrap, topic_prefix)
    create_topics(kafka.bootstrap, [settings.topics.checkpoints], partitions=1)
    with pytest.raises(JournalRetentionError, match="retention.ms=604800000"):
        check_journal_retention(settings)


def test_the_broker_enforces_max_message_bytes_on_topics_cutline_creates(settings: Settings) -> None:
    """The limit is the broker's, not a simulation: the largest value cutline's size rule lets it
    write (the limit less :data:`RECORD_OVERHEAD`) is taken, a value of the limit itself is refused
    by the broker with MSG_SIZE_TOO_LARGE (the producer's own limit was raised out of the way)."""
    topic = settings.topics.checkpoints
    assert DEFAULT_MAX_MESSAGE_BYTES == int(topic_config(settings.bootstrap, topic)["max.message.bytes"])
    assert _produce(settings.bootstrap, topic, b"x" * (DEFAULT_MAX_MESSAGE_BYTES - RECORD_OVERHEAD)) is None
    refused = _produce(settings.bootstrap, topic, b"x" * DEFAULT_MAX_MESSAGE_BYTES)
    assert refused is not None and KafkaError.MSG_SIZE_TOO_LARGE == refused.code(), refused


def test_the_broker_default_max_message_bytes_is_cutline_s(kafka: ApacheKafka) -> None:
    """The broker's own default (``message.max.bytes``, 1,048,588) is the limit cutline creates its
    topics with (:data:`DEFAULT_MAX_MESSAGE_BYTES`): a topic made with no setting has it too."""
    name = f"plain-{uuid4().hex[:8]}"
    admin = _admin(kafka.bootstrap)
    (future,) = admin.create_topics([NewTopic(name, 1)]).values()
    future.result(timeout=30)

    def described() -> ConfigEntry:
        (config,) = admin.describe_configs([ConfigResource("topic", name)]).values()
        try:
            return config.result(timeout=30)["max.message.bytes"]
        except KafkaException as exc:
            raise AssertionError(str(exc)) from None

    # the broker answers UNKNOWN_TOPIC_OR_PART until the topic reaches its metadata
    entry = eventually(described, timeout=10, what=f"the configs of {name}")
    assert str(DEFAULT_MAX_MESSAGE_BYTES) == entry.value
    assert entry.is_default


def test_the_broker_grants_the_coordinator_an_idempotent_producer(kafka: ApacheKafka) -> None:
    """aiokafka's (Faust's) idempotent producer starts, so the coordinator's journal writes are
    idempotent here (on the embedded broker, InitProducerId v0 fails and it runs without)."""
    assert (True, "the broker granted a producer id") == broker_supports_idempotence(kafka.bootstrap)


def _completions(bootstrap: str, topics: Topics, job: str) -> list[CheckpointCompleted]:
    journal = read_journal_topic(bootstrap, topics.checkpoints, lambda message, problem: None)
    return [event for event, _ in journal if isinstance(event, CheckpointCompleted) and event.job_id == job]


def test_a_job_of_two_participants_completes_checkpoints_under_the_coordinator(
    settings: Settings, tmp_path: Path
) -> None:
    """The whole flow on Apache Kafka: a ``cutline coordinator`` worker (Kafka's group protocol, an
    idempotent producer), a job driver and two participants; checkpoints complete with a handle per
    task, and the job finishes."""
    bootstrap, topics = settings.bootstrap, settings.topics
    job = f"job-{uuid4().hex[:6]}"
    counts = {"task-0": 0, "task-1": 0}

    def snapshotter(task: str) -> Callable[[CheckpointBarrier], bytes]:
        def snapshot(barrier: CheckpointBarrier) -> bytes:
            counts[task] += 10
            return str(counts[task]).encode()

        return snapshot

    def offsets(task: str) -> Callable[[], dict[str, int]]:
        return lambda: {f"in:{task.removeprefix('task-')}": counts[task]}

    coordinator = CoordinatorProcess(
        bootstrap, settings.prefix, extra_args=("--session-timeout", SESSION_TIMEOUT)
    )
    participants = [
        Participant(bootstrap, job, task, 1, topics, snapshotter(task), offsets(task)) for task in counts
    ]
    driver = JobDriver(bootstrap, job, topics)
    try:
        coordinator.start()
        for participant in participants:
            participant.run_in_thread()
        driver.running(
            tuple(counts), CheckpointConfig(interval_ms=300, location=tmp_path.as_uri()), attempt=1
        )
        try:
            done = eventually(
                lambda: _completions(bootstrap, topics, job),
                lambda completed: len(completed) >= 3,
                timeout=60,
                interval=0.2,
                what="three completed checkpoints",
            )
        except AssertionError as error:
            raise AssertionError(f"{error}; coordinator log:\n{coordinator.tail()}") from None
        assert all(set(counts) == set(completed.handles) for completed in done)
        ids = [completed.checkpoint_id for completed in done]
        assert sorted(set(ids)) == ids
        driver.status(JobStatus.FINISHED)
    finally:
        for participant in participants:
            participant.close()
        driver.close()
        coordinator.stop()
