"""The driver side of a checkpointed Spark Structured Streaming job (docs/design.md, "Tasks and Spark").

::

    job = CheckpointedJob(spark, JobSettings(
        job_id="wordcount", bootstrap="127.0.0.1:9092", topics=("words",),
        config=CheckpointConfig(interval_ms=1000, location="file:///data/checkpoints"),
        work_dir="/data/wordcount",
    ))
    counts = job.stream(word_count)                     # a StatefulStep (spark_tasks.state)
    query = job.start(counts.writeStream.foreachBatch(write_counts).trigger(processingTime="1 second"))
    job.await_termination()

What it does:

- **Restore.** On construction it reads the job's journal: the restarted job takes
  the next attempt number and restores from the latest completed checkpoint of its
  job id (``restore="latest"``, the default), a given checkpoint id, a savepoint or
  checkpoint directory (its ``_metadata``), or nothing (``restore=None``). Each
  partition's snapshot is checked against its handle and becomes the first state
  version; the query starts at the checkpoint's offsets. Every attempt gets a
  fresh Spark checkpoint directory under ``work_dir``: cutline's checkpoint, not
  Spark's, is what a restarted job resumes from.
- **Job status** from the query's events (:class:`~spark_tasks.query_status.QueryStatusListener`):
  RUNNING (one task per input partition, and the checkpoint config) once the query has run its
  first trigger, so the source is already listening for barriers; FINISHED, CANCELED (after
  :meth:`stop`) or FAILING when the query ends (the job's restart strategy decides).
- **Restarts in the driver.** :meth:`run` starts the query a function builds and,
  when it fails, waits for the coordinator's decision: on ``JobRestartScheduled`` it
  starts the next attempt in the same SparkSession (no new JVM), restored from the
  checkpoint the decision names; on ``JobFailedPermanently`` it raises
  :class:`JobFailedForGood`.
- **Following the journal** (a thread, :class:`~spark_tasks.journal_follower.JournalFollower`,
  fenced by the journal's claims): a completed checkpoint's offsets are
  committed to the consumer group (``group``, default the job id), its metadata is
  written to ``<location>/_metadata`` (so a savepoint directory is enough to
  restore from), and completed checkpoints beyond ``config.retained`` are deleted
  (never savepoints); an aborted checkpoint's snapshots are deleted, never a piece
  a retained checkpoint's chain needs (:mod:`spark_tasks.retention`, carried out by
  :class:`~spark_tasks.retention_executor.RetentionExecutor`);
  ``CheckpointFailureThresholdExceeded`` stops the query, and :meth:`await_termination`
  raises :class:`CheckpointFailuresExceeded`. What each record makes the job do is
  decided by a :class:`~events.task.ledger.JobLedger`, which acts on a completion
  once, never deletes the latest completed checkpoint nor anything outside the job's
  checkpoint location, and ignores (with one log line, kept in
  :attr:`CheckpointedJob.ignored`) records that contradict what it knows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from confluent_kafka import KafkaException

from events.kafka.client_config import client_properties
from events.task import storage
from events.task.completion_metadata import MetadataUnavailable, resolve_completion
from events.task.ledger import (
    Abort,
    Complete,
    ConfirmRunning,
    Fail,
    GiveUp,
    Ignore,
    JobLedger,
    Restart,
    Stop,
    attempt_after,
)
from events.task.participant import (
    METADATA_FILE,
    JobDriver,
    MetadataProblem,
    SnapshotCorrupted,
    UnsupportedLocation,
    load_task_snapshot,
    read_checkpoint_metadata,
    valid_completions,
)
from events.task.reply import Answer, barrier_epoch
from events.task.scheduler_watch import UNSCHEDULED_WARNING_S, SchedulerWatch
from events.task.storage import write_atomic
from events.wire.codec import codec_for, process_wire, use_wire
from events.wire.records import (
    CheckpointAborted,
    CheckpointAcknowledged,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointRequested,
    JobFailedPermanently,
    JobRestartScheduled,
    JobStatus,
    Record,
    SchedulerStarted,
    SchedulerStopped,
    TriggerRejected,
)
from events.wire.topics import DEFAULT_PREFIX, Topics
from events.wire.wire_settings import WireSettings
from spark_tasks.barrier_source import CHANNEL, held_file
from spark_tasks.connector_cuts import SOURCE_TASK, CutFollower, PartitionSnapshots, SourceAck
from spark_tasks.connector_security import connector_security_options
from spark_tasks.connector_source import CONNECTOR_FORMAT, connector_options, connector_stream
from spark_tasks.journal_follower import JournalFollower
from spark_tasks.kafka_source import (
    EARLIEST,
    FORMAT,
    LATEST,
    KafkaSource,
    OffsetProbe,
    TopicPartitionKey,
    entry_barrier,
    from_offsets,
    to_offsets,
)
from spark_tasks.keyed import (
    MAX_PARALLELISM,
    TARGET_COLUMN,
    AnyKeyedStep,
    KeyedSettings,
    KeyedState,
    KeyedStateStore,
    WithBatchId,
    connect_batch_property,
    key_group_range,
    keyed_task_id,
    process_step,
    read_key_groups,
    read_manifests,
    route_step,
    shuffle_schema,
)
from spark_tasks.query_status import QueryStatusListener
from spark_tasks.restore import (
    JobShape,
    LeftBehind,
    Refusal,
    Refused,
    RestorePlan,
    owner_problem,
    plan_restore,
    refusal_message,
    restore_step,
)
from spark_tasks.retention_executor import RetentionExecutor, RunFiles
from spark_tasks.session import is_connect_session
from spark_tasks.state import PartitionStateStore, StatefulStep, task_id
from spark_tasks.tasks import TaskSettings, partition_step, send_reply

__all__ = [
    "METADATA_FILE",
    "CheckpointFailuresExceeded",
    "CheckpointedJob",
    "JobSettings",
    "NothingToRestore",
    "RestoreRefused",
    "read_metadata",
]

log = logging.getLogger(__name__)

Restore = Literal["latest"] | int | str | Path | None
Source = Literal["cutline-kafka", "kafka"]


class CheckpointFailuresExceeded(RuntimeError):
    """The coordinator reported more consecutive checkpoint failures than the job tolerates."""


class NothingToRestore(MetadataProblem):
    """The checkpoint or savepoint a job was told to restore from does not exist."""


class RestoreRefused(NothingToRestore):
    """No checkpoint the job was told to restore from can be restored exactly (see
    :mod:`spark_tasks.restore`); the message lists why, on one screen, with advice."""

    def __init__(self, message: str, refused: tuple[Refused, ...]) -> None:
        super().__init__(message)
        self.refused = refused


_EXCEPTION_LINE = re.compile(r"^\s*(?:[\w$]+\.)*\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?$")


def failure_summary(exception: str, limit: int = 2000) -> str:
    """The line of a Spark query's failure that says what went wrong.

    Spark wraps a Python task's error in py4j and Java exceptions whose first line says
    only that a Python proxy raised; the last ``SomeError: message`` line that is not
    py4j's own is the user's error. Falls back to the first line.
    """
    lines = exception.strip().splitlines() or [""]
    found = [
        line.strip()
        for line in lines
        if _EXCEPTION_LINE.match(line) and not line.strip().startswith(("py4j.", "at "))
    ]
    return (found[-1] if found else lines[0])[:limit]


class JobFailedForGood(RuntimeError):
    """The job's restart strategy gave up (``JobFailedPermanently``)."""


RESTART_DECISION_TIMEOUT_S = 120.0
"""How long :meth:`CheckpointedJob.run` waits for the coordinator to decide on a failed attempt."""


@dataclass(frozen=True)
class JobSettings:
    """A checkpointed job: its id, its input topics, its checkpoint config and where it keeps files.

    ``restore``: ``"latest"`` (the latest completed checkpoint of ``job_id``, if any),
    a checkpoint id of this job, the path or ``file:`` URI of a savepoint or checkpoint
    directory (it holds ``_metadata``: this job's, or ``restore_from_job``'s), or None (start empty).
    ``source`` reads the topics with ``cutline-kafka`` (the default) or Spark's own ``kafka``
    connector (the session needs the connector's jars: docs/spark.md, "Checkpoints on
    Spark's own kafka connector"). ``source_options`` go to that source as they are (for example
    ``maxOffsetsPerTrigger`` or ``kafka.*``, in its client's names); ``startingOffsets`` applies only
    when nothing is restored (default ``earliest``).
    """

    job_id: str
    bootstrap: str
    topics: tuple[str, ...]
    config: CheckpointConfig
    work_dir: str | Path
    topic_prefix: str = DEFAULT_PREFIX
    group: str | None = None
    restore: Restore = "latest"
    restore_from_job: str | None = None
    """The job whose savepoint or checkpoint directory ``restore`` names, when it is not this job's
    (a savepoint of the job before a rename, say): a restore from a directory refuses another job's
    ``_metadata`` unless it is named here."""
    source_options: Mapping[str, Any] = field(default_factory=dict)
    keyed_partitions: int | None = None
    """Shuffle partitions of a keyed job (:meth:`CheckpointedJob.stream_keyed`): its tasks are
    ``keyed-0`` … ``keyed-<n-1>``. None: state per input partition (:meth:`CheckpointedJob.stream`)."""
    max_parallelism: int = MAX_PARALLELISM
    """Key groups of a keyed job: the most shuffle partitions it can be rescaled to (Flink's)."""
    state_location: str | None = None
    """Where a keyed job's state store lives: any fsspec URL (``s3://…``) or path that every
    executor sees. Default: ``work_dir``."""
    wire: WireSettings = field(default_factory=process_wire)
    """How the job's records are framed (its driver, source and tasks alike): by default the
    process's (:func:`events.wire.codec.use_wire`)."""
    latency_interval_ms: int = 0
    """Emit a latency marker at most this often (Flink's ``latencyTrackingInterval``); 0, the
    default as in Flink: none (docs/spark.md, "Latency markers")."""
    source: Source = "cutline-kafka"
    """``cutline-kafka`` or ``kafka`` (Spark's own connector): the format the job reads its topics with."""
    unscheduled_warning_s: float = UNSCHEDULED_WARNING_S
    """Warn when no coordinator has run an attempt this long after its RUNNING (none runs on the topic
    prefix, say): the job then runs on without checkpoints (:mod:`events.task.scheduler_watch`)."""
    allow_non_restored_state: bool = False
    """Restore even though the checkpoint holds state this job does not map (another kind of step,
    partitions it does not read, another keyed step's state): that state is left behind and the
    job's own starts empty (Flink's ``--allowNonRestoredState``). Default: refuse."""

    @property
    def consumer_group(self) -> str:
        return self.group or self.job_id


def read_metadata(location: str | Path) -> CheckpointCompleted:
    """The ``CheckpointCompleted`` in a checkpoint or savepoint directory (path or ``file:`` URI)."""
    try:
        return read_checkpoint_metadata(location)
    except MetadataProblem as exc:
        raise NothingToRestore(str(exc)) from exc


QUERY_ID_NAMESPACE = uuid.UUID("8f2c6a53-3d1e-4b7a-9c4e-2a6f0d5b7e19")
"""The namespace of :func:`job_query_id`'s name-based UUIDs."""


def job_query_id(job_id: str, topic_prefix: str) -> str:
    """The Spark query id every attempt of a job runs its query under on Spark Connect: one per
    job (its coordinator's topic prefix and its id), the same in every driver that runs it, so that
    the server runs one query of the job at a time (:meth:`CheckpointedJob._claim_query_id`)."""
    return str(uuid.uuid5(QUERY_ID_NAMESPACE, f"{topic_prefix}\0{job_id}"))


def write_query_id(spark_checkpoint: Path, query_id: str) -> None:
    """Have a query started on the Spark checkpoint directory ``spark_checkpoint`` run under
    ``query_id``: Spark reads a query's id from the directory's ``metadata`` file, and writes a
    random one only when that file is missing."""
    write_atomic(spark_checkpoint / "metadata", json.dumps({"id": query_id}).encode())


class CheckpointedJob:
    """One attempt of a checkpointed streaming job on a SparkSession (see the module docstring)."""

    def __init__(self, spark: Any, settings: JobSettings, *, timeout: float = 30.0) -> None:
        self.spark = spark
        self.settings = settings
        self.timeout = timeout
        use_wire(settings.wire)  # the driver's own records (status, heartbeats, requests) too
        self.topics = Topics(settings.topic_prefix)
        self.run_id = uuid.uuid4().hex[:8]
        """Names this run's snapshot files (with the attempt and the cut): see spark_tasks.tasks."""
        self.query_name = f"cutline-{settings.job_id}-{self.run_id}"
        self.query_id = job_query_id(settings.job_id, settings.topic_prefix)
        """On Spark Connect, the Spark query id of the job's queries, the same in every driver."""
        # the job's own watch reads SchedulerStarted from the journal it follows (no reads of its own)
        self.driver = JobDriver(
            settings.bootstrap, settings.job_id, self.topics, timeout=timeout, unscheduled_warning_s=None
        )
        history = self.driver.journal(
            (SchedulerStarted, SchedulerStopped, CheckpointCompleted, JobRestartScheduled)
        )
        attempt = max(attempt_after(history), int(os.environ.get("CUTLINE_ATTEMPT", "0")))  # cutline run's
        with OffsetProbe(settings.bootstrap, {}, timeout) as probe:
            self.partitions: list[tuple[str, int]] = probe.partitions(settings.topics)
        if not self.partitions:
            raise ValueError(f"topics {list(settings.topics)} have no partitions: create them first")
        keyed = settings.keyed_partitions
        if settings.source not in (FORMAT, CONNECTOR_FORMAT):
            raise ValueError(
                f"JobSettings.source must be {FORMAT!r} or {CONNECTOR_FORMAT!r}, not {settings.source!r}"
            )
        if keyed is not None and not 0 < keyed <= settings.max_parallelism:
            raise ValueError(
                f"keyed_partitions={keyed}: a keyed job has 1 to max_parallelism "
                f"({settings.max_parallelism}) shuffle partitions"
            )
        self.tasks = (
            [task_id(t, p) for t, p in self.partitions]
            if keyed is None
            else [keyed_task_id(i) for i in range(keyed)]
            + ([SOURCE_TASK] if settings.source == CONNECTOR_FORMAT else [])
        )
        self._cuts: CutFollower | None = None
        """On the connector: the driver's ``source`` task, following the query's offset log."""
        self._first_cut: dict[TopicPartitionKey, int] = {}
        """On the connector: the exact offsets the query's first batch starts at."""
        self._partition_snapshots: PartitionSnapshots | None = None
        """A per-partition job's answers to barriers on the connector (set by :meth:`stream`)."""
        self.cut_gates: list[Callable[[Mapping[str, Any]], bool]] = []
        """On the connector, what must say yes (to the barrier entry) before the driver answers a cut:
        an ``ExactlyOnceKafkaSink``'s output before it staged (``ExactlyOnceKafkaSink.staged_for``)."""
        self._restored_state: dict[tuple[str, int], bytes] = {}
        """A per-partition job's restored snapshots, until :meth:`_seed_state` writes them."""
        self._restored_keyed: list[KeyedState] = []
        """A keyed job's restored state per shuffle partition, until :meth:`stream_keyed` seeds it."""
        self._retention = RetentionExecutor(keyed=keyed is not None)
        """What the job deletes when the ledger discards a checkpoint (:mod:`spark_tasks.retention`)."""
        self.ignored: list[tuple[Record, str]] = []
        """Journal records of this job that the job ignored, and why (each logged once)."""
        self._listener: QueryStatusListener | None = None
        self._follower: JournalFollower | None = None
        self._scheduler_watch: SchedulerWatch | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._completion = threading.Condition(self._lock)
        self._canceled = threading.Event()
        """Set when the journal cancels the job (``cutline cancel``): a restart delay then ends the job."""
        try:
            if is_connect_session(spark):
                self._claim_query_id()
            self._begin_attempt(attempt, settings.restore, history)
        except BaseException:
            self.driver.close()  # a refused restore: no job, and nothing left running
            raise

    def _claim_query_id(self) -> None:
        """Spark Connect: stop the run of this job's query still active in the server, if any (a
        crashed driver's), and wait for its end, before this driver restores and its sink rolls back.

        A Connect client that dies leaves its query running in the server, reading and writing,
        until its session expires. Spark runs one query per id in a server: starting one whose id is
        active stops that run first, whatever session started it, and waits until its thread has
        ended (``spark.sql.streaming.stopActiveRunOnRestart``, true by default). Every driver of the
        job runs its query under :attr:`query_id`; this one first starts and stops a throwaway
        query (``rate`` to ``noop``) under it (docs/spark.md, "Spark Connect").
        """
        claim = Path(self.settings.work_dir) / "claim"
        shutil.rmtree(claim, ignore_errors=True)  # the previous driver's throwaway query
        write_query_id(claim, self.query_id)
        started = time.monotonic()
        query = (
            self.spark.readStream.format("rate")
            .load()
            .writeStream.format("noop")
            .queryName(f"{self.query_name}-claim")
            .option("checkpointLocation", str(claim))
            .start()
        )
        query.stop()
        log.info(
            "job %s: claimed its Spark query id %s in %.1f s (the Spark Connect server stopped a run "
            "of it still active there first, if any, and logged that it did)",
            self.settings.job_id,
            self.query_id,
            time.monotonic() - started,
        )

    def _begin_attempt(self, attempt: int, restore: Restore, history: list[Record]) -> None:
        """Become ``attempt``: its own work directory, ``restore`` loaded and seeded as the first state
        versions, a ledger over the journal's ``history``, and nothing completed or decided yet."""
        with self._completion:
            self._history = valid_completions(history)
            self.attempt = attempt
            self.work_dir = Path(self.settings.work_dir) / f"attempt-{attempt}"
            self.restored: CheckpointCompleted | None = self._find_restore(restore)
            self.store = PartitionStateStore(self.work_dir / "state")
            base = self.settings.state_location or str(self.work_dir.parent)
            self.keyed_root = f"{base.rstrip('/')}/attempt-{attempt}/keyed-{self.run_id}"
            """This run's keyed state store (one directory per shuffle partition)."""
            self.starting_offsets = self._seed_state()
            self.ledger = JobLedger(
                self.settings.job_id,
                attempt,
                retained=self.settings.config.retained,
                location=self.settings.config.location,
                tasks=self.tasks,
                partitions=self.partitions,
                history=self._history,
            )
            self.completed: list[CheckpointCompleted] = []
            self.aborted: list[CheckpointAborted] = []
            self.rejected: dict[str, TriggerRejected] = {}
            """Trigger requests the coordinator refused, by request id."""
            self._scheduled = threading.Event()
            self._said_unconfirmed = False
            """Whether a completion before RUNNING was confirmed has been logged (once an attempt)."""
            self.failure: CheckpointFailuresExceeded | None = None
            self.query: Any = None
            self._decision: JobRestartScheduled | JobFailedPermanently | None = None
            """The restart strategy's decision on this attempt's failure, once the journal has it."""

    # ------------------------------------------------------------- restore

    def _find_restore(self, restore: Restore) -> CheckpointCompleted | None:
        """The checkpoint to restore, its snapshots loaded and checked (:meth:`_load_state`)."""
        self._plan: RestorePlan | None = None
        self._restored_state, self._restored_keyed, self._keyed_seeded = {}, [], False
        if restore is None:
            return None
        if restore == "latest":
            return self._latest_restorable()
        if isinstance(restore, int):
            for completed in self._history:
                if completed.checkpoint_id == restore:
                    break
            else:
                known = [c.checkpoint_id for c in self._history]
                raise NothingToRestore(
                    f"job {self.settings.job_id} has no completed checkpoint {restore} in the journal "
                    f"(completed: {known or 'none'})"
                )
            try:
                completed = resolve_completion(completed)
            except MetadataUnavailable as exc:
                raise NothingToRestore(str(exc)) from exc
        else:
            completed = read_metadata(restore)
            settings = self.settings
            other = owner_problem(
                completed.checkpoint_id, completed.job_id, settings.job_id, settings.restore_from_job
            )
            if other is not None:
                raise RestoreRefused(refusal_message(settings.job_id, [other], latest=False), (other,))
        refused = self._load_state(completed)
        if refused is not None:
            raise RestoreRefused(refusal_message(self.settings.job_id, [refused], latest=False), (refused,))
        return completed

    def _latest_restorable(self) -> CheckpointCompleted | None:
        """The newest completed checkpoint that restores exactly (:mod:`spark_tasks.restore`).

        A newer one that does not (deleted, corrupt, a forged completion, a gap in its state, state
        this job does not map) is skipped with a warning, as Flink skips a checkpoint it cannot
        read; if none restores, :class:`RestoreRefused` lists the newest refusals.
        """
        checkpoints = sorted(
            (c for c in self._history if c.kind is CheckpointKind.CHECKPOINT),
            key=lambda c: c.checkpoint_id,
            reverse=True,
        )
        refusals: list[Refused] = []
        for completed in checkpoints:
            try:
                completed = resolve_completion(completed)  # noqa: PLW2901 (the same checkpoint, whole)
            except MetadataUnavailable as exc:
                refused: Refused | None = Refused(completed.checkpoint_id, Refusal.UNREADABLE, str(exc))
            else:
                refused = self._load_state(completed)
            if refused is None:
                return completed
            log.warning(
                "job %s: checkpoint %d cannot be restored exactly (%s); trying an older one",
                self.settings.job_id,
                refused.checkpoint_id,
                refused.reason,
            )
            refusals.append(refused)
        if refusals:
            raise RestoreRefused(
                refusal_message(self.settings.job_id, refusals, latest=True), tuple(refusals)
            )
        return None

    def _load_state(self, completed: CheckpointCompleted) -> Refused | None:
        """Plan restoring ``completed`` (:func:`~spark_tasks.restore.plan_restore`) and load what it
        brings back, checked against its handles: each partition's snapshot, or a keyed job's key
        groups from the checkpoint's manifests, whatever their number was (rescaling). None when it
        is loaded (``_plan``); why not otherwise."""
        shape = JobShape(
            tuple(self.partitions),
            self.settings.keyed_partitions,
            self.settings.max_parallelism,
            self.settings.allow_non_restored_state,
        )
        try:
            manifests = read_manifests(completed.handles) if shape.keyed_partitions is not None else {}
            plan = plan_restore(completed, shape, manifests)
            if isinstance(plan, Refused):
                return plan
            if shape.keyed_partitions is None:
                self._restored_state = {
                    partition: load_task_snapshot(completed.handles[task])
                    for partition, task in plan.partition_state.items()
                }
            elif plan.keyed_state:
                parallelism, max_parallelism = shape.keyed_partitions, shape.max_parallelism
                self._restored_keyed = [
                    read_key_groups(
                        manifests, completed.handles, key_group_range(i, parallelism, max_parallelism)
                    )[0]
                    for i in range(parallelism)
                ]
        except (OSError, SnapshotCorrupted, UnsupportedLocation) as exc:
            self._restored_state, self._restored_keyed = {}, []
            return Refused(completed.checkpoint_id, Refusal.UNREADABLE, f"{type(exc).__name__}: {exc}")
        for what in plan.left_behind:
            log.warning(
                "job %s: checkpoint %d's %s is left behind (allow_non_restored_state)",
                self.settings.job_id,
                completed.checkpoint_id,
                what,
            )
        self._plan = plan
        return None

    def _seed_state(self) -> str:
        """Write the restored snapshots as first state versions; the source's startingOffsets. (A
        keyed job's state is seeded by :meth:`stream_keyed`, which knows the step.)"""
        plan = self._plan
        if plan is None:
            return str(self.settings.source_options.get("startingOffsets", "earliest"))
        offsets: dict[tuple[str, int], int] = {}
        for topic, partition in self.partitions:
            offset = plan.offsets.get((topic, partition))
            if offset is None:
                log.warning(
                    "checkpoint %d knows nothing of %s[%d] (a new partition): it starts empty, from the "
                    "earliest offset",
                    plan.checkpoint_id,
                    topic,
                    partition,
                )
                offsets[(topic, partition)] = -2
                continue
            data = self._restored_state.get((topic, partition))
            if data is not None:
                self.store.save(topic, partition, offset, data)
            offsets[(topic, partition)] = offset
        self._restored_state = {}
        return json.dumps(to_offsets(offsets))

    # ---------------------------------------------------------------- query

    @property
    def on_connector(self) -> bool:
        """Does the job read with Spark's own ``kafka`` connector?"""
        return self.settings.source == CONNECTOR_FORMAT

    def _source(self, source_options: Mapping[str, Any] | None) -> Any:
        """The ``cutline-kafka`` stream of the job's topics, from the restored offsets, with barriers
        (on the connector: :meth:`_connector_source`)."""
        if self.on_connector:
            return self._connector_source(source_options)
        self.spark.dataSource.register(KafkaSource)
        options = {
            "kafka.bootstrap.servers": self.settings.bootstrap,
            **{k: v for k, v in self.settings.source_options.items() if k != "startingOffsets"},
            **(source_options or {}),
            "subscribe": ",".join(self.settings.topics),
            "startingOffsets": self.starting_offsets,
            "cutline.job": self.settings.job_id,
            "cutline.topicPrefix": self.settings.topic_prefix,
            "cutline.attempt": self.attempt,
            "cutline.wireFormat": self.settings.wire.wire_format,
            **(
                {"cutline.schemaRegistryUrl": self.settings.wire.schema_registry_url}
                if self.settings.wire.schema_registry_url
                else {}
            ),
            "cutline.latencyIntervalMs": self.settings.latency_interval_ms,
            "cutline.pauseFile": str(self.pause_file),
        }
        reader = self.spark.readStream.format(FORMAT)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    def _connector_source(self, source_options: Mapping[str, Any] | None) -> Any:
        """Spark's ``format("kafka")`` stream of the job's topics from exact offsets (the restored ones,
        or ``startingOffsets`` resolved), unioned with the job's ``cutline-barriers`` source."""
        settings = self.settings
        user = {**settings.source_options, **(source_options or {})}
        # the Kafka client settings cutline's own clients use, as the connector's (docs/spark.md)
        user = {**connector_security_options(client_properties(), given=user), **user}
        starting = (
            self.starting_offsets
            if self.restored is not None
            else str(user.get("startingOffsets", "earliest"))
        )
        self._first_cut = self._exact_offsets(starting)
        options = connector_options(
            user,
            bootstrap=settings.bootstrap,
            topics=settings.topics,
            group=settings.consumer_group,
            starting=self._first_cut,
            restored=None if self.restored is None else self.restored.checkpoint_id,
            per_partition=settings.keyed_partitions is None,
        )
        barriers = {
            "cutline.job": settings.job_id,
            "cutline.bootstrap": settings.bootstrap,
            "cutline.topicPrefix": settings.topic_prefix,
            "cutline.attempt": self.attempt,
            "cutline.wireFormat": settings.wire.wire_format,
            "cutline.schemaRegistryUrl": settings.wire.schema_registry_url or "",
            "cutline.pauseFile": str(self.pause_file),
            # a per-partition job's driver snapshots at the cut (connector_cuts.PartitionSnapshots)
            "cutline.barrierRows": str(settings.keyed_partitions is not None).lower(),
            "cutline.latencyIntervalMs": settings.latency_interval_ms,
        }
        return connector_stream(self.spark, options, barriers)

    def _exact_offsets(self, starting: str) -> dict[TopicPartitionKey, int]:
        """``startingOffsets`` (``earliest``, ``latest`` or JSON naming every partition, -2 earliest and
        -1 latest) as the offset of each of the job's partitions."""
        with OffsetProbe(self.settings.bootstrap, {}, self.timeout) as probe:
            if starting == "earliest":
                return probe.earliest(self.partitions)
            if starting == "latest":
                return probe.latest(self.partitions)
            requested = from_offsets(starting)
            missing = [f"{t}[{p}]" for t, p in self.partitions if (t, p) not in requested]
            if missing:
                raise ValueError(
                    "startingOffsets must name every partition of the job's topics (-2 earliest, -1 "
                    f"latest); missing: {', '.join(missing)}"
                )
            own = {tp: requested[tp] for tp in self.partitions}
            earliest = probe.earliest(tp for tp, offset in own.items() if offset == EARLIEST)
            latest = probe.latest(tp for tp, offset in own.items() if offset == LATEST)
            return {tp: earliest.get(tp, latest.get(tp, offset)) for tp, offset in own.items()}

    def _send_source_ack(self, ack: SourceAck) -> None:
        """The ``source`` task's ack: the cut's offsets, no state (:mod:`spark_tasks.connector_cuts`)."""
        settings = self.settings
        barrier = entry_barrier(settings.job_id, ack.barrier)
        reply = CheckpointAcknowledged(
            job_id=settings.job_id,
            checkpoint_id=barrier.checkpoint_id,
            attempt=barrier.attempt,
            task_id=SOURCE_TASK,
            timestamp_ms=time.time_ns() // 1_000_000,
            offsets={f"{t}:{p}": offset for (t, p), offset in sorted(ack.offsets.items())},
        )
        task = TaskSettings(
            settings.job_id, settings.bootstrap, "", settings.topic_prefix, wire=settings.wire
        )
        send_reply(task, Answer(reply, barrier_epoch(ack.barrier.get("epoch"))))
        log.info(
            "job %s: source acknowledged checkpoint %d at batch %d's %s: %s",
            settings.job_id,
            barrier.checkpoint_id,
            ack.batch_id,
            "end" if ack.after_commit else "start",
            dict(reply.offsets),
        )

    @staticmethod
    def _schema(ddl: str) -> Any:
        from pyspark.sql.types import StructType

        schema = StructType.fromDDL(ddl)
        if not isinstance(schema, StructType):
            raise TypeError(f"output_schema must describe columns, got {ddl!r}")
        return schema

    def stream(self, step: StatefulStep[Any], source_options: Mapping[str, Any] | None = None) -> Any:
        """The DataFrame of ``step``'s output over the job's input topics, with checkpoints."""
        from pyspark.sql.pandas.types import to_arrow_schema

        if self.settings.keyed_partitions is not None:
            raise TypeError("this job is keyed (JobSettings.keyed_partitions): use stream_keyed(KeyedStep)")
        source = self._source(source_options)
        schema = self._schema(step.output_schema)
        # Every partition gets a first state version before the query starts: the restored one, or
        # the initial state at offset 0. A task that then finds none declines (spark_tasks.tasks).
        initial: bytes | None = None
        for topic, partition in self.partitions:
            if not self.store.versions(topic, partition):
                initial = step.serialize(step.initial()) if initial is None else initial
                self.store.save(topic, partition, 0, initial)
        settings = TaskSettings(
            job_id=self.settings.job_id,
            bootstrap=self.settings.bootstrap,
            state_dir=str(self.work_dir / "state"),
            topic_prefix=self.settings.topic_prefix,
            run_id=self.run_id,
            seeded=frozenset(self.tasks),
            wire=self.settings.wire,
            attempt=self.attempt,
        )
        self._partition_snapshots = PartitionSnapshots(self.store, settings)
        return source.mapInArrow(partition_step(step, settings, to_arrow_schema(schema)), schema)

    def stream_keyed(self, step: AnyKeyedStep, source_options: Mapping[str, Any] | None = None) -> Any:
        """The DataFrame of a keyed ``step``'s output: the input's ``(key, value)`` pairs shuffled by
        key group into ``JobSettings.keyed_partitions`` partitions, each keeping the state of its key
        groups, snapshotting them at every barrier and acking once per partition
        (:mod:`spark_tasks.keyed`). ``step`` is a :class:`KeyedStep` (per record and key) or a
        :class:`~spark_tasks.keyed.KeyedBatchStep` (whole Arrow batches)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        parallelism = self.settings.keyed_partitions
        if parallelism is None:
            raise TypeError("stream_keyed needs JobSettings.keyed_partitions (the shuffle partitions)")
        if step.max_parallelism != self.settings.max_parallelism:
            raise ValueError(
                f"the step's max_parallelism {step.max_parallelism} differs from the job's "
                f"{self.settings.max_parallelism} (JobSettings.max_parallelism): they must match"
            )
        self._seed_keyed(step, parallelism)
        schema = self._schema(step.output_schema)
        settings = KeyedSettings(
            job_id=self.settings.job_id,
            bootstrap=self.settings.bootstrap,
            state_root=self.keyed_root,
            parallelism=parallelism,
            # on the connector, a barrier comes from the barrier source alone (its batch aligns the
            # Kafka partitions), and the driver's source task acks the cut's offsets
            inputs=frozenset({CHANNEL}) if self.on_connector else frozenset(self.partitions),
            topic_prefix=self.settings.topic_prefix,
            run_id=self.run_id,
            attempt=self.attempt,
            wire=self.settings.wire,
            acks_carry_offsets=not self.on_connector,
        )
        return (
            self._source(source_options)
            .mapInArrow(route_step(step, parallelism, settings), shuffle_schema(step))
            .repartitionById(parallelism, TARGET_COLUMN)
            .mapInArrow(process_step(step, settings, to_arrow_schema(schema)), schema)
        )

    def _seed_keyed(self, step: AnyKeyedStep, parallelism: int) -> None:
        """Write every shuffle partition's first state version, once per attempt: the restored key
        groups if they are ``step``'s (:func:`~spark_tasks.restore.restore_step`), else empty.
        Raises :class:`RestoreRefused` if they are another step's and the job does not allow that."""
        if self._keyed_seeded:
            return
        restored = self._restored_keyed
        plan = self._plan
        if plan is not None:
            decision = restore_step(
                plan, step.identity, allow_non_restored_state=self.settings.allow_non_restored_state
            )
            if isinstance(decision, Refused):
                raise RestoreRefused(
                    refusal_message(self.settings.job_id, [decision], latest=False), (decision,)
                )
            if isinstance(decision, LeftBehind):
                log.warning(
                    "job %s: checkpoint %d's keyed state is left behind (allow_non_restored_state): %s",
                    self.settings.job_id,
                    plan.checkpoint_id,
                    decision.reason,
                )
                restored = []
        for i in range(parallelism):
            KeyedStateStore(self.keyed_root, i).seed(restored[i] if restored else {})
        self._restored_keyed, self._keyed_seeded = [], True

    @property
    def batch_property(self) -> str | None:
        """A keyed job's :func:`~spark_tasks.keyed.connect_batch_property` (None: not keyed)."""
        if self.settings.keyed_partitions is None:
            return None
        return connect_batch_property(self.settings.job_id, self.run_id)

    def foreach_batch(self, function: Callable[[Any, int], object]) -> WithBatchId:
        """``function`` as this job's ``foreachBatch`` function, on any session: on Spark Connect
        a keyed job's tasks learn the batch id from it (:func:`~spark_tasks.keyed.batch_id_known`).
        A :class:`~spark_tasks.sink.CutFileSink` does this itself."""
        return WithBatchId(function, self.batch_property)

    def start(self, writer: Any) -> Any:
        """Start ``writer`` (a DataStreamWriter of :meth:`stream`'s output) as this job's query."""
        if self.query is not None:
            raise RuntimeError("the job's query is already started")
        if self._follower is None:
            self._follower = JournalFollower(
                self.settings.bootstrap,
                self.settings.job_id,
                self.topics.checkpoints,
                self.settings.consumer_group,
                self._on_journal_record,
                timeout=self.timeout,
            )
        self._listener = QueryStatusListener(
            self.spark,
            self.query_name,
            self.settings.job_id,
            on_running=self._publish_running,
            on_end=self._publish_end,
        )
        self._listener.register()
        self.pause_file.unlink(missing_ok=True)  # a stopped run's, in the same directory
        Path(held_file(str(self.pause_file))).unlink(missing_ok=True)
        spark_checkpoint = self.work_dir / "spark"
        self._set_aside_stale_spark_checkpoint(spark_checkpoint)
        writer = writer.queryName(self.query_name).option("checkpointLocation", str(spark_checkpoint))
        try:
            if self._listener.connect:  # one query of the job in the server (_claim_query_id)
                write_query_id(spark_checkpoint, self.query_id)
            self.query = _start_query(writer, self.settings.job_id)
        except BaseException:
            self.close()
            raise
        self._listener.follow(self.query)
        if self.on_connector:
            self._cuts = CutFollower(
                spark_checkpoint,
                self._first_cut,
                self.partitions,
                self._send_source_ack if self._partition_snapshots is None else self._partition_snapshots,
                name=f"cutline-cuts-{self.settings.job_id}",
                ready=lambda entry: all(gate(entry) for gate in self.cut_gates),
            )
        return self.query

    def _close_cuts(self) -> None:
        if self._cuts is not None:
            self._cuts.close()
            self._cuts = None

    def _set_aside_stale_spark_checkpoint(self, spark_checkpoint: Path) -> None:
        """Rename ``spark_checkpoint`` aside if it exists: an earlier driver of this attempt number
        ran a query there and ended before the coordinator journaled its start (a crash in its
        first batches), so the journal gave this driver the same attempt. Spark would resume from
        that query's offsets and ignore the restored ones: the records of its batches would be
        neither in the restored state nor read again. No cutline restore reads Spark's checkpoint;
        it stays beside, for a look."""
        if not spark_checkpoint.exists():
            return
        aside = spark_checkpoint.with_name(f"{spark_checkpoint.name}-before-{self.run_id}")
        spark_checkpoint.rename(aside)
        log.warning(
            "job %s attempt %d: an earlier driver of this attempt left a Spark checkpoint (it ended "
            "before the coordinator ran it); the query starts from the restored offsets, and that "
            "checkpoint is kept at %s",
            self.settings.job_id,
            self.attempt,
            aside,
        )

    def _publish_running(self) -> None:
        restored = self.restored
        self.driver.running(
            self.tasks,
            self.settings.config,
            self.attempt,
            restored_checkpoint_id=None if restored is None else restored.checkpoint_id,
            restored_location=None if restored is None else restored.location or None,
        )
        log.info(
            "job %s attempt %d is RUNNING with %d tasks", self.settings.job_id, self.attempt, len(self.tasks)
        )
        self._close_scheduler_watch()
        self._scheduler_watch = SchedulerWatch(
            self._scheduled,
            self.settings.job_id,
            self.attempt,
            self.settings.topic_prefix,
            self.settings.bootstrap,
            after_s=self.settings.unscheduled_warning_s,
        ).start()

    def _close_scheduler_watch(self) -> None:
        if self._scheduler_watch is not None:
            self._scheduler_watch.close()
            self._scheduler_watch = None

    def _canceled_after_failing(self) -> None:
        """``cutline cancel`` reached this driver after its attempt had failed but before the restart
        delay began (on Apache Kafka the journal's cancel can arrive first): cancel wins there too,
        the attempt is CANCELED and no next attempt starts."""
        log.warning("job %s was canceled after attempt %d failed", self.settings.job_id, self.attempt)
        self._publish_canceled()

    def _publish_canceled(self) -> None:
        """The attempt that failed is CANCELED: the job was canceled in its restart delay."""
        try:
            self.driver.status(JobStatus.CANCELED, attempt=self.attempt)
        except (KafkaException, TimeoutError) as exc:
            log.error("could not publish CANCELED of job %s: %s", self.settings.job_id, exc)

    def _publish_end(self, exception: str | None) -> None:
        self._close_scheduler_watch()
        # A failure is FAILING: the job's restart strategy decides (cutline run carries it out).
        if self.failure is not None:
            status, error = JobStatus.FAILING, str(self.failure)
        elif exception:
            status, error = JobStatus.FAILING, failure_summary(exception)
        elif self._stopping:
            status, error = JobStatus.CANCELED, None
        else:
            status, error = JobStatus.FINISHED, None
        try:
            self.driver.status(status, error=error, attempt=self.attempt)
        except (KafkaException, TimeoutError) as exc:
            log.error("could not publish %s of job %s: %s", status, self.settings.job_id, exc)

    # ------------------------------------------------------------- journal

    def _on_journal_record(self, record: Record) -> None:
        """Act on one decoded journal record of this job, as the ledger decides."""
        if isinstance(record, TriggerRejected):
            if record.request_id is not None:
                with self._completion:
                    self.rejected[record.request_id] = record
                    self._completion.notify_all()
            return
        try:  # a completion too large for one journal record: its metadata object has the rest
            decision = self.ledger.fold(
                resolve_completion(record) if isinstance(record, CheckpointCompleted) else record
            )
        except MetadataUnavailable as exc:
            decision = Ignore(str(exc))
        if isinstance(decision, Ignore):
            self._ignore(record, decision.reason)
        elif isinstance(decision, Complete):
            self._on_completed(decision)
        elif isinstance(decision, Abort):
            self._on_aborted(decision)
        elif isinstance(decision, Fail):
            self._on_threshold(decision.exceeded)
        elif isinstance(decision, Restart | GiveUp):
            with self._completion:
                self._decision = decision.scheduled if isinstance(decision, Restart) else decision.failed
                self._completion.notify_all()
        elif isinstance(decision, ConfirmRunning):
            self._scheduled.set()
        elif isinstance(decision, Stop):
            self._end_with(decision)

    def _end_with(self, stop: Stop) -> None:
        """Stop with a savepoint and cancel (docs/spark.md, "Stop with a savepoint"): when this
        attempt's stop savepoint completed the query stops and the job is FINISHED; when the job is
        CANCELLING it stops and is CANCELED. The source already reads nothing after the stop's cut."""
        if stop.status is JobStatus.CANCELED:
            self._canceled.set()
        if self.query is None:
            return
        finished = stop.status is JobStatus.FINISHED
        log.info("job %s attempt %d stops (%s)", self.settings.job_id, self.attempt,
                 "its stop savepoint completed" if finished else "canceled")  # fmt: skip
        threading.Thread(target=self.stop, kwargs={"finished": finished}, daemon=True).start()

    def _ignore(self, record: Record, reason: str) -> None:
        checkpoint_id = getattr(record, "checkpoint_id", None)
        log.warning(
            "job %s attempt %d ignores %s%s: %s",
            self.settings.job_id,
            self.attempt,
            type(record).__name__,
            "" if checkpoint_id is None else f" of checkpoint {checkpoint_id}",
            reason,
        )
        with self._lock:
            self.ignored.append((record, reason))

    def _on_completed(self, decision: Complete) -> None:
        completed = decision.completed
        assert self._follower is not None  # the follower hands out the records
        if not self._scheduled.is_set() and not self._said_unconfirmed:
            self._said_unconfirmed = True
            log.warning(
                "job %s attempt %d: checkpoint %d completed, but this driver has read no valid "
                "SchedulerStarted of the attempt (its `running` stays false; void journal records: %s)",
                self.settings.job_id, self.attempt, completed.checkpoint_id, dict(self._follower.void),
            )  # fmt: skip
        keyed = self.settings.keyed_partitions is not None
        pieces = (
            self._retention.pieces_needed_by(completed)
            if keyed and completed.kind is CheckpointKind.CHECKPOINT
            else None
        )
        self._follower.commit(completed.checkpoint_id, decision.commit)
        if decision.metadata is not None:
            self._write_metadata(decision.metadata, completed)
        with self._completion:
            self.completed.append(completed)
            self._completion.notify_all()
        self._retention.completed(completed.checkpoint_id, decision.discard, pieces, self._run_files)
        if decision.stop is not None:  # the stop savepoint: its offsets and _metadata first
            self._end_with(decision.stop)

    def _write_metadata(self, directory: str, completed: CheckpointCompleted) -> None:
        """``_metadata`` next to the snapshots it describes: every handle's file is there, of its size
        (inline state is in the record itself)."""
        for task, handle in completed.handles.items():
            if handle.inline is not None:
                continue
            try:
                size = storage.size(handle.uri)
            except (OSError, ValueError, ImportError) as exc:
                size, problem = -1, f"{type(exc).__name__}: {exc}"
            else:
                problem = f"{size} bytes, not {handle.size_bytes}"
            if size != handle.size_bytes:
                log.warning(
                    "no %s for checkpoint %d in %s: the state of %s is not there (%s)",
                    METADATA_FILE,
                    completed.checkpoint_id,
                    directory,
                    task,
                    problem,
                )
                return
        try:
            storage.write_bytes(
                storage.join(directory, METADATA_FILE), codec_for(self.settings.wire).encode(completed)
            )
        except (OSError, ValueError, ImportError) as exc:
            log.warning(
                "could not write %s of checkpoint %d: %s", METADATA_FILE, completed.checkpoint_id, exc
            )

    def _on_aborted(self, decision: Abort) -> None:
        with self._lock:
            self.aborted.append(decision.aborted)
        if decision.discard is not None:
            self._retention.aborted(decision.discard, self._run_files)

    @property
    def _run_files(self) -> RunFiles:
        """The files this run and attempt writes into checkpoint directories: retention deletes no other."""
        return RunFiles(tuple(self.tasks), self.attempt, self.run_id, self.settings.keyed_partitions)

    def _on_threshold(self, exceeded: CheckpointFailureThresholdExceeded) -> None:
        self.failure = CheckpointFailuresExceeded(
            f"job {self.settings.job_id}: {exceeded.failures} checkpoint failures in a row, more than the "
            f"{exceeded.tolerable} tolerated (last: checkpoint {exceeded.checkpoint_id}, {exceeded.reason}). "
            f"The query was stopped. See `cutline status {self.settings.job_id}` for the reasons, fix the "
            "cause (often the checkpoint location), then start the job again: it restores from the latest "
            "completed checkpoint. Raise tolerable_failures to ride out more."
        )
        log.error("%s", self.failure)
        if self.query is not None:
            threading.Thread(target=self.query.stop, name="cutline-stop-query", daemon=True).start()

    # ------------------------------------------------------------ lifecycle

    def run(self, make_writer: Callable[[CheckpointedJob], Any]) -> None:
        """Run the query ``make_writer(self)`` builds (a DataStreamWriter of :meth:`stream`'s output)
        and restart it in this SparkSession as the job's restart strategy decides
        (docs/design.md, "Job lifecycle").

        When the query fails the job reports FAILING and waits for the coordinator: on
        ``JobRestartScheduled`` it waits the delay and starts the next attempt, restored from the
        checkpoint the decision names (``make_writer`` is called again: build the stream and the
        sink, e.g. a :class:`~spark_tasks.sink.CutFileSink`, from the job each time); on
        ``JobFailedPermanently`` it raises :class:`JobFailedForGood`. Returns when the query ends
        without failing (:meth:`stop`, or the query finished).
        """
        while True:
            self.start(make_writer(self))
            try:
                self.await_termination()
            except Exception as exc:  # the query failed: the strategy decides
                if self._stopping and self._canceled.is_set():
                    self._canceled_after_failing()
                    return
                if self._stopping:
                    raise
                log.warning("job %s attempt %d failed: %s", self.settings.job_id, self.attempt, exc)
            else:
                if self._listener is None or self._listener.exception is None or self._stopping:
                    if self._canceled.is_set() and self._listener is not None and self._listener.exception:
                        self._canceled_after_failing()
                    return
            decision = self._await_decision()
            if isinstance(decision, JobFailedPermanently):
                raise JobFailedForGood(
                    f"job {self.settings.job_id} failed for good after attempt {decision.attempt} "
                    f"({decision.failure}): {decision.reason}"
                )
            wait_s = decision.restart_at_ms / 1000 - time.time()
            log.warning(
                "job %s: the restart strategy starts attempt %d in %.1f s, restoring %s",
                self.settings.job_id,
                decision.attempt,
                max(wait_s, 0),
                decision.restore_checkpoint_id,
            )
            if self._canceled.wait(max(wait_s, 0)):
                # cutline cancel in the restart delay: cancel wins, no next attempt starts
                log.warning("job %s was canceled in its restart delay", self.settings.job_id)
                self._publish_canceled()
                return
            self._next_attempt(decision)

    def _await_decision(self) -> JobRestartScheduled | JobFailedPermanently:
        deadline = time.monotonic() + RESTART_DECISION_TIMEOUT_S
        with self._completion:
            while self._decision is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"job {self.settings.job_id} attempt {self.attempt} failed and no restart decision "
                        f"came within {RESTART_DECISION_TIMEOUT_S:g}s; is `cutline coordinator` running "
                        f"with topic prefix {self.settings.topic_prefix!r}?"
                    )
                self._completion.wait(min(left, 0.2))
            return self._decision

    def _next_attempt(self, restart: JobRestartScheduled) -> None:
        """Become ``restart.attempt``: a fresh work directory, the named checkpoint restored."""
        if self._listener is not None:
            with contextlib.suppress(Exception):
                self._listener.unregister()
        self._listener = None
        self._close_cuts()
        target = restart.restore_checkpoint_id
        history = self.driver.journal((SchedulerStarted, CheckpointCompleted))
        self._begin_attempt(restart.attempt, self.settings.restore if target is None else target, history)

    def wait_for_running(self, timeout: float = 60.0) -> None:
        """Block until the coordinator runs this attempt (its SchedulerStarted is in the journal)."""
        if not self._scheduled.wait(timeout):
            published = self._listener is not None and self._listener.running.is_set()
            raise TimeoutError(
                f"job {self.settings.job_id} attempt {self.attempt} was not RUNNING on the coordinator "
                f"within {timeout:g}s (RUNNING published: {published}); is `cutline coordinator` running "
                f"with topic prefix {self.settings.topic_prefix!r}?"
            )

    def wait_for_completed(self, count: int = 1, timeout: float = 60.0) -> list[CheckpointCompleted]:
        """Block until this attempt has ``count`` completed checkpoints; returns them."""
        deadline = time.monotonic() + timeout
        with self._completion:
            while len(self.completed) < count:
                left = deadline - time.monotonic()
                if left <= 0 or self.failure is not None:
                    raise TimeoutError(
                        f"job {self.settings.job_id}: {len(self.completed)} of {count} checkpoints "
                        f"completed within {timeout:g}s"
                    )
                self._completion.wait(min(left, 0.2))
            return list(self.completed)

    def savepoint(self, target: str | Path, timeout: float = 60.0) -> CheckpointCompleted:
        """Ask for a savepoint into ``target`` (a directory) and wait until it completes."""
        uri = target if isinstance(target, str) and "://" in target else Path(target).resolve().as_uri()
        request = CheckpointRequested(
            job_id=self.settings.job_id,
            kind=CheckpointKind.SAVEPOINT,
            timestamp_ms=time.time_ns() // 1_000_000,
            request_id=uuid.uuid4().hex,
            target=uri,
        )
        deadline = time.monotonic() + timeout
        self.driver.request(request)
        with self._completion:
            while True:
                for completed in self.completed:
                    if completed.kind is CheckpointKind.SAVEPOINT and completed.location.startswith(uri):
                        return completed
                rejected = self.rejected.get(request.request_id)
                if rejected is not None:
                    raise RuntimeError(
                        f"the coordinator refused the savepoint: {rejected.reason} {rejected.message}".strip()
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"savepoint into {uri} did not complete within {timeout:g}s")
                self._completion.wait(min(left, 0.2))

    @property
    def running(self) -> bool:
        """The coordinator runs this attempt: RUNNING was published and its scheduler started."""
        return self._scheduled.is_set()

    @property
    def pause_file(self) -> Path:
        """While it exists the source plans no new batch (``cutline.pauseFile``): :meth:`stop`
        creates it, so that a backlog's back-to-back batches leave a moment to stop between them."""
        return self.work_dir / "pause-source"

    def stop(self, *, finished: bool = False) -> None:
        """Stop the query and wait until its status is published: CANCELED, or FINISHED if ``finished``."""
        self._stopping = not finished
        if self.query is not None:
            self.pause_file.parent.mkdir(parents=True, exist_ok=True)
            self.pause_file.touch()
            self._between_batches()
            self.query.stop()
            if self._listener is not None:
                self._listener.ended.wait(10)

    def _between_batches(self, timeout: float = 10.0) -> None:
        """Wait (up to ``timeout`` s) until no micro-batch runs, so that stopping interrupts none.

        Interrupting a ``foreachBatch`` batch makes classic PySpark match the Python error's
        text against a regex (SPARK-48717), which can overflow the stack of the query's
        thread on a long traceback; the query then ends without its terminated event.
        """
        deadline = time.monotonic() + timeout
        held = Path(held_file(str(self.pause_file)))
        while time.monotonic() < deadline:
            if self.on_connector and held.exists():
                return  # the barrier source holds the next batch's planning: stopping interrupts that
            try:
                status = self.query.status
            except Exception:  # the query is already gone
                return
            if not status.get("isTriggerActive", False):
                return
            time.sleep(0.02)

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the query to end; raises :class:`CheckpointFailuresExceeded` if that ended it."""
        if self.query is None:
            raise RuntimeError("start the job first")
        ended = self.query.awaitTermination(timeout) if timeout is not None else self.query.awaitTermination()
        if self._listener is not None and (ended is None or ended):
            self._listener.ended.wait(10)
        if self.failure is not None:
            raise self.failure
        return bool(ended is None or ended)

    def close(self) -> None:
        """Stop the query if it runs, the listener and the journal thread; idempotent."""
        if self.query is not None and self.query.isActive:
            self.stop()
        if self._listener is not None:
            with contextlib.suppress(Exception):
                self._listener.ended.wait(5)
                self._listener.unregister()
            self._listener = None
        if self._follower is not None:
            self._follower.close()
            self._follower = None
        self._close_cuts()
        self._close_scheduler_watch()
        self.driver.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


WORKER_STARTS = 3
"""How often a query start is tried when the server's Python worker for it does not connect back."""


def _start_query(writer: Any, job_id: str) -> Any:
    """``writer.start()``, tried again (up to :data:`WORKER_STARTS` times) when it fails because a
    Python worker did not connect back: Spark gives a Spark Connect ``foreachBatch`` function's
    fresh Python process 10 s for that (not configurable), which a loaded machine can miss. No
    query ran, so starting again is safe."""
    for attempt in range(1, WORKER_STARTS + 1):
        try:
            return writer.start()
        except Exception as exc:
            if attempt == WORKER_STARTS or "Python worker to connect back" not in str(exc):
                raise
            log.warning("job %s: the query did not start (%s); starting it again", job_id,
                        "its Python worker did not connect back in time")  # fmt: skip
    raise AssertionError("unreachable")
