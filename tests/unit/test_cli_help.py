"""``cutline --help`` and every command's help read as the docs write them (coordinator/cli/help.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import typer
from typer.testing import CliRunner

from coordinator.cli import app
from coordinator.cli.help import argument_usage, option_metavar, ordered


def command_paths() -> Iterator[tuple[str, ...]]:
    """Every command and group of the app, as the words that name it."""

    def walk(command: object, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        yield path
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            if not getattr(sub, "hidden", False):
                yield from walk(sub, (*path, name))

    yield from walk(typer.main.get_command(app), ())


def help_of(*path: str) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert 0 == result.exit_code, result.output
    return result.output


@pytest.mark.parametrize("path", list(command_paths()), ids=lambda path: " ".join(path) or "cutline")
def test_options_show_what_they_take_not_a_python_type(path: tuple[str, ...]) -> None:
    """No option shows typer's `<bool>`, `<str>`, `<int>` or `<float>` (a flag shows nothing), and the
    usage line names arguments as the docs do (`JOB`, not `{job}`)."""
    text = help_of(*path)

    options = [line for line in text.splitlines() if re.search(r"│\s+(\*\s+)?--", line)]
    assert options, text
    assert [] == [line for line in options if re.search(r"<(bool|str|int|float)>", line)]
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert "{" not in usage


def test_demo_is_listed_first() -> None:
    """`cutline --help` lists `demo` first, then the commands that set cutline up."""
    text = help_of()

    commands = re.findall(r"^│ (\w[\w-]*)\s{2,}", text.split("Commands", 1)[1], re.MULTILINE)
    assert ["demo", "doctor", "broker", "topics", "coordinator"] == commands[:5]
    assert {"list", "status", "trigger", "stop", "cancel"} <= set(commands)


def test_usage_names_the_job_argument_in_capitals() -> None:
    assert re.search(r"Usage: \S+ trigger \[OPTIONS\] JOB\s*$", help_of("trigger"), re.MULTILINE)


def test_the_cancel_timeout_is_about_the_job_not_a_savepoint() -> None:
    timeout = next(line for line in help_of("cancel").splitlines() if "--timeout" in line)

    assert "savepoint" not in timeout.lower()
    assert "CANCELED" in timeout


def test_an_unlimited_default_says_so() -> None:
    """`cutline run`'s restarts in a row before giving up: unlimited, as the docs say, not a bare number."""
    line = next(line for line in help_of("run").splitlines() if "--attempts-before-reset-backoff" in line)
    following = help_of("run").split(line, 1)[1].split("│ --", 1)[0]

    assert "[default: (unlimited)]" in line + following


class TestRules:
    def test_a_flag_shows_no_metavar(self) -> None:
        assert "" == option_metavar("<bool>", flag=True)

    def test_other_options_name_what_they_take(self) -> None:
        assert ["TEXT", "INTEGER", "NUMBER", "TEXT"] == [
            option_metavar(label, flag=False) for label in ("<str>", "<int>", "<float>", "<list[str]>")
        ]

    def test_arguments_on_the_usage_line(self) -> None:
        assert ["JOB", "[DIR]", "COMMAND..."] == [
            argument_usage("JOB", required=True, many=False),
            argument_usage("DIR", required=False, many=False),
            argument_usage("COMMAND", required=True, many=True),
        ]

    def test_commands_in_order_and_the_unnamed_after(self) -> None:
        assert ["demo", "status", "zeta", "alpha"] == ordered(["zeta", "status", "alpha", "demo"])
