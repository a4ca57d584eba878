"""``cutline topics``: cutline's topics."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from coordinator.cli.common import (
    Bootstrap,
    TopicPrefix,
    fail,
    need_bootstrap,
)
from coordinator.cli.help import CutlineCommand, CutlineGroup
from events.wire.topics import DEFAULT_PARTITIONS, DEFAULT_PREFIX

topics_app = typer.Typer(help="Manage cutline's topics.", no_args_is_help=True, cls=CutlineGroup)


@topics_app.command("create", cls=CutlineCommand)
def topics_create(
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    partitions: Annotated[
        int,
        typer.Option("--partitions", envvar="CUTLINE_PARTITIONS", min=1, help="Partitions of every topic."),
    ] = DEFAULT_PARTITIONS,
) -> None:
    """Create every topic of the protocol with one partition count (existing ones are kept, and the
    missing ones get their count; fails, saying what to do, if existing ones differ)."""
    from coordinator.service.app import Settings, TopicLayoutError, ensure_topics, settle_partitions
    from events.dev.broker import partition_counts

    errors = Console(stderr=True, highlight=False)
    bootstrap = need_bootstrap(errors, bootstrap)
    try:
        settings = settle_partitions(Settings(bootstrap, topic_prefix, partitions=partitions))
        if settings.partitions != partitions:
            errors.print(
                f"the existing topics of {topic_prefix!r} have {settings.partitions} partitions: the missing "
                f"ones get {settings.partitions} too (--partitions {partitions} applies to a new prefix)",
                soft_wrap=True,
            )
        created = ensure_topics(settings)
        settle_partitions(settings)  # someone else may have created some at the same time
    except (TopicLayoutError, TimeoutError) as exc:
        fail(errors, str(exc))
    names = [*settings.topics.all, *settings.topics.internal]
    counts = partition_counts(bootstrap, names)
    console = Console(highlight=False)
    for name in names:
        console.print(
            f"{'created' if name in created else 'exists '}  {name}  ({counts.get(name)} partitions)",
            soft_wrap=True,
        )
