"""``spark.read.format("cutline-state")``: a job's state at a checkpoint or savepoint as a DataFrame
(Flink's State Processor API, read side; Spark 4's ``statestore`` reader, for cutline's state).

    spark.dataSource.register(CutlineStateSource)     # local_spark() and CheckpointedJob do it
    df = (spark.read.format("cutline-state")
          .option("path", "/data/checkpoints/wordcount/chk-41")   # a checkpoint or savepoint directory
          .option("uid", "counts")                                 # optional: one keyed step's state
          .load())

One row per key (a per-partition task's whole state is one row, keyed by its task), with the
checkpoint directory of the piece that last wrote it: ``task``, ``key_group`` (null for a
per-partition task), ``key``, ``state`` (the stored bytes), ``state_json`` (the state as JSON text
when it is UTF-8 JSON, a ``KeyedStep``'s default serializer; else null) and ``written_in``. One
Spark partition per task; each reads its manifest and pieces and checks them as a restore does
(:mod:`events.task.state_view`): a corrupt piece fails the query naming it, never silent rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

__all__ = ["FORMAT", "SCHEMA", "CutlineStateSource"]

FORMAT = "cutline-state"
SCHEMA = "task string, key_group int, key string, state binary, state_json string, written_in string"


class _TaskPartition(InputPartition):
    def __init__(self, task: str) -> None:
        super().__init__(task)
        self.task = task


def _as_json(state: bytes) -> str | None:
    try:
        return json.dumps(json.loads(state.decode("utf-8")), ensure_ascii=False)
    except (UnicodeDecodeError, ValueError):
        return None


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

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        from dataclasses import replace

        from events.task.state_view import state_rows

        completed = self._completed()
        task = partition.task  # type: ignore[attr-defined]
        alone = replace(completed, handles={task: completed.handles[task]})
        for row in state_rows(alone, self.uid):
            yield row.task, row.key_group, row.key, row.state, _as_json(row.state), row.written_in


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
