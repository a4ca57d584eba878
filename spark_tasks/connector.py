"""Spark's own Kafka connector (``spark-sql-kafka-0-10``) as local jars, for ``spark.jars``.

:func:`kafka_connector` resolves ``org.apache.spark:spark-sql-kafka-0-10_2.13`` at the installed
PySpark's version with Maven, once per machine, into a cache outside the repository
(``$CUTLINE_KAFKA_CACHE``, by default ``~/.cache/cutline``, as Apache Kafka's jars:
:mod:`events.dev.apache_kafka`), and leaves out every jar whose artifact Spark already ships in
``$SPARK_HOME/jars``, so that no second copy of a class goes on the classpath. A session then gets
the jars as files (:func:`with_kafka_connector`): nothing depends on Spark's Ivy reaching a
repository when a query starts. docs/spark.md, "Spark's own kafka connector".
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from events.dev.maven import (
    Artifact,
    ArtifactNotFound,
    MavenUnavailable,
    cache_root,
    copy_dependencies,
    dependency_tree,
    dependency_xml,
    pom_xml,
    require_java,
    require_maven,
    resolve_once,
)

__all__ = [
    "CONNECTOR",
    "ConnectorUnavailable",
    "KafkaConnector",
    "kafka_connector",
    "kafka_connector_jars",
    "spark_jars_dir",
    "with_kafka_connector",
]

log = logging.getLogger(__name__)

GROUP = "org.apache.spark"
CONNECTOR = "spark-sql-kafka-0-10_2.13"
"""The connector's artifact (Scala 2.13, the only Scala of Spark 4)."""

PROVIDER_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
"""The class behind ``format("kafka")``."""

REQUIRED = (CONNECTOR, "spark-token-provider-kafka-0-10_2.13", "kafka-clients", "commons-pool2")
"""The artifacts the connector cannot run without that Spark does not ship."""

CACHE_ENV = "CUTLINE_KAFKA_CACHE"
"""The cache root, shared with Apache Kafka's jars (:mod:`events.dev.apache_kafka`)."""

VERSION_ENV = "CUTLINE_SPARK_KAFKA_VERSION"
"""The connector's version to fetch instead of the installed PySpark's (and no other)."""

JARS_ENV = "CUTLINE_SPARK_KAFKA_JARS"
"""A directory holding the connector's jars, to use instead of Maven's copy."""

TESTED_FALLBACKS = {"4.3.0": "4.2.0"}
"""The connector to use where the installed PySpark's own is not in Maven's repositories, for a
PySpark with which ``tests/spark/test_kafka_connector.py`` passes on that connector. Spark 4.3.0's
artifacts were not on the Maven Central these machines reach in November 2026 (PyPI had PySpark
4.3.0 since October). Used with a warning, only when the exact version is missing; a connector is
built against one Spark's internals and is not guaranteed to work on another."""

INSTALL_HINT = "apt-get install maven openjdk-17-jre-headless"
WHAT = "Spark's Kafka connector (spark-sql-kafka-0-10)'s jars"


class ConnectorUnavailable(MavenUnavailable):
    """The connector's jars cannot be had here, or cannot reach this process's Spark; the message
    says why and what to do."""


@dataclass(frozen=True)
class KafkaConnector:
    """The jars of one ``spark-sql-kafka-0-10`` for one installed Spark."""

    version: str
    """The connector's (Spark) version."""
    spark_version: str
    """The installed PySpark's version."""
    jars: tuple[Path, ...]
    left_out: tuple[str, ...] = ()
    """The connector's dependencies that Spark ships, and so left out: ``group:artifact:version``."""

    @property
    def exact(self) -> bool:
        """Is it the installed Spark's own connector?"""
        return self.version == self.spark_version

    @property
    def spark_jars(self) -> str:
        """The jars as ``spark.jars`` takes them: comma-separated paths."""
        return ",".join(str(jar) for jar in self.jars)


def spark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def spark_jars_dir() -> Path:
    """The jars of the Spark that runs: ``$SPARK_HOME/jars``, else the pip PySpark's ``jars``."""
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home) / "jars"
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def shipped(artifact: str, jar_names: set[str]) -> str | None:
    """The jar of ``artifact`` (any version) among ``jar_names``, if any."""
    pattern = re.compile(rf"^{re.escape(artifact)}-\d.*\.jar$")
    return next((name for name in sorted(jar_names) if pattern.match(name)), None)


def missing_jars(jars: list[Path]) -> list[str]:
    """The :data:`REQUIRED` artifacts that have no jar among ``jars``."""
    names = {jar.name for jar in jars}
    return [artifact for artifact in REQUIRED if shipped(artifact, names) is None]


def connector_pom(version: str, exclusions: Sequence[Artifact] = ()) -> str:
    """A POM whose runtime dependencies are the connector's at ``version``, without ``exclusions``."""
    dependency = dependency_xml(GROUP, CONNECTOR, version, exclusions)
    return pom_xml(f"spark-kafka-connector-{version}", version, [dependency])


def kafka_connector(cache: Path | None = None, timeout: float = 900) -> KafkaConnector:
    """The connector's jars: ``$CUTLINE_SPARK_KAFKA_JARS``, or Maven's copy in the cache (fetched the
    first time, under a file lock, published behind a ``complete`` marker).

    Maven's copy is of the installed PySpark's version, or ``$CUTLINE_SPARK_KAFKA_VERSION``'s; where
    the installed version is not in Maven's repositories, of its :data:`TESTED_FALLBACKS` entry (with
    a warning). :class:`ConnectorUnavailable` says what is missing and how to install it.
    """
    spark = spark_version()
    given = os.environ.get(JARS_ENV)
    if given:
        return _given_jars(Path(given).expanduser(), spark)
    pinned = os.environ.get(VERSION_ENV) or None
    name = f"spark-{spark}-kafka-connector" + (f"-{pinned}" if pinned else "")
    home = (cache or cache_root(CACHE_ENV)) / name
    candidates = [pinned] if pinned else [spark, *filter(None, [TESTED_FALLBACKS.get(spark)])]
    try:
        marker = json.loads(resolve_once(home, lambda work: _fetch(work, candidates, timeout)))
    except ConnectorUnavailable:
        raise
    except MavenUnavailable as exc:
        raise ConnectorUnavailable(str(exc)) from exc
    connector = KafkaConnector(
        marker["version"], spark, tuple(sorted((home / "jars").glob("*.jar"))), tuple(marker["left_out"])
    )
    if not connector.exact and not pinned:
        log.warning(
            "Spark's Kafka connector %s runs on PySpark %s, whose own (%s:%s:%s) is not in Maven's "
            "repositories: set $%s=%s to insist on it, and delete %s to look for it again",
            connector.version, spark, GROUP, CONNECTOR, spark, VERSION_ENV, spark, home,
        )  # fmt: skip
    return connector


def _given_jars(directory: Path, spark: str) -> KafkaConnector:
    jars = sorted(directory.glob("*.jar"))
    missing = missing_jars(jars)
    if missing:
        raise ConnectorUnavailable(f"${JARS_ENV} ({directory}) lacks the jars of {', '.join(missing)}")
    connector = next(jar.name for jar in jars if jar.name.startswith(f"{CONNECTOR}-"))
    version = connector.removeprefix(f"{CONNECTOR}-").removesuffix(".jar")
    return KafkaConnector(version, spark, tuple(jars))


def _fetch(work: Path, candidates: list[str], timeout: float) -> str:
    """Fill ``work/jars`` with the first of ``candidates`` that Maven's repositories have; the
    ``complete`` marker's text (JSON: the version and what was left out)."""
    require_java(WHAT, INSTALL_HINT)
    require_maven(WHAT, INSTALL_HINT)
    tried = []
    for version in candidates:
        try:
            return _fetch_version(work, version, timeout)
        except ArtifactNotFound as exc:
            if not any(f":{CONNECTOR}:" in c for c in exc.coordinates):
                raise
            log.warning("%s:%s:%s is not in Maven's repositories", GROUP, CONNECTOR, version)
            tried.append(version)
    raise ConnectorUnavailable(
        f"{GROUP}:{CONNECTOR} is not in Maven's repositories at version {' nor '.join(tried)} (the "
        f"installed PySpark is {spark_version()}): set ${VERSION_ENV} to the version of a published "
        f"connector (a connector of another Spark than the one that runs is not guaranteed to work), "
        f"or ${JARS_ENV} to a directory holding its jars"
    )


def _fetch_version(work: Path, version: str, timeout: float) -> str:
    """Maven's dependency tree of the connector at ``version``, then a copy of its jars into
    ``work/jars`` without those whose artifact Spark ships (Spark's copy, of whatever version, wins)."""
    maven = work / f"maven-{version}"
    try:
        jar_names = {path.name for path in spark_jars_dir().glob("*.jar")}
        tree = dependency_tree(connector_pom(version), maven / "tree", WHAT, timeout)
        excluded = [a for a in tree if a.artifact != CONNECTOR and shipped(a.artifact, jar_names)]
        left_out = [f"{a} (Spark ships {shipped(a.artifact, jar_names)})" for a in excluded]
        jars = copy_dependencies(
            connector_pom(version, excluded), maven / "copy", work / "jars", WHAT, timeout
        )
    except MavenUnavailable:
        shutil.rmtree(work / "jars", ignore_errors=True)
        raise
    finally:
        shutil.rmtree(maven, ignore_errors=True)
    missing = missing_jars(jars)
    if missing:
        raise ConnectorUnavailable(f"Maven's copy of {CONNECTOR}:{version} lacks {', '.join(missing)}")
    return json.dumps({"version": version, "left_out": left_out}, indent=1)


def kafka_connector_jars() -> list[str]:
    """The connector's jars, as paths (:func:`kafka_connector`)."""
    return [str(jar) for jar in kafka_connector().jars]


def with_kafka_connector(builder: Any, connector: KafkaConnector | None = None) -> Any:
    """``builder`` (a ``SparkSession.Builder``) with ``spark.jars`` set to the connector's jars (a
    ``spark.jars`` set before is replaced: join other jars with :func:`kafka_connector_jars`).

    The jars reach Spark's driver only when its JVM starts: a process whose JVM runs without them
    (a session created, even stopped, before) gets :class:`ConnectorUnavailable` here, not
    ``KAFKA_DATA_SOURCE_NOT_ENABLED`` at its first query.
    """
    connector = connector or kafka_connector()
    _check_running_jvm()
    return builder.config("spark.jars", connector.spark_jars)


def _check_running_jvm() -> None:
    from pyspark import SparkContext

    jvm = SparkContext._jvm  # set once this process has started Spark's JVM
    if jvm is None:
        return
    if not jvm.org.apache.spark.util.Utils.classIsLoadable(PROVIDER_CLASS):
        raise ConnectorUnavailable(
            "this process's Spark JVM started without Spark's Kafka connector, and jars given to a "
            "later session (spark.jars) do not reach its driver: create the first SparkSession of the "
            "process with the connector (with_kafka_connector), or use a process of its own"
        )
