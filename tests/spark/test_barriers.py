"""Barrier alignment in the ``cutline-kafka`` source (docs/design.md, "Tasks and Spark"): barriers of the
job are
folded into a micro-batch's end offset and emitted in-band by every partition's task."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from support import eventually
from wordfeed import wait

from events.dev.broker import create_topics
from events.kafka.clients import job_key, partition_for, produce_record, producer_config
from events.wire.fencing import epoch_header
from events.wire.records import CheckpointBarrier, CheckpointKind
from spark_tasks.kafka_source.offsets import BARRIER_KEY, barrier_of, from_offsets, to_offsets
from spark_tasks.kafka_source.options import FORMAT, KafkaSourceOptions
from spark_tasks.kafka_source.probes import BarrierFeed
from spark_tasks.kafka_source.reading import KafkaInputPartition, kafka_schema

PARTITIONS = 4
BARRIER_PARTITIONS = 8

Row = tuple[int, int, str | None, str | None]  # partition, offset, value, cutline_barrier


# --------------------------------------------------------------------------- no Spark


def test_offsets_with_a_barrier_keep_the_topic_offsets_as_before() -> None:
    barrier = {"timestamp_ms": 5, "location": "file:///c/1", "kind": "CHECKPOINT", "id": 1, "attempt": 0}
    offsets = to_offsets({("t", 1): 3, ("t", 0): 4}, barrier)
    text = json.dumps(offsets)

    assert text.startswith(f'{{"{BARRIER_KEY}": {{"attempt": 0, "id": 1, "kind": "CHECKPOINT", ')
    assert text.endswith('"t": {"0": 4, "1": 3}}')
    assert {("t", 0): 4, ("t", 1): 3} == from_offsets(text)
    assert barrier == barrier_of(text)
    assert barrier_of(to_offsets({("t", 0): 4})) is None
    assert json.dumps(to_offsets(from_offsets(text), barrier_of(text))) == text


def test_the_barrier_column_only_with_a_job() -> None:
    plain = KafkaSourceOptions.parse({"kafka.bootstrap.servers": "b:9092", "subscribe": "t"})
    job = KafkaSourceOptions.parse(
        {
            "kafka.bootstrap.servers": "b:9092",
            "subscribe": "t",
            "cutline.job": "j",
            "cutline.topicPrefix": "x.",
        }
    )

    assert plain.job is None
    assert ("j", "x.barriers") == (job.job, job.barriers_topic)
    assert "cutline_barrier" not in kafka_schema(plain.include_headers).fieldNames()
    assert "cutline_barrier" == kafka_schema(barriers=True).fieldNames()[-1]
    assert KafkaInputPartition("t", 0, 1, 2).barrier is None


# --------------------------------------------------------------------------- Spark


def _same_partition_job(job: str) -> str:
    """Another job id whose barriers share ``job``'s partition (so they arrive in order)."""
    target = partition_for(job_key(job), BARRIER_PARTITIONS)
    for i in range(10_000):
        other = f"other-{i}"
        if partition_for(job_key(other), BARRIER_PARTITIONS) == target:
            return other
    raise AssertionError("no other job id found")


def _barrier(job: str, checkpoint_id: int, location: str) -> CheckpointBarrier:
    return CheckpointBarrier(
        job_id=job,
        checkpoint_id=checkpoint_id,
        attempt=0,
        kind=CheckpointKind.CHECKPOINT,
        timestamp_ms=1_700_000_000_000 + checkpoint_id,
        location=location,
    )


_wait = wait


def test_barriers_are_folded_into_one_batch_and_emitted_per_partition(
    spark: Any, bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topic = topic_prefix + "words"
    barriers_topic = topic_prefix + "barriers"
    create_topics(bootstrap, [topic], partitions=PARTITIONS)
    create_topics(bootstrap, [barriers_topic], partitions=BARRIER_PARTITIONS)
    job = "job-" + topic_prefix.rstrip(".")
    other = _same_partition_job(job)
    checkpoint = tmp_path / "checkpoint"
    producer = Producer(producer_config(bootstrap, {"linger.ms": 5}))
    lock = threading.Lock()
    batches: dict[int, list[list[Row]]] = {}  # batch id -> the rows of each run, in read order

    def record(batch_df: Any, batch_id: int) -> None:
        rows = [
            (r.partition, r.offset, None if r.value is None else bytes(r.value).decode(), r.cutline_barrier)
            for r in batch_df.select("partition", "offset", "value", "cutline_barrier").collect()
        ]
        with lock:
            batches.setdefault(batch_id, []).append(rows)

    def start() -> Any:
        df = (
            spark.readStream.format(FORMAT)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("kafka.fetch.wait.max.ms", 5)
            .option("cutline.barrierFetchWaitMs", 5)  # barriers must arrive while records wait
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("cutline.job", job)
            .option("cutline.topicPrefix", topic_prefix)
            .load()
        )
        return (
            df.writeStream.foreachBatch(record)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="100 milliseconds")
            .start()
        )

    def produce(first: int, count: int) -> None:
        for i in range(first, first + count):
            producer.produce(topic, value=f"v{i}".encode(), partition=i % PARTITIONS)
        assert 0 == producer.flush(30)

    def send(barrier: CheckpointBarrier) -> None:
        produce_record(producer, barriers_topic, barrier)
        assert 0 == producer.flush(30)

    def barrier_batches() -> dict[int, list[Row]]:
        with lock:
            return {b: runs[0] for b, runs in batches.items() if any(r[3] for r in runs[0])}

    def wait_for_barrier_batches(count: int) -> None:
        _wait(lambda: len(barrier_batches()) >= count, f"the batch with barrier {count}")

    def ends(last: int) -> dict[int, int]:
        """Each partition's end offset after the records of batches up to ``last``."""
        out = dict.fromkeys(range(PARTITIONS), 0)
        with lock:
            for batch_id, runs in batches.items():
                if batch_id > last:
                    continue
                for partition, offset, value, _ in runs[0]:
                    if value is not None:
                        out[partition] = max(out[partition], offset + 1)
        return out

    location = (tmp_path / "checkpoints").as_uri()
    query = start()
    try:
        produce(0, 20)
        query.processAllAvailable()
        assert not barrier_batches()

        # Records, then a barrier of another job (same partition, ignored), then ours. A
        # trigger may take the records before the barrier arrives; then try again, so that
        # one barrier batch has records after its barrier rows.
        checkpoint_id = 0
        while checkpoint_id < 5:
            checkpoint_id += 1
            produce(20 * checkpoint_id, 20)
            send(_barrier(other, 90 + checkpoint_id, location + "/other"))
            send(_barrier(job, checkpoint_id, f"{location}/{checkpoint_id}"))
            wait_for_barrier_batches(checkpoint_id)
            query.processAllAvailable()
            if any(r[3] is None for r in barrier_batches()[max(barrier_batches())]):
                break
        with_records = checkpoint_id

        # A barrier with no new records: a batch of barrier rows only.
        checkpoint_id += 1
        send(_barrier(job, checkpoint_id, f"{location}/{checkpoint_id}"))
        wait_for_barrier_batches(checkpoint_id)
        query.processAllAvailable()
        time.sleep(0.5)  # a few idle triggers: no batch may carry the barrier again
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None

    found = barrier_batches()
    assert checkpoint_id == len(found)
    assert set(found) == {b for b, runs in batches.items() if any(r[3] for run in runs for r in run)}
    assert all(len(runs) == 1 for runs in batches.values())
    records = 20 * (with_records + 1)
    assert records == sum(1 for runs in batches.values() for r in runs[0] if r[2] is not None)
    assert {p: records // PARTITIONS for p in range(PARTITIONS)} == ends(max(batches))

    for checkpoint_id, batch_id in enumerate(sorted(found), start=1):
        rows = found[batch_id]
        end = ends(batch_id)
        cut = ends(batch_id - 1)  # the checkpoint's cut: where this batch starts
        barrier_rows = [r for r in rows if r[3] is not None]
        expected = {
            "attempt": 0,
            "epoch": 0,  # the coordinator epoch that sent it (no header: 0)
            "id": checkpoint_id,
            "kind": "CHECKPOINT",
            "location": f"{location}/{checkpoint_id}",
            "timestamp_ms": 1_700_000_000_000 + checkpoint_id,
        }
        # once per Kafka partition, with that partition's start offset of the batch, no value
        assert sorted((p, o) for p, o, _, _ in barrier_rows) == sorted(cut.items())
        assert all(v is None and json.loads(b or "") == expected for _, _, v, b in barrier_rows)
        # before that partition's records of the batch
        for partition in range(PARTITIONS):
            mine = [r for r in rows if r[0] == partition]
            assert mine[0][3] is not None, mine
            assert all(r[3] is None and r[1] >= cut[partition] for r in mine[1:]), mine
        # Spark's write-ahead log holds the barrier: a re-run sees it again
        logged = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()[-1]
        assert expected == barrier_of(logged)
        assert {(topic, p): o for p, o in end.items()} == from_offsets(logged)
    first, second = sorted(found)[with_records - 1], max(found)
    # the barrier that came with records, and the one with none
    assert any(r[3] is None for r in found[first])
    assert all(r[3] is not None for r in found[second])
    assert second == max(batches), "a batch after the barrier batch carried a barrier or ran"

    # A crash after batch `second` was logged but before it was committed: Spark re-runs
    # it from offsets/N, and the source emits the same barrier rows again.
    for name in (str(second), f".{second}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    query = start()
    try:
        _wait(lambda: len(batches[second]) == 2, "the re-run of the barrier batch")
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    assert sorted(batches[second][0]) == sorted(batches[second][1])
    assert second == max(batches), "the re-run folded a barrier twice"
    assert all(len(runs) == 1 for b, runs in batches.items() if b != second)


def test_the_feed_ignores_barriers_of_older_attempts(bootstrap: str, topic_prefix: str) -> None:
    """A restarted job must not fold a barrier the coordinator sent to the crashed attempt."""
    barriers_topic = topic_prefix + "barriers"
    create_topics(bootstrap, [barriers_topic], partitions=BARRIER_PARTITIONS)
    job = "job-" + topic_prefix.rstrip(".")
    feed = BarrierFeed(bootstrap, barriers_topic, job, min_attempt=2)
    producer = Producer(producer_config(bootstrap))
    try:
        for attempt, checkpoint_id in ((1, 7), (2, 8)):
            stale = replace(_barrier(job, checkpoint_id, "file:///c"), attempt=attempt)
            produce_record(producer, barriers_topic, stale)
        assert 0 == producer.flush(30)

        # One partition: once the last barrier is queued, the stale one before it was read.
        taken = [eventually(lambda: feed.poll() or feed.take(), timeout=30, what="the barrier of attempt 2")]
        feed.poll()
        taken.append(feed.take())
    finally:
        feed.close()

    assert [None if b is None else (b["id"], b["attempt"]) for b in taken] == [(8, 2), None]


def test_the_barrier_feed_drops_a_superseded_epochs_barriers(bootstrap: str, topic_prefix: str) -> None:
    """The driver's barrier feed applies the fencing rule (docs/design.md, "Ownership and fencing"): after
    a barrier of epoch 2, a
    zombie's barrier of epoch 1 is dropped; the entries it queues name their epoch for the tasks'
    acks, and a newer epoch may send an id again."""
    barriers_topic = topic_prefix + "barriers"
    create_topics(bootstrap, [barriers_topic], partitions=BARRIER_PARTITIONS)
    job = "job-" + topic_prefix.rstrip(".")
    feed = BarrierFeed(bootstrap, barriers_topic, job)
    producer = Producer(producer_config(bootstrap))
    try:
        for checkpoint_id, epoch in ((7, 2), (8, 1), (7, 3)):
            barrier = _barrier(job, checkpoint_id, "file:///c")
            produce_record(producer, barriers_topic, barrier, headers=[epoch_header(epoch)])
        assert 0 == producer.flush(30)

        # One partition: once the last barrier is queued, the zombie's before it was read.
        taken = [
            eventually(lambda: feed.poll() or feed.take(), timeout=30, what=f"barrier {n}") for n in (1, 2)
        ]
        feed.poll()
        taken.append(feed.take())
    finally:
        feed.close()

    assert [(7, 2), (7, 3), None] == [None if b is None else (b["id"], b["epoch"]) for b in taken]
