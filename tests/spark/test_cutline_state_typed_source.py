"""``spark.read.format("cutline-state")`` with typed columns, per task, and the state type refusal of a
real job (issue 50).

A savepoint of a step whose state is a declared struct reads with a ``value`` struct column; a
user's schema picks columns and decodes JSON states by field, and a state that does not fit fails
the read naming its key; ``.option("task", ...)`` reads one per-partition task's snapshot. A job
whose step declares another state type refuses a bootstrapped savepoint when it restores it, before
any batch runs.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from keyed_checkpoints import TALLIES, TALLY, TALLY_STEP, per_partition_checkpoint
from wordfeed import Input

from coordinator.service.supervisor import CoordinatorProcess
from events.wire.records import CheckpointConfig
from spark_tasks.job import CheckpointedJob, JobSettings, RestoreRefused
from spark_tasks.state_writer import write_new_savepoint
from spark_tasks.wordcount import KEYED_WORD_COUNT

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def topic_prefix() -> str:
    """One topic prefix, and so one coordinator (``coordinator``), for this module's tests."""
    return f"sty{uuid.uuid4().hex[:8]}."


def _tallies(location: Path) -> str:
    table = pa.table({"key": list(TALLIES), "state": pa.array(list(TALLIES.values()), TALLY)})
    return write_new_savepoint(table, TALLY_STEP, location, job_id="tally", parallelism=2).location


def test_cutline_state_reads_a_recorded_struct_state_as_a_value_struct_column(
    spark: Any, tmp_path: Path
) -> None:
    location = _tallies(tmp_path / "sp")

    df = spark.read.format("cutline-state").option("path", location).load()
    rows = df.select("key", "value.count", "value.last").collect()

    assert "struct<count:bigint,last:string>" == df.schema["value"].dataType.simpleString()
    assert ["task", "key_group", "key", "value", "state", "state_json", "written_in"] == df.columns
    assert {k: (v["count"], v["last"]) for k, v in TALLIES.items()} == {
        r["key"]: (r["count"], r["last"]) for r in rows
    }


def test_cutline_state_with_a_users_schema_decodes_json_states_into_its_columns(
    spark: Any, tmp_path: Path
) -> None:
    """Counts (bare JSON numbers) fill the one column; a tally's fields fill theirs by name; a
    field of another type fails the read naming the key."""
    counts = {"alpha": 3, "beta": 5}
    table = pa.table({"key": list(counts), "state": pa.array(list(counts.values()), pa.int64())})
    words = write_new_savepoint(table, KEYED_WORD_COUNT, tmp_path / "words", job_id="wc").location
    tallies = _tallies(tmp_path / "tallies")

    def read(location: str, schema: str) -> Any:
        return spark.read.format("cutline-state").schema(schema).option("path", location).load()

    assert counts == {r["key"]: r["count"] for r in read(words, "key string, count bigint").collect()}
    assert {k: (v["last"], "tallies") for k, v in TALLIES.items()} == {
        r["key"]: (r["last"], r["written_in"])
        for r in read(tallies, "key string, last string, written_in string").collect()
    }
    with pytest.raises(
        Exception, match="key '(alpha|beta)': its state \"[xy]\" does not fit column last int64"
    ):
        read(tallies, "key string, last bigint").collect()


def test_cutline_state_reads_one_per_partition_task_by_the_task_option(spark: Any, tmp_path: Path) -> None:
    directory = per_partition_checkpoint(tmp_path)

    rows = (
        spark.read.format("cutline-state")
        .option("path", str(directory))
        .option("task", "words-1")
        .schema("task string, gamma bigint")
        .load()
        .collect()
    )

    assert [("words-1", 4)] == [(r["task"], r["gamma"]) for r in rows]


def test_savepoint_writer_output_of_another_state_type_is_refused_when_the_job_restores(
    spark: Any,
    bootstrap: str,
    topic_prefix: str,
    coordinator: CoordinatorProcess,
    tmp_path: Path,
    given: Input,
) -> None:
    """Given a savepoint bootstrapped for the word count with int64 states, the job whose step
    declares string states refuses it as it restores (stream_keyed, before a batch), naming both."""
    typed = replace(KEYED_WORD_COUNT, state_type=pa.int64())
    table = pa.table({"key": ["alpha"], "state": pa.array([3], pa.int64())})
    written = write_new_savepoint(table, typed, tmp_path / "sp", job_id=given.job_id)
    settings = JobSettings(
        job_id=given.job_id,
        bootstrap=bootstrap,
        topics=(given.topic,),
        config=CheckpointConfig(interval_ms=1000, location=(tmp_path / "checkpoints").as_uri()),
        work_dir=tmp_path / "work",
        topic_prefix=topic_prefix,
        keyed_partitions=2,
        restore=written.location,
    )

    with (
        CheckpointedJob(spark, settings) as job,
        pytest.raises(RestoreRefused, match="state type int64; this step's state type is string"),
    ):
        job.stream_keyed(replace(KEYED_WORD_COUNT, state_type=pa.string()))
