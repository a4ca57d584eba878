"""Exactly-once output to Kafka, committed with the checkpoint (docs/exactly-once.md).

A participant's :class:`ExactlyOnceSink` keeps the records the app sends between two barriers in
memory (bounded), writes them at the barrier into the checkpoint's location beside the task's
snapshot (``<location>/<task>.<uid>.out``, before the participant acks, so the checkpoint covers them),
and sends them when the journal completes the checkpoint: in one Kafka transaction with a
**commit marker** (key ``job/uid/task``, value the checkpoint id and attempt) to the marker topic
``<prefix>sink-commits``. "Committed" is recorded atomically with the output. Sending ahead (the
default), the records also go into an open transaction as they are sent, flushed at the barrier, and
a completion that covers exactly that checkpoint adds the marker and commits it; any other case
aborts it and sends the staged copy.

librdkafka cannot resume another producer's transaction, so a process that resumes the job does not
try: :meth:`ExactlyOnceSink.recover` initialises the same transactional id (which fences the dead
producer and aborts what it left open), reads the marker (``read_committed``), and sends again the
staged files of completed checkpoints after the marked one, in checkpoint order. Which ones is
:func:`recovery_plan`'s decision, pure; the rest of this module is the shell around it.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload
from urllib.parse import quote

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from events.dev.broker import create_topics
from events.kafka.acls import sink_commits_topic, sink_transactional_id_prefix
from events.kafka.clients import consumer_config, partition_count, partition_for, producer_config
from events.kafka.clients import read_partition_to_end as read_to_end
from events.kafka.feed import read_job_partition
from events.task import storage
from events.wire.records import CheckpointBarrier, CheckpointCompleted, CheckpointTriggered, JobStatus
from events.wire.topics import Topics

__all__ = [
    "COMMITS_TOPIC_CONFIG",
    "BufferFull",
    "Completion",
    "ExactlyOnceSink",
    "Marker",
    "OutputBuffer",
    "OutputColumns",
    "OutputRecord",
    "Recovered",
    "RecoveryPlan",
    "Staged",
    "StagedOutput",
    "StagedOutputCorrupted",
    "Step",
    "commits_topic",
    "create_commits_topic",
    "decode_staged",
    "encode_staged",
    "marker_key",
    "orphans_for",
    "recovery_plan",
    "find_staged",
    "legacy_staged_name",
    "staged_name",
    "transaction_timeout_problem",
    "transactional_id",
]

log = logging.getLogger(__name__)

STAGED_FORMAT = "cutline-staged-output"
STAGED_VERSION = 2
"""A JSON header line, then the records as one Arrow IPC stream."""
READABLE_VERSIONS = (1, 2)
"""Version 1 (JSON lines with base64 bytes) is still read: a job staged by it recovers."""
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
"""librdkafka's default ``transaction.timeout.ms``."""
COMMIT_QUEUE_MESSAGES = 1_000_000
"""The producer's ``queue.buffering.max.messages``: a commit queues a checkpoint's records at once."""
SERVE_REPORTS_EVERY = 1000
"""Records a sink sends ahead between two serves of its producer's delivery reports (``poll(0)``), as
a plain producer's loop serves them. librdkafka keeps each delivered record until its report is
served: left to the flush at the barrier, an interval's records (tens of MB) pile up in fresh memory
and are freed in one burst, while the barrier waits."""
DEFAULT_MAX_BUFFERED_BYTES = 64 * 1024 * 1024
"""The most a sink keeps between two barriers (keys, values and headers): past it ``send`` refuses."""

AHEAD_SHARE_OF_TRANSACTION_TIMEOUT = 0.5
"""A transaction sent ahead open this share of ``transaction.timeout.ms`` is aborted by the sink (its
records go from the staged copy): one the broker aborts fences its producer for good."""

COMMITS_TOPIC_CONFIG = {"cleanup.policy": "compact"}
"""The marker topic keeps the latest marker of each ``job/uid/task``."""

Step = Callable[[str, int], None]
"""Called at each step of a commit with its name and checkpoint id (``committing``: the completion
is in, no transaction yet; ``open``: the transaction holds the records, not committed; ``committed``:
committed, the staged files not deleted yet; ``staged``: the staged file is written, not acked).
For tests that stop a process at each crash point."""


# ---------------------------------------------------------------- the pure core


@dataclass(frozen=True, order=True)
class Staged:
    """A staged file found at recovery: checkpoint ``checkpoint_id`` of ``attempt``."""

    checkpoint_id: int
    attempt: int


@dataclass(frozen=True, order=True)
class Completion:
    """A completion in the journal: checkpoint ``checkpoint_id``, completed for ``attempt``."""

    checkpoint_id: int
    attempt: int


@dataclass(frozen=True)
class Marker:
    """The last committed checkpoint of a sink's task: everything staged up to it was sent."""

    checkpoint_id: int
    attempt: int


@dataclass(frozen=True)
class RecoveryPlan:
    """What a resuming sink does: send ``commit`` again (ascending, in one transaction whose marker is
    the last of them), then delete the staged files of ``commit`` and of ``delete``."""

    commit: tuple[int, ...]
    delete: tuple[int, ...]

    @property
    def marker(self) -> int | None:
        return self.commit[-1] if self.commit else None


def covered(staged: Staged, completions: Iterable[Completion], restored: int | None) -> bool:
    """Whether the journal completed a checkpoint of the staged file's attempt at or after it (and
    not after ``restored``, the checkpoint the job resumes from; None: any). Its records are the
    output of input before that checkpoint's cut, which the job does not read again."""
    return any(
        c.attempt == staged.attempt
        and c.checkpoint_id >= staged.checkpoint_id
        and (restored is None or c.checkpoint_id <= restored)
        for c in completions
    )


def recovery_plan(
    marker: Marker | None,
    staged: Iterable[Staged],
    completions: Iterable[Completion],
    restored: int | None = None,
) -> RecoveryPlan:
    """Which staged checkpoints a resuming sink sends again, and which it deletes. Pure.

    Up to the marker everything was sent: delete. After it, a staged file covered by a completion
    (:func:`covered`) is committed again, in checkpoint order; one that no completion covers (its
    checkpoint aborted, expired, or was still pending when its attempt died) is deleted unsent:
    the job reads its input again from the restored cut.
    """
    done = 0 if marker is None else marker.checkpoint_id
    known = list(completions)
    commit: list[int] = []
    delete: list[int] = []
    for found in sorted(set(staged)):
        if found.checkpoint_id > done and covered(found, known, restored):
            commit.append(found.checkpoint_id)
        else:
            delete.append(found.checkpoint_id)
    return RecoveryPlan(tuple(commit), tuple(delete))


def orphans_for(task_id: str, tasks: Iterable[str], previous: Iterable[str]) -> tuple[str, ...]:
    """The tasks of earlier attempts that no task of ``tasks`` has any more (a rescale to fewer tasks)
    whose output ``task_id`` recovers: each orphan has one owner among ``tasks`` (the orphans and the
    tasks sorted, dealt in turn), so its completed output is committed once. Pure."""
    current = sorted(set(tasks))
    if task_id not in current:
        raise ValueError(f"task {task_id!r} is not one of the attempt's tasks {current}: pass every task")
    orphans = sorted(set(previous) - set(current))
    return tuple(orphan for i, orphan in enumerate(orphans) if current[i % len(current)] == task_id)


def transaction_timeout_problem(transaction_timeout_ms: int, commit_timeout_ms: int) -> str | None:
    """Why ``transaction.timeout.ms`` does not suit the sink, or None. Pure.

    A commit from the staged copy begins after the journal completed its checkpoint and ends with that
    commit, which the sink gives ``commit_timeout_ms``: a broker that aborted it sooner would make
    every large commit fail. A transaction sent ahead spans an interval and a checkpoint (Flink's
    pitfall); the sink aborts it itself at :data:`AHEAD_SHARE_OF_TRANSACTION_TIMEOUT` of the timeout
    and commits the staged copy instead, so no interval makes the timeout wrong."""
    if transaction_timeout_ms < commit_timeout_ms:
        return (
            f"transaction.timeout.ms={transaction_timeout_ms} is shorter than the sink's commit timeout "
            f"({commit_timeout_ms} ms): the broker could abort a commit the sink still waits for. Raise "
            f"transaction.timeout.ms to at least {commit_timeout_ms} (a transaction spans one commit, "
            "not a checkpoint: the checkpoint interval and timeout do not bound it)"
        )
    return None


def pending_through(staged: Iterable[int], completed: int) -> tuple[int, ...]:
    """The staged checkpoints a completion of ``completed`` sends: every one up to it (an aborted
    checkpoint's records go with the next completed one, whose cut covers them too), ascending. Pure."""
    return tuple(sorted(c for c in staged if c <= completed))


# ---------------------------------------------------------------- names


def _part(text: str) -> str:
    """One component of a transactional id: ``-`` and what is not safe percent-encoded, so that two
    different (job, uid, task) never share an id."""
    return quote(text, safe="._~").replace("-", "%2D")


def transactional_id(prefix: str, job_id: str, uid: str, task_id: str) -> str:
    """``<prefix>-<job>-<uid>-<task>``: stable across restarts, one per task of a sink (Flink's
    ``setTransactionalIdPrefix``; grant the prefix with a prefixed transactional-id ACL)."""
    return "-".join([prefix, _part(job_id), _part(uid), _part(task_id)])


def marker_key(job_id: str, uid: str, task_id: str) -> bytes:
    """The commit marker's key: ``job/uid/task``."""
    return "/".join(quote(part, safe="-._~:@") for part in (job_id, uid, task_id)).encode()


def commits_topic(topics: Topics) -> str:
    """The marker topic: ``<prefix>sink-commits``."""
    return sink_commits_topic(topics)


def staged_name(task_id: str, uid: str) -> str:
    """The staged file's name in a checkpoint's location: ``<task>.<uid>.out``, so that two sinks of
    one task stage apart (each part %-quoted, its dots too: the name reads back one way only)."""
    return f"{_name_part(task_id)}.{_name_part(uid)}.out"


def legacy_staged_name(task_id: str) -> str:
    """``<task>.out``: the name before the sink's uid was in it. Recovery still reads such a file,
    when its header names the sink's uid (a restore never drops what it may need)."""
    return _name_part(task_id).replace("%2E", ".") + ".out"


def find_staged(locations: Mapping[int, str], task_id: str, uid: str) -> dict[int, StagedOutput]:
    """The staged files of sink ``uid``'s task ``task_id`` in the checkpoint ``locations``, by
    checkpoint, checked (:class:`StagedOutputCorrupted`); a file of the old name counts when its
    header names ``uid``."""
    found: dict[int, StagedOutput] = {}
    for checkpoint_id, location in sorted(locations.items()):
        output = _read_staged(location, staged_name(task_id, uid))
        if output is None:
            legacy = _read_staged(location, legacy_staged_name(task_id))
            output = legacy if legacy is not None and legacy.uid == uid else None
        if output is None:
            continue
        if output.checkpoint_id != checkpoint_id or (output.task_id, output.uid) != (task_id, uid):
            raise StagedOutputCorrupted(
                f"{output.uri} holds checkpoint {output.checkpoint_id} of task {output.task_id} "
                f"(sink {output.uid}), not {checkpoint_id} of {task_id} (sink {uid})"
            )
        found[checkpoint_id] = output
    return found


def _read_staged(location: str, name: str) -> StagedOutput | None:
    uri = storage.join(location, name)
    try:
        data = storage.read_bytes(uri)
    except FileNotFoundError:
        return None
    return decode_staged(data, uri)


def _name_part(part: str) -> str:
    return quote(part, safe=":@=+,").replace(".", "%2E")


def create_commits_topic(bootstrap: str, topics: Topics, partitions: int = 8) -> list[str]:
    """Create the compacted marker topic unless it is there (an administrator may make it instead)."""
    return create_topics(
        bootstrap, [commits_topic(topics)], partitions=partitions, config=COMMITS_TOPIC_CONFIG
    )


# ---------------------------------------------------------------- staged files


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One record the app sends: ``partition`` None lets the producer's partitioner place it."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def size(self) -> int:
        return len(self.value or b"") + len(self.key or b"") + sum(len(k) + len(v) for k, v in self.headers)


Headers = tuple[tuple[str, bytes], ...]
ANY_PARTITION = -1
"""The partition of a record the producer's partitioner places (librdkafka's ``RD_KAFKA_PARTITION_UA``)."""


@dataclass(frozen=True)
class OutputColumns(Sequence[OutputRecord]):
    """Records in columns, as a sink keeps, stages and sends them: no object per record (a sink's
    cost per record is a few list appends beside the producer's own). A sequence of
    :class:`OutputRecord` for whoever reads them one by one.

    ``partitions`` holds :data:`ANY_PARTITION` where the partitioner chooses; ``headers`` only the
    records that have any, by index."""

    topics: Sequence[str] = ()
    values: Sequence[bytes | None] = ()
    keys: Sequence[bytes | None] = ()
    partitions: Sequence[int] = ()
    headers: Mapping[int, Headers] = field(default_factory=dict)

    @classmethod
    def of(cls, records: Iterable[OutputRecord]) -> OutputColumns:
        """The columns of ``records`` (the same object when they are columns already)."""
        if isinstance(records, OutputColumns):
            return records
        rows = list(records)
        return cls(
            [r.topic for r in rows],
            [r.value for r in rows],
            [r.key for r in rows],
            [ANY_PARTITION if r.partition is None else r.partition for r in rows],
            {i: r.headers for i, r in enumerate(rows) if r.headers},
        )

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> OutputRecord: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[OutputRecord, ...]: ...
    def __getitem__(self, index: int | slice) -> OutputRecord | tuple[OutputRecord, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        i = range(len(self))[index]
        partition = self.partitions[i]
        return OutputRecord(
            self.topics[i],
            self.values[i],
            self.keys[i],
            None if partition == ANY_PARTITION else partition,
            self.headers.get(i, ()),
        )


@dataclass(frozen=True)
class StagedOutput:
    """What a task staged at a barrier: its records, and where they are with their sha256 (the one in
    the file's header). The app may keep ``uri`` and ``sha256`` in its snapshot; recovery checks each
    file against the sha256 of its own header (:func:`decode_staged`), not yet against a snapshot's."""

    job_id: str
    uid: str
    task_id: str
    checkpoint_id: int
    attempt: int
    records: Sequence[OutputRecord]
    uri: str = ""
    sha256: str = ""


class StagedOutputCorrupted(ValueError):
    """A staged file does not hold what its header (or the snapshot) says, or is of a format this
    version of cutline cannot read."""


class BufferFull(RuntimeError):
    """The records sent since the last barrier would exceed the sink's ``max_buffered_bytes``."""


def _arrow() -> Any:
    """pyarrow, imported on first use (a core dependency; its import takes a while)."""
    import pyarrow

    return pyarrow


@functools.cache
def _staged_schema() -> Any:
    """The Arrow schema of a staged file's records (version 2)."""
    pa = _arrow()
    header = pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
    return pa.schema(
        [
            pa.field("topic", pa.dictionary(pa.int32(), pa.string()), nullable=False),
            pa.field("partition", pa.int32(), nullable=False),
            pa.field("key", pa.large_binary()),
            pa.field("value", pa.large_binary()),
            pa.field("headers", pa.list_(header)),
        ]
    )


def _arrow_stream(records: OutputColumns) -> Any:
    """``records`` as one Arrow IPC stream of :func:`_staged_schema` (a ``pyarrow.Buffer``): C loops
    over the columns."""
    pa = _arrow()
    schema = _staged_schema()
    count = len(records)
    if records.headers:
        found = records.headers
        headers = pa.array(
            [[{"key": k, "value": v} for k, v in found[i]] if i in found else None for i in range(count)],
            schema.field("headers").type,
        )
    else:
        headers = pa.nulls(count, schema.field("headers").type)
    batch = pa.record_batch(
        [
            _topic_column(records.topics, schema.field("topic").type),
            _partition_column(records.partitions),
            pa.array(records.keys, pa.large_binary()),
            pa.array(records.values, pa.large_binary()),
            headers,
        ],
        schema=schema,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _same(column: Sequence[Any]) -> bool:
    """Whether every item of ``column`` is its first (a C loop that compares by identity first)."""
    return bool(column) and column.count(column[0]) == len(column)


def _topic_column(topics: Sequence[str], dictionary: Any) -> Any:
    """The ``topic`` column: one topic for every record (the usual case) without hashing each."""
    pa = _arrow()
    if not _same(topics):
        return pa.array(topics, dictionary)
    indices = pa.repeat(pa.scalar(0, pa.int32()), len(topics))
    return pa.DictionaryArray.from_arrays(indices, pa.array(topics[:1], pa.string()))


def _partition_column(partitions: Sequence[int]) -> Any:
    """The ``partition`` column: one partition (or the partitioner's) for every record, repeated."""
    pa = _arrow()
    if not _same(partitions):
        return pa.array(partitions, pa.int32())
    return pa.repeat(pa.scalar(partitions[0], pa.int32()), len(partitions))


def _columns_of_stream(body: bytes, uri: str) -> OutputColumns:
    pa = _arrow()
    table = pa.ipc.open_stream(body).read_all()
    if not table.schema.equals(_staged_schema()):
        raise StagedOutputCorrupted(f"{uri}: its records are not of the staged schema: {table.schema}")
    headers = {
        i: tuple((h["key"], h["value"] or b"") for h in found)
        for i, found in enumerate(table.column("headers").to_pylist())
        if found
    }
    return OutputColumns(
        table.column("topic").to_pylist(),
        table.column("value").to_pylist(),
        table.column("key").to_pylist(),
        table.column("partition").to_pylist(),
        headers,
    )


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text, validate=True)


def _record_of_line(line: str) -> OutputRecord:
    """One record of a version-1 staged file: a JSON line with base64 bytes."""
    fields = json.loads(line)
    headers = tuple((str(k), _unb64(v) or b"") for k, v in fields.get("headers", []))
    return OutputRecord(
        fields["topic"], _unb64(fields["value"]), _unb64(fields["key"]), fields["partition"], headers
    )


def encode_staged(output: StagedOutput) -> bytes:
    """A staged file: a JSON header line (format, version, who, which checkpoint, how many records,
    the sha256 of the bytes after it), then the records as one Arrow IPC stream."""
    return _encode_staged(output)[0]


def _encode_staged(output: StagedOutput) -> tuple[bytes, str]:
    """The staged file, and the sha256 of its records (its header's)."""
    body = memoryview(_arrow_stream(OutputColumns.of(output.records)))
    digest = hashlib.sha256(body).hexdigest()
    header = {
        "format": STAGED_FORMAT,
        "version": STAGED_VERSION,
        "job": output.job_id,
        "uid": output.uid,
        "task": output.task_id,
        "checkpoint": output.checkpoint_id,
        "attempt": output.attempt,
        "records": len(output.records),
        "sha256": digest,
    }
    return b"".join([json.dumps(header, separators=(",", ":")).encode(), b"\n", body]), digest


def _decode_records(header: Mapping[str, Any], body: bytes, uri: str) -> OutputColumns:
    if header.get("format") != STAGED_FORMAT:
        raise StagedOutputCorrupted(f"{uri} is not a staged output (no {STAGED_FORMAT!r} header)")
    version = header.get("version")
    if version not in READABLE_VERSIONS:
        raise StagedOutputCorrupted(
            f"{uri} is a staged output of version {version}; this cutline reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}: recover the job with the cutline that staged it"
        )
    if hashlib.sha256(body).hexdigest() != header["sha256"]:
        raise StagedOutputCorrupted(f"{uri}: its records do not match the sha256 of its header")
    if version == 1:
        return OutputColumns.of(_record_of_line(line) for line in body.decode().splitlines())
    return _columns_of_stream(body, uri)


def decode_staged(data: bytes, uri: str = "") -> StagedOutput:
    """The staged output in ``data`` (version 2, or version 1's JSON lines), checked against its
    header; :class:`StagedOutputCorrupted` says what is wrong."""
    first, _, body = data.partition(b"\n")
    try:
        header = json.loads(first)
        records = _decode_records(header, body, uri)
    except StagedOutputCorrupted:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, _arrow().ArrowException) as exc:
        raise StagedOutputCorrupted(f"{uri} cannot be read as a staged output: {exc}") from exc
    if len(records) != header["records"]:
        raise StagedOutputCorrupted(f"{uri} holds {len(records)} records, not {header['records']}")
    return StagedOutput(
        header["job"],
        header["uid"],
        header["task"],
        int(header["checkpoint"]),
        int(header["attempt"]),
        records,
        uri,
        header["sha256"],
    )


class OutputBuffer:
    """The records a task sends between two barriers, in columns, bounded, and their staging at the
    barrier.

    No Kafka client: it pickles (a Spark sink's ``foreachBatch`` half runs where Spark runs it)."""

    def __init__(self, job_id: str, uid: str, task_id: str, max_buffered_bytes: int) -> None:
        self.job_id, self.uid, self.task_id = job_id, uid, task_id
        self.max_buffered_bytes = max_buffered_bytes
        self.size = 0
        """Bytes kept (keys, values and headers)."""
        self.discard()

    def append(
        self, topic: str, value: bytes | None, key: bytes | None, partition: int, headers: Headers
    ) -> None:
        """Keep one record until the next barrier (``partition`` :data:`ANY_PARTITION`: the
        partitioner's); :class:`BufferFull` past the bound."""
        size = self.size + (len(value) if value else 0) + (len(key) if key else 0)
        if headers:
            size += sum(len(k) + len(v) for k, v in headers)
        if size > self.max_buffered_bytes:
            raise BufferFull(
                f"sink {self.uid} of task {self.task_id}: {size} bytes "
                f"sent since the last barrier, more than max_buffered_bytes={self.max_buffered_bytes}: "
                "checkpoint more often or raise the bound"
            )
        self.size = size
        if headers:
            self._headers[len(self._values)] = headers
        self._topics.append(topic)
        self._values.append(value)
        self._keys.append(key)
        self._partitions.append(partition)

    def add(self, record: OutputRecord) -> None:
        """Keep ``record`` until the next barrier; :class:`BufferFull` past the bound."""
        partition = ANY_PARTITION if record.partition is None else record.partition
        self.append(record.topic, record.value, record.key, partition, record.headers)

    def extend(self, records: OutputColumns) -> int:
        """Keep every record of ``records`` until the next barrier (all or, past the bound, none:
        :class:`BufferFull`); how many."""
        size = self.size + sum(len(v) for v in records.values if v) + sum(len(k) for k in records.keys if k)
        size += sum(len(k) + len(v) for found in records.headers.values() for k, v in found)
        if size > self.max_buffered_bytes:
            raise BufferFull(
                f"sink {self.uid} of task {self.task_id}: {size} bytes "
                f"sent since the last barrier, more than max_buffered_bytes={self.max_buffered_bytes}: "
                "checkpoint more often or raise the bound"
            )
        self.size = size
        offset = len(self._values)
        self._headers.update((offset + i, found) for i, found in records.headers.items())
        self._topics.extend(records.topics)
        self._values.extend(records.values)
        self._keys.extend(records.keys)
        self._partitions.extend(records.partitions)
        return len(records)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def records(self) -> OutputColumns:
        """The records kept since the last barrier."""
        return OutputColumns(self._topics, self._values, self._keys, self._partitions, self._headers)

    def stage(self, barrier: CheckpointBarrier) -> StagedOutput:
        """Write the buffered records to ``<location>/<task>.<uid>.out``, atomically and durably, and
        start an empty buffer. The returned output holds the records in memory, to be sent from
        there by the process that staged them."""
        output = StagedOutput(
            self.job_id, self.uid, self.task_id, barrier.checkpoint_id, barrier.attempt, self.records
        )
        uri = storage.join(barrier.location, staged_name(self.task_id, self.uid))
        data, digest = _encode_staged(output)
        storage.write_bytes(uri, data)
        self.discard()
        return dataclasses.replace(output, uri=uri, sha256=digest)

    def discard(self) -> None:
        """Forget the buffered records (new lists: a staged output keeps the old ones)."""
        self._topics: list[str] = []
        self._values: list[bytes | None] = []
        self._keys: list[bytes | None] = []
        self._partitions: list[int] = []
        self._headers: dict[int, Headers] = {}
        self.size = 0


# ---------------------------------------------------------------- the shell


@dataclass(frozen=True)
class Recovered:
    """What :meth:`ExactlyOnceSink.recover` found and did."""

    marker: Marker | None
    plan: RecoveryPlan
    records: int
    """Records it sent again."""
    adopted: tuple[tuple[str, Recovered], ...] = ()
    """The recovery of each task of an earlier attempt this one took over (:func:`orphans_for`)."""


@dataclass
class _Pending:
    """Staged and not committed yet, in this process."""

    by_id: dict[int, StagedOutput] = field(default_factory=dict)


@dataclass(frozen=True)
class _Commit:
    """A commit the committing thread owes: ``outputs`` (ascending) in one transaction with ``marker``."""

    outputs: tuple[StagedOutput, ...]
    marker: Marker


class ExactlyOnceSink:
    """A participant's transactional Kafka output (see the module docstring and docs/exactly-once.md).

    The app calls :meth:`send` for each output record, :meth:`stage` from its ``snapshot`` callback
    (before the participant acks), :meth:`complete` from ``on_complete``, and :meth:`recover` once
    at start, before it sends anything (with the checkpoint it restored, if any).

    :meth:`complete` hands the commit to the sink's committing thread and returns: sends go on
    while a transaction commits. That thread commits one completion at a time, in the order they
    came; :meth:`wait_for_commits` (called by :meth:`on_stop` and :meth:`close`) waits for it.
    """

    def __init__(
        self,
        bootstrap: str,
        job_id: str,
        task_id: str,
        topics: Topics,
        *,
        uid: str = "sink",
        transactional_id_prefix: str | None = None,
        max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES,
        producer_extra: Mapping[str, Any] | None = None,
        consumer_extra: Mapping[str, Any] | None = None,
        commits_partitions: int = 8,
        timeout: float = 30.0,
        step: Step | None = None,
        send_ahead: bool = True,
    ) -> None:
        self.bootstrap = bootstrap
        self.job_id = job_id
        self.task_id = task_id
        self.uid = uid
        self._options: dict[str, Any] = {
            "uid": uid,
            "transactional_id_prefix": transactional_id_prefix,
            "max_buffered_bytes": max_buffered_bytes,
            "producer_extra": producer_extra,
            "consumer_extra": consumer_extra,
            "commits_partitions": commits_partitions,
            "timeout": timeout,
            "step": step,
            "send_ahead": send_ahead,
        }
        self.topics = topics
        self.commits = commits_topic(topics)
        prefix = transactional_id_prefix or sink_transactional_id_prefix(topics)
        self.transactional_id = transactional_id(prefix, job_id, uid, task_id)
        self.timeout = timeout
        self._consumer_extra = dict(consumer_extra or {})
        self._step = step
        self._buffer = OutputBuffer(job_id, uid, task_id, max_buffered_bytes)
        self._pending = _Pending()
        self._pending_lock = threading.Lock()
        self._commit_lock = threading.Lock()
        """Held by a commit: one transaction at a time (the committing thread's, a recovery's and
        :meth:`commit_staged`'s); :meth:`send` opens a transaction sent ahead only when it is free."""
        self.send_ahead = send_ahead
        """Whether records go into an open transaction as they are sent (Flink's way), so that a
        completion has only ``commit_transaction`` left; the staged copy stays for recovery."""
        self._ahead_lock = threading.Lock()
        """Guards the transaction sent ahead (:attr:`_sending_ahead`, :attr:`_prepared`) and the buffer
        against the committing thread. Taken before :attr:`_commit_lock`'s non-blocking try, never
        while waiting for it."""
        self._sending_ahead = False
        """An open transaction holds every record sent since the last barrier; :meth:`send` produces
        into it."""
        self._prepared: int | None = None
        """The checkpoint whose staged records and marker an open transaction holds, flushed at its
        barrier; its completion commits that transaction as it is (:meth:`_commit_prepared`)."""
        self._ahead_paused = False
        """Opening a transaction ahead failed, or one expired: no more until the next commit succeeds."""
        self._unserved = 0
        """Records sent ahead since the producer's delivery reports were last served."""
        self._commits_count: int | None = None
        """The marker topic's partitions, looked up at the first commit."""
        self._ahead_generation = 0
        self._ahead_timer: threading.Timer | None = None
        """Aborts the transaction sent ahead before ``transaction.timeout.ms`` (:meth:`_expire_ahead`)."""
        self._commits: queue.SimpleQueue[_Commit | None] = queue.SimpleQueue()
        self._owed = 0
        self._settled = threading.Condition()
        self._committer: threading.Thread | None = None
        self.failure: BaseException | None = None
        """What stopped the committing thread (a newer process fenced this producer), if anything."""
        config = producer_config(
            bootstrap,
            {
                "enable.idempotence": True,
                "transactional.id": self.transactional_id,
                # a commit produces a checkpoint's records at once; the buffer bounds them already
                "queue.buffering.max.messages": COMMIT_QUEUE_MESSAGES,
                **(producer_extra or {}),
            },
        )
        problem = transaction_timeout_problem(
            int(config.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)), int(timeout * 1000)
        )
        if problem is not None:
            raise ValueError(f"sink {uid} of {job_id}/{task_id}: {problem}")
        self._ahead_ttl = (
            int(config.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS))
            / 1000
            * AHEAD_SHARE_OF_TRANSACTION_TIMEOUT
        )
        create_commits_topic(bootstrap, topics, commits_partitions)
        self._producer = Producer(config)
        self._initialised = False
        self._left_open = False
        self._unfinished: _Commit | None = None
        """A commit whose ``commit_transaction`` failed retriably (its outcome unknown: the broker may
        have committed it); the next commit finishes it first, never aborts it."""
        """A commit failed after its transaction began, and aborting it failed too (the broker
        unreachable): the next commit aborts it first."""
        self.marker: Marker | None = None
        """The last commit marker this sink read (at :meth:`recover`) or committed."""
        self.committed: list[int] = []
        """Checkpoints whose output this sink committed, in order."""
        self.aborted: list[int] = []
        """Staged checkpoints a cancel deleted unsent."""

    # ------------------------------------------------------------ between barriers

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        """Keep one output record until the next barrier (:class:`BufferFull` past the bound) and, sending
        ahead, produce it into the open transaction.

        The hot path: one call into the buffer and one ``produce`` (positional arguments: keywords cost
        the producer twice the time); waiting on a full local queue and a failed produce go aside."""
        where = ANY_PARTITION if partition is None else partition
        found = tuple(headers) if headers else ()
        with self._ahead_lock:
            self._buffer.append(topic, value, key, where, found)
            if not self._sending_ahead:
                if self._may_go_ahead():
                    self._go_ahead()
                return
            try:
                if found:
                    self._producer.produce(topic, value, key, where, headers=list(found))
                else:
                    self._producer.produce(topic, value, key, where)
            except BufferError:  # the local queue is full: wait for it to drain
                self._produce_ahead(topic, value, key, where, found)
            except KafkaException as exc:
                self._stop_ahead(exc, True)
            self._unserved += 1
            if self._unserved >= SERVE_REPORTS_EVERY:
                self._serve_reports()

    def send_many(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        *,
        partition: int | None = None,
    ) -> int:
        """:meth:`send` each of ``values`` (with ``keys[i]``, if given) to ``topic``, in order, under one
        lock: all kept or, past the bound, none (:class:`BufferFull`); sending ahead, produced in one
        loop. How many. For an app that has its output in batches: the per-record cost is
        ``produce``'s and a few list extends, not a Python call each."""
        count = len(values)
        if keys is not None and len(keys) != count:
            raise ValueError(
                f"sink {self.uid}: send_many got {count} values and {len(keys)} keys: pass one key for each "
                "value, or no keys"
            )
        where = ANY_PARTITION if partition is None else partition
        batch = OutputColumns(
            [topic] * count, values, [None] * count if keys is None else keys, [where] * count
        )
        with self._ahead_lock:
            self._buffer.extend(batch)
            if not self._sending_ahead:
                if self._may_go_ahead():
                    self._go_ahead()
                return count
            try:
                self._produce_all(batch)
            except KafkaException as exc:
                self._stop_ahead(exc, True)
            self._unserved += count
            if self._unserved >= SERVE_REPORTS_EVERY:
                self._serve_reports()
        return count

    def _serve_reports(self) -> None:
        """Serve the delivery reports of the records sent ahead (with the ahead lock)."""
        self._unserved = 0
        self._producer.poll(0)

    @property
    def buffered(self) -> int:
        """Records sent since the last barrier."""
        return len(self._buffer)

    def stage(self, barrier: CheckpointBarrier) -> StagedOutput:
        """Write the records sent since the last barrier to ``<location>/<task>.<uid>.out``, atomically and
        durably; call it from the participant's ``snapshot``, so the ack covers them. Refused once the
        committing thread failed for good (:attr:`failure`): the checkpoint is declined."""
        self._raise_failure()
        with self._ahead_lock:
            staged = self._buffer.stage(barrier)
            with self._pending_lock:
                self._pending.by_id[barrier.checkpoint_id] = staged
            if self._sending_ahead:
                self._prepare(staged)
            elif self._prepared == barrier.checkpoint_id:  # staged again: the transaction no longer
                self._end_ahead()  # holds what the staged file does; the commit aborts it, sends the file
                self._left_open = True
        self._at("staged", barrier.checkpoint_id)
        return staged

    def complete(self, completed: CheckpointCompleted) -> None:
        """The journal completed ``completed``: commit every staged checkpoint up to it, on the
        committing thread (call it from the participant's ``on_complete``; it returns at once). Another
        attempt's completion commits nothing here."""
        self._raise_failure()
        with self._pending_lock:
            mine = {k: s for k, s in self._pending.by_id.items() if s.attempt == completed.attempt}
            ids = pending_through(mine, completed.checkpoint_id)
            if not ids:
                return
            for checkpoint_id in ids:
                del self._pending.by_id[checkpoint_id]
            marker = Marker(completed.checkpoint_id, completed.attempt)
            self._owe(_Commit(tuple(mine[k] for k in ids), marker))

    def wait_for_commits(self, timeout: float | None = None) -> None:
        """Wait until the committing thread has committed every completion handed to it (``timeout``
        s, the sink's by default; :class:`TimeoutError` past it), and raise what stopped it, if
        anything."""
        wait = self.timeout if timeout is None else timeout
        with self._settled:
            if not self._settled.wait_for(lambda: self._owed == 0, wait):
                raise TimeoutError(
                    f"sink {self.uid} of {self.job_id}/{self.task_id}: {self._owed} commits still running "
                    f"after {wait:g} s"
                )
        self._raise_failure()

    # ------------------------------------------------------------ sending ahead

    def _may_go_ahead(self, owed: int = 0) -> bool:
        """Whether :meth:`send` may open a transaction for the records since the last barrier: none of
        this sink's is open, unfinished or owed but ``owed``, and no staged checkpoint waits for its
        completion (its commit, from the staged copy, would abort that transaction). Call with the
        ahead lock: :meth:`stage` adds to the pending ones under it, so none appears meanwhile."""
        return (
            self.send_ahead
            and not self._ahead_paused
            and self._prepared is None
            and self._unfinished is None
            and not self._left_open
            and self.failure is None
            and self._owed == owed
            and not self._pending.by_id
        )

    def _go_ahead_after_commit(self) -> None:
        """On the committing thread, after a commit that was the last one owed: the records sent while it
        ran (each :meth:`send` found the producer taken) go ahead now, not at the next :meth:`send`,
        which may come after the next barrier (they would then wait for that checkpoint's commit,
        as Flink's would not: its next transaction begins at the snapshot)."""
        with self._ahead_lock:
            if len(self._buffer) and not self._sending_ahead and self._may_go_ahead(owed=1):
                self._go_ahead()

    def _go_ahead(self) -> None:
        """Open a transaction and produce into it every record sent since the last barrier; from then on
        :meth:`send` produces each record as it comes. Not while a commit holds the producer."""
        if not self._commit_lock.acquire(blocking=False):
            return
        began = False
        try:
            self._init_transactions()
            self._producer.begin_transaction()
            began = self._sending_ahead = True
            self._start_ahead_timer()
            self._produce_all(self._buffer.records)
        except KafkaException as exc:
            self._stop_ahead(exc, began)
        finally:
            self._commit_lock.release()

    def _start_ahead_timer(self) -> None:
        self._ahead_generation += 1
        timer = self._ahead_timer = threading.Timer(
            self._ahead_ttl, self._expire_ahead, args=(self._ahead_generation,)
        )
        timer.daemon = True
        timer.start()

    def _end_ahead(self) -> None:
        """No transaction sent ahead any more (with the ahead lock)."""
        self._sending_ahead, self._prepared = False, None
        if self._ahead_timer is not None:
            self._ahead_timer.cancel()
            self._ahead_timer = None

    def _expire_ahead(self, generation: int) -> None:
        """The transaction sent ahead has been open :data:`AHEAD_SHARE_OF_TRANSACTION_TIMEOUT` of
        ``transaction.timeout.ms`` (its checkpoint slow to come or to complete): abort it before the
        broker does, which would fence this producer for good. Its records go from the staged copy."""
        if not self._commit_lock.acquire(blocking=False):
            return  # a commit holds the producer: it ends this transaction
        try:
            with self._ahead_lock:
                if generation != self._ahead_generation or (
                    not self._sending_ahead and self._prepared is None
                ):
                    return
                log.warning(
                    "sink %s of %s/%s: a transaction sent ahead open %g s, aborted; its records go from "
                    "the staged copy",
                    self.uid,
                    self.job_id,
                    self.task_id,
                    self._ahead_ttl,
                )
                self._end_ahead()
                self._ahead_paused = True
                try:
                    self._abort_transaction()
                except KafkaException:
                    self._left_open = True
        finally:
            self._commit_lock.release()

    def _produce_ahead(
        self, topic: str, value: bytes | None, key: bytes | None, partition: int, headers: Headers
    ) -> None:
        try:
            self._produce(topic, value, key, partition, headers)
        except KafkaException as exc:
            self._stop_ahead(exc, True)

    def _prepare(self, staged: StagedOutput) -> None:
        """At the barrier (with the ahead lock): every record of ``staged`` in the transaction sent ahead
        flushed to the broker (Flink's pre-commit), so that its completion adds the marker and commits.
        (The marker goes in at the completion: an open transaction on the marker topic would hold up
        other tasks' recoveries, which read it ``read_committed``.)"""
        self._sending_ahead = False
        try:
            self._producer.flush(self.timeout)
        except KafkaException as exc:
            self._stop_ahead(exc, True)
            return
        self._prepared = staged.checkpoint_id

    def _stop_ahead(self, exc: KafkaException, began: bool) -> None:
        """Sending ahead failed: the next commit aborts what the transaction holds and sends the staged
        copy (the records are in the buffer until the barrier stages them); no transaction is opened
        ahead until a commit succeeds."""
        log.warning(
            "sink %s of %s/%s stops sending ahead (%s); its commit sends the staged copy",
            self.uid,
            self.job_id,
            self.task_id,
            exc,
        )
        self._end_ahead()
        self._ahead_paused = True
        if began:
            self._left_open = True

    def _take_prepared(self) -> int | None:
        """For a commit (with the commit lock): the checkpoint a transaction sent ahead holds, if any, no
        longer sent ahead. A transaction still sending ahead (a commit the app runs itself) is left
        for this commit to abort: its records are in the buffer, to be staged."""
        with self._ahead_lock:
            prepared, sending = self._prepared, self._sending_ahead
            self._end_ahead()
            if sending:
                self._left_open = True
            return prepared

    def _abort_ahead(self, timeout: float) -> None:
        """Abort the transaction sent ahead, if one is open (cancel, close): its records are staged
        for recovery or forgotten. Not while a commit still runs after ``timeout`` s: a recovery
        fences and aborts it then."""
        if not self._commit_lock.acquire(timeout=timeout):
            return
        try:
            with self._ahead_lock:
                if not self._sending_ahead and self._prepared is None:
                    return
                self._end_ahead()
                try:
                    self._abort_transaction()
                except KafkaException as exc:
                    log.warning(
                        "sink %s of %s/%s: abort failed (%s)", self.uid, self.job_id, self.task_id, exc
                    )
                    self._left_open = True
        finally:
            self._commit_lock.release()

    # ------------------------------------------------------------ the committing thread

    def _owe(self, commit: _Commit) -> None:
        """Hand ``commit`` to the committing thread (started on first use); call with the pending lock."""
        with self._settled:
            self._owed += 1
        if self._committer is None:
            self._committer = threading.Thread(
                target=self._run_commits, name=f"cutline-sink-{self.transactional_id}", daemon=True
            )
            self._committer.start()
        self._commits.put(commit)

    def _run_commits(self) -> None:
        while (commit := self._commits.get()) is not None:
            try:
                if self.failure is None:
                    self._commit(commit.outputs, commit.marker)
                    self._go_ahead_after_commit()
            except KafkaException as exc:
                self._after_failed_commit(commit, exc)
            except Exception as exc:  # the staged files could not be deleted, or the step failed
                log.exception("sink %s of %s/%s stops committing", self.uid, self.job_id, self.task_id)
                self.failure = exc
            finally:
                with self._settled:
                    self._owed -= 1
                    self._settled.notify_all()

    def _after_failed_commit(self, commit: _Commit, exc: KafkaException) -> None:
        """A fenced or fatal producer stops committing (a newer process resumed the task; its
        recovery commits). Any other failure (its transaction aborted) leaves ``commit``'s outputs
        pending, and those of the commits queued behind it, so that the next completion commits them
        all in order: a later marker never passes output not committed yet."""
        error: KafkaError = exc.args[0]
        if error.fatal() or error.code() == KafkaError._FENCED:
            log.error("sink %s of %s/%s stops committing: %s", self.uid, self.job_id, self.task_id, exc)
            self.failure = exc
            return
        log.warning(
            "sink %s of %s/%s: commit of %d failed (%s); it goes with the next completion",
            self.uid,
            self.job_id,
            self.task_id,
            commit.marker.checkpoint_id,
            exc,
        )
        self._abort_ahead(self.timeout)  # not left open to hold up read_committed readers meanwhile
        with self._pending_lock:
            owed = [commit]
            while not self._commits.empty():
                later = self._commits.get()
                if later is None:  # closing: keep the sentinel for the loop
                    self._commits.put(None)
                    break
                owed.append(later)
            for each in owed:
                self._pending.by_id.update((o.checkpoint_id, o) for o in each.outputs)
            with self._settled:
                self._owed -= len(owed) - 1

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise RuntimeError(
                f"sink {self.uid} of {self.job_id}/{self.task_id} stopped committing: {self.failure}; "
                "restart the task (its recovery commits what is completed)"
            ) from self.failure

    def commit_staged(self, completed: CheckpointCompleted, locations: Mapping[int, str]) -> tuple[int, ...]:
        """The journal completed ``completed``: commit the staged files of its attempt found in
        ``locations`` (the checkpoints' locations, by id) after the last marker and up to it, in one
        transaction (as :meth:`complete`, for a sink whose files another process staged); the ids
        committed."""
        done = 0 if self.marker is None else self.marker.checkpoint_id
        wanted = {k: where for k, where in locations.items() if done < k <= completed.checkpoint_id}
        found = {k: s for k, s in self._find_staged(wanted).items() if s.attempt == completed.attempt}
        ids = pending_through(found, completed.checkpoint_id)
        if ids:
            self._commit([found[k] for k in ids], Marker(completed.checkpoint_id, completed.attempt))
        return ids

    # ------------------------------------------------------------ stop and cancel

    def on_stop(self, status: JobStatus, drain: bool = False) -> None:
        """The participant's ``on_stop``: a stop savepoint's output is committed by its completion
        (``on_complete`` comes first; this waits for that commit); a cancel aborts what is pending
        (:meth:`abort`)."""
        if status is JobStatus.CANCELED:
            self.abort()
        else:
            self.wait_for_commits()

    def abort(self, locations: Mapping[int, str] | None = None) -> tuple[int, ...]:
        """Cancel: forget the records sent since the last barrier and delete, unsent, the files staged
        for checkpoints not completed (this process's, and those found in ``locations`` after the
        marker); the ids deleted. Nothing of theirs is in an open transaction. The completed
        checkpoints' commits are waited for first."""
        with self._ahead_lock:
            self._buffer.discard()
        self.wait_for_commits()
        self._abort_ahead(self.timeout)
        done = 0 if self.marker is None else self.marker.checkpoint_id
        found = self._find_staged({k: where for k, where in (locations or {}).items() if k > done})
        with self._pending_lock:
            pending = {**found, **self._pending.by_id}
            self._pending.by_id.clear()
        ids = tuple(sorted(pending))
        for checkpoint_id in ids:
            self._delete(pending[checkpoint_id])
        self.aborted.extend(ids)
        if ids:
            log.info(
                "sink %s of %s/%s: canceled, deleted staged %s", self.uid, self.job_id, self.task_id, ids
            )
        return ids

    # ------------------------------------------------------------ recovery

    def recover(
        self,
        restored: int | None = None,
        *,
        plan: Callable[..., RecoveryPlan] | None = None,
        tasks: Sequence[str] | None = None,
    ) -> Recovered:
        """Fence and abort what a dead producer of this task left open, then commit again the staged
        output of completed checkpoints after the marker (up to ``restored``, the checkpoint the job
        resumes from; None: every completed one) and delete the rest (:func:`recovery_plan`).

        ``tasks`` (every task of this attempt) makes it also recover, the same way and under their own
        transactional ids and markers, its share of the tasks that earlier attempts' checkpoints
        named and this attempt has not (:func:`orphans_for`): a rescale to fewer tasks loses nothing.
        """
        self._init_transactions()
        marker = self.marker = self.read_marker()
        triggers, completions, named = self._journal()
        found = self._find_staged(triggers)
        decide = plan or recovery_plan
        decided: RecoveryPlan = decide(
            marker, [Staged(s.checkpoint_id, s.attempt) for s in found.values()], completions, restored
        )
        sent = 0
        if decided.commit:
            outputs = [found[k] for k in decided.commit]
            last = found[decided.commit[-1]]
            self._commit(outputs, Marker(last.checkpoint_id, last.attempt))
            sent = sum(len(o.records) for o in outputs)
        for checkpoint_id in decided.delete:
            self._delete(found[checkpoint_id])
        log.info(
            "sink %s of %s/%s recovered: marker %s, committed again %s, deleted %s",
            self.uid,
            self.job_id,
            self.task_id,
            marker,
            decided.commit,
            decided.delete,
        )
        orphans = () if tasks is None else orphans_for(self.task_id, tasks, named)
        adopted = tuple((orphan, self._recover_orphan(orphan, restored, plan)) for orphan in orphans)
        return Recovered(marker, decided, sent, adopted)

    def _recover_orphan(
        self, orphan: str, restored: int | None, plan: Callable[..., RecoveryPlan] | None
    ) -> Recovered:
        """Recover task ``orphan`` of an earlier attempt as its own sink would: its transactional id
        fenced (what it left open aborted), its completed output committed with its marker."""
        sink = ExactlyOnceSink(self.bootstrap, self.job_id, orphan, self.topics, **self._options)
        try:
            recovered = sink.recover(restored, plan=plan)
        finally:
            sink.close()
        self.committed.extend(sink.committed)
        log.info("sink %s of %s/%s took over task %s", self.uid, self.job_id, self.task_id, orphan)
        return recovered

    def read_marker(self) -> Marker | None:
        """The last commit marker of this task (read_committed), or None."""
        key = marker_key(self.job_id, self.uid, self.task_id)
        extra = {"isolation.level": "read_committed", **self._consumer_extra}
        consumer = Consumer(consumer_config(self.bootstrap, extra=extra))
        marker: Marker | None = None
        try:
            partition = partition_for(key, partition_count(consumer, self.commits, self.timeout))
            for msg in read_to_end(consumer, self.commits, partition, self.timeout):
                if msg.key() == key and msg.value():
                    fields = json.loads(msg.value() or b"{}")
                    marker = Marker(int(fields["checkpoint"]), int(fields["attempt"]))
        finally:
            consumer.close()
        return marker

    def _journal(self) -> tuple[dict[int, str], list[Completion], set[str]]:
        """The job's checkpoint locations (by id), completions, and every task a trigger named, from
        the journal."""
        locations: dict[int, str] = {}
        completions: list[Completion] = []
        named: set[str] = set()
        kinds = {CheckpointTriggered.__name__, CheckpointCompleted.__name__}
        for found in read_job_partition(
            self.bootstrap,
            self.job_id,
            self.topics.checkpoints,
            claims_topic=self.topics.checkpoints,
            kinds=kinds,
            timeout=self.timeout,
        ):
            record = found.record
            if isinstance(record, CheckpointTriggered):
                locations.setdefault(record.checkpoint_id, record.location)
                named.update(record.tasks)
            elif isinstance(record, CheckpointCompleted):
                if record.location:
                    locations.setdefault(record.checkpoint_id, record.location)
                completions.append(Completion(record.checkpoint_id, record.attempt))
                named.update(record.handles)
        return locations, completions, named

    def _find_staged(self, locations: Mapping[int, str]) -> dict[int, StagedOutput]:
        return find_staged(locations, self.task_id, self.uid)

    # ------------------------------------------------------------ committing

    def _init_transactions(self) -> None:
        if self._initialised:
            return
        try:
            self._producer.init_transactions(self.timeout)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                raise ValueError(
                    f"sink {self.uid} of {self.job_id}/{self.task_id}: the broker refuses its "
                    "transaction.timeout.ms (above the broker's transaction.max.timeout.ms): lower it, "
                    "one commit is all it has to outlast"
                ) from exc
            raise
        self._initialised = True

    def _commit(self, outputs: Sequence[StagedOutput], marker: Marker) -> None:
        """One transaction: every record of ``outputs`` in order, then the marker; then the staged
        files go (never before the marker is committed). One at a time (``_commit_lock``)."""
        with self._commit_lock:
            self._commit_in_transaction(outputs, marker)

    def _commit_in_transaction(self, outputs: Sequence[StagedOutput], marker: Marker) -> None:
        self._init_transactions()
        self._at("committing", marker.checkpoint_id)
        if self._unfinished is not None:
            finished = self._finish_unfinished()
            if finished is not None:  # its outputs are committed: commit only what came after them
                outputs = [o for o in outputs if o.checkpoint_id > finished.checkpoint_id]
                if not outputs:
                    return
        prepared = self._take_prepared()
        if prepared is not None:
            if [o.checkpoint_id for o in outputs] == [prepared]:
                if self._commit_prepared(outputs, marker):
                    return
            else:  # it holds other output than this commit's: abort it, send the staged copies
                self._left_open = True
        if self._left_open:  # a failed commit's, or a transaction sent ahead: nothing of it was committed
            self._abort_transaction()
            self._left_open = False
        self._producer.begin_transaction()
        try:
            for output in outputs:
                self._produce_all(OutputColumns.of(output.records))
            self._produce_marker(marker)
            if self._step is not None:
                self._producer.flush(self.timeout)  # the records are at the broker, in the open transaction
                self._at("open", marker.checkpoint_id)
        except KafkaException as exc:
            self._abort_uncommitted(exc)
            raise
        try:
            self._producer.commit_transaction(self.timeout)
        except KafkaException as exc:
            self._abort_after(exc, _Commit(tuple(outputs), marker))
            raise
        self._committed(outputs, marker)

    def _abort_transaction(self) -> None:
        """Abort the open transaction once what was produced into it is delivered (bounded by the
        sink's timeout).

        librdkafka sends EndTxn(abort) once it has asked to add a partition, even one the
        coordinator refused because it was still ending the previous transaction
        (CONCURRENT_TRANSACTIONS, right after a commit); at the same producer epoch the coordinator
        then answers INVALID_TXN_STATE, which librdkafka makes fatal: the producer is fenced for good
        (confluentinc/librdkafka#4849; Java's producer sends no EndTxn until a partition was added).
        A delivered record's partition is in the transaction, so the abort is one the coordinator
        accepts."""
        self._producer.flush(self.timeout)
        self._producer.abort_transaction(self.timeout)

    def _produce_marker(self, marker: Marker) -> None:
        """The commit marker into the open transaction, after the records."""
        key = marker_key(self.job_id, self.uid, self.task_id)
        value = json.dumps({"checkpoint": marker.checkpoint_id, "attempt": marker.attempt}).encode()
        if self._commits_count is None:  # once per sink: a metadata round trip less in each commit
            self._commits_count = partition_count(self._producer, self.commits, self.timeout)
        self._produce(self.commits, value, key, partition_for(key, self._commits_count))

    def _commit_prepared(self, outputs: Sequence[StagedOutput], marker: Marker) -> bool:
        """Commit the transaction sent ahead, which holds ``outputs`` (one checkpoint's), with ``marker``.
        False when the broker says to abort it (it timed out, say): aborted, the caller sends the
        staged copy."""
        try:
            self._produce_marker(marker)
            self._at("open", marker.checkpoint_id)  # the records at the broker (flushed at the barrier)
        except KafkaException as exc:
            self._abort_uncommitted(exc)
            raise
        try:
            self._producer.commit_transaction(self.timeout)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.txn_requires_abort() and not error.fatal():
                log.warning(
                    "sink %s of %s/%s: the transaction sent ahead for %d was aborted (%s); sending the "
                    "staged copy",
                    self.uid,
                    self.job_id,
                    self.task_id,
                    marker.checkpoint_id,
                    exc,
                )
                self._abort_uncommitted(exc)
                if self._left_open:  # aborting failed too (the broker unreachable): the next commit
                    raise  # aborts it first and sends the staged copy
                return False
            self._abort_after(exc, _Commit(tuple(outputs), marker))
            raise
        self._committed(outputs, marker)
        return True

    def _committed(self, outputs: Sequence[StagedOutput], marker: Marker) -> None:
        self._ahead_paused = False
        self.marker = marker
        self.committed.extend(o.checkpoint_id for o in outputs)
        self._at("committed", marker.checkpoint_id)
        for output in outputs:
            self._delete(output)

    def _finish_unfinished(self) -> Marker | None:
        """Retry the ``commit_transaction`` that failed retriably (librdkafka's rule: retry it, never
        abort what may be committed): its marker once it is committed, None when the broker says to
        abort it (its outputs are still staged and go with this commit). Raises while it still fails."""
        unfinished = self._unfinished
        assert unfinished is not None
        try:
            self._producer.commit_transaction(self.timeout)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.retriable():
                raise
            self._unfinished = None
            if not error.txn_requires_abort():
                raise
            self._abort_transaction()
            return None
        self._unfinished = None
        self._committed(unfinished.outputs, unfinished.marker)
        return unfinished.marker

    def _produce_all(self, records: OutputColumns) -> None:
        """Produce ``records`` in order: ``produce`` bound once, in a loop of nothing else (a commit
        from the staged copy, a transaction opened ahead, :meth:`send_many`), the headers only where a
        record has any; a full local queue is waited for record by record (:meth:`_produce`)."""
        produce, headers = self._producer.produce, records.headers
        rows = zip(records.topics, records.values, records.keys, records.partitions, strict=True)
        if headers:
            for index, (topic, value, key, partition) in enumerate(rows):
                self._produce(topic, value, key, partition, headers.get(index, ()))
            return
        for topic, value, key, partition in rows:
            try:
                produce(topic, value, key, partition)
            except BufferError:  # the local queue is full: wait for it to drain
                self._produce(topic, value, key, partition)

    def _produce(
        self, topic: str, value: bytes | None, key: bytes | None, partition: int, headers: Headers = ()
    ) -> None:
        """Produce one record, waiting while the local queue is full: positional arguments (keywords
        cost the producer twice the time), ``headers`` only where there are any."""
        while True:
            try:
                if headers:
                    self._producer.produce(topic, value, key, partition, headers=list(headers))
                else:
                    self._producer.produce(topic, value, key, partition)
                return
            except BufferError:  # the local queue is full: let it drain
                self._producer.poll(0.05)

    def _abort_uncommitted(self, exc: KafkaException) -> None:
        """A failure before ``commit_transaction`` (the broker unreachable, say): nothing of the
        transaction is committed, so abort it, now or (if that fails too) at the next commit; left
        open, it would refuse every later ``begin_transaction``. A fenced or fatal producer aborts
        nothing: another process resumed the task, and its recovery commits."""
        error: KafkaError = exc.args[0]
        if error.fatal() or error.code() == KafkaError._FENCED:
            return
        try:
            self._abort_transaction()
        except KafkaException:
            self._left_open = True

    def _abort_after(self, exc: KafkaException, commit: _Commit) -> None:
        """After a failed ``commit_transaction``: abort where the broker says to; keep a retriable
        failure (a timeout: the outcome is unknown) for the next commit to finish
        (:meth:`_finish_unfinished`)."""
        error: KafkaError = exc.args[0]
        if error.txn_requires_abort():
            self._abort_transaction()
        elif error.retriable():
            self._unfinished = commit
        # a fenced or fatal producer: another process resumed the task; its recovery commits

    def _delete(self, output: StagedOutput) -> None:
        storage.delete(output.uri)
        directory = output.uri.rsplit("/", 1)[0]
        storage.remove_empty_directory(directory)

    def _at(self, step: str, checkpoint_id: int) -> None:
        if self._step is not None:
            self._step(step, checkpoint_id)

    def close(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` s (the sink's by default) for the commits handed to the committing
        thread, stop it, and deliver what is queued. Staged output not committed stays for the next
        recovery."""
        wait = self.timeout if timeout is None else timeout
        try:
            if self._committer is not None:
                self.wait_for_commits(wait)
        finally:
            if self._committer is not None:
                self._commits.put(None)
                self._committer.join(wait)
                self._committer = None
            self._abort_ahead(wait)
            self._producer.flush(wait)
