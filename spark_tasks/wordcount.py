"""The Spark word count that checkpoints with cutline: the tests', the benchmark's and the demo's job.

    python -m spark_tasks.wordcount --bootstrap 127.0.0.1:9092 --job wc --topic words \\
        --work-dir /tmp/wc --location file:///tmp/wc/checkpoints --out /tmp/wc/out [--interval-ms 1000]
        [--keyed 8] [--source kafka | cutline-kafka] [--master local[2] | --remote sc://127.0.0.1:15002]

Each input partition keeps a ``{word: count}`` state (:data:`WORD_COUNT`). Every
micro-batch writes a row per word it saw: the word's new count, how many it
``added``, and the offset the count is valid after. The rows go to ``--out``
through :class:`~spark_tasks.sink.CutFileSink`, whose files hold each record's
output exactly once across crashes and restores (it rolls back what a crashed
attempt wrote after the restored checkpoint). :func:`read_counts` sums ``added``
over those raw rows: no de-duplication, so a row written twice or lost shows.
With ``--kafka-out TOPIC`` the same rows also go to a Kafka topic (key: the word, value: the row
as JSON) through :class:`~spark_tasks.kafka_sink.ExactlyOnceKafkaSink`, visible to
``read_committed`` readers once their checkpoint completes (:func:`read_kafka_counts`).

The count reads Kafka with Spark's own ``kafka`` connector where its jars resolve
(:mod:`spark_tasks.connector`: Java and Maven, or a cache), and with ``cutline-kafka`` otherwise;
``--source`` chooses (:func:`spark_tasks.source_choice.choose_source`). The first line it prints
says which, and why (``source``). On a secured cluster (``--kafka-config``, ``CUTLINE_KAFKA_CONFIG``)
the connector gets the same settings as its Java client's ``kafka.*`` options
(:mod:`spark_tasks.connector_security`); settings with no exact translation make the count read
with ``cutline-kafka``, and ``--source kafka`` refused.

On start the job restores from the latest completed checkpoint of its job id
(``--restore`` for a checkpoint id or a savepoint directory, ``--no-restore`` to
start empty). It stops on SIGTERM/SIGINT (CANCELED), after ``--idle-stop`` seconds
without input (FINISHED; counted from the first micro-batch, and barrier rows, the connector's
barrier source's included, are not input), or
when the coordinator reports too many checkpoint failures (FAILING: the restart strategy decides;
exit 3). It prints one JSON line per event worth knowing
(``source``, ``restored``, ``running``, ``progress`` after each micro-batch with the input rows so far
(barrier rows included), ``completed``, ``failed``, ``stopped``) to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer

from events.kafka.client_config import client_properties
from events.kafka.clients import consumer_config, partition_count, read_partition_to_end
from events.stopping import Stop, StopSignals
from events.wire.codec import use_wire
from events.wire.records import CheckpointConfig
from events.wire.schema_registry import wire_from_environment
from events.wire.topics import DEFAULT_PREFIX
from spark_tasks.barrier_source import BarrierOffset
from spark_tasks.connector import kafka_connector
from spark_tasks.job import CheckpointedJob, CheckpointFailuresExceeded, JobSettings, Restore, Source
from spark_tasks.kafka_sink import ExactlyOnceKafkaSink
from spark_tasks.kafka_source.offsets import barrier_of, from_offsets, marker_of
from spark_tasks.keyed import KeyedBatchStep
from spark_tasks.sink import CutFileSink, read_rows
from spark_tasks.source_choice import (
    CONNECTOR,
    CUTLINE_KAFKA,
    SourceChoice,
    SourceUnavailable,
    choose_source,
    security_refusal,
)
from spark_tasks.state import KafkaRecord, StatefulStep

log = logging.getLogger(__name__)

OUTPUT_SCHEMA = "word string, count long, added long, topic string, partition int, offset long"


def count_words(state: dict[str, int], records: Sequence[KafkaRecord]) -> tuple[dict[str, int], list[Any]]:
    """Count the lower-cased, whitespace-separated words of ``records``.

    One row per word that changed: ``(word, count, added, topic, partition, offset)``,
    ``count`` being the partition's count after ``offset`` and ``added`` how many of
    the word ``records`` held.
    """
    changed: dict[str, int] = {}
    added: Counter[str] = Counter()
    for record in records:
        if record.value is None:
            continue
        for word in record.value.decode("utf-8", "replace").split():
            word = word.lower()
            state[word] = state.get(word, 0) + 1
            changed[word] = record.offset
            added[word] += 1
    if not records:
        return state, []
    topic, partition = records[0].topic, records[0].partition
    return state, [
        (word, state[word], added[word], topic, partition, offset) for word, offset in sorted(changed.items())
    ]


WORD_COUNT: StatefulStep[dict[str, int]] = StatefulStep(
    update=count_words, output_schema=OUTPUT_SCHEMA, initial=dict
)


KEYED_OUTPUT_SCHEMA = "word string, count long, added long"


_SPLIT_ONLY_IN_PYTHON = r"[\x1c-\x1f]"
"""ASCII separators ``str.split()`` splits on and Arrow's ``ascii_split_whitespace`` does not."""


def _words(value: bytes | None) -> list[str]:
    """One value's words, as the word count has always cut them: decoded (invalid bytes replaced),
    split on whitespace, lower-cased."""
    if value is None:
        return []
    return [word.lower() for word in value.decode("utf-8", "replace").split()]


def words_of(records: pa.RecordBatch) -> pa.Table:
    """The keyed word count's pairs, ``(word, 1)`` for every word of every record, in input order.

    Arrow compute lower-cases and splits the ASCII values of the batch at once; any other value
    (non-ASCII, not UTF-8, or holding a separator only Python splits on) goes through
    :func:`_words`, so every key is what ``str.lower``/``str.split`` make of it either way.
    """
    values = records.column("value")
    try:
        text = values.cast(pa.string())
    except pa.ArrowInvalid:  # some value is not UTF-8: the whole batch goes the slow way
        text = None
    if text is None:
        fast = np.zeros(len(values), bool)
    else:
        plain = pc.and_(
            pc.string_is_ascii(text), pc.invert(pc.match_substring_regex(text, _SPLIT_ONLY_IN_PYTHON))
        )
        fast = pc.fill_null(plain, True).to_numpy(zero_copy_only=False)
    rows: list[Any] = []
    words: list[Any] = []
    if text is not None and fast.any():
        fast_rows = np.flatnonzero(fast)
        split = pc.ascii_split_whitespace(pc.ascii_lower(text.take(pa.array(fast_rows))))
        found, parents = pc.list_flatten(split), pc.list_parent_indices(split)
        kept = pc.not_equal(found, "")
        words.append(found.filter(kept))
        rows.append(pa.array(fast_rows[parents.filter(kept).to_numpy()], pa.int32()))
    slow = np.flatnonzero(~fast)
    if len(slow):
        cut = [(int(i), word) for i in slow for word in _words(values[int(i)].as_py())]
        rows.append(pa.array([i for i, _ in cut], pa.int32()))
        words.append(pa.array([word for _, word in cut], pa.string()))
    if not rows:
        return pa.table(
            {
                "row": pa.array([], pa.int32()),
                "key": pa.array([], pa.string()),
                "value": pa.array([], pa.int64()),
            }
        )
    pairs = pa.table({"row": pa.concat_arrays(rows), "key": pa.concat_arrays(words)})
    if len(slow) and len(rows) > 1:
        pairs = pairs.sort_by("row")  # stable: a record's words stay in order
    return pairs.append_column("value", pa.array(np.ones(pairs.num_rows, np.int64)))


def add_up(words: pa.Array, ones: pa.ListArray, counts: pa.Array) -> tuple[pa.Array, pa.Table]:
    """Each word's new count: its count before the batch (null for a new word) plus what the batch
    added; one row ``(word, count, added)`` per word the micro-batch saw."""
    flat = pc.list_flatten(ones).to_numpy()
    starts = ones.offsets.to_numpy()[:-1]  # every word the batch saw has at least one value
    added = pa.array(np.add.reduceat(flat, starts) if len(flat) else np.zeros(0, np.int64))
    total = pc.add(pc.fill_null(counts, 0), added)
    return total, pa.table({"word": words, "count": total, "added": added})


def counts_as_bytes(counts: pa.Array) -> pa.Array:
    """Counts as the bytes the keyed store keeps: the decimal digits (``str(count).encode()``)."""
    return counts.cast(pa.string()).cast(pa.binary())


def counts_from_bytes(stored: pa.Array) -> pa.Array:
    return stored.cast(pa.string()).cast(pa.int64())


KEYED_WORD_COUNT = KeyedBatchStep(
    pairs_of=words_of,
    update_batch=add_up,
    output_schema=KEYED_OUTPUT_SCHEMA,
    value_type=pa.int64(),
    encode_states=counts_as_bytes,
    decode_states=counts_from_bytes,
    uid="word-count",
)
"""The word count as a keyed job (``--keyed N``): one global count per word, kept by the shuffle
partition that owns the word's key group; its rows are the final counts, nothing is summed outside.
Vectorized: each micro-batch is routed and counted with Arrow compute (docs/spark.md, "Keyed state
across a shuffle")."""


def final_counts(*outs: Path) -> dict[str, int]:
    """The keyed word count's result: each word's ``count`` in the last raw row that has it."""
    counts: dict[str, int] = {}
    for out in outs:
        for row in read_rows(out):
            counts[row["word"]] = row["count"]
    return counts


def counts_of(rows: Iterable[Mapping[str, Any]]) -> tuple[Counter[str], dict[str, int]]:
    """The words counted in output rows (``added`` summed, no de-duplication) and each word's
    ``count`` in the last row that has it. Pure."""
    counted: Counter[str] = Counter()
    final: dict[str, int] = {}
    for row in rows:
        counted[row["word"]] += row["added"]
        final[row["word"]] = row["count"]
    return counted, final


def read_kafka_counts(
    bootstrap: str, topic: str, isolation: str = "read_committed"
) -> tuple[Counter[str], dict[str, int]]:
    """:func:`counts_of` the rows ``--kafka-out`` wrote, as a reader with ``isolation`` sees them
    (a word's rows are in one partition, in order: its last row has its last count)."""
    consumer = Consumer(consumer_config(bootstrap, extra={"isolation.level": isolation}))
    try:
        rows = [
            json.loads(message.value() or b"")
            for partition in range(partition_count(consumer, topic))
            for message in read_partition_to_end(consumer, topic, partition)
        ]
    finally:
        consumer.close()
    return counts_of(rows)


def read_counts(*outs: Path) -> Counter[str]:
    """The words counted in sink directories: ``added`` summed over every raw row of their output files.

    Several directories: the outputs of a job and of the job restored from its savepoint.
    """
    counts: Counter[str] = Counter()
    for out in outs:
        for row in read_rows(out):
            counts[row["word"]] += row["added"]
    return counts


MAX_OFFSETS_PER_TRIGGER = 20_000
"""The word count's default cap on one micro-batch (``--max-offsets-per-trigger``, the cap
``bench/bench_spark.py`` uses): a stop waits for the batch in flight, so a backlog is read in
bounded batches rather than in one that outlasts ``cutline run``'s stop timeout."""


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}), flush=True)


def input_rows(progress: Mapping[str, Any]) -> int:
    """A micro-batch's input rows, from its progress: Spark's total, or on Spark Connect (whose
    progress reports no total) the sum of its sources' rows."""
    total = progress.get("numInputRows")
    if total is None:
        return sum(int(source.get("numInputRows") or 0) for source in progress.get("sources") or ())
    return int(total)


def records_read(progress: Mapping[str, Any]) -> int:
    """The Kafka records a micro-batch read, from its progress: its input rows less those that are no
    record (:func:`rows_not_read`)."""
    rows = input_rows(progress)
    for source in progress.get("sources") or ():
        rows -= rows_not_read(source)
    return max(rows, 0)


def rows_not_read(source: Mapping[str, Any]) -> int:
    """The rows of one source of a micro-batch that are no Kafka record: every row of the connector's
    ``cutline-barriers`` source (one per barrier), and cutline-kafka's barrier and latency marker rows
    (one per partition each when a new one is folded into the batch's end offset)."""
    end: Any = source.get("endOffset")
    start: Any = source.get("startOffset")
    try:
        BarrierOffset.from_json(end)
    except ValueError:
        pass  # not the barrier source's offset
    else:
        return int(source.get("numInputRows") or 0)
    try:
        rows = 0
        barrier, marker = barrier_of(end), marker_of(end)
        if barrier is not None and barrier != barrier_of(start):
            rows += len(from_offsets(end))
        if marker is not None and marker != marker_of(start):
            rows += len(from_offsets(end))
        return rows
    except ValueError:  # not cutline-kafka offsets (Spark's kafka connector, another source): records
        return 0


def caught_up(progress: Mapping[str, Any]) -> bool:
    """Whether a micro-batch read up to the latest offsets its source reported when it was planned
    (True for a source that reports none): a batch after it reads only what arrived since."""
    for source in progress.get("sources") or ():
        try:
            latest = from_offsets(source.get("latestOffset"))
            end = from_offsets(source.get("endOffset"))
        except ValueError:  # none reported ("null"), or not cutline-kafka offsets
            continue
        if any(end.get(tp, -1) < offset for tp, offset in latest.items()):
            return False
    return True


@dataclasses.dataclass
class IdleClock:
    """When ``--idle-stop`` is due: ``seconds`` after the last micro-batch that read records, counted
    from the first micro-batch (never while the JVM and the query start up), and only once a batch
    has read everything its source had (never while a capped backlog is still being read)."""

    seconds: float | None
    last_input: float | None = None
    caught_up: bool = False

    def batch(self, records: int, now: float, *, caught_up: bool = True) -> None:
        """A micro-batch ended at ``now`` having read ``records`` Kafka records; ``caught_up``: all
        its source had when it was planned (:func:`caught_up`)."""
        if records > 0 or self.last_input is None:
            self.last_input = now
        self.caught_up = caught_up

    def expired(self, now: float) -> bool:
        return (
            self.seconds is not None
            and self.last_input is not None
            and self.caught_up
            and now - self.last_input > self.seconds
        )


@dataclasses.dataclass(frozen=True)
class FilesAndKafka:
    """A ``foreachBatch`` function that writes each micro-batch's rows to Kafka and to files, both
    exactly once: the rows are computed once (persisted) and given to each sink. The Kafka sink goes
    first: at a barrier batch it stages the output before the batch runs (its tasks ack then), so a
    checkpoint never completes before its output is staged."""

    files: CutFileSink
    kafka: ExactlyOnceKafkaSink

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        from pyspark.sql.functions import col, struct, to_json

        batch_df.persist()
        try:
            self.kafka(
                batch_df.select(col("word").alias("key"), to_json(struct("*")).alias("value")), batch_id
            )
            self.files(batch_df, batch_id)
        finally:
            batch_df.unpersist()


def run_wordcount(
    spark: Any,
    settings: JobSettings,
    out: Path,
    *,
    trigger: str = "200 milliseconds",
    stop: Stop | None = None,
    idle_stop: float | None = None,
    kafka_topic: str | None = None,
    on_event: Any = _emit,
) -> CheckpointedJob:
    """Run the word count until ``stop`` is set, ``idle_stop`` s pass without input, or it fails;
    with ``kafka_topic``, its rows go to that topic too (:class:`FilesAndKafka`)."""
    stop = stop or threading.Event()
    job = CheckpointedJob(spark, settings)
    out.mkdir(parents=True, exist_ok=True)
    sink = CutFileSink(job, out)
    # it recovers before the query starts: it commits again what a dead driver's completed checkpoints staged
    kafka = None if kafka_topic is None else ExactlyOnceKafkaSink(job, topic=kafka_topic, uid="word-counts")
    if job.restored is not None:
        on_event(
            "restored",
            checkpoint_id=job.restored.checkpoint_id,
            kind=str(job.restored.kind),
            offsets=dict(job.restored.offsets),
            attempt=job.attempt,
            rolled_back=len(sink.rolled_back),
            kafka_committed_again=[] if kafka is None else list(kafka.recovered.plan.commit),
        )
    if settings.keyed_partitions:
        counts = job.stream_keyed(
            dataclasses.replace(KEYED_WORD_COUNT, max_parallelism=settings.max_parallelism)
        )
    else:
        counts = job.stream(WORD_COUNT)
    writer = sink if kafka is None else FilesAndKafka(sink, kafka)
    job.start(counts.writeStream.foreachBatch(writer).trigger(processingTime=trigger))
    reported = 0
    records = 0
    last_batch: int | None = None
    idle = IdleClock(idle_stop)
    running = False
    try:
        while not stop.wait(0.1):
            if not job.query.isActive:
                break
            if not running and job.running:
                running = True
                on_event("running", attempt=job.attempt, tasks=job.tasks)
            progress = job.query.lastProgress
            if progress and progress.get("batchId") != last_batch:
                last_batch = progress.get("batchId")
                records += input_rows(progress)
                idle.batch(records_read(progress), time.monotonic(), caught_up=caught_up(progress))
                on_event(
                    "progress",
                    batch=last_batch,
                    records=records,
                    rows_per_second=progress.get("processedRowsPerSecond"),
                )
            for completed in job.completed[reported:]:
                on_event(
                    "completed",
                    checkpoint_id=completed.checkpoint_id,
                    kind=str(completed.kind),
                    offsets=dict(completed.offsets),
                    handles=len(completed.handles),
                    duration_ms=completed.duration_ms,
                )
            reported = len(job.completed)
            if idle.expired(time.monotonic()):
                break
    finally:
        if job.query.isActive:
            job.stop(finished=not stop.is_set())
        try:
            job.await_termination(30)
            if kafka is not None:
                kafka.close()  # once the journal is read to its end: a stop savepoint's output is committed
        finally:
            job.close()
    return job


# ------------------------------------------------------------- as a child process


class SparkDriver:
    """``python -m spark_tasks.wordcount`` in a child process and its own process group.

    The job prints one JSON line per event (``restored``, ``running``, ``progress``,
    ``completed``, ``stopped``, ``failed``); :attr:`events` holds those of the
    current process. Each start is a new attempt with its own log.
    """

    def __init__(self, args: list[str], log_dir: Path, *, supervisor: Sequence[str] | None = None) -> None:
        self.args = args
        self.log_dir = log_dir
        self.supervisor = None if supervisor is None else list(supervisor)
        """``cutline run`` options: the driver runs under it, which restarts it as the journal says."""
        self.starts = 0
        self.events: list[dict[str, Any]] = []
        self.supervisor_lines: list[str] = []
        """What ``cutline run`` printed (each attempt's start, failure and restart decision)."""
        self.process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"spark-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        self.events = []
        command = [sys.executable, "-m", "spark_tasks.wordcount", *self.args]
        if self.supervisor is not None:
            command = [sys.executable, "-m", "coordinator.cli", "run", *self.supervisor, "--", *command]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )
        assert self.process.stdout is not None
        self._reader = threading.Thread(
            target=self._read,
            args=(
                self.process.stdout,
                self.events,
                self.log_dir / f"spark-{self.starts}.events.jsonl",
                self.supervisor_lines,
            ),
            name="cutline-demo-spark",
            daemon=True,
        )
        self._reader.start()

    @staticmethod
    def _read(stdout: IO[bytes], events: list[dict[str, Any]], copy: Path, other: list[str]) -> None:
        with copy.open("ab") as kept:
            for line in stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    if line.strip():
                        other.append(line.decode("utf-8", "replace").rstrip())
                    continue
                if isinstance(event, dict):
                    event["at"] = round(time.time(), 3)
                    kept.write(json.dumps(event).encode() + b"\n")
                    kept.flush()
                    events.append(event)

    def seen(self, event: str) -> list[dict[str, Any]]:
        """The ``event`` lines of the current driver process (under ``cutline run``: its latest attempt)."""
        pid = self.driver_pid
        return [e for e in list(self.events) if e.get("event") == event and e.get("pid", pid) == pid]

    @property
    def driver_pid(self) -> int | None:
        """The pid of the driver process: the child, or under ``cutline run`` the latest attempt's."""
        if self.supervisor is None:
            return self.pid
        pids = [e["pid"] for e in list(self.events) if "pid" in e]
        return pids[-1] if pids else None

    def last(self, event: str) -> dict[str, Any] | None:
        found = self.seen(event)
        return found[-1] if found else None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def returncode(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def kill(self) -> None:
        """SIGKILL to the driver's process group: the Python driver, its JVM and its workers (under
        ``cutline run``, those of the current attempt: the supervisor then reports it failed)."""
        if self.process is None:
            return
        if self.supervisor is None:
            self._kill_everything()
        elif self.driver_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.driver_pid, signal.SIGKILL)

    def _kill_everything(self) -> None:
        """SIGKILL to the child's process group and (under ``cutline run``) the attempt's."""
        if self.process is None:
            return
        groups = [self.process.pid] if self.supervisor is None else [self.process.pid, self.driver_pid]
        for group in groups:
            if group is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM (the job stops its query: CANCELED), SIGKILL after ``grace`` s; idempotent.

        Under ``cutline run``, a second SIGTERM after ``grace`` s has it SIGKILL the attempt's
        process group at once, and a SIGKILL of everything follows 3 s later if it has not exited.
        Returns the driver's exit code (None if it was never started).
        """
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                if self.supervisor is not None:
                    self.process.send_signal(signal.SIGTERM)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.process.wait(3)
                self._kill_everything()
        code = self.process.returncode
        self._kill_everything()  # whatever the driver left behind in its group
        if self._reader is not None:
            self._reader.join(5)
        return code

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def warnings(self, limit: int = 12) -> list[str]:
        """cutline's own warnings and errors in the log (:func:`cutline_warnings`), which a tail of
        Spark's lines may have scrolled past."""
        try:
            return cutline_warnings(self.log_path.read_text(errors="replace"), limit)
        except OSError:
            return []


CUTLINE_LOGGERS = ("spark_tasks", "events", "coordinator")
"""The packages whose log lines :func:`cutline_warnings` picks out of a driver's log."""


def cutline_warnings(log: str, limit: int = 12) -> list[str]:
    """The last ``limit`` WARNING and ERROR lines of cutline's own loggers in a driver's log, as
    ``logging.basicConfig``'s format writes them (``LEVEL:logger:message``)."""
    picked = [
        line
        for line in log.splitlines()
        if line.startswith(("WARNING:", "ERROR:", "CRITICAL:"))
        and line.split(":", 2)[1].split(".", 1)[0] in CUTLINE_LOGGERS
    ]
    return picked[-limit:]


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m spark_tasks.wordcount``."""
    parser = argparse.ArgumentParser(
        prog="python -m spark_tasks.wordcount", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--topic", action="append", required=True, help="input topic (repeat for more)")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--location", required=True, help="checkpoint storage root (file:// URI or path)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--topic-prefix", default=DEFAULT_PREFIX)
    parser.add_argument(
        "--kafka-out",
        metavar="TOPIC",
        help="also write the rows to this Kafka topic, exactly once (committed with the checkpoints)",
    )
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--timeout-ms", type=int, default=10_000)
    parser.add_argument("--tolerable-failures", type=int, default=3)
    parser.add_argument("--trigger-ms", type=int, default=200)
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=MAX_OFFSETS_PER_TRIGGER,
        help="cap on the offsets one micro-batch reads (0: none); a stop waits for the batch in flight",
    )
    parser.add_argument(
        "--keyed",
        type=int,
        metavar="N",
        help="count words globally, keyed by word, in N shuffle partitions (one task and ack each)",
    )
    parser.add_argument("--max-parallelism", type=int, default=128, help="key groups of the keyed count")
    parser.add_argument(
        "--source",
        choices=(CONNECTOR, CUTLINE_KAFKA),
        help="read Kafka with Spark's own kafka connector (its jars resolved with Maven) or "
        "with cutline-kafka (no jar); default: the connector where its jars resolve",
    )
    parser.add_argument(
        "--state-location", help="where the keyed state store lives (fsspec URL or path; default --work-dir)"
    )
    parser.add_argument("--restore", help="a checkpoint id of this job or a savepoint/checkpoint directory")
    parser.add_argument(
        "--restore-from-job",
        metavar="JOB",
        help="the job whose savepoint --restore names, when it is another job's (refused otherwise)",
    )
    parser.add_argument("--no-restore", action="store_true")
    parser.add_argument(
        "--idle-stop", type=float, help="stop (FINISHED) after this many seconds without input"
    )
    parser.add_argument(
        "--master",
        default="local[2]",
        help="Spark master: local[N], local-cluster[N,cores,MB], spark://host:port, ... (default local[2])",
    )
    parser.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="run through the Spark Connect server at this URL instead of a session on --master",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_spark_conf,
        help="a Spark setting, as spark-submit's --conf (repeat for more)",
    )
    parser.add_argument(
        "--executor-env",
        action="append",
        default=[],
        metavar="NAME",
        help="pass this environment variable to every executor (repeat for more; e.g. AWS_ENDPOINT_URL)",
    )
    return parser


def _spark_conf(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not key or not equals:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _session(args: argparse.Namespace, choice: SourceChoice) -> Any:
    """The command line's session: a Spark Connect one with ``--remote``, else a classic one (with
    the connector's jars added to ``spark.jars`` when it reads with them)."""
    from spark_tasks.session import connect_spark, spark_session

    conf = dict(args.conf)
    if args.remote:
        return connect_spark(args.remote, conf=conf)
    if choice.connector is not None:
        conf["spark.jars"] = ",".join(filter(None, (conf.get("spark.jars"), choice.connector.spark_jars)))
    return spark_session(args.master, f"cutline-{args.job}", conf=conf, executor_env=args.executor_env)


def source_choice(args: argparse.Namespace) -> SourceChoice:
    """The source the command line's job reads with (:func:`choose_source`): on the connector, the job
    hands it the Kafka client settings as its ``kafka.*`` options (``CheckpointedJob``,
    :mod:`spark_tasks.connector_security`), unless they do not translate."""
    return choose_source(
        args.source,
        remote=bool(args.remote),
        resolve=kafka_connector,
        refused=security_refusal(client_properties()),
    )


def job_settings(args: argparse.Namespace, source: Source = "cutline-kafka") -> JobSettings:
    """The job the command line describes, reading with ``source``."""
    restore: Restore = "latest"
    if args.no_restore:
        restore = None
    elif args.restore:
        restore = int(args.restore) if args.restore.isdigit() else args.restore
    location = args.location if "://" in args.location else Path(args.location).resolve().as_uri()
    source_options = {}
    if args.max_offsets_per_trigger:
        source_options["maxOffsetsPerTrigger"] = args.max_offsets_per_trigger
    return JobSettings(
        job_id=args.job,
        bootstrap=args.bootstrap,
        topics=tuple(args.topic),
        config=CheckpointConfig(
            interval_ms=args.interval_ms,
            location=location,
            timeout_ms=args.timeout_ms,
            tolerable_failures=args.tolerable_failures,
        ),
        work_dir=args.work_dir,
        topic_prefix=args.topic_prefix,
        restore=restore,
        restore_from_job=args.restore_from_job,
        source_options=source_options,
        keyed_partitions=args.keyed,
        max_parallelism=args.max_parallelism,
        state_location=args.state_location,
        source=source,
    )


def main(argv: Iterable[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    use_wire(wire_from_environment())  # as `cutline run` exported them
    if args.remote and args.executor_env:
        parser.error("--executor-env is for --master: a Connect server's executors are its own")
    try:
        choice = source_choice(args)
    except SourceUnavailable as exc:
        parser.error(str(exc))
    _emit("source", source=choice.source, line=choice.line)
    settings = job_settings(args, choice.source)
    with StopSignals() as stop:
        spark = _session(args, choice)
        try:
            if stop.requested:  # while the JVM started: no job to start, nor to report CANCELED
                return 0
            job = run_wordcount(
                spark,
                settings,
                args.out,
                trigger=f"{args.trigger_ms} milliseconds",
                stop=stop,
                idle_stop=args.idle_stop,
                kafka_topic=args.kafka_out,
            )
        except CheckpointFailuresExceeded as exc:
            _emit("failed", error=str(exc))
            print(f"error: {exc}", file=sys.stderr)
            return 3
        finally:
            spark.stop()
    _emit("stopped", attempt=job.attempt, completed=[c.checkpoint_id for c in job.completed])
    return 0


if __name__ == "__main__":
    sys.exit(main())
