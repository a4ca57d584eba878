"""``cutline demo``: checks its options and becomes ``python -m cutline_demo`` (the demo, composed
outside the library packages in cutline_demo/)."""

from __future__ import annotations

import os
import sys
from enum import StrEnum
from typing import Annotated

import typer


class DemoBroker(StrEnum):
    """The broker the demo starts when no ``--bootstrap`` is given."""

    tansu = "tansu"
    """The embedded broker (pip only)."""
    kafka = "kafka"
    """Apache Kafka itself (Java 17+, and Maven the first time: events/dev/apache_kafka.py)."""


class DemoSource(StrEnum):
    """What the demo's Spark job reads Kafka with."""

    kafka = "kafka"
    """Spark's own connector (spark-sql-kafka-0-10; its jars fetched with Maven the first time)."""
    cutline_kafka = "cutline-kafka"
    """cutline's Python Data Source (no jar)."""


def demo(
    duration: Annotated[
        float,
        typer.Option(
            "--duration",
            min=10,
            help="Seconds of input to produce, at least (the input goes on until the restarted job "
            "has completed two checkpoints).",
        ),
    ] = 40.0,
    bootstrap: Annotated[
        str | None,
        typer.Option(
            "--bootstrap",
            envvar="CUTLINE_BOOTSTRAP",
            help="A real Kafka cluster instead of the embedded broker (fresh topics each run).",
        ),
    ] = None,
    broker: Annotated[
        DemoBroker,
        typer.Option(
            "--broker",
            help="The broker to start: the embedded one (tansu), or Apache Kafka itself (kafka: Java 17+, "
            "and Maven the first time).",
        ),
    ] = DemoBroker.tansu,
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="Partitions (tasks) of the input.")
    ] = 4,
    interval: Annotated[int, typer.Option("--interval", min=100, help="Checkpoint interval in ms.")] = 1000,
    keyed: Annotated[
        int,
        typer.Option(
            "--keyed",
            min=0,
            max=128,
            help="Shuffle partitions of the keyed word count (one task and ack each); 0 keeps state "
            "per input partition instead.",
        ),
    ] = 8,
    source: Annotated[
        DemoSource | None,
        typer.Option(
            "--source",
            help="Read Kafka with Spark's own connector (kafka: its jars fetched with Maven the first time) "
            "or cutline-kafka (no jar). Default: the connector where its jars resolve "
            "(Java and Maven), cutline-kafka otherwise; the demo says which.",
        ),
    ] = None,
) -> None:
    """The main job: a keyed Spark word count that checkpoints with cutline, crashes, restores, and
    checks exactly-once, in its files and in its Kafka output (read_committed); on Spark's own Kafka
    connector where its jars resolve."""
    from events.extras import require

    require("spark", "cutline's Spark integration (spark_tasks)")
    if bootstrap and broker is not DemoBroker.tansu:
        raise typer.BadParameter(
            "a cluster is given (--bootstrap or CUTLINE_BOOTSTRAP)", param_hint="--broker"
        )
    args = ["--duration", str(duration), "--partitions", str(partitions)]
    args += ["--interval", str(interval), "--keyed", str(keyed)]
    args += ["--bootstrap", bootstrap] if bootstrap else ["--broker", broker.value]
    args += ["--source", source.value] if source is not None else []
    # This process becomes the demo (same pid, terminal, signals and exit status): the demo is
    # composed in cutline_demo/, which nothing in coordinator/ imports.
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "cutline_demo", *args])
