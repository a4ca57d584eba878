"""``spark.read.format("cutline-state")``: a job's state at a checkpoint or savepoint as a DataFrame
(Flink's State Processor API, read side; Spark 4's ``statestore`` reader, for cutline's state).

    spark.dataSource.register(CutlineStateSource)     # local_spark() and CheckpointedJob do it
    df = (spark.read.format("cutline-state")
          .option("path", "/data/checkpoints/wordcount/chk-41")   # a checkpoint or savepoint directory
          .option("uid", "counts")                                 # optional: one keyed step's state
          .option("task", "keyed-0")                               # optional: one task's state
          .load())

One row per key (a per-partition task's or a participant's whole state is one row, keyed by its
task), with the checkpoint directory of the piece that last wrote it: ``task``, ``key_group`` (null
for a per-partition task), ``key``, ``value`` (only when the step declared its state's type: the
state decoded into a column of that type, a struct column for a struct), ``state`` (the stored
bytes), ``state_json`` (the state's text when it is UTF-8 JSON, as a ``KeyedStep``'s default
serializer and the word count's counts are; else null) and ``written_in``.

A user-given schema (``.schema("key string, count bigint")``) picks columns: those named as above
are those, any other is decoded from the state's JSON (:func:`events.task.state_view.state_columns`:
an object's field of that name, or the whole state for one such column); a state that does not fit
fails the read naming its task and key.

One Spark partition per task; each reads its manifest and pieces and checks them as a restore
does, folds them with Arrow and yields Arrow batches (:func:`events.task.state_view.state_tables`):
a corrupt piece fails the query naming it, never silent rows.
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
VALUE = "value"
"""The typed state's column, after ``key``, when the step recorded its state's type."""
BATCH_ROWS = 65_536
"""Rows per Arrow batch a task yields (its keys are folded with Arrow and handed to Spark as batches)."""


class _TaskPartition(InputPartition):
    def __init__(self, task: str) -> None:
        super().__init__(task)
        self.task = task


def _completed(path: str, uid: str | None) -> Any:
    from events.task.completion_metadata import resolve_completion
    from events.task.participant import read_checkpoint_metadata
    from events.task.state_view import require_uid

    completed = resolve_completion(read_checkpoint_metadata(path))
    require_uid(completed, uid)
    return completed


class _Reader(DataSourceReader):
    def __init__(self, path: str, uid: str | None, task: str | None, schema: pa.Schema) -> None:
        self.path, self.uid, self.task, self.schema = path, uid, task, schema

    def partitions(self) -> list[InputPartition]:
        tasks = sorted(_completed(self.path, self.uid).handles)
        if self.task is not None and self.task not in tasks:
            raise ValueError(
                f"cutline-state: {self.path} holds no task {self.task!r}; its tasks: {', '.join(tasks)}"
            )
        return [_TaskPartition(task) for task in tasks if self.task in (None, task)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from dataclasses import replace

        from events.task.state_view import state_tables

        completed = _completed(self.path, self.uid)
        task = partition.task  # type: ignore[attr-defined]
        alone = replace(completed, handles={task: completed.handles[task]})
        for name, table in state_tables(alone, self.uid):
            for batch in table.to_batches(max_chunksize=BATCH_ROWS):
                yield self._columns(name, batch)

    def _columns(self, task: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch``'s rows as the schema's columns: the known ones as they are, the others decoded
        from the states."""
        from events.task.state_view import json_texts, state_columns

        states, keys = batch.column("state"), batch.column("key")
        known = {
            "task": lambda: pa.array([task] * batch.num_rows, pa.string()),
            "key_group": lambda: batch.column("key_group"),
            "key": lambda: keys,
            "state": lambda: states,
            "state_json": lambda: json_texts(states),
            "written_in": lambda: batch.column("written_in"),
        }
        decoded = pa.schema([f for f in self.schema if f.name not in known])
        values = dict(
            zip(decoded.names, state_columns(states, keys, task, decoded) if decoded else [], strict=True)
        )
        arrays = [known[f.name]().cast(f.type) if f.name in known else values[f.name] for f in self.schema]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


class CutlineStateSource(DataSource):
    """``spark.read.format("cutline-state")`` (see the module's docstring)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _path(self) -> str:
        path = self.options.get("path")
        if not path:
            raise ValueError('cutline-state needs .option("path", DIR): a checkpoint or savepoint directory')
        return str(path)

    def schema(self) -> StructType | str:
        """:data:`SCHEMA`, with ``value`` of the step's recorded state type after ``key`` when it has one."""
        from pyspark.sql.pandas.types import from_arrow_type

        from events.task.state_view import recorded_state_type

        state_type = recorded_state_type(
            _completed(self._path(), self.options.get("uid")), self.options.get("uid")
        )
        if state_type is None:
            return SCHEMA
        value = from_arrow_type(state_type).simpleString()
        return SCHEMA.replace("key string,", f"key string, {VALUE} {value},")

    def reader(self, schema: StructType) -> DataSourceReader:
        from pyspark.sql.pandas.types import to_arrow_schema

        return _Reader(
            self._path(), self.options.get("uid"), self.options.get("task"), to_arrow_schema(schema)
        )
