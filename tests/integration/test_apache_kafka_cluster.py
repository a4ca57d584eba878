"""A broker of a three-node Apache Kafka cluster dies under the coordinator (issue 47, step 3).

The cluster (``ApacheKafka(brokers=3)``: three combined broker+controller JVMs, every topic with
three replicas and ``min.insync.replicas`` 2, Kafka's default timeouts) loses the leader of a
journal partition to SIGKILL while jobs checkpoint, and gets it back on the same ports and log dir.
The journal must neither lose nor double a decision (the coordinator writes with ``acks=all``,
idempotently), and every job must complete checkpoints again; the test prints how long each took
(docs/benchmarks.md, "Broker failover").
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from support import eventually
from test_ownership_races import Checkpointing, spread_jobs

from coordinator.invariants import first_violation
from coordinator.service.app import Settings, ensure_topics
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.apache_kafka import ApacheKafka
from events.kafka.clients import job_key, partition_for
from events.kafka.log import LogMessage, read_journal_topic, read_to_end
from events.wire.records import CheckpointCompleted, CheckpointTriggered, JournalEvent
from events.wire.topics import Topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 2


@pytest.fixture(name="cluster", scope="module")
def _cluster() -> Iterator[ApacheKafka]:
    with ApacheKafka(brokers=3, heap="256m") as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def _settings_of_a_real_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apache Kafka refuses a session timeout under 6 s (``group.min.session.timeout.ms``)."""
    monkeypatch.setenv("CUTLINE_SESSION_TIMEOUT", "6")


def _partitions(bootstrap: str, topic: str) -> dict[int, tuple[int, tuple[int, ...]]]:
    """Each partition's leader and in-sync replicas, as the cluster's metadata says."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
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


def test_the_leader_of_a_journal_partition_killed_and_restarted_loses_and_doubles_no_decision(
    cluster: ApacheKafka, topic_prefix: str, tmp_path: Path
) -> None:
    """Given a coordinator worker and two jobs checkpointing every 200 ms on a three-node cluster,
    when the leader of the first job's journal partition is SIGKILLed, then another replica leads
    it and every job completes checkpoints again; when the node restarts on its ports and log dir,
    it rejoins the partition's in-sync replicas and every job completes checkpoints again. Every
    journal record stored before the kill is still there at its offset, no checkpoint id is
    triggered or completed twice, and ``cutline replay --verify`` passes."""
    settings = Settings(cluster.bootstrap, topic_prefix, partitions=PARTITIONS)
    ensure_topics(settings)
    bootstrap, topics = settings.bootstrap, settings.topics
    job_ids = spread_jobs(PARTITIONS, PARTITIONS)
    partition = partition_for(job_key(job_ids[0]), PARTITIONS)
    jobs = Checkpointing(bootstrap, topics, tmp_path, job_ids, PARTITIONS)
    coordinator = CoordinatorProcess(bootstrap, topic_prefix)
    try:
        coordinator.start(timeout=90)
        jobs.start()
        jobs.wait_for_new_completions(0.0, timeout=60)
        leader, replicas = _partitions(bootstrap, topics.checkpoints)[partition]
        assert 3 == len(replicas)
        stored = _stored(bootstrap, topics)

        cluster.kill(leader)
        killed_at = time.time()  # the node is gone: what completes after this was written without it
        resumed = jobs.wait_for_new_completions(killed_at, timeout=120)
        new_leader, _ = eventually(
            lambda: _partitions(bootstrap, topics.checkpoints)[partition],
            lambda led: led[0] not in (leader, -1) and leader not in led[1],
            timeout=30,
            interval=0.2,
            what=f"a new leader of journal partition {partition}, node {leader} out of its in-sync replicas",
        )

        restarted_at = time.time()
        cluster.restart(leader)
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
