"""The ``cutline-kafka`` source as PySpark sees it: the :class:`KafkaSource` data source and its
micro-batch :class:`KafkaStreamReader`.

**Where each part runs.** ``initialOffset``/``latestOffset``/``partitions``/``commit`` run in one
long-lived Python worker on the driver; the reader keeps one :class:`OffsetProbe` consumer and, with
``cutline.job``, one :class:`BarrierFeed` there. ``read`` runs in Python workers on executors and
reads with :func:`read_chunks`, a consumer per call (the reader object is pickled to them, so the
probe and the feed are not part of its pickled state).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from events.task.latency import LatencyMarker, MarkerSchedule
from events.wire.barrier_entry import barrier_json
from spark_tasks.kafka_source.offsets import (
    EARLIEST,
    LATEST,
    TopicPartitionKey,
    barrier_of,
    from_offsets,
    marker_of,
    partition_order,
    rate_limit,
    to_offsets,
)
from spark_tasks.kafka_source.options import FORMAT, SOURCE_ID, KafkaSourceOptions
from spark_tasks.kafka_source.probes import BarrierFeed, OffsetProbe
from spark_tasks.kafka_source.reading import (
    DataLossError,
    KafkaInputPartition,
    barrier_batch,
    kafka_schema,
    marker_batch,
    read_chunks,
    record_batch,
)
from spark_tasks.workers import freeze_worker_heap

try:  # Spark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    ReadLimit = object  # type: ignore[misc,assignment]

    class ReadAllAvailable:  # type: ignore[no-redef]
        """Stand-in so the reader imports on Spark 4.0/4.1."""

    @dataclass
    class ReadMaxRows:  # type: ignore[no-redef]
        """Stand-in so the reader imports on Spark 4.0/4.1."""

        max_rows: int

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in so the reader imports on Spark 4.0/4.1."""


__all__ = ["KafkaSource", "KafkaStreamReader"]

log = logging.getLogger(__name__)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch reader: plans one Spark task per Kafka partition with new records."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._probe: OffsetProbe | None = None
        self._available_now: dict[TopicPartitionKey, int] | None = None
        self._latest: dict[TopicPartitionKey, int] | None = None
        self._initial: dict[TopicPartitionKey, int] | None = None
        self._last_end: dict[TopicPartitionKey, int] | None = None
        self._last_barrier: dict[str, Any] | None = None
        self._stopped = False
        """A stop-with-savepoint barrier was folded: no new offsets until a newer barrier comes (its
        savepoint failed, the scheduler resumed) or the query stops (it completed)."""
        self._last_marker: int | None = None
        self._markers = MarkerSchedule(options.latency_interval_ms if options.markers else 0)
        # With cutline.job: the barriers that arrive from now on
        # (barrier alignment, docs/design.md, "Tasks and Spark").
        # Made at the first initialOffset/latestOffset, which only the query's source runner
        # calls: Spark also builds this reader in a planning worker for the first batch, where
        # a feed (a consumer, and a round trip to find the partition's end) would delay that batch.
        self._barriers: BarrierFeed | None = None

    def _barrier_feed(self) -> BarrierFeed | None:
        """The job's :class:`BarrierFeed` (made on first use), or None without ``cutline.job``."""
        options = self.options
        if self._barriers is None and options.job is not None:
            bootstrap = options.cutline_bootstrap or options.bootstrap
            extra = dict(options.kafka) if options.cutline_bootstrap in (None, options.bootstrap) else {}
            extra.pop("bootstrap.servers", None)
            self._barriers = BarrierFeed(
                bootstrap,
                options.barriers_topic,
                options.job,
                extra,
                min_attempt=options.attempt,
                fetch_wait_ms=options.barrier_fetch_wait_ms,
                wire=options.wire,
            )
        return self._barriers

    # The reader is pickled to the executors (read() runs there); the consumers stay behind.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_probe"] = None
        state["_barriers"] = None
        return state

    @property
    def probe(self) -> OffsetProbe:
        if self._probe is None:
            self._probe = OffsetProbe.for_options(self.options)
        return self._probe

    def _current_end(self) -> dict[TopicPartitionKey, int]:
        probe = self.probe
        return probe.latest(probe.partitions(self.options.topics))

    def initialOffset(self) -> dict[str, dict[str, int]]:
        # Spark 4.3 calls this twice for the first batch (to plan it and again to run it);
        # "latest" must resolve once, or records produced in between would fall in no batch.
        if self._initial is None:
            self._barrier_feed()  # from now on: before the first batch can be planned
            self._initial = self._resolve_starting_offsets()
            self._last_end = dict(self._initial)
            log.info("%s initial offsets (%s): %s", FORMAT, self.options.starting_offsets, self._initial)
        return to_offsets(self._initial)

    def _resolve_starting_offsets(self) -> dict[TopicPartitionKey, int]:
        probe = self.probe
        tps = probe.partitions(self.options.topics)
        starting = self.options.starting_offsets
        if starting == "earliest":
            offsets = probe.earliest(tps)
        elif starting == "latest":
            offsets = probe.latest(tps)
        else:
            requested = from_offsets(starting)
            missing = sorted(set(tps) - set(requested), key=partition_order)
            unknown = sorted(set(requested) - set(tps), key=partition_order)
            if missing or unknown:
                raise ValueError(
                    "startingOffsets must name every partition of the subscribed topics "
                    f"(-1 latest, -2 earliest): missing {missing}, not in the topics {unknown}"
                )
            earliest = probe.earliest(tp for tp, o in requested.items() if o == EARLIEST)
            latest = probe.latest(tp for tp, o in requested.items() if o == LATEST)
            offsets = {tp: earliest.get(tp, latest.get(tp, o)) for tp, o in requested.items()}
        return offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._current_end()
        log.info("%s Trigger.AvailableNow reads up to %s", FORMAT, self._available_now)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, dict[str, int]]:
        if start is None:  # Spark 4.0/4.1 call latestOffset() with no start and no limit
            begin = dict(self._last_end or {})
            begin_barrier, begin_marker = self._last_barrier, self._last_marker
            limit = self.getDefaultReadLimit() if begin else ReadAllAvailable()
        else:
            begin = from_offsets(start)
            begin_barrier, begin_marker = barrier_of(start), marker_of(start)
        if begin and self.options.pause_file is not None and os.path.exists(self.options.pause_file):
            # Paused: answer the start itself, so no batch runs; a barrier stays in its feed.
            return to_offsets(begin, begin_barrier, begin_marker)
        feed = self._barrier_feed()
        if feed is not None:
            if begin_barrier is not None:
                feed.mark_folded(begin_barrier)  # e.g. after a restart: folded into batch start
            feed.poll()  # before the ends: records produced before a barrier fall in its batch
        latest = dict(self._available_now) if self._available_now is not None else self._current_end()
        self._latest = dict(latest)
        end = dict(begin)
        new = [tp for tp in latest if tp not in begin]
        known = self.probe.earliest(new) if new else {}
        for tp, offset in latest.items():
            floor = begin.get(tp, known.get(tp, 0))
            if offset < floor:
                message = f"{tp[0]}[{tp[1]}]: end offset {offset} is below the committed offset {floor}"
                if self.options.fail_on_data_loss:
                    raise DataLossError(message + " (the partition lost records); set failOnDataLoss=false")
                log.warning("%s; keeping %d", message, floor)
                offset = floor
            end[tp] = offset
        if isinstance(limit, ReadMaxRows):
            end = {**end, **rate_limit(limit.max_rows, {**known, **begin}, end)}
        elif limit is not None and not isinstance(limit, ReadAllAvailable):
            raise ValueError(f"{FORMAT} supports maxOffsetsPerTrigger (ReadMaxRows) only, got {limit!r}")
        if self._stopped_at_barrier(feed):
            end = dict(begin)  # read nothing after the stop savepoint's cut
        barrier = feed.take() if feed is not None else None
        if barrier is not None and barrier.get("stop"):
            # The barrier batch holds no records: its cut (the batch's start) is the end of the
            # output, and the sink's last file ends exactly at the savepoint's offsets.
            end, self._stopped = dict(begin), True
            log.info("%s stops reading at %s for stop-with-savepoint %s", FORMAT, end, barrier["id"])
        marker = None
        if barrier is None and end == begin:
            # Nothing new: answer the start itself (with its barrier and marker, if it has them),
            # so no batch runs. A barrier is folded into exactly one batch's end offset.
            barrier, marker = begin_barrier, begin_marker
        else:
            if barrier is not None:
                log.info("%s folds barrier %s into the batch ending at %s", FORMAT, barrier, end)
            marker = self._due_marker()
        self._last_end = end
        self._last_barrier, self._last_marker = barrier, marker
        return to_offsets(end, barrier, marker)

    def _due_marker(self) -> int | None:
        """The time of a latency marker for the batch being planned, if one is due (else None)."""
        now = time.time_ns() // 1_000_000
        if not self._markers.due(now):
            return None
        self._markers = self._markers.emitted(now)
        return now

    def _stopped_at_barrier(self, feed: BarrierFeed | None) -> bool:
        """Still stopped at a stop-with-savepoint's cut? A newer barrier ends it: the savepoint failed
        and the coordinator's scheduler resumed (docs/spark.md, "Stop with a savepoint")."""
        newer = feed.peek() if self._stopped and feed is not None else None
        if newer is not None and not newer.get("stop"):
            log.info("%s reads on: the stop-with-savepoint failed", FORMAT)
            self._stopped = False
        return self._stopped

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None if self._latest is None else to_offsets(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaInputPartition]:
        """One task per partition with new records; with a barrier in ``end``, one per partition."""
        begin, until = from_offsets(start), from_offsets(end)
        barrier = barrier_of(end) if self.options.job is not None else None
        if barrier is not None and barrier == barrier_of(start):
            barrier = None  # not a new barrier (latestOffset never answers this way; be safe)
        text = None if barrier is None else barrier_json(barrier)
        marked = marker_of(end) if self.options.markers else None
        if marked is not None and marked == marker_of(start):
            marked = None
        new = [tp for tp in until if tp not in begin]
        earliest = self.probe.earliest(new) if new else {}
        splits = []
        for subtask, tp in enumerate(sorted(until, key=partition_order)):
            first = begin.get(tp, earliest.get(tp, 0))
            if until[tp] > first or text is not None:
                # the source's subtask index of a partition: its place among the job's partitions
                marker = None if marked is None else LatencyMarker(marked, SOURCE_ID, subtask).to_json()
                splits.append(KafkaInputPartition(tp[0], tp[1], first, max(first, until[tp]), text, marker))
        return splits

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's records as Arrow batches (:func:`record_batch`); with ``cutline.job``, the
        batch's barrier row first.

        The barrier goes first, with the partition's *start* offset of the batch: the cut
        of a checkpoint is the start of its barrier's batch, i.e. the end of the batch
        before, whose output Spark has already committed to the sink (micro-batches run
        one after another). A snapshot taken at the barrier therefore never covers a
        record whose output could still be lost, and restoring it replays the batch.
        """
        if not isinstance(partition, KafkaInputPartition):
            raise TypeError(f"{FORMAT} cannot read {partition!r}")
        from pyspark.sql.pandas.types import to_arrow_schema

        freeze_worker_heap()

        include_headers = self.options.include_headers
        options = self.options
        schema = to_arrow_schema(
            kafka_schema(include_headers, barriers=options.job is not None, markers=options.markers),
            timezone="UTC",
        )
        if self.options.job is not None and partition.barrier is not None:
            yield barrier_batch(partition, schema, include_headers)
        if self.options.markers and partition.marker is not None:
            yield marker_batch(partition, schema, include_headers)
        for chunk in read_chunks(self.options, partition):
            yield record_batch(chunk, schema, include_headers)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has finished the batches up to ``end``; like Spark's source, nothing goes to Kafka."""
        log.debug("%s committed %s", FORMAT, end)

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None
        if self._barriers is not None:
            self._barriers.close()
            self._barriers = None


class KafkaSource(DataSource):
    """``spark.readStream.format("cutline-kafka")``: Spark's Kafka source on confluent-kafka."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        options = KafkaSourceOptions.parse(self.options)
        return kafka_schema(
            options.include_headers, barriers=options.job is not None, markers=options.markers
        )

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(KafkaSourceOptions.parse(self.options))
