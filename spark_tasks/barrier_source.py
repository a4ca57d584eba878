"""The ``cutline-barriers`` source: checkpoint barriers for a query that reads Kafka with Spark's own
``kafka`` connector (docs/spark.md, "Checkpoints on Spark's own kafka connector").

The JVM connector cannot fold a barrier into its offsets as ``cutline-kafka`` does, so a checkpointed
job unions its ``format("kafka")`` stream with this small Python Data Source. Spark plans a
micro-batch across every source of a query at once and logs all their end offsets together in
``<checkpoint>/offsets/N``, so a barrier this source folds into a batch's end offset is in exactly
that batch, beside the Kafka offsets the batch reads: the batch's start is the checkpoint's cut on
every Kafka partition at once.

- **Offsets.** ``{"__cutline_barriers__": n}``: ``n`` barriers folded so far; a batch with a barrier
  ends at ``{"__cutline_barrier__": <entry>, "__cutline_barriers__": n + 1}`` (the entry is
  :mod:`events.wire.barrier_entry`'s). With no barrier pending :meth:`BarrierStreamReader.latestOffset`
  answers the start itself, so this source alone never makes a batch run.
- **One row per barrier batch**: ``topic`` ``cutline-barriers``, ``partition`` 0, ``offset`` ``n + 1``,
  ``key``/``value`` null, ``timestamp`` the barrier's, ``cutline_barrier`` the entry's JSON. The keyed
  map side copies it to every shuffle partition (:func:`spark_tasks.keyed.route_step`). A per-partition
  job's tasks never see it (``cutline.barrierRows`` false): the driver snapshots their state at the
  cut (:class:`spark_tasks.connector_cuts.PartitionSnapshots`).
- **Latency markers** (``cutline.latencyIntervalMs`` > 0): a due marker is folded into the end offset
  (``"__cutline_marker__": {"marked_ms": <now>}``) when ``latestOffset`` is called and becomes one row
  after the barrier's (``cutline_marker`` the marker's JSON, source :data:`MARKER_SOURCE_ID`, subtask
  0), which travels the union and the shuffle as the records do. The source cannot see whether the
  Kafka source has records, so a marker makes a batch of its own: an idle query runs one batch with
  no records per interval.
- **Its cost per trigger**: three round trips from Spark's driver to this source's Python process
  (``latestOffset``, the last batch's ``commit`` and the batch's ``partitions``), each well under a
  millisecond of work here (:meth:`BarrierStreamReader.latestOffset` takes no arguments so that Spark
  asks no ``reportLatestOffset`` besides), and no Spark task unless the batch has a barrier row or a
  marker. Its Kafka consumer (:class:`~spark_tasks.kafka_source.BarrierFeed`) is made as the runner
  starts, before the query's first trigger.
- **Stopping.** While the job's pause file exists (``CheckpointedJob.stop`` creates it) ``latestOffset``
  blocks, up to :data:`HOLD_AFTER_PAUSE_S`, after creating ``<pause file>.held``: the job then stops
  the query, which interrupts that call, never a running batch (an interrupted ``foreachBatch``
  batch can overflow the query thread's stack in classic PySpark, SPARK-48717).
- **Stop with a savepoint.** After a batch that folded a stop barrier, ``latestOffset`` *holds*: it
  does not return until another barrier arrives (the savepoint failed and the coordinator's scheduler
  resumed) or, once the job's pause file exists, :data:`HOLD_AFTER_PAUSE_S` later. Spark plans no
  batch meanwhile, whatever the Kafka source has, and the job stops the query (an interrupt Spark
  takes as a clean stop) when the savepoint completes.

Options: ``cutline.job`` and ``cutline.bootstrap`` (required), ``cutline.topicPrefix`` (default
``cutline.``), ``cutline.attempt`` (barriers of older attempts are ignored), ``cutline.wireFormat``,
``cutline.schemaRegistryUrl``, ``cutline.barrierFetchWaitMs`` (default 500), ``cutline.pauseFile``,
``cutline.barrierRows`` (default true) and ``cutline.latencyIntervalMs`` (default 0: no markers).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from events.task.latency import LatencyMarker, MarkerSchedule
from events.wire.topics import DEFAULT_PREFIX, Topics
from events.wire.wire_settings import WireSettings
from spark_tasks.kafka_source import (
    BACKGROUND_FETCH_WAIT_MAX_MS,
    BARRIER_KEY,
    MARKER_KEY,
    BarrierFeed,
    barrier_json,
    kafka_schema,
    marker_of,
)
from spark_tasks.workers import freeze_worker_heap

__all__ = [
    "CHANNEL",
    "FOLDED_KEY",
    "FORMAT",
    "HOLD_AFTER_PAUSE_S",
    "MARKER_SOURCE_ID",
    "BarrierOffset",
    "BarrierSource",
    "BarrierSourceOptions",
    "BarrierStreamReader",
    "held_file",
    "holds",
    "in_source_runner",
    "is_barrier_offset",
    "next_end",
]

log = logging.getLogger(__name__)

FORMAT = "cutline-barriers"
"""The name to pass to ``spark.readStream.format(...)`` after ``spark.dataSource.register(BarrierSource)``."""

FOLDED_KEY = "__cutline_barriers__"
"""The key of this source's offset: how many barriers it folded. It tells its line in Spark's offset
log from the Kafka source's."""

CHANNEL = (FORMAT, 0)
"""The ``(topic, partition)`` of the barrier rows: the one input channel a keyed task aligns on."""

HOLD_AFTER_PAUSE_S = 30.0
"""How long a held ``latestOffset`` goes on holding once the job's pause file exists: the job stops
the query right after creating it, and a worker whose query has gone must not sleep for ever."""

MARKER_SOURCE_ID = "kafka"
"""The ``source_id`` of the latency markers of a job on the connector: they stand for the batches
of its ``kafka`` source, which this source only carries them beside."""

_HOLD_POLL_S = 0.05
_SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


@dataclass(frozen=True)
class BarrierOffset:
    """This source's offset: ``folded`` barriers so far, and the last one's entry if the batch that
    ends here folded it (a batch's start carries its predecessor's); ``marker_ms``, the time of the
    latency marker the batch that ends here carries."""

    folded: int
    barrier: Mapping[str, Any] | None = None
    marker_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Spark's offset (keys sorted: Spark compares offsets by their text)."""
        out: dict[str, Any] = {}
        if self.barrier is not None:
            out[BARRIER_KEY] = {k: self.barrier[k] for k in sorted(self.barrier)}
        out[FOLDED_KEY] = self.folded
        if self.marker_ms is not None:
            out[MARKER_KEY] = {"marked_ms": self.marker_ms}
        return out

    @classmethod
    def from_json(cls, offset: Mapping[str, Any] | str) -> BarrierOffset:
        parsed: Any = json.loads(offset) if isinstance(offset, str) else offset
        folded = parsed.get(FOLDED_KEY) if isinstance(parsed, Mapping) else None
        if isinstance(folded, bool) or not isinstance(folded, int) or folded < 0:
            raise ValueError(f"a {FORMAT} offset is {{{FOLDED_KEY!r}: <count>}}, got {offset!r}")
        barrier = parsed.get(BARRIER_KEY)
        if barrier is not None and not isinstance(barrier, Mapping):
            raise ValueError(f"{BARRIER_KEY} must be an object, got {barrier!r}")
        return cls(folded, None if barrier is None else dict(barrier), marker_of(parsed))

    @property
    def stops(self) -> bool:
        """Does it carry a stop-with-savepoint barrier?"""
        return self.barrier is not None and bool(self.barrier.get("stop"))


def in_source_runner() -> bool:
    """Is this process the driver's source runner (PySpark's ``python_streaming_source_runner``),
    which makes the reader once, as the query starts, and then asks it for every batch's offsets?"""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == _SOURCE_RUNNER


def held_file(pause_file: str) -> str:
    """The file the barrier source creates once it holds the next batch: the job may stop the query."""
    return f"{pause_file}.held"


def is_barrier_offset(line: str) -> bool:
    """Is ``line`` of Spark's offset log this source's (and not the Kafka source's)?"""
    try:
        parsed = json.loads(line)
    except ValueError:
        return False
    return isinstance(parsed, Mapping) and FOLDED_KEY in parsed


def next_end(
    start: BarrierOffset, pending: Mapping[str, Any] | None, marker_ms: int | None = None
) -> BarrierOffset:
    """The end offset of the batch planned from ``start``: the oldest ``pending`` barrier folded and
    the due latency marker's time ``marker_ms``, or, with neither, the start itself (so no batch runs
    for this source). After a stop barrier's batch only a new barrier moves it: no marker makes a
    batch run after the stop's."""
    if pending is None and (marker_ms is None or start.stops):
        return start
    if pending is None:
        return BarrierOffset(start.folded, None, marker_ms)
    return BarrierOffset(start.folded + 1, dict(pending), marker_ms)


def batch_rows(
    start: BarrierOffset, end: BarrierOffset, *, barrier_rows: bool = True
) -> BarrierPartition | None:
    """The rows of the batch from ``start`` to ``end``: its new barrier (unless ``barrier_rows`` is
    false) and its new latency marker, as one Spark task; None if it has neither."""
    barrier = end.barrier if end.barrier is not None and end.folded > start.folded and barrier_rows else None
    marker = end.marker_ms if end.marker_ms is not None and end.marker_ms != start.marker_ms else None
    if barrier is None and marker is None:
        return None
    return BarrierPartition(
        end.folded,
        None if barrier is None else barrier_json(barrier),
        int(barrier.get("timestamp_ms", 0)) if barrier is not None else 0,
        None if marker is None else LatencyMarker(marker, MARKER_SOURCE_ID, 0).to_json(),
    )


def holds(start: BarrierOffset, pending: Mapping[str, Any] | None) -> bool:
    """Must the next batch wait? After a stop barrier's batch, until another barrier comes."""
    return start.stops and pending is None


@dataclass(frozen=True)
class BarrierSourceOptions:
    """The parsed options of one :class:`BarrierSource`."""

    job: str
    bootstrap: str
    topic_prefix: str = DEFAULT_PREFIX
    attempt: int = 0
    wire: WireSettings = WireSettings()
    fetch_wait_ms: int = BACKGROUND_FETCH_WAIT_MAX_MS
    pause_file: str | None = None
    barrier_rows: bool = True
    """Emit a barrier batch's barrier row (a keyed job aligns on it; a per-partition job's driver
    snapshots instead, and its tasks see no barrier row)."""
    latency_interval_ms: int = 0
    """Fold a latency marker into a batch's end at most this often; 0: never (no ``cutline_marker``)."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> BarrierSourceOptions:
        opts = {str(k).lower(): v for k, v in options.items()}
        missing = [name for name in ("cutline.job", "cutline.bootstrap") if not opts.get(name)]
        if missing:
            raise ValueError(
                f"{FORMAT} needs the options {', '.join(missing)} (CheckpointedJob sets them; see "
                "docs/spark.md, 'Checkpoints on Spark's own kafka connector')"
            )
        registry = str(opts.get("cutline.schemaregistryurl", "")).strip() or None
        return cls(
            job=str(opts["cutline.job"]),
            bootstrap=str(opts["cutline.bootstrap"]),
            topic_prefix=str(opts.get("cutline.topicprefix", DEFAULT_PREFIX)),
            attempt=int(opts.get("cutline.attempt", 0)),
            wire=WireSettings(
                schema_registry_url=registry,
                wire_format=str(opts.get("cutline.wireformat", "single-object")).strip(),
            ),
            fetch_wait_ms=int(opts.get("cutline.barrierfetchwaitms", BACKGROUND_FETCH_WAIT_MAX_MS)),
            pause_file=str(opts["cutline.pausefile"]) if opts.get("cutline.pausefile") else None,
            barrier_rows=_flag(opts.get("cutline.barrierrows", "true"), "cutline.barrierRows"),
            latency_interval_ms=_non_negative(
                opts.get("cutline.latencyintervalms", 0), "cutline.latencyIntervalMs"
            ),
        )

    @property
    def markers(self) -> bool:
        """Does the source emit latency markers (and the ``cutline_marker`` column)?"""
        return self.latency_interval_ms > 0


def _flag(value: Any, name: str) -> bool:
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"{FORMAT}: {name} is true or false, got {value!r}")
    return text == "true"


def _non_negative(value: Any, name: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise ValueError(f"{FORMAT}: {name} is a number of milliseconds (0 or more), got {value!r}")
    return number


@dataclass(frozen=True)
class BarrierPartition(InputPartition):
    """The one Spark task of a batch with a barrier or a latency marker: their rows."""

    folded: int
    barrier: str | None
    timestamp_ms: int
    marker: str | None = None


class BarrierStreamReader(DataSourceStreamReader):
    """Plans batches of barriers: one barrier (one row) per batch, at most."""

    def __init__(self, options: BarrierSourceOptions) -> None:
        self.options = options
        self._last = BarrierOffset(0)
        self._markers = MarkerSchedule(options.latency_interval_ms)
        self._feed: BarrierFeed | None = None
        """Made on the driver's source runner only (never in a planning worker or executor): as the
        runner starts, before the query's first trigger (:func:`in_source_runner`), else on first use."""
        if in_source_runner():
            self._barrier_feed()  # from now on: barriers sent before the first batch are not missed

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_feed"] = None
        return state

    def _barrier_feed(self) -> BarrierFeed:
        if self._feed is None:
            options = self.options
            self._feed = BarrierFeed(
                options.bootstrap,
                Topics(options.topic_prefix).barriers,
                options.job,
                min_attempt=options.attempt,
                fetch_wait_ms=options.fetch_wait_ms,
                wire=options.wire,
            )
        return self._feed

    def initialOffset(self) -> dict[str, Any]:
        self._barrier_feed()  # from now on: barriers sent before the first batch are not missed
        return BarrierOffset(0).to_json()

    def latestOffset(self) -> dict[str, Any]:  # type: ignore[override]
        """The end of the next batch, from the end of the last one (:meth:`partitions` keeps it).

        The form without arguments on purpose: with ``(start, limit)`` Spark (>= 4.2) takes the source
        for one with admission control and asks ``reportLatestOffset`` after each call, one more
        round trip to this process every trigger, and this source has no limit to admit."""
        begin = self._last
        if self._paused():
            self._hold_paused()
            return begin.to_json()
        feed = self._barrier_feed()
        if begin.barrier is not None:
            feed.mark_folded(begin.barrier)  # folded into the batch that ended at ``begin``
        feed.poll()
        if holds(begin, feed.peek()):
            self._hold(feed)
        end = next_end(begin, feed.take(), self._due_marker())
        if end.folded != begin.folded:
            log.info("%s folds barrier %s into batch %d's end", FORMAT, end.barrier, end.folded)
        self._last = end
        return end.to_json()

    def _due_marker(self) -> int | None:
        """The time of a latency marker for the batch being planned, if one is due (else None)."""
        now = time.time_ns() // 1_000_000
        if not self._markers.due(now):
            return None
        self._markers = self._markers.emitted(now)
        return now

    def _paused(self) -> bool:
        pause = self.options.pause_file
        return pause is not None and os.path.exists(pause)

    def _mark_held(self) -> None:
        """Tell the job that no batch will be planned (``<pause file>.held``): it stops the query now."""
        if self.options.pause_file is not None:
            with open(held_file(self.options.pause_file), "w"):
                pass

    def _hold_paused(self) -> None:
        """The job is stopping: block the planning of the next batch until the query is stopped (or
        the pause file goes, or :data:`HOLD_AFTER_PAUSE_S` pass), so that the stop interrupts this
        call rather than a batch."""
        self._mark_held()
        paused_at = time.monotonic()
        while self._paused() and time.monotonic() - paused_at <= HOLD_AFTER_PAUSE_S:
            time.sleep(_HOLD_POLL_S)

    def _hold(self, feed: BarrierFeed) -> None:
        """Block the planning of the next batch after a stop barrier's (see the module docstring)."""
        log.info("%s holds the next batch: stop-with-savepoint", FORMAT)
        self._mark_held()
        paused_at: float | None = None
        while feed.peek() is None:
            time.sleep(_HOLD_POLL_S)
            feed.poll()
            pause = self.options.pause_file
            if pause is not None and os.path.exists(pause):
                paused_at = time.monotonic() if paused_at is None else paused_at
                if time.monotonic() - paused_at > HOLD_AFTER_PAUSE_S:
                    return
        log.info("%s reads on: a barrier after the stop's (its savepoint failed)", FORMAT)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[BarrierPartition]:
        """The batch from ``start`` to ``end``'s one task, if it has rows. Spark plans every batch it
        runs here, the one it runs again after a restart from its own checkpoint included, and hands
        a restarted query's last logged end here as ``partitions(end, end)``: the next batch starts
        at ``end``."""
        begin, until = BarrierOffset.from_json(start), BarrierOffset.from_json(end)
        self._last = until
        rows = batch_rows(begin, until, barrier_rows=self.options.barrier_rows)
        return [] if rows is None else [rows]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, BarrierPartition):
            raise TypeError(f"{FORMAT} cannot read {partition!r}")
        freeze_worker_heap()
        markers = self.options.markers
        if partition.barrier is not None:
            at = datetime.fromtimestamp(partition.timestamp_ms / 1000, UTC)
            row = (None, None, CHANNEL[0], CHANNEL[1], partition.folded, at, -1, partition.barrier)
            yield (*row, None) if markers else row
        if markers and partition.marker is not None:
            marked = LatencyMarker.from_json(partition.marker).marked_time_ms
            at = datetime.fromtimestamp(marked / 1000, UTC)
            yield (None, None, CHANNEL[0], CHANNEL[1], partition.folded, at, -1, None, partition.marker)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the barrier was taken from the feed when its batch was planned."""

    def stop(self) -> None:
        if self._feed is not None:
            self._feed.close()
            self._feed = None


class BarrierSource(DataSource):
    """``spark.readStream.format("cutline-barriers")``: a checkpointed job's barriers as a stream."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return kafka_schema(barriers=True, markers=BarrierSourceOptions.parse(self.options).markers)

    def streamReader(self, schema: StructType) -> BarrierStreamReader:
        return BarrierStreamReader(BarrierSourceOptions.parse(self.options))
