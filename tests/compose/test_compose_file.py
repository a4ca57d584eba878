"""The compose stack's file, checked without a Docker engine: every cutline service runs a command
the CLI has, with options it takes; ports, scrape targets and mounted files agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_tasks.wordcount import build_parser

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"
STACK: dict[str, Any] = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = STACK["services"]
CUTLINE_SERVICES = sorted(
    name for name, service in SERVICES.items() if service.get("image") == "cutline:compose"
)


def cli_help(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``cutline ARGS --help``: exit 0 only if the command exists and takes every option given."""
    return subprocess.run(
        [sys.executable, "-m", "coordinator.cli", *args, "--help"], capture_output=True, text=True, timeout=60
    )


def test_the_stack_has_the_production_parts() -> None:
    assert {"kafka", "topics", "words", "coordinator-1", "coordinator-2", "wordcount", "prometheus"} <= set(
        SERVICES
    )
    assert {"topics", "coordinator-1", "coordinator-2", "wordcount"} <= set(CUTLINE_SERVICES)


@pytest.mark.parametrize("name", CUTLINE_SERVICES)
def test_each_cutline_service_runs_a_command_of_the_cli(name: str) -> None:
    command: list[str] = SERVICES[name]["command"]
    split = command.index("--") if "--" in command else len(command)
    outer, inner = command[:split], command[split + 1 :]

    result = cli_help(outer)

    assert 0 == result.returncode, f"{name}: cutline {' '.join(outer)}: {result.stderr}"
    if inner:  # cutline run -- CMD: the job's own command line must parse too
        assert inner[:3] == ["python", "-m", "spark_tasks.wordcount"], inner
        build_parser().parse_args(inner[3:])


def test_every_dependency_names_a_service_and_every_mounted_file_exists() -> None:
    for name, service in SERVICES.items():
        assert set(service.get("depends_on", {})) <= set(SERVICES), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).exists(), f"{name} mounts {source}, which is missing"


def test_prometheus_scrapes_each_worker_at_its_web_port_and_loads_the_example_alerts() -> None:
    prometheus = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    targets = {t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    ports = {}
    for name in ("coordinator-1", "coordinator-2"):
        command = SERVICES[name]["command"]
        ports[name] = command[command.index("--web-port") + 1]
        assert f"127.0.0.1:{ports[name]}:{ports[name]}" in SERVICES[name]["ports"]
        assert f"127.0.0.1:{ports[name]}/ready" in " ".join(SERVICES[name]["healthcheck"]["test"])
    assert {f"{name}:{port}" for name, port in ports.items()} == targets
    mounts = dict(volume.split(":")[:2] for volume in SERVICES["prometheus"]["volumes"])
    assert mounts["../docs/prometheus-alerts.yml"] in prometheus["rule_files"]
