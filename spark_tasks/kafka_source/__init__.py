"""A Kafka source for Spark Structured Streaming on PySpark's Python Data Source API.

The official Spark Kafka connector (``spark-sql-kafka-0-10``) cannot be installed
here (docs/design.md, "Tasks and Spark"), so this source reads Kafka with confluent-kafka from Python. It
speaks the built-in source's language, so a job can switch between the two by
changing one word::

    spark.dataSource.register(KafkaSource)
    df = (
        spark.readStream.format("cutline-kafka")  # or "kafka" where the jar is on the classpath
        .option("kafka.bootstrap.servers", "127.0.0.1:9092")
        .option("subscribe", "words")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 10_000)
        .load()
    )

**Options** (names as in Spark's Kafka source; keys are case-insensitive):

- ``kafka.bootstrap.servers`` (required) and any other ``kafka.*`` option: passed,
  without the prefix, to librdkafka (so librdkafka's property names, e.g.
  ``kafka.fetch.wait.max.ms``, ``kafka.security.protocol``, ``kafka.isolation.level``).
  Java-client-only settings that Spark also rejects (``auto.offset.reset``,
  ``enable.auto.commit``, ``key.deserializer``, ``value.deserializer``,
  ``interceptor.classes``) raise an error.
- ``subscribe`` (required): comma-separated topic names. ``subscribePattern`` and
  ``assign`` are not supported.
- ``startingOffsets``: ``latest`` (default, as in Spark), ``earliest``, or JSON such as
  ``{"topic":{"0":23,"1":-2}}`` naming every partition of every subscribed topic
  (-2 = earliest, -1 = latest). Only used when a query starts without a checkpoint.
- ``maxOffsetsPerTrigger``: cap on the offsets of one micro-batch, split across
  partitions in proportion to their backlog exactly as Spark does (a partition with
  a backlog gets at least one offset, so a batch can exceed the cap when more
  partitions than the cap hold data). ``Trigger.AvailableNow`` honours it too.
- ``failOnDataLoss`` (default true): fail when a start offset has been deleted by
  retention (otherwise skip to the earliest available offset) or a partition's end
  went backwards.
- ``includeHeaders`` (default false): add the ``headers`` column.
- ``kafkaConsumer.pollTimeoutMs`` (default 120000): how long a task waits without
  progress before it fails.
- ``cutline.job`` (default unset): take part in barrier alignment (docs/design.md, "Tasks and Spark") for this
  job id: barriers of the job, read from its partition of ``<cutline.topicPrefix>barriers``
  (prefix default ``cutline.``) on ``cutline.bootstrap`` (default
  ``kafka.bootstrap.servers``; ``cutline.attempt``, default 0, ignores barriers of
  older attempts), are folded into a batch's end offset under
  ``__cutline_barrier__`` and emitted in-band as one row per Kafka partition before
  its records of the batch (at the batch's start offset: the checkpoint's cut), in
  the extra nullable string column ``cutline_barrier`` (docs/spark.md, "Barrier
  alignment"). ``cutline.barrierFetchWaitMs`` (default 500, Kafka's default
  ``fetch.max.wait.ms``) is the driver's barrier consumer's fetch wait: lower it for
  barriers sooner on a broker that, like the embedded one, answers a waiting fetch
  only after about half of it.
- ``cutline.latencyIntervalMs`` (default 0: off, as Flink's ``latencyTrackingInterval``; needs
  ``cutline.job``): emit a latency marker at most this often. A due marker is folded into the
  next batch that runs anyway (it never makes a batch of its own) under ``__cutline_marker__``,
  and emitted as one row per Kafka partition of the batch, after the barrier row and before the
  records, in the extra nullable string column ``cutline_marker`` (docs/spark.md, "Latency
  markers").

**Columns** (as the built-in source): ``key`` binary, ``value`` binary, ``topic``
string, ``partition`` int, ``offset`` long, ``timestamp`` timestamp,
``timestampType`` int (0 CreateTime, 1 LogAppendTime, -1 none: the Java client's
ids, not librdkafka's), and with ``includeHeaders`` ``headers``
``array<struct<key: string, value: binary>>`` (null when a record has none).

**Offsets** are Spark offset JSON, ``{"topic": {"partition": next_offset}}`` as the built-in source
writes them, plus a folded barrier entry and latency marker: :mod:`~spark_tasks.kafka_source.offsets`.

**The modules**, along the source's seams: :mod:`~spark_tasks.kafka_source.offsets` (offset JSON,
pure), :mod:`~spark_tasks.kafka_source.options` (the options and the consumer configuration),
:mod:`~spark_tasks.kafka_source.probes` (the driver's consumers: partition ends, the job's barriers),
:mod:`~spark_tasks.kafka_source.reading` (the columns, and what an executor's task reads) and
:mod:`~spark_tasks.kafka_source.reader` (the ``DataSource`` and its stream reader). The barrier entry's
codec is :mod:`events.wire.barrier_entry`. This package exports the names its importers use.


**Differences from the built-in source**, all documented in docs/spark.md: no
``assign``/``subscribePattern``/``startingTimestamp``/``endingOffsets``/
``minOffsetsPerTrigger``, no batch (``spark.read``) reader, no consumer cache or
``kafkaConsumer.*`` options besides the poll timeout, rows go through Python (slower),
gaps inside a range (compaction, transaction markers) are skipped silently, and
``maxOffsetsPerTrigger`` needs Spark >= 4.2 for the ReadLimit API (on 4.0/4.1 the
cap is applied from the last offsets this reader saw).
"""

from events.wire.barrier_entry import barrier_json, entry_barrier
from spark_tasks.kafka_source.offsets import (
    BARRIER_KEY,
    EARLIEST,
    LATEST,
    MARKER_KEY,
    TopicPartitionKey,
    barrier_of,
    from_offsets,
    marker_of,
    rate_limit,
    to_offsets,
)
from spark_tasks.kafka_source.options import (
    BACKGROUND_FETCH_WAIT_MAX_MS,
    FORMAT,
    SOURCE_ID,
    KafkaSourceOptions,
)
from spark_tasks.kafka_source.probes import BarrierFeed, OffsetProbe, end_offsets
from spark_tasks.kafka_source.reader import KafkaSource, KafkaStreamReader
from spark_tasks.kafka_source.reading import (
    BARRIER_COLUMN,
    MARKER_COLUMN,
    DataLossError,
    KafkaInputPartition,
    kafka_schema,
    read_chunks,
)

__all__ = [
    "BACKGROUND_FETCH_WAIT_MAX_MS",
    "BARRIER_COLUMN",
    "BARRIER_KEY",
    "EARLIEST",
    "FORMAT",
    "LATEST",
    "MARKER_COLUMN",
    "MARKER_KEY",
    "SOURCE_ID",
    "BarrierFeed",
    "DataLossError",
    "KafkaInputPartition",
    "KafkaSource",
    "KafkaSourceOptions",
    "KafkaStreamReader",
    "OffsetProbe",
    "TopicPartitionKey",
    "barrier_json",
    "barrier_of",
    "end_offsets",
    "entry_barrier",
    "from_offsets",
    "kafka_schema",
    "marker_of",
    "rate_limit",
    "read_chunks",
    "to_offsets",
]
