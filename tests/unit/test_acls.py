"""cutline's trust model as Kafka ACLs (events/kafka/acls.py, docs/security.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from events.kafka.acls import (
    Grant,
    Lacking,
    Role,
    acl_bindings,
    application_grants,
    grant_bindings,
    grants,
    kafka_acls_commands,
    lacking_commands,
    refusal,
    sink_commands,
    sink_grants,
)
from events.task.exactly_once import commits_topic, transactional_id
from events.wire.topics import Topics

SECURITY = Path(__file__).resolve().parents[2] / "docs" / "security.md"
TOPICS = Topics("cutline.")


def _writers(topic: str) -> set[Role]:
    return {
        role for role in Role for g in grants(role, TOPICS) if g.covers(topic) and "Write" in g.operations
    }


@pytest.mark.parametrize(
    "topic", [TOPICS.checkpoints, TOPICS.barriers, TOPICS.dead_letters, TOPICS.snapshots]
)
def test_only_the_coordinator_may_write_what_every_reader_trusts(topic: str) -> None:
    assert {Role.COORDINATOR} == _writers(topic)


def test_tasks_write_acks_and_declines_and_operators_requests() -> None:
    assert {Role.TASK} == _writers(TOPICS.acks) == _writers(TOPICS.declines)
    assert {Role.DRIVER, Role.OPERATOR} == _writers(TOPICS.requests)
    assert {Role.DRIVER, Role.TASK} == _writers(TOPICS.job_status)


@pytest.mark.parametrize("role", list(Role))
def test_docs_security_gives_every_grant_as_a_kafka_acls_command(role: Role) -> None:
    """The page's commands are the module's, for the default prefix and a principal per role."""
    documented = SECURITY.read_text()
    for command in kafka_acls_commands(role, f"User:{role.value}", TOPICS):
        assert command in documented


@pytest.mark.parametrize("role", list(Role))
def test_each_operation_becomes_one_binding_of_kafka_s_own_operation(role: Role) -> None:
    bindings = acl_bindings(role, "User:x", TOPICS)
    expected = sum(len(g.operations) for g in grants(role, TOPICS))
    assert expected == len(bindings) == len(set(bindings))
    assert {AclOperation.DESCRIBE_CONFIGS, AclOperation.CREATE} <= {
        b.operation for b in acl_bindings(Role.COORDINATOR, "User:x", TOPICS)
    }


def test_the_coordinator_s_own_topics_are_granted_by_their_prefix() -> None:
    (own,) = [g for g in grants(Role.COORDINATOR, TOPICS) if g.prefixed]
    assert own.covers(TOPICS.ticks) and own.covers(TOPICS.snapshots)
    assert own.covers("cutline.coordinator-__assignor-__leader")
    assert not own.covers(TOPICS.checkpoints)
    assert (
        "--resource-pattern-type prefixed"
        in lacking_commands([Lacking(own, own.name, ("Create",))], "User:c")[0]
    )


def test_a_refusal_names_the_principal_the_acl_and_the_command_that_grants_it() -> None:
    said = refusal("Write", "cutline.requests", {"sasl.username": "bob"}, "kafka:9093")

    assert said.startswith("User:bob may not Write topic cutline.requests")
    assert (
        "kafka-acls.sh --bootstrap-server kafka:9093 --command-config admin.properties --add "
        "--allow-principal User:bob --operation Write --operation Describe --topic cutline.requests"
    ) in said


def test_what_is_lacking_is_granted_by_one_command_per_resource() -> None:
    group = Grant("group", "cutline.coordinator", ("Read", "Describe"))
    (command,) = lacking_commands([Lacking(group, group.name, ("Read",))], "User:c", "b:1")
    assert command.endswith("--allow-principal User:c --operation Read --group cutline.coordinator")


def test_a_spark_job_s_one_principal_holds_a_driver_s_and_a_task_s_grants_and_its_inputs() -> None:
    chosen = application_grants(TOPICS, ["words"], "wordcount")
    writes = {g.name for g in chosen if "Write" in g.operations}
    assert {TOPICS.job_status, TOPICS.requests, TOPICS.acks, TOPICS.declines} == writes
    assert ("Read", "Describe") == next(g.operations for g in chosen if g.name == "words")
    assert ("Read", "Describe") == next(g.operations for g in chosen if g.name == "wordcount")
    assert {"cutline-kafka-source-", "cutline-offset-probe-"} == {g.name for g in chosen if g.prefixed}
    assert len(chosen) == len({(g.resource, g.name) for g in chosen}), "one grant per resource"


def test_an_exactly_once_sink_s_grants_cover_the_ids_and_topics_it_uses() -> None:
    """Its transactional ids by their prefix, its outputs, and Read and Write on the commit markers."""
    chosen = sink_grants(TOPICS, ["word-counts"])
    (ids,) = [g for g in chosen if g.resource == "transactional-id"]
    assert ids.prefixed and ("Write", "Describe") == ids.operations
    assert ids.covers(transactional_id("cutline", "wordcount", "counts", "driver"))
    assert ("Write", "Describe") == next(g.operations for g in chosen if g.name == "word-counts")
    markers = next(g for g in chosen if g.name == commits_topic(TOPICS))
    assert {"Write", "Read"} <= set(markers.operations)


def test_a_sink_s_transactional_ids_are_granted_by_their_prefix_with_kafka_acls() -> None:
    commands = sink_commands("User:task", TOPICS, ["word-counts"], transactional_id_prefix="wc")
    assert commands[0].endswith(
        "--allow-principal User:task --operation Write --operation Describe "
        "--transactional-id wc --resource-pattern-type prefixed"
    )
    documented = SECURITY.read_text()
    for command in sink_commands("User:task", TOPICS, ["word-counts"]):
        assert command in documented, "docs/security.md gives the sink's commands"


def test_a_sink_s_transactional_id_grant_becomes_a_transactional_id_binding() -> None:
    bindings = grant_bindings(sink_grants(TOPICS, ["out"])[:1], "User:x")
    assert {ResourceType.TRANSACTIONAL_ID} == {b.restype for b in bindings}
    assert {ResourcePatternType.PREFIXED} == {b.resource_pattern_type for b in bindings}
