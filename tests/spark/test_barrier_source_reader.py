"""The ``cutline-barriers`` reader against a real broker, called as PySpark's source runner calls it
(spark_tasks/barrier_source.py): it plans each batch from the end of the one before, which Spark hands
it back through ``partitions`` after a restart from its own checkpoint."""

from __future__ import annotations

from confluent_kafka import Producer
from support import eventually

from events.dev.broker import create_topics
from events.kafka.clients import produce_record, producer_config
from events.wire.barrier_entry import barrier_entry
from events.wire.records import CheckpointBarrier, CheckpointKind
from spark_tasks.barrier_source import BarrierOffset, BarrierSourceOptions, BarrierStreamReader

BARRIER_PARTITIONS = 8


def _barrier(job: str, checkpoint_id: int) -> CheckpointBarrier:
    return CheckpointBarrier(
        job_id=job,
        checkpoint_id=checkpoint_id,
        attempt=0,
        kind=CheckpointKind.CHECKPOINT,
        timestamp_ms=1_700_000_000_000 + checkpoint_id,
        location="file:///c",
    )


def test_each_batch_starts_where_spark_planned_the_last_one_to_end(bootstrap: str, topic_prefix: str) -> None:
    # Given a reader of a job whose query restarted from Spark's checkpoint: Spark hands the last
    # logged end (3 barriers folded, the last one checkpoint 3) back as partitions(end, end)
    job = "job-" + topic_prefix.rstrip(".")
    create_topics(bootstrap, [topic_prefix + "barriers"], partitions=BARRIER_PARTITIONS)
    reader = BarrierStreamReader(
        BarrierSourceOptions(job=job, bootstrap=bootstrap, topic_prefix=topic_prefix)
    )
    logged = BarrierOffset(3, barrier_entry(_barrier(job, 3)))
    try:
        assert reader.partitions(logged.to_json(), logged.to_json()) == []

        # When no barrier is pending, then the next end is that end: no batch runs for this source
        assert reader.latestOffset() == logged.to_json()

        # When the next barrier arrives, then the next batch folds it as the 4th
        producer = Producer(producer_config(bootstrap))
        produce_record(producer, topic_prefix + "barriers", _barrier(job, 4))
        assert producer.flush(30) == 0
        end = BarrierOffset.from_json(
            eventually(reader.latestOffset, lambda o: o != logged.to_json(), what="the end with barrier 4")
        )
        assert (end.folded, end.barrier and end.barrier["id"]) == (4, 4)

        # and once Spark planned that batch, the one after starts from it
        assert len(reader.partitions(logged.to_json(), end.to_json())) == 1
        assert BarrierOffset.from_json(reader.latestOffset()) == end
    finally:
        reader.stop()
