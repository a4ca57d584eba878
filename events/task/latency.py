"""Latency markers and latency histograms, after Flink's ``LatencyMarker`` and ``LatencyStats``
(docs/design.md, "Latency markers"). Pure: no clock, no Kafka.

A source emits a :class:`LatencyMarker` every ``latency_interval_ms`` (:class:`MarkerSchedule`,
Flink's ``LatencyMarksEmitter``); it travels in-band as a barrier does and never reaches user
code. Every operator subtask it reaches records ``now - marked_time_ms`` as a
:class:`~events.wire.records.LatencyMeasured` on the acks topic. The coordinator folds those into one
:class:`LatencyHistogram` per key: which key depends on the :class:`Granularity` (Flink's
``metrics.latency.granularity``), and each keeps all-time bucket counts (the Prometheus histogram
at ``/metrics``) and the last :data:`HISTORY_SIZE` latencies (the quantiles of ``cutline status``
and the dashboard, as Flink's ``DescriptiveStatisticsHistogram``).

Anyone who may write the acks topic can send measurements, so both are bounded
(docs/wire-format.md, "Bounds"): :func:`measurement_problem` refuses ids over
:data:`MAX_LATENCY_ID_BYTES` and negative subtask indexes, and a job keeps at most
:data:`MAX_HISTOGRAMS` histograms; :func:`record_latency` counts the measurements of new keys past it
(``LatencyHistograms.dropped``) instead of folding them. So one job's share of ``/metrics`` stays
under 1 MB, whatever arrives.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeGuard

from events.wire.records import LatencyMeasured

__all__ = [
    "BUCKETS_MS",
    "HISTORY_SIZE",
    "MARKER_HEADER",
    "MAX_HISTOGRAMS",
    "MAX_LATENCY_ID_BYTES",
    "Granularity",
    "HistogramKey",
    "LatencyHistogram",
    "LatencyHistograms",
    "LatencyMarker",
    "MarkerSchedule",
    "fold_latency",
    "latency_json",
    "measurement_problem",
    "operator_summaries",
    "quantile",
    "record_latency",
    "summary",
]

HISTORY_SIZE = 128
"""Latencies a histogram keeps for its quantiles: Flink's ``metrics.latency.history-size``."""

BUCKETS_MS: tuple[float, ...] = (
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, math.inf,
)  # fmt: skip
"""Upper bounds (ms, inclusive) of the Prometheus histogram's buckets; the last is ``+Inf``."""

MARKER_HEADER = "cutline.latency-marker"
"""The Kafka header that carries a marker in a plain Kafka app's records (:meth:`LatencyMarker.header`)."""

MAX_HISTOGRAMS = 100
"""Histograms (keys) a job keeps; measurements of a new key past them are dropped and counted. Each
is 18 lines of ``/metrics`` (16 buckets, count, sum) of up to 8.5 KB at the id bound below: at most
about 850 KB a job, at any granularity."""

MAX_LATENCY_ID_BYTES = 64
"""UTF-8 bytes of a measurement's ``operator_id`` and ``source_id`` (Flink's operator ids are 32 hex
digits; cutline's own are words: ``route``, ``keyed``, ``cutline-kafka``)."""


class Granularity(StrEnum):
    """Flink's ``metrics.latency.granularity``: what one histogram tells apart.

    Every histogram is per operator and operator subtask; ``operator`` (the default, as in Flink)
    also per source, ``subtask`` per source and source subtask.
    """

    SINGLE = "single"
    OPERATOR = "operator"
    SUBTASK = "subtask"


@dataclass(frozen=True, slots=True)
class LatencyMarker:
    """A marker emitted by subtask ``source_subtask_index`` of source ``source_id`` at
    ``marked_time_ms`` (the source's wall clock)."""

    marked_time_ms: int
    source_id: str
    source_subtask_index: int

    def measured(
        self, job_id: str, attempt: int, operator_id: str, operator_subtask_index: int, now_ms: int
    ) -> LatencyMeasured:
        """The record of this marker reaching ``operator_id``'s subtask at ``now_ms``."""
        return LatencyMeasured(
            job_id=job_id,
            attempt=attempt,
            timestamp_ms=now_ms,
            marked_time_ms=self.marked_time_ms,
            source_id=self.source_id,
            source_subtask_index=self.source_subtask_index,
            operator_id=operator_id,
            operator_subtask_index=operator_subtask_index,
        )

    def to_json(self) -> str:
        """Compact JSON, keys sorted: how the marker rides a Spark row or a Kafka header."""
        return json.dumps(
            {
                "marked_ms": self.marked_time_ms,
                "source": self.source_id,
                "subtask": self.source_subtask_index,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(text: str | bytes) -> LatencyMarker:
        """The marker of :meth:`to_json`'s text; ``ValueError`` for anything else."""
        parsed: Any = json.loads(text)
        if not isinstance(parsed, Mapping):
            raise ValueError(f"a latency marker is a JSON object, got {parsed!r}")
        marked, source, subtask = parsed.get("marked_ms"), parsed.get("source"), parsed.get("subtask")
        if _is_int(marked) and isinstance(source, str) and _is_int(subtask):
            return LatencyMarker(marked, source, subtask)
        raise ValueError(f"not a latency marker: {parsed!r}")

    def header(self) -> tuple[str, bytes]:
        """The marker as a Kafka header (:data:`MARKER_HEADER`), for a plain Kafka app's records."""
        return MARKER_HEADER, self.to_json().encode()

    @staticmethod
    def from_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> LatencyMarker | None:
        """The marker among a record's headers, or None (none, or not readable)."""
        for key, value in headers or ():
            if key == MARKER_HEADER and value is not None:
                try:
                    return LatencyMarker.from_json(value)
                except ValueError:
                    return None
        return None


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class MarkerSchedule:
    """When a source's next marker is due: every ``interval_ms`` at a fixed rate from the first
    (Flink's ``LatencyMarksEmitter``); 0 disables markers (Flink's default)."""

    interval_ms: int
    next_due_ms: int | None = None
    """None: the first marker is due at once."""

    def due(self, now_ms: int) -> bool:
        return self.interval_ms > 0 and (self.next_due_ms is None or now_ms >= self.next_due_ms)

    def emitted(self, now_ms: int) -> MarkerSchedule:
        """The schedule after a marker went out at ``now_ms``: the next tick of the fixed rate after
        it (ticks missed while nothing could carry a marker are skipped, not caught up)."""
        if self.next_due_ms is None or self.interval_ms <= 0:
            return MarkerSchedule(self.interval_ms, now_ms + self.interval_ms)
        behind = max(0, now_ms - self.next_due_ms)
        ticks = behind // self.interval_ms + 1
        return MarkerSchedule(self.interval_ms, self.next_due_ms + ticks * self.interval_ms)


@dataclass(frozen=True, slots=True)
class HistogramKey:
    """What one histogram is of; the source fields are None where the granularity merges them."""

    operator_id: str
    operator_subtask_index: int
    source_id: str | None = None
    source_subtask_index: int | None = None

    @staticmethod
    def of(measured: LatencyMeasured, granularity: Granularity) -> HistogramKey:
        source = None if granularity is Granularity.SINGLE else measured.source_id
        subtask = measured.source_subtask_index if granularity is Granularity.SUBTASK else None
        return HistogramKey(measured.operator_id, measured.operator_subtask_index, source, subtask)


@dataclass(frozen=True, slots=True)
class LatencyHistogram:
    """Latencies of one key: all-time counts per bucket of :data:`BUCKETS_MS` (not cumulative), their
    count and sum, and the last :data:`HISTORY_SIZE` latencies, oldest first."""

    buckets: tuple[int, ...] = (0,) * len(BUCKETS_MS)
    count: int = 0
    sum_ms: int = 0
    recent: tuple[int, ...] = ()

    def observe(self, latency_ms: int) -> LatencyHistogram:
        """This histogram with one more latency (a negative one, from clocks apart, counts as 0)."""
        latency = max(0, latency_ms)
        index = next(i for i, bound in enumerate(BUCKETS_MS) if latency <= bound)
        buckets = (*self.buckets[:index], self.buckets[index] + 1, *self.buckets[index + 1 :])
        return LatencyHistogram(
            buckets, self.count + 1, self.sum_ms + latency, (*self.recent[1 - HISTORY_SIZE :], latency)
        )

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as a Prometheus histogram has them."""
        out, total = [], 0
        for bound, count in zip(BUCKETS_MS, self.buckets, strict=True):
            total += count
            out.append(("+Inf" if math.isinf(bound) else f"{bound:g}", total))
        return out


@dataclass(frozen=True, slots=True)
class LatencyHistograms:
    """One job's latency histograms, by key, in the order their keys were first seen (at most
    :data:`MAX_HISTOGRAMS`)."""

    granularity: Granularity = Granularity.OPERATOR
    histograms: Mapping[HistogramKey, LatencyHistogram] = field(default_factory=dict)
    dropped: int = 0
    """Measurements not folded because their key would have been one histogram too many."""


def measurement_problem(measured: LatencyMeasured) -> str | None:
    """Why a measurement is refused (a dead letter), or None: an ``operator_id`` or ``source_id``
    over :data:`MAX_LATENCY_ID_BYTES`, or a negative subtask index."""
    for name, value in (("operator_id", measured.operator_id), ("source_id", measured.source_id)):
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_LATENCY_ID_BYTES:
            return f"{name} of {size} bytes; at most {MAX_LATENCY_ID_BYTES} are accepted"
    for name, index in (
        ("operator_subtask_index", measured.operator_subtask_index),
        ("source_subtask_index", measured.source_subtask_index),
    ):
        if index < 0:
            return f"{name} must not be negative: {index}"
    return None


def record_latency(state: LatencyHistograms, measured: LatencyMeasured) -> LatencyHistograms:
    """``state`` with one more measurement, in the histogram its granularity puts it in; a
    measurement that would open histogram number ``MAX_HISTOGRAMS + 1`` is only counted
    (``dropped``)."""
    key = HistogramKey.of(measured, state.granularity)
    histogram = state.histograms.get(key)
    if histogram is None:
        if len(state.histograms) >= MAX_HISTOGRAMS:
            return LatencyHistograms(state.granularity, state.histograms, state.dropped + 1)
        histogram = LatencyHistogram()
    latency = measured.timestamp_ms - measured.marked_time_ms
    histograms = {**state.histograms, key: histogram.observe(latency)}
    return LatencyHistograms(state.granularity, histograms, state.dropped)


def fold_latency(measurements: Iterable[LatencyMeasured], state: LatencyHistograms) -> LatencyHistograms:
    """Every measurement recorded in ``state``, in order."""
    for measured in measurements:
        state = record_latency(state, measured)
    return state


def quantile(values: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile of ``values`` by linear interpolation between order statistics (Apache
    Commons Math's default estimation, as Flink's histograms); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) + 1) - 1
    if position <= 0:
        return float(ordered[0])
    if position >= len(ordered) - 1:
        return float(ordered[-1])
    low = math.floor(position)
    return ordered[low] + (position - low) * (ordered[low + 1] - ordered[low])


def summary(recent: Sequence[int], count: int) -> dict[str, Any]:
    """The figures shown of a set of recent latencies: count (all time), min, p50, p99, max, mean."""
    return {
        "count": count,
        "min": min(recent) if recent else None,
        "p50": quantile(recent, 0.5),
        "p99": quantile(recent, 0.99),
        "max": max(recent) if recent else None,
        "mean": round(sum(recent) / len(recent), 1) if recent else None,
    }


def operator_summaries(state: LatencyHistograms) -> list[dict[str, Any]]:
    """Per operator (all its subtasks and sources together): the summary of their recent latencies,
    operators in the order they were first seen (the pipeline's order, source to sink)."""
    merged: dict[str, tuple[list[int], int]] = {}
    for key, histogram in state.histograms.items():
        recent, count = merged.setdefault(key.operator_id, ([], 0))
        recent.extend(histogram.recent)
        merged[key.operator_id] = (recent, count + histogram.count)
    return [{"operator_id": op, **summary(recent, count)} for op, (recent, count) in merged.items()]


def latency_json(state: LatencyHistograms) -> dict[str, Any]:
    """A job's latency as the coordinator's ``/jobs/JOB/latency`` shows it: per operator, and per
    histogram of the granularity (recent quantiles, all-time count)."""
    return {
        "granularity": state.granularity.value,
        "history_size": HISTORY_SIZE,
        "operators": operator_summaries(state),
        "histograms": [
            {
                "source_id": key.source_id,
                "source_subtask_index": key.source_subtask_index,
                "operator_id": key.operator_id,
                "operator_subtask_index": key.operator_subtask_index,
                **summary(histogram.recent, histogram.count),
            }
            for key, histogram in state.histograms.items()
        ],
    }
