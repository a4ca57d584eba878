"""Secured Kafka, for real (issue 47, step 4): SASL_SSL, SCRAM-SHA-512 and cutline's ACLs.

One Apache Kafka node serves the module (events/dev/kafka_security.py): a SASL_SSL listener with a CA
and a broker certificate made for the test, SCRAM-SHA-512 users created when its storage is
formatted, and Kafka's ``StandardAuthorizer`` with no access for anyone but what ACLs grant. An
administrator creates the protocol's topics and the ACLs of cutline's trust model
(:mod:`events.kafka.acls`, docs/security.md): the coordinator alone writes the journal, the barriers
and its own topics; a task writes acknowledgements and declines and reads barriers and the journal;
a driver writes statuses; an operator writes requests. Every client takes its principal's settings
as a user gives them: a properties file of mode 0600 named by ``CUTLINE_KAFKA_CONFIG``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from support import eventually

from coordinator.service.app import Settings, ensure_topics
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.apache_kafka import ApacheKafka
from events.dev.broker import create_topics
from events.dev.kafka_security import ADMIN, SaslSsl
from events.kafka.acls import Grant, Role, acl_bindings, application_grants, grant_bindings
from events.kafka.client_config import CONFIG_FILE_VARIABLE
from events.kafka.clients import consumer_config, job_key, producer_config
from events.kafka.log import LogMessage, read_to_end
from events.task.participant import JobDriver, Participant
from events.wire.codec import decode, encode
from events.wire.fencing import epoch_header
from events.wire.records import (
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointKind,
    JobStatus,
)
from events.wire.topics import Topics
from spark_tasks.wordcount import read_counts

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PRINCIPALS = {
    "coordinator": Role.COORDINATOR,
    "driver": Role.DRIVER,
    "task": Role.TASK,
    "operator": Role.OPERATOR,
}
"""A principal per role, each granted exactly its role's ACLs."""

PREFIX = "secured."
SPARK_JOBS = {
    "kafka": ("sasl-spark-connector", f"{PREFIX}connector-words"),
    "cutline-kafka": ("sasl-spark", f"{PREFIX}words"),
}
"""The Spark word count's id (its consumer group) and input topic, on each source."""
FORGERY = "forgery."
"""The topics of the forgery tests: what lands there cannot spoil the journal of the others."""


@dataclass(frozen=True)
class Secured:
    """The secured broker, the protocol's topics, and each principal's properties file."""

    kafka: ApacheKafka
    topics: Topics
    files: dict[str, Path]

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    def env(self, user: str) -> dict[str, str]:
        """The environment of a process that logs in as ``user``."""
        return {**os.environ, CONFIG_FILE_VARIABLE: str(self.files[user])}

    @contextlib.contextmanager
    def acting_as(self, user: str) -> Iterator[None]:
        """Clients made in this process meanwhile log in as ``user``."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(CONFIG_FILE_VARIABLE, str(self.files[user]))
            yield


def _without(bindings: list[AclBinding], topic: str, operation: str) -> list[AclBinding]:
    return [b for b in bindings if not (b.name == topic and b.operation.name == operation)]


def _acls(topics: Topics, forgery: Topics) -> list[AclBinding]:
    """Each role's ACLs for its principal, on both prefixes; and the principals of the failure tests:
    ``novice``, an operator without Write on the requests; ``half-coordinator``, a coordinator without
    Read on the acknowledgements; ``misgranted``, a task granted Write on the journal by mistake."""
    bindings = [
        binding
        for prefix in (topics, forgery)
        for user, role in PRINCIPALS.items()
        for binding in acl_bindings(role, f"User:{user}", prefix)
    ]
    bindings += _without(acl_bindings(Role.OPERATOR, "User:novice", topics), topics.requests, "WRITE")
    bindings += _without(
        acl_bindings(Role.COORDINATOR, "User:half-coordinator", forgery), forgery.acks, "READ"
    )
    bindings += acl_bindings(Role.TASK, "User:misgranted", forgery)
    bindings += _grant(Grant("topic", forgery.checkpoints, ("Write",)), "misgranted")
    for job_id, topic in SPARK_JOBS.values():
        bindings += grant_bindings(application_grants(topics, [topic], job_id), "User:spark")
    return bindings


def _grant(grant: Grant, user: str) -> list[AclBinding]:
    return [
        AclBinding(ResourceType.TOPIC, grant.name, ResourcePatternType.LITERAL, f"User:{user}", "*",
                   AclOperation[op.upper()], AclPermissionType.ALLOW)
        for op in grant.operations
    ]  # fmt: skip


@pytest.fixture(name="secured", scope="module")
def _secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    users = [*PRINCIPALS, "novice", "half-coordinator", "misgranted", "spark"]
    directory = tmp_path_factory.mktemp("principals")
    with ApacheKafka(heap="384m", security=SaslSsl.with_users(users)) as kafka:
        secured = Secured(kafka, Topics(PREFIX), kafka.properties_files(directory))
        with secured.acting_as(ADMIN):
            for prefix in (PREFIX, FORGERY):
                ensure_topics(Settings(kafka.bootstrap, prefix, partitions=2))
            create_topics(kafka.bootstrap, [topic for _, topic in SPARK_JOBS.values()], partitions=2)
        kafka.create_acls(_acls(secured.topics, Topics(FORGERY)))
        yield secured


@pytest.fixture(autouse=True)
def _session_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTLINE_SESSION_TIMEOUT", "6")


def cutline(secured: Secured, user: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``cutline ARGS`` as ``user`` would run it."""
    return subprocess.run(
        [sys.executable, "-m", "coordinator.cli", *args],
        capture_output=True, text=True, timeout=timeout, env={**secured.env(user), "COLUMNS": "250"},
    )  # fmt: skip


class SecuredJob:
    """A job of two Python participants (the task principal) and its driver (the driver principal)."""

    def __init__(self, secured: Secured, job_id: str, root: Path) -> None:
        self.stops: list[JobStatus] = []
        with secured.acting_as("driver"):
            self.driver = JobDriver(secured.bootstrap, job_id, secured.topics)
        with secured.acting_as("task"):
            self.tasks = [
                Participant(
                    secured.bootstrap, job_id, task, 1, secured.topics, self.snapshot, lambda: {"in:0": 1},
                    on_stop=self.stopped,
                )
                for task in ("t0", "t1")
            ]  # fmt: skip
            for task in self.tasks:
                task.run_in_thread()
        config = CheckpointConfig(300, (root / "checkpoints").as_uri(), timeout_ms=10_000)
        self.driver.running(["t0", "t1"], config, attempt=1)

    def snapshot(self, barrier: CheckpointBarrier) -> bytes:
        return b"state"

    def stopped(self, status: JobStatus, drain: bool) -> None:
        self.stops.append(status)
        self.driver.status(status)

    def close(self) -> None:
        for task in self.tasks:
            task.close()
        self.driver.close()


def test_the_coordinator_participants_and_the_cli_work_over_sasl_ssl(
    secured: Secured, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The coordinator, two participants and a driver, each as its own principal with exactly its
    role's ACLs over SASL_SSL, complete checkpoints; an operator's ``cutline status``, ``tail``,
    ``trigger``, ``stop`` and ``replay --verify`` work, the job ends FINISHED, and no client was
    refused anything on the way."""
    job_id = "sasl-job"
    coordinator = CoordinatorProcess(secured.bootstrap, PREFIX)
    job: SecuredJob | None = None
    try:
        with secured.acting_as("coordinator"):
            coordinator.start(timeout=90)
        job = SecuredJob(secured, job_id, tmp_path)
        eventually(
            lambda: coordinator.get(f"/jobs/{job_id}/checkpoints").get("counts", {}).get("completed", 0),
            lambda completed: completed >= 2,
            timeout=60,
            what="two completed checkpoints",
        )
        bootstrap = ("--bootstrap", secured.bootstrap, "--topic-prefix", PREFIX)

        status = cutline(secured, "operator", "status", job_id, "--url", coordinator.url)
        assert 0 == status.returncode, status.stdout + status.stderr
        tail = cutline(
            secured, "operator", "tail", "checkpoints", *bootstrap, "--from-beginning", "--json", "-n", "3"
        )
        assert 0 == tail.returncode, tail.stdout + tail.stderr
        assert 3 == len([json.loads(line) for line in tail.stdout.splitlines()])
        trigger = cutline(secured, "operator", "trigger", job_id, *bootstrap, "--timeout", "30")
        assert 0 == trigger.returncode, trigger.stdout + trigger.stderr
        savepoints = str(tmp_path / "savepoints")
        stop = cutline(
            secured, "operator", "stop", job_id, *bootstrap, "--savepoint", savepoints, "--timeout", "30"
        )
        assert 0 == stop.returncode, stop.stdout + stop.stderr
        assert [JobStatus.FINISHED, JobStatus.FINISHED] == job.stops  # each task told to stop
        replay = cutline(secured, "operator", "replay", *bootstrap, "--verify", "--quiet")
        assert 0 == replay.returncode, replay.stdout + replay.stderr
        refused = [r.getMessage() for r in caplog.records if "AUTHORIZATION" in r.getMessage()]
        refused += [line for line in coordinator.log_path.read_text().splitlines() if "AUTHORIZATION" in line]
        assert [] == refused
    except AssertionError as error:
        raise AssertionError(f"{error}\ncoordinator log:\n{coordinator.tail(60)}") from None
    finally:
        if job is not None:
            job.close()
        coordinator.stop()


def run_word_count(secured: Secured, tmp_path: Path, source: str) -> tuple[Counter[str], Path, list[str]]:
    """Words produced to the ``source``'s job's input, then the word count (``python -m
    spark_tasks.wordcount --source SOURCE``, a local Spark whose Python workers inherit the settings)
    run as the ``spark`` principal until its input goes idle, beside a coordinator: the words, the
    output, and what the job and the coordinator said, each a line."""
    job_id, topic = SPARK_JOBS[source]
    coordinator = CoordinatorProcess(secured.bootstrap, PREFIX)
    produced: Counter[str] = Counter()
    with secured.acting_as(ADMIN):
        producer = Producer(producer_config(secured.bootstrap))
    for n in range(200):
        line = " ".join(["alpha", "beta", "gamma"][: 1 + n % 3])
        producer.produce(topic, value=line.encode(), partition=n % 2)
        produced.update(line.split())
    assert 0 == producer.flush(30)
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "spark_tasks.wordcount", "--bootstrap", secured.bootstrap, "--job", job_id,
        "--topic", topic, "--topic-prefix", PREFIX, "--work-dir", str(tmp_path / "work"),
        "--location", (tmp_path / "checkpoints").as_uri(), "--out", str(out), "--interval-ms", "500",
        "--idle-stop", "6", "--no-restore", "--source", source,
    ]  # fmt: skip
    try:
        with secured.acting_as("coordinator"):
            coordinator.start(timeout=90)
        job = subprocess.run(command, capture_output=True, text=True, timeout=300, env=secured.env("spark"))
    finally:
        coordinator.stop()
    said = job.stdout + job.stderr
    assert 0 == job.returncode, said[-4000:]
    events = [json.loads(line) for line in job.stdout.splitlines() if line.startswith("{")]
    (chosen,) = [e["source"] for e in events if e.get("event") == "source"]
    assert source == chosen, said[-4000:]
    (stopped,) = [e for e in events if e.get("event") == "stopped"]
    assert stopped["completed"], said[-4000:]
    return produced, out, [*said.splitlines(), *coordinator.log_path.read_text().splitlines()]


@pytest.mark.spark
def test_the_connector_word_count_checkpoints_over_sasl_ssl_with_an_application_s_acls(
    secured: Secured, tmp_path: Path
) -> None:
    """The word count on Spark's kafka connector, as one principal with a driver's and a task's ACLs,
    Read on its input and on its consumer group: the connector's Java client gets the principal's
    SCRAM-SHA-512 login and the CA as its ``kafka.*`` options (translated from the librdkafka
    properties file every other client reads), and the job completes checkpoints over SASL_SSL,
    counts every word once, commits its offsets to its group, and ends FINISHED when its input goes
    idle; no client was refused anything."""
    produced, out, said = run_word_count(secured, tmp_path, "kafka")

    assert produced == read_counts(out)
    assert [] == [line for line in said if "AUTHORIZATION" in line or "Authentication failed" in line]
    assert [] == [line for line in said if password(secured, "spark") in line]
    job_id, topic = SPARK_JOBS["kafka"]
    with secured.acting_as("spark"):
        committed = committed_offsets(secured.bootstrap, job_id, topic)
    assert {0: 100, 1: 100} == committed


@pytest.mark.spark
def test_a_cutline_kafka_word_count_checkpoints_over_sasl_ssl_with_an_application_s_acls(
    secured: Secured, tmp_path: Path
) -> None:
    """The same word count on ``cutline-kafka``, whose own consumers (librdkafka, in Spark's Python
    workers) read the input over SASL_SSL: every word counted once, checkpoints completed, no client
    refused."""
    produced, out, said = run_word_count(secured, tmp_path, "cutline-kafka")

    assert produced == read_counts(out)
    assert [] == [line for line in said if "AUTHORIZATION" in line]


@pytest.mark.spark
def test_the_connector_word_count_with_a_wrong_sasl_password_fails_at_once_saying_so(
    secured: Secured, tmp_path: Path
) -> None:
    """A wrong password in the principal's properties file: the word count exits with an error that
    says the SCRAM login failed (its clients' and the connector's alike get the wrong one), within a
    minute, not at a timeout, and the wrong password is nowhere in what it said."""
    job_id, topic = SPARK_JOBS["kafka"]
    wrong = f"{password(secured, 'spark')}-wrong"
    settings = tmp_path / "wrong.properties"
    settings.write_text(secured.files["spark"].read_text().replace(password(secured, "spark"), wrong))
    settings.chmod(0o600)
    command = [
        sys.executable, "-m", "spark_tasks.wordcount", "--bootstrap", secured.bootstrap, "--job", job_id,
        "--topic", topic, "--topic-prefix", PREFIX, "--work-dir", str(tmp_path / "work"),
        "--location", (tmp_path / "checkpoints").as_uri(), "--out", str(tmp_path / "out"),
        "--no-restore", "--source", "kafka",
    ]  # fmt: skip
    started = time.monotonic()
    job = subprocess.run(
        command, capture_output=True, text=True, timeout=240,
        env={**os.environ, CONFIG_FILE_VARIABLE: str(settings)},
    )  # fmt: skip
    took = time.monotonic() - started

    said = job.stdout + job.stderr
    assert 0 != job.returncode, said[-4000:]
    assert "Authentication failed" in said, said[-4000:]
    assert took < 120, f"the word count took {took:.0f} s to give up"
    assert wrong not in said


def password(secured: Secured, user: str) -> str:
    """``user``'s SASL password, from its properties file."""
    (line,) = [
        line for line in secured.files[user].read_text().splitlines() if line.startswith("sasl.password=")
    ]
    return line.partition("=")[2]


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The offsets ``group`` committed on ``topic``'s two partitions, by partition."""
    consumer = Consumer(consumer_config(bootstrap, group))
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}


# ------------------------------------------------------------------ what the ACLs refuse


def forge(secured: Secured, user: str, job_id: str) -> KafkaError | None:
    """As ``user``, write into the journal a ``CheckpointCompleted`` no coordinator decided, under an
    epoch above any claim (as a forger who read the journal would); the broker's answer."""
    topics = Topics(FORGERY)
    forged = CheckpointCompleted(
        job_id, 7, CheckpointKind.CHECKPOINT, int(time.time() * 1000), 1, {}, 0, {"in:0": 1_000_000}
    )
    with secured.acting_as(user):
        producer = Producer(producer_config(secured.bootstrap))
    answers: list[KafkaError | None] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        answers.append(error)

    producer.produce(
        topics.checkpoints, key=job_key(job_id), value=encode(forged), headers=[epoch_header(2**40)],
        on_delivery=delivered,
    )  # fmt: skip
    assert 0 == producer.flush(30)
    (answer,) = answers
    return answer


def forged_in_journal(secured: Secured, job_id: str) -> list[LogMessage]:
    with secured.acting_as("operator"):
        return [
            m for m in read_to_end(secured.bootstrap, Topics(FORGERY).checkpoints) if m.key == job_key(job_id)
        ]


def test_the_broker_refuses_a_task_principal_s_forged_completion_in_the_journal_acl(secured: Secured) -> None:
    """A task's principal may write acknowledgements, not the journal: a forged ``CheckpointCompleted``
    produced into it is refused by the broker (TOPIC_AUTHORIZATION_FAILED), and nothing lands."""
    answer = forge(secured, "task", "forged-by-a-task")

    assert answer is not None and KafkaError.TOPIC_AUTHORIZATION_FAILED == answer.code(), answer
    assert [] == forged_in_journal(secured, "forged-by-a-task")


def test_with_write_on_the_journal_granted_by_mistake_the_forgery_lands_acl(secured: Secured) -> None:
    """The same forgery by a task principal also granted Write on the journal (the grant
    docs/security.md says never to make) lands: the refusal above is the ACL's doing."""
    assert forge(secured, "misgranted", "forged-by-mistake") is None
    (landed,) = forged_in_journal(secured, "forged-by-mistake")
    assert isinstance(decode(landed.value or b""), CheckpointCompleted)


def test_an_operator_missing_an_acl_is_told_which_and_how_to_grant_it_acl(secured: Secured) -> None:
    """``cutline trigger`` by an operator whose principal lacks Write on the requests topic fails at
    once (not at its timeout) with the ACL it lacks and the ``kafka-acls.sh`` command that grants it;
    ``cutline doctor --role operator`` fails its ACL check with the same. With the full operator
    ACLs, the doctor's check passes."""
    bootstrap = ("--bootstrap", secured.bootstrap, "--topic-prefix", PREFIX)
    started = time.monotonic()
    trigger = cutline(secured, "novice", "trigger", "any-job", *bootstrap, "--timeout", "60")
    took = time.monotonic() - started

    said = trigger.stdout + trigger.stderr
    assert 0 != trigger.returncode
    assert took < 30, f"cutline trigger took {took:.0f} s to give up"
    assert f"User:novice may not Write topic {PREFIX}requests" in said
    assert (
        f"--allow-principal User:novice --operation Write --operation Describe --topic {PREFIX}requests"
        in said
    )
    doctor = cutline(secured, "novice", "doctor", "--role", "operator", *bootstrap, "--json")
    (acls,) = [c for c in map(json.loads, doctor.stdout.splitlines()) if c["name"] == "Kafka ACLs"]
    assert "fail" == acls["verdict"] and 1 == doctor.returncode
    assert f"User:novice lacks what a operator needs: Write on topic {PREFIX}requests" == acls["found"]
    assert f"--operation Write --topic {PREFIX}requests" in acls["fix"]
    granted = cutline(secured, "operator", "doctor", "--role", "operator", *bootstrap, "--json")
    (acls,) = [c for c in map(json.loads, granted.stdout.splitlines()) if c["name"] == "Kafka ACLs"]
    assert ("ok", f"User:operator holds every ACL a operator needs on {PREFIX}*") == (
        acls["verdict"],
        acls["found"],
    )


def test_a_coordinator_missing_an_acl_refuses_to_start_and_names_it_acl(secured: Secured) -> None:
    """A coordinator whose principal lacks Read on the acknowledgements exits at start, naming the ACL
    and the command that grants it, instead of being refused in a loop inside its consumer."""
    coordinator = CoordinatorProcess(secured.bootstrap, FORGERY)
    with secured.acting_as("half-coordinator"), pytest.raises(RuntimeError, match="exited with") as exited:
        coordinator.start(timeout=60)

    said = str(exited.value)
    assert f"User:half-coordinator lacks ACLs a coordinator needs: Read on topic {FORGERY}acks" in said
    assert f"--allow-principal User:half-coordinator --operation Read --topic {FORGERY}acks" in said
