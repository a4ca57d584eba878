"""Participant snapshots on S3 (events/task/storage.py, the ``s3`` extra): s3fs against moto's S3 server,
started by the test, as s3fs's own tests do. A real coordinator decides; two participants write
their snapshots to ``s3://``, old ones are discarded, and a restore reads the latest back."""

from __future__ import annotations

from pathlib import Path

import pytest
import s3fs
from support import create_protocol_topics, eventually

from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.log import read_journal_topic
from events.task.participant import JobDriver, Participant, load_task_snapshot
from events.wire.records import CheckpointBarrier, CheckpointCompleted, CheckpointConfig
from events.wire.topics import Topics

BUCKET = "cutline-checkpoints"
JOB = "s3-job"
TASKS = ("task-0", "task-1")


@pytest.mark.slow
def test_snapshots_on_s3_complete_are_retained_and_restore(
    s3: s3fs.S3FileSystem, bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topics = Topics(topic_prefix)
    create_protocol_topics(bootstrap, topics.prefix)
    participants = []
    for task in TASKS:

        def snapshot(barrier: CheckpointBarrier, task: str = task) -> bytes:
            return f"{task} at checkpoint {barrier.checkpoint_id}".encode()

        participant = Participant(bootstrap, JOB, task, 1, topics, snapshot, lambda: {"in:0": 1})
        participant.run_in_thread()
        participants.append(participant)
    driver = JobDriver(bootstrap, JOB, topics)
    config = CheckpointConfig(interval_ms=300, location=f"s3://{BUCKET}/checkpoints", retained=1)
    try:
        with CoordinatorProcess(bootstrap, topic_prefix):
            driver.running(TASKS, config, attempt=1)

            def completed() -> list[CheckpointCompleted]:
                journal = read_journal_topic(bootstrap, topics.checkpoints, lambda m, p: None)
                return [e for e, _ in journal if isinstance(e, CheckpointCompleted)]

            eventually(
                completed,
                lambda done: len(done) >= 4 and all(len(p.stats.discarded) >= 2 for p in participants),
                timeout=60,
                interval=0.3,
                what="4 checkpoints completed on s3, 2 discarded by each task",
            )
    finally:
        for participant in participants:
            participant.close()
        driver.close()

    # The journal once everything has stopped: a checkpoint may complete (and the participants
    # discard the one before it) between the loop's last read and the coordinator's stop.
    journal = [e for e, _ in read_journal_topic(bootstrap, topics.checkpoints, lambda m, p: None)]
    completed = [e for e in journal if isinstance(e, CheckpointCompleted)]
    latest = max(completed, key=lambda c: c.checkpoint_id)
    assert {f"s3://{BUCKET}/checkpoints/{JOB}/chk-{latest.checkpoint_id}/{t}" for t in TASKS} == {
        h.uri for h in latest.handles.values()
    }
    for task, handle in latest.handles.items():
        assert f"{task} at checkpoint {latest.checkpoint_id}".encode() == load_task_snapshot(handle)
    discarded = {i for p in participants for i in p.stats.discarded}
    stored = s3.find(f"{BUCKET}/checkpoints/{JOB}")
    assert not any(f"/chk-{i}/" in key for i in discarded for key in stored), stored
