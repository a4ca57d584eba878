"""The layers (docs/design.md, "Layout") and issue 11: a pure core that imports no I/O framework."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PURE = [
    "coordinator.commands",
    "coordinator.state",
    "coordinator.decider",
    "coordinator.invariants",
    "coordinator.stats",
    "coordinator.journal",
    "coordinator.snapshot",
    "coordinator.savepoints",
    "coordinator.stop_outcome",
    "coordinator.replay_selection",
    "coordinator.group_view",
    "coordinator.web_trust",
    "coordinator.job_view",
    "coordinator.health",
    "coordinator.units",
    "coordinator.log_throttle",
    "events.wire.fencing",
    "events.wire.records",
    "events.wire.codec",
    "events.task.ledger",
    "events.task.reply",
    "events.task.latency",
]
FORBIDDEN = ("faust", "aiokafka", "confluent_kafka", "rich", "typer", "matplotlib", "pyspark", "mode")


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_imports_no_io_framework(module: str) -> None:
    """Importing the module (in a fresh interpreter) loads none of Faust, Kafka clients, rich, typer,
    matplotlib or PySpark, not even through another module."""
    probe = (
        f"import json, sys, {module}; "
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r}))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)

    assert [] == json.loads(loaded.stdout)


def test_the_service_is_not_pure() -> None:
    """The probe can fail: the Faust app does load Faust."""
    probe = "import json, sys, coordinator.service.app; print(json.dumps('faust' in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)

    assert json.loads(loaded.stdout) is True


def test_no_coordinator_module_imports_spark_tasks() -> None:
    """The coordinator and its CLI run without the spark extra: no module of coordinator/ imports
    spark_tasks, at module level or inside a function (the demo is composed in spark_tasks/demo.py)."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "coordinator"
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] == "spark_tasks"]

    assert [] == found


def test_test_modules_have_unique_basenames() -> None:
    """pytest's default (prepend) import mode imports a test file by its basename: two files
    named alike in different test folders stop the whole collection (as in CI once)."""
    from collections import Counter
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    names = Counter(p.name for p in tests.rglob("test_*.py") if ".venv" not in p.parts)

    assert [] == sorted(name for name, count in names.items() if count > 1)
