"""A principal missing one ACL is told which, never that a topic is missing, and never left hanging
(issue 47, step 4; docs/security.md, "Kafka ACLs per principal").

One SASL_SSL Apache Kafka node with Kafka's ``StandardAuthorizer`` (as in test_apache_kafka_sasl.py):
a user per role with exactly its role's ACLs on the prefix (events/kafka/acls.py), and users that each
lack one ACL of their role. The broker leaves a topic its principal may not Describe out of a listing
and answers ``TOPIC_AUTHORIZATION_FAILED`` for it whether it exists or not: the CLI, a participant, the
coordinator and ``cutline doctor`` must each say which ACL is lacking and how to grant it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coordinator.service.app import Settings, ensure_topics
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.apache_kafka import ROLE_USERS, ApacheKafka
from events.dev.kafka_security import ADMIN, SaslSsl
from events.kafka.acls import Role, acl_bindings
from events.kafka.client_config import CONFIG_FILE_VARIABLE
from events.kafka.refusals import AccessRefused
from events.task.participant import Participant
from events.wire.topics import Topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PREFIX = "acl."
TOPICS = Topics(PREFIX)

LACKING = {
    "blind-task": (Role.TASK, TOPICS.barriers, {"READ", "DESCRIBE"}),
    "deaf-task": (Role.TASK, TOPICS.barriers, {"READ"}),
    "peeking-operator": (Role.OPERATOR, TOPICS.checkpoints, {"READ"}),
    "groupless-operator": (Role.OPERATOR, f"{PREFIX}coordinator", {"DESCRIBE"}),
    "blind-coordinator": (
        Role.COORDINATOR,
        TOPICS.dead_letters,
        {"WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS"},
    ),
}
"""Users each granted their role's ACLs but one resource's operations: (role, resource, operations
left out). Kafka's Read and Write imply Describe: a principal lacks Describe only without all three."""

FAST_S = 30.0
"""A refusal is said at once: well before any command's or client's own timeout."""


@dataclass(frozen=True)
class Secured:
    kafka: ApacheKafka
    files: dict[str, Path]

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    @contextlib.contextmanager
    def acting_as(self, user: str) -> Iterator[None]:
        """Clients made in this process meanwhile log in as ``user``."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(CONFIG_FILE_VARIABLE, str(self.files[user]))
            yield


def _lacking_one(user: str) -> list[Any]:
    role, resource, operations = LACKING[user]
    every = acl_bindings(role, f"User:{user}", TOPICS)
    return [b for b in every if not (b.name == resource and b.operation.name in operations)]


@pytest.fixture(name="secured", scope="module")
def _secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    with ApacheKafka(heap="384m", security=SaslSsl.with_users([*ROLE_USERS, *LACKING])) as kafka:
        secured = Secured(kafka, kafka.properties_files(tmp_path_factory.mktemp("principals")))
        with secured.acting_as(ADMIN):
            ensure_topics(Settings(kafka.bootstrap, PREFIX, partitions=2))
        kafka.grant_roles(TOPICS)
        kafka.create_acls([binding for user in LACKING for binding in _lacking_one(user)])
        yield secured


@pytest.fixture(autouse=True)
def _session_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apache Kafka refuses a session timeout under 6 s (``group.min.session.timeout.ms``)."""
    monkeypatch.setenv("CUTLINE_SESSION_TIMEOUT", "6")


@dataclass(frozen=True)
class Ran:
    returncode: int
    said: str
    took: float


def cutline(secured: Secured, user: str, *args: str, timeout: float = 120) -> Ran:
    """``cutline ARGS`` as ``user`` would run it."""
    env = {**os.environ, CONFIG_FILE_VARIABLE: str(secured.files[user]), "COLUMNS": "400"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return Ran(done.returncode, done.stdout + done.stderr, time.monotonic() - started)


def on_the_broker(secured: Secured) -> tuple[str, ...]:
    return ("--bootstrap", secured.bootstrap, "--topic-prefix", PREFIX)


def test_cutline_trigger_as_a_principal_without_describe_names_the_acl_not_a_missing_topic_acl(
    secured: Secured,
) -> None:
    """Given the task principal, which may not Describe the requests topic, when it runs ``cutline
    trigger``, then it fails at once saying it may not Describe the topic (refused, not missing), with
    the command that grants the Write the trigger needs."""
    ran = cutline(secured, "task", "trigger", "any-job", *on_the_broker(secured), "--timeout", "60")

    assert 2 == ran.returncode, ran.said
    assert ran.took < FAST_S, f"took {ran.took:.0f} s to give up"
    assert f"User:task may not Describe topic {PREFIX}requests (TOPIC_AUTHORIZATION_FAILED)" in ran.said
    assert (
        f"--allow-principal User:task --operation Write --operation Describe --topic {PREFIX}requests"
        in ran.said
    )
    assert "no topic" not in ran.said and "does not exist" not in ran.said


@pytest.mark.parametrize(
    "command",
    [
        ("tail", "checkpoints", "--from-beginning", "-n", "1"),
        ("replay", "--verify", "--quiet"),
    ],
    ids=["tail", "replay"],
)
def test_a_reader_refused_read_on_the_journal_is_told_the_acl_at_once_acl(
    secured: Secured, command: tuple[str, ...]
) -> None:
    """Given an operator that may Describe the journal but not Read it, when it runs ``cutline tail``
    or ``cutline replay``, then it fails at once naming Read on the journal and its command (a fetch
    refused is not retried until a timeout, nor silently skipped)."""
    ran = cutline(secured, "peeking-operator", *command, *on_the_broker(secured))

    assert 2 == ran.returncode, ran.said
    assert ran.took < FAST_S, f"took {ran.took:.0f} s to give up"
    assert (
        f"User:peeking-operator may not Read topic {PREFIX}checkpoints (TOPIC_AUTHORIZATION_FAILED)"
        in ran.said
    )
    assert f"--operation Read --operation Describe --topic {PREFIX}checkpoints" in ran.said
    assert "Traceback" not in ran.said


@pytest.mark.parametrize(
    ("user", "said"),
    [
        (
            "blind-task",
            f"User:blind-task may not Describe topic {PREFIX}barriers (TOPIC_AUTHORIZATION_FAILED)",
        ),
        ("deaf-task", f"User:deaf-task may not Read topic {PREFIX}barriers (TOPIC_AUTHORIZATION_FAILED)"),
    ],
    ids=["without-describe", "without-read"],
)
def test_a_participant_missing_an_acl_on_the_barriers_fails_at_start_naming_it_acl(
    secured: Secured, user: str, said: str
) -> None:
    """Given a task principal lacking Describe (or Read) on the barriers, when a participant starts, then
    it raises AccessRefused at once, naming the ACL and the command that grants it, not a missing topic
    nor a timeout."""
    started = time.monotonic()
    with secured.acting_as(user), pytest.raises(AccessRefused) as refused:
        Participant(
            secured.bootstrap, "acl-job", "t0", 1, TOPICS, lambda barrier: b"", dict, start_timeout=FAST_S
        )
    took = time.monotonic() - started

    assert took < FAST_S - 5, f"took {took:.0f} s to give up"
    assert said in str(refused.value)
    assert (
        f"--allow-principal User:{user} --operation Read --operation Describe --topic {PREFIX}barriers"
        in str(refused.value)
    )


def test_a_coordinator_without_describe_on_a_topic_exits_at_start_naming_the_acl(secured: Secured) -> None:
    """Given a coordinator principal that may not Describe the dead letters, when the coordinator
    starts, then it exits naming what it lacks on that topic and the command that grants it."""
    coordinator = CoordinatorProcess(secured.bootstrap, PREFIX)
    with secured.acting_as("blind-coordinator"), pytest.raises(RuntimeError, match="exited with") as exited:
        coordinator.start(timeout=60)

    said = str(exited.value)
    assert "User:blind-coordinator lacks ACLs a coordinator needs: " in said
    assert f"Describe, DescribeConfigs on topic {PREFIX}dead-letters" in said
    assert (
        "--allow-principal User:blind-coordinator --operation Write --operation Read --operation Describe"
        in said
    )


def test_cutline_doctor_names_the_missing_acl_and_tells_an_unseen_topic_from_a_missing_one_acl(
    secured: Secured,
) -> None:
    """Given a task principal that may not Describe the barriers, when it runs ``cutline doctor --role
    task``, then the ACL check fails naming Describe on the barriers, and the topics check names the
    topics it cannot see as not visible, not as missing."""
    ran = cutline(secured, "blind-task", "doctor", "--role", "task", *on_the_broker(secured), "--json")
    checks = {
        c["name"]: c for c in (json.loads(line) for line in ran.said.splitlines() if line.startswith("{"))
    }

    assert 1 == ran.returncode, ran.said
    assert "fail" == checks["Kafka ACLs"]["verdict"]
    assert f"Read, Describe on topic {PREFIX}barriers" in checks["Kafka ACLs"]["found"]
    assert f"--operation Read --operation Describe --topic {PREFIX}barriers" in checks["Kafka ACLs"]["fix"]
    assert "missing" not in checks["topics"]["found"], checks["topics"]
    assert "not visible to User:blind-task" in checks["topics"]["found"]
    assert f"{PREFIX}barriers" in checks["topics"]["found"]


def test_the_operator_finds_the_coordinator_through_its_group_and_one_without_describe_is_told_acl(
    secured: Secured,
) -> None:
    """Given a coordinator running as its principal, when the operator runs ``cutline list`` with only
    ``--bootstrap``, then it finds the worker through the coordinator group (Describe on the group is an
    operator's grant); an operator without that grant is told GROUP_AUTHORIZATION_FAILED, the ACL and
    its command."""
    coordinator = CoordinatorProcess(secured.bootstrap, PREFIX)
    try:
        with secured.acting_as("coordinator"):
            coordinator.start(timeout=90)
        listed = cutline(secured, "operator", "list", *on_the_broker(secured))
        refused = cutline(secured, "groupless-operator", "list", *on_the_broker(secured))
    finally:
        coordinator.stop()

    assert 0 == listed.returncode, listed.said
    assert coordinator.url in listed.said
    assert 2 == refused.returncode, refused.said
    assert (
        f"User:groupless-operator may not Describe group {PREFIX}coordinator (GROUP_AUTHORIZATION_FAILED)"
        in refused.said
    )
    assert f"--allow-principal User:groupless-operator --operation Describe --group {PREFIX}coordinator" in (
        refused.said
    )
