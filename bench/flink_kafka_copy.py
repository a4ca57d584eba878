"""Flink's exactly-once KafkaSink copying one topic to another, for bench/bench_exactly_once.py --flink.

Runs in the PyFlink venv (``/tmp/cutline-flink-venv``; see ../shared/anchors/), not the project's:

    python bench/flink_kafka_copy.py --bootstrap HOST:PORT --source IN --sink OUT --jar CONNECTOR.jar \
        [--interval-ms 1000] [--parallelism 2] --ready FILE --stop FILE [--seconds 300]

A local MiniCluster reads ``--source`` (raw bytes, from the earliest offset) and writes each value to
``--sink`` with ``sink.delivery-guarantee = exactly-once`` (``DeliveryGuarantee.EXACTLY_ONCE``: a
transaction per checkpoint, committed when the checkpoint completes), checkpointing every
``--interval-ms``. It touches ``--ready`` once the job is submitted and cancels it once ``--stop``
exists (or after ``--seconds``); then it prints ``checkpoint_ms [..]``, the durations of the job's
completed checkpoints in Flink's log (as ../shared/anchors/flink_checkpoint_latency.py reads them).
"""

import argparse
import glob
import json
import os
import pathlib
import re
import time
import uuid

import pyflink
from pyflink.table import EnvironmentSettings, TableEnvironment


def checkpoint_durations(job_id: str) -> list[int]:
    """The checkpointDuration of each completed checkpoint of ``job_id`` in Flink's log."""
    found = []
    for path in glob.glob(os.path.join(os.path.dirname(pyflink.__file__), "log", "*")):
        with open(path, errors="replace") as lines:
            for line in lines:
                match = re.search(
                    r"Completed checkpoint \d+ for job (\w+).*checkpointDuration=(\d+) ms", line
                )
                if match and match.group(1) == job_id:
                    found.append(int(match.group(2)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--jar", required=True)
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--stop", required=True)
    parser.add_argument("--seconds", type=int, default=300)
    args = parser.parse_args()

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("pipeline.jars", pathlib.Path(args.jar).resolve().as_uri())
    config.set("execution.checkpointing.interval", f"{args.interval_ms} ms")
    config.set("execution.checkpointing.mode", "EXACTLY_ONCE")
    config.set("parallelism.default", str(args.parallelism))
    config.set("state.checkpoints.dir", f"file:///tmp/flink-kafka-copy-{uuid.uuid4().hex[:6]}")
    common = f"'connector' = 'kafka', 'properties.bootstrap.servers' = '{args.bootstrap}', 'format' = 'raw'"
    env.execute_sql(
        f"CREATE TABLE src (v BYTES) WITH ({common}, 'topic' = '{args.source}', "
        "'properties.group.id' = 'flink-kafka-copy', 'scan.startup.mode' = 'earliest-offset')"
    )
    env.execute_sql(
        f"CREATE TABLE snk (v BYTES) WITH ({common}, 'topic' = '{args.sink}', "
        "'sink.delivery-guarantee' = 'exactly-once', "
        f"'sink.transactional-id-prefix' = 'flink-copy-{uuid.uuid4().hex[:6]}', "
        "'properties.transaction.timeout.ms' = '60000')"
    )
    result = env.execute_sql("INSERT INTO snk SELECT v FROM src")
    client = result.get_job_client()
    pathlib.Path(args.ready).touch()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and not pathlib.Path(args.stop).exists():
        time.sleep(0.2)
    client.cancel().result()
    time.sleep(1)
    print("checkpoint_ms " + json.dumps(checkpoint_durations(str(client.get_job_id()))), flush=True)


if __name__ == "__main__":
    main()
