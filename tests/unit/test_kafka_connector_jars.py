"""How ``spark_tasks.connector`` finds Spark's Kafka connector's jars, without Maven or Spark running:
Maven's tree read, Spark's own jars left out, the cache reused, and what it says when Maven, Java or
a jar is missing (docs/spark.md, "Spark's own kafka connector"). Resolving with Maven and reading
Kafka through the jars: tests/spark/test_kafka_connector.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from events.dev.maven import Artifact, parse_tree, resolve_once
from spark_tasks.connector import (
    CONNECTOR,
    JARS_ENV,
    VERSION_ENV,
    ConnectorUnavailable,
    connector_pom,
    kafka_connector,
    shipped,
    spark_version,
)

TREE = """\
dev.cutline:spark-kafka-connector-4.2.0:pom:4.2.0
\\- org.apache.spark:spark-sql-kafka-0-10_2.13:jar:4.2.0:compile
   +- org.apache.spark:spark-token-provider-kafka-0-10_2.13:jar:4.2.0:compile
   |  \\- org.apache.hadoop:hadoop-client-runtime:jar:3.5.0:compile
   +- org.apache.kafka:kafka-clients:jar:3.9.2:compile
   |  \\- org.slf4j:slf4j-api:jar:1.7.36:runtime
   +- io.netty:netty-tcnative-boringssl-static:jar:linux-x86_64:2.0.76.Final:runtime
   \\- org.apache.commons:commons-pool2:jar:2.13.1:compile
"""

JARS = (
    f"{CONNECTOR}-4.2.0.jar",
    "spark-token-provider-kafka-0-10_2.13-4.2.0.jar",
    "kafka-clients-3.9.2.jar",
    "commons-pool2-2.13.1.jar",
)


@pytest.fixture(autouse=True)
def no_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (JARS_ENV, VERSION_ENV):
        monkeypatch.delenv(name, raising=False)


def test_mavens_tree_gives_every_dependency_with_its_version_and_classifier() -> None:
    tree = parse_tree(TREE)

    assert [
        Artifact("org.apache.spark", CONNECTOR, "4.2.0"),
        Artifact("org.apache.spark", "spark-token-provider-kafka-0-10_2.13", "4.2.0"),
        Artifact("org.apache.hadoop", "hadoop-client-runtime", "3.5.0"),
        Artifact("org.apache.kafka", "kafka-clients", "3.9.2"),
        Artifact("org.slf4j", "slf4j-api", "1.7.36", scope="runtime"),
        Artifact(
            "io.netty", "netty-tcnative-boringssl-static", "2.0.76.Final", "jar", "linux-x86_64", "runtime"
        ),
        Artifact("org.apache.commons", "commons-pool2", "2.13.1"),
    ] == tree
    assert "netty-tcnative-boringssl-static-2.0.76.Final-linux-x86_64.jar" == tree[5].file_name


def test_spark_ships_an_artifact_whatever_its_version_and_only_that_artifact() -> None:
    sparks = {"slf4j-api-2.0.17.jar", "commons-pool-1.5.4.jar", "spark-sql_2.13-4.3.0.jar"}

    assert "slf4j-api-2.0.17.jar" == shipped("slf4j-api", sparks)
    assert None is shipped("commons-pool2", sparks)
    assert None is shipped("spark-sql-kafka-0-10_2.13", sparks)
    assert "spark-sql_2.13-4.3.0.jar" == shipped("spark-sql_2.13", sparks)


def test_the_pom_leaves_out_what_spark_ships_in_any_group() -> None:
    pom = connector_pom("4.2.0", [Artifact("org.slf4j", "slf4j-api", "1.7.36")])

    assert f"<artifactId>{CONNECTOR}</artifactId><version>4.2.0</version>" in pom
    assert "<exclusion><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId></exclusion>" in pom


def cached(cache: Path, version: str) -> Path:
    """A cache holding a complete copy of the connector ``version`` for the installed Spark."""
    home = cache / f"spark-{spark_version()}-kafka-connector"
    (home / "jars").mkdir(parents=True)
    for name in JARS:
        (home / "jars" / name).write_bytes(b"")
    (home / "complete").write_text(
        json.dumps({"version": version, "left_out": ["org.slf4j:slf4j-api:1.7.36"]})
    )
    return home


def test_a_complete_copy_in_the_cache_is_used_without_maven_or_java(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = cached(tmp_path, "4.2.0")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("JAVA_HOME", raising=False)

    connector = kafka_connector(cache=tmp_path)

    assert sorted(home / "jars" / name for name in JARS) == list(connector.jars)
    assert ("4.2.0", spark_version()) == (connector.version, connector.spark_version)
    assert ",".join(str(jar) for jar in connector.jars) == connector.spark_jars
    assert ("org.slf4j:slf4j-api:1.7.36",) == connector.left_out


def test_without_java_it_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("JAVA_HOME", raising=False)

    with pytest.raises(
        ConnectorUnavailable, match=r"no `java` is on the PATH.*apt-get install maven openjdk-17"
    ):
        kafka_connector(cache=tmp_path)
    assert [] == list(tmp_path.glob("spark-*-kafka-connector")), "nothing published"


def test_without_maven_it_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "java").write_text("#!/bin/sh\n")
    (bin_dir / "java").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("JAVA_HOME", raising=False)

    with pytest.raises(ConnectorUnavailable, match=r"no `mvn` is on the PATH.*apt-get install maven"):
        kafka_connector(cache=tmp_path / "cache")


def test_given_jars_are_used_as_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in JARS:
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv(JARS_ENV, str(tmp_path))

    connector = kafka_connector(cache=tmp_path / "unused")

    assert "4.2.0" == connector.version
    assert sorted(tmp_path / name for name in JARS) == list(connector.jars)


def test_given_jars_without_kafka_clients_are_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in JARS:
        if not name.startswith("kafka-clients"):
            (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv(JARS_ENV, str(tmp_path))

    with pytest.raises(
        ConnectorUnavailable, match=rf"\${JARS_ENV} \({tmp_path}\) lacks the jars of kafka-clients"
    ):
        kafka_connector()


def test_a_copy_is_made_once_and_a_failed_one_leaves_nothing(tmp_path: Path) -> None:
    home = tmp_path / "thing"
    calls = []

    def fail(work: Path) -> str:
        (work / "half.jar").write_bytes(b"")
        raise ConnectorUnavailable("no")

    def fill(work: Path) -> str:
        calls.append(work)
        (work / "whole.jar").write_bytes(b"")
        return "done"

    with pytest.raises(ConnectorUnavailable):
        resolve_once(home, fail)
    assert not home.exists()
    assert ["done", "done"] == [resolve_once(home, fill), resolve_once(home, fill)]
    assert 1 == len(calls)
    assert ["whole.jar"] == sorted(p.name for p in home.glob("*.jar"))
    assert [] == [p.name for p in tmp_path.iterdir() if p.name.startswith(".")], "no work directory left"
