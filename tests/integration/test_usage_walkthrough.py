"""docs/usage.md's participant walkthrough runs as written.

The Python blocks of "Taking part from a Python Kafka consumer", up to its first subheading, are one
program: the test saves them as ``wordcount.py`` and runs it against a real broker and coordinator,
as its shell block says: words in, a checkpoint completes with what it counted, ``cutline stop``
takes a savepoint and the program ends, its job FINISHED.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support import TEST_PARTITIONS, eventually

from coordinator.service.app import Settings, ensure_topics
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import create_topics
from events.kafka.clients import consumer_config, producer_config, read_partition_to_end, watermark_offsets
from events.task.participant import JobDriver, load_task_snapshot
from events.wire.records import CheckpointCompleted, CheckpointKind, CheckpointRestored
from events.wire.topics import Topics

USAGE = Path(__file__).resolve().parents[2] / "docs" / "usage.md"
SECTION = "## Taking part from a Python Kafka consumer"
INPUT = "words"


def walkthrough(markdown: str) -> tuple[str, str]:
    """The walkthrough's program (its Python blocks, joined) and its shell block: those of
    :data:`SECTION` before the section's first subheading."""
    start = markdown.index(f"\n{SECTION}\n")
    end = markdown.find("\n## ", start + 1)
    section = markdown[start : None if end < 0 else end]
    blocks = fenced_blocks(section.split("\n### ", 1)[0])
    python = [code for language, code in blocks if language == "python"]
    shell = [code for language, code in blocks if language == ""]
    assert python and len(shell) == 1, "the walkthrough has Python blocks and one shell block"
    return "\n".join(python), shell[0]


def fenced_blocks(markdown: str) -> list[tuple[str, str]]:
    """Each fenced code block of ``markdown``: its language (the fence's info string) and its code."""
    blocks: list[tuple[str, str]] = []
    language: str | None = None
    lines: list[str] = []
    for line in markdown.splitlines(keepends=True):
        if language is None and line.startswith("```"):
            language, lines = line[3:].strip(), []
        elif language is not None and line.rstrip() == "```":
            blocks.append((language, "".join(lines)))
            language = None
        elif language is not None:
            lines.append(line)
    return blocks


@pytest.fixture(scope="module", name="topics")
def _topics(bootstrap: str) -> Iterator[Topics]:
    topics = Topics(f"walk-{uuid4().hex[:8]}.")
    ensure_topics(Settings(bootstrap, topics.prefix, partitions=TEST_PARTITIONS))
    with CoordinatorProcess(bootstrap, topics.prefix):
        yield topics


def produce(bootstrap: str, lines: list[str]) -> int:
    """Produce ``lines`` into partition 0 of the input; the partition's end offset after them."""
    producer = Producer(producer_config(bootstrap))
    for line in lines:
        producer.produce(INPUT, line.encode(), partition=0)
    assert 0 == producer.flush(10)
    reader = Consumer(consumer_config(bootstrap))
    try:
        return watermark_offsets(reader, TopicPartition(INPUT, 0))[1]
    finally:
        reader.close()


def words_in_partition(bootstrap: str, end: int) -> Counter[str]:
    """Every word of partition 0 of the input up to ``end`` (other tests may have written there too)."""
    counts: Counter[str] = Counter()
    reader = Consumer(consumer_config(bootstrap))
    try:
        for message in read_partition_to_end(reader, INPUT, 0, until=end - 1):
            counts.update((message.value() or b"").decode().split())
    finally:
        reader.close()
    return counts


class Program:
    """The walkthrough's program as ``wordcount.py`` in a directory, run as job ``job`` (the variables
    ``cutline run`` would set), and the job seen from outside: its journal and cutline's commands."""

    def __init__(self, bootstrap: str, topics: Topics, directory: Path, code: str) -> None:
        self.bootstrap, self.topics, self.directory = bootstrap, topics, directory
        (directory / "wordcount.py").write_text(code)
        self.job = f"wordcount-{uuid4().hex[:6]}"
        self.driver = JobDriver(bootstrap, self.job, topics)
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        environment = {**os.environ, "CUTLINE_BOOTSTRAP": self.bootstrap, "CUTLINE_JOB": self.job}
        environment["CUTLINE_TOPIC_PREFIX"] = self.topics.prefix
        self.process = subprocess.Popen(
            [sys.executable, "wordcount.py"],
            cwd=self.directory,
            env=environment,
            stderr=subprocess.PIPE,
            text=True,
        )

    def checkpoint_at(self, end: int) -> CheckpointCompleted:
        """The newest completed checkpoint whose cut is ``end`` in the input, once there is one: the
        program keeps checkpointing, and retention deletes the snapshots of the older ones."""

        def caught_up() -> list[CheckpointCompleted]:
            assert self.process is not None and self.process.poll() is None, self.ended()
            return [c for c in self.driver.completions() if c.offsets.get(f"{INPUT}:0") == end]

        return eventually(caught_up, timeout=60, what=f"a checkpoint at offset {end}")[-1]

    def cutline(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "coordinator.cli", *args, "--bootstrap", self.bootstrap]
        command += ["--topic-prefix", self.topics.prefix, "--timeout", "60"]
        return subprocess.run(command, capture_output=True, text=True, timeout=90)

    def exit_code(self) -> int:
        assert self.process is not None
        return self.process.wait(timeout=30)

    def ended(self) -> str:
        assert self.process is not None
        return f"the program ended ({self.process.poll()}): {self.process.communicate()[1]}"

    def committed(self) -> int:
        """The job's consumer group's committed offset of the input."""
        group = Consumer(consumer_config(self.bootstrap, self.job))
        try:
            [committed] = group.committed([TopicPartition(INPUT, 0)], timeout=10)
        finally:
            group.close()
        return int(committed.offset)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.driver.close()


def counts_in(completed: CheckpointCompleted) -> Counter[str]:
    return Counter(json.loads(load_task_snapshot(completed.handles["task-0"])))


@pytest.fixture(name="program")
def _program(bootstrap: str, topics: Topics, tmp_path: Path) -> Iterator[Program]:
    code, shell = walkthrough(USAGE.read_text())
    assert "cutline stop wordcount --savepoint" in shell
    create_topics(bootstrap, [INPUT], partitions=1)
    program = Program(bootstrap, topics, tmp_path, code)
    yield program
    program.close()


def test_the_walkthrough_checkpoints_what_it_counted_and_ends_finished_after_a_stop(
    bootstrap: str, program: Program, tmp_path: Path
) -> None:
    """Its checkpoints hold the words of the records before their cut, the group's offset follows
    them, and ``cutline stop`` takes a savepoint of all of it and ends the program, FINISHED."""
    end = produce(bootstrap, ["to be or not to be", "that is the question"])
    program.start()

    checkpoint = program.checkpoint_at(end)

    expected = words_in_partition(bootstrap, end)
    assert expected == counts_in(checkpoint)
    stopped = program.cutline("stop", program.job, "--savepoint", str(tmp_path / "savepoints"))
    assert 0 == stopped.returncode, stopped.stdout + stopped.stderr
    assert f"job {program.job} is FINISHED" in stopped.stdout
    assert 0 == program.exit_code(), program.ended()
    [savepoint] = [c for c in program.driver.completions() if c.kind is CheckpointKind.SAVEPOINT]
    assert expected == counts_in(savepoint)
    assert end == program.committed()


def test_the_walkthrough_restores_its_latest_checkpoint_and_ends_canceled_after_a_cancel(
    bootstrap: str, program: Program
) -> None:
    """Started again, it restores the counts and offset of its latest checkpoint, counts on from
    there, and ``cutline cancel`` ends it, CANCELED."""
    first = produce(bootstrap, ["the rest is silence"])
    program.start()
    program.checkpoint_at(first)
    program.cutline("cancel", program.job)
    assert 0 == program.exit_code(), program.ended()

    latest = program.driver.latest_completed()
    end = produce(bootstrap, ["silence is golden", "the rest"])
    program.start()
    checkpoint = program.checkpoint_at(end)

    assert latest is not None and first == latest.offsets[f"{INPUT}:0"]
    [restored] = program.driver.journal((CheckpointRestored,))
    assert (latest.checkpoint_id, 2) == (restored.checkpoint_id, checkpoint.attempt)
    assert words_in_partition(bootstrap, end) == counts_in(checkpoint)
    canceled = program.cutline("cancel", program.job)
    assert 0 == canceled.returncode, canceled.stdout + canceled.stderr
    assert f"job {program.job} is CANCELED" in canceled.stdout
    assert 0 == program.exit_code(), program.ended()
