"""Kafka client settings from a properties file reach every client, and their secrets reach no log,
no --help and no doctor output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import create_protocol_topics

from coordinator.service.supervisor import CoordinatorProcess

SECRET = "hunter2-never-print-me"


def cutline(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator.cli", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_the_coordinator_runs_with_a_client_config_and_logs_no_secret(
    bootstrap: str, topic_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "client.properties"
    config.write_text(f"security.protocol=PLAINTEXT\nsasl.username=alice\nsasl.password={SECRET}\n")
    monkeypatch.setenv("CUTLINE_KAFKA_CONFIG", str(config))
    create_protocol_topics(bootstrap, topic_prefix)

    with CoordinatorProcess(bootstrap, topic_prefix, extra_args=("--loglevel", "info")) as coordinator:
        assert coordinator.get("/ready")["recovered"]
    log = coordinator.log_path.read_text()

    assert SECRET not in log
    assert "claimed journal partition" in log  # it did talk to the broker with these settings


def test_doctor_and_help_show_no_secret(bootstrap: str, topic_prefix: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CUTLINE_BOOTSTRAP"}
    env["CUTLINE_KAFKA_SASL_JAAS_CONFIG"] = (  # read as sasl.username and sasl.password
        f'org.apache.kafka.common.security.plain.PlainLoginModule password="{SECRET}";'
    )

    doctor = cutline(
        "-X", f"sasl.password={SECRET}", "-X", "sasl.username=alice",
        "doctor", "--json", "--bootstrap", bootstrap, "--topic-prefix", topic_prefix, "--url", "http://127.0.0.1:9",
        env=env,
    )  # fmt: skip
    helps = [cutline(*command, "--help", env=env) for command in ([], ["coordinator"], ["doctor"])]

    checks = {c["name"]: c for c in map(json.loads, doctor.stdout.splitlines())}
    settings = checks["Kafka client settings"]["found"]
    assert "sasl.password=[redacted]" in settings
    assert "sasl.username=alice" in settings
    for result in (doctor, *helps):
        assert SECRET not in result.stdout + result.stderr
