"""A Spark driver whose word count writes to Kafka through an ExactlyOnceKafkaSink: the child process
tests/spark/test_kafka_sink.py SIGKILLs (with its JVM) at a crash point of a commit.

Its settings are the JSON in ``KAFKA_SINK_APP``. It says on stdout what it does (``recovered
commit=[..] delete=[..]``, ``transactional_id ID``, ``started``, ``step NAME CHECKPOINT``); at the
first step ``crash`` names (``[name, first checkpoint id]``) it says ``stopped at NAME CHECKPOINT``
and waits there for its SIGKILL, and so does any later step of the other half (the committer does
not commit after the batches stopped, nor the reverse). ``variant: no-marker`` recovers without
reading the marker: the broken sink the test must catch; ``variant: stop-at-start`` stages a stop
barrier's output at its batch's start on the connector too (the stop batch's own rows are left
out). With ``crash`` at ``acked``, the running committer commits nothing: the journal may complete
the checkpoint before its batch returns.
``holds`` (``[[NAME, FIRST CHECKPOINT, FILE], ...]``) hold the first step NAME of a checkpoint from
FIRST on (``held at NAME CHECKPOINT``) until FILE exists; ``master`` runs it on that Spark master
(``local-cluster[2,1,1024]``: executors in JVMs of their own) instead of ``local[2]``. ``keyed: N``
runs the keyed word count in N shuffle partitions (its rows ``word``, ``count``, ``added``) on Spark's
own ``kafka`` connector (its jars on the session) instead of the per-partition one on ``cutline-kafka``.
When the query ends by itself (a stop with a savepoint), it closes the sink and says ``closed``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from events.task.exactly_once import Completion, Marker, RecoveryPlan, Staged, recovery_plan
from events.wire.records import CheckpointConfig
from spark_tasks import kafka_sink
from spark_tasks.job import CheckpointedJob, JobSettings
from spark_tasks.kafka_sink import BarrierBatch, ExactlyOnceKafkaSink, batch_barrier
from spark_tasks.session import local_spark, spark_session
from spark_tasks.wordcount import KEYED_WORD_COUNT, WORD_COUNT


def say(line: str) -> None:
    """One line on stdout in one write: ``print`` writes the text and the newline apart, and the
    committing thread's lines then broke into the main thread's (``processed 10step open 1``)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def without_marker(
    marker: Marker | None, staged: Iterable[Staged], completions: Iterable[Completion], restored: int | None
) -> RecoveryPlan:
    return recovery_plan(None, staged, completions, restored)


def cluster_spark(master: str) -> Any:
    """A session on ``master`` with one core and 1 GiB per executor, 2 shuffle partitions."""
    conf = {
        "spark.executor.cores": "1",
        "spark.executor.memory": "1024m",
        "spark.sql.shuffle.partitions": "2",
    }
    return spark_session(master, "kafka-sink-app", conf=conf)


def connector_spark() -> Any:
    """A ``local[2]`` session with Spark's kafka connector's jars, 2 shuffle partitions."""
    from spark_tasks.connector import kafka_connector

    conf = {"spark.sql.shuffle.partitions": "2", "spark.jars": kafka_connector().spark_jars}
    return spark_session("local[2]", "kafka-sink-app", conf=conf)


def stop_at_start(batch_id: int, logged: str, previous: str | None, *, on_connector: bool) -> Any:
    """:func:`~spark_tasks.kafka_sink.batch_barrier` with every cut at the batch's start (broken)."""
    opened = batch_barrier(batch_id, logged, previous, on_connector=on_connector)
    return None if opened is None else BarrierBatch(opened.entry)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    settings = json.loads(os.environ["KAFKA_SINK_APP"])
    crash = settings.get("crash")
    started, stopped = threading.Event(), threading.Event()
    committed: set[int] = set()
    holds = [(name, int(first), Path(release)) for name, first, release in settings.get("holds", [])]

    def step(name: str, checkpoint_id: int) -> None:
        say(f"step {name} {checkpoint_id}")
        for held in [h for h in holds if h[0] == name and checkpoint_id >= h[1]]:
            holds.remove(held)
            say(f"held at {name} {checkpoint_id}")
            while not held[2].exists():  # until the test lets it go on
                time.sleep(0.02)
        if name == "committed":
            committed.add(checkpoint_id)
        if stopped.is_set():  # the other half (batches or committer) goes no further either
            threading.Event().wait()
        if crash and crash[0] == "acked" and name == "committing" and started.is_set():
            stopped.wait()  # the completion may come before the batch returns: it is not committed
            threading.Event().wait()
        # ``buffered`` stops once the checkpoint before is committed: nothing but the buffer is pending
        at_crash = bool(crash) and name == crash[0] and checkpoint_id >= crash[1]
        if at_crash and (name != "buffered" or checkpoint_id in committed):
            stopped.set()
            say(f"stopped at {name} {checkpoint_id}")
            threading.Event().wait()  # until the test's SIGKILL

    from pyspark.sql.functions import col, struct, to_json

    if settings.get("variant") == "stop-at-start":
        kafka_sink.batch_barrier = stop_at_start

    master, keyed = settings.get("master"), int(settings.get("keyed") or 0)
    if keyed:
        spark = connector_spark()
    else:
        spark = local_spark("kafka-sink-app") if master is None else cluster_spark(master)
    job = CheckpointedJob(
        spark,
        JobSettings(
            job_id=settings["job"],
            bootstrap=settings["bootstrap"],
            topics=(settings["input"],),
            config=CheckpointConfig(interval_ms=1000, timeout_ms=60_000, location=settings["location"]),
            work_dir=Path(settings["work_dir"]),
            topic_prefix=settings["prefix"],
            keyed_partitions=keyed or None,
            source="kafka" if keyed else "cutline-kafka",
        ),
    )
    sink = ExactlyOnceKafkaSink(
        job,
        topic=settings["output"],
        uid="counts",
        step=step,
        recovery=without_marker if settings.get("variant") == "no-marker" else None,
    )
    plan = sink.recovered.plan
    say(f"recovered commit={list(plan.commit)} delete={list(plan.delete)}")
    say(f"transactional_id {sink.transactional_id}")
    if keyed:
        counts, rows = job.stream_keyed(KEYED_WORD_COUNT), struct("word", "count", "added")
    else:
        counts, rows = (
            job.stream(WORD_COUNT),
            struct("topic", "partition", "offset", "word", "added", "count"),
        )
    out = counts.select(col("word").alias("key"), to_json(rows).alias("value"))
    job.start(out.writeStream.foreachBatch(sink).trigger(processingTime="200 milliseconds"))
    started.set()
    say("started")
    job.await_termination()
    sink.close()  # once the journal is read to its end: a stop savepoint's output is committed
    job.close()
    say("closed")
    spark.stop()


if __name__ == "__main__":
    main()
