"""The ``cutline-kafka`` source: offset helpers, end offsets on the embedded broker, and
streaming queries on a real local Spark reading a real broker."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from support import eventually

from events.dev.broker import create_topics
from events.kafka.clients import producer_config
from events.kafka.log import read_to_end
from spark_tasks.kafka_source.offsets import from_offsets, rate_limit, to_offsets
from spark_tasks.kafka_source.options import FORMAT, KafkaSourceOptions
from spark_tasks.kafka_source.probes import end_offsets
from spark_tasks.kafka_source.reader import KafkaSource, KafkaStreamReader
from spark_tasks.kafka_source.reading import KafkaInputPartition, kafka_schema, read_chunks, record_row

# The columns of the built-in source (spark-sql-kafka-0-10), in its order.
SPARK_KAFKA_DDL = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
    "timestamp TIMESTAMP, timestampType INT"
)


# --------------------------------------------------------------------------- offset helpers


def test_to_offsets_has_string_keys_in_a_fixed_order() -> None:
    offsets = to_offsets({("b", 10): 5, ("b", 2): 1, ("a", 0): 0})

    assert '{"a": {"0": 0}, "b": {"2": 1, "10": 5}}' == json.dumps(offsets)


def test_equal_offsets_give_equal_json_whatever_the_insertion_order() -> None:
    one = to_offsets({("t", 1): 3, ("t", 0): 4, ("s", 0): 1})
    two = to_offsets({("s", 0): 1, ("t", 0): 4, ("t", 1): 3})

    assert json.dumps(one) == json.dumps(two)


def test_offsets_survive_sparks_json_round_trip() -> None:
    mapping = {("words", p): 100 + p for p in range(12)}
    through_spark = json.loads(json.dumps(to_offsets(mapping)))

    assert mapping == from_offsets(through_spark)
    assert mapping == from_offsets(json.dumps(through_spark))
    assert json.dumps(to_offsets(from_offsets(through_spark))) == json.dumps(through_spark)


def test_from_offsets_reads_sparks_own_kafka_offset_json() -> None:
    assert {("topic", 0): 23, ("topic", 1): -2} == from_offsets('{"topic":{"0":23,"1":-2}}')


@pytest.mark.parametrize(
    "bad",
    [
        "[1, 2]",
        '{"t": [0, 1]}',
        '{"t": {"x": 1}}',
        '{"t": {"-1": 1}}',
        '{"t": {"0": "1"}}',
        '{"t": {"0": true}}',
        '{"t": {"0": 1.5}}',
    ],
)
def test_from_offsets_rejects_anything_else(bad: str) -> None:
    with pytest.raises(ValueError):
        from_offsets(bad)


def test_from_offsets_rejects_int_partition_keys() -> None:
    with pytest.raises(ValueError, match="decimal string"):
        from_offsets({"t": {0: 1}})


def test_to_offsets_rejects_non_int_offsets() -> None:
    with pytest.raises(TypeError):
        to_offsets({("t", 0): True})


def test_rate_limit_splits_the_cap_in_proportion_to_backlog_like_spark() -> None:
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0, ("t", 3): 50}
    end = {("t", 0): 9000, ("t", 1): 900, ("t", 2): 9, ("t", 3): 50}

    capped = rate_limit(1000, start, end)

    # 1000 * 9000/9909 = 908.2 -> 908; 90.8 -> 90; 0.908 -> 1 (never starved); no backlog: unchanged
    assert {("t", 0): 908, ("t", 1): 90, ("t", 2): 1, ("t", 3): 50} == capped


def test_rate_limit_never_passes_the_end_and_keeps_an_empty_range() -> None:
    assert {("t", 0): 3} == rate_limit(10, {("t", 0): 0}, {("t", 0): 3})
    assert {("t", 0): 7} == rate_limit(10, {("t", 0): 7}, {("t", 0): 7})


# --------------------------------------------------------------------------- options, schema


def test_options_like_sparks_kafka_source() -> None:
    options = KafkaSourceOptions.parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9092",
            "subscribe": " a, b ,a",
            "StartingOffsets": "EARLIEST",
            "maxoffsetspertrigger": "500",
            "kafka.fetch.wait.max.ms": "5",
            "failOnDataLoss": "false",
        }
    )

    assert ("a", "b") == options.topics
    assert "earliest" == options.starting_offsets
    assert 500 == options.max_offsets_per_trigger
    assert not options.fail_on_data_loss
    config = options.consumer_config()
    assert "127.0.0.1:9092" == config["bootstrap.servers"]
    assert "5" == config["fetch.wait.max.ms"]
    assert "error" == config["auto.offset.reset"]
    assert config["enable.partition.eof"]


def test_starting_offsets_default_to_latest_as_in_spark() -> None:
    options = KafkaSourceOptions.parse({"kafka.bootstrap.servers": "b:9092", "subscribe": "t"})

    assert "latest" == options.starting_offsets
    assert options.max_offsets_per_trigger is None
    assert 500 == options.barrier_fetch_wait_ms  # Kafka's default fetch.max.wait.ms


def test_the_barrier_consumers_fetch_wait_is_an_option() -> None:
    options = KafkaSourceOptions.parse(
        {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "cutline.barrierFetchWaitMs": "5"}
    )

    assert 5 == options.barrier_fetch_wait_ms


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t"}, "kafka.bootstrap.servers"),
        ({"kafka.bootstrap.servers": "b:9092"}, "subscribe"),
        ({"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "assign": '{"t":[0]}'}, "assign"),
        ({"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "kafka.auto.offset.reset": "x"}, "auto"),
        (
            {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "startingOffsets": "soon"},
            "startingOffsets",
        ),
        ({"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "startingOffsets": '{"u":{"0":1}}'}, "u"),
        ({"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "maxOffsetsPerTrigger": "0"}, "positive"),
        (
            {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "cutline.barrierFetchWaitMs": "-1"},
            "barrierFetchWaitMs",
        ),
    ],
)
def test_bad_options_fail_early(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KafkaSourceOptions.parse(options)


def test_schema_is_the_builtin_kafka_sources() -> None:
    assert SPARK_KAFKA_DDL == _ddl(kafka_schema())
    headers = kafka_schema(include_headers=True)
    assert "headers" == headers.fields[-1].name
    assert "ARRAY<STRUCT<KEY:STRING,VALUE:BINARY>>" == headers.fields[-1].dataType.simpleString().upper()
    assert "cutline-kafka" == KafkaSource.name() == FORMAT


def _ddl(schema: Any) -> str:
    return ", ".join(f"{f.name} {f.dataType.simpleString().upper()}" for f in schema)


# --------------------------------------------------------------------------- broker, no Spark


def _produce(bootstrap: str, topic: str, count: int, *, first: int = 0, linger_ms: int = 5) -> None:
    """``count`` keyed records ``key-i``/``value-i``, batched by the producer (multi-record batches)."""
    producer = Producer(producer_config(bootstrap, {"linger.ms": linger_ms}))
    for i in range(first, first + count):
        producer.produce(topic, key=f"key-{i}".encode(), value=f"value-{i}".encode())
    assert 0 == producer.flush(30)


def test_end_offsets_are_right_with_multi_record_batches(bootstrap: str, topic_prefix: str) -> None:
    topic = topic_prefix + "ends"
    create_topics(bootstrap, [topic], partitions=3)
    producer = Producer(producer_config(bootstrap, {"linger.ms": 50}))
    for i in range(25):  # one batch of 25 on partition 0
        producer.produce(topic, value=b"x%d" % i, partition=0)
    producer.flush(30)
    for i in range(3):  # three one-record batches on partition 1; partition 2 stays empty
        producer.produce(topic, value=b"y%d" % i, partition=1)
        producer.flush(30)
    tps = [(topic, p) for p in range(3)]

    ends = end_offsets(bootstrap, tps)

    assert {(topic, 0): 25, (topic, 1): 3, (topic, 2): 0} == ends
    counted = {tp: 0 for tp in tps}
    for message in read_to_end(bootstrap, topic):
        counted[(topic, message.partition)] = message.offset + 1
    assert counted == ends
    # For the record: what ListOffsets "latest" says (1 on the embedded broker, 25 on Kafka).
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        listed = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
    finally:
        consumer.close()
    assert listed <= ends[(topic, 0)]


def test_read_partition_stops_at_the_end_when_the_last_offsets_are_not_records(
    bootstrap: str, topic_prefix: str
) -> None:
    topic = topic_prefix + "txn"
    create_topics(bootstrap, [topic], partitions=1)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic, "linger.ms": 5})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, key=b"k", value=b"v%d" % i, headers=[("n", str(i).encode())])
    producer.commit_transaction(30)
    # three records and the commit marker; Apache Kafka may write the marker just after
    # commit_transaction returned, and until then the end a read_committed reader sees is still 0
    end = eventually(
        lambda: end_offsets(bootstrap, [(topic, 0)])[(topic, 0)],
        lambda found: found == 4,
        what="the end past the three records and the commit marker",
    )
    options = KafkaSourceOptions.parse(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "includeHeaders": "true"}
    )

    rows = _rows(options, KafkaInputPartition(topic, 0, 0, end))
    middle = _rows(options, KafkaInputPartition(topic, 0, 1, 2))

    assert [0, 1, 2] == [row[4] for row in rows]
    assert [b"v0", b"v1", b"v2"] == [row[1] for row in rows]
    assert [[("n", b"0")], [("n", b"1")], [("n", b"2")]] == [row[7] for row in rows]
    assert [(b"k", b"v1", topic, 0, 1)] == [row[:5] for row in middle]


def _rows(options: KafkaSourceOptions, split: KafkaInputPartition) -> list[tuple[Any, ...]]:
    """The split's records as the source's columns, in tuples."""
    return [record_row(m, options.include_headers) for chunk in read_chunks(options, split) for m in chunk]


def _reader(bootstrap: str, topic: str, **options: str) -> KafkaStreamReader:
    return KafkaSource({"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **options}).streamReader(
        kafka_schema()
    )


def test_latest_resolves_once_per_query(bootstrap: str, topic_prefix: str) -> None:
    topic = topic_prefix + "once"
    create_topics(bootstrap, [topic], partitions=2)
    _produce(bootstrap, topic, 10)
    reader = _reader(bootstrap, topic, startingOffsets="latest")
    try:
        first = reader.initialOffset()
        _produce(bootstrap, topic, 10, first=10)
        # Spark 4.3 asks twice for the first batch; a second answer past the first would drop records.
        assert first == reader.initialOffset()
        assert 10 == sum(first[topic].values())
        end = reader.latestOffset(first, ReadAllAvailable())
        assert 20 == sum(end[topic].values())
        splits = reader.partitions(first, end)
        assert 10 == sum(s.end - s.start for s in splits)
    finally:
        reader.stop()


def test_a_paused_reader_plans_no_new_batch_until_its_pause_file_is_gone(
    bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """Given a backlog and the pause file (``cutline.pauseFile``) present, the reader answers the
    batch's start itself (Spark runs no batch); once the file is gone it plans the backlog again."""
    topic = topic_prefix + "paused"
    create_topics(bootstrap, [topic], partitions=2)
    _produce(bootstrap, topic, 10)
    pause = tmp_path / "pause"
    reader = _reader(bootstrap, topic, startingOffsets="earliest", **{"cutline.pauseFile": str(pause)})
    try:
        start = reader.initialOffset()
        pause.touch()
        assert start == reader.latestOffset(start, ReadAllAvailable())
        pause.unlink()
        end = reader.latestOffset(start, ReadAllAvailable())
    finally:
        reader.stop()

    assert 10 == sum(end[topic].values())


def test_a_topic_created_later_is_read_from_its_beginning(bootstrap: str, topic_prefix: str) -> None:
    topic = topic_prefix + "later"
    reader = _reader(bootstrap, topic, startingOffsets="latest", maxOffsetsPerTrigger="1000")
    try:
        start = reader.initialOffset()
        assert {} == start
        assert {} == reader.latestOffset(start, ReadMaxRows(1000))
        create_topics(bootstrap, [topic], partitions=2)
        _produce(bootstrap, topic, 8)

        end = reader.latestOffset(start, ReadMaxRows(1000))
        splits = reader.partitions(start, end)
    finally:
        reader.stop()

    assert ["0", "1"] == list(end[topic])
    assert 8 == sum(end[topic].values())
    assert [0, 0] == [s.start for s in splits if s.end > 0]
    values = [v for s in splits for batch in reader.read(s) for v in batch.column("value").to_pylist()]
    assert sorted(f"value-{i}".encode() for i in range(8)) == sorted(values)


# --------------------------------------------------------------------------- Spark


def _source(spark: Any, bootstrap: str, topic: str, **options: Any) -> Any:
    reader = (
        spark.readStream.format(FORMAT)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("kafka.fetch.wait.max.ms", 5)
        .option("subscribe", topic)
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def _name(topic: str) -> str:
    return re.sub(r"\W", "_", topic)


def _batch_sizes(query: Any) -> list[int]:
    return [int(p["numInputRows"]) for p in query.recentProgress if int(p["numInputRows"]) > 0]


def _await(query: Any, timeout: float = 120) -> None:
    assert query.awaitTermination(timeout), "query did not finish"
    assert query.exception() is None, query.exception()


def test_available_now_reads_every_record_with_sparks_columns(
    spark: Any, bootstrap: str, topic_prefix: str
) -> None:
    topic = topic_prefix + "words"
    create_topics(bootstrap, [topic], partitions=4)
    _produce(bootstrap, topic, 200)
    expected = {
        (m.key, m.value, m.partition, m.offset, m.timestamp_ms) for m in read_to_end(bootstrap, topic)
    }
    assert 200 == len(expected)
    assert 4 == len({partition for _, _, partition, _, _ in expected})

    df = _source(spark, bootstrap, topic, startingOffsets="earliest")
    assert SPARK_KAFKA_DDL == _ddl(df.schema)
    query = df.writeStream.format("memory").queryName(_name(topic)).trigger(availableNow=True).start()
    _await(query)

    rows = spark.sql(
        f"SELECT key, value, topic, partition, offset, unix_millis(timestamp) AS ts, timestampType "
        f"FROM {_name(topic)}"
    ).collect()
    assert 200 == len(rows)
    assert {topic} == {r.topic for r in rows}
    assert {0} == {r.timestampType for r in rows}
    assert expected == {(bytes(r.key), bytes(r.value), r.partition, r.offset, r.ts) for r in rows}
    # The offsets Spark checkpoints are the end offsets, in the built-in source's JSON.
    end = json.loads(query.lastProgress["sources"][0]["endOffset"])
    ends = {}
    for _, _, partition, offset, _ in expected:
        ends[(topic, partition)] = max(ends.get((topic, partition), 0), offset + 1)
    assert to_offsets(ends) == end


def test_headers_column_when_asked(spark: Any, bootstrap: str, topic_prefix: str) -> None:
    topic = topic_prefix + "headers"
    create_topics(bootstrap, [topic], partitions=1)
    producer = Producer(producer_config(bootstrap))
    producer.produce(topic, key=b"a", value=b"1", headers=[("trace", b"x"), ("n", b"1")])
    producer.produce(topic, key=b"b", value=None)
    producer.flush(30)

    df = _source(spark, bootstrap, topic, startingOffsets="earliest", includeHeaders="true")
    query = df.writeStream.format("memory").queryName(_name(topic)).trigger(availableNow=True).start()
    _await(query)

    rows = spark.sql(f"SELECT key, value, headers FROM {_name(topic)} ORDER BY offset").collect()
    assert [(b"a", b"1"), (b"b", None)] == [
        (bytes(r.key), None if r.value is None else bytes(r.value)) for r in rows
    ]
    assert [("trace", b"x"), ("n", b"1")] == [(h.key, bytes(h.value)) for h in rows[0].headers]
    assert rows[1].headers is None


def test_max_offsets_per_trigger_splits_into_micro_batches(
    spark: Any, bootstrap: str, topic_prefix: str
) -> None:
    topic = topic_prefix + "capped"
    create_topics(bootstrap, [topic], partitions=4)
    _produce(bootstrap, topic, 100)

    df = _source(spark, bootstrap, topic, startingOffsets="earliest", maxOffsetsPerTrigger=30)
    query = df.writeStream.format("memory").queryName(_name(topic)).trigger(availableNow=True).start()
    _await(query)

    sizes = _batch_sizes(query)
    assert 100 == sum(sizes)
    assert len(sizes) >= 4
    assert all(size <= 30 for size in sizes), sizes
    assert 100 == spark.sql(f"SELECT DISTINCT partition, offset FROM {_name(topic)}").count()


def test_starting_offsets_latest_reads_only_what_comes_after_the_start(
    spark: Any, bootstrap: str, topic_prefix: str
) -> None:
    topic = topic_prefix + "latest"
    create_topics(bootstrap, [topic], partitions=4)
    _produce(bootstrap, topic, 40)  # before the query: never read

    df = _source(spark, bootstrap, topic, startingOffsets="latest")
    query = (
        df.writeStream.format("memory").queryName(_name(topic)).trigger(processingTime="0 seconds").start()
    )
    try:
        query.processAllAvailable()
        _produce(bootstrap, topic, 10, first=40)
        query.processAllAvailable()
    finally:
        query.stop()

    values = sorted(bytes(r.value).decode() for r in spark.table(_name(topic)).collect())
    assert sorted(f"value-{i}" for i in range(40, 50)) == values


def test_starting_offsets_json(spark: Any, bootstrap: str, topic_prefix: str) -> None:
    topic = topic_prefix + "json"
    create_topics(bootstrap, [topic], partitions=4)
    producer = Producer(producer_config(bootstrap, {"linger.ms": 5}))
    for partition in range(4):
        for i in range(5):
            producer.produce(topic, value=f"{partition}-{i}".encode(), partition=partition)
    producer.flush(30)
    starting = {topic: {"0": 2, "1": -2, "2": -1, "3": 4}}

    df = _source(spark, bootstrap, topic, startingOffsets=json.dumps(starting))
    query = df.writeStream.format("memory").queryName(_name(topic)).trigger(availableNow=True).start()
    _await(query)

    got = sorted((r.partition, r.offset) for r in spark.table(_name(topic)).collect())
    assert [(0, 2), (0, 3), (0, 4), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (3, 4)] == got


def test_restart_from_the_checkpoint_continues_exactly_where_it_stopped(
    spark: Any, bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topic = topic_prefix + "restart"
    create_topics(bootstrap, [topic], partitions=4)
    checkpoint = tmp_path / "checkpoint"
    batches: dict[int, list[list[tuple[int, int]]]] = {}  # batch id -> the (partition, offset)s of each run

    def record(batch_df: Any, batch_id: int) -> None:
        rows = sorted((r.partition, r.offset) for r in batch_df.select("partition", "offset").collect())
        batches.setdefault(batch_id, []).append(rows)

    def run() -> None:
        query = (
            _source(spark, bootstrap, topic, startingOffsets="earliest", maxOffsetsPerTrigger=25)
            .writeStream.foreachBatch(record)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        _await(query)

    def seen() -> list[tuple[int, int]]:
        return sorted(row for runs in batches.values() for row in runs[0])

    def everything() -> list[tuple[int, int]]:
        return sorted((m.partition, m.offset) for m in read_to_end(bootstrap, topic))

    _produce(bootstrap, topic, 60)
    run()
    first_run = dict(batches)
    assert everything() == seen()
    assert all(len(runs) == 1 for runs in batches.values())

    # A clean restart with new records reads just the new ones, in new batches.
    _produce(bootstrap, topic, 40, first=60)
    run()
    assert everything() == seen()
    assert all(len(runs) == 1 for runs in batches.values()), "a record was read twice"
    assert set(first_run) < set(batches)

    # A crash after a batch's offsets were logged but before it was committed:
    # Spark re-runs that batch, and the source gives it exactly the same records.
    last = max(batches)
    for name in (str(last), f".{last}.crc"):  # the commit file and Hadoop's checksum beside it
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    _produce(bootstrap, topic, 20, first=100)
    run()
    assert 2 == len(batches[last])
    assert batches[last][0] == batches[last][1]
    assert all(len(runs) == 1 for batch_id, runs in batches.items() if batch_id != last)
    assert everything() == seen()
    assert 120 == len(seen())
