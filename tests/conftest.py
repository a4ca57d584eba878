"""Fixtures shared by every test that talks to a real Kafka-protocol broker.

One Apache Kafka broker (:mod:`events.dev.apache_kafka`, Java 17 and Maven) serves the test sessions
of all the pytest-xdist workers (started by their controller: :func:`_share_one_broker`);
``CUTLINE_TEST_BROKER=tansu`` runs them on the embedded Tansu broker instead (the explicit fallback
where Java's build tools are missing), and ``CUTLINE_BOOTSTRAP`` against an existing cluster. Tests
marked ``tansu`` run on a Tansu broker of their own whichever broker the others use: the demo's
default broker keeps tests of its own. Tests are marked by their directory: ``integration``,
``spark``, ``e2e``, ``compose``. Waiting is :func:`support.eventually`'s.
"""

from __future__ import annotations

import compileall
import contextlib
import functools
import os
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import uuid4

import jvm_archive
import pytest
import worker_logs
from alone import TURNS_VARIABLE, turn
from cpu_account import VARIABLE as CPU_ACCOUNT_VARIABLE
from cpu_account import CpuAccount
from support import (
    KAFKA_FETCH_WAIT_MS,
    SESSION_BROKER_VARIABLE,
    SESSION_KAFKA_HEAP,
    TEST_BROKER_VARIABLE,
    TEST_FETCH_WAIT_MS,
    TEST_PARTITIONS,
    broker_kind,
    kafka_bootstrap,
    local_broker,
)

from events.dev import apache_kafka

HERE = Path(__file__).resolve().parent
MARKED_DIRECTORIES = ("integration", "spark", "e2e", "compose")
PURE = ("unit", "property")
"""Directories of the tests that start no broker, coordinator or Spark: they take no turn (a timed
test runs beside them, its processes at a higher priority)."""


TEST_SESSION_TIMEOUT = "3"
"""``cutline coordinator --session-timeout`` for every worker the tests start on the brokers they
start (its ``envvar``, inherited by child processes): a failover waits for it, and on the embedded
broker a first join or a rebalance waits half of it. Not lower: a worker that a busy machine starves
of the CPU for a whole session timeout would be rebalanced away in the middle of a test. The tests'
Apache Kafka accepts it (``group.min.session.timeout.ms`` lowered: :data:`support.TEST_KAFKA_CONFIG`);
on an external cluster (``CUTLINE_BOOTSTRAP``) the default, 6 s, stays: Apache Kafka refuses less
by default."""


TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Java options of every Spark JVM the tests start (drivers, executors, a standalone master and
workers, the Connect server): short-lived JVMs on a small machine spend less CPU with only the
quick JIT compiler and one GC thread. They also map the archive of Spark's classes that
:mod:`jvm_archive` makes at the start of the session (once per pytest cache directory)."""


TEST_KAFKA_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true"
"""``KAFKA_JVM_PERFORMANCE_OPTS`` of every Apache Kafka node the tests start, instead of Kafka's G1
defaults: most nodes live for one test, and the JIT compiler of a JVM that starts is most of its CPU.
A node that started, took 1,000,000 records and stopped spent 3.4-3.5 CPU s this way against 6.5-6.7
with the defaults, and was ready in 2.0 s against 2.6; mapping the archive of Kafka's classes
(:mod:`jvm_archive`) takes one that starts, takes 20,000 and stops from 2.8 CPU s to 1.8-2.0
(docs/benchmarks.md, "The test suite")."""


TEST_PYTHON_DAEMON = "spark.python.daemon.module=spark_tasks.daemon"
"""Every Spark application the tests start forks its Python workers from :mod:`spark_tasks.daemon`,
which has imported ``pyspark.worker`` once (PySpark's own daemon imports it in every worker)."""

TEST_BLAS_THREADS = "1"
"""``OPENBLAS_NUM_THREADS`` of every process the tests start. NumPy's OpenBLAS starts a thread per
core when NumPy is imported, and that thread spins before it sleeps: about 0.055 CPU s in each
process that imports NumPy, which is every Python process of Spark (the daemon and its workers, the
data source's planners and runners, the drivers' own Python). No test multiplies matrices. In
``perf record`` of ``tests/spark/test_checkpointed_job.py`` the spinning thread took 3.8 % of all
samples (8 % of the Python processes'); ``perf stat -e task-clock`` of that file: 48.2 CPU s with
it against 50.4-53.5 without (docs/benchmarks.md, "The test suite")."""

SPARK_NICENESS = 10
"""The niceness of a test marked ``spark`` while it runs, and so of every process it starts (its
Spark JVMs, their Python workers, its coordinators): a CPU-bound JVM then takes a free core but
never one that another test is waiting for."""

TIMED_NICENESS = -10
"""The niceness of a test marked ``timed`` while it runs: it asserts a bound of the product (a
failover within a session timeout), which the coordinators it starts should meet as on a machine
of their own, not with a share of 2 cores that the suite's other workers keep busy.

Both are set only where the worker may set them back to 0 afterwards (as root): elsewhere the tests
run at the niceness they were started with."""

NICENESS = {"spark": SPARK_NICENESS, "timed": TIMED_NICENESS}

_archive_maker: jvm_archive.ArchiveMaker | None = None
_kafka_archive_maker: jvm_archive.KafkaArchiveMaker | None = None
_session_broker = contextlib.ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    global _archive_maker
    worker_logs.follow_launches()
    external = bool(os.environ.get("CUTLINE_BOOTSTRAP"))
    tansu = not external and broker_kind() == "tansu"
    os.environ.setdefault("CUTLINE_SESSION_TIMEOUT", "6" if external else TEST_SESSION_TIMEOUT)
    os.environ.setdefault("CUTLINE_FETCH_WAIT_MS", TEST_FETCH_WAIT_MS if tansu else KAFKA_FETCH_WAIT_MS)
    os.environ.setdefault("CUTLINE_PARTITIONS", str(TEST_PARTITIONS))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", TEST_BLAS_THREADS)
    # every Python process the tests start runs python_startup/sitecustomize.py first
    startup, inherited = str(HERE / "python_startup"), os.environ.get("PYTHONPATH", "")
    if startup not in inherited.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(entry for entry in (startup, inherited) if entry)
    # pytest-xdist's workers inherit what the controller (or the only process) set here
    cache = getattr(config, "cache", None)  # none with -p no:cacheprovider
    archive = jvm_archive.archive_path(cache.mkdir("cutline-jvm")) if cache is not None else None
    options = (
        TEST_JVM_OPTIONS if archive is None else f"{TEST_JVM_OPTIONS} {jvm_archive.java_options(archive)}"
    )
    if not hasattr(config, "workerinput"):
        os.environ.setdefault(TURNS_VARIABLE, tempfile.mkdtemp(prefix="cutline-test-turns-"))
        _compile_the_packages()
        if not external and not tansu and not _only_pure_tests(config):
            jars = _check_apache_kafka()
            _set_kafka_jvm_options(jars.classpath, cache.mkdir("cutline-jvm") if cache is not None else None)
            _share_one_broker(config)
    if archive is not None and not hasattr(config, "workerinput") and _may_start_spark(config):
        _archive_maker = jvm_archive.make_in_background(archive, TEST_JVM_OPTIONS)
    # inherited by every process the tests start: spark-submit's driver JVMs (in-process sessions,
    # the word count's and the demo's drivers, the Connect server), their executors, the daemons;
    # a driver's spark.* system properties are settings of its application (and its executors)
    os.environ.setdefault("SPARK_SUBMIT_OPTS", f"{options} -D{TEST_PYTHON_DAEMON}")
    os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", options)
    os.environ.setdefault(
        "PYSPARK_SUBMIT_ARGS", f'--conf "spark.executor.extraJavaOptions={options}" pyspark-shell'
    )


def _set_kafka_jvm_options(classpath: str, cache: Path | None) -> None:
    """``KAFKA_JVM_PERFORMANCE_OPTS`` for every Kafka node of the session (unless set already):
    :data:`TEST_KAFKA_JVM_OPTIONS`, mapping the archive of Kafka's classes, which is made in the
    background if it is not there yet (:mod:`jvm_archive`)."""
    global _kafka_archive_maker
    if os.environ.get(apache_kafka.PERFORMANCE_OPTIONS_ENV):
        return
    options = TEST_KAFKA_JVM_OPTIONS
    archive = jvm_archive.kafka_archive_path(cache, classpath, options) if cache is not None else None
    if archive is not None:
        _kafka_archive_maker = jvm_archive.make_kafka_archive_in_background(archive, options)
        options = f"{options} {jvm_archive.java_options(archive)}"
    os.environ[apache_kafka.PERFORMANCE_OPTIONS_ENV] = options


def _share_one_broker(config: pytest.Config) -> None:
    """Under pytest-xdist, start the one Apache Kafka broker that every worker's session shares (the
    ``bootstrap`` fixture, through :data:`~support.SESSION_BROKER_VARIABLE`), stopped with the run.
    Each test's topics, groups and transactional ids are its own (:func:`topic_prefix`), and a test
    that kills, pauses or reconfigures a broker starts one of its own. A broker per worker cost the
    idle work of two more brokers (about 1.4 CPU s a minute each: docs/benchmarks.md, "The test
    suite"). Started from the controller's main thread, which lives as long as the run: the broker
    ends with the process (:func:`support.local_broker`)."""
    if getattr(config.option, "dist", "no") == "no" or os.environ.get(SESSION_BROKER_VARIABLE):
        return
    shared = _session_broker.enter_context(local_broker(heap=SESSION_KAFKA_HEAP))
    os.environ[SESSION_BROKER_VARIABLE] = shared.bootstrap


PACKAGES = ("events", "coordinator", "spark_tasks")


def _compile_the_packages() -> None:
    """Byte-compile the project's packages once, before any test starts a process. Where
    ``PYTHONDONTWRITEBYTECODE`` is set, every coordinator, CLI and Spark worker the tests start would
    otherwise compile the modules it imports from source (``uv sync --compile-bytecode`` does the
    same for the dependencies, not for the project itself). An explicit compile writes the caches
    that the variable only stops imports from writing; Python checks them against the sources'
    modification times as usual."""
    for package in PACKAGES:
        compileall.compile_dir(HERE.parent / package, quiet=1)


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    _session_broker.close()
    if _archive_maker is not None:
        _archive_maker.stop()
    if _kafka_archive_maker is not None:
        _kafka_archive_maker.stop()
    turns = os.environ.get(TURNS_VARIABLE, "")
    if Path(turns).name.startswith("cutline-test-turns-"):  # made by this run, not one given to it
        shutil.rmtree(turns, ignore_errors=True)


def _may_start_spark(config: pytest.Config) -> bool:
    """Whether the run may start a Spark JVM: not with ``-m "not spark ..."``, nor when only the pure
    tests' directories are given (then no archive of Spark's classes is made)."""
    if "not spark" in (config.option.markexpr or ""):
        return False
    return not _only_pure_tests(config)


def _only_pure_tests(config: pytest.Config) -> bool:
    """Whether only the pure tests' directories (no broker, no Spark) are given."""
    pure = [HERE / directory for directory in PURE]
    given = [Path(arg.split("::", 1)[0]).resolve() for arg in config.args]
    return bool(given) and all(any(path.is_relative_to(p) for p in pure) for path in given)


def _check_apache_kafka() -> apache_kafka.KafkaJars:
    """Before any test starts: Java 17 and Apache Kafka's jars (fetched with Maven the first time on a
    machine, once for every xdist worker; returned), or a usage error that says what to install and
    how to run on the embedded Tansu broker instead. Never a silent skip."""
    from events.dev.apache_kafka import KafkaUnavailable, check_java, resolve_jars

    try:
        check_java()
        return resolve_jars()
    except KafkaUnavailable as exc:
        raise pytest.UsageError(
            f"{exc}\nThe tests run on Apache Kafka by default; to run them on the embedded Tansu broker "
            f"instead (pip only): {TEST_BROKER_VARIABLE}=tansu uv run pytest"
        ) from exc


FIRST = ("spark", "e2e", "integration")
"""Directories whose tests start first: they wait the most (on Spark, a coordinator's group join),
and a long one started last would finish alone."""

LONGEST_FIRST = (
    "tests/spark/test_connector_stateful.py",
    "tests/spark/test_exactly_once_connector_sink.py",
    "tests/spark/test_keyed_job.py",
    "tests/integration/test_exactly_once_broker_restart.py",
    "tests/integration/test_exactly_once_rescale_4_2_8.py",
    "tests/spark/test_exactly_once_executor_kill.py",
    "tests/spark/test_connector_latency.py",
    "tests/spark/test_kafka_sink.py",
    "tests/spark/test_connector_job.py",
    "tests/spark/test_kafka_source.py",
    "tests/integration/test_exactly_once_sink.py",
    "tests/spark/test_checkpointed_job.py",
    "tests/spark/test_wordcount_connector.py",
    "tests/spark/test_cluster.py",
    "tests/spark/test_kafka_sink_order.py",
)
"""The test files that take minutes, longest unit of the schedule first (as measured one by one on
2026-11-29, a file of :data:`EACH_TEST_A_UNIT` by its longest test): they start before every other
file, so that no long one starts last and ends alone while the other worker idles; the short files
fill in at the end."""

EACH_TEST_A_UNIT = (
    "tests/spark/test_cluster.py",
    "tests/spark/test_connect.py",
    "tests/spark/test_kafka_sink.py",
    "tests/spark/test_kafka_sink_order.py",
)
"""Test files whose tests take minutes each (Spark clusters, a Connect server, drivers SIGKILLed and
restarted): under ``--dist loadfile`` each of their tests is a unit of its own, so that the two
workers share them out (a module-scoped coordinator then starts in each worker that runs one).
Every other file is one unit, as ``loadfile`` makes it; a Spark test file that uses the session
fixture starts it in the worker that runs it, once per worker (tests/spark/conftest.py)."""


TIMED_FILES = (
    "tests/integration/test_ownership.py",
    "tests/integration/test_ownership_races.py",
    "tests/integration/test_apache_kafka_ownership.py",
    "tests/integration/test_rebalance_storm.py",
    "tests/integration/test_offset_probe_burst.py",
)
"""The test files with a test marked ``timed`` (checked at collection): together one unit of the
schedule, so they run one after another in one worker. Each a unit of its own, both workers would
take one and wait for each other's alone turns (:mod:`alone`), while one of them could run the pure
tests, which take no turn."""

TIMED_UNIT = "timed files"


def schedule_unit(nodeid: str) -> str:
    """The unit of the schedule that test ``nodeid`` goes out in (to one xdist worker): its file, but
    each test of :data:`EACH_TEST_A_UNIT` alone and all the :data:`TIMED_FILES` together."""
    path = nodeid.split("::", 1)[0]
    if path in TIMED_FILES:
        return TIMED_UNIT
    return nodeid if path in EACH_TEST_A_UNIT else path


def unlisted_timed_files(items: list[pytest.Item]) -> list[str]:
    """Files of tests marked ``timed`` that :data:`TIMED_FILES` does not name."""
    timed = {
        item.path.resolve().relative_to(HERE.parent).as_posix()
        for item in items
        if item.get_closest_marker("timed")
    }
    return sorted(timed - set(TIMED_FILES))


def _first(item: pytest.Item) -> int:
    """Where ``item``'s file starts in the run: the files of :data:`LONGEST_FIRST` in its order,
    then the directories of :data:`FIRST`, then the :data:`TIMED_FILES` (whose timed tests run
    alone, :mod:`alone`: last of the broker tests, while the other workers go on with the pure
    tests, which take no turn), then the rest."""
    relative = item.path.resolve().relative_to(HERE.parent).as_posix()
    if relative in LONGEST_FIRST:
        return LONGEST_FIRST.index(relative)
    if relative in TIMED_FILES:
        return len(LONGEST_FIRST) + len(FIRST)
    directory = item.path.resolve().relative_to(HERE).parts[0]
    return len(LONGEST_FIRST) + (FIRST.index(directory) if directory in FIRST else len(FIRST) + 1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under tests/<name>/ with the marker <name>; put the longest files first, then
    the slowest directories, then the files of timed tests (each file keeps its order), so that
    pytest-xdist hands them out in that order."""
    for item in items:
        relative = item.path.resolve().relative_to(HERE)
        if len(relative.parts) > 1 and relative.parts[0] in MARKED_DIRECTORIES:
            item.add_marker(getattr(pytest.mark, relative.parts[0]))
    unlisted = unlisted_timed_files(items)
    if unlisted:
        raise pytest.UsageError(
            f"tests marked timed in files that TIMED_FILES (tests/conftest.py) does not name: {unlisted}"
        )
    items.sort(key=_first)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, but in the units of :func:`schedule_unit`; units go out in the order of the
    collection (``--no-loadscope-reorder``: :data:`LONGEST_FIRST` first)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LoadFileLongTestsApart(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return schedule_unit(nodeid)

    return LoadFileLongTestsApart(config, log)


@functools.cache
def _may_renice() -> bool:
    """Whether this process may raise its niceness and lower it again, below 0 too (tried in a child)."""
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.setpriority(os.PRIO_PROCESS, 0, SPARK_NICENESS)
            os.setpriority(os.PRIO_PROCESS, 0, TIMED_NICENESS)
            os.setpriority(os.PRIO_PROCESS, 0, 0)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) == 0


@contextmanager
def _priority(niceness: int) -> Iterator[None]:
    """This process (and what it starts meanwhile) at ``niceness``, where it may set it back after."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if before == niceness or not _may_renice():
        yield
        return
    os.setpriority(os.PRIO_PROCESS, 0, niceness)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


def _pure(item: pytest.Item) -> bool:
    return item.path.resolve().relative_to(HERE).parts[0] in PURE


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A test runs (sets up, calls, tears down) in its turn: one marked ``timed`` alone, while no other
    xdist worker runs a test but a pure one (:mod:`alone`); one marked ``spark`` or ``timed`` at its
    :data:`NICENESS`."""
    niceness = next((n for marker, n in NICENESS.items() if item.get_closest_marker(marker)), None)
    worker_logs.running_test(item.nodeid)
    with contextlib.ExitStack() as stack:
        turns, asked = os.environ.get(TURNS_VARIABLE), time.time()
        if turns and not _pure(item):
            stack.enter_context(turn(Path(turns), alone=item.get_closest_marker("timed") is not None))
        waited = time.time() - asked
        if niceness is not None:
            stack.enter_context(_priority(niceness))
        account = _cpu_account(item.config)
        if account is not None:
            stack.enter_context(account.measuring(item.nodeid, asked, waited))
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report ends with the logs of the coordinator workers it ran (:mod:`worker_logs`)."""
    report = yield
    if report.failed:
        logs = worker_logs.report(item.nodeid)
        if logs:
            report.sections.append(("coordinator workers' logs", logs))
    return report


@functools.cache
def _cpu_account(config: pytest.Config) -> CpuAccount | None:
    """Where this process notes each test's CPU (:mod:`cpu_account`), if ``CUTLINE_TEST_CPU`` says."""
    directory = os.environ.get(CPU_ACCOUNT_VARIABLE)
    if not directory:
        return None
    return CpuAccount(Path(directory), getattr(config, "workerinput", {}).get("workerid", "main"))


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    """``bootstrap.servers`` of the broker shared by the session: the one the xdist workers share
    (:func:`_share_one_broker`), or one of this process's own, Apache Kafka or what
    ``CUTLINE_TEST_BROKER``/``CUTLINE_BOOTSTRAP`` say, started at the usual priority, whichever test
    needs it first."""
    shared = os.environ.get(SESSION_BROKER_VARIABLE)
    if shared:
        yield shared
        return
    with contextlib.ExitStack() as stack:
        with _priority(0):
            address = stack.enter_context(kafka_bootstrap())
        yield address


@pytest.fixture
def topic_prefix() -> str:
    """A topic-name prefix unique to one test, so tests never see each other's data."""
    return f"t{uuid4().hex[:8]}."


BUCKET = "cutline-checkpoints"


@pytest.fixture(name="s3")
def _s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto's S3 server on a free port, the AWS variables pointing at it (child processes inherit
    them), and an s3fs file system with the bucket ``BUCKET`` (as s3fs's own tests do)."""
    s3fs = pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    from events.dev.broker import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    # moto keeps its buckets in this process, across servers: start from none, as a new S3 would.
    reset = urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST")
    urllib.request.urlopen(reset, timeout=10).close()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    filesystem = s3fs.S3FileSystem()
    filesystem.mkdir(BUCKET)
    try:
        yield filesystem
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
