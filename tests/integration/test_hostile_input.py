"""Hostile and broken input on every edge of a real coordinator process (issue 12).

One ``cutline coordinator`` child process on the embedded broker, with one
savepoint root. A healthy job of two participants checkpoints every 300 ms
throughout; a second job, ``victim``, has checkpoint 1 pending and no
participant, so that hostile acks reach every check of an ack. Then a table of
hostile messages goes to every input topic (and to the internal ticks topic),
followed in the same batches by valid input. Each hostile message must end in
dead-letters with its reason (savepoint targets outside the roots: a journaled
``TriggerRejected``); the valid input is still decided; the healthy job keeps
completing checkpoints; and nothing outside the checkpoint location and the
savepoint root is created, changed or deleted.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from support import create_protocol_topics, eventually

from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.clients import producer_config
from events.kafka.log import read_journal_topic, read_to_end
from events.task.participant import JobDriver, Participant
from events.wire.codec import decode, encode
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointDeclined,
    CheckpointKind,
    CheckpointRequested,
    CheckpointTriggered,
    DeadLetter,
    JobStatus,
    JobStatusChanged,
    JournalEvent,
    Record,
    SchedulerStarted,
    StateHandle,
    TriggerRejected,
)
from events.wire.topics import Topics

HEALTHY = "healthy"
VICTIM = "victim"


@dataclass
class Tree:
    """The directories of the test: checkpoints, a savepoint root, and a file outside both."""

    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def savepoints(self) -> Path:
        return self.root / "savepoints"

    @property
    def secret(self) -> Path:
        return self.root / "outside" / "secret"

    def location(self) -> str:
        return self.checkpoints.as_uri()

    def snapshot(self) -> dict[str, str]:
        """Every path outside the checkpoint location and the savepoint root, with what it holds. Those
        two are not walked: the healthy job's retention deletes its old checkpoints meanwhile (a
        walk into them listed a directory that was gone by the time it read it)."""
        found = {}
        for path in sorted(self._outside()):
            if path.is_symlink():
                found[str(path)] = f"link to {path.readlink()}"
            elif path.is_file():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[str(path)] = "directory"
        return found

    def _outside(self) -> Iterator[Path]:
        for directory, subdirectories, files in os.walk(self.root):  # symbolic links not followed
            here = Path(directory)
            subdirectories[:] = [
                d for d in subdirectories if here / d not in (self.checkpoints, self.savepoints)
            ]
            yield from (here / name for name in (*subdirectories, *files))


@dataclass
class Sent:
    """What was produced, by position, with the dead-letter reason each message must get."""

    expected: dict[tuple[str, int, int], str] = field(default_factory=dict)
    names: dict[tuple[str, int, int], str] = field(default_factory=dict)


@pytest.fixture(name="topics")
def _topics(bootstrap: str, topic_prefix: str) -> Topics:
    topics = Topics(topic_prefix)
    create_protocol_topics(bootstrap, topics.prefix)
    return topics


@pytest.fixture(name="tree")
def _tree(tmp_path: Path) -> Tree:
    tree = Tree(tmp_path)
    tree.checkpoints.mkdir()
    tree.savepoints.mkdir()
    tree.secret.parent.mkdir()
    tree.secret.write_text("do not touch")
    victim_dir = tree.checkpoints / VICTIM / "chk-1"
    victim_dir.mkdir(parents=True)
    (victim_dir / "v0-link").symlink_to(tree.secret)
    (victim_dir / "v0").write_bytes(b"victim state")
    (tree.savepoints / "evil").symlink_to(tree.secret.parent)
    return tree


@pytest.fixture(name="coordinator")
def _coordinator(bootstrap: str, topics: Topics, tree: Tree) -> Iterator[CoordinatorProcess]:
    process = CoordinatorProcess(
        bootstrap, topics.prefix, extra_args=("--savepoint-root", str(tree.savepoints))
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture(name="healthy")
def _healthy(bootstrap: str, topics: Topics, tree: Tree) -> Iterator[JobDriver]:
    driver = JobDriver(bootstrap, HEALTHY, topics)
    counts = {"task-0": 0, "task-1": 0}
    participants = []
    for task in counts:

        def snapshot(barrier: CheckpointBarrier, task: str = task) -> bytes:
            counts[task] += 10
            return str(counts[task]).encode()

        def offsets(task: str = task) -> dict[str, int]:
            return {f"words:{task[-1]}": counts[task]}

        participant = Participant(bootstrap, HEALTHY, task, 1, topics, snapshot, offsets)
        participant.run_in_thread()
        participants.append(participant)
    config = CheckpointConfig(
        interval_ms=300, location=tree.location(), timeout_ms=20_000, tolerable_failures=100
    )
    driver.running(tuple(counts), config, attempt=1)
    yield driver
    for participant in participants:
        participant.close()
    driver.close()


def journal(bootstrap: str, topics: Topics) -> list[JournalEvent]:
    return [event for event, _ in read_journal_topic(bootstrap, topics.checkpoints, lambda m, p: None)]


def wait_for(
    bootstrap: str, topics: Topics, predicate: Callable[[list[JournalEvent]], bool], timeout: float = 45.0
) -> list[JournalEvent]:

    def matches(events: list[JournalEvent]) -> bool:
        assert predicate(events), f"last events: {[type(e).__name__ for e in events][-15:]}"
        return True

    return eventually(lambda: journal(bootstrap, topics), matches, timeout=timeout, interval=0.2)


def completed(events: list[JournalEvent], job: str) -> list[CheckpointCompleted]:
    return [e for e in events if isinstance(e, CheckpointCompleted) and e.job_id == job]


def frame(record: Record) -> bytes:
    return encode(record)


def names(n: int) -> Iterator[str]:
    """``n`` distinct short names (three letters or digits)."""
    return (
        "".join(p)
        for p in itertools.islice(itertools.product(string.ascii_letters + string.digits, repeat=3), n)
    )


def hostile_table(tree: Tree) -> list[tuple[str, str, bytes | None, bytes | None, str]]:
    """(name, topic attribute, key, value, dead-letter reason) of every hostile message."""
    chk = f"{tree.location()}/{VICTIM}/chk-1"
    path = chk.removeprefix("file://")
    victim = VICTIM.encode()

    def ack(uri: str | None = None, checkpoint_id: int = 1, **fields: object) -> bytes:
        state = StateHandle(uri, 1, "0" * 64) if uri is not None else None
        values: dict[str, object] = {"state": state, **fields}
        return frame(CheckpointAcknowledged(VICTIM, checkpoint_id, 1, "v0", 0, **values))  # type: ignore[arg-type]

    def decline(checkpoint_id: int) -> bytes:
        return frame(CheckpointDeclined(VICTIM, checkpoint_id, 1, "v0", 0, "TASK_CHECKPOINT_FAILURE", "x"))

    def status(job: str, **fields: object) -> bytes:
        values: dict[str, object] = {
            "tasks": ("a",),
            "config": CheckpointConfig(0, tree.location()),
            **fields,
        }
        return frame(JobStatusChanged(job, JobStatus.RUNNING, 0, **{"attempt": 1, **values}))  # type: ignore[arg-type]

    valid_ack = ack(f"{chk}/v0")
    request = frame(CheckpointRequested(HEALTHY, CheckpointKind.CHECKPOINT, 0, "r-null-key"))
    unknown_fingerprint = b"\xc3\x01" + b"\xee" * 8 + valid_ack[10:]
    table: list[tuple[str, str, bytes | None, bytes | None, str]] = [
        ("state file://[x", "acks", victim, ack("file://[x"), "STATE_OUTSIDE_LOCATION"),
        (
            "state %2e%2e",
            "acks",
            victim,
            ack(f"{chk}/%2e%2e/%2e%2e/%2e%2e/outside/secret"),
            "STATE_OUTSIDE_LOCATION",
        ),
        ("state %252e", "acks", victim, ack(f"{chk}/%252e%252e/x"), "STATE_OUTSIDE_LOCATION"),
        ("state ..", "acks", victim, ack(f"{chk}/../../../outside/secret"), "STATE_OUTSIDE_LOCATION"),
        ("state symlink", "acks", victim, ack(f"{chk}/v0-link"), "STATE_OUTSIDE_LOCATION"),
        ("state FILE:", "acks", victim, ack(f"FILE://{path}/v0"), "STATE_OUTSIDE_LOCATION"),
        ("state file:/", "acks", victim, ack(f"file:{path}/v0"), "STATE_OUTSIDE_LOCATION"),
        ("state file://host", "acks", victim, ack(f"file://host{path}/v0"), "STATE_OUTSIDE_LOCATION"),
        ("state s3", "acks", victim, ack(f"s3://bucket{path}/v0"), "STATE_OUTSIDE_LOCATION"),
        (
            "negative size",
            "acks",
            victim,
            ack(f"{chk}/v0", state=StateHandle(f"{chk}/v0", -1, "")),
            "INVALID_STATE_HANDLE",
        ),
        (
            "inline state the checkpoint does not allow",
            "acks",
            victim,
            ack(state=StateHandle(f"{chk}/v0", 3, hashlib.sha256(b"abc").hexdigest(), b"abc")),
            "INVALID_STATE_HANDLE",
        ),
        ("offsets t:²", "acks", victim, ack(offsets={"t:²": 1}), "INVALID_OFFSETS"),
        ("offsets t:-1", "acks", victim, ack(offsets={"t:-1": 1}), "INVALID_OFFSETS"),
        (
            "100,001 offsets",
            "acks",
            victim,
            ack(offsets={f"{n}:0": 0 for n in names(100_001)}),
            "INVALID_OFFSETS",
        ),
        ("negative ack id", "acks", victim, ack(checkpoint_id=-5), "INVALID_ID"),
        ("huge ack id", "acks", victim, ack(checkpoint_id=2**63 - 1), "INVALID_ID"),
        ("unknown fingerprint", "acks", victim, unknown_fingerprint, "UNKNOWN_SCHEMA"),
        ("truncated header", "acks", victim, valid_ack[:6], "TRUNCATED_FRAME"),
        ("truncated body", "acks", victim, valid_ack[:20], "BODY_MISMATCH"),
        ("not avro", "acks", victim, b"hello, coordinator", "BAD_MAGIC"),
        ("ack without key", "acks", None, valid_ack, "MISSING_KEY"),
        ("ack under another key", "acks", b"healthy", valid_ack, "KEY_MISMATCH"),
        ("decline on acks", "acks", victim, decline(1), "WRONG_TOPIC"),
        ("ack tombstone", "acks", victim, None, "EMPTY_MESSAGE"),
        ("negative decline id", "declines", victim, decline(-1), "INVALID_ID"),
        ("huge decline id", "declines", victim, decline(2**62 + 1), "INVALID_ID"),
        ("decline without key", "declines", None, decline(1), "MISSING_KEY"),
        ("ack on declines", "declines", victim, valid_ack, "WRONG_TOPIC"),
        ("decline garbage", "declines", victim, b"\x00\x01\x02", "BAD_MAGIC"),
        ("decline tombstone", "declines", victim, None, "EMPTY_MESSAGE"),
        ("job id ..", "job_status", b"..", status(".."), "INVALID_CONFIG"),
        ("job id a/b", "job_status", b"a/b", status("a/b"), "INVALID_CONFIG"),
        ("job id %2e%2e", "job_status", b"%2e%2e", status("%2e%2e"), "INVALID_CONFIG"),
        (
            "location with ..",
            "job_status",
            b"bad-location",
            status("bad-location", config=CheckpointConfig(0, f"{tree.location()}/../outside")),
            "INVALID_CONFIG",
        ),
        (
            "location FILE:",
            "job_status",
            b"bad-scheme",
            status("bad-scheme", config=CheckpointConfig(0, tree.location().replace("file:", "FILE:"))),
            "INVALID_CONFIG",
        ),
        ("100,001 tasks", "job_status", b"big", status("big", tasks=tuple(names(100_001))), "INVALID_CONFIG"),
        (
            "huge restored id",
            "job_status",
            b"restored",
            status("restored", restored_checkpoint_id=2**63 - 1),
            "INVALID_CONFIG",
        ),
        (
            "huge interval",
            "job_status",
            b"slow",
            status("slow", config=CheckpointConfig(2**62, tree.location())),
            "INVALID_CONFIG",
        ),
        ("negative attempt", "job_status", victim, status(VICTIM, attempt=-1), "INVALID_STATUS"),
        ("status without key", "job_status", None, status("keyless"), "MISSING_KEY"),
        ("status garbage", "job_status", victim, b"\xc3\x01\x00", "TRUNCATED_FRAME"),
        ("status tombstone", "job_status", victim, None, "EMPTY_MESSAGE"),
        ("request without key", "requests", None, request, "MISSING_KEY"),
        (
            "request of nobody",
            "requests",
            b"nobody",
            frame(CheckpointRequested("nobody", CheckpointKind.CHECKPOINT, 0, "r")),
            "UNKNOWN_JOB",
        ),
        ("ack on requests", "requests", victim, valid_ack, "WRONG_TOPIC"),
        ("request garbage", "requests", victim, b'{"job_id": "victim"}', "BAD_MAGIC"),
        ("request tombstone", "requests", victim, None, "EMPTY_MESSAGE"),
        (
            "savepoint into a link out of the root",
            "requests",
            b"healthy",
            frame(
                CheckpointRequested(
                    HEALTHY, CheckpointKind.SAVEPOINT, 0, "sp-link", (tree.savepoints / "evil").as_uri()
                )
            ),
            "SAVEPOINT_TARGET_NOT_ALLOWED",
        ),
    ]
    return table


def produce(
    producer: Producer,
    sent: Sent,
    name: str,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    reason: str | None,
) -> None:
    def delivered(error: KafkaError | None, message: Message) -> None:
        assert error is None, f"{name}: {error}"
        position = (message.topic(), message.partition(), message.offset())
        sent.names[position] = name
        if reason is not None:
            sent.expected[position] = reason

    producer.produce(topic, key=key, value=value, on_delivery=delivered)
    producer.poll(0)


@pytest.mark.slow
def test_hostile_input_on_every_edge(
    bootstrap: str, topics: Topics, tree: Tree, coordinator: CoordinatorProcess, healthy: JobDriver
) -> None:
    """Every hostile message ends in dead-letters with its reason (or a journaled TriggerRejected),
    valid input in the same batches is decided, the healthy job keeps completing checkpoints, and
    nothing outside the checkpoint location and the savepoint root changes."""
    wait_for(bootstrap, topics, lambda j: len(completed(j, HEALTHY)) >= 1)
    victim = JobDriver(bootstrap, VICTIM, topics)
    victim.running(
        ("v0",), CheckpointConfig(interval_ms=0, location=tree.location(), timeout_ms=120_000), attempt=1
    )
    # job-status and requests are separate agents: the request must not overtake the RUNNING.
    wait_for(
        bootstrap, topics, lambda j: any(isinstance(e, SchedulerStarted) and e.job_id == VICTIM for e in j)
    )
    victim.request(CheckpointRequested(VICTIM, CheckpointKind.CHECKPOINT, 0, "victim-1"))
    wait_for(
        bootstrap, topics, lambda j: any(isinstance(e, CheckpointTriggered) and e.job_id == VICTIM for e in j)
    )
    before = tree.snapshot()
    seen = len(completed(journal(bootstrap, topics), HEALTHY))
    producer = Producer(producer_config(bootstrap, {"message.max.bytes": 2_000_000}))
    sent = Sent()

    for name, attr, key, value, reason in hostile_table(tree):
        produce(producer, sent, name, getattr(topics, attr), key, value, reason)
    ticks = topics.ticks
    produce(producer, sent, "tick without key", ticks, None, b"0", None)
    produce(producer, sent, "tick with a key that is not UTF-8", ticks, b"\xff\xfe", b"0", None)
    outside = tree.secret.parent.as_uri()
    for request_id, target in [
        ("sp-outside", outside),
        ("sp-dotdot", f"{tree.savepoints.as_uri()}/../outside"),
        ("sp-encoded", f"{tree.savepoints.as_uri()}/%2e%2e/outside"),
        ("sp-allowed", f"{tree.savepoints.as_uri()}/sp"),
    ]:
        request = CheckpointRequested(HEALTHY, CheckpointKind.SAVEPOINT, 0, request_id, target)
        produce(producer, sent, request_id, topics.requests, HEALTHY.encode(), encode(request), None)
    # Valid input right behind the hostile input, in the same batches: the victim's last ack.
    chk = f"{tree.location()}/{VICTIM}/chk-1"
    valid = CheckpointAcknowledged(
        VICTIM, 1, 1, "v0", 0, StateHandle(f"{chk}/v0", 12, "0" * 64), {"words:9": 5}
    )
    produce(producer, sent, "valid victim ack", topics.acks, VICTIM.encode(), encode(valid), None)
    assert 0 == producer.flush(30)

    events = wait_for(
        bootstrap,
        topics,
        lambda j: (
            len(completed(j, HEALTHY)) >= seen + 3
            and any(c.checkpoint_id == 1 for c in completed(j, VICTIM))
            and any(
                isinstance(e, CheckpointCompleted) and e.location.startswith(tree.savepoints.as_uri())
                for e in j
            )
        ),
    )

    def each_dead_letter() -> dict[tuple[str, int, int], DeadLetter]:
        letters = {
            (letter.topic, letter.partition, letter.offset): letter
            for message in read_to_end(bootstrap, topics.dead_letters)
            if message.value and isinstance(letter := decode(message.value), DeadLetter)
        }
        missing = {sent.names[p]: r for p, r in sent.expected.items() if p not in letters}
        assert {} == missing, "no dead letter for these"
        return letters

    letters = eventually(
        each_dead_letter, timeout=30, interval=0.3, what="a dead letter of each hostile record"
    )
    wrong = {
        sent.names[p]: (r, letters[p].reason, letters[p].message)
        for p, r in sent.expected.items()
        if letters[p].reason != r
    }
    assert {} == wrong
    assert [] == [letter.message for letter in letters.values() if letter.reason == "INTERNAL_ERROR"]
    rejected = {e.request_id: e for e in events if isinstance(e, TriggerRejected) and e.job_id == HEALTHY}
    for request_id in ("sp-outside", "sp-dotdot", "sp-encoded"):
        assert "SAVEPOINT_TARGET_NOT_ALLOWED" == rejected[request_id].reason, request_id
    assert "--savepoint-root" in rejected["sp-outside"].message
    assert {"sp-link", "sp-allowed"}.isdisjoint(rejected)
    victim_done = next(c for c in completed(events, VICTIM) if c.checkpoint_id == 1)
    assert ({"words:9": 5}, f"{chk}/v0") == (dict(victim_done.offsets), victim_done.handles["v0"].uri)
    assert coordinator.pid is not None and "Traceback" not in coordinator.tail(10_000)
    assert before == tree.snapshot()
    assert "do not touch" == tree.secret.read_text()
    assert ["evil", "sp"] == sorted(p.name for p in tree.savepoints.iterdir())
    victim.close()
