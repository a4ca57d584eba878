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


def _start_rank(conftest: ModuleType, relative: str) -> int:
    return int(conftest._first(SimpleNamespace(path=ROOT / relative)))


def test_every_test_file_the_schedule_names_exists(conftest: ModuleType) -> None:
    named = [*conftest.LONGEST_FIRST, *conftest.EACH_TEST_A_UNIT, *conftest.TIMED_FILES]
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
    # given: a file of TIMED_FILES (its timed tests run alone, beside pure tests only: tests/alone.py)
    timed = ("tests/integration/test_rebalance_storm.py",)
    ranks = {
        path: _start_rank(conftest, path)
        for path in ("tests/integration/test_cli.py", *timed, "tests/unit/test_layers.py")
    }
    # then: it starts after every other integration file and before the unit tests
    assert list(ranks.values()) == sorted(ranks.values())
    assert len(set(ranks.values())) == 3


def test_the_files_of_timed_tests_go_out_as_one_unit_and_every_other_file_as_its_own(
    conftest: ModuleType,
) -> None:
    # given: two tests of two timed files, two of an ordinary file, two of a file whose tests are units
    storm, races = (
        "tests/integration/test_rebalance_storm.py::a",
        "tests/integration/test_ownership_races.py::b",
    )
    cli = ("tests/integration/test_cli.py::c", "tests/integration/test_cli.py::d")
    cluster = ("tests/spark/test_cluster.py::e", "tests/spark/test_cluster.py::f")
    # then: the timed files share one worker; a file is one unit; the cluster's tests one each
    assert conftest.schedule_unit(storm) == conftest.schedule_unit(races)
    assert {conftest.schedule_unit(n) for n in cli} == {"tests/integration/test_cli.py"}
    assert {conftest.schedule_unit(n) for n in cluster} == set(cluster)
    assert conftest.schedule_unit(storm) not in {conftest.schedule_unit(n) for n in (*cli, *cluster)}


def test_a_timed_test_in_a_file_the_schedule_does_not_name_is_found(conftest: ModuleType) -> None:
    # given: a timed test in a file TIMED_FILES names and one in a file it does not
    def item(relative: str, timed: bool) -> SimpleNamespace:
        marker = object() if timed else None
        return SimpleNamespace(
            path=ROOT / relative, get_closest_marker=lambda name: marker if name == "timed" else None
        )

    items = [
        item("tests/integration/test_rebalance_storm.py", True),
        item("tests/integration/test_cli.py", False),
        item("tests/integration/test_new_failover.py", True),
    ]
    # then: the unnamed file is reported (collection then stops with a usage error)
    assert conftest.unlisted_timed_files(items) == ["tests/integration/test_new_failover.py"]
