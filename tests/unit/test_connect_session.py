"""How a job tells a Spark Connect session from a classic one, and when a polled Connect query is
RUNNING (spark_tasks.session.is_connect_session, spark_tasks.job.has_triggered): no Spark."""

from __future__ import annotations

import pytest

from spark_tasks.job import has_triggered
from spark_tasks.session import is_connect_session


def _session_of(module: str) -> object:
    return type("SparkSession", (), {"__module__": module})()


class TestIsConnectSession:
    """Only a session of PySpark's Connect client takes the Connect paths."""

    def test_a_connect_client_session_is_one(self) -> None:
        assert is_connect_session(_session_of("pyspark.sql.connect.session"))

    def test_a_classic_session_is_not(self) -> None:
        assert not is_connect_session(_session_of("pyspark.sql.session"))


class TestHasTriggered:
    """A polled query is RUNNING once its first trigger has run: its source listens for barriers."""

    @pytest.mark.parametrize("message", ["Initializing StreamExecution", "Initializing sources",
                                         "Getting offsets from cutline-kafka"])  # fmt: skip
    def test_not_before_its_first_trigger_has_run(self, message: str) -> None:
        assert not has_triggered({"message": message, "isTriggerActive": True}, has_progress=False)

    @pytest.mark.parametrize("message", ["Waiting for data to arrive", "Waiting for next trigger",
                                         "Processing new data"])  # fmt: skip
    def test_once_spark_waits_between_triggers_or_processes_a_batch(self, message: str) -> None:
        assert has_triggered({"message": message, "isTriggerActive": False}, has_progress=False)

    def test_a_progress_report_is_enough(self) -> None:
        assert has_triggered({"message": "Getting offsets from cutline-kafka"}, has_progress=True)
