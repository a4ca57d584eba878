"""cutline doctor's checks that need no cluster: Python and Java."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from coordinator.service.doctor import CheckStatus, check_java, check_python, java_major


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ("no version here", None),
    ],
)
def test_the_java_major_version_is_read_from_java_dash_version(output: str, major: int | None) -> None:
    assert major == java_major(output)


def test_python_older_than_3_11_fails_and_says_what_to_install() -> None:
    check = check_python((3, 10, 12))

    assert (CheckStatus.FAIL, "3.10.12") == (check.verdict, check.found)
    assert "3.11" in check.fix
    assert CheckStatus.OK == check_python((3, 11, 7)).verdict


def test_no_java_on_path_and_no_java_home_fails_and_says_how_to_install_it(tmp_path: Path) -> None:
    check = check_java({"PATH": str(tmp_path)})

    assert CheckStatus.FAIL == check.verdict
    assert "no java on PATH and JAVA_HOME is not set" == check.found
    assert "openjdk-17-jre-headless" in check.fix and "JAVA_HOME" in check.fix


def test_a_java_home_without_java_fails(tmp_path: Path) -> None:
    check = check_java({"PATH": "", "JAVA_HOME": str(tmp_path)})

    assert CheckStatus.FAIL == check.verdict
    assert f"JAVA_HOME={tmp_path} has no bin/java" == check.found


def fake_java(tmp_path: Path, version: str) -> Path:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2021-01-01' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return java


def test_java_11_is_too_old_for_spark(tmp_path: Path) -> None:
    fake_java(tmp_path, "11.0.2")

    check = check_java({"PATH": os.environ.get("PATH", ""), "JAVA_HOME": str(tmp_path)})

    assert (CheckStatus.FAIL, f"Java 11 at {tmp_path}/bin/java (JAVA_HOME={tmp_path})") == (
        check.verdict,
        check.found,
    )


def test_java_17_from_java_home_is_fine(tmp_path: Path) -> None:
    fake_java(tmp_path, "17.0.9")

    assert CheckStatus.OK == check_java({"PATH": "", "JAVA_HOME": str(tmp_path)}).verdict
