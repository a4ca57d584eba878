"""What the commands share: the options every Kafka command takes, and failing with a message."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn, TypeAlias

import typer
from rich.console import Console
from rich.text import Text

USAGE_ERROR = 2
VIOLATION = 1

Bootstrap: TypeAlias = Annotated[
    str | None,
    typer.Option(
        "--bootstrap",
        "-b",
        envvar="CUTLINE_BOOTSTRAP",
        help="Kafka bootstrap servers HOST:PORT (default: $CUTLINE_BOOTSTRAP).",
    ),
]
TopicPrefix: TypeAlias = Annotated[
    str, typer.Option("--topic-prefix", "-p", help="Prefix of every cutline topic.")
]


def fail(console: Console, message: str) -> NoReturn:
    console.print(Text(message, "red"), soft_wrap=True)
    raise typer.Exit(USAGE_ERROR)


def need_bootstrap(console: Console, bootstrap: str | None) -> str:
    if not bootstrap:
        fail(
            console,
            "no Kafka cluster given: pass --bootstrap HOST:PORT or set CUTLINE_BOOTSTRAP "
            "(`cutline broker` starts an embedded one)",
        )
    check_broker(console, bootstrap)
    return bootstrap


BROKER_WAIT_S = 5.0
"""How long a command waits for the cluster to answer before it says that no broker does."""


def check_broker(console: Console, bootstrap: str) -> None:
    from events.dev.broker import wait_for_broker

    try:
        wait_for_broker(bootstrap, timeout=BROKER_WAIT_S)
    except TimeoutError as exc:
        fail(console, f"no Kafka broker answers at {bootstrap} ({exc}); start one with `cutline broker`")


def as_uri(path_or_uri: str) -> str:
    """A URI as it is; a local path as its absolute ``file:`` URI."""
    return path_or_uri if "://" in path_or_uri else Path(path_or_uri).absolute().as_uri()
