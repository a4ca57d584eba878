"""Kafka client settings for secured clusters (events/kafka/client_config.py): from a properties file,
CUTLINE_KAFKA_* variables and -X; given to each kind of client in its own terms; secrets hidden."""

from __future__ import annotations

import ssl
from pathlib import Path

import faust
import pytest

from coordinator.service.watcher import watch_fetch_wait_ms
from events.kafka.client_config import (
    ClientConfigError,
    aiokafka_security,
    client_properties,
    faust_credentials,
    fetch_wait_ms,
    override,
    parse_properties,
    redacted,
    scrubbed,
)
from events.kafka.clients import consumer_config, producer_config
from spark_tasks.kafka_source.options import KafkaSourceOptions

SASL = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice"}


def test_a_properties_file_in_kcat_and_java_style() -> None:
    text = (
        "# comment\n! also one\n\nsecurity.protocol=SASL_SSL\nsasl.mechanism : PLAIN\nsasl.jaas.config=a=b\n"
    )

    assert {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config": "a=b"} == (
        parse_properties(text)
    )
    with pytest.raises(ClientConfigError, match="client.properties, line 2: expected name=value"):
        parse_properties("a=b\nnonsense\n", "client.properties")


def test_variables_override_the_file_and_x_overrides_both(tmp_path: Path) -> None:
    """Given a file, a variable and a -X for the same property, -X wins; bootstrap.servers is left
    to --bootstrap."""
    config = tmp_path / "client.properties"
    config.write_text("sasl.username=from-file\nsasl.mechanism=PLAIN\nbootstrap.servers=elsewhere:9092\n")
    environ = {"CUTLINE_KAFKA_CONFIG": str(config), "CUTLINE_KAFKA_SASL_USERNAME": "from-env", "HOME": "/x"}

    before = client_properties(environ)
    override(["sasl.username=from-x", "ssl.ca.location=/ca.pem"], environ)
    after = client_properties(environ)

    assert {"sasl.username": "from-env", "sasl.mechanism": "PLAIN"} == before
    assert {"sasl.username": "from-x", "sasl.mechanism": "PLAIN", "ssl.ca.location": "/ca.pem"} == after


def test_a_java_jaas_config_becomes_librdkafka_s_username_and_password() -> None:
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="bob" password="pw";'

    assert {"sasl.username": "bob", "sasl.password": "pw"} == client_properties(
        {"CUTLINE_KAFKA_SASL_JAAS_CONFIG": jaas}
    )


def test_an_unreadable_file_and_a_malformed_x_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ClientConfigError, match="CUTLINE_KAFKA_CONFIG.*unreadable"):
        client_properties({"CUTLINE_KAFKA_CONFIG": str(tmp_path / "missing")})
    with pytest.raises(ClientConfigError, match="expected -X name=value"):
        override(["sasl.password"], {})


def test_confluent_kafka_clients_get_the_properties_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SASL.items():
        monkeypatch.setenv("CUTLINE_KAFKA_" + name.upper().replace(".", "_"), value)

    producer = producer_config("broker:9092", {"linger.ms": 5})
    consumer = consumer_config("broker:9092", "group")
    source = KafkaSourceOptions(
        "broker:9092", ("t",), kafka={"sasl.username": "spark-user"}
    ).consumer_config()

    assert SASL.items() <= producer.items() and SASL.items() <= consumer.items()
    assert ("broker:9092", 5) == (producer["bootstrap.servers"], producer["linger.ms"])
    assert "spark-user" == source["sasl.username"]  # the source's own kafka.* options win
    assert "SCRAM-SHA-512" == source["sasl.mechanism"]


def test_consumers_fetch_with_cutline_fetch_wait_ms_when_it_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given no CUTLINE_FETCH_WAIT_MS, a consumer waits the default that suits Apache Kafka (which
    answers as soon as records arrive); given one, that; an explicit ``fetch.wait.max.ms`` of the
    caller wins over both."""
    monkeypatch.delenv("CUTLINE_FETCH_WAIT_MS", raising=False)
    assert 500 == consumer_config("b:9092")["fetch.wait.max.ms"]
    monkeypatch.setenv("CUTLINE_FETCH_WAIT_MS", "5")
    assert 5 == consumer_config("b:9092")["fetch.wait.max.ms"]
    assert 10 == consumer_config("b:9092", extra={"fetch.wait.max.ms": 10})["fetch.wait.max.ms"]
    assert "fetch.wait.max.ms" not in producer_config("b:9092")


@pytest.mark.parametrize(
    ("variable", "expected"),
    [(None, 500), ("5", 50), ("100", 100), ("2000", 2000)],
    ids=["apache-kafka-default", "embedded-broker", "shorter", "longer"],
)
def test_the_journal_watcher_waits_as_the_other_consumers_but_never_under_50_ms(
    variable: str | None, expected: int
) -> None:
    """Given CUTLINE_FETCH_WAIT_MS (unset on Apache Kafka, 5 ms on the embedded broker), the journal
    watcher's fetches wait as long as the worker's other consumers', and at least 50 ms: the embedded
    broker parks an empty fetch for half its wait, so a shorter one would poll it."""
    environ = {} if variable is None else {"CUTLINE_FETCH_WAIT_MS": variable}
    assert expected == watch_fetch_wait_ms(environ)


@pytest.mark.parametrize("value", ["0", "-5", "fast", "1.5"])
def test_a_fetch_wait_that_is_no_whole_positive_number_is_refused_by_name(value: str) -> None:
    with pytest.raises(ClientConfigError, match=f"CUTLINE_FETCH_WAIT_MS={value!r}: give a whole number"):
        fetch_wait_ms(5, {"CUTLINE_FETCH_WAIT_MS": value})


def test_aiokafka_and_faust_get_them_in_their_own_terms() -> None:
    properties = {**SASL, "sasl.password": "s3cr3t"}

    security = aiokafka_security(properties)
    credentials = faust_credentials(properties)

    assert {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "s3cr3t",
    } == security
    assert isinstance(credentials, faust.SASLCredentials)
    assert ("alice", "s3cr3t", "SCRAM-SHA-512") == (
        credentials.username,
        credentials.password,
        credentials.mechanism.value,
    )
    assert faust_credentials({}) is None


def test_ssl_settings_become_an_ssl_context() -> None:
    security = aiokafka_security({"security.protocol": "SSL", "enable.ssl.certificate.verification": "false"})

    assert "SSL" == security["security_protocol"]
    assert isinstance(security["ssl_context"], ssl.SSLContext)
    assert ssl.CERT_NONE == security["ssl_context"].verify_mode
    assert isinstance(faust_credentials({"security.protocol": "SSL"}), faust.SSLCredentials)


def test_a_mechanism_the_coordinator_cannot_speak_is_refused_by_name() -> None:
    with pytest.raises(ClientConfigError, match="sasl.mechanism=GSSAPI.*PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"):
        aiokafka_security({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"})


def test_secrets_are_redacted() -> None:
    shown = redacted(
        {"sasl.password": "p", "ssl.key.password": "k", "sasl.jaas.config": "j", "sasl.username": "alice"}
    )

    assert {"sasl.password", "ssl.key.password", "sasl.jaas.config"} == {
        k for k, v in shown.items() if v == "[redacted]"
    }
    assert "alice" == shown["sasl.username"]


def test_an_error_that_quotes_a_secret_shows_it_redacted() -> None:
    """A client library's error may quote a value: every secret's value in it is replaced, the longest
    first (so a password that holds a shorter one leaves no part of itself), and nothing else is."""
    properties = {"sasl.password": "hunter2-and-more", "ssl.key.password": "hunter2", "sasl.username": "bob"}

    shown = scrubbed('bad value "hunter2-and-more" or "hunter2" of bob', properties)

    assert 'bad value "[redacted]" or "[redacted]" of bob' == shown


def test_the_jar_cache_variables_of_apache_kafka_are_not_client_properties() -> None:
    """``CUTLINE_KAFKA_CACHE`` and ``CUTLINE_KAFKA_LIBS`` say where Apache Kafka's jars are
    (docs/usage.md); as ``cache`` and ``libs`` properties, librdkafka refused every client."""
    environ = {
        "CUTLINE_KAFKA_CACHE": "/tmp/jars",
        "CUTLINE_KAFKA_LIBS": "/opt/kafka/libs",
        "CUTLINE_KAFKA_ACKS": "1",
    }
    assert {"acks": "1"} == client_properties(environ)
