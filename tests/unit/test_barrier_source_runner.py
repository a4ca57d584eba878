"""What Spark's driver asks the ``cutline-barriers`` source each trigger (spark_tasks/barrier_source.py,
"Its cost per trigger"), checked against PySpark's own source runner, without a query."""

from __future__ import annotations

import importlib.util
import io
import sys
import types

import pytest
from pyspark.sql.streaming import python_streaming_source_runner as runner

from spark_tasks import barrier_source
from spark_tasks.barrier_source import BarrierSourceOptions, BarrierStreamReader, in_source_runner


def _reader() -> BarrierStreamReader:
    return BarrierStreamReader(BarrierSourceOptions(job="job", bootstrap="localhost:1"))


def test_spark_asks_the_barrier_source_for_no_admission_control_so_no_report_round_trip() -> None:
    # Given the reader as PySpark's source runner sees it
    answer = io.BytesIO()

    # When the runner tells the JVM what the reader supports
    runner.check_support_func(_reader(), answer)

    # Then it supports neither admission control (latestOffset(start, limit), which makes Spark ask
    # reportLatestOffset after it every trigger) nor Trigger.AvailableNow
    assert answer.getvalue() == (0).to_bytes(4, "big")


def test_the_source_runner_is_found_under_the_name_pyspark_starts_it_with() -> None:
    assert importlib.util.find_spec(barrier_source._SOURCE_RUNNER) is not None
    assert runner.__name__ == barrier_source._SOURCE_RUNNER


def test_only_pysparks_source_runner_counts_as_the_source_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given this process (pytest's) as __main__: not the runner
    assert not in_source_runner()

    # When __main__ is the module PySpark starts for a Python streaming source
    main = types.ModuleType("__main__")
    main.__spec__ = importlib.util.find_spec(barrier_source._SOURCE_RUNNER)
    monkeypatch.setitem(sys.modules, "__main__", main)

    # Then it is
    assert in_source_runner()


def test_outside_the_runner_the_reader_opens_no_consumer() -> None:
    # A planning worker makes the reader only to pickle its read(): it must not reach Kafka
    # (the bootstrap here has no broker, so a consumer made now would fail or hang)
    assert _reader()._feed is None
