"""Latency markers and their histograms (events/task/latency.py), and the coordinator folding them
(coordinator/service/runtime.py, coordinator/service/metrics.py): pure logic, no Kafka."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from coordinator.service.metrics import CoordinatorCollector, registry_for
from coordinator.service.runtime import Coordinator
from events.task.latency import (
    BUCKETS_MS,
    HISTORY_SIZE,
    MAX_HISTOGRAMS,
    MAX_LATENCY_ID_BYTES,
    Granularity,
    HistogramKey,
    LatencyHistogram,
    LatencyHistograms,
    LatencyMarker,
    MarkerSchedule,
    fold_latency,
    latency_json,
    measurement_problem,
    quantile,
    record_latency,
)
from events.wire.codec import decode, encode
from events.wire.records import CheckpointConfig, DeadLetter, JobStatus, JobStatusChanged, LatencyMeasured
from events.wire.topics import Topics

JOB = "job"
TOPICS = Topics("t.")


def measured(
    latency: int, operator: str = "keyed", subtask: int = 0, source_subtask: int = 0
) -> LatencyMeasured:
    return LatencyMarker(1_000, "cutline-kafka", source_subtask).measured(
        JOB, 1, operator, subtask, 1_000 + latency
    )


class TestRecordLatency:
    def test_operator_granularity_keeps_sources_apart_and_merges_their_subtasks(self) -> None:
        """At granularity operator (Flink's default) one histogram per source, operator and operator
        subtask: two source subtasks reaching one keyed subtask share it."""
        state = fold_latency(
            [measured(10, source_subtask=0), measured(30, source_subtask=1)], LatencyHistograms()
        )

        assert [HistogramKey("keyed", 0, "cutline-kafka", None)] == list(state.histograms)
        histogram = state.histograms[HistogramKey("keyed", 0, "cutline-kafka", None)]
        assert (2, 40, (10, 30)) == (histogram.count, histogram.sum_ms, histogram.recent)

    def test_subtask_granularity_keeps_source_subtasks_apart(self) -> None:
        """At granularity subtask the source subtask is part of the key."""
        state = fold_latency(
            [measured(10, source_subtask=0), measured(30, source_subtask=1)],
            LatencyHistograms(Granularity.SUBTASK),
        )

        assert [0, 1] == [key.source_subtask_index for key in state.histograms]

    def test_single_granularity_knows_no_source(self) -> None:
        """At granularity single only the operator and its subtask tell histograms apart."""
        state = record_latency(LatencyHistograms(Granularity.SINGLE), measured(5, "sink"))

        assert [HistogramKey("sink", 0)] == list(state.histograms)

    def test_a_negative_latency_counts_as_zero(self) -> None:
        """Clocks of two hosts apart can make a marker arrive before it left: it counts as 0 ms."""
        histogram = LatencyHistogram().observe(-20)

        assert (1, 0, (0,), 1) == (histogram.count, histogram.sum_ms, histogram.recent, histogram.buckets[0])

    def test_the_history_keeps_the_last_128(self) -> None:
        """Quantiles come from the last HISTORY_SIZE latencies (Flink's history-size); counts are all-time."""
        histogram = LatencyHistogram()
        for latency in range(200):
            histogram = histogram.observe(latency)

        assert (200, tuple(range(200 - HISTORY_SIZE, 200))) == (histogram.count, histogram.recent)
        assert ("+Inf", 200) == histogram.cumulative()[-1]


class TestQuantile:
    def test_quantiles_interpolate_between_order_statistics(self) -> None:
        """As Apache Commons Math's Percentile (Flink's histograms): position q * (n + 1)."""
        assert 2.5 == quantile([4, 1, 3, 2], 0.5)
        assert 4 == quantile([4, 1, 3, 2], 0.99)
        assert 1 == quantile([4, 1, 3, 2], 0.01)
        assert quantile([], 0.5) is None


class TestMarkerSchedule:
    def test_off_by_default(self) -> None:
        """Interval 0 (Flink's default) never makes a marker due."""
        assert not MarkerSchedule(0).due(10**12)

    def test_the_first_is_due_at_once_then_at_a_fixed_rate(self) -> None:
        """After a marker at 1000 with interval 200 the next is due at 1200; a batch at 1730 takes
        one and the next is due at 1800 (missed ticks are skipped, not caught up)."""
        schedule = MarkerSchedule(200)
        assert schedule.due(1_000)
        schedule = schedule.emitted(1_000)

        assert (False, True) == (schedule.due(1_199), schedule.due(1_200))
        assert 1_800 == schedule.emitted(1_730).next_due_ms


class TestLatencyMarker:
    def test_a_marker_travels_as_json_and_as_a_header(self) -> None:
        """What a Spark row or a Kafka header carries comes back as the same marker."""
        marker = LatencyMarker(1_767_225_600_000, "orders", 3)

        assert marker == LatencyMarker.from_json(marker.to_json())
        assert marker == LatencyMarker.from_headers([("other", b"x"), marker.header()])
        assert LatencyMarker.from_headers([("cutline.latency-marker", b"{}")]) is None


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.builds(
            measured,
            st.integers(-100, 70_000),
            st.sampled_from(["route", "keyed", "sink"]),
            st.integers(0, 40),
            st.integers(0, 3),
        ),
        max_size=300,
    ),
    st.sampled_from(list(Granularity)),
    st.integers(0, 300),
)
def test_folding_in_parts_is_folding_at_once_and_counts_add_up(
    measurements: list[LatencyMeasured], granularity: Granularity, split: int
) -> None:
    """Invariants: folding incrementally equals folding in one go; every histogram's buckets add up
    to its count, its history holds min(count, 128), a job has at most MAX_HISTOGRAMS, and the
    counts and the dropped add up to the measurements."""
    empty = LatencyHistograms(granularity)
    at_once = fold_latency(measurements, empty)

    assert at_once == fold_latency(measurements[split:], fold_latency(measurements[:split], empty))
    assert len(at_once.histograms) <= MAX_HISTOGRAMS
    assert len(measurements) == sum(h.count for h in at_once.histograms.values()) + at_once.dropped
    for histogram in at_once.histograms.values():
        assert histogram.count == sum(histogram.buckets)
        assert min(histogram.count, HISTORY_SIZE) == len(histogram.recent)
        assert len(BUCKETS_MS) == len(histogram.cumulative())


class TestBounds:
    def test_a_job_keeps_at_most_100_histograms_and_counts_the_measurements_it_drops(self) -> None:
        """Past MAX_HISTOGRAMS keys a measurement of a new key is dropped and counted; one of a key
        the job has is still folded."""
        full = fold_latency([measured(5, subtask=i) for i in range(MAX_HISTOGRAMS)], LatencyHistograms())

        state = fold_latency([measured(5, subtask=MAX_HISTOGRAMS + i) for i in range(7)], full)
        state = record_latency(state, measured(9, subtask=0))

        assert (100, 7) == (MAX_HISTOGRAMS, state.dropped)
        assert list(full.histograms) == list(state.histograms)
        assert (2, 14) == (state.histograms[HistogramKey("keyed", 0, "cutline-kafka")].count,
                           state.histograms[HistogramKey("keyed", 0, "cutline-kafka")].sum_ms)  # fmt: skip

    def test_ids_over_64_bytes_and_negative_subtasks_are_refused(self) -> None:
        def problem(
            operator: str = "o", source: str = "s", subtask: int = 0, source_subtask: int = 0
        ) -> str | None:
            return measurement_problem(
                LatencyMarker(0, source, source_subtask).measured(JOB, 1, operator, subtask, 1)
            )

        assert 64 == MAX_LATENCY_ID_BYTES
        assert [None, None] == [problem("o" * 64), problem(source="é" * 32)]
        assert "operator_id of 65 bytes; at most 64 are accepted" == problem("o" * 65)
        assert "source_id of 66 bytes; at most 64 are accepted" == problem(source="é" * 33)
        assert "operator_subtask_index must not be negative: -1" == problem(subtask=-1)
        assert "source_subtask_index must not be negative: -2" == problem(source_subtask=-2)

    def test_at_the_bounds_a_job_s_metrics_stay_under_1_mb_at_every_granularity(self) -> None:
        """The worst a hostile ack writer can do to one job (more than MAX_HISTOGRAMS keys, ids of 64
        bytes that the text format escapes to 128, the largest subtask indexes), with a job id of 64
        characters: under 1 MB of /metrics at any granularity."""
        from prometheus_client import generate_latest

        job, source, operator = "j" * 64, '"' * 64, "\\" * 62
        for granularity in Granularity:
            coordinator = Coordinator(TOPICS, latency_granularity=granularity)
            marks = [LatencyMarker(0, source, 2**31 - 1 - i) for i in range(MAX_HISTOGRAMS + 50)]
            coordinator.latency[job] = state = fold_latency(
                [
                    m.measured(job, 1, f"{operator}{i % 100:02}", 2**31 - 1 - i, 10**9)
                    for i, m in enumerate(marks)
                ],
                LatencyHistograms(granularity),
            )

            size = len(generate_latest(registry_for(CoordinatorCollector(coordinator))))

            assert (MAX_HISTOGRAMS, 50) == (len(state.histograms), state.dropped)
            assert size < 1_000_000, granularity


class TestCoordinatorFoldsMeasurements:
    def _running(self) -> Coordinator:
        coordinator = Coordinator(TOPICS, rng=random.Random(1))
        status = JobStatusChanged(
            JOB, JobStatus.RUNNING, 0, 1, ("a",), CheckpointConfig(100, location="file:///c")
        )
        coordinator.handle(TOPICS.job_status, 0, 0, JOB.encode(), encode(status), 0)
        return coordinator

    def test_a_measurement_is_folded_and_nothing_is_journaled(self) -> None:
        """A LatencyMeasured on the acks topic lands in the job's histograms and the metrics, with
        Flink's labels at granularity operator; no journal record, no dead letter."""
        coordinator = self._running()

        outcome = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), encode(measured(42)), 5)

        assert ([], []) == (outcome.journal, outcome.messages)
        text = registry_for(CoordinatorCollector(coordinator)).collect()
        family = next(f for f in text if f.name == "cutline_job_latency")
        total = next(s for s in family.samples if s.name == "cutline_job_latency_sum")
        assert {
            "job_id": JOB,
            "source_id": "cutline-kafka",
            "operator_id": "keyed",
            "operator_subtask_index": "0",
        } == total.labels
        assert 42 == total.value
        assert {"operator_id": "keyed", "count": 1, "p50": 42} == {
            k: latency_json(coordinator.latency[JOB])["operators"][0][k]
            for k in ("operator_id", "count", "p50")
        }

    def test_the_metrics_text_parses(self) -> None:
        """The exposition is valid Prometheus text: a histogram with buckets, count and sum."""
        from prometheus_client import generate_latest

        coordinator = self._running()
        coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), encode(measured(3_000, "sink")), 5)

        families = {f.name: f for f in text_string_to_metric_families(generate_latest(
            registry_for(CoordinatorCollector(coordinator))).decode())}  # fmt: skip

        assert "histogram" == families["cutline_job_latency"].type
        buckets = [s for s in families["cutline_job_latency"].samples if s.name.endswith("_bucket")]
        assert [0] * 11 + [1] == [s.value for s in buckets][:12]  # 3000 ms: the bucket le=5000

    def test_a_measurement_with_an_id_over_its_bound_is_a_dead_letter(self) -> None:
        coordinator = self._running()

        outcome = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), encode(measured(1, "o" * 65)), 5)

        letter = decode(outcome.messages[0].value)
        assert isinstance(letter, DeadLetter) and "INVALID_LATENCY" == letter.reason
        assert "operator_id of 65 bytes" in letter.message and JOB not in coordinator.latency

    def test_measurements_past_the_bound_are_counted_in_the_metrics_and_logged_once_per_10_s(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Given 20,000 measurements of distinct keys within 10 s, the job keeps MAX_HISTOGRAMS, the
        metrics count the other 19,900 as dropped, and the log has one line about them."""
        coordinator = self._running()

        with caplog.at_level(logging.WARNING, logger="cutline.coordinator"):
            for i in range(20_000):
                coordinator.handle(
                    TOPICS.acks, 0, 1 + i, JOB.encode(), encode(measured(1, subtask=i)), 5 + i // 4
                )
        families = {f.name: f for f in registry_for(CoordinatorCollector(coordinator)).collect()}

        assert MAX_HISTOGRAMS == len(coordinator.latency[JOB].histograms)
        [dropped] = families["cutline_job_latency_measurements_dropped"].samples
        assert ({"job_id": JOB}, 19_900) == (dropped.labels, dropped.value)
        assert ["latency measurement of job 'job' dropped: it has 100 histograms, the most a job keeps"] == [
            r.getMessage() for r in caplog.records
        ]

    def test_a_measurement_of_an_unknown_job_is_a_dead_letter(self) -> None:
        """A job that never ran has no histograms to fold into: the input is dead-lettered."""
        coordinator = Coordinator(TOPICS)

        outcome = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), encode(measured(1)), 5)

        letter = decode(outcome.messages[0].value)
        assert isinstance(letter, DeadLetter) and "UNKNOWN_JOB" == letter.reason
        assert {} == coordinator.latency


def test_cutline_status_prints_p50_and_p99_per_operator() -> None:
    """``cutline status`` adds a table of the job's latency per operator, and none without markers."""
    from rich.console import Console

    from coordinator.replay.timeline import render_status

    state = fold_latency(
        [measured(40, "route"), measured(60, "route"), measured(250, "sink")], LatencyHistograms()
    )
    console = Console(width=120, record=True)

    console.print(render_status(JOB, {}, {}, latency=latency_json(state)))
    shown = console.export_text()
    console.print(render_status(JOB, {}, {}, latency=latency_json(LatencyHistograms())))

    assert "latency markers" in shown and "latency markers" not in console.export_text()
    rows = [line.split() for line in shown.splitlines() if "route" in line or "sink" in line]
    assert [
        ["│", "route", "│", "2", "│", "50", "│", "60", "│", "60", "│"],
        ["│", "sink", "│", "1", "│", "250", "│", "250", "│", "250", "│"],
    ] == rows
