"""What the tests of a checkpointed job on Spark's own kafka connector share (test_connector_*.py):
a driver of the word count on the connector in a child process (keyed, or per partition, with latency
markers or without), and reading what it left: the journal's completions, Spark's offset log and the
connector's own record of its starting offsets, the sink's last cut, the per-partition counts' running
totals, the coordinator's latency histograms; a stop with a savepoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from connector_session import ConnectorDriver
from wordfeed import PARTITIONS, Input

from events.kafka.clients import consumer_config
from events.task.participant import JobDriver
from events.wire.records import (
    CheckpointCompleted,
    CheckpointKind,
    JobStatus,
    JobStopRequested,
    SchedulerStopped,
)
from events.wire.topics import Topics
from spark_tasks.connector_cuts import read_logged_batch
from spark_tasks.sink import CUTS_DIR, read_rows

SHUFFLE = 2
"""The word count's shuffle partitions (``--keyed``) unless a test says otherwise."""
STARTS_S = 300.0
"""How long a driver may take to start Spark and run its first batch: 30 s on an idle 2-core
machine, minutes when other processes keep its cores busy."""


def driver(
    given: Input, bootstrap: str, prefix: str, tmp_path: Path, n: int, *extra: str, latency_ms: int = 0
) -> ConnectorDriver:
    """Start driver ``n`` of the test's keyed word count on the connector (``extra`` options last: they
    win), its output in ``tmp_path/out``, its log ``tmp_path/driver-<n>.log``; with ``latency_ms``,
    latency markers."""
    args = [
        "--bootstrap", bootstrap, "--job", given.job_id, "--topic", given.topic, "--topic-prefix", prefix,
        "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
        "--location", (tmp_path / "checkpoints").as_uri(), "--keyed", str(SHUFFLE), "--interval-ms", "1000",
        "--conf", "spark.sql.streaming.minBatchesToRetain=100000",  # every batch's offsets stay to compare
        *extra,
    ]  # fmt: skip
    log = tmp_path / f"driver-{n}.log"
    if latency_ms:
        return MarkedDriver([*args, "--latency-interval-ms", str(latency_ms)], log).start()
    return ConnectorDriver(args, log).start()


def partition_driver(
    given: Input, bootstrap: str, prefix: str, tmp_path: Path, n: int, *extra: str, latency_ms: int = 0
) -> ConnectorDriver:
    """Start driver ``n`` of the test's per-partition word count (a ``StatefulStep``, one state per
    Kafka partition) on the connector, as :func:`driver` does; with ``latency_ms``, latency markers."""
    args = [
        "--bootstrap", bootstrap, "--job", given.job_id, "--topic", given.topic, "--topic-prefix", prefix,
        "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
        "--location", (tmp_path / "checkpoints").as_uri(), "--interval-ms", "1000",
        "--conf", "spark.sql.streaming.minBatchesToRetain=100000",
        *extra,
    ]  # fmt: skip
    log = tmp_path / f"driver-{n}.log"
    if latency_ms:
        return MarkedDriver([*args, "--latency-interval-ms", str(latency_ms)], log).start()
    return ConnectorDriver(args, log).start()


class MarkedDriver(ConnectorDriver):
    """A driver whose job emits latency markers (``connector_marked_driver.py``)."""

    def start(self) -> ConnectorDriver:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
        script = Path(__file__).with_name("connector_marked_driver.py")
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(script), *self.args],
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                text=True,
                start_new_session=True,
            )
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        return self


def running_totals_that_break(out: Path) -> list[str]:
    """Where a per-partition count does not carry on from the one before: for each partition and word,
    in offset order, each row's ``count`` must be the previous row's plus its ``added``. A restore that
    brought back the wrong state (empty, or after records it replays) breaks it."""
    rows = sorted(read_rows(out), key=lambda r: (r["topic"], r["partition"], r["word"], r["offset"]))
    broken, totals = [], Counter[tuple[str, int, str]]()
    for row in rows:
        key = (row["topic"], row["partition"], row["word"])
        totals[key] += row["added"]
        if row["count"] != totals[key]:
            broken.append(f"{key} at offset {row['offset']}: count {row['count']}, counted {totals[key]}")
    return broken


def latency_histograms(url: str, job_id: str) -> dict[tuple[str, str, str], tuple[float, float]]:
    """``cutline_job_latency`` of ``job_id`` at the coordinator's ``/metrics``: (source, operator,
    operator subtask) -> (count, sum in ms)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[tuple[str, str, str], list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "cutline_job_latency":
            continue
        for sample in family.samples:
            labels = sample.labels
            if labels.get("job_id") != job_id or sample.name.endswith("_bucket"):
                continue
            key = (labels["source_id"], labels["operator_id"], labels["operator_subtask_index"])
            found.setdefault(key, [0.0, 0.0])[sample.name.endswith("_sum")] = sample.value
    return {key: (count, total) for key, (count, total) in found.items()}


def completions(bootstrap: str, prefix: str, job_id: str, attempt: int) -> list[CheckpointCompleted]:
    """The completed checkpoints of the job's ``attempt``, in the journal's order."""
    return [c for c in JobDriver(bootstrap, job_id, Topics(prefix)).completions() if c.attempt == attempt]


def committed(bootstrap: str, group: str, topic: str) -> dict[str, int]:
    """The consumer group's committed offsets, as a checkpoint names them."""
    consumer = Consumer(consumer_config(bootstrap, group))
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    finally:
        consumer.close()
    return {f"{tp.topic}:{tp.partition}": tp.offset for tp in found if tp.offset >= 0}


def batch_ends(spark_checkpoint: Path) -> list[dict[str, int]]:
    """The Kafka source's end offsets of every micro-batch in Spark's offset log, as a checkpoint
    names offsets."""
    ends = []
    for batch_id in sorted(int(p.name) for p in (spark_checkpoint / "offsets").iterdir() if p.name.isdigit()):
        batch = read_logged_batch(spark_checkpoint, batch_id)
        assert batch is not None
        ends.append({f"{t}:{p}": offset for (t, p), offset in batch.offsets.items()})
    return ends


def batches_after_the_stop(spark_checkpoint: Path) -> list[int]:
    """The micro-batches Spark planned after the first one that folded a stop barrier (its offset
    log; a batch's barrier source offset carries the last barrier folded, new or not)."""
    ids = sorted(int(p.name) for p in (spark_checkpoint / "offsets").iterdir() if p.name.isdigit())
    batches = [read_logged_batch(spark_checkpoint, batch_id) for batch_id in ids]
    stops = [b.batch_id for b in batches if b is not None and b.barriers.stops]
    assert stops, f"no batch of {spark_checkpoint} folded a stop barrier"
    return [batch_id for batch_id in ids if batch_id > stops[0]]


def spark_starting_offsets(spark_checkpoint: Path) -> dict[str, int]:
    """Where the Kafka source's first batch started: the initial offsets the connector writes to its
    metadata log (``sources/0/0``: a zero byte, ``v1``, then the JSON)."""
    text = (spark_checkpoint / "sources" / "0" / "0").read_bytes().lstrip(b"\0").decode()
    offsets: Mapping[str, Mapping[str, int]] = json.loads(text.split("\n", 1)[1])
    return {f"{topic}:{p}": offset for topic, parts in offsets.items() for p, offset in parts.items()}


def stop_with_savepoint(
    running: ConnectorDriver, bootstrap: str, prefix: str, job_id: str, attempt: int, target: Path
) -> CheckpointCompleted:
    """``cutline stop JOB --savepoint TARGET`` (its request): the driver ends by itself, exit 0, the
    attempt FINISHED; the savepoint."""
    journal = JobDriver(bootstrap, job_id, Topics(prefix))
    journal.request(JobStopRequested(job_id, int(time.time() * 1000), uuid.uuid4().hex, target.as_uri()))
    assert running.process is not None
    assert 0 == running.process.wait(180), running.tail()
    ended = [
        e
        for e in journal.journal((SchedulerStopped,))
        if isinstance(e, SchedulerStopped) and e.attempt == attempt
    ]
    assert [JobStatus.FINISHED] == [e.status for e in ended]
    (savepoint,) = [
        c for c in completions(bootstrap, prefix, job_id, attempt) if c.kind is CheckpointKind.SAVEPOINT
    ]
    return savepoint


def last_cut_end(out: Path) -> dict[str, int]:
    """The end offsets of the sink's last output file (its ``_cuts`` record)."""
    cuts = [json.loads(p.read_text()) for p in (out / CUTS_DIR).glob("*.json")]
    return dict(max(cuts, key=lambda c: sum(c["end"].values()))["end"])
