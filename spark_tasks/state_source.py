"""``spark.read.format("cutline-state")``: a job's state at a checkpoint or savepoint as a DataFrame
(Flink's State Processor API, read side; Spark 4's ``statestore`` reader, for cutline's state).

    spark.dataSource.register(CutlineStateSource)     # local_spark() and CheckpointedJob do it
    df = (spark.read.format("cutline-state")
          .option("path", "/data/checkpoints/wordcount/chk-41")   # a checkpoint or savepoint directory
          .option("uid", "counts")                                 # optional: one keyed step's state
          .load())

One row per key (a per-partition task's whole state is one row, keyed by its task), with the
checkpoint directory of the piece that last wrote it: ``task``, ``key_group`` (null for a
per-partition task), ``key``, ``state`` (the stored bytes), ``state_json`` (the state's text when
it is UTF-8 JSON, as a ``KeyedStep``'s default serializer and the word count's counts are; else
null) and ``written_in``. One Spark partition per task; each reads its manifest and pieces and
checks them as a restore does, folds them with Arrow and yields Arrow batches
(:func:`events.task.state_view.state_tables`): a corrupt piece fails the query naming it, never
silent rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

__all__ = ["FORMAT", "SCHEMA", "CutlineStateSource"]

FORMAT = "cutline-state"
SCHEMA = "task string, key_group int, key string, state binary, state_json string, written_in string"
COLUMNS = ["task", "key_group", "key", "state", "state_json", "written_in"]
BATCH_ROWS = 65_536
"""Rows per Arrow batch a task yields (its keys are folded with Arrow and handed to Spark as batches)."""


class _TaskPartition(InputPartition):
    def __init__(self, task: str) -> None:
        super().__init__(task)
        self.task = task


class _Reader(DataSourceReader):
    def __init__(self, path: str, uid: str | None) -> None:
        self.path, self.uid = path, uid

    def _completed(self) -> Any:
        from events.task.participant import read_checkpoint_metadata
        from events.task.state_view import require_uid
        from events.wire.metadata import resolve_completion

        completed = resolve_completion(read_checkpoint_metadata(self.path))
        require_uid(completed, self.uid)
        return completed

    def partitions(self) -> list[InputPartition]:
        return [_TaskPartition(task) for task in sorted(self._completed().handles)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from dataclasses import replace

        from events.task.state_view import json_texts, state_tables

        completed = self._completed()
        task = partition.task  # type: ignore[attr-defined]
        alone = replace(completed, handles={task: completed.handles[task]})
        for name, table in state_tables(alone, self.uid):
            for batch in table.to_batches(max_chunksize=BATCH_ROWS):
                states = batch.column("state")
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array([name] * batch.num_rows, pa.string()),
                        batch.column("key_group"),
                        batch.column("key"),
                        states,
                        json_texts(states),
                        batch.column("written_in"),
                    ],
                    names=COLUMNS,
                )


class CutlineStateSource(DataSource):
    """``spark.read.format("cutline-state")`` (see the module's docstring)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType | str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        path = self.options.get("path")
        if not path:
            raise ValueError('cutline-state needs .option("path", DIR): a checkpoint or savepoint directory')
        return _Reader(str(path), self.options.get("uid"))
