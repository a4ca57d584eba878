"""How ``cutline --help`` and every command's ``--help`` read.

Typer shows each option's Python type as its metavar (``--drain <bool>``, ``--bootstrap <str>``) and
a required argument as ``{job}`` on the usage line. Here a flag shows no metavar (it takes no
value), any other option its own metavar or, without one, the name of what it takes (``TEXT``,
``INTEGER``, ``NUMBER``, ``PATH``), and an argument its metavar as the docs write it (``JOB``,
``[JOB]`` when optional). ``cutline --help`` lists the commands in the order a newcomer uses them,
``demo`` first.

Every command of the app is a :class:`CutlineCommand` and every group a :class:`CutlineGroup`
(``cls=`` where they are registered); tests/unit/test_cli_help.py reads every command's help.
"""

from __future__ import annotations

from collections.abc import Sequence

from typer import _click as click  # typer's own copy of Click, whose classes it extends
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

ORDER = (
    "demo",
    "doctor",
    "broker",
    "topics",
    "coordinator",
    "run",
    "list",
    "status",
    "trigger",
    "stop",
    "cancel",
    "savepoints",
    "state",
    "tail",
    "replay",
)
"""The commands as ``cutline --help`` lists them: trying it, setting it up, running jobs, operating
them, looking inside. A command not named here comes after these."""

TYPE_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "path": "PATH", "file": "FILE"}
"""What an option without a metavar shows, by the type typer would show (``<float>``: NUMBER)."""


def ordered(names: Sequence[str], order: Sequence[str] = ORDER) -> list[str]:
    """``names`` in ``order``, those it does not name after them in their own order."""
    rank = {name: i for i, name in enumerate(order)}
    return sorted(names, key=lambda name: rank.get(name, len(order)))


def option_metavar(type_label: str, *, flag: bool) -> str:
    """The metavar of an option without one: nothing for a flag, else the name of what it takes
    (``type_label`` is typer's, such as ``<float>`` or ``<list[str]>``)."""
    if flag:
        return ""
    label = type_label.strip("<>")
    if label.startswith("list[") and label.endswith("]"):
        label = label[len("list[") : -1]
    return TYPE_NAMES.get(label, label.upper())


def argument_usage(name: str, *, required: bool, many: bool) -> str:
    """An argument on the usage line: ``JOB``, ``[JOB]`` when optional, ``COMMAND...`` for many."""
    shown = name + ("..." if many else "")
    return shown if required else f"[{shown}]"


def _tidy(params: Sequence[click.Parameter], ctx: click.Context) -> None:
    """Give every option without a metavar the one :func:`option_metavar` says (and every argument
    without one its name in capitals)."""
    for param in params:
        if param.metavar is not None:
            continue
        if isinstance(param, TyperOption):
            param.metavar = option_metavar(param.display_type(ctx), flag=param.is_flag)
        elif isinstance(param, TyperArgument) and param.name:
            param.metavar = param.name.upper()


class CutlineCommand(TyperCommand):
    """A command whose help shows metavars as the docs write them (see the module)."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _tidy(self.get_params(ctx), ctx)
        super().format_help(ctx, formatter)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = param.metavar or (param.name or "").upper()
                pieces.append(argument_usage(name, required=param.required, many=param.nargs != 1))
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


class CutlineGroup(TyperGroup):
    """A group whose help lists its commands in :data:`ORDER` and shows metavars as the docs write them."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _tidy(self.get_params(ctx), ctx)
        super().format_help(ctx, formatter)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return ordered(super().list_commands(ctx))
