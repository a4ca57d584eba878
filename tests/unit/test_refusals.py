"""events/kafka/refusals.py: a broker's authorization error becomes the ACL to grant, any other error
nothing (docs/security.md, "Kafka ACLs per principal")."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from events.kafka.refusals import explain, grant_command, is_refusal

ALICE = {"sasl.username": "alice"}


@pytest.mark.parametrize(
    ("code", "kind", "option"),
    [
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, "topic", "--topic cutline.acks"),
        (KafkaError.GROUP_AUTHORIZATION_FAILED, "group", "--group cutline.acks"),
        (
            KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            "transactional-id",
            "--transactional-id cutline.acks",
        ),
    ],
)
def test_each_refusal_names_the_principal_the_operation_the_resource_and_its_command(
    code: int, kind: str, option: str
) -> None:
    """A refusal of Write on ``cutline.acks`` says who may not do what on which kind of resource, and
    the command that grants it with Describe."""
    said = explain(
        KafkaException(KafkaError(code)), "Write", "cutline.acks", bootstrap="b:9093", properties=ALICE
    )

    assert said is not None
    assert said.startswith(f"User:alice may not Write {kind} cutline.acks ({KafkaError(code).name()})")
    assert said.endswith(
        "kafka-acls.sh --bootstrap-server b:9093 --command-config admin.properties --add --allow-principal "
        f"User:alice --operation Write --operation Describe {option}"
    )


def test_a_cluster_refusal_grants_on_the_cluster_which_takes_no_name() -> None:
    """``CLUSTER_AUTHORIZATION_FAILED`` (creating topics without Create) grants on ``--cluster``."""
    said = explain(KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED), "Create", "x", properties=ALICE)

    assert said is not None
    assert "User:alice may not Create cluster kafka-cluster (CLUSTER_AUTHORIZATION_FAILED)" in said
    assert said.endswith("--allow-principal User:alice --operation Create --cluster")


@pytest.mark.parametrize(
    "error",
    [KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), KafkaException(KafkaError(KafkaError._TIMED_OUT)), None],
)
def test_any_other_error_is_not_a_refusal(error: object) -> None:
    """A missing topic, a timeout or no error at all: the caller says what it said before."""
    assert explain(error, "Read", "t", properties=ALICE) is None
    assert not is_refusal(error)


def test_describe_refused_on_a_topic_says_the_broker_hides_whether_it_exists() -> None:
    """Without Describe the broker answers the same for a topic that is there and one that is not."""
    said = explain(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "Describe", "t", properties=ALICE)

    assert said is not None and "does not say whether a topic exists" in said


def test_a_prefixed_grant_is_one_command_for_the_prefix() -> None:
    assert grant_command("User:a", "topic", "cutline.", ["Read"], prefixed=True).endswith(
        "--operation Read --topic cutline. --resource-pattern-type prefixed"
    )
