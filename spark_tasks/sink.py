"""A ``foreachBatch`` sink whose output is exactly once across crashes and restores.

A restored job resumes from cutline's checkpoint, not from Spark's offset log: it
reads again every record after the checkpoint's cut and writes their output again.
Spark's batch ids start at 0 in every attempt (each attempt has a fresh Spark
checkpoint directory), and the new attempt's batches need not cover the same
records as the old attempt's, so a sink keyed by batch id ("overwrite batch N")
overwrites the wrong output or keeps it twice. This sink keys its output by the
**input cut** instead:

- each micro-batch with rows becomes one JSON-lines file,
  ``<out>/<end-total:020d>-<digest>.jsonl``, named after the batch's end offsets
  (the cut after its records: ``digest`` is a hash of them, ``end-total`` their
  sum, so names sort in input order); next to it, ``<out>/_cuts/<name>.json``
  records the batch's start and end offsets, its attempt and batch id. Both are
  written atomically, the record first. A re-run of the batch writes the same
  name again;
- when a job attempt starts, the sink **rolls back** to the cut the attempt
  restored from: every file whose end lies after that cut (on any partition) was
  written after the checkpoint by an attempt that is gone, and the new attempt
  writes that output again, so the file moves to
  ``<out>/_rolled_back/attempt-<N>/`` (N: the attempt that rolled it back). A job
  that restores nothing rolls back every file. Files before the cut stay, since
  a restore never replays their records.

So the files directly in ``<out>`` hold each input record's output once, in input
order: their raw rows are the job's output (:func:`read_rows`).

One sink writes to ``<out>`` at a time, the newest: ``<out>/_writer`` names it. A new sink
names itself there and rolls back under a lock of that file, and every write checks, under the
same lock, that it is still named, else raises :class:`SinkTakenOver` and writes nothing. So a
write of an older attempt's sink that outlives its query (a crashed Spark Connect driver's query,
stopped by the next driver while its ``foreachBatch`` function ran) lands before the rollback,
which moves it, or not at all. Readers that must
never see rows a later rollback removes (Flink's read-committed) read only the
files whose end is at or below the latest completed checkpoint's offsets.

The batch's offsets come from Spark's offset log
(``<work_dir>/attempt-N/spark/offsets/<batch id>``), which Spark writes before it
runs the batch. The sink runs on the driver (on Spark Connect: in a Python process of the
server, which pickles it) and writes local files (or a file system every reader sees).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from events.task.latency import LatencyMarker
from events.task.participant import write_atomic
from events.wire.validation import parse_offsets
from spark_tasks.barrier_source import MARKER_SOURCE_ID, is_barrier_offset  # a job on Spark's kafka connector
from spark_tasks.connector_cuts import logged_marker
from spark_tasks.kafka_source.offsets import TopicPartitionKey, barrier_of, from_offsets, marker_of
from spark_tasks.kafka_source.options import SOURCE_ID
from spark_tasks.keyed import batch_id_known
from spark_tasks.latency import SINK, send_measurements
from spark_tasks.tasks import TaskSettings

if TYPE_CHECKING:
    from spark_tasks.job import CheckpointedJob

__all__ = [
    "CUTS_DIR",
    "ROLLED_BACK_DIR",
    "WRITER_FILE",
    "BatchCut",
    "CutFileSink",
    "SinkTakenOver",
    "read_rows",
    "sink_files",
]

log = logging.getLogger(__name__)

CUTS_DIR = "_cuts"
"""Where the sink records each output file's input offsets."""
ROLLED_BACK_DIR = "_rolled_back"
"""Where a restore moves the files written after its cut."""
WRITER_FILE = "_writer"
"""Names the sink that writes to the directory (the newest), and is locked around its writes."""


class SinkTakenOver(RuntimeError):
    """A newer sink (a later attempt's, or a later driver's) writes to the directory now."""


@contextlib.contextmanager
def _writer_locked(out: Path) -> Iterator[int]:
    """``<out>/_writer``, open and locked (``flock``) until the block ends (or the process does)."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / WRITER_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _wire(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, int]:
    return {f"{topic}:{partition}": offsets[(topic, partition)] for topic, partition in sorted(offsets)}


@dataclass(frozen=True)
class BatchCut:
    """The input offsets of one micro-batch: ``start`` (None: the query's first, unknown) to ``end``."""

    start: Mapping[TopicPartitionKey, int] | None
    end: Mapping[TopicPartitionKey, int]

    @property
    def name(self) -> str:
        """The output file's name, from the end offsets alone: ``<sum:020d>-<digest>``."""
        text = json.dumps(_wire(self.end), sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return f"{sum(self.end.values()):020d}-{digest}"

    def after(self, cut: Mapping[TopicPartitionKey, int]) -> bool:
        """Did this batch read a record at or after ``cut`` (a partition missing from it: from 0)?"""
        return any(offset > cut.get(tp, 0) for tp, offset in self.end.items())


def batch_offsets(spark_checkpoint: Path, batch_id: int) -> dict[TopicPartitionKey, int]:
    """The end offsets of ``batch_id`` in Spark's offset log (of the ``cutline-kafka`` source)."""
    return from_offsets(_offset_line(spark_checkpoint, batch_id))


def batch_marker(spark_checkpoint: Path, batch_id: int) -> tuple[int | None, bool]:
    """The latency marker's time folded into ``batch_id``'s end offset (None: none), and whether a
    barrier was folded there too."""
    line = _offset_line(spark_checkpoint, batch_id)
    return marker_of(line), barrier_of(line) is not None


def _offset_line(spark_checkpoint: Path, batch_id: int) -> str:
    """The ``cutline-kafka`` source's line of ``batch_id`` in Spark's offset log."""
    path = spark_checkpoint / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise RuntimeError(f"cannot read batch {batch_id}'s offsets in Spark's offset log: {exc}") from exc
    # "v1", the batch metadata, then one line per source ("-" for a source without offsets)
    sources = [line for line in lines[2:] if line.strip() not in ("", "-") and not is_barrier_offset(line)]
    if len(lines) < 3 or len(sources) != 1:
        raise RuntimeError(
            f"{path}: expected Spark's offset log with exactly one source (the job's cutline-kafka), "
            f"found {len(sources)}"
        )
    return sources[0]


class CutFileSink:
    """``foreachBatch`` function of a checkpointed job: JSON-lines files keyed by the input cut.

    ``CutFileSink(job, out)`` rolls ``out`` back to the cut ``job`` restored from
    (see the module docstring; :attr:`rolled_back` lists the moved files), then
    writes every micro-batch's rows::

        sink = CutFileSink(job, "/data/wordcount/out")
        job.start(counts.writeStream.foreachBatch(sink).trigger(processingTime="1 second"))

    Create it for each job attempt, after the :class:`~spark_tasks.job.CheckpointedJob`
    and before the query starts.
    """

    def __init__(self, job: CheckpointedJob, out: Path | str) -> None:
        self.out = Path(out)
        self.attempt = job.attempt
        self.spark_checkpoint = job.work_dir / "spark"
        restored = job.restored
        self.cut: dict[TopicPartitionKey, int] = {} if restored is None else parse_offsets(restored.offsets)
        """The restored checkpoint's offsets, the start of this attempt's output."""
        self.first_start: dict[TopicPartitionKey, int] | None = None if restored is None else dict(self.cut)
        self.writer = {"writer": uuid.uuid4().hex, "attempt": self.attempt}
        """What ``<out>/_writer`` holds while this sink writes there (an older sink then writes nothing)."""
        with _writer_locked(self.out) as fd:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(self.writer, sort_keys=True).encode(), 0)
            self.rolled_back = self.rollback()
        # The job's settings, not the job (its threads and Kafka clients): Spark Connect pickles a
        # foreachBatch function and runs it in a Python process of the server.
        self.settings = job.settings
        self.batch_property = job.batch_property

    def rollback(self) -> list[Path]:
        """Move the files written after :attr:`cut` to ``_rolled_back/attempt-<N>/``; the moved files."""
        cuts = self.out / CUTS_DIR
        target = self.out / ROLLED_BACK_DIR / f"attempt-{self.attempt}"
        moved: list[Path] = []
        for record in sorted(cuts.glob("*.json")) if cuts.is_dir() else []:
            try:
                written = json.loads(record.read_text())
                end = parse_offsets(written["end"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("sink %s: unreadable cut record %s (%s); its output stays", self.out, record, exc)
                continue
            if not BatchCut(None, end).after(self.cut):
                continue
            target.mkdir(parents=True, exist_ok=True)
            data = self.out / f"{record.stem}.jsonl"
            if data.exists():
                os.replace(data, target / data.name)
                moved.append(target / data.name)
            (target / CUTS_DIR).mkdir(exist_ok=True)
            os.replace(record, target / CUTS_DIR / record.name)
        for stale in [*self.out.glob(".*.tmp"), *cuts.glob(".*.tmp")]:  # a write the crash cut short
            with contextlib.suppress(OSError):
                stale.unlink()
        if moved:
            log.info(
                "sink %s: rolled back %d files written after the restored cut to %s",
                self.out,
                len(moved),
                target,
            )
        return moved

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        with batch_id_known(batch_df, batch_id, self.batch_property):
            rows = batch_df.collect()
        if rows:
            self._write(rows, batch_id)
        if self.settings.latency_interval_ms > 0:
            self._measure_latency(batch_id)

    def _measure_latency(self, batch_id: int) -> None:
        """The batch's latency marker reached the sink: one measurement per source subtask that
        emitted it (the partitions the batch read, every one with a barrier), subtask 0."""
        if self.settings.source == "kafka":  # on the connector: the cutline-barriers source's marker
            self._measure_connector_latency(batch_id)
            return
        marked, barrier = batch_marker(self.spark_checkpoint, batch_id)
        if marked is None:
            return
        now = time.time_ns() // 1_000_000
        end = batch_offsets(self.spark_checkpoint, batch_id)
        start = self._start(batch_id)
        emitted = [
            subtask
            for subtask, tp in enumerate(sorted(end))
            if barrier or start is None or end[tp] > start.get(tp, 0)
        ]
        settings = self.settings
        measured = [
            LatencyMarker(marked, SOURCE_ID, subtask).measured(settings.job_id, self.attempt, SINK, 0, now)
            for subtask in emitted
        ]
        reporter = TaskSettings(settings.job_id, settings.bootstrap, "", topic_prefix=settings.topic_prefix)
        send_measurements(reporter, measured)

    def _measure_connector_latency(self, batch_id: int) -> None:
        """The batch's new latency marker (one, of the connector's source subtask 0) reached the sink."""
        marked = logged_marker(self.spark_checkpoint, batch_id)
        if marked is None:
            return
        settings = self.settings
        now = time.time_ns() // 1_000_000
        measured = LatencyMarker(marked, MARKER_SOURCE_ID, 0).measured(
            settings.job_id, self.attempt, SINK, 0, now
        )
        reporter = TaskSettings(settings.job_id, settings.bootstrap, "", topic_prefix=settings.topic_prefix)
        send_measurements(reporter, [measured])

    def _start(self, batch_id: int) -> dict[TopicPartitionKey, int] | None:
        """Where ``batch_id`` started reading (None: not known)."""
        if batch_id <= 0:
            return self.first_start
        try:
            return batch_offsets(self.spark_checkpoint, batch_id - 1)
        except RuntimeError:
            return None

    def _write(self, rows: list[Any], batch_id: int) -> None:
        end = batch_offsets(self.spark_checkpoint, batch_id)
        start = self._start(batch_id)  # only for the record; the end is what counts
        cut = BatchCut(start, end)
        record = {
            "attempt": self.attempt,
            "batch": batch_id,
            "start": None if start is None else _wire(start),
            "end": _wire(end),
        }
        text = "".join(
            json.dumps(row.asDict(recursive=True), sort_keys=True, default=str) + "\n" for row in rows
        )
        with _writer_locked(self.out) as fd:
            self._check_writer(fd)
            write_atomic(
                self.out / CUTS_DIR / f"{cut.name}.json", json.dumps(record, sort_keys=True).encode()
            )
            write_atomic(self.out / f"{cut.name}.jsonl", text.encode())

    def _check_writer(self, fd: int) -> None:
        """Raise :class:`SinkTakenOver` unless ``<out>/_writer`` (open and locked) names this sink."""
        try:
            current = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            current = {}
        if current.get("writer") != self.writer["writer"]:
            raise SinkTakenOver(
                f"sink {self.out}: attempt {current.get('attempt')}'s sink writes here now, after it "
                f"rolled back to its restored cut; attempt {self.attempt}'s writes nothing more"
            )


def sink_files(out: Path) -> list[Path]:
    """The output files of a sink directory, in input order (rolled-back ones excluded)."""
    return sorted(path for path in out.glob("*.jsonl") if not path.name.startswith("."))


def read_rows(out: Path) -> Iterator[dict[str, Any]]:
    """Every row in a sink directory's output files, as written, in input order."""
    for path in sink_files(out):
        for line in path.read_text().splitlines():
            if line:
                yield json.loads(line)
