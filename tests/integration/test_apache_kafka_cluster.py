"""A broker of a three-node Apache Kafka cluster dies under the coordinator (issue 47, step 3).

First, what the cluster gives cutline's topics: three replicas, and every node serving a topic as
soon as its creation returns.

The cluster (``ApacheKafka(brokers=3)``: three combined broker+controller JVMs, every topic with
three replicas and ``min.insync.replicas`` 2, Kafka's default timeouts) loses the leader of a
journal partition to SIGKILL while jobs checkpoint, and gets it back on the same ports and log dir.
The journal must neither lose nor double a decision (the coordinator writes with ``acks=all``,
idempotently), and every job must complete checkpoints again; the test prints how long each took
(docs/benchmarks.md, "Broker failover"). The same on a secured cluster: SASL_SSL listeners
(SCRAM-SHA-512, a CA made for the run, the brokers replicating as the super user) and Kafka's
``StandardAuthorizer`` with cutline's ACLs (events/kafka/acls.py), every client logging in as its
role's principal.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient
from support import eventually
from test_ownership_races import Checkpointing, spread_jobs

from coordinator.core.invariants import first_violation
from coordinator.service.app import Settings, ensure_topics
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.apache_kafka import ROLE_USERS, ApacheKafka
from events.dev.broker import topic_config
from events.dev.kafka_security import ADMIN, SaslSsl
from events.kafka.client_config import CONFIG_FILE_VARIABLE, client_properties
from events.kafka.clients import job_key, partition_for, producer_config
from events.kafka.log import LogMessage, read_journal_topic, read_to_end
from events.wire.records import CheckpointCompleted, CheckpointTriggered, JournalEvent
from events.wire.topics import Topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 2


@dataclass(frozen=True)
class Cluster:
    """Three nodes, and each user's client properties file where they are secured (none: PLAINTEXT)."""

    kafka: ApacheKafka
    files: Mapping[str, Path] = field(default_factory=dict)

    @contextlib.contextmanager
    def acting_as(self, user: str) -> Iterator[None]:
        """Clients made in this process meanwhile log in as ``user`` (as anyone on a PLAINTEXT cluster)."""
        if not self.files:
            yield
            return
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(CONFIG_FILE_VARIABLE, str(self.files[user]))
            yield


@pytest.fixture(name="cluster", scope="module")
def _cluster() -> Iterator[Cluster]:
    """Three PLAINTEXT nodes, shared by the module's tests (each on topics of its own prefix): the
    node a test kills it starts again on its ports and log dir."""
    with ApacheKafka(brokers=3, heap="256m") as kafka:
        yield Cluster(kafka)


@pytest.fixture(name="secured_cluster")
def _secured_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three SASL_SSL nodes with the ``StandardAuthorizer``; a user per role (events.dev.apache_kafka)."""
    with ApacheKafka(brokers=3, heap="256m", security=SaslSsl.with_users(ROLE_USERS)) as kafka:
        yield Cluster(kafka, kafka.properties_files(tmp_path_factory.mktemp("principals")))


@pytest.fixture(autouse=True)
def _settings_of_a_real_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apache Kafka refuses a session timeout under 6 s (``group.min.session.timeout.ms``)."""
    monkeypatch.setenv("CUTLINE_SESSION_TIMEOUT", "6")


def _partitions(bootstrap: str, topic: str) -> dict[int, tuple[int, tuple[int, ...]]]:
    """Each partition's leader and in-sync replicas, as the cluster's metadata says."""
    metadata = AdminClient({"bootstrap.servers": bootstrap, **client_properties()}).list_topics(
        topic, timeout=10
    )
    return {p: (m.leader, tuple(sorted(m.isrs))) for p, m in metadata.topics[topic].partitions.items()}


def _foreign(message: LogMessage, problem: str) -> None:
    raise AssertionError(f"journal {message.partition}@{message.offset}: {problem}")


def _journal(bootstrap: str, topics: Topics) -> list[JournalEvent]:
    return [e for e, _ in read_journal_topic(bootstrap, topics.checkpoints, _foreign)]


def _ids(
    journal: list[JournalEvent], kind: type[CheckpointTriggered | CheckpointCompleted], job: str
) -> list[int]:
    return [e.checkpoint_id for e in journal if isinstance(e, kind) and e.job_id == job]


def _stored(bootstrap: str, topics: Topics) -> dict[tuple[int, int], bytes | None]:
    """Every journal record by (partition, offset)."""
    return {(m.partition, m.offset): m.value for m in read_to_end(bootstrap, topics.checkpoints)}


def test_a_cluster_of_three_replicates_cutline_s_topics_on_every_broker(
    cluster: Cluster, topic_prefix: str
) -> None:
    """Three processes sharing the controller quorum: a topic cutline creates has three replicas on
    the three brokers and ``min.insync.replicas`` 2, and a record written to it with ``acks=all`` is
    taken."""
    kafka = cluster.kafka
    assert 3 == len(set(kafka.pids.values())) == len(kafka.bootstrap.split(","))
    settings = Settings(kafka.bootstrap, topic_prefix, partitions=PARTITIONS)
    ensure_topics(settings)
    journal = settings.topics.checkpoints
    metadata = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(journal, timeout=10)
    assert {1, 2, 3} == set(metadata.brokers)
    partitions = metadata.topics[journal].partitions.values()
    assert [[1, 2, 3]] * PARTITIONS == [sorted(p.replicas) for p in partitions]
    assert "2" == topic_config(kafka.bootstrap, journal)["min.insync.replicas"]
    producer = Producer(producer_config(kafka.bootstrap))  # acks=all
    reports: list[KafkaError | None] = []
    producer.produce(journal, b"x", on_delivery=lambda error, message: reports.append(error))
    assert (0, [None]) == (producer.flush(30), reports)


def test_topics_just_created_are_served_by_every_node_when_their_creation_returns(
    cluster: Cluster, topic_prefix: str
) -> None:
    """Given three nodes, when cutline's topics are created (``ensure_topics``, behind ``cutline topics
    create`` and a coordinator's start), then as soon as it returns each node's own metadata (a client
    that knows that node alone) names every topic with all its partitions, each with a leader: a
    participant that asks any node at once finds them (the controller creates a topic, and each broker
    learns of it a moment later)."""
    settings = Settings(cluster.kafka.bootstrap, topic_prefix, partitions=PARTITIONS)
    names = [*settings.topics.all, *settings.topics.internal]

    ensure_topics(settings)

    for node in cluster.kafka.nodes:
        served = AdminClient({"bootstrap.servers": node.address}).list_topics(timeout=10).topics
        unserved = [
            name
            for name in names
            if name not in served
            or served[name].error is not None
            or PARTITIONS != len(served[name].partitions)
            or any(p.leader < 0 for p in served[name].partitions.values())
        ]
        assert [] == unserved, f"node {node.node_id} does not serve these yet"


def test_the_leader_of_a_journal_partition_killed_and_restarted_loses_and_doubles_no_decision(
    cluster: Cluster, topic_prefix: str, tmp_path: Path
) -> None:
    """Given a coordinator worker and two jobs checkpointing every 200 ms on a three-node cluster,
    when the leader of the first job's journal partition is SIGKILLed, then another replica leads
    it and every job completes checkpoints again; when the node restarts on its ports and log dir,
    it rejoins the partition's in-sync replicas and every job completes checkpoints again. Every
    journal record stored before the kill is still there at its offset, no checkpoint id is
    triggered or completed twice, and ``cutline replay --verify`` passes."""
    kill_and_restart_a_journal_leader(cluster, topic_prefix, tmp_path)


def test_on_a_sasl_ssl_cluster_with_cutline_s_acls_a_journal_leader_killed_and_restarted_stops_no_job(
    secured_cluster: Cluster, topic_prefix: str, tmp_path: Path
) -> None:
    """The same on three SASL_SSL nodes with cutline's ACLs on the test's prefix: the coordinator logs
    in as the coordinator principal, the participants and their drivers as the task principal, the
    test's reads and ``cutline replay --verify`` as the operator, each with exactly its role's ACLs;
    and the coordinator is refused nothing on the way."""
    secured_cluster.kafka.grant_roles(Topics(topic_prefix))
    kill_and_restart_a_journal_leader(secured_cluster, topic_prefix, tmp_path)


def kill_and_restart_a_journal_leader(cluster: Cluster, topic_prefix: str, tmp_path: Path) -> None:
    """SIGKILL the leader of a journal partition while two jobs checkpoint, then restart it; check the
    journal and print the times (the tests' common body)."""
    settings = Settings(cluster.kafka.bootstrap, topic_prefix, partitions=PARTITIONS)
    bootstrap, topics = settings.bootstrap, settings.topics
    with cluster.acting_as(ADMIN):
        ensure_topics(settings)  # returns once every node serves them: the participants ask any node
    job_ids = spread_jobs(PARTITIONS, PARTITIONS)
    partition = partition_for(job_key(job_ids[0]), PARTITIONS)
    with cluster.acting_as("task"):
        jobs = Checkpointing(bootstrap, topics, tmp_path, job_ids, PARTITIONS)
    coordinator = CoordinatorProcess(bootstrap, topic_prefix)
    with cluster.acting_as("operator"):
        try:
            with cluster.acting_as("coordinator"):
                coordinator.start(timeout=90)
            jobs.start()
            jobs.wait_for_new_completions(0.0, timeout=60)
            leader, replicas = _partitions(bootstrap, topics.checkpoints)[partition]
            assert 3 == len(replicas)
            stored = _stored(bootstrap, topics)

            cluster.kafka.kill(leader)
            killed_at = time.time()  # the node is gone: what completes after this was written without it
            resumed = jobs.wait_for_new_completions(killed_at, timeout=120)
            new_leader, _ = eventually(
                lambda: _partitions(bootstrap, topics.checkpoints)[partition],
                lambda led: led[0] not in (leader, -1) and leader not in led[1],
                timeout=30,
                interval=0.2,
                what=f"a new leader of journal partition {partition}, node {leader} out of its ISR",
            )

            restarted_at = time.time()
            cluster.kafka.restart(leader)
            caught_up = eventually(
                lambda: _partitions(bootstrap, topics.checkpoints)[partition],
                lambda led: leader in led[1],
                timeout=60,
                interval=0.2,
                what=f"node {leader} back in the in-sync replicas of journal partition {partition}",
            )
            rejoined = time.time() - restarted_at
            again = jobs.wait_for_new_completions(time.time(), timeout=60)
            print(
                f"journal partition {partition}: leader {leader} SIGKILLed, every job completed a checkpoint "
                f"{resumed:.1f} s later (new leader {new_leader}); restarted, in sync again after "
                f"{rejoined:.1f} s ({caught_up}), every job completed a checkpoint {again:.1f} s after that"
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\ncoordinator log:\n{coordinator.tail()}") from None
        finally:
            jobs.close()
            coordinator.stop()

        after = _stored(bootstrap, topics)
        lost = [where for where, value in stored.items() if after.get(where) != value]
        assert [] == lost, "journal records stored before the kill are gone or changed"
        journal = _journal(bootstrap, topics)
        for job in job_ids:
            for kind in (CheckpointTriggered, CheckpointCompleted):
                ids = _ids(journal, kind, job)
                assert sorted(set(ids)) == ids, f"{job}: {kind.__name__} ids doubled or out of order: {ids}"
        assert first_violation(journal) is None
        replay = subprocess.run(
            [sys.executable, "-m", "coordinator.cli", "replay", "--bootstrap", bootstrap, "--topic-prefix",
             topic_prefix, "--verify", "--quiet"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert 0 == replay.returncode, replay.stdout + replay.stderr
    refused = [line for line in coordinator.log_path.read_text().splitlines() if "AUTHORIZATION" in line]
    assert [] == refused, "the coordinator was refused what its ACLs should grant"
