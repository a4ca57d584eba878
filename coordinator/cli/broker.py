"""``cutline broker``: the embedded Kafka-protocol broker."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from coordinator.cli.common import (
    fail,
)


def broker(
    port: Annotated[
        int | None, typer.Option("--port", help="Port on 127.0.0.1 (default: a free one).")
    ] = None,
) -> None:
    """Run the embedded Kafka-protocol broker (Tansu, memory only) until Ctrl-C or SIGTERM."""
    from events.dev.broker import BrokerError, EmbeddedBroker
    from events.stopping import StopSignals

    console = Console(highlight=False)
    # Installed before the broker starts: a SIGTERM while it starts stops it once it has
    try:
        with StopSignals() as stop, EmbeddedBroker(port) as running:
            console.print(f"bootstrap: {running.bootstrap}", soft_wrap=True)
            console.print(
                Text(
                    f"export CUTLINE_BOOTSTRAP={running.bootstrap}   (Ctrl-C stops; data is in memory only)",
                    "dim",
                ),
                soft_wrap=True,
            )
            stop.wait()
    except BrokerError as exc:
        fail(Console(stderr=True), f"the broker did not start: {exc}")
