"""Which source the word count and the demo read Kafka with (spark_tasks/source_choice.py): Spark's own
connector where its jars resolve, cutline-kafka otherwise, and the line that says which and why."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from spark_tasks.connector import ConnectorUnavailable, KafkaConnector  # noqa: E402
from spark_tasks.source_choice import (  # noqa: E402
    CONNECTOR,
    CUTLINE_KAFKA,
    SourceUnavailable,
    choose_source,
    security_refusal,
)

JARS = KafkaConnector("4.2.0", "4.2.0", (Path("/c/spark-sql-kafka-0-10_2.13-4.2.0.jar"),))


def resolves() -> KafkaConnector:
    return JARS


def no_maven() -> KafkaConnector:
    raise ConnectorUnavailable("no `mvn` is on the PATH: install it (e.g. `apt-get install maven`)")


class TestByDefault:
    def test_the_count_reads_with_the_connector_where_its_jars_resolve(self) -> None:
        choice = choose_source(None, remote=False, resolve=resolves)

        assert (CONNECTOR, JARS) == (choice.source, choice.connector)
        assert "source: Spark's kafka connector 4.2.0 (its jars resolve)" == choice.line

    def test_without_maven_it_falls_back_to_cutline_kafka_and_says_why_in_one_line(self) -> None:
        choice = choose_source(None, remote=False, resolve=no_maven)

        assert CUTLINE_KAFKA == choice.source
        assert choice.line.startswith("source: cutline-kafka (Spark's kafka connector is not available: ")
        assert "no `mvn` is on the PATH" in choice.line and "\n" not in choice.line

    def test_on_spark_connect_the_servers_jars_are_unknown_so_cutline_kafka(self) -> None:
        assert CUTLINE_KAFKA == choose_source(None, remote=True, resolve=resolves).source

    def test_a_connector_of_another_spark_says_so(self) -> None:
        other = KafkaConnector("4.2.0", "4.3.0", JARS.jars)

        line = choose_source(None, remote=False, resolve=lambda: other).line

        assert "source: Spark's kafka connector 4.2.0 on PySpark 4.3.0 (its jars resolve)" == line


class TestAsAsked:
    def test_cutline_kafka_is_read_with_even_where_the_connector_resolves(self) -> None:
        choice = choose_source(CUTLINE_KAFKA, remote=False, resolve=resolves)

        assert (CUTLINE_KAFKA, "source: cutline-kafka (as asked)") == (choice.source, choice.line)

    def test_the_connector_asked_for_and_unavailable_is_an_error_saying_what_to_install(self) -> None:
        with pytest.raises(SourceUnavailable, match="--source kafka: no `mvn` is on the PATH: install it"):
            choose_source(CONNECTOR, remote=False, resolve=no_maven)

    def test_the_connector_asked_for_on_spark_connect_is_the_servers(self) -> None:
        choice = choose_source(CONNECTOR, remote=True, resolve=no_maven)

        assert (CONNECTOR, None) == (choice.source, choice.connector)

    def test_another_source_is_refused(self) -> None:
        with pytest.raises(SourceUnavailable, match="--source is 'kafka' or 'cutline-kafka'"):
            choose_source("kafka-0-8", remote=False, resolve=resolves)


class TestOnASecuredCluster:
    """The connector gets the job's Kafka client settings as its Java client's options where they
    translate (spark_tasks/connector_security.py); where they do not, the job reads with cutline-kafka
    and says why, and ``--source kafka`` is refused saying what to do."""

    SCRAM = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "spark",
        "sasl.password": "pw",
    }

    def test_settings_that_translate_leave_the_connector_chosen(self) -> None:
        refused = security_refusal(self.SCRAM)

        assert refused is None
        assert CONNECTOR == choose_source(None, remote=False, resolve=resolves, refused=refused).source

    def test_settings_that_do_not_translate_make_the_job_read_with_cutline_kafka_and_say_why(self) -> None:
        refused = security_refusal({**self.SCRAM, "sasl.mechanism": "GSSAPI"})
        assert refused is not None

        choice = choose_source(None, remote=False, resolve=resolves, refused=refused)

        assert CUTLINE_KAFKA == choice.source
        assert "cannot get the Kafka client settings: sasl.mechanism=GSSAPI (Kerberos)" in choice.line

    def test_asking_for_the_connector_with_settings_that_do_not_translate_is_refused_with_what_to_do(
        self,
    ) -> None:
        refused = security_refusal({**self.SCRAM, "sasl.mechanism": "OAUTHBEARER"})

        with pytest.raises(SourceUnavailable, match="OAUTHBEARER.*--source cutline-kafka"):
            choose_source(CONNECTOR, remote=False, resolve=resolves, refused=refused)

    def test_the_job_s_own_security_options_make_any_settings_acceptable(self) -> None:
        assert (
            security_refusal({**self.SCRAM, "sasl.mechanism": "GSSAPI"}, ["kafka.security.protocol"]) is None
        )
