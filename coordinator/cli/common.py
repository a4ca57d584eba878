"""What the commands share: the options every Kafka command takes, and failing with a message."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Annotated, NoReturn, TypeAlias

import typer
from rich.console import Console
from rich.text import Text

from coordinator.service.group_members import DEFAULT_URL, answers, coordinator_urls

USAGE_ERROR = 2
VIOLATION = 1

Bootstrap: TypeAlias = Annotated[
    str | None,
    typer.Option(
        "--bootstrap",
        "-b",
        envvar="CUTLINE_BOOTSTRAP",
        metavar="HOST:PORT",
        help="Kafka bootstrap servers HOST:PORT (default: $CUTLINE_BOOTSTRAP).",
    ),
]
TopicPrefix: TypeAlias = Annotated[
    str, typer.Option("--topic-prefix", "-p", metavar="PREFIX", help="Prefix of every cutline topic.")
]
CoordinatorUrl: TypeAlias = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="CUTLINE_URL",
        metavar="URL",
        help="The web views of any worker of the coordinator group (default: $CUTLINE_URL; else, with "
        "--bootstrap or $CUTLINE_BOOTSTRAP, a worker the group names; else the local worker's).",
    ),
]


def resolve_url(console: Console, url: str | None, bootstrap: str | None, topic_prefix: str) -> str:
    """Where to ask: ``url`` (``--url``, ``$CUTLINE_URL``); else a worker of the group at ``bootstrap``
    (or, when the group names none, the local worker if one answers); else the local worker's default."""
    if url:
        return url
    if not bootstrap:
        return DEFAULT_URL
    from events.kafka.refusals import explain

    check_broker(console, bootstrap)
    try:
        urls = coordinator_urls(bootstrap, topic_prefix)
    except Exception as exc:  # the admin client's errors are KafkaException, or a future's
        group = f"{topic_prefix}coordinator"
        refused = explain(exc, "Describe", group, bootstrap=bootstrap)
        if refused is not None:
            fail(console, f"cannot find a coordinator worker: {refused}\n(or pass --url)")
        fail(console, f"cannot describe the coordinator group at {bootstrap} ({exc}); pass --url")
    if not urls and answers(DEFAULT_URL):
        return DEFAULT_URL  # the local worker (on Tansu, whose group descriptions have no members)
    if not urls:
        fail(
            console,
            f"no coordinator worker of prefix {topic_prefix!r} is in its group at {bootstrap}: start one "
            "with `cutline coordinator`, check --topic-prefix, or pass --url (the embedded Tansu broker "
            "describes a group without its members: there --url, or $CUTLINE_URL, is the way)",
        )
    return urls[0]


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


def need_topics(
    console: Console, bootstrap: str, topic_prefix: str, names: Sequence[str] | Mapping[str, str]
) -> None:
    """Fail with one line when one of ``names`` does not exist (the topics were never created, or
    ``--topic-prefix`` is wrong), or naming the ACL and its command when the principal may not
    Describe one (a listing leaves such a topic out: it is not missing). ``names`` may map each
    topic to the operation the command needs on it (``Write``, ``Read``), which the ACL then names
    too. It only lists the cluster's topics: nothing is created."""
    from confluent_kafka import Consumer, KafkaException

    from events.kafka.clients import consumer_config, refused_topics
    from events.kafka.refusals import refusal_message

    consumer = Consumer(consumer_config(bootstrap))  # a consumer's metadata requests create no topic
    try:
        existing = set(consumer.list_topics(timeout=BROKER_WAIT_S).topics)
        unseen = [name for name in names if name not in existing]
        refused = refused_topics(consumer, unseen, BROKER_WAIT_S, bootstrap)
    except KafkaException as exc:
        fail(console, f"cannot list the topics at {bootstrap}: {exc}")
    finally:
        consumer.close()
    if refused:
        needs = names if isinstance(names, Mapping) else {}
        messages = (
            refusal_message("Describe", "topic", name, bootstrap=bootstrap, also=[needs.get(name, "Read")])
            for name in refused
        )
        fail(console, "\n".join(messages))
    problem = missing_topics(bootstrap, topic_prefix, list(names), existing)
    if problem is not None:
        fail(console, problem)


def missing_topics(
    bootstrap: str, topic_prefix: str, names: Sequence[str], existing: Collection[str]
) -> str | None:
    """What to say when some of ``names`` are not among the ``existing`` topics; None when all are.
    Names the prefixes the cluster has cutline's topics under, if any: a typo shows at once."""
    from events.wire.topics import Topics

    missing = [name for name in names if name not in existing]
    if not missing:
        return None
    listed = ", ".join(missing[:-1]) + (" or " if len(missing) > 1 else "") + missing[-1]
    journal = Topics("").checkpoints
    prefixes = sorted(
        name.removesuffix(journal)
        for name in existing
        if name.endswith(journal) and Topics(name.removesuffix(journal)).requests in existing
    )
    others = f" (this cluster has cutline's topics with prefix {', '.join(prefixes[:5])})" if prefixes else ""
    return (
        f"no topic {listed} at {bootstrap}: create cutline's topics with "
        f"`cutline topics create --topic-prefix {topic_prefix}`, or check --topic-prefix{others}"
    )


def as_uri(path_or_uri: str) -> str:
    """A URI as it is; a local path as its absolute ``file:`` URI."""
    return path_or_uri if "://" in path_or_uri else Path(path_or_uri).absolute().as_uri()
