"""The suite's schedule (tests/conftest.py): the test files it names exist, and they start first.

A file renamed or deleted would otherwise silently lose its place (it would start with its directory,
and a long one started last ends alone while the other xdist worker idles)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def conftest(request: pytest.FixtureRequest) -> ModuleType:
    """tests/conftest.py as pytest loaded it (``import conftest`` may find another directory's)."""
    path = ROOT / "tests" / "conftest.py"
    plugins: list[Any] = list(request.config.pluginmanager.get_plugins())
    return next(p for p in plugins if Path(getattr(p, "__file__", "") or "/").resolve() == path)


def _start_rank(conftest: ModuleType, relative: str, timed: tuple[str, ...] = ()) -> int:
    timed_files = {ROOT / path for path in timed}
    return int(conftest._first(SimpleNamespace(path=ROOT / relative), timed_files))


def test_every_test_file_the_schedule_names_exists(conftest: ModuleType) -> None:
    named = [*conftest.LONGEST_FIRST, *conftest.EACH_TEST_A_UNIT]
    missing = [path for path in named if not (ROOT / path).is_file()]
    assert [] == missing, f"tests/conftest.py names test files that do not exist (fix them there): {missing}"


def test_the_longest_files_start_in_their_order_and_before_every_directory(conftest: ModuleType) -> None:
    # given the longest files and a file of each directory that starts first, and a unit test's
    longest = [_start_rank(conftest, path) for path in conftest.LONGEST_FIRST]
    spark, integration, unit = "spark/test_python_daemon.py", "integration/test_cli.py", "unit/test_layers.py"
    others = [_start_rank(conftest, f"tests/{path}") for path in (spark, integration, unit)]
    # then the longest start in the order listed, every other file after them, a unit test last
    assert longest == sorted(longest)
    assert max(longest) < min(others)
    assert others == sorted(others)


def test_the_files_of_timed_tests_start_after_the_other_broker_tests_and_before_the_pure_ones(
    conftest: ModuleType,
) -> None:
    # given: a file with a timed test (it runs alone, beside pure tests only: tests/alone.py)
    timed = ("tests/integration/test_rebalance_storm.py",)
    ranks = {
        path: _start_rank(conftest, path, timed)
        for path in ("tests/integration/test_cli.py", *timed, "tests/unit/test_layers.py")
    }
    # then: it starts after every other integration file and before the unit tests
    assert list(ranks.values()) == sorted(ranks.values())
    assert len(set(ranks.values())) == 3
