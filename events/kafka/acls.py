"""Kafka ACLs for cutline's trust model (docs/security.md, "Kafka ACLs per principal").

Kafka is cutline's security boundary: who may write which topic decides who may do what. This
module says it once, as data: the grants of each :class:`Role` on a prefix's topics and groups
(:func:`grants`). From them come the ``kafka-acls.sh`` commands an operator runs
(:func:`kafka_acls_commands`, which docs/security.md shows), the bindings a program creates with the
AdminClient (:func:`acl_bindings`), the check of what a principal lacks, asked of the cluster itself
(:func:`missing_grants`, ``cutline doctor --role``), and the message a refused client prints
(:func:`refusal`): the ACL it lacks, and the command that grants it.

The model: only the coordinator writes the journal, the barriers, the dead letters and its own
topics; tasks write acknowledgements and declines (and their RUNNING status) and read barriers and
the journal; drivers write job statuses and requests and read the journal; operators write requests
and read the journal and the dead letters. A task or Spark job with an exactly-once Kafka sink also
needs the sink's grants (:func:`sink_grants`): its transactional ids by their prefix, its output
topics and the commit markers' topic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from events.kafka.clients import PLACEHOLDER_GROUP
from events.kafka.refusals import (
    AUTHORIZATION_ERRORS,
    grant_command,
    is_refusal,
    principal_of,
    refusal_message,
)
from events.wire.topics import Topics

__all__ = [
    "Grant",
    "Lacking",
    "Role",
    "acl_bindings",
    "acl_command",
    "application_grants",
    "grant_bindings",
    "grants",
    "is_refusal",
    "kafka_acls_commands",
    "lacking_commands",
    "lacking_summary",
    "missing_grants",
    "principal_of",
    "refusal",
    "sink_commands",
    "sink_commits_topic",
    "sink_grants",
    "sink_transactional_id_prefix",
]


GROUP_WAIT_S = 2.0
"""How long :func:`missing_grants` waits for a group's description: a cluster whose first group is
asked for creates its offsets topic and loads its coordinator meanwhile (several seconds); the group's
ACLs are then not known, rather than the check slow."""


class Role(StrEnum):
    """Who a principal is to cutline."""

    COORDINATOR = "coordinator"
    DRIVER = "driver"
    TASK = "task"
    OPERATOR = "operator"


@dataclass(frozen=True, slots=True)
class Grant:
    """Operations (Kafka's names: ``Read``, ``Write``, ``Create``, ``Describe``, ``DescribeConfigs``)
    on a topic or a group, by its literal name or by a name prefix."""

    resource: str
    """``topic``, ``group`` or ``transactional-id``."""
    name: str
    operations: tuple[str, ...]
    prefixed: bool = False
    why: str = ""

    def covers(self, topic: str) -> bool:
        return topic.startswith(self.name) if self.prefixed else topic == self.name


def grants(role: Role, topics: Topics) -> tuple[Grant, ...]:
    """What ``role`` needs on ``topics`` (one prefix: one trust domain)."""
    return (*_grants(role, topics), PLACEHOLDER)


PLACEHOLDER = Grant(
    "group", PLACEHOLDER_GROUP, ("Describe",),
    why="librdkafka's consumers that only assign partitions still look their group's coordinator up",
)  # fmt: skip
"""Every role's: cutline's assign-only consumers name the group :data:`PLACEHOLDER_GROUP` and never
join or commit it, but librdkafka asks for its coordinator (FindCoordinator needs Describe), and logs
``GROUP_AUTHORIZATION_FAILED`` where it may not."""


def _grants(role: Role, topics: Topics) -> tuple[Grant, ...]:
    read, write = ("Read", "Describe"), ("Write", "Describe")
    if role is Role.COORDINATOR:
        return (
            *(Grant("topic", t, read, why="its input") for t in topics.inputs),
            *(
                Grant("topic", t, ("Write", "Read", "Describe", "DescribeConfigs"), why="it alone writes it")
                for t in (topics.checkpoints, topics.barriers, topics.dead_letters)
            ),
            Grant(
                "topic",
                f"{topics.prefix}coordinator",
                ("Create", "Write", "Read", "Describe"),
                True,
                "its own topics: ticks, snapshots, Faust's leader topic",
            ),  # fmt: skip
            Grant("group", f"{topics.prefix}coordinator", ("Read", "Describe"), why="its workers' group"),
        )
    if role is Role.TASK:
        return (
            Grant("topic", topics.acks, write, why="acknowledges checkpoints"),
            Grant("topic", topics.declines, write, why="declines checkpoints"),
            Grant("topic", topics.job_status, write, why="says it runs (the barriers owed to it)"),
            Grant("topic", topics.barriers, read, why="follows its job's barriers"),
            Grant("topic", topics.checkpoints, read, why="learns of completions from the journal"),
        )
    if role is Role.DRIVER:
        return (
            Grant("topic", topics.job_status, write, why="reports its job's status"),
            Grant("topic", topics.requests, write, why="asks for savepoints and stops"),
            Grant("topic", topics.checkpoints, read, why="restores from the journal"),
        )
    return (
        Grant("topic", topics.requests, write, why="cutline trigger, stop, cancel"),
        Grant("topic", topics.checkpoints, read, why="cutline status, replay, tail, and answers"),
        Grant("topic", topics.dead_letters, read, why="refusals of its requests"),
        Grant("group", f"{topics.prefix}coordinator", ("Describe",), why="list, status: find a worker"),
    )


SPARK_SOURCE_GROUPS = ("cutline-kafka-source-", "cutline-offset-probe-")
"""Prefixes of the throwaway ``group.id`` of the ``cutline-kafka`` source's consumers
(spark_tasks/kafka_source/: assign-only, never joined; Describe spares the warnings)."""


def application_grants(topics: Topics, inputs: Iterable[str], group: str) -> tuple[Grant, ...]:
    """What an application whose driver and tasks share one principal needs (a Spark job: its
    executors get the driver's settings): a driver's and a task's grants, Read on its input topics,
    Read on the consumer group it commits checkpointed offsets to (a ``CheckpointedJob``'s is its job
    id unless ``JobSettings.group`` says), and Describe on its source consumers' groups."""
    chosen = [
        *grants(Role.DRIVER, topics),
        *grants(Role.TASK, topics),
        *(Grant("topic", name, ("Read", "Describe"), why="its input") for name in inputs),
        Grant("group", group, ("Read", "Describe"), why="commits checkpointed offsets"),
        *(Grant("group", p, ("Describe",), True, "the source's consumers") for p in SPARK_SOURCE_GROUPS),
    ]
    merged: dict[tuple[str, str, bool], Grant] = {}
    for grant in chosen:
        key = (grant.resource, grant.name, grant.prefixed)
        known = merged.get(key)
        operations = grant.operations if known is None else (*known.operations, *grant.operations)
        merged[key] = Grant(
            grant.resource, grant.name, tuple(dict.fromkeys(operations)), grant.prefixed, grant.why
        )
    return tuple(merged.values())


def sink_transactional_id_prefix(topics: Topics) -> str:
    """An exactly-once sink's default ``transactional_id_prefix``: the topic prefix without its dot."""
    return topics.prefix.rstrip(".") or "cutline"


def sink_commits_topic(topics: Topics) -> str:
    """The exactly-once sinks' commit markers: ``<prefix>sink-commits`` (compacted)."""
    return f"{topics.prefix}sink-commits"


def sink_grants(
    topics: Topics, outputs: Iterable[str], transactional_id_prefix: str | None = None
) -> tuple[Grant, ...]:
    """What an exactly-once Kafka sink needs beyond its task's (or Spark job's) grants
    (docs/exactly-once.md): Write on its transactional ids, by their prefix; Write on its output
    topics; Write on the commit markers' topic and Read there for recovery (Create unless an
    administrator made it, compacted)."""
    prefix = transactional_id_prefix or sink_transactional_id_prefix(topics)
    return (
        Grant("transactional-id", prefix, ("Write", "Describe"), True, "its transactions, one id a task"),
        *(Grant("topic", name, ("Write", "Describe"), why="its output") for name in dict.fromkeys(outputs)),
        Grant(
            "topic",
            sink_commits_topic(topics),
            ("Create", "Write", "Read", "Describe"),
            why="its commit markers: written with the output, read at recovery",
        ),
    )


def sink_commands(
    principal: str,
    topics: Topics,
    outputs: Iterable[str],
    transactional_id_prefix: str | None = None,
    bootstrap: str = "BROKER:9093",
) -> list[str]:
    """One ``kafka-acls.sh`` command per grant of an exactly-once sink to ``principal``."""
    chosen = sink_grants(topics, outputs, transactional_id_prefix)
    return [acl_command(grant, principal, bootstrap=bootstrap) for grant in chosen]


def acl_command(
    grant: Grant, principal: str, operations: Sequence[str] | None = None, bootstrap: str = "BROKER:9093"
) -> str:
    """The ``kafka-acls.sh`` command that grants ``principal`` (``User:name``) ``operations`` (all of the
    grant's by default)."""
    chosen = operations or grant.operations
    return grant_command(
        principal, grant.resource, grant.name, chosen, prefixed=grant.prefixed, bootstrap=bootstrap
    )


def kafka_acls_commands(
    role: Role, principal: str, topics: Topics, bootstrap: str = "BROKER:9093"
) -> list[str]:
    """One ``kafka-acls.sh`` command per grant of ``role`` to ``principal``."""
    return [acl_command(grant, principal, bootstrap=bootstrap) for grant in grants(role, topics)]


def acl_bindings(role: Role, principal: str, topics: Topics) -> list[Any]:
    """``confluent_kafka.admin.AclBinding`` of each operation of each grant (``AdminClient.create_acls``)."""
    return grant_bindings(grants(role, topics), principal)


def grant_bindings(chosen: Iterable[Grant], principal: str) -> list[Any]:
    """``confluent_kafka.admin.AclBinding`` of each operation of ``chosen``."""
    from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
    from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

    bindings = []
    for grant in chosen:
        resource = {
            "topic": ResourceType.TOPIC,
            "group": ResourceType.GROUP,
            "transactional-id": ResourceType.TRANSACTIONAL_ID,
        }[grant.resource]
        pattern = ResourcePatternType.PREFIXED if grant.prefixed else ResourcePatternType.LITERAL
        for operation in grant.operations:
            bindings.append(
                AclBinding(
                    resource, grant.name, pattern, principal, "*", AclOperation[_enum_name(operation)],
                    AclPermissionType.ALLOW,
                )
            )  # fmt: skip
    return bindings


def _enum_name(operation: str) -> str:
    """``DescribeConfigs`` -> ``DESCRIBE_CONFIGS``."""
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(operation)).upper()


def _kafka_name(operation: Any) -> str:
    """``AclOperation.DESCRIBE_CONFIGS`` -> ``DescribeConfigs``."""
    return "".join(word.capitalize() for word in str(operation.name).split("_"))


@dataclass(frozen=True, slots=True)
class Lacking:
    """What a principal lacks of one grant, on one topic or group the grant covers."""

    grant: Grant
    resource: str
    operations: tuple[str, ...]

    def describe(self) -> str:
        kind = self.grant.resource
        return f"{', '.join(self.operations)} on {kind} {self.resource}"


def missing_grants(
    bootstrap: str, role: Role, topics: Topics, config: Mapping[str, Any] | None = None, timeout: float = 10.0
) -> list[Lacking] | None:
    """What the principal of the client settings lacks of ``role``'s grants, as the cluster says (the
    operations it reports the principal authorized for, KIP-430), on the topics that exist; None where
    the cluster reports none (no authorizer, or a broker without the feature). KafkaException for any
    other failure of the question itself."""
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    from events.kafka.clients import consumer_config

    admin = AdminClient(
        {k: v for k, v in consumer_config(bootstrap, extra=config).items() if k != "group.id"}
    )
    names = [*topics.all, *topics.internal]
    held: dict[str, set[str]] = {}
    futures = admin.describe_topics(
        TopicCollection(names), include_authorized_operations=True, request_timeout=timeout
    )
    for name, future in futures.items():
        try:
            operations = future.result(timeout=timeout).authorized_operations
        except KafkaException as exc:
            if exc.args[0].name() == "UNKNOWN_TOPIC_OR_PART":
                continue  # not there (yet): whoever creates it needs Create, checked by creating it
            if exc.args[0].name() not in AUTHORIZATION_ERRORS:
                raise
            operations = []  # not even Describe
        if operations is None:
            return None
        held[name] = {_kafka_name(o) for o in operations}
    lacking = []
    for grant in grants(role, topics):
        if grant.resource == "group":
            lacking += _group_lacks(admin, grant, timeout)
            continue
        for name in (n for n in names if grant.covers(n) and n in held):
            wanted = tuple(op for op in grant.operations if op not in held[name])
            if wanted:
                lacking.append(Lacking(grant, name, wanted))
    return lacking


def _group_lacks(admin: Any, grant: Grant, timeout: float) -> list[Lacking]:
    from confluent_kafka import KafkaException

    wait = min(timeout, GROUP_WAIT_S)
    (future,) = admin.describe_consumer_groups(
        [grant.name], include_authorized_operations=True, request_timeout=wait
    ).values()
    try:
        operations = future.result(timeout=wait).authorized_operations
    except TimeoutError:
        return []  # its coordinator is still loading (a new cluster): not known
    except KafkaException as exc:
        if exc.args[0].name() not in AUTHORIZATION_ERRORS:
            return []  # a group nobody has joined yet, its coordinator not elected: not known
        operations = []
    if operations is None:
        return []
    held = {_kafka_name(o) for o in operations}
    wanted = tuple(op for op in grant.operations if op not in held)
    return [Lacking(grant, grant.name, wanted)] if wanted else []


def lacking_commands(lacking: Iterable[Lacking], principal: str, bootstrap: str = "BROKER:9093") -> list[str]:
    """The ``kafka-acls.sh`` commands that grant what is lacking: one per topic or group, or one per
    prefix for what a prefixed grant covers."""
    commands: dict[str, None] = {}
    for item in lacking:
        name = item.grant.name if item.grant.prefixed else item.resource
        grant = Grant(item.grant.resource, name, item.operations, item.grant.prefixed)
        commands[acl_command(grant, principal, bootstrap=bootstrap)] = None
    return list(commands)


def refusal(
    operation: str, resource: str, properties: Mapping[str, str], bootstrap: str, kind: str = "topic"
) -> str:
    """What a client the broker refused ``operation`` on ``resource`` says: the ACL its principal
    lacks and the command that grants it (:func:`events.kafka.refusals.refusal_message`)."""
    return refusal_message(operation, kind, resource, bootstrap=bootstrap, properties=properties)


def lacking_summary(lacking: Iterable[Lacking]) -> str:
    return "; ".join(item.describe() for item in lacking)
