"""Prometheus metrics of a coordinator worker, at ``GET /metrics`` (docs/coordinator.md, "Metrics").

Per job, Flink's checkpoint metrics under Flink's names (``lastCheckpointDuration``,
``numberOfCompletedCheckpoints`` ...), prefixed ``cutline_job_`` and labelled ``job_id``;
Flink reports them as gauges, and so does this. Each worker reports the jobs it owns (the
jobs of its claimed journal partitions): scrape every worker, and each job comes from exactly
one of them at a time. Next to them the worker's own: inputs decided per topic, dead letters
by reason, its journal partitions (epoch, offset, how long their recovery took), how far its
fetch position is behind each input partition's end, and its scheduled garbage collections.

Latency markers' histograms are Flink's ``latency`` as ``cutline_job_latency`` (ms; labels after
Flink's metric groups at the coordinator's ``--latency-granularity``), at most
``events.task.latency.MAX_HISTOGRAMS`` a job, and the measurements dropped past them as
``cutline_job_latency_measurements_dropped_total``.

Job metrics are read from the coordinator's state at scrape time (a custom collector), so
deciding an input costs nothing more; the worker's counters are kept by the runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from coordinator.service.gc_schedule import ScheduledCollections
from coordinator.service.health import BrokerHealth
from coordinator.service.runtime import Coordinator
from events.task.latency import MAX_HISTOGRAMS, Granularity, HistogramKey

JOB_PREFIX = "cutline_job_"
WORKER_PREFIX = "cutline_coordinator_"


@dataclass(frozen=True, slots=True)
class PartitionView:
    """What the worker knows of one journal partition it owns."""

    partition: int
    epoch: int
    ready: bool
    journal_offset: int
    recovery_seconds: float | None
    phase: str = "DECIDING"
    """Its :class:`coordinator.core.ownership.Phase`: ``STEPPED_DOWN`` when a newer claim fenced it."""
    why: str | None = None
    """Why it is not decided here (None: it is)."""
    undecided_seconds: float = 0.0
    """How long it has been held here without being decided (0 while decided)."""


@dataclass(frozen=True, slots=True)
class InputLag:
    topic: str
    partition: int
    records: int


@dataclass(frozen=True, slots=True)
class RefetchCounts:
    """What rebalances cost the worker's input consumer (``DirectConsumer``) since it started."""

    records_fetched_again: int = 0
    partitions_sought_back: int = 0


class CoordinatorCollector(Collector):
    """Reads ``coordinator`` (and the shell's views of partitions and input lag) at each scrape."""

    def __init__(
        self,
        coordinator: Coordinator,
        partitions: Callable[[], Iterable[PartitionView]] = lambda: (),
        input_lag: Callable[[], Iterable[InputLag]] = lambda: (),
        collections: ScheduledCollections | None = None,
        broker: Callable[[], BrokerHealth] | None = None,
        refetches: Callable[[], RefetchCounts] = RefetchCounts,
    ) -> None:
        self.coordinator = coordinator
        self.partitions = partitions
        self.input_lag = input_lag
        self.collections = collections
        self.broker = broker
        self.refetches = refetches

    def collect(self) -> Iterator[Metric]:
        yield from self._jobs()
        yield from self._latency()
        yield from self._worker()

    def _latency(self) -> Iterator[Metric]:
        """Flink's ``latency`` histograms, ms, labelled as its metric groups at the coordinator's
        granularity: ``operator_id`` and ``operator_subtask_index``, with ``source_id`` (operator,
        subtask) and ``source_subtask_index`` (subtask); and per job the measurements dropped past
        its bound of histograms (events/task/latency.py)."""
        granularity = self.coordinator.latency_granularity
        labels = ["job_id", *LATENCY_LABELS[granularity]]
        family = HistogramMetricFamily(
            JOB_PREFIX + "latency",
            "Latency markers' time from their source to each operator subtask, ms (Flink's latency).",
            labels=labels,
        )
        dropped = CounterMetricFamily(
            JOB_PREFIX + "latency_measurements_dropped",
            f"Latency measurements not folded: a new key past the {MAX_HISTOGRAMS} histograms a job keeps.",
            labels=["job_id"],
        )
        for job_id, state in sorted(self.coordinator.latency.items()):
            for key, histogram in state.histograms.items():
                family.add_metric(
                    [job_id, *_label_values(key, granularity)], histogram.cumulative(), histogram.sum_ms
                )
            dropped.add_metric([job_id], state.dropped)
        yield from (family, dropped)

    def _jobs(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(JOB_PREFIX + name, doc, labels=["job_id"])

        families = {
            "total": gauge(
                "totalNumberOfCheckpoints", "Checkpoints triggered (Flink's totalNumberOfCheckpoints)."
            ),
            "completed": gauge("numberOfCompletedCheckpoints", "Checkpoints completed."),
            "failed": gauge("numberOfFailedCheckpoints", "Checkpoints failed (aborted, expired, declined)."),
            "in_progress": gauge("numberOfInProgressCheckpoints", "Checkpoints triggered and not yet ended."),
            "duration": gauge(
                "lastCheckpointDuration", "Trigger to completion of the last completed checkpoint, ms."
            ),
            "size": gauge("lastCheckpointSize", "State size of the last completed checkpoint, bytes."),
            "completed_id": gauge("lastCompletedCheckpointId", "Id of the last completed checkpoint."),
            "restore": gauge(
                "lastCheckpointRestoreTimestamp",
                "When the job last restored a checkpoint, ms since the epoch.",
            ),
            "restarts": gauge("numRestarts", "Restarts of the job by its restart strategy so far."),
            "attempt": gauge("attempt", "The job's current attempt number."),
            "running": gauge("isRunning", "1 while the job's status is RUNNING."),
        }
        for job_id, state in sorted(self.coordinator.states.items()):
            stats = self.coordinator.stats.get(job_id)
            values: dict[str, float] = {
                "attempt": state.attempt,
                "restarts": state.restarts,
                "running": 1.0 if state.status is not None and state.status.value == "RUNNING" else 0.0,
            }
            if stats is not None:
                values.update(
                    total=stats.total,
                    completed=stats.completed,
                    failed=stats.failed,
                    in_progress=stats.in_progress,
                )
                latest = stats.latest_completed
                if latest is not None:
                    values.update(
                        duration=latest.end_to_end_duration or 0,
                        size=latest.state_size,
                        completed_id=latest.id,
                    )
                if stats.latest_restored is not None:
                    values["restore"] = stats.latest_restored.timestamp_ms
            else:
                values.update(total=0, completed=0, failed=0, in_progress=0)
            for key, value in values.items():
                families[key].add_metric([job_id], float(value))
        yield from families.values()

    def _worker(self) -> Iterator[Metric]:
        decided = CounterMetricFamily(
            WORKER_PREFIX + "inputs_decided", "Input messages decided, by topic.", labels=["topic"]
        )
        for topic, count in sorted(self.coordinator.inputs_decided.items()):
            decided.add_metric([topic], count)
        yield decided
        letters = CounterMetricFamily(
            WORKER_PREFIX + "dead_letters", "Dead letters written, by reason.", labels=["reason"]
        )
        for reason, count in sorted(self.coordinator.dead_letters.items()):
            letters.add_metric([reason], count)
        yield letters
        yield GaugeMetricFamily(
            WORKER_PREFIX + "jobs", "Jobs this worker owns.", value=len(self.coordinator.states)
        )
        if self.broker is not None:
            yield GaugeMetricFamily(
                WORKER_PREFIX + "broker_reachable",
                "0 while the broker fails this worker's probes (/ready answers 503), else 1.",
                value=0.0 if self.broker().reachable is False else 1.0,
            )

        views = sorted(self.partitions(), key=lambda v: v.partition)
        labels = ["partition"]
        epoch = GaugeMetricFamily(
            WORKER_PREFIX + "partition_epoch", "This worker's claim epoch.", labels=labels
        )
        ready = GaugeMetricFamily(
            WORKER_PREFIX + "partition_ready", "1 once the partition is claimed and folded.", labels=labels
        )
        offset = GaugeMetricFamily(
            WORKER_PREFIX + "journal_offset", "Last journal offset written or read to.", labels=labels
        )
        recovery = GaugeMetricFamily(
            WORKER_PREFIX + "recovery_seconds",
            "How long claiming and folding the partition took.",
            labels=labels,
        )
        undecided = GaugeMetricFamily(
            WORKER_PREFIX + "partition_undecided_seconds",
            "How long a journal partition assigned to this worker has not been decided here (0 while it "
            "is): its jobs get no checkpoint meanwhile; /ready says why.",
            labels=labels,
        )
        stepped_down = GaugeMetricFamily(
            WORKER_PREFIX + "partitions_stepped_down",
            "Assigned journal partitions this worker stopped deciding because a newer claim fenced it.",
            value=sum(1 for view in views if view.phase == "STEPPED_DOWN"),
        )
        for view in views:
            key = [str(view.partition)]
            epoch.add_metric(key, view.epoch)
            ready.add_metric(key, 1.0 if view.ready else 0.0)
            offset.add_metric(key, view.journal_offset)
            if view.recovery_seconds is not None:
                recovery.add_metric(key, view.recovery_seconds)
            undecided.add_metric(key, view.undecided_seconds)
        yield from (epoch, ready, offset, recovery, undecided, stepped_down)

        lag = GaugeMetricFamily(
            WORKER_PREFIX + "input_lag",
            "Records in an input partition past this worker's fetch position.",
            labels=["topic", "partition"],
        )
        for entry in sorted(self.input_lag(), key=lambda e: (e.topic, e.partition)):
            lag.add_metric([entry.topic, str(entry.partition)], entry.records)
        yield lag
        refetches = self.refetches()
        yield CounterMetricFamily(
            WORKER_PREFIX + "records_fetched_again",
            "Input records fetched and dropped (before a rebalance's seek, or while the consumer's flow "
            "was stopped), and so fetched again.",
            value=refetches.records_fetched_again,
        )
        yield CounterMetricFamily(
            WORKER_PREFIX + "partitions_sought_back",
            "Times an input partition was sought back to the first of such records.",
            value=refetches.partitions_sought_back,
        )

        if self.collections is not None:
            yield CounterMetricFamily(
                WORKER_PREFIX + "gc_collections",
                "Scheduled garbage collections run (coordinator/service/gc_schedule.py).",
                value=self.collections.runs,
            )
            yield CounterMetricFamily(
                WORKER_PREFIX + "gc_seconds",
                "Time spent in scheduled garbage collections.",
                value=self.collections.seconds,
            )


LATENCY_LABELS = {
    Granularity.SINGLE: ["operator_id", "operator_subtask_index"],
    Granularity.OPERATOR: ["source_id", "operator_id", "operator_subtask_index"],
    Granularity.SUBTASK: ["source_id", "source_subtask_index", "operator_id", "operator_subtask_index"],
}
"""The labels of ``cutline_job_latency`` besides ``job_id``, per granularity (Flink's metric groups)."""


def _label_values(key: HistogramKey, granularity: Granularity) -> list[str]:
    values = {
        "source_id": key.source_id or "",
        "source_subtask_index": str(key.source_subtask_index),
        "operator_id": key.operator_id,
        "operator_subtask_index": str(key.operator_subtask_index),
    }
    return [values[name] for name in LATENCY_LABELS[granularity]]


def registry_for(collector: CoordinatorCollector) -> CollectorRegistry:
    """A registry of its own (not the process-wide default): one per app, nothing global."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
