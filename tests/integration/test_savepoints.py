"""``cutline savepoints list / show / dispose`` against a journal topic on the broker.

The journal is decided by the coordinator's runtime (the same code the service runs) from
plain inputs and written to the journal topic as the service would; the ``_metadata`` files
are what a Spark job's driver writes on completion. The commands run as real processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer
from support import TEST_PARTITIONS

from coordinator.service.runtime import Coordinator, Outcome
from events.dev.broker import create_topics
from events.kafka.clients import producer_config
from events.task.manifest import Manifest, Piece, StepIdentity
from events.task.participant import METADATA_FILE, local_path
from events.wire.codec import encode
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointKind,
    CheckpointRequested,
    CheckpointTriggered,
    JobStatus,
    JobStatusChanged,
    JournalEvent,
    Record,
    StateHandle,
)
from events.wire.topics import Topics

JOB = "orders"
RESTORED_JOB = "orders-v2"


def cutline(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "CUTLINE_BOOTSTRAP"}
    environment["COLUMNS"] = "250"
    return subprocess.run(
        [sys.executable, "-m", "coordinator.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )


class Journal:
    """Inputs decided by the runtime; ``publish`` writes the journal to the topic."""

    def __init__(self, topics: Topics, savepoint_root: Path) -> None:
        self.topics = topics
        self.runtime = Coordinator(topics, rng=random.Random(7), savepoint_roots=(savepoint_root.as_uri(),))
        self.messages: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = []
        self.offset = 0

    def handle(self, topic: str, job: str, record: Record, now: int) -> list[JournalEvent]:
        self.offset += 1
        outcome = self.runtime.handle(topic, 0, self.offset, job.encode(), encode(record), now)
        assert outcome.rejected is None and all(m.topic != self.topics.dead_letters for m in outcome.messages)
        self.keep(outcome)
        return list(outcome.journal)

    def keep(self, outcome: Outcome) -> None:
        for message in outcome.messages:
            if message.topic == self.topics.checkpoints:
                self.messages.append((message.key, message.value, list(message.headers)))

    def checkpoint(
        self,
        job: str,
        now: int,
        target: str | None = None,
        task: str = "task-0",
        state: Callable[[str], bytes] | None = None,
    ) -> CheckpointCompleted:
        """Trigger (a savepoint into ``target``, else a checkpoint), write the one task's state file
        (``state`` of the checkpoint's location, default its own URI), ack it; returns the completion."""
        kind = CheckpointKind.SAVEPOINT if target else CheckpointKind.CHECKPOINT
        request = CheckpointRequested(job, kind, now, request_id=f"r{now}", target=target)
        [triggered] = [
            e
            for e in self.handle(self.topics.requests, job, request, now)
            if isinstance(e, CheckpointTriggered)
        ]
        path = local_path(f"{triggered.location}/{task}")
        path.parent.mkdir(parents=True, exist_ok=True)
        state_bytes = f"{triggered.location}/{task}".encode() if state is None else state(triggered.location)
        path.write_bytes(state_bytes)
        ack = CheckpointAcknowledged(
            job, triggered.checkpoint_id, triggered.attempt, task, now + 5,
            state=StateHandle(
                f"{triggered.location}/{task}", len(state_bytes), hashlib.sha256(state_bytes).hexdigest()
            ),
            offsets={"orders-in:0": now},
        )  # fmt: skip
        [completed] = [
            e for e in self.handle(self.topics.acks, job, ack, now + 5) if isinstance(e, CheckpointCompleted)
        ]
        (path.parent / METADATA_FILE).write_bytes(encode(completed))  # as the Spark driver does
        return completed

    def publish(self, bootstrap: str) -> None:
        producer = Producer(producer_config(bootstrap))
        for key, value, headers in self.messages:
            producer.produce(self.topics.checkpoints, key=key, value=value, headers=headers)
        assert 0 == producer.flush(10)


@dataclass(frozen=True)
class Setup:
    args: tuple[str, ...]
    """--bootstrap and --topic-prefix of the journal."""
    root: Path
    """The savepoint root."""
    savepoint: CheckpointCompleted
    checkpoint: CheckpointCompleted
    kept: CheckpointCompleted
    """The savepoint job orders-v2 restored."""


@pytest.fixture(name="setup")
def _setup(bootstrap: str, topic_prefix: str, tmp_path: Path) -> Setup:
    """Job ``orders``: savepoint 1, checkpoint 2. Job ``orders-v2``: restored from a second
    savepoint of ``orders`` (3) and has completed nothing since."""
    topics = Topics(topic_prefix)
    create_topics(bootstrap, topics.all, partitions=TEST_PARTITIONS)
    root = tmp_path / "savepoints"
    journal = Journal(topics, root)
    config = CheckpointConfig(interval_ms=0, location=(tmp_path / "checkpoints").as_uri())
    running = JobStatusChanged(JOB, JobStatus.RUNNING, 1_000, 1, ("task-0",), config)
    journal.handle(topics.job_status, JOB, running, 1_000)
    savepoint = journal.checkpoint(JOB, 2_000, target=(root / "before-upgrade").as_uri())
    checkpoint = journal.checkpoint(JOB, 3_000)
    kept = journal.checkpoint(JOB, 4_000, target=(root / "for-v2").as_uri())
    restored = JobStatusChanged(
        RESTORED_JOB, JobStatus.RUNNING, 5_000, 1, ("task-0",), config,
        restored_checkpoint_id=kept.checkpoint_id, restored_location=kept.location,
    )  # fmt: skip
    journal.handle(topics.job_status, RESTORED_JOB, restored, 5_000)
    journal.publish(bootstrap)
    return Setup(
        ("--bootstrap", bootstrap, "--topic-prefix", topic_prefix), root, savepoint, checkpoint, kept
    )


def listed(setup: Setup) -> dict[int, dict[str, object]]:
    result = cutline("savepoints", "list", JOB, "--json", *setup.args)
    assert 0 == result.returncode, result.stderr
    return {row["checkpoint_id"]: row for row in map(json.loads, result.stdout.splitlines())}


def test_list_shows_the_job_s_savepoints_and_which_one_a_restore_needs(setup: Setup) -> None:
    savepoint, kept = setup.savepoint, setup.kept

    rows = listed(setup)
    table = cutline("savepoints", "list", JOB, *setup.args)

    assert [savepoint.checkpoint_id, kept.checkpoint_id] == list(rows)
    first, second = rows.values()
    assert (savepoint.location, True, None) == (first["location"], first["on_disk"], first["needed_by"])
    assert kept.location == second["location"] and second["on_disk"] is True
    assert str(second["needed_by"]).startswith(f"job {RESTORED_JOB} restored it in attempt 1")
    assert 0 == table.returncode and f"savepoints of {JOB}" in table.stdout


def test_show_prints_the_metadata(setup: Setup) -> None:
    savepoint = setup.savepoint

    result = cutline("savepoints", "show", str(local_path(savepoint.location)))

    assert 0 == result.returncode, result.stderr
    assert f"savepoint {savepoint.checkpoint_id} of job {JOB}" in result.stdout
    assert "orders-in:0" in result.stdout and "2000" in result.stdout
    assert "task-0" in result.stdout and "yes" in result.stdout


def test_show_of_a_directory_without_metadata_says_what_to_give(tmp_path: Path) -> None:
    result = cutline("savepoints", "show", str(tmp_path))

    assert 2 == result.returncode
    assert f"has no {METADATA_FILE}" in result.stdout + result.stderr


def test_dispose_deletes_a_savepoint_inside_the_root(setup: Setup) -> None:
    savepoint, root = setup.savepoint, setup.root
    directory = local_path(savepoint.location)

    result = cutline("savepoints", "dispose", str(directory), "--savepoint-root", str(root), *setup.args)

    assert 0 == result.returncode, result.stdout + result.stderr
    assert "1 state files" in result.stdout
    assert not directory.exists()
    assert listed(setup)[savepoint.checkpoint_id]["on_disk"] is False


def test_dispose_of_a_keyed_savepoint_deletes_its_pieces(
    bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """Given a keyed job's savepoint (its handle a manifest that lists a piece next to it), dispose
    deletes the piece too, not only the manifest and _metadata: nothing of it is left."""
    topics = Topics(topic_prefix)
    create_topics(bootstrap, topics.all, partitions=TEST_PARTITIONS)
    root = tmp_path / "savepoints"
    journal = Journal(topics, root)
    config = CheckpointConfig(interval_ms=0, location=(tmp_path / "checkpoints").as_uri())
    journal.handle(
        topics.job_status,
        "keyed",
        JobStatusChanged("keyed", JobStatus.RUNNING, 1_000, 1, ("keyed-0",), config),
        1_000,
    )

    def manifest_with_a_piece(location: str) -> bytes:
        piece = local_path(f"{location}/keyed-0.a1.cut-3.full")
        piece.write_bytes(b"the key groups' state")
        listed = Piece(piece.as_uri(), 21, "0" * 64, "full", 1)
        return Manifest("keyed-0", 128, range(128), 3, (listed,), StepIdentity(None, "app.f")).to_bytes()

    savepoint = journal.checkpoint(
        "keyed", 2_000, target=(root / "keyed").as_uri(), task="keyed-0", state=manifest_with_a_piece
    )
    directory = local_path(savepoint.location)
    journal.publish(bootstrap)

    result = cutline(
        "savepoints", "dispose", str(directory), "--savepoint-root", str(root),
        "--bootstrap", bootstrap, "--topic-prefix", topic_prefix,
    )  # fmt: skip

    assert 0 == result.returncode, result.stdout + result.stderr
    assert "2 state files" in result.stdout
    assert not directory.exists()


def test_dispose_refuses_outside_the_savepoint_roots(setup: Setup, tmp_path: Path) -> None:
    savepoint = setup.savepoint
    directory = local_path(savepoint.location)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "link").symlink_to(directory)

    wrong_root = cutline(
        "savepoints", "dispose", str(directory), "--savepoint-root", str(elsewhere), *setup.args
    )
    through_link = cutline(
        "savepoints",
        "dispose",
        str(elsewhere / "link"),
        "--savepoint-root",
        str(elsewhere),
        *setup.args,
    )

    for result in (wrong_root, through_link):
        assert 2 == result.returncode
        assert "is not inside a savepoint root" in result.stdout + result.stderr
    assert (directory / METADATA_FILE).exists()


def test_dispose_refuses_a_checkpoint_and_a_savepoint_a_restore_needs(setup: Setup) -> None:
    checkpoint, kept, root = setup.checkpoint, setup.kept, setup.root
    checkpoint_dir = local_path(checkpoint.location)

    of_checkpoint = cutline(
        "savepoints", "dispose", str(checkpoint_dir), "--savepoint-root", str(checkpoint_dir.parent.parent),
        *setup.args,
    )  # fmt: skip
    of_needed = cutline(
        "savepoints",
        "dispose",
        str(local_path(kept.location)),
        "--savepoint-root",
        str(root),
        *setup.args,
    )

    assert 2 == of_checkpoint.returncode
    assert "dispose only of savepoints" in of_checkpoint.stdout + of_checkpoint.stderr
    assert 2 == of_needed.returncode
    assert f"still needed: job {RESTORED_JOB} restored it" in " ".join(
        (of_needed.stdout + of_needed.stderr).split()
    )
    assert (checkpoint_dir / METADATA_FILE).exists() and (local_path(kept.location) / METADATA_FILE).exists()
