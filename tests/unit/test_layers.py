"""The layers (docs/design.md, "Layout") and issues 11 and 52: a pure core that imports no I/O
framework, no import loops among the product packages, and ``events`` below the rest."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PURE = [
    "coordinator.core.commands",
    "coordinator.core.state",
    "coordinator.core.decider",
    "coordinator.core.invariants",
    "coordinator.core.stats",
    "coordinator.replay.journal",
    "coordinator.core.snapshot",
    "coordinator.core.savepoints",
    "coordinator.replay.stop_outcome",
    "coordinator.replay.selection",
    "coordinator.service.group_view",
    "coordinator.service.web_trust",
    "coordinator.service.job_view",
    "coordinator.service.health",
    "coordinator.service.units",
    "coordinator.service.log_throttle",
    "events.wire.fencing",
    "events.wire.records",
    "events.wire.codec",
    "events.wire.barrier_entry",
    "events.task.ledger",
    "events.task.reply",
    "events.task.latency",
    "spark_tasks.retention",
]
CORE = sorted(
    f"coordinator.core.{path.stem}"
    for path in (Path(__file__).resolve().parents[2] / "coordinator" / "core").glob("*.py")
    if path.stem != "__init__"
)
PURE = sorted(set(PURE) | set(CORE))
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


def test_test_modules_have_unique_basenames() -> None:
    """pytest's default (prepend) import mode imports a test file by its basename: two files
    named alike in different test folders stop the whole collection (as in CI once)."""
    from collections import Counter
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    names = Counter(p.name for p in tests.rglob("test_*.py") if ".venv" not in p.parts)

    assert [] == sorted(name for name, count in names.items() if count > 1)


ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("coordinator", "events", "spark_tasks")
"""The library packages."""
DEMO = "cutline_demo"
"""The demo's composition root: it wires the libraries, and none of them imports it."""

KNOWN_LOOPS: dict[frozenset[str], str] = {}
"""Import loops that exist today, each with why; a new loop fails, and so does one that is gone."""

KNOWN_WIRE_REACHES: dict[tuple[str, str], str] = {}
"""Imports of ``events.wire`` into the Kafka edge, the task side or the dev helpers that exist today."""


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Every module of ``packages`` under ``root`` and the modules of ``packages`` it imports, anywhere
    in its file: at module level, under ``TYPE_CHECKING`` or inside a function, where a loop hides."""
    paths = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {name: _imported(name, path, paths) for name, path in paths.items()}


def _imported(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from the module's package up
                package = name.split(".")[: None if path.name == "__init__.py" else -1]
                module = ".".join(package[: len(package) - node.level + 1] + ([module] if module else []))
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_loops(graph: Mapping[str, set[str]]) -> set[frozenset[str]]:
    """The groups of modules that import each other, directly or round about (Tarjan's strongly
    connected components of more than one module)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: set[frozenset[str]] = set()

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in graph.get(module, ()):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            group = {stack.pop()}
            while module not in group:
                group.add(stack.pop())
            if len(group) > 1:
                loops.add(frozenset(group))

    for module in graph:
        if module not in order:
            visit(module)
    return loops


@pytest.fixture(name="graph", scope="module")
def fixture_graph() -> dict[str, set[str]]:
    return import_graph(ROOT, (*PRODUCT, DEMO))


def test_the_import_graph_finds_a_loop_hidden_in_a_function(tmp_path: Path) -> None:
    """Given a module that imports another only under TYPE_CHECKING and one that imports it back inside a
    function, then the graph sees both imports and the loop (the way spark_tasks.tasks and
    spark_tasks.latency were tied before spark_tasks.replies)."""
    package = tmp_path / "product"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from product.b import B\n"
    )
    (package / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (package / "c.py").write_text("import product.a\n")

    graph = import_graph(tmp_path, ["product"])

    assert {"product.a": {"product.b"}, "product.b": {"product.a"}, "product.c": {"product.a"}} == {
        k: v for k, v in graph.items() if k != "product"
    }
    assert {frozenset({"product.a", "product.b"})} == import_loops(graph)


def test_no_import_loops_among_the_product_packages(graph: dict[str, set[str]]) -> None:
    """coordinator, events and spark_tasks have no import loop but the known ones."""
    loops = import_loops(graph)

    assert [] == sorted(sorted(loop) for loop in loops - KNOWN_LOOPS.keys())
    assert [] == sorted(sorted(loop) for loop in KNOWN_LOOPS.keys() - loops), "gone: drop it from KNOWN_LOOPS"


def test_no_coordinator_module_imports_spark_tasks(graph: dict[str, set[str]]) -> None:
    """The coordinator and its CLI run without the spark extra: no module of coordinator/ imports
    spark_tasks, at module level or inside a function (the demo is composed in cutline_demo/, which
    ``cutline demo`` runs as a process of its own)."""
    found = [
        f"{module} -> {imported}"
        for module, imports in graph.items()
        if module.split(".")[0] == "coordinator"
        for imported in imports
        if imported.split(".")[0] == "spark_tasks"
    ]

    assert [] == sorted(found)


def test_no_library_imports_the_demo(graph: dict[str, set[str]]) -> None:
    """coordinator, events and spark_tasks are libraries: the demo wires them (cutline_demo/), and
    none of their modules imports it, at module level or inside a function."""
    assert any(module.startswith(f"{DEMO}.") for module in graph)  # the demo is in the graph
    found = [
        f"{module} -> {imported}"
        for module, imports in graph.items()
        if module.split(".")[0] in PRODUCT
        for imported in imports
        if imported.split(".")[0] == DEMO
    ]

    assert [] == sorted(found)


def test_the_core_imports_only_itself_and_the_wire(graph: dict[str, set[str]]) -> None:
    """``coordinator.core`` is the pure core: it imports nothing of the coordinator's service, replay,
    simulation or command line, and of ``events`` only the wire contract."""
    assert len(CORE) > 10
    reaches = [
        f"{module} -> {imported}"
        for module, imports in graph.items()
        if module.startswith("coordinator.core.")
        for imported in imports
        if imported.split(".")[0] in ("coordinator", "events", "spark_tasks")
        and not imported.startswith(("coordinator.core", "events.wire"))
    ]

    assert [] == sorted(reaches)


def test_events_imports_nothing_above_it(graph: dict[str, set[str]]) -> None:
    """``events`` is shared by every process: no module of it imports coordinator or spark_tasks."""
    upward = [
        f"{module} -> {imported}"
        for module, imports in graph.items()
        if module.split(".")[0] == "events"
        for imported in imports
        if imported.split(".")[0] in ("coordinator", "spark_tasks")
    ]

    assert [] == sorted(upward)


def test_the_wire_imports_nothing_of_the_kafka_edge_the_task_side_or_the_dev_helpers(
    graph: dict[str, set[str]],
) -> None:
    """``events.wire`` is the contract: it imports nothing of ``events.kafka``, ``events.task`` or
    ``events.dev`` but the known reaches."""
    reaches = {
        (module, imported)
        for module, imports in graph.items()
        if module.startswith("events.wire")
        for imported in imports
        if imported.split(".")[:2] in (["events", "kafka"], ["events", "task"], ["events", "dev"])
    }

    assert [] == sorted(reaches - KNOWN_WIRE_REACHES.keys())
    assert [] == sorted(KNOWN_WIRE_REACHES.keys() - reaches), "gone: drop it from KNOWN_WIRE_REACHES"
