"""Flink's exactly-once KafkaSink copying one topic to another, for bench/bench_exactly_once.py --flink.

Runs in the PyFlink venv (``/tmp/cutline-flink-venv``; see ../shared/anchors/), not the project's:

    python bench/flink_kafka_copy.py --bootstrap HOST:PORT --source IN --sink OUT --jar CONNECTOR.jar \
        [--interval-ms 1000] [--parallelism 2] --ready FILE [--seconds 130]

A local MiniCluster reads ``--source`` (raw bytes, from the earliest offset) and writes each value to
``--sink`` with ``sink.delivery-guarantee = exactly-once`` (``DeliveryGuarantee.EXACTLY_ONCE``: a
transaction per checkpoint, committed when the checkpoint completes), checkpointing every
``--interval-ms``. It touches ``--ready`` once the job is submitted and cancels it after ``--seconds``.
"""

import argparse
import pathlib
import time
import uuid

from pyflink.table import EnvironmentSettings, TableEnvironment


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--jar", required=True)
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--seconds", type=int, default=130)
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
    pathlib.Path(args.ready).touch()
    time.sleep(args.seconds)
    result.get_job_client().cancel().result()


if __name__ == "__main__":
    main()
