"""How a job tells a Spark Connect session from a classic one, when a polled Connect query is
RUNNING, how a keyed job's tasks learn a batch's id inside a Connect ``foreachBatch`` function,
and the Spark query id every driver of a job runs its query under
(spark_tasks.session.is_connect_session, spark_tasks.query_status.has_triggered,
spark_tasks.keyed.batch_id_known, spark_tasks.job.job_query_id): no Spark."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spark_tasks.job import job_query_id, write_query_id
from spark_tasks.keyed import WithBatchId, batch_id_known, connect_batch_property
from spark_tasks.query_status import has_triggered
from spark_tasks.session import is_connect_session


def _session_of(module: str) -> Any:
    return type("SparkSession", (), {"__module__": module})()


class Conf:
    """A session's runtime settings, as ``spark.conf`` sets and unsets them."""

    def __init__(self) -> None:
        self.settings: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.settings[key] = value

    def unset(self, key: str) -> None:
        del self.settings[key]


@dataclass
class Batch:
    """A ``foreachBatch`` function's DataFrame: only its session matters here."""

    sparkSession: Any


class TestIsConnectSession:
    """Only a session of PySpark's Connect client takes the Connect paths."""

    def test_a_connect_client_session_is_one(self) -> None:
        assert is_connect_session(_session_of("pyspark.sql.connect.session"))

    def test_a_classic_session_is_not(self) -> None:
        assert not is_connect_session(_session_of("pyspark.sql.session"))


class TestHasTriggered:
    """A polled query is RUNNING once its first trigger has run to its end: its source listens for
    barriers and its first batch is done."""

    @pytest.mark.parametrize(
        "message",
        ["Initializing StreamExecution", "Initializing sources", "Getting offsets from cutline-kafka",
         "Processing new data"],
    )  # fmt: skip
    def test_not_before_its_first_trigger_has_run_to_its_end(self, message: str) -> None:
        """Not while the first batch runs either: as on a classic session, whose first progress
        event comes after that batch, a first checkpoint does not wait out a cold start."""
        assert not has_triggered({"message": message, "isTriggerActive": True}, has_progress=False)

    @pytest.mark.parametrize("message", ["Waiting for data to arrive", "Waiting for next trigger"])
    def test_once_spark_waits_between_triggers(self, message: str) -> None:
        assert has_triggered({"message": message, "isTriggerActive": False}, has_progress=False)

    def test_a_progress_report_is_enough(self) -> None:
        assert has_triggered({"message": "Getting offsets from cutline-kafka"}, has_progress=True)


class TestBatchIdKnown:
    """On Spark Connect, a keyed job's ``foreachBatch`` actions run with the batch id in a session
    setting of the job's run; anywhere else nothing changes."""

    PROP = connect_batch_property("wc", "run1")

    def test_on_connect_the_setting_holds_the_batch_id_around_the_actions_only(self) -> None:
        session = _session_of("pyspark.sql.connect.session")
        session.conf = Conf()
        seen: list[dict[str, str]] = []

        WithBatchId(lambda df, batch_id: seen.append(dict(df.sparkSession.conf.settings)), self.PROP)(
            Batch(session), 7
        )

        assert seen == [{"spark.cutline.batchId.wc.run1": "7"}]
        assert session.conf.settings == {}

    def test_it_is_unset_when_the_function_fails(self) -> None:
        session = _session_of("pyspark.sql.connect.session")
        session.conf = Conf()

        with pytest.raises(ValueError), batch_id_known(Batch(session), 7, self.PROP):
            raise ValueError("the sink failed")

        assert session.conf.settings == {}

    def test_a_classic_session_is_left_alone(self) -> None:
        session = _session_of("pyspark.sql.session")
        session.conf = Conf()

        with batch_id_known(Batch(session), 7, self.PROP):
            assert session.conf.settings == {}

    def test_without_a_setting_the_session_is_not_even_read(self) -> None:
        """An unkeyed job (no setting): the batch's session is never asked for."""

        class NoSession:
            @property
            def sparkSession(self) -> Any:
                raise AssertionError("read the batch's session")

        with batch_id_known(NoSession(), 7, None):
            pass


class TestJobQueryId:
    """Every driver of a job runs its query under one Spark query id, which no other job shares."""

    def test_every_driver_of_a_job_gets_the_same_id(self) -> None:
        assert job_query_id("wc", "cutline.") == job_query_id("wc", "cutline.")

    def test_another_job_or_coordinator_gets_another(self) -> None:
        ids = {job_query_id("wc", "cutline."), job_query_id("wc2", "cutline."), job_query_id("wc", "t1.")}
        assert 3 == len(ids)

    def test_it_is_a_uuid_in_the_metadata_file_spark_reads_a_query_id_from(self, tmp_path: Path) -> None:
        query_id = job_query_id("wc", "cutline.")
        write_query_id(tmp_path / "spark", query_id)
        assert {"id": str(uuid.UUID(query_id))} == json.loads((tmp_path / "spark" / "metadata").read_text())
