"""Apache Kafka itself on this machine: its jars from Maven Central, one KRaft node or a small cluster.

:class:`ApacheKafka` is :class:`~events.dev.broker.EmbeddedBroker`'s counterpart for the broker
users run: combined broker+controller JVMs (``kafka.Kafka``) on free ports of 127.0.0.1, each
formatted (``kafka.tools.StorageTool format``) in a temp dir of its own, stopped with SIGTERM and
then SIGKILL. It needs Java 17+ and, the first time, Maven: :func:`resolve_jars` copies the pinned
broker's jars with ``mvn dependency:copy-dependencies`` into a cache outside the repository
(``$CUTLINE_KAFKA_CACHE``, by default ``~/.cache/cutline``), once per version and machine.
Where Apache Kafka differs from the embedded broker is in ``docs/embedded-broker.md``.
"""

from __future__ import annotations

import atexit
import base64
import functools
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from events.dev import maven, parent_death
from events.dev.broker import HOST, BrokerError, free_port
from events.dev.kafka_security import ADMIN, Certificates, SaslSsl, make_certificates
from events.kafka.acls import Role, acl_bindings
from events.kafka.client_config import client_properties
from events.wire.topics import Topics

__all__ = [
    "KAFKA_VERSION",
    "ApacheKafka",
    "KafkaJars",
    "KafkaNode",
    "KafkaUnavailable",
    "ROLE_USERS",
    "check_java",
    "resolve_jars",
]

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.4.0"
"""The Apache Kafka broker :class:`ApacheKafka` runs (``org.apache.kafka:kafka_2.13``)."""

LOG4J_VERSION = "2.25.5"
"""The log4j-core that Kafka 4.4.0 depends on: its SLF4J 1.x binding (``log4j-slf4j-impl``) is added,
without which the broker logs nothing at all."""

DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

MIN_JAVA = 17
"""Kafka 4.x brokers need Java 17 or later."""

INSTALL_HINT = "apt-get install maven openjdk-17-jre-headless"

CACHE_ENV = "CUTLINE_KAFKA_CACHE"
"""Where the jars are cached (``kafka-<version>/libs`` under it); default ``~/.cache/cutline``."""

LIBS_ENV = "CUTLINE_KAFKA_LIBS"
"""The ``libs/`` of an Apache Kafka 4.x download to run instead of Maven's copy."""

REQUIRED_JARS = (
    "kafka_2.13",
    "kafka-clients",
    "kafka-server",
    "kafka-server-common",
    "kafka-storage",
    "kafka-raft",
    "kafka-metadata",
    "kafka-group-coordinator",
    "kafka-transaction-coordinator",
    "kafka-share-coordinator",
    "scala-library",
    "log4j-core",
    "log4j-slf4j-impl",
)
"""Jar names (without the version) that ``kafka.Kafka`` and ``StorageTool`` cannot start without."""

JVM_OPTIONS = (
    # kafka-run-class.sh's defaults for the broker
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)
"""The JVM's performance options unless ``KAFKA_JVM_PERFORMANCE_OPTS`` is set (as in Kafka's own
scripts, which it replaces whole)."""

PERFORMANCE_OPTIONS_ENV = "KAFKA_JVM_PERFORMANCE_OPTS"


def jvm_options(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """Every node's JVM options besides its heap and paths: ``KAFKA_JVM_PERFORMANCE_OPTS`` (split as a
    shell would) where set, else :data:`JVM_OPTIONS`; then an exit on running out of memory."""
    given = environ.get(PERFORMANCE_OPTIONS_ENV)
    chosen = tuple(shlex.split(given)) if given else JVM_OPTIONS
    return (*chosen, "-XX:+ExitOnOutOfMemoryError")


ROLE_USERS = tuple(role.value for role in Role)
"""The users of a broker secured for cutline (``SaslSsl.with_users(ROLE_USERS)``): one per role of
its trust model (events/kafka/acls.py), named after it; :meth:`ApacheKafka.grant_roles` grants them."""


class KafkaUnavailable(BrokerError):
    """Java or Maven is missing or too old, or the jars could not be resolved; the message says
    what to install."""


# ---------------------------------------------------------------- Java and the jars


def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` where JAVA_HOME is set, else ``java`` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise KafkaUnavailable(
            f"Apache Kafka needs Java {MIN_JAVA} or later, and no `java` is on the PATH (nor in "
            f"$JAVA_HOME): install it, e.g. `{INSTALL_HINT}`"
        )
    return found


def parse_java_version(text: str) -> int | None:
    """The feature release in ``java -version``'s output: 17 for ``"17.0.15"``, 8 for ``"1.8.0_292"``."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


@functools.cache
def _java_version(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return None
    return parse_java_version(out.stderr + out.stdout)


def check_java() -> str:
    """The ``java`` to run Kafka with, once it is known to be Java 17 or later."""
    java = java_binary()
    version = _java_version(java)
    if version is None or version < MIN_JAVA:
        seen = "an unknown version" if version is None else f"Java {version}"
        raise KafkaUnavailable(
            f"Apache Kafka {KAFKA_VERSION} needs Java {MIN_JAVA} or later; {java} is {seen}: install a "
            f"newer one (e.g. `{INSTALL_HINT}`) and put it first on the PATH or in $JAVA_HOME"
        )
    return java


@dataclass(frozen=True)
class KafkaJars:
    """A directory holding every jar of one Apache Kafka broker."""

    version: str
    libs: Path

    @property
    def classpath(self) -> str:
        return f"{self.libs}{os.sep}*"

    def missing(self) -> list[str]:
        """The :data:`REQUIRED_JARS` not in :attr:`libs`."""
        names = [path.name for path in self.libs.glob("*.jar")] if self.libs.is_dir() else []
        pattern = re.compile(r"^(.*?)-\d[^-]*(-[^-]*)?\.jar$")
        present = {match.group(1) for name in names if (match := pattern.match(name))}
        return [jar for jar in REQUIRED_JARS if jar not in present]


def cache_root() -> Path:
    """``$CUTLINE_KAFKA_CACHE``, else ``$XDG_CACHE_HOME/cutline``, else ``~/.cache/cutline``."""
    return maven.cache_root(CACHE_ENV)


def pom(version: str = KAFKA_VERSION) -> str:
    """A POM whose runtime dependencies are the broker's jars."""
    dependencies = [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
    ]
    deps = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"
        for g, a, v in dependencies
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>dev.cutline</groupId><artifactId>apache-kafka-broker</artifactId>"
        f"<version>{version}</version><packaging>pom</packaging><dependencies>{deps}</dependencies></project>"
    )


def resolve_jars(version: str = KAFKA_VERSION, cache: Path | None = None, timeout: float = 900) -> KafkaJars:
    """The broker's jars: ``$CUTLINE_KAFKA_LIBS``, or ``<cache>/kafka-<version>/libs``, copied there by
    Maven the first time (under a file lock; a ``complete`` marker is written after a whole copy)."""
    given = os.environ.get(LIBS_ENV)
    if given:
        jars = KafkaJars("unknown", Path(given).expanduser())
        if jars.missing():
            raise KafkaUnavailable(f"${LIBS_ENV} ({given}) lacks the jars {', '.join(jars.missing())}")
        return jars
    home = (cache or cache_root()) / f"kafka-{version}"
    jars = KafkaJars(version, home / "libs")
    if (home / "complete").exists():
        return jars
    with maven.file_lock(home.parent / f"kafka-{version}.lock"):
        if (home / "complete").exists():
            return jars
        _copy_with_maven(version, home, timeout)
    if jars.missing():  # pragma: no cover - Maven's copy is checked before it is published
        raise KafkaUnavailable(f"{jars.libs} lacks the jars {', '.join(jars.missing())}")
    return jars


def _copy_with_maven(version: str, home: Path, timeout: float) -> None:
    """Copy the jars into a fresh directory beside ``home``, check them, then move it into place."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaUnavailable(
            f"Apache Kafka's jars are fetched from Maven Central with Maven the first time, and no `mvn` "
            f"is on the PATH: install it (e.g. `{INSTALL_HINT}`), or set ${LIBS_ENV} to the libs/ "
            "directory of an Apache Kafka 4.x download"
        )
    check_java()
    work = Path(tempfile.mkdtemp(prefix=f".kafka-{version}-", dir=home.parent))
    try:
        (work / "pom.xml").write_text(pom(version))
        command = [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(work / "pom.xml")]
        command += [f"{DEPENDENCY_PLUGIN}:copy-dependencies", "-DincludeScope=runtime"]
        command += [f"-DoutputDirectory={work / 'libs'}"]
        log.info("fetching Apache Kafka %s's jars with Maven into %s", version, home)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise KafkaUnavailable(f"Maven did not fetch Apache Kafka {version} within {timeout:g}s") from exc
        jars = KafkaJars(version, work / "libs")
        if done.returncode != 0 or jars.missing():
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
            raise KafkaUnavailable(
                f"Maven could not fetch Apache Kafka {version} (exit {done.returncode}; missing "
                f"{', '.join(jars.missing()) or 'nothing'}): {' '.join(command)}\n{tail}"
            )
        (work / "complete").write_text(f"{version}\n")
        if home.exists():
            shutil.rmtree(home)  # an incomplete copy of an earlier run (no marker)
        work.rename(home)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- the broker


@dataclass(frozen=True)
class KafkaNode:
    """One combined broker+controller of an :class:`ApacheKafka`: its id, ports and directory."""

    node_id: int
    port: int
    controller_port: int
    directory: Path

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def voter(self) -> str:
        """Its entry in ``controller.quorum.voters``."""
        return f"{self.node_id}@{HOST}:{self.controller_port}"

    @property
    def log_path(self) -> Path:
        """The broker's log4j log (WARN and above)."""
        return self.directory / "server.log"

    @property
    def out_path(self) -> Path:
        """What the JVM writes to stdout and stderr."""
        return self.directory / "stdout.log"


@dataclass(frozen=True)
class KafkaSettings:
    """What the nodes of one :class:`ApacheKafka` share."""

    cluster_id: str
    brokers: int
    heap: str
    config: Mapping[str, str] = field(default_factory=dict)
    security: SaslSsl | None = None

    def server_properties(
        self, node: KafkaNode, voters: str, tls: Certificates | None = None
    ) -> dict[str, str]:
        """``server.properties`` of ``node``: a test cluster's settings, :attr:`security`'s listeners
        and authorizer (with the certificates ``tls``), then :attr:`config`'s."""
        replicas = str(self.brokers)
        min_isr = str(min(2, self.brokers))
        properties = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{node.address},CONTROLLER://{HOST}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{node.address}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.directory / "data"),
            # cutline creates every topic it uses (create_topics, `cutline topics create`)
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            "group.initial.rebalance.delay.ms": "0",
        }
        if self.security is not None:
            assert tls is not None, "a secured node needs its certificates"
            properties.update(self.security.server_properties(HOST, node.port, node.controller_port, tls))
        return {**properties, **self.config}


def _log4j2_properties(log_file: Path) -> str:
    """Kafka's own logging: WARN and above, to ``log_file`` only."""
    return "\n".join(
        [
            "status = warn",
            "appender.file.type = File",
            "appender.file.name = FILE",
            f"appender.file.fileName = {log_file}",
            "appender.file.layout.type = PatternLayout",
            "appender.file.layout.pattern = [%d] %p %m (%c)%n",
            "rootLogger.level = WARN",
            "rootLogger.appenderRef.file.ref = FILE",
            "",
        ]
    )


def _write_properties(path: Path, properties: Mapping[str, str]) -> None:
    path.write_text("".join(f"{name}={value}\n" for name, value in properties.items()))


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64, as ``kafka-storage random-uuid``; never
    one that starts with ``-``, which ``StorageTool format -t`` would take for an option (as Kafka's
    own ``Uuid.randomUuid`` draws again; one id in 64 did, and the node failed to format)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class ApacheKafka:
    """Apache Kafka (:data:`KAFKA_VERSION`, KRaft) on 127.0.0.1: one combined broker+controller, or
    ``brokers`` of them sharing the controller quorum, each a JVM in its own process group with its
    own ports and log dir under one temp dir.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. ``port`` is the first node's
    (default: free ones); ``config`` overrides entries of every node's ``server.properties``;
    ``heap`` is each JVM's ``-Xmx``; ``java_options`` its other options (default: :func:`jvm_options`);
    ``security``: SASL_SSL listeners, SCRAM users and the ``StandardAuthorizer``
    (:mod:`events.dev.kafka_security`) instead of PLAINTEXT.

    A node can crash and come back (:meth:`kill`, :meth:`restart`) or freeze (:meth:`pause`,
    :meth:`resume`), as a broker of a production cluster does. A secured one grants ACLs
    (:meth:`create_acls`; cutline's roles: :meth:`grant_roles`) and writes its users' client
    properties files (:meth:`properties_files`).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        brokers: int = 1,
        heap: str = "512m",
        config: Mapping[str, str] | None = None,
        security: SaslSsl | None = None,
        startup_timeout: float = 90.0,
        jars: KafkaJars | None = None,
        ends_with_parent: bool = False,
        java_options: tuple[str, ...] | None = None,
    ) -> None:
        if brokers < 1:
            raise ValueError("brokers must be at least 1")
        self._settings = KafkaSettings(new_cluster_id(), brokers, heap, dict(config or {}), security)
        self._tls: Certificates | None = None
        self._fixed_port = port
        self._startup_timeout = startup_timeout
        self._jars = jars
        self._java_options = java_options
        """Every node's JVM options besides heap and paths; :func:`jvm_options` when None."""
        self._ends_with_parent = ends_with_parent
        """Each node's JVM gets SIGTERM when this process dies (:mod:`events.dev.parent_death`)."""
        self._dir: Path | None = None
        self._nodes: tuple[KafkaNode, ...] = ()
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._outputs: dict[int, IO[bytes]] = {}

    @property
    def cluster_id(self) -> str:
        return self._settings.cluster_id

    @property
    def nodes(self) -> tuple[KafkaNode, ...]:
        """The nodes (empty before :meth:`start`)."""
        return self._nodes

    @property
    def port(self) -> int:
        """The first node's listening port."""
        if not self._nodes:
            raise BrokerError("Apache Kafka not started")
        return self._nodes[0].port

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: every node's ``127.0.0.1:PORT``."""
        if not self._nodes:
            raise BrokerError("Apache Kafka not started")
        return ",".join(node.address for node in self._nodes)

    @property
    def pids(self) -> dict[int, int]:
        """The process id of each running node, by node id."""
        return {node_id: proc.pid for node_id, proc in self._procs.items() if proc.poll() is None}

    @property
    def log_path(self) -> Path | None:
        """The first node's log, while it exists."""
        return self._nodes[0].log_path if self._nodes and self._dir is not None else None

    @property
    def security(self) -> SaslSsl | None:
        return self._settings.security

    def client_properties(self, user: str = ADMIN) -> dict[str, str]:
        """librdkafka properties for ``user`` of a secured cluster (none for a PLAINTEXT one)."""
        if self._settings.security is None:
            return {}
        if self._tls is None:
            raise BrokerError("Apache Kafka not started")
        return self._settings.security.client_properties(user, self._tls)

    def properties_file(self, user: str, path: Path) -> Path:
        """``user``'s :meth:`client_properties` in a file of mode 0600 (``--kafka-config FILE``)."""
        if self._settings.security is None or self._tls is None:
            raise BrokerError("a properties file is for a secured, started Apache Kafka")
        return self._settings.security.properties_file(user, self._tls, path)

    def properties_files(self, directory: Path) -> dict[str, Path]:
        """Every user's :meth:`properties_file`, ``<directory>/<user>.properties``, by user."""
        if self._settings.security is None:
            raise BrokerError("properties files are for a secured Apache Kafka")
        users = self._settings.security.users
        return {user: self.properties_file(user, directory / f"{user}.properties") for user in users}

    def create_acls(self, bindings: Iterable[Any], timeout: float = 30.0) -> None:
        """Create ``bindings`` (``confluent_kafka.admin.AclBinding``) as the super user, and return once
        the cluster has taken every one."""
        if self._settings.security is None:
            raise BrokerError("ACLs are for a secured Apache Kafka: this one has no authorizer")
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "logger": log,
            **self.client_properties(),
        }
        admin = AdminClient(conf)  # held until every future is done: a client destroyed fails them
        futures = admin.create_acls(list(dict.fromkeys(bindings)), request_timeout=timeout)
        try:
            for future in futures.values():
                future.result(timeout=timeout)
        except KafkaException as exc:
            raise BrokerError(f"creating ACLs on {self.bootstrap} failed: {exc.args[0]}") from exc

    def grant_roles(self, topics: Topics) -> None:
        """Each role's ACLs on ``topics`` (:func:`events.kafka.acls.grants`) to the user named after it
        (:data:`ROLE_USERS`): cutline's trust model on one prefix."""
        self.create_acls(
            binding for role in Role for binding in acl_bindings(role, f"User:{role.value}", topics)
        )

    def node(self, node_id: int) -> KafkaNode:
        """The node ``node_id`` (1 to ``brokers``)."""
        for node in self._nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no Kafka node {node_id} (nodes: {[n.node_id for n in self._nodes]})")

    def kill(self, node_id: int) -> None:
        """SIGKILL node ``node_id``, as a crash: no controlled shutdown, nothing flushed. Its ports
        and log dir stay for :meth:`restart`; the cluster notices when the node's broker session
        (``broker.session.timeout.ms``) expires."""
        self.node(node_id)
        proc = self._procs.pop(node_id, None)
        if proc is None:
            return
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
        output = self._outputs.pop(node_id, None)
        if output is not None:
            output.close()

    def restart(self, node_id: int, timeout: float | None = None) -> None:
        """Start node ``node_id`` again (after :meth:`kill`) on its ports and log dir, and wait until
        every node is in the cluster's metadata again."""
        node = self.node(node_id)
        if node_id in self._procs:
            raise BrokerError(f"Kafka node {node_id} is running")
        self._spawn(check_java(), self._jars or resolve_jars(), node)
        self._await_ready(timeout)

    def pause(self, node_id: int, timeout: float = 10.0) -> None:
        """SIGSTOP node ``node_id``, and return once every thread of its JVM is stopped (a signal is
        delivered to a thread running on another core a moment later, and meanwhile it may still
        answer a request): its sockets stay open and its clients' requests wait, unanswered."""
        proc = self._procs[node_id]
        _signal_group(proc, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while not _all_threads_stopped(proc.pid):
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"Kafka node {node_id} (pid {proc.pid}) not stopped {timeout:g}s after SIGSTOP"
                )
            time.sleep(0.001)

    def resume(self, node_id: int) -> None:
        """SIGCONT node ``node_id`` after :meth:`pause`."""
        _signal_group(self._procs[node_id], signal.SIGCONT)

    def start(self) -> Self:
        """Resolve the jars, format each node's storage, start the nodes and wait until every broker
        is in the cluster's metadata. Retried on fresh ports when a node does not start."""
        if self._procs:
            return self
        java = check_java()
        jars = self._jars = self._jars or resolve_jars()
        attempts = 1 if self._fixed_port is not None else 3
        for attempt in range(attempts):
            try:
                self._layout()
                self._format(java, jars)
                for node in self._nodes:
                    self._spawn(java, jars, node)
                atexit.register(self.stop)
                self._await_ready()
                return self
            except KafkaUnavailable:
                self._terminate(grace=2.0)
                self._remove_dir()
                raise
            except BrokerError as exc:
                self._terminate(grace=2.0)
                if attempt + 1 == attempts:
                    raise
                self._remove_dir()
                log.warning("Apache Kafka failed to start, retrying: %s", exc)
        raise AssertionError("unreachable")

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM every node (a controlled shutdown), SIGKILL what is left after ``grace`` s, and delete
        the temp dir, unless a node had died by itself (its log is kept); idempotent."""
        if not self._procs:
            self._remove_dir()
            return
        died = any(proc.poll() is not None for proc in self._procs.values())
        self._terminate(grace)
        if not died:
            self._remove_dir()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _layout(self) -> None:
        """A fresh temp dir with a directory, ports, ``server.properties`` and log4j2 config per node."""
        self._dir = Path(tempfile.mkdtemp(prefix="cutline-kafka-"))
        if self._settings.security is not None:
            self._tls = make_certificates(self._dir / "tls", check_java())
        ports = self._ports()
        count = self._settings.brokers
        self._nodes = tuple(
            KafkaNode(i, ports[i - 1], ports[count + i - 1], self._dir / f"node-{i}")
            for i in range(1, count + 1)
        )
        voters = ",".join(node.voter for node in self._nodes)
        for node in self._nodes:
            (node.directory / "data").mkdir(parents=True)
            path = node.directory / "server.properties"
            _write_properties(path, self._settings.server_properties(node, voters, self._tls))
            path.chmod(0o600)  # a secured node's holds the brokers' passwords
            (node.directory / "log4j2.properties").write_text(_log4j2_properties(node.log_path))

    def _ports(self) -> list[int]:
        """Distinct ports: every node's listener (the first one ``port`` where given), then every
        node's controller."""
        ports = [self._fixed_port] if self._fixed_port is not None else []
        while len(ports) < 2 * self._settings.brokers:
            port = free_port()
            if port not in ports:
                ports.append(port)
        return ports

    def _java(self, java: str, jars: KafkaJars, node: KafkaNode, heap: str) -> list[str]:
        return [
            java,
            f"-Xmx{heap}",
            *(jvm_options() if self._java_options is None else self._java_options),
            f"-Dlog4j2.configurationFile={node.directory / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={node.directory}",
            "-cp",
            jars.classpath,
        ]

    def _format(self, java: str, jars: KafkaJars) -> None:
        """``kafka.tools.StorageTool format`` of every node's log dir, side by side."""
        running = []
        for node in self._nodes:
            command = [*self._java(java, jars, node, "256m"), "kafka.tools.StorageTool", "format"]
            command += ["-t", self.cluster_id, "-c", str(node.directory / "server.properties")]
            if self._settings.security is not None:
                command += self._settings.security.scram_arguments()
            running.append(
                subprocess.Popen(
                    command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=node.directory
                )
            )
        for node, proc in zip(self._nodes, running, strict=True):
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                tail = "\n".join(out.decode(errors="replace").splitlines()[-20:])
                raise KafkaUnavailable(
                    f"formatting the storage of Kafka node {node.node_id} failed "
                    f"(exit {proc.returncode}):\n{tail}"
                )

    def _spawn(self, java: str, jars: KafkaJars, node: KafkaNode) -> None:
        """Start one node's JVM in its own session, stdout and stderr to its ``stdout.log``."""
        output = open(node.out_path, "ab")  # noqa: SIM115 (closed in _terminate)
        self._outputs[node.node_id] = output
        command = [*self._java(java, jars, node, self._settings.heap), "kafka.Kafka"]
        self._procs[node.node_id] = subprocess.Popen(
            [*command, str(node.directory / "server.properties")],
            cwd=node.directory,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=parent_death.ends_with_parent() if self._ends_with_parent else None,
        )

    def _await_ready(self, timeout: float | None = None) -> None:
        """Wait until the cluster's metadata names every broker; fail fast if a node exits."""
        timeout = self._startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        errors: list[str] = []
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "logger": log,
            "reconnect.backoff.max.ms": 500,
            "socket.connection.setup.timeout.ms": 2000,
            "error_cb": lambda err: errors.append(str(err)),
            **client_properties(),
            **self.client_properties(),
        }
        admin = AdminClient(conf)
        while True:
            for node_id, proc in self._procs.items():
                if proc.poll() is not None:
                    raise BrokerError(
                        f"Kafka node {node_id} exited with code {proc.returncode} while starting "
                        f"(logs in {self._dir}):\n{self._log_tail(node_id)}"
                    )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                last = errors[-1] if errors else "no answer"
                raise BrokerError(
                    f"Apache Kafka did not serve metadata on {self.bootstrap} within "
                    f"{timeout:g}s ({last}; logs in {self._dir}):\n{self._log_tail()}"
                )
            try:
                metadata = admin.list_topics(timeout=min(1.0, remaining))
                if metadata.cluster_id == self.cluster_id and len(metadata.brokers) == len(self._nodes):
                    return
            except KafkaException as exc:
                errors.append(str(exc.args[0]))
            time.sleep(0.1)

    def _terminate(self, grace: float) -> None:
        """SIGTERM every node's process group, SIGKILL those still there after ``grace`` s, reap them."""
        procs, self._procs = self._procs, {}
        if procs:
            atexit.unregister(self.stop)
        for proc in procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("Kafka (pid %d) still running %gs after SIGTERM: SIGKILL", proc.pid, grace)
                _signal_group(proc, signal.SIGKILL)  # the node's whole process group
                proc.wait()
        for output in self._outputs.values():
            output.close()
        self._outputs = {}

    def _remove_dir(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _log_tail(self, node_id: int | None = None, lines: int = 30) -> str:
        """The last lines of a node's log and output (the first node's by default)."""
        node = next((n for n in self._nodes if n.node_id == node_id), self._nodes[0] if self._nodes else None)
        if node is None:
            return "(no log)"
        parts = []
        for path in (node.log_path, node.out_path):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name}\n" + ("\n".join(text) or "(empty)"))
        return "\n".join(parts) or "(no log)"


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped by a signal (Linux: state T in /proc/<pid>/task/*/stat)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks]
    except OSError:
        return False
    return bool(states) and all(state in ("T", "t") for state in states)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
