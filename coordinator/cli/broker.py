"""``cutline broker``: the embedded Kafka-protocol broker, or Apache Kafka itself with ``--kafka``
(secured with ``--sasl``: SASL_SSL, SCRAM users and cutline's ACLs, docs/security.md)."""

from __future__ import annotations

import shlex
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text

from coordinator.cli.common import TopicPrefix, fail
from events.kafka.client_config import EMBEDDED_BROKER_FETCH_WAIT_MS, FETCH_WAIT_VARIABLE
from events.wire.topics import DEFAULT_PREFIX

if TYPE_CHECKING:
    from events.dev.apache_kafka import ApacheKafka
    from events.dev.broker import EmbeddedBroker

USERS = {
    "admin": "the super user: creates topics and ACLs",
    "coordinator": "cutline coordinator",
    "driver": "a job's driver (JobDriver)",
    "task": "a job's tasks (Participant)",
    "operator": "cutline status, list, tail, trigger, stop, replay",
}
"""What each user of a secured broker is for (the admin, then :data:`events.dev.apache_kafka.ROLE_USERS`)."""


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
    sasl: Annotated[
        bool,
        typer.Option(
            "--sasl",
            help="With --kafka: SASL_SSL (SCRAM-SHA-512, a CA made for this run) and cutline's ACLs; "
            "prints a client properties file per principal (admin, coordinator, driver, task, operator).",
        ),
    ] = False,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
) -> None:
    """Run a Kafka broker on 127.0.0.1 until Ctrl-C or SIGTERM: the embedded one (Tansu, memory only),
    or Apache Kafka with --kafka (data in a temp dir, deleted when it stops)."""
    from events.dev.broker import BrokerError, EmbeddedBroker
    from events.stopping import StopSignals

    console = Console(highlight=False)
    if not kafka and (brokers != 1 or heap != "512m" or sasl):
        fail(Console(stderr=True), "--brokers, --heap and --sasl are options of --kafka")
    if not sasl and topic_prefix != DEFAULT_PREFIX:
        fail(Console(stderr=True), "--topic-prefix is an option of --sasl (the prefix its ACLs grant)")
    running: EmbeddedBroker | ApacheKafka
    if kafka:
        running, what, note = _apache_kafka(port, brokers, heap, sasl)
    else:
        running, what, note = (
            EmbeddedBroker(port, ends_with_parent=True),
            "the broker",
            "data is in memory only",
        )
    # Installed before the broker starts: a SIGTERM while it starts stops it once it has
    try:
        with StopSignals() as stop:
            if kafka:
                console.print(
                    Text(f"starting {what} (a few seconds; the first time Maven fetches it)", "dim")
                )
            clients = tempfile.TemporaryDirectory(prefix="cutline-clients-") if sasl else nullcontext(None)
            with running, clients as directory:
                console.print(f"bootstrap: {running.bootstrap}", soft_wrap=True)
                console.print(
                    Text(f"export CUTLINE_BOOTSTRAP={running.bootstrap}   (Ctrl-C stops; {note})", "dim"),
                    soft_wrap=True,
                )
                if isinstance(
                    running, EmbeddedBroker
                ):  # its deviation: a fetch is answered after half its wait
                    console.print(
                        Text(f"export {FETCH_WAIT_VARIABLE}={EMBEDDED_BROKER_FETCH_WAIT_MS}", "dim"),
                        soft_wrap=True,
                    )
                if directory is not None:
                    assert not isinstance(running, EmbeddedBroker)
                    _secure(console, running, topic_prefix, Path(directory))
                while not stop.wait(1.0):
                    gone = _exited(running)
                    if gone is not None:
                        message = f"{what} at {running.bootstrap} {gone}; its data is lost"
                        Console(stderr=True, highlight=False).print(Text(message, "red"), soft_wrap=True)
                        raise typer.Exit(1)
    except BrokerError as exc:
        fail(Console(stderr=True), f"{what} did not start: {exc}")


def _apache_kafka(port: int | None, brokers: int, heap: str, sasl: bool) -> tuple[ApacheKafka, str, str]:
    """The Apache Kafka to run (secured with its role users where ``sasl``), its name and a note."""
    from events.dev.apache_kafka import KAFKA_VERSION, ROLE_USERS, ApacheKafka
    from events.dev.kafka_security import SaslSsl

    security = SaslSsl.with_users(ROLE_USERS) if sasl else None
    running = ApacheKafka(port, brokers=brokers, heap=heap, security=security, ends_with_parent=True)
    what = "Apache Kafka (SASL_SSL)" if sasl else "Apache Kafka"
    plural = "s" if brokers > 1 else ""
    note = f"Apache Kafka {KAFKA_VERSION}, {brokers} broker{plural}; data deleted on stop"
    return running, what, note


def _secure(console: Console, running: ApacheKafka, topic_prefix: str, clients: Path) -> None:
    """Grant each role's ACLs on ``topic_prefix``, write every user's properties file into ``clients``,
    and print where they are and the commands that use them."""
    from events.wire.topics import Topics

    running.grant_roles(Topics(topic_prefix))
    files = running.properties_files(clients)
    console.print(
        f"client properties (SASL_SSL, SCRAM-SHA-512; mode 0600; deleted when the broker stops; the "
        f"ACLs of docs/security.md on {topic_prefix}*):",
        soft_wrap=True,
    )
    width, path_width = max(map(len, files)), max(len(str(path)) for path in files.values())
    for user, path in files.items():
        console.print(f"  {user:<{width}}  {str(path):<{path_width}}  {USERS.get(user, '')}", soft_wrap=True)
    prefix = [] if topic_prefix == DEFAULT_PREFIX else ["--topic-prefix", topic_prefix]

    def as_user(user: str, *command: str) -> str:
        return shlex.join(["cutline", "--kafka-config", str(files[user]), *command, *prefix])

    console.print("next, in another shell:")
    for line in (
        f"export CUTLINE_BOOTSTRAP={running.bootstrap}",
        as_user("admin", "topics", "create"),
        as_user("coordinator", "coordinator"),
        as_user("operator", "tail", "checkpoints", "--from-beginning"),
        as_user("operator", "list"),
        f"export CUTLINE_KAFKA_CONFIG={shlex.quote(str(files['task']))}   # in a participant's process",
    ):
        console.print(f"  {line}", soft_wrap=True)


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
