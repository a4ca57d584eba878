"""The Node.js participant of examples/node-participant (written from docs/wire-format.md alone)
against the embedded broker and a real coordinator: its checkpoints complete, and it decodes every
record the coordinator writes to the journal."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from support import create_protocol_topics

from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.log import read_journal_topic, read_to_end
from events.wire.codec import default_codec
from events.wire.records import CheckpointCompleted
from events.wire.topics import Topics

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node-participant"
JOB = "node-job"
CHECKPOINTS = 3


@pytest.fixture(scope="module")
def node_example() -> Path:
    """The example with its npm packages installed (``npm ci`` from the committed lock file)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(reason="node and npm are not on this machine: the Node.js participant cannot run")
    if (
        not (EXAMPLE / "node_modules" / "kafkajs").is_dir()
        or not (EXAMPLE / "node_modules" / "avsc").is_dir()
    ):
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=EXAMPLE, check=True, capture_output=True, timeout=300
        )
    return EXAMPLE


@pytest.mark.slow
def test_node_participant_completes_checkpoints_and_decodes_the_journal(
    node_example: Path, bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topics = Topics(topic_prefix)
    create_protocol_topics(bootstrap, topics.prefix)
    coordinator = CoordinatorProcess(bootstrap, topic_prefix)
    coordinator.start()
    try:
        result = subprocess.run(
            [
                "node",
                "participant.js",
                *("--bootstrap", bootstrap, "--prefix", topic_prefix, "--job", JOB),
                *("--dir", str(tmp_path / "checkpoints"), "--checkpoints", str(CHECKPOINTS)),
                *("--timeout-s", "30"),
            ],
            cwd=node_example,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
        summaries = [line["summary"] for line in lines if "summary" in line]
        assert result.returncode == 0 and summaries, (
            result.returncode,
            result.stdout[-3000:],
            result.stderr[-3000:],
        )
        summary = summaries[-1]

        # Its checkpoints complete, with a handle of each of its three tasks (the journal, read in Python).
        completions = [
            event
            for event, _ in read_journal_topic(bootstrap, topics.checkpoints, lambda message, problem: None)
            if isinstance(event, CheckpointCompleted) and event.job_id == JOB
        ]
        assert len(completions) >= CHECKPOINTS
        assert all(sorted(c.handles) == ["task-0", "task-1", "task-2"] for c in completions)
        assert [c.checkpoint_id for c in completions][:CHECKPOINTS] == summary["completed"][:CHECKPOINTS]
        for completed in completions[-1:]:  # the newest snapshots are kept, and are what the acks said
            for handle in completed.handles.values():
                assert handle.sha256 == handle.sha256.lower() and len(handle.sha256) == 64
                assert handle.uri.startswith(completed.location + "/")

        # It decoded every record the coordinator wrote to the journal, by type, claims included.
        codec = default_codec()
        written = Counter(
            codec.record_name(m.value or b"") for m in read_to_end(bootstrap, topics.checkpoints)
        )
        assert None not in written
        assert summary["undecodable"] == 0
        assert summary["decoded"] == dict(written)
        assert {"CoordinatorClaimed", "SchedulerStarted", "CheckpointTriggered", "TaskAcknowledged"} <= set(
            written
        )
        assert "SchedulerStopped" in written and summary["void"] == 0
    finally:
        coordinator.stop()
