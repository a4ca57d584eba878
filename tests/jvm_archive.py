"""Class-data sharing for the tests' Spark and Kafka JVMs: one archive of each one's classes, made once.

A Spark JVM spends much of its start loading and verifying the same few thousand classes. Java's
application class-data sharing (AppCDS, JEP 350) maps them from an archive instead (what it saves:
docs/spark.md, "Tests"). Every Spark JVM of the suite (drivers, executors, the standalone master
and workers, the Connect server) starts with :func:`java_options`.

The archive is written by one small Spark application (:data:`WORKLOAD`) run by ``spark-submit``
with ``-XX:ArchiveClassesAtExit``; it is kept in pytest's cache directory under a name that says
which Java and which PySpark it was made for. While it is being made (in the background, at the
start of the session) the JVMs that start find no archive and run as they would without one; an
archive that does not fit (another class path, another JVM) is ignored as well. Java says nothing
of either: the options turn its ``cds`` log off. Nothing here is needed for correctness.

Apache Kafka's nodes get an archive of their own the same way (:class:`KafkaArchiveMaker`: one node
that starts, takes a few records and stops), named after the Java and the broker's jars: a node
that maps it starts on 2.0-2.1 CPU s instead of 2.8-3.0 (docs/benchmarks.md, "The test suite").
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from support import pyspark_script

WORKLOAD = """
from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.appName("cutline-jvm-archive")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .getOrCreate()
)
frame = spark.range(2000).selectExpr("id % 10 AS k", "id AS v")
frame.groupBy("k").sum("v").collect()
frame.mapInArrow(lambda batches: batches, frame.schema).count()
query = (
    spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    .groupBy().count()
    .writeStream.outputMode("complete")
    .foreachBatch(lambda batch, batch_id: batch.collect())
    .trigger(processingTime="200 milliseconds")
    .start()
)
query.awaitTermination(4)
query.stop()
spark.stop()
"""
"""What the archive holds the classes of: a shuffle, an Arrow UDF and a stateful streaming query."""


def _java_identity() -> str | None:
    """This machine's ``java``: its home and its release file (None without Java)."""
    java = shutil.which("java")
    if java is None:
        return None
    java_home = Path(java).resolve().parent.parent
    release = java_home / "release"
    java_release = release.read_text() if release.exists() else ""
    return f"{java_home}\n{java_release}"


def archive_path(cache: Path) -> Path | None:
    """Where the archive for this machine's ``java`` and this PySpark is (None without Java)."""
    java = _java_identity()
    if java is None:
        return None
    pyspark = f"{pyspark_script('spark-submit')} {importlib.metadata.version('pyspark')}"
    identity = f"{java}\n{pyspark}"
    return cache / f"spark-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.jsa"


def java_options(archive: Path) -> str:
    """Options that map ``archive`` when it exists and fits, silently run without it otherwise."""
    return f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


class ArchiveMaker:
    """Writes the archive in the background: ``spark-submit`` of :data:`WORKLOAD` and a thread that
    waits for it. The archive appears under its name only once whole: it is written to another name
    and renamed after ``spark-submit`` (and so the JVM that wrote it) has exited."""

    def __init__(self, archive: Path, jvm_options: str) -> None:
        self.archive = archive
        self._partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
        self._script = archive.with_name(f"{archive.stem}.{os.getpid()}.py")
        archive.parent.mkdir(parents=True, exist_ok=True)
        self._script.write_text(WORKLOAD)
        environment = {
            **os.environ,
            "SPARK_SUBMIT_OPTS": f"{jvm_options} -XX:ArchiveClassesAtExit={self._partial}",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        spark_submit = pyspark_script("spark-submit")
        self._process = subprocess.Popen(
            [str(spark_submit), "--master", "local[2]", str(self._script)],
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            # niced: the tests that start at the same time keep the CPU they would have without it
            preexec_fn=lambda: os.nice(10),
        )
        self._thread = threading.Thread(target=self._finish, name="cutline-jvm-archive", daemon=True)
        self._thread.start()

    def _finish(self) -> None:
        try:
            if self._process.wait() == 0 and self._partial.exists():
                self._partial.replace(self.archive)
        finally:
            self._partial.unlink(missing_ok=True)
            self._script.unlink(missing_ok=True)

    def stop(self) -> None:
        """End the application if it still runs (with the session): no archive this time."""
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
        self._thread.join(10)


def _to_make(archive: Path) -> bool:
    """Whether ``archive`` is still to be made; if so, the other archives of its kind (its name's
    prefix: made for another Java, other classes or options) are deleted first (a JVM that maps one
    keeps its copy)."""
    if archive.exists():
        return False
    kind = archive.name.split("-", 1)[0]
    for stale in archive.parent.glob(f"{kind}-*.jsa"):
        stale.unlink(missing_ok=True)
    return True


def make_in_background(archive: Path, jvm_options: str) -> ArchiveMaker | None:
    """Start writing ``archive`` unless it exists (None when there is nothing to do); the archives
    of another Java or PySpark in its directory are deleted."""
    return ArchiveMaker(archive, jvm_options) if _to_make(archive) else None


def kafka_archive_path(cache: Path, classpath: str, options: str) -> Path | None:
    """Where the archive of Kafka's classes for this ``java``, these jars and JVM options is."""
    java = _java_identity()
    if java is None:
        return None
    jars = sorted(path.name for path in Path(classpath.rstrip("*")).glob("*.jar"))
    identity = "\n".join([java, classpath, options, *jars])
    return cache / f"kafka-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.jsa"


class KafkaArchiveMaker:
    """Writes the archive of Kafka's classes in a thread: a one-node Apache Kafka started with
    ``-XX:ArchiveClassesAtExit`` takes a few records and stops (the JVM writes the archive as it exits),
    and the archive is renamed into place once whole."""

    def __init__(self, archive: Path, options: str) -> None:
        self.archive = archive
        self._partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
        self._options = (*shlex.split(options), f"-XX:ArchiveClassesAtExit={self._partial}")
        archive.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._make, name="cutline-kafka-archive", daemon=True)
        self._thread.start()

    def _make(self) -> None:
        from confluent_kafka import Producer

        from events.dev.apache_kafka import ApacheKafka
        from events.dev.broker import create_topics

        try:
            with ApacheKafka(heap="256m", java_options=self._options, ends_with_parent=True) as kafka:
                create_topics(kafka.bootstrap, ["archive"], partitions=2)
                producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
                for index in range(100):
                    producer.produce("archive", str(index).encode())
                producer.flush(30)
                del producer  # gone before its node: no reconnection attempts logged while it stops
            if self._partial.exists():
                self._partial.replace(self.archive)
        except Exception:  # no archive this time: the nodes run as they would without one
            pass
        finally:
            self._partial.unlink(missing_ok=True)

    def stop(self) -> None:
        """Wait a little for it to finish (with the session); its node ends with this process."""
        self._thread.join(30)


def make_kafka_archive_in_background(archive: Path, options: str) -> KafkaArchiveMaker | None:
    """Start writing ``archive`` unless it exists (None when there is nothing to do); the archives of
    other jars or options in its directory are deleted."""
    return KafkaArchiveMaker(archive, options) if _to_make(archive) else None
