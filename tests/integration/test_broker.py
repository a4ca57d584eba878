"""The topic helpers against the session's broker, and the embedded Tansu broker itself.

The tests of :class:`~events.dev.broker.EmbeddedBroker` (marked ``tansu``) start brokers of their own
whichever broker the session runs on: it is the demo's default."""

from __future__ import annotations

import os
import shutil
import socket
from collections import defaultdict

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # not re-exported
    AdminClient,
    ConfigResource,
    ResourceType,
)
from support import eventually

from events.dev.broker import BrokerError, EmbeddedBroker, create_topics, wait_for_broker

Record = tuple[str, int, int, bytes, bytes]  # topic, partition, offset, key, value


def topic_names(bootstrap: str) -> set[str]:
    """Names of the topics the broker reports."""
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def read_all(bootstrap: str, topics: list[str], expected: int, timeout: float = 10) -> list[Record]:
    """Read every partition of ``topics`` from the beginning until ``expected`` records arrived."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",  # assign() needs no group, librdkafka still wants an id
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        consumer.assign(
            [
                TopicPartition(topic, partition, OFFSET_BEGINNING)
                for topic in topics
                for partition in metadata.topics[topic].partitions
            ]
        )
        records: list[Record] = []

        def read_one() -> int:
            msg = consumer.poll(0.2)
            if msg is not None:  # an empty message is falsy: compare with None
                if msg.error() is not None:
                    pytest.fail(f"consumer error: {msg.error()}")
                records.append(
                    (msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value())  # type: ignore[arg-type]
                )
            return len(records)

        eventually(
            read_one, lambda read: read >= expected, timeout=timeout, interval=0, what=f"{expected} records"
        )
        return records
    finally:
        consumer.close()


def test_keyed_messages_round_trip_and_each_key_keeps_one_partition(
    bootstrap: str, topic_prefix: str
) -> None:
    """Given two 8-partition topics, when keyed messages are produced and read back,
    then every message arrives once, in offset order, and each key sits on one partition in both."""
    topics = [f"{topic_prefix}left", f"{topic_prefix}right"]
    assert create_topics(bootstrap, topics) == topics
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    assert [len(metadata.topics[t].partitions) for t in topics] == [8, 8]

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    reports: dict[tuple[str, bytes], int] = {}
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failures.append(err)
        else:
            reports[(msg.topic() or "", msg.value() or b"")] = msg.partition() or 0

    keys = [f"job-{i}".encode() for i in range(16)]
    sent = [(t, k, f"{k.decode()}#{n}".encode()) for t in topics for n in range(5) for k in keys]
    for topic, key, value in sent:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    assert producer.flush(10) == 0
    assert failures == []

    records = read_all(bootstrap, topics, expected=len(sent))

    assert sorted((t, k, v) for t, _, _, k, v in records) == sorted(sent)
    assert all(reports[(t, v)] == p for t, p, _, _, v in records)
    partitions_of_key: dict[bytes, set[int]] = defaultdict(set)
    offsets: dict[tuple[str, int], list[int]] = defaultdict(list)
    for topic, partition, offset, key, _ in records:
        partitions_of_key[key].add(partition)
        offsets[(topic, partition)].append(offset)
    assert all(len(ps) == 1 for ps in partitions_of_key.values())
    assert len({p for t, p in offsets}) > 1
    assert all(offs == list(range(len(offs))) for offs in offsets.values())


def test_create_topics_is_idempotent_and_honours_partitions_and_config(
    bootstrap: str, topic_prefix: str
) -> None:
    """Given some topics exist, when create_topics gets old and new names, then it creates only
    the new ones, each with the asked partition count and config."""
    first = [f"{topic_prefix}a", f"{topic_prefix}b"]
    newer = f"{topic_prefix}c"
    compact = {"cleanup.policy": "compact"}

    assert create_topics(bootstrap, first, partitions=3, config=compact) == first
    assert create_topics(bootstrap, first, partitions=3, config=compact) == []
    assert create_topics(bootstrap, [first[0], newer, newer], partitions=3) == [newer]
    assert create_topics(bootstrap, []) == []

    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=10)
    assert {t: len(metadata.topics[t].partitions) for t in [*first, newer]} == dict.fromkeys(
        [*first, newer], 3
    )
    resource = ConfigResource(ResourceType.TOPIC, first[0])
    config = admin.describe_configs([resource])[resource].result(timeout=10)
    assert config["cleanup.policy"].value == "compact"


@pytest.mark.tansu
def test_stop_ends_the_process_and_frees_the_port(topic_prefix: str) -> None:
    """Given a running broker, when it is stopped, then its process group is gone, nothing answers
    on its port, and a new broker can take the port (with none of the old data)."""
    broker = EmbeddedBroker().start()
    pid, port = broker.pid, broker.port
    assert pid is not None
    create_topics(broker.bootstrap, [f"{topic_prefix}old"], partitions=1)

    broker.stop()
    broker.stop()  # idempotent

    assert broker.pid is None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    with pytest.raises(TimeoutError):
        wait_for_broker(f"127.0.0.1:{port}", timeout=1)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
    with EmbeddedBroker(port) as again:
        assert again.bootstrap == f"127.0.0.1:{port}"
        assert f"{topic_prefix}old" not in topic_names(again.bootstrap)


@pytest.mark.tansu
def test_the_embedded_broker_gives_its_process_the_short_fetch_wait_its_deviation_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tansu answers a fetch that finds nothing only after half its wait (docs/embedded-broker.md), so
    while it runs, this process and its children fetch with CUTLINE_FETCH_WAIT_MS=5 instead of the
    500 ms that suits Apache Kafka; a wait the user set is theirs, and a stopped broker leaves none."""
    monkeypatch.delenv("CUTLINE_FETCH_WAIT_MS", raising=False)
    with EmbeddedBroker():
        assert "5" == os.environ.get("CUTLINE_FETCH_WAIT_MS")
    assert "CUTLINE_FETCH_WAIT_MS" not in os.environ

    monkeypatch.setenv("CUTLINE_FETCH_WAIT_MS", "100")
    with EmbeddedBroker():
        assert "100" == os.environ["CUTLINE_FETCH_WAIT_MS"]
    assert "100" == os.environ["CUTLINE_FETCH_WAIT_MS"]


@pytest.mark.tansu
def test_a_second_broker_runs_beside_the_session_broker(bootstrap: str, topic_prefix: str) -> None:
    """Given the session broker, when a second one starts, then it has its own port and topics."""
    with EmbeddedBroker() as other:
        assert other.bootstrap != bootstrap
        assert create_topics(other.bootstrap, [f"{topic_prefix}x"], partitions=1)
        assert f"{topic_prefix}x" in topic_names(other.bootstrap)
        assert f"{topic_prefix}x" not in topic_names(bootstrap)


@pytest.mark.tansu
def test_start_fails_with_the_log_tail_when_the_port_is_taken() -> None:
    """Given a port held by another socket, when a broker starts on it, then BrokerError shows its log."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        broker = EmbeddedBroker(holder.getsockname()[1], startup_timeout=10)
        with pytest.raises(BrokerError, match="Address in use"):
            broker.start()
    assert broker.pid is None
    if broker.log_path is not None:
        shutil.rmtree(broker.log_path.parent)


def test_tests_in_this_directory_are_marked_integration(request: pytest.FixtureRequest) -> None:
    """Given the integration conftest, when tests are collected, then each carries the marker."""
    assert request.node.get_closest_marker("integration") is not None
