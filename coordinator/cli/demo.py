"""``cutline demo``: the Spark word count that checkpoints with cutline, crashes and restores."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text


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
) -> None:
    """The main job: a keyed Spark word count that checkpoints with cutline, crashes, restores, and
    checks exactly-once."""
    from coordinator.demo import DemoError, DemoOptions, run_demo, summary
    from events.stopping import StopRequested, StopSignals

    console = Console(highlight=False)
    # SIGTERM, like Ctrl-C, stops everything the demo started (the Spark driver in its own session)
    try:
        with StopSignals() as stop:
            result = run_demo(
                DemoOptions(
                    duration=duration,
                    bootstrap=bootstrap,
                    partitions=partitions,
                    interval_ms=interval,
                    keyed=keyed,
                ),
                console,
                stop,
            )
    except StopRequested:
        console.print(Text("interrupted: everything the demo started was stopped", "yellow"))
        raise typer.Exit(130) from None
    except DemoError as exc:
        console.print(Text(f"demo failed: {exc}", "bold red"), soft_wrap=True)
        console.print(Text("exactly-once: not checked", "bold red"))
        raise typer.Exit(1) from None
    console.print(summary(result))
    if result.exactly_once:
        console.print(
            Text(
                f"exactly-once: OK, {result.counted.total():,} words counted = "
                f"{result.produced.total():,} produced, and every word's final count is right, across a "
                f"crash and a restore from checkpoint {result.restored_from}",
                "bold green",
            ),
            soft_wrap=True,
        )
        return
    console.print(Text("exactly-once: FAILED", "bold red"), soft_wrap=True)
    if result.restored_from is None:
        console.print("  the restarted job did not restore from a checkpoint")
    for word in sorted(set(result.produced) | set(result.counted)):
        if result.produced[word] != result.counted[word] or result.final.get(word) != result.produced[word]:
            console.print(
                f"  {word}: produced {result.produced[word]}, counted {result.counted[word]}, "
                f"final count {result.final.get(word)}"
            )
    raise typer.Exit(1)
