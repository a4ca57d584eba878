"""The archive of Kafka's classes that the tests' nodes map (tests/jvm_archive.py): its name says what
it was made for, so a node never maps one made for other jars or other JVM options."""

from __future__ import annotations

import shutil
from pathlib import Path

import jvm_archive
import pytest

OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

pytestmark = pytest.mark.skipif(
    shutil.which("java") is None, reason="names an archive for this machine's java"
)


def libs(tmp_path: Path, *jars: str) -> str:
    directory = tmp_path / "libs"
    directory.mkdir(exist_ok=True)
    for jar in jars:
        (directory / jar).touch()
    return f"{directory}/*"


def test_the_same_jars_and_options_name_the_same_archive(tmp_path: Path) -> None:
    classpath = libs(tmp_path, "kafka_2.13-4.4.0.jar")

    first = jvm_archive.kafka_archive_path(tmp_path, classpath, OPTIONS)

    assert first is not None and first.name.startswith("kafka-") and first.suffix == ".jsa"
    assert first == jvm_archive.kafka_archive_path(tmp_path, classpath, OPTIONS)


def test_another_jar_or_other_options_name_another_archive(tmp_path: Path) -> None:
    classpath = libs(tmp_path, "kafka_2.13-4.4.0.jar")
    before = jvm_archive.kafka_archive_path(tmp_path, classpath, OPTIONS)

    other_options = jvm_archive.kafka_archive_path(tmp_path, classpath, "-XX:+UseG1GC")
    libs(tmp_path, "kafka-clients-4.4.0.jar")
    other_jars = jvm_archive.kafka_archive_path(tmp_path, classpath, OPTIONS)

    assert len({before, other_options, other_jars}) == 3


def test_an_archive_already_there_is_not_made_again(tmp_path: Path) -> None:
    archive = tmp_path / "kafka-0123456789abcdef.jsa"
    archive.write_bytes(b"made")

    assert jvm_archive.make_kafka_archive_in_background(archive, OPTIONS) is None
    assert b"made" == archive.read_bytes()
