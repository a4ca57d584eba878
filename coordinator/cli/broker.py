"""``cutline broker``: the embedded Kafka-protocol broker, or Apache Kafka itself with ``--kafka``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text

from coordinator.cli.common import (
    fail,
)

if TYPE_CHECKING:
    from events.dev.apache_kafka import ApacheKafka
    from events.dev.broker import EmbeddedBroker


def broker(
    port: Annotated[
        int | None, typer.Option("--port", help="Port on 127.0.0.1 (default: a free one).")
    ] = None,
    kafka: Annotated[
        bool,
        typer.Option(
            "--kafka",
            help="Apache Kafka itself (KRaft) instead of the embedded broker: needs Java 17+, and Maven "
            "the first time (its jars are cached in ~/.cache/cutline, or $CUTLINE_KAFKA_CACHE).",
        ),
    ] = False,
    brokers: Annotated[
        int,
        typer.Option(
            "--brokers", min=1, max=9, help="With --kafka: brokers (and controllers) in the cluster."
        ),
    ] = 1,
    heap: Annotated[str, typer.Option("--heap", help="With --kafka: each broker JVM's -Xmx.")] = "512m",
) -> None:
    """Run a Kafka broker on 127.0.0.1 until Ctrl-C or SIGTERM: the embedded one (Tansu, memory only),
    or Apache Kafka with --kafka (data in a temp dir, deleted when it stops)."""
    from events.dev.broker import BrokerError, EmbeddedBroker
    from events.stopping import StopSignals

    console = Console(highlight=False)
    if not kafka and (brokers != 1 or heap != "512m"):
        fail(Console(stderr=True), "--brokers and --heap are options of --kafka")
    running: EmbeddedBroker | ApacheKafka
    if kafka:
        from events.dev.apache_kafka import KAFKA_VERSION, ApacheKafka

        running, what = ApacheKafka(port, brokers=brokers, heap=heap), "Apache Kafka"
        plural = "s" if brokers > 1 else ""
        note = f"Apache Kafka {KAFKA_VERSION}, {brokers} broker{plural}; data deleted on stop"
    else:
        running, what, note = EmbeddedBroker(port), "the broker", "data is in memory only"
    # Installed before the broker starts: a SIGTERM while it starts stops it once it has
    try:
        with StopSignals() as stop:
            if kafka:
                console.print(
                    Text(f"starting {what} (a few seconds; the first time Maven fetches it)", "dim")
                )
            with running:
                console.print(f"bootstrap: {running.bootstrap}", soft_wrap=True)
                console.print(
                    Text(f"export CUTLINE_BOOTSTRAP={running.bootstrap}   (Ctrl-C stops; {note})", "dim"),
                    soft_wrap=True,
                )
                while not stop.wait(1.0):
                    gone = _exited(running)
                    if gone is not None:
                        message = f"{what} at {running.bootstrap} {gone}; its data is lost"
                        Console(stderr=True, highlight=False).print(Text(message, "red"), soft_wrap=True)
                        raise typer.Exit(1)
    except BrokerError as exc:
        fail(Console(stderr=True), f"{what} did not start: {exc}")


def _exited(running: EmbeddedBroker | ApacheKafka) -> str | None:
    """How the broker's process (or one of the cluster's) ended on its own; None while all run."""
    from events.dev.broker import EmbeddedBroker

    if isinstance(running, EmbeddedBroker):
        code = running.returncode
        if code is None:
            return None
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"exited by itself ({how}; its log: {running.log_path})"
    down = len(running.nodes) - len(running.pids)
    return f"lost {down} of its {len(running.nodes)} broker processes" if down else None
