"""A SparkSession with Spark's own Kafka connector, in a process of its own, answering reads.

The connector's jars reach Spark's driver only when its JVM starts (``spark.jars``), and the test
process's JVM serves the shared session of tests/spark/conftest.py without them; so
tests/spark/test_kafka_connector.py asks this process, started once per module, to run its queries.
It makes its session as a user does: ``with_kafka_connector(SparkSession.builder...)``.

One JSON request a line on stdin, one JSON answer a line on stdout (after :data:`ANSWER`; Spark's
own output goes to stderr). A row is ``[key, value, topic, partition, offset]``, key and value
decoded as UTF-8.

- ``{"read": options}``: a batch read (``spark.read.format("kafka")``), its rows;
- ``{"stream": options, "name": name, "available_now": bool}``: a streaming read
  (``spark.readStream.format("kafka")``) into the memory table ``name``, with
  ``Trigger.AvailableNow`` or every 100 ms;
- ``{"finish": name}``: waits until the query ends (an ``available_now`` one), its table's rows;
- ``{"rows": name}``: the table's rows so far;
- ``{"stop": name}``: stops the query.

``python connector_session.py job --source kafka|cutline-kafka <word count options>`` is a job's
driver instead: :func:`spark_tasks.wordcount.run_wordcount` (the keyed word count with ``--keyed``)
on a session with the connector's jars (with ``--remote``, a Spark Connect server's that has them),
reading with the source named, its events one JSON line each on stdout (as ``python -m
spark_tasks.wordcount``'s). SIGTERM stops it (CANCELED).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

ANSWER = "connector-session: "
COLUMNS = ("key", "value", "topic", "partition", "offset")

Row = tuple[str | None, str | None, str, int, int]


class ConnectorSession:
    """The test side: starts this module as a process and sends it requests."""

    def __init__(self, log_path: Path, timeout: float = 240.0) -> None:
        self.log_path = log_path
        self.timeout = timeout
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._log = log_path.open("ab")
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
        self._process = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
        )
        threading.Thread(target=self._pump, args=(self._process.stdout,), daemon=True).start()
        self._ready: dict[str, Any] | None = None

    @property
    def ready(self) -> dict[str, Any]:
        """The session's first answer, once it is up: Spark's and the connector's versions, the jars.
        Not awaited at start, so that the test's broker starts meanwhile."""
        if self._ready is None:
            self._ready = self._answer()
        return self._ready

    def _pump(self, stdout: IO[str]) -> None:
        for line in stdout:
            if line.startswith(ANSWER):
                self._answers.put(line.removeprefix(ANSWER))
        self._answers.put(None)

    def _answer(self) -> dict[str, Any]:
        try:
            line = self._answers.get(timeout=self.timeout)
        except queue.Empty:
            raise AssertionError(f"no answer within {self.timeout:g}s; log:\n{self.tail()}") from None
        if line is None:
            raise AssertionError(
                f"the connector session exited ({self._process.poll()}); log:\n{self.tail()}"
            )
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise AssertionError(f"the connector session failed: {answer['error']}")
        return answer

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin is not None
        assert self.ready
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        return self._answer()

    def read(self, **options: str) -> list[Row]:
        return rows(self.ask({"read": options})["rows"])

    def stream(self, name: str, *, available_now: bool = False, **options: str) -> None:
        self.ask({"stream": options, "name": name, "available_now": available_now})

    def finish(self, name: str) -> list[Row]:
        return rows(self.ask({"finish": name})["rows"])

    def rows(self, name: str) -> list[Row]:
        return rows(self.ask({"rows": name})["rows"])

    def stop(self, name: str) -> None:
        self.ask({"stop": name})

    def tail(self, lines: int = 40) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()  # the session stops Spark and exits at the end of its input
        try:
            self._process.wait(60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()


def position(row: Row) -> tuple[str, int, int]:
    """A row's topic, partition and offset: the order rows are compared in."""
    return row[2], row[3], row[4]


def rows(answer: list[list[Any]]) -> list[Row]:
    return sorted(
        ((key, value, topic, partition, offset) for key, value, topic, partition, offset in answer),
        key=position,
    )


class ConnectorDriver:
    """A word count job's driver on the connector (``python connector_session.py job``), a child
    process in a process group of its own; its JSON events as they come (:meth:`seen`)."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self.events: list[dict[str, Any]] = []
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> ConnectorDriver:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, __file__, "job", *self.args],
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                text=True,
                start_new_session=True,
            )
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        return self

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                self.events.append(event)

    def seen(self, event: str) -> list[dict[str, Any]]:
        """The driver's ``event`` lines so far; raises with its log's tail if it exited failing."""
        assert self.process is not None
        code = self.process.poll()
        if code not in (None, 0):
            raise AssertionError(f"the driver exited with {code}:\n{self.tail()}")
        return [e for e in list(self.events) if e.get("event") == event]

    def tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(line for line in text if not line.lstrip().startswith("at "))[-6000:]

    def kill(self) -> None:
        """SIGKILL the driver and its process group (its Spark JVM, its Python workers)."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self, timeout: float = 90.0) -> int:
        """SIGTERM (the job stops CANCELED) and wait; SIGKILL after ``timeout``. Its exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode


# --------------------------------------------------------------------------- the session's side


def _collect(frame: Any) -> list[list[Any]]:
    def text(data: bytes | bytearray | None) -> str | None:
        return None if data is None else bytes(data).decode()

    return [
        [text(r.key), text(r.value), r.topic, r.partition, r.offset] for r in frame.select(*COLUMNS).collect()
    ]


class Server:
    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.queries: dict[str, Any] = {}

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        if "read" in request:
            return {"rows": _collect(self.spark.read.format("kafka").options(**request["read"]).load())}
        if "stream" in request:
            name = request["name"]
            reader = self.spark.readStream.format("kafka").options(**request["stream"]).load()
            writer = reader.select(*COLUMNS).writeStream.format("memory").queryName(name)
            trigger = (
                {"availableNow": True} if request["available_now"] else {"processingTime": "100 milliseconds"}
            )
            self.queries[name] = writer.trigger(**trigger).start()
            return {"started": name}
        if "finish" in request:
            name = request["finish"]
            self.queries[name].awaitTermination()
            return {"rows": _collect(self.spark.table(name))}
        if "rows" in request:
            return {"rows": _collect(self.spark.table(request["rows"]))}
        if "stop" in request:
            self.queries.pop(request["stop"]).stop()
            return {"stopped": request["stop"]}
        raise ValueError(f"unknown request {request}")


def answer(message: dict[str, Any]) -> None:
    sys.stdout.write(ANSWER + json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    from pyspark.sql import SparkSession

    from spark_tasks.connector import kafka_connector, with_kafka_connector

    connector = kafka_connector()
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("cutline-kafka-connector-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
    )
    spark = with_kafka_connector(builder, connector).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    answer({"spark": spark.version, "connector": connector.version, "jars": connector.spark_jars})
    server = Server(spark)
    try:
        for line in sys.stdin:
            try:
                answer(server.handle(json.loads(line)))
            except Exception as exc:  # noqa: BLE001 (the test gets it as its failure)
                answer({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        spark.stop()


def run_job(argv: list[str]) -> int:
    """A word count job's driver on a session with the connector (see the module docstring)."""
    import logging

    from events.stopping import StopSignals
    from spark_tasks.connector import kafka_connector
    from spark_tasks.session import connect_spark, spark_session
    from spark_tasks.wordcount import build_parser, job_settings, run_wordcount

    parser = build_parser()  # its --source: here the connector unless cutline-kafka is asked
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    settings = job_settings(args, args.source or "kafka")
    with StopSignals() as stop:
        if args.remote:  # the Connect server has the connector's jars (its own spark.jars)
            spark = connect_spark(args.remote, conf=dict(args.conf))
        else:
            conf = {**dict(args.conf), "spark.jars": kafka_connector().spark_jars}
            spark = spark_session(args.master, f"cutline-{args.job}", conf=conf)
        try:
            job = run_wordcount(
                spark, settings, args.out, trigger=f"{args.trigger_ms} milliseconds", stop=stop
            )
        finally:
            spark.stop()
    print(
        json.dumps(
            {
                "event": "stopped",
                "attempt": job.attempt,
                "completed": [c.checkpoint_id for c in job.completed],
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["job"]:
        sys.exit(run_job(sys.argv[2:]))
    main()
