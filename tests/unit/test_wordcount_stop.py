"""How ``python -m spark_tasks.wordcount`` stops (spark_tasks/wordcount.py): when ``--idle-stop``
is due, from micro-batch progress as Spark reports it, and the cap on a micro-batch that a stop
waits for."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("pyarrow")

from spark_tasks.kafka_source.offsets import BARRIER_KEY, MARKER_KEY  # noqa: E402
from spark_tasks.wordcount import (  # noqa: E402
    MAX_OFFSETS_PER_TRIGGER,
    IdleClock,
    build_parser,
    caught_up,
    input_rows,
    job_settings,
    records_read,
)

BARRIER_3 = {"attempt": 1, "epoch": 1, "id": 3, "kind": "CHECKPOINT", "location": "file:///c/chk-3"}


def progress(rows: int, start: dict[str, Any] | str | None, end: dict[str, Any] | str) -> dict[str, Any]:
    """A micro-batch's ``lastProgress`` with one cutline-kafka source."""
    return {"numInputRows": rows, "sources": [{"startOffset": start, "endOffset": end, "numInputRows": rows}]}


class TestRecordsRead:
    def test_a_barrier_batch_without_records_read_nothing(self) -> None:
        """4 partitions, a new barrier and no records: the 4 input rows are barrier rows."""
        offsets = {"words": {"0": 10, "1": 10, "2": 10, "3": 10}}

        read = records_read(progress(4, offsets, {BARRIER_KEY: BARRIER_3, **offsets}))

        assert 0 == read

    def test_latency_marker_rows_are_no_input_either(self) -> None:
        """2 partitions, a new barrier and a new latency marker, 5 records: 2 + 2 rows are not input."""
        start = {MARKER_KEY: {"marked_ms": 1_000}, "words": {"0": 10, "1": 10}}
        end = {BARRIER_KEY: BARRIER_3, MARKER_KEY: {"marked_ms": 2_000}, "words": {"0": 15, "1": 10}}

        assert 5 == records_read(progress(9, start, end))

    def test_records_next_to_a_barrier_count(self) -> None:
        start = {"words": {"0": 10, "1": 10}}
        end = {BARRIER_KEY: BARRIER_3, "words": {"0": 15, "1": 10}}

        assert 5 == records_read(progress(7, start, end))

    def test_a_barrier_already_in_the_start_offset_is_not_counted_again(self) -> None:
        start = {BARRIER_KEY: BARRIER_3, "words": {"0": 10}}
        end = {BARRIER_KEY: BARRIER_3, "words": {"0": 12}}

        assert 2 == records_read(progress(2, start, end))

    def test_without_barriers_every_row_is_a_record(self) -> None:
        assert 9 == records_read(progress(9, None, {"words": {"0": 9}}))

    def test_offsets_as_spark_reports_them_are_json_text(self) -> None:
        """PySpark's ``lastProgress`` gives a source's offsets as JSON text, ``"null"`` for none."""
        start = json.dumps({"words": {"0": 3}})
        end = json.dumps({BARRIER_KEY: BARRIER_3, "words": {"0": 3}})

        assert (0, 2) == (records_read(progress(1, start, end)), records_read(progress(2, "null", "{}")))

    def test_offsets_of_another_source_count_every_row(self) -> None:
        assert 5 == records_read(progress(5, None, "not offsets"))

    def test_the_connectors_barrier_source_rows_are_no_input(self) -> None:
        """On Spark's kafka connector a barrier comes as a row of the ``cutline-barriers`` source, beside
        the Kafka source's records: a batch of 5 records and a barrier read 5, one of a barrier only 0."""
        kafka = {"startOffset": {"words": {"0": 10}}, "endOffset": {"words": {"0": 15}}, "numInputRows": 5}
        barriers = {
            "startOffset": json.dumps({"__cutline_barriers__": 2}),
            "endOffset": json.dumps({BARRIER_KEY: BARRIER_3, "__cutline_barriers__": 3}),
            "numInputRows": 1,
        }
        idle = {**kafka, "startOffset": kafka["endOffset"], "numInputRows": 0}

        assert (5, 0) == (
            records_read({"numInputRows": 6, "sources": [kafka, barriers]}),
            records_read({"numInputRows": 1, "sources": [idle, barriers]}),
        )

    def test_a_spark_connect_progress_counts_its_sources_rows(self) -> None:
        """A Connect query's ``lastProgress`` has no total (``numInputRows`` is None): its sources'."""
        connect = {**progress(7, None, {"words": {"0": 7}}), "numInputRows": None}
        connect["sources"].append({"startOffset": None, "endOffset": "not offsets", "numInputRows": 2})

        assert (9, 9) == (input_rows(connect), records_read(connect))


class TestIdleClock:
    def test_it_does_not_run_before_the_first_micro_batch(self) -> None:
        """A slow start (JVM, first batch under load) is not idleness: nothing is due before a batch."""
        clock = IdleClock(5.0)

        assert not clock.expired(now=1_000.0)

    def test_it_runs_from_the_first_micro_batch_even_if_it_read_nothing(self) -> None:
        clock = IdleClock(5.0)

        clock.batch(0, now=100.0)

        assert (False, True) == (
            clock.expired(now=105.0),
            clock.expired(now=105.5),
        )

    def test_batches_of_barrier_rows_only_do_not_reset_it(self) -> None:
        """Checkpoints every second make batches of barrier rows; they are not input."""
        clock = IdleClock(5.0)
        clock.batch(100, now=100.0)

        for second in range(1, 7):
            clock.batch(
                records_read(progress(1, {"w": {"0": 1}}, {BARRIER_KEY: BARRIER_3, "w": {"0": 1}})),
                100.0 + second,
            )

        assert clock.expired(now=106.0)

    def test_on_the_connector_barrier_batches_do_not_reset_it_either(self) -> None:
        """A checkpoint a second on Spark's kafka connector: each batch holds one barrier source row."""
        clock = IdleClock(5.0)
        clock.batch(100, now=100.0)
        idle = {"startOffset": {"w": {"0": 1}}, "endOffset": {"w": {"0": 1}}, "numInputRows": 0}

        for second in range(1, 7):
            barrier = {"startOffset": {"__cutline_barriers__": second}, "numInputRows": 1}
            barrier["endOffset"] = {BARRIER_KEY: BARRIER_3, "__cutline_barriers__": second + 1}
            clock.batch(records_read({"numInputRows": 1, "sources": [idle, barrier]}), 100.0 + second)

        assert clock.expired(now=106.0)

    def test_it_is_not_due_while_a_capped_backlog_is_read(self) -> None:
        """A batch slower than ``idle_stop`` of a backlog read in capped batches: not idle."""
        clock = IdleClock(2.0)
        clock.batch(100, now=100.0, caught_up=False)

        assert not clock.expired(now=110.0)

    def test_caught_up_means_the_batch_read_up_to_the_latest_offsets(self) -> None:
        capped = progress(100, {"w": {"0": 0}}, {"w": {"0": 100}})
        capped["sources"][0]["latestOffset"] = json.dumps({"w": {"0": 600}})
        done = progress(100, {"w": {"0": 500}}, {BARRIER_KEY: BARRIER_3, "w": {"0": 600}})
        done["sources"][0]["latestOffset"] = json.dumps({"w": {"0": 600}})
        unknown = progress(1, None, {"w": {"0": 1}})
        unknown["sources"][0]["latestOffset"] = "null"

        assert (False, True, True) == (caught_up(capped), caught_up(done), caught_up(unknown))

    def test_records_reset_it(self) -> None:
        clock = IdleClock(5.0)
        clock.batch(1, now=100.0)

        clock.batch(1, now=104.0)

        assert not clock.expired(now=106.0)

    def test_without_idle_stop_it_never_expires(self) -> None:
        clock = IdleClock(None)
        clock.batch(0, now=0.0)

        assert not clock.expired(now=1e9)


class TestBatchCap:
    ARGS = ("--bootstrap", "b:9092", "--job", "wc", "--topic", "words", "--work-dir", "/w", "--location",
            "file:///c", "--out", "/o")  # fmt: skip

    def test_a_micro_batch_is_capped_by_default(self) -> None:
        """A stop waits for the batch in flight: by default a backlog is not read in one batch."""
        settings = job_settings(build_parser().parse_args(self.ARGS))

        assert {"maxOffsetsPerTrigger": MAX_OFFSETS_PER_TRIGGER} == settings.source_options

    def test_the_source_asked_for_is_the_jobs(self) -> None:
        """``--source`` is parsed; the job reads with the source :func:`choose_source` resolved."""
        args = build_parser().parse_args([*self.ARGS, "--keyed", "2", "--source", "kafka"])

        assert ("kafka", "kafka") == (args.source, job_settings(args, "kafka").source)

    def test_zero_lifts_the_cap(self) -> None:
        settings = job_settings(build_parser().parse_args([*self.ARGS, "--max-offsets-per-trigger", "0"]))

        assert {} == dict(settings.source_options)
