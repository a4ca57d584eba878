"""Latency markers in a Spark job (docs/spark.md, "Latency markers"): what each stage does with the
marker rows of the ``cutline-kafka`` source.

The source folds a marker into a batch's end offset and emits it as one row per Kafka partition
(column ``cutline_marker``, :mod:`spark_tasks.kafka_source.reading`); like a barrier row it never reaches
user code. Each stage it passes records ``now - marked_time`` as a
:class:`~events.wire.records.LatencyMeasured` for its operator subtask and sends them, without waiting,
to the acks topic once its task is done; the coordinator folds them into the job's histograms.

Operators (Flink's ``operator_id``), in pipeline order: ``step`` (a :class:`StatefulStep`, one
subtask per input partition), or ``route`` (the keyed job's map side, per input partition) and
``keyed`` (its :class:`KeyedStep`, per shuffle partition), then ``sink`` (:class:`CutFileSink`,
on the driver: subtask 0).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from events.kafka.clients import produce_record
from events.task.latency import LatencyMarker
from events.wire.records import LatencyMeasured
from spark_tasks.kafka_source.reading import MARKER_COLUMN
from spark_tasks.replies import ReplyTarget, task_producer

__all__ = ["KEYED", "ROUTE", "SINK", "STEP", "Measurements", "measure", "send_measurements"]

log = logging.getLogger(__name__)

STEP = "step"
"""The ``operator_id`` of a job's :class:`~spark_tasks.state.StatefulStep`."""
ROUTE = "route"
"""The ``operator_id`` of a keyed job's map side (before the shuffle)."""
KEYED = "keyed"
"""The ``operator_id`` of a keyed job's :class:`~spark_tasks.keyed.KeyedStep` (after the shuffle)."""
SINK = "sink"
"""The ``operator_id`` of :class:`~spark_tasks.sink.CutFileSink`."""


class Measurements:
    """The measurements of one task of one operator, sent when the task is done (:meth:`send`)."""

    def __init__(self, job_id: str, attempt: int, operator_id: str, subtask: int | None = None) -> None:
        self.job_id, self.attempt, self.operator_id, self.subtask = job_id, attempt, operator_id, subtask
        self.taken: list[LatencyMeasured] = []

    def marker(self, marker_json: str) -> None:
        """A marker row reached this operator now."""
        measured = measure(marker_json, self.job_id, self.attempt, self.operator_id, self.subtask)
        if measured is not None:
            self.taken.append(measured)

    def take_markers(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list[dict[str, Any]]]:
        """``batch`` without its marker rows, which are measured now; and those rows (``topic``,
        ``partition``, ``offset`` and the marker's JSON), for an operator that passes them on."""
        if MARKER_COLUMN not in batch.schema.names:
            return batch, []
        column = batch.column(MARKER_COLUMN)
        if column.null_count == batch.num_rows:
            return batch, []
        rows = batch.filter(pc.is_valid(column)).select(["topic", "partition", "offset", MARKER_COLUMN])
        markers = rows.to_pylist()
        for row in markers:
            self.marker(row[MARKER_COLUMN])
        return batch.filter(pc.is_null(column)), markers

    def send(self, settings: ReplyTarget) -> None:
        send_measurements(settings, self.taken)
        self.taken = []


def measure(
    marker_json: str, job_id: str, attempt: int, operator_id: str, subtask: int | None = None
) -> LatencyMeasured | None:
    """The marker of a ``cutline_marker`` cell reaching ``operator_id``'s subtask now (``subtask``
    None: the marker's source subtask, for an operator that runs in the source's task); None for a
    cell that is not a marker (logged)."""
    try:
        marker = LatencyMarker.from_json(marker_json)
    except ValueError as exc:
        log.warning("%s skips a latency marker it cannot read: %s", operator_id, exc)
        return None
    index = marker.source_subtask_index if subtask is None else subtask
    return marker.measured(job_id, attempt, operator_id, index, time.time_ns() // 1_000_000)


def send_measurements(settings: ReplyTarget, measurements: Iterable[LatencyMeasured]) -> None:
    """Hand ``measurements`` to the task's producer for the acks topic; never waits (a lost one
    costs a sample, never the batch)."""
    producer: Any = None
    for measured in measurements:
        producer = producer or task_producer(settings)
        try:
            produce_record(producer, settings.topics.acks, measured)
        except Exception as exc:  # a full queue, a closed producer: a sample lost
            log.warning("latency of %s not sent: %s", measured.operator_id, exc)
