"""Exactly-once output to Kafka, committed with the checkpoint (docs/exactly-once.md).

A participant's :class:`ExactlyOnceSink` keeps the records the app sends between two barriers in
memory (bounded), writes them at the barrier into the checkpoint's location beside the task's
snapshot (``<location>/<task>.out``, before the participant acks, so the checkpoint covers them),
and sends them when the journal completes the checkpoint: in one Kafka transaction with a
**commit marker** (key ``job/uid/task``, value the checkpoint id and attempt) to the marker topic
``<prefix>sink-commits``. "Committed" is recorded atomically with the output.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
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
    "staged_name",
    "transaction_timeout_problem",
    "transactional_id",
]

log = logging.getLogger(__name__)

STAGED_FORMAT = "cutline-staged-output"
STAGED_VERSION = 1
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
"""librdkafka's default ``transaction.timeout.ms``."""
DEFAULT_MAX_BUFFERED_BYTES = 64 * 1024 * 1024
"""The most a sink keeps between two barriers (keys, values and headers): past it ``send`` refuses."""

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

    A transaction of this sink begins after the journal completed its checkpoint and ends with that
    commit: it never spans a checkpoint interval or a checkpoint's duration (Flink's pitfall), only
    one commit, which the sink gives ``commit_timeout_ms``. A broker that aborted it sooner would
    make every large commit fail."""
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


def staged_name(task_id: str) -> str:
    """The staged file's name in a checkpoint's location: ``<task>.out``."""
    return quote(task_id, safe=":@=+,") + ".out"


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


@dataclass(frozen=True)
class StagedOutput:
    """What a task staged at a barrier: its records, and where and with which digest they are.
    The app may keep ``uri`` and ``sha256`` in its snapshot; recovery checks each file against the
    sha256 of its own header (:func:`decode_staged`), not yet against a snapshot's."""

    job_id: str
    uid: str
    task_id: str
    checkpoint_id: int
    attempt: int
    records: tuple[OutputRecord, ...]
    uri: str = ""
    sha256: str = ""


class StagedOutputCorrupted(ValueError):
    """A staged file does not hold what its header (or the snapshot) says."""


class BufferFull(RuntimeError):
    """The records sent since the last barrier would exceed the sink's ``max_buffered_bytes``."""


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text, validate=True)


@functools.lru_cache(maxsize=1024)
def _json_string(text: str) -> str:
    return json.dumps(text)


def _b64_json(data: bytes | None) -> str:
    """``data`` as a JSON value: base64 needs no escaping."""
    return "null" if data is None else '"' + base64.b64encode(data).decode("ascii") + '"'


def _record_line(record: OutputRecord) -> str:
    """``{"topic":…,"partition":…,"key":…,"value":…,"headers":[[k,v],…]}``, compact: the JSON
    ``json.dumps`` writes, put together by hand (2.5× as fast; every record is staged once)."""
    headers = [[k, _b64(v)] for k, v in record.headers]
    partition = "null" if record.partition is None else str(int(record.partition))
    return (
        f'{{"topic":{_json_string(record.topic)},"partition":{partition},"key":{_b64_json(record.key)},'
        f'"value":{_b64_json(record.value)},"headers":{json.dumps(headers, separators=(",", ":"))}}}'
    )


def _record_of(line: str) -> OutputRecord:
    fields = json.loads(line)
    headers = tuple((str(k), _unb64(v) or b"") for k, v in fields.get("headers", []))
    return OutputRecord(
        fields["topic"], _unb64(fields["value"]), _unb64(fields["key"]), fields["partition"], headers
    )


def encode_staged(output: StagedOutput) -> bytes:
    """JSON lines: a header (format, who, which checkpoint, how many records, the sha256 of the
    lines after it), then one line per record with base64 bytes."""
    body = "".join(_record_line(r) + "\n" for r in output.records).encode()
    header = {
        "format": STAGED_FORMAT,
        "version": STAGED_VERSION,
        "job": output.job_id,
        "uid": output.uid,
        "task": output.task_id,
        "checkpoint": output.checkpoint_id,
        "attempt": output.attempt,
        "records": len(output.records),
        "sha256": hashlib.sha256(body).hexdigest(),
    }
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + body


def decode_staged(data: bytes, uri: str = "") -> StagedOutput:
    """The staged output in ``data``, checked against its header; :class:`StagedOutputCorrupted`
    says what is wrong."""
    first, _, body = data.partition(b"\n")
    try:
        header = json.loads(first)
        if header.get("format") != STAGED_FORMAT or header.get("version") != STAGED_VERSION:
            raise StagedOutputCorrupted(f"{uri} is not a staged output of version {STAGED_VERSION}")
        if hashlib.sha256(body).hexdigest() != header["sha256"]:
            raise StagedOutputCorrupted(f"{uri}: its records do not match the sha256 of its header")
        records = tuple(_record_of(line) for line in body.decode().splitlines())
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, StagedOutputCorrupted):
            raise
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
        hashlib.sha256(data).hexdigest(),
    )


class OutputBuffer:
    """The records a task sends between two barriers, bounded, and their staging at the barrier.

    No Kafka client: it pickles (a Spark sink's ``foreachBatch`` half runs where Spark runs it)."""

    def __init__(self, job_id: str, uid: str, task_id: str, max_buffered_bytes: int) -> None:
        self.job_id, self.uid, self.task_id = job_id, uid, task_id
        self.max_buffered_bytes = max_buffered_bytes
        self.records: list[OutputRecord] = []
        self.size = 0

    def add(self, record: OutputRecord) -> None:
        """Keep ``record`` until the next barrier; :class:`BufferFull` past the bound."""
        if self.size + record.size > self.max_buffered_bytes:
            raise BufferFull(
                f"sink {self.uid} of task {self.task_id}: {self.size + record.size} bytes "
                f"sent since the last barrier, more than max_buffered_bytes={self.max_buffered_bytes}: "
                "checkpoint more often or raise the bound"
            )
        self.records.append(record)
        self.size += record.size

    def stage(self, barrier: CheckpointBarrier) -> StagedOutput:
        """Write the buffered records to ``<location>/<task>.out``, atomically and durably, and
        start an empty buffer."""
        output = StagedOutput(
            self.job_id, self.uid, self.task_id, barrier.checkpoint_id, barrier.attempt, tuple(self.records)
        )
        uri = storage.join(barrier.location, staged_name(self.task_id))
        data = encode_staged(output)
        storage.write_bytes(uri, data)
        self.discard()
        return dataclasses.replace(output, uri=uri, sha256=hashlib.sha256(data).hexdigest())

    def discard(self) -> None:
        """Forget the buffered records."""
        self.records, self.size = [], 0


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


class ExactlyOnceSink:
    """A participant's transactional Kafka output (see the module docstring and docs/exactly-once.md).

    The app calls :meth:`send` for each output record, :meth:`stage` from its ``snapshot`` callback
    (before the participant acks), :meth:`complete` from ``on_complete``, and :meth:`recover` once
    at start, before it sends anything (with the checkpoint it restored, if any).
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
        config = producer_config(
            bootstrap,
            {
                "enable.idempotence": True,
                "transactional.id": self.transactional_id,
                **(producer_extra or {}),
            },
        )
        problem = transaction_timeout_problem(
            int(config.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)), int(timeout * 1000)
        )
        if problem is not None:
            raise ValueError(f"sink {uid} of {job_id}/{task_id}: {problem}")
        create_commits_topic(bootstrap, topics, commits_partitions)
        self._producer = Producer(config)
        self._initialised = False
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
        """Keep one output record until the next barrier; :class:`BufferFull` past the bound."""
        self._buffer.add(OutputRecord(topic, value, key, partition, tuple(headers)))

    @property
    def buffered(self) -> int:
        """Records sent since the last barrier."""
        return len(self._buffer.records)

    def stage(self, barrier: CheckpointBarrier) -> StagedOutput:
        """Write the records sent since the last barrier to ``<location>/<task>.out``, atomically and
        durably; call it from the participant's ``snapshot``, so the ack covers them."""
        staged = self._buffer.stage(barrier)
        self._pending.by_id[barrier.checkpoint_id] = staged
        self._at("staged", barrier.checkpoint_id)
        return staged

    def complete(self, completed: CheckpointCompleted) -> None:
        """The journal completed ``completed``: commit every staged checkpoint up to it (call it from
        the participant's ``on_complete``). Another attempt's completion commits nothing here."""
        mine = {k: s for k, s in self._pending.by_id.items() if s.attempt == completed.attempt}
        ids = pending_through(mine, completed.checkpoint_id)
        if not ids:
            return
        self._commit([mine[k] for k in ids], Marker(completed.checkpoint_id, completed.attempt))
        for checkpoint_id in ids:
            del self._pending.by_id[checkpoint_id]

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
        """The participant's ``on_stop``: a stop savepoint's output was committed by its completion
        (``on_complete`` comes first); a cancel aborts what is pending (:meth:`abort`)."""
        if status is JobStatus.CANCELED:
            self.abort()

    def abort(self, locations: Mapping[int, str] | None = None) -> tuple[int, ...]:
        """Cancel: forget the records sent since the last barrier and delete, unsent, the files staged
        for checkpoints not completed (this process's, and those found in ``locations`` after the
        marker); the ids deleted. Nothing of theirs is in an open transaction."""
        self._buffer.discard()
        done = 0 if self.marker is None else self.marker.checkpoint_id
        found = self._find_staged({k: where for k, where in (locations or {}).items() if k > done})
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
        """This task's staged files in the journal's checkpoint locations, checked."""
        found: dict[int, StagedOutput] = {}
        for checkpoint_id, location in sorted(locations.items()):
            uri = storage.join(location, staged_name(self.task_id))
            try:
                data = storage.read_bytes(uri)
            except FileNotFoundError:
                continue
            output = decode_staged(data, uri)
            if output.checkpoint_id != checkpoint_id or output.task_id != self.task_id:
                raise StagedOutputCorrupted(
                    f"{uri} holds checkpoint {output.checkpoint_id} of task {output.task_id}, "
                    f"not {checkpoint_id} of {self.task_id}"
                )
            found[checkpoint_id] = output
        return found

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
        files go (never before the marker is committed)."""
        self._init_transactions()
        self._at("committing", marker.checkpoint_id)
        self._producer.begin_transaction()
        try:
            for output in outputs:
                for record in output.records:
                    self._produce(record)
            key = marker_key(self.job_id, self.uid, self.task_id)
            value = json.dumps({"checkpoint": marker.checkpoint_id, "attempt": marker.attempt}).encode()
            count = partition_count(self._producer, self.commits, self.timeout)
            self._producer.produce(self.commits, value, key, partition=partition_for(key, count))
            if self._step is not None:
                self._producer.flush(self.timeout)  # the records are at the broker, in the open transaction
                self._at("open", marker.checkpoint_id)
            self._producer.commit_transaction(self.timeout)
        except KafkaException as exc:
            self._abort_after(exc)
            raise
        self.marker = marker
        self.committed.extend(o.checkpoint_id for o in outputs)
        self._at("committed", marker.checkpoint_id)
        for output in outputs:
            self._delete(output)

    def _produce(self, record: OutputRecord) -> None:
        kwargs: dict[str, Any] = {"key": record.key, "headers": list(record.headers) or None}
        if record.partition is not None:
            kwargs["partition"] = record.partition
        while True:
            try:
                self._producer.produce(record.topic, record.value, **kwargs)
                return
            except BufferError:  # the local queue is full: let it drain
                self._producer.poll(0.1)

    def _abort_after(self, exc: KafkaException) -> None:
        error: KafkaError = exc.args[0]
        if error.txn_requires_abort():
            self._producer.abort_transaction(self.timeout)
        # a fenced or fatal producer: another process resumed the task; its recovery commits

    def _delete(self, output: StagedOutput) -> None:
        storage.delete(output.uri)
        directory = output.uri.rsplit("/", 1)[0]
        storage.remove_empty_directory(directory)

    def _at(self, step: str, checkpoint_id: int) -> None:
        if self._step is not None:
            self._step(step, checkpoint_id)

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued. Staged output not committed stays for the next recovery."""
        self._producer.flush(timeout)
