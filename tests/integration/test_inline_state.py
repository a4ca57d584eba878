"""Small state inline in the ack (Flink's ``state.storage.fs.memory-threshold``), end to end: a real
coordinator decides, two participants with small state send it inline and write no file, a third
with larger state writes its file as before, and a restore reads every task's bytes back from the
journal's completion."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import create_protocol_topics, eventually

from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.log import read_journal_topic
from events.task.participant import JobDriver, Participant, load_task_snapshot
from events.wire.records import CheckpointBarrier, CheckpointCompleted, CheckpointConfig, TaskAcknowledged
from events.wire.topics import Topics

JOB = "inline-job"
SMALL, LARGE = ("task-0", "task-1"), "task-2"
THRESHOLD = 1024


def state_of(task: str, checkpoint_id: int) -> bytes:
    """What ``task`` snapshots at ``checkpoint_id``: a few bytes, or more than the threshold."""
    text = f"{task} at checkpoint {checkpoint_id};"
    return (text * (2 * THRESHOLD // len(text))).encode() if task == LARGE else text.encode()


@pytest.mark.slow
def test_small_state_rides_in_the_acks_and_restores_from_the_completion(
    bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topics = Topics(topic_prefix)
    create_protocol_topics(bootstrap, topics.prefix)
    participants = []
    for task in (*SMALL, LARGE):

        def snapshot(barrier: CheckpointBarrier, task: str = task) -> bytes:
            return state_of(task, barrier.checkpoint_id)

        participant = Participant(bootstrap, JOB, task, 1, topics, snapshot, lambda: {"in:0": 1})
        participant.run_in_thread()
        participants.append(participant)
    driver = JobDriver(bootstrap, JOB, topics)
    root = tmp_path / "checkpoints"
    config = CheckpointConfig(
        interval_ms=200, location=root.as_uri(), retained=2, inline_threshold_bytes=THRESHOLD
    )
    try:
        with CoordinatorProcess(bootstrap, topic_prefix):
            driver.running((*SMALL, LARGE), config, attempt=1)
            eventually(
                lambda: len(participants[-1].stats.discarded) >= 2,
                timeout=60,
                what=f"two checkpoints of {JOB} completed and discarded: {participants}",
            )
    finally:
        for participant in participants:
            participant.close()
    try:
        latest = driver.latest_completed(timeout=10)  # what a restarted job restores from
    finally:
        driver.close()

    assert latest is not None
    checkpoint = latest.checkpoint_id
    assert {task: state_of(task, checkpoint) for task in (*SMALL, LARGE)} == {
        task: load_task_snapshot(handle) for task, handle in latest.handles.items()
    }
    assert all(latest.handles[task].inline is not None for task in SMALL)
    assert latest.handles[LARGE].inline is None
    assert state_of(LARGE, checkpoint) == (root / JOB / f"chk-{checkpoint}" / LARGE).read_bytes()
    written = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert written and all(p.endswith(f"/{LARGE}") for p in written), written  # nothing of the small tasks
    journal = [e for e, _ in read_journal_topic(bootstrap, topics.checkpoints, lambda m, p: None)]
    acks = [e for e in journal if isinstance(e, TaskAcknowledged) and e.task_id in SMALL]
    assert acks and all(
        a.state is not None and a.state.inline == state_of(a.task_id, a.checkpoint_id) for a in acks
    )
    completions = [e for e in journal if isinstance(e, CheckpointCompleted)]
    assert latest == max(completions, key=lambda c: c.checkpoint_id)
    assert all(c.size_bytes == sum(h.size_bytes for h in c.handles.values()) for c in completions)
