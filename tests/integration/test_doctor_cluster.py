"""``cutline doctor`` against the broker, as a real process: a missing Java, missing topics, a
finite journal retention, and a cluster with everything in place."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from events.dev.broker import create_topics
from events.wire.topics import Topics


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, dict[str, str]]]:
    environment = {k: v for k, v in os.environ.items() if k != "CUTLINE_BOOTSTRAP"}
    environment.update(env or {})
    result = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "doctor", "--json", "--url", "http://127.0.0.1:9", *args],
        capture_output=True, text=True, timeout=120, env=environment,
    )  # fmt: skip
    checks = {check["name"]: check for check in map(json.loads, result.stdout.splitlines())}
    return result.returncode, checks


def all_topics(prefix: str) -> list[str]:
    return [*Topics(prefix).all, *Topics(prefix).internal]


def test_a_missing_java_fails_and_says_how_to_install_it(bootstrap: str, topic_prefix: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = os.path.dirname(sys.executable)  # python, no java
    create_topics(bootstrap, all_topics(topic_prefix), config=None)

    code, checks = doctor("--bootstrap", bootstrap, "--topic-prefix", topic_prefix, env=env)

    assert 1 == code
    assert ("fail", "no java on PATH and JAVA_HOME is not set") == (
        checks["Java"]["verdict"],
        checks["Java"]["found"],
    )
    assert "openjdk-17-jre-headless" in checks["Java"]["fix"]


def test_missing_topics_fail_and_say_how_to_create_them(bootstrap: str, topic_prefix: str) -> None:
    create_topics(bootstrap, [Topics(topic_prefix).checkpoints])

    code, checks = doctor("--bootstrap", bootstrap, "--topic-prefix", topic_prefix)

    assert 1 == code
    assert "fail" == checks["topics"]["verdict"]
    assert Topics(topic_prefix).acks in checks["topics"]["found"]
    assert (
        f"cutline topics create --bootstrap {bootstrap} --topic-prefix {topic_prefix}"
        in checks["topics"]["fix"]
    )


def test_a_finite_journal_retention_fails_and_says_how_to_keep_it(bootstrap: str, topic_prefix: str) -> None:
    create_topics(bootstrap, [Topics(topic_prefix).checkpoints], config={"retention.ms": "604800000"})
    create_topics(bootstrap, all_topics(topic_prefix))

    code, checks = doctor("--bootstrap", bootstrap, "--topic-prefix", topic_prefix)

    assert 1 == code
    retention = checks["journal retention"]
    assert "fail" == retention["verdict"] and "retention.ms=604800000" in retention["found"]
    assert "retention.ms=-1" in retention["fix"]


def test_a_compacted_journal_fails_and_says_how_to_keep_it(bootstrap: str, topic_prefix: str) -> None:
    config = {"cleanup.policy": "compact", "retention.ms": "-1"}
    create_topics(bootstrap, [Topics(topic_prefix).checkpoints], config=config)
    create_topics(bootstrap, all_topics(topic_prefix))

    code, checks = doctor("--bootstrap", bootstrap, "--topic-prefix", topic_prefix)

    assert 1 == code
    retention = checks["journal retention"]
    assert "fail" == retention["verdict"] and "cleanup.policy=compact" in retention["found"]
    assert "cleanup.policy=delete,retention.ms=-1" in retention["fix"]


def test_a_cluster_with_everything_in_place_passes(bootstrap: str, topic_prefix: str) -> None:
    create_topics(bootstrap, [Topics(topic_prefix).checkpoints], config={"retention.ms": "-1"})
    create_topics(bootstrap, all_topics(topic_prefix))

    code, checks = doctor("--bootstrap", bootstrap, "--topic-prefix", topic_prefix)

    assert 0 == code, checks
    assert {"ok"} == {
        checks[name]["verdict"] for name in ("Python", "Java", "broker", "topics", "journal retention")
    }
    assert "warn" == checks["coordinator"]["verdict"]  # none runs at --url: a warning, not a failure


@pytest.mark.slow  # the broker check waits its timeout
def test_no_broker_skips_what_needs_one() -> None:
    code, checks = doctor("--bootstrap", "127.0.0.1:9")

    assert 1 == code
    assert "fail" == checks["broker"]["verdict"]
    assert ("skipped", "skipped") == (checks["topics"]["verdict"], checks["journal retention"]["verdict"])
