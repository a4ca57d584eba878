"""cutline doctor shows no secret of any client library, prints "[redacted]" as it is, warns about
a properties file others may read, and -X with a secret warns that the command line is public."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from coordinator.cli import app
from coordinator.service.doctor import CheckStatus, check_client_settings, diagnose
from events.kafka.client_config import REDACTED

LISTS = Path(__file__).parent.parent / "client_properties"


def secret_names() -> list[str]:
    """Every secret name of librdkafka, aiokafka and Faust (tests/client_properties/)."""
    names: set[str] = set()
    for file in LISTS.glob("*.tsv"):
        rows = (line.split("\t") for line in file.read_text().splitlines() if not line.startswith("#"))
        names |= {name for name, verdict in rows if verdict == "secret"}
    return sorted(names)


@pytest.fixture(name="isolated_environment")
def fixture_isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI writes os.environ (-X, --kafka-config, the wire format): undone after each test."""
    for name in [n for n in os.environ if n.startswith("CUTLINE_")]:
        monkeypatch.delenv(name)
    for name in ("CUTLINE_KAFKA_CONFIG", "CUTLINE_WIRE_FORMAT", "CUTLINE_KAFKA_SASL_PASSWORD"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "4000")  # one table row a line: a value is never folded


def doctor(*options: str, json_lines: bool = False) -> Result:
    """``cutline OPTIONS doctor``, with no broker and no coordinator to find."""
    return CliRunner().invoke(
        app, [*options, "doctor", "--url", "http://127.0.0.1:9", *(["--json"] if json_lines else [])]
    )


@pytest.mark.usefixtures("isolated_environment")
def test_every_secret_property_of_the_three_libraries_is_shown_as_redacted(tmp_path: Path) -> None:
    """Given a properties file setting every secret name each library accepts, to a distinct value,
    neither the doctor's table nor its JSON holds a value, and the table shows [redacted] as it is
    (the check fails: aiokafka's and Faust's names are no librdkafka properties)."""
    names = secret_names()
    values = {name: f"v{i}-hunter2" for i, name in enumerate(names)}
    config = tmp_path / "client.properties"
    config.write_text("".join(f"{name}={value}\n" for name, value in values.items()))
    config.chmod(0o600)

    table = doctor("--kafka-config", str(config))
    lines = doctor("--kafka-config", str(config), json_lines=True).stdout.splitlines()

    assert len(names) > 15
    settings = next(c for c in map(json.loads, lines) if c["name"] == "Kafka client settings")
    assert CheckStatus.FAIL == settings["verdict"] and "librdkafka refuses them" in settings["found"]
    for output in (table.output, "\n".join(lines)):
        assert [] == [name for name, value in values.items() if value in output]
        assert "hunter2" not in output
    shown = next(line for line in table.output.splitlines() if "Kafka client settings" in line)
    assert f"sasl.password={REDACTED}" in shown
    assert len(names) <= shown.count(REDACTED)


@pytest.mark.usefixtures("isolated_environment")
def test_a_properties_file_with_a_secret_others_may_read_is_a_warning(tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("sasl.username=alice\nsasl.password=hunter2\n")

    config.chmod(0o644)
    readable = check_client_settings({"CUTLINE_KAFKA_CONFIG": str(config)})
    config.chmod(0o600)
    private = check_client_settings({"CUTLINE_KAFKA_CONFIG": str(config)})

    assert (CheckStatus.WARN, CheckStatus.OK) == (readable.verdict, private.verdict)
    assert "sasl.password" in readable.found and "0644" in readable.found
    assert f"chmod 600 {config}" in readable.fix
    assert "hunter2" not in readable.found + private.found


@pytest.mark.usefixtures("isolated_environment")
def test_a_property_librdkafka_does_not_know_fails_the_settings_and_the_checks_that_need_a_client_skip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given a property librdkafka does not know and a broker to check, the doctor does not die: the
    client settings fail, naming the property, the broker, topics and retention are skipped (no client
    can be made), the coordinator is still asked, and no secret is shown."""
    monkeypatch.setenv("CUTLINE_KAFKA_SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("CUTLINE_KAFKA_NO_SUCH_THING", "1")

    checks = {check.name: check for check in diagnose("127.0.0.1:9", "cutline.", "http://127.0.0.1:9")}
    result = CliRunner().invoke(app, ["doctor", "--bootstrap", "127.0.0.1:9", "--url", "http://127.0.0.1:9"])

    settings = checks["Kafka client settings"]
    assert CheckStatus.FAIL == settings.verdict
    assert 'No such configuration property: "no.such.thing"' in settings.found
    assert "CUTLINE_KAFKA_" in settings.fix
    assert {"broker": "skipped", "topics": "skipped", "journal retention": "skipped"} == {
        name: checks[name].verdict for name in ("broker", "topics", "journal retention")
    }
    assert CheckStatus.WARN == checks["coordinator"].verdict
    assert 1 == result.exit_code and isinstance(result.exception, SystemExit)  # typer.Exit(1), no crash
    assert "no.such.thing" in result.output and "hunter2" not in result.output


@pytest.mark.usefixtures("isolated_environment")
def test_x_with_a_secret_warns_that_the_command_line_is_public_and_says_what_to_use() -> None:
    result = doctor("-X", "sasl.password=hunter2", "-X", "sasl.username=alice")

    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert 1 == len(warnings)
    assert "-X sasl.password=..." in warnings[0]
    assert "/proc/<pid>/cmdline" in result.output
    assert "CUTLINE_KAFKA_SASL_PASSWORD" in result.output and "chmod 600" in result.output
    assert "hunter2" not in result.output
