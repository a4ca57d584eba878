"""The ``cutline`` command line (docs/design.md, "Command line").

``cutline replay`` folds a journal into the coordinator's state at any offset
or time, prints what happened, and checks the journal against the named
invariants; ``cutline journal-demo`` writes a realistic journal to try it on.
Every other command joins this app from its module (coordinator/cli/*.py).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from coordinator.cli import broker, demo, doctor, jobs, replay, savepoints, state, topics
from coordinator.cli.common import USAGE_ERROR, fail
from coordinator.cli.help import CutlineCommand, CutlineGroup
from coordinator.cli.service import _worker_command as _worker_command  # the watchdog's tests
from coordinator.cli.service import coordinator as coordinator
from coordinator.replay.selection import Cut, parse_until
from coordinator.replay.selection import Selection as _Selection  # noqa: F401 (tests use it)

__all__ = ["Cut", "app", "main", "parse_until"]

app = typer.Typer(
    name="cutline",
    help="Flink-style checkpoint coordination for Spark Structured Streaming and Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=CutlineGroup,
)

# One module per command group; `cutline --help` lists them in coordinator.cli.help.ORDER.
command = functools.partial(app.command, cls=CutlineCommand)
command()(demo.demo)
command()(doctor.doctor)
command()(broker.broker)
app.add_typer(topics.topics_app, name="topics")
command()(coordinator)
command(context_settings={"allow_interspersed_args": False})(jobs.run)
command("list")(jobs.jobs_list)
command()(jobs.status)
command()(jobs.trigger)
command()(jobs.stop)
command()(jobs.cancel)
app.add_typer(savepoints.savepoints_app, name="savepoints")
state.state_app.command(cls=CutlineCommand)(state.show)
state.state_app.command(cls=CutlineCommand)(state.diff)
app.add_typer(state.state_app, name="state")
command()(jobs.tail)
command()(replay.replay)
command("journal-demo", hidden=True)(replay.journal_demo)


@app.callback()
def cutline(
    kafka_config: Annotated[
        Path | None,
        typer.Option(
            "--kafka-config",
            exists=True,
            dir_okay=False,
            help="Kafka client properties (kcat/Java style name=value: security.protocol, sasl.*, ssl.*) "
            "for every Kafka client cutline starts; also $CUTLINE_KAFKA_CONFIG.",
        ),
    ] = None,
    kafka_properties: Annotated[
        list[str] | None,
        typer.Option(
            "-X",
            "--kafka-property",
            metavar="NAME=VALUE",
            help="One Kafka client property (repeatable), over the file and $CUTLINE_KAFKA_<NAME> variables.",
        ),
    ] = None,
    schema_registry: Annotated[
        str | None,
        typer.Option(
            "--schema-registry",
            envvar="CUTLINE_SCHEMA_REGISTRY_URL",
            help="Confluent Schema Registry URL: read Confluent-framed records too (the registry extra).",
        ),
    ] = None,
    wire_format: Annotated[
        str,
        typer.Option(
            "--wire-format",
            envvar="CUTLINE_WIRE_FORMAT",
            help="How records are written: single-object (Avro's, the default) or confluent "
            "(magic 0 + schema id, subjects <topic>-cutline.<Record>; needs --schema-registry).",
        ),
    ] = "single-object",
) -> None:
    """Flink-style checkpoint coordination for Spark Structured Streaming and Kafka."""
    from events.kafka.client_config import (
        CONFIG_FILE_VARIABLE,
        ClientConfigError,
        command_line_warnings,
        override,
    )
    from events.wire.codec import use_wire
    from events.wire.schema_registry import wire_environment
    from events.wire.wire_settings import WireFormatError, WireSettings

    errors = Console(stderr=True, highlight=False)
    if kafka_config is not None:
        os.environ[CONFIG_FILE_VARIABLE] = str(kafka_config.resolve())
    try:
        override(kafka_properties or [])
    except ClientConfigError as exc:
        fail(errors, str(exc))
    for warning in command_line_warnings(kafka_properties or []):
        errors.print(Text(f"warning: {warning}", "yellow"))
    try:
        wire = WireSettings(schema_registry or None, wire_format)
    except WireFormatError as exc:
        fail(errors, str(exc))
    use_wire(wire)
    # The processes cutline starts (a job under `cutline run`, the demo's Spark job) take the same
    # settings from their entry points (events.wire.schema_registry.wire_from_environment).
    os.environ.update(wire_environment(wire))


def main() -> None:
    """The ``cutline`` console script. A missing extra, and a principal the broker refused
    (the ACL it lacks and its command, wherever a command met it), end it with what to do."""
    from events.extras import MissingExtra
    from events.kafka.refusals import AccessRefused

    try:
        app()
    except (MissingExtra, AccessRefused) as exc:
        Console(stderr=True, highlight=False).print(Text(str(exc), "red"), soft_wrap=True)
        raise SystemExit(USAGE_ERROR) from None
