"""``cutline doctor``: what cutline needs here, and what to fix."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from coordinator.cli.common import (
    VIOLATION,
    Bootstrap,
    TopicPrefix,
    fail,
)
from events.wire.topics import DEFAULT_PREFIX


def doctor(
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="A coordinator worker's web views (default: a worker of the prefix's coordinator group, "
            "else the local worker's, http://127.0.0.1:6066).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per check and line.")] = False,
    role: Annotated[
        str,
        typer.Option(
            "--role",
            metavar="ROLE",
            help="Whose Kafka ACLs to check the client settings' principal for: coordinator, driver, "
            "task or operator (docs/security.md).",
        ),
    ] = "coordinator",
) -> None:
    """Check what cutline needs here: Python, Java, the broker, the topics, the journal's
    retention and the coordinator; say what to fix. Exits 1 if a check failed."""
    import dataclasses
    import json

    from rich.table import Table

    from coordinator.service.doctor import CheckStatus, diagnose
    from events.kafka.acls import Role

    if role not in {r.value for r in Role}:
        fail(Console(stderr=True), f"--role {role}: give one of {', '.join(r.value for r in Role)}")

    with Console(stderr=True).status("checking..."):
        checks = diagnose(bootstrap, topic_prefix, url, role)
    if as_json:
        for check in checks:
            print(json.dumps(dataclasses.asdict(check)))
        raise typer.Exit(VIOLATION if any(check.verdict is CheckStatus.FAIL for check in checks) else 0)
    colour = {
        CheckStatus.OK: "green",
        CheckStatus.WARN: "yellow",
        CheckStatus.FAIL: "red",
        CheckStatus.SKIPPED: "dim",
    }
    table = Table(title="cutline doctor", show_lines=True)
    for column in ("check", "", "found", "what to do"):
        table.add_column(column, overflow="fold")
    for check in checks:
        # Text, not markup: a found value such as "[redacted]" is printed as it is.
        verdict = Text(check.verdict, colour[check.verdict])
        table.add_row(check.name, verdict, Text(check.found), Text(check.fix))
    Console(highlight=False).print(table)
    if any(check.verdict is CheckStatus.FAIL for check in checks):
        raise typer.Exit(VIOLATION)
