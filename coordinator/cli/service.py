"""``cutline coordinator``: the checkpoint coordinator (a Faust worker), under its watchdog."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from coordinator.cli.common import (
    Bootstrap,
    TopicPrefix,
    fail,
    need_bootstrap,
)
from events.kafka.client_config import FETCH_WAIT_MS
from events.wire.topics import DEFAULT_PARTITIONS, DEFAULT_PREFIX


def _need_free_port(console: Console, host: str, port: int) -> None:
    """Fail, saying what to do, when the web views could not listen on ``host:port`` (Faust would
    fail later, with a traceback). Bound with SO_REUSEADDR, as aiohttp binds."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        fail(
            console,
            f"the web views cannot listen on {host}:{port} ({exc.strerror}): another coordinator worker "
            "or program has the port. Each worker on a machine needs its own: pass --web-port with a "
            "free one",
        )


def _need_acls(console: Console, bootstrap: str, prefix: str) -> None:
    """Fail, naming each ACL a coordinator lacks and the command that grants it, where the cluster
    says so (docs/security.md): without them it would be refused in a loop, deep in its start. Where
    the cluster answers no such question (no authorizer, the embedded broker), nothing is checked."""
    from confluent_kafka import KafkaException

    from events.kafka.acls import Role, lacking_commands, lacking_summary, missing_grants, principal_of
    from events.kafka.client_config import client_properties
    from events.wire.topics import Topics

    try:
        lacking = missing_grants(bootstrap, Role.COORDINATOR, Topics(prefix))
    except (KafkaException, TimeoutError):
        return  # the question itself failed: the start goes on, and says what it meets
    if lacking:
        principal = principal_of(client_properties())
        commands = "\n".join(f"  {c}" for c in lacking_commands(lacking, principal, bootstrap))
        fail(
            console,
            f"{principal} lacks ACLs a coordinator needs: {lacking_summary(lacking)} (docs/security.md, "
            f'"Kafka ACLs per principal"). An administrator grants them with:\n{commands}',
        )


def coordinator(
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    web_host: Annotated[str, typer.Option("--web-host", help="Address of the web views.")] = "127.0.0.1",
    web_port: Annotated[int, typer.Option("--web-port", help="Port of the web views.")] = 6066,
    web_advertised_host: Annotated[
        str | None,
        typer.Option(
            "--web-advertised-host",
            help="Host name of this worker's web address as the other workers and the dashboard use it "
            "(default: --web-host; set it when --web-host is 0.0.0.0).",
        ),
    ] = None,
    web_allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--web-allowed-host",
            metavar="NAME",
            help="A Host name the web views answer besides localhost, the advertised host and "
            "--web-host (a guard against DNS rebinding); repeatable.",
        ),
    ] = None,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Faust's working directory.")] = Path(
        ".cutline/coordinator"
    ),
    loglevel: Annotated[str, typer.Option("--loglevel", help="debug, info, warning or error.")] = "warning",
    snapshot_interval: Annotated[
        float,
        typer.Option(
            "--snapshot-interval",
            min=0.1,
            help="Seconds between fold snapshots of each owned journal partition.",
        ),
    ] = 10.0,
    savepoint_root: Annotated[
        list[str] | None,
        typer.Option(
            "--savepoint-root",
            metavar="DIR",
            help="A directory (path or URI) savepoint targets may lie in; repeatable. Without any, "
            "savepoints may go only below the parent of each job's checkpoint location.",
        ),
    ] = None,
    session_timeout: Annotated[
        float,
        typer.Option(
            "--session-timeout",
            envvar="CUTLINE_SESSION_TIMEOUT",
            min=1.0,
            help="Seconds without a heartbeat before the group hands this worker's partitions to "
            "the others (Kafka's session.timeout.ms; Apache Kafka accepts 6 to 1800 by default).",
        ),
    ] = 6.0,
    fetch_wait_ms: Annotated[
        int,
        typer.Option(
            "--fetch-wait-ms",
            envvar="CUTLINE_FETCH_WAIT_MS",
            min=1,
            help="fetch.wait.max.ms of the worker's input consumers. Apache Kafka answers a fetch as "
            "soon as records arrive, so the long default costs no latency; the embedded broker answers "
            "one only after half of it (docs/embedded-broker.md): `cutline demo` sets "
            "CUTLINE_FETCH_WAIT_MS=5 there, and `cutline broker` prints the line that does.",
        ),
    ] = FETCH_WAIT_MS,
    partitions: Annotated[
        int,
        typer.Option(
            "--partitions",
            envvar="CUTLINE_PARTITIONS",
            min=1,
            help="Partitions of the topics it creates when none exists yet. Existing topics keep "
            "theirs, and the coordinator uses their count.",
        ),
    ] = DEFAULT_PARTITIONS,
    watchdog: Annotated[
        bool,
        typer.Option(
            "--watchdog/--no-watchdog",
            envvar="CUTLINE_WATCHDOG",
            help="Run the worker as a child process and, when it dies (SIGKILL, OOM, a crash), tell "
            "its group at once, so that the other workers take its jobs without waiting for the "
            "session timeout.",
        ),
    ] = True,
    latency_granularity: Annotated[
        str,
        typer.Option(
            "--latency-granularity",
            help="What one latency histogram tells apart (Flink's metrics.latency.granularity): "
            "single (operator subtask), operator (and source) or subtask (and source subtask).",
        ),
    ] = "operator",
) -> None:
    """Run the checkpoint coordinator (a Faust worker) until interrupted.

    Start it N times with the same prefix for N workers: each owns the jobs of its partitions."""
    import logging

    from events.task.latency import Granularity
    from events.wire.validation import InvalidUri, canonical_uri

    errors = Console(stderr=True, highlight=False)
    bootstrap = need_bootstrap(errors, bootstrap)
    if latency_granularity not in {g.value for g in Granularity}:
        fail(errors, f"--latency-granularity {latency_granularity!r}: use single, operator or subtask")
    _need_free_port(errors, web_host, web_port)
    roots = []
    for root in savepoint_root or []:
        uri = root if ":" in root.split("/", 1)[0] else Path(root).absolute().as_uri()
        try:
            roots.append(canonical_uri(uri))
        except InvalidUri as exc:
            fail(errors, f"--savepoint-root {root!r}: {exc}")
    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if watchdog:
        child = _worker_command(
            bootstrap=bootstrap,
            topic_prefix=topic_prefix,
            web_host=web_host,
            web_port=web_port,
            web_advertised_host=web_advertised_host or web_host,
            web_allowed_host=web_allowed_host or [],
            data_dir=data_dir,
            loglevel=loglevel,
            snapshot_interval=snapshot_interval,
            savepoint_root=roots,
            session_timeout=session_timeout,
            fetch_wait_ms=fetch_wait_ms,
            partitions=partitions,
            latency_granularity=latency_granularity,
        )
        raise typer.Exit(_watch_worker(errors, bootstrap, child))
    # The worker's imports (Faust, aiokafka): not in the watchdog, which only waits.
    from coordinator.service.app import JournalRetentionError, Settings, TopicLayoutError, run_coordinator
    from coordinator.service.watchdog import die_with_watchdog

    die_with_watchdog(bootstrap=bootstrap)
    _need_acls(errors, bootstrap, topic_prefix)
    errors.print(
        f"coordinator: topics {topic_prefix}*, "
        f"dashboard on http://{web_advertised_host or web_host}:{web_port}/",
        soft_wrap=True,
    )
    settings = Settings(
        bootstrap,
        topic_prefix,
        web_host=web_host,
        web_port=web_port,
        web_advertised_host=web_advertised_host,
        web_allowed_hosts=tuple(web_allowed_host or ()),
        data_dir=data_dir,
        snapshot_interval=snapshot_interval,
        savepoint_roots=tuple(roots),
        session_timeout=session_timeout,
        fetch_wait_ms=fetch_wait_ms,
        partitions=partitions,
        latency_granularity=Granularity(latency_granularity),
    )
    try:
        run_coordinator(settings, loglevel)
    except (JournalRetentionError, TopicLayoutError) as exc:
        fail(errors, str(exc))


def _worker_command(**options: object) -> list[str]:
    """``cutline coordinator --no-watchdog`` with ``options`` (the command's parameters, by name):
    the watchdog's worker. A list is given as its option repeated."""
    command = [sys.executable, "-m", "coordinator.cli", "coordinator", "--no-watchdog"]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        for item in value if isinstance(value, list) else [value]:
            command += [flag, str(item)]
    return command


def _watch_worker(errors: Console, bootstrap: str, command: list[str]) -> int:
    """Run the coordinator worker ``command`` under :func:`coordinator.service.watchdog.watch`."""
    from coordinator.service.watchdog import group_leaver, watch

    return watch(
        command, group_leaver(bootstrap), lambda message: errors.print(message, soft_wrap=True, markup=False)
    )
