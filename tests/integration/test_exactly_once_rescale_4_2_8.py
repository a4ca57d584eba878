"""Exactly-once output of participants rescaled 4 -> 2 -> 8 tasks with transactions pending, on Apache
Kafka (docs/exactly-once.md, "Recovery"): each task copies its own input partition to one output
topic through an ExactlyOnceSink (exactly_once_app.py, SIGKILLed at named steps); the test plays the
coordinator. A read_committed reader must see every input's copy exactly once; a read_uncommitted
reader sees the copies of each transaction a SIGKILL left open, aborted, beside their committed
ones, so the tests can fail.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import on_apache_kafka
from test_exactly_once_rescale import RescaledJob
from test_exactly_once_sink import Child, launch

from events.dev.broker import create_topics

pytestmark = pytest.mark.skipif(
    not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
)

FOUR = [f"task-{i}" for i in range(4)]
TWO = FOUR[:2]
EIGHT = [f"task-{i}" for i in range(8)]
WORDS = 5
"""Words per input partition between two checkpoints."""


class ThreeScales(RescaledJob):
    """Task ``task-i`` reads input partition i of eight; words go only to the running tasks'
    partitions, so that no input is read twice or skipped across the rescales."""

    def __init__(self, bootstrap: str, prefix: str, root: Path) -> None:
        super().__init__(bootstrap, prefix, root)
        self.input = f"{prefix}words-8"
        create_topics(bootstrap, [self.input], partitions=len(EIGHT))
        self.produced: Counter[int] = Counter()
        """Words produced per input partition."""
        self.copies: dict[int, set[str]] = {}
        """The words each checkpoint's cut covers beyond the previous one's."""

    def words_for(self, tasks: list[str]) -> None:
        """``WORDS`` more words on each of ``tasks``' partitions; each of them has read them."""
        for task in tasks:
            partition = EIGHT.index(task)
            for _ in range(WORDS):
                word = f"p{partition}-w{self.produced[partition]}"
                self.producer.produce(self.input, word.encode(), partition=partition)
                self.produced[partition] += 1
                self.sent.append(word)
        assert self.producer.flush(10) == 0
        for task in tasks:
            self.children[task].said(f"processed {self.produced[EIGHT.index(task)]}")

    def launch_task(
        self,
        task: str,
        attempt: int,
        tasks: list[str],
        restored: int | None = None,
        crash: tuple[str, int] | None = None,
        fresh: bool = False,
    ) -> Child:
        """Start ``task`` of ``attempt`` without waiting for it; ``fresh``: a task the restored
        checkpoint has no snapshot of, which reads its partition from what was produced before."""
        partition = EIGHT.index(task)
        settings = {
            "bootstrap": self.bootstrap,
            "prefix": self.topics.prefix,
            "job": "copy",
            "task": task,
            "partition": partition,
            "tasks": tasks,
            "attempt": attempt,
            "input": self.input,
            "output": self.output,
            "restored": restored,
            "crash": crash,
            "offset": self.produced[partition] if fresh else None,
        }
        child = self.children[task] = launch(settings)
        return child

    def attempt(
        self,
        attempt: int,
        tasks: list[str],
        restored: int | None = None,
        crash: dict[str, tuple[str, int]] | None = None,
        fresh: tuple[str, ...] = (),
    ) -> None:
        """Every task of ``attempt`` started and ready (recovered)."""
        for task in tasks:
            self.launch_task(task, attempt, tasks, restored, (crash or {}).get(task), task in fresh)
        for task in tasks:
            self.children[task].said("ready")

    def kill_all(self) -> None:
        for child in self.children.values():
            if child.process.poll() is None:
                child.kill()
        self.children = {}

    def repeated_uncommitted(self) -> set[str]:
        """The words a read_uncommitted reader sees more than once: aborted copies beside the committed."""
        return {word for word, n in self.output_values("read_uncommitted").items() if n > 1}

    def assert_exactly_once(self) -> None:
        every = Counter(self.sent)
        seen = self.output_values()
        assert seen == every, f"not exactly once: extra {seen - every}, missing {every - seen}"
        assert sorted(self.root.glob("*/*.out")) == [], "staged files left after their output was committed"


def copies_of(job: ThreeScales, task: str, checkpoint: int) -> set[str]:
    """The words ``task`` read between checkpoint ``checkpoint - 1`` and ``checkpoint`` (``WORDS``
    words of its partition between two checkpoints of the attempts it ran in)."""
    prefix = f"p{EIGHT.index(task)}-w"
    first = (checkpoint - 1) * WORDS
    return {w for w in job.sent if w.startswith(prefix) and first <= int(w[len(prefix) :]) < first + WORDS}


@pytest.fixture
def job(bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[ThreeScales]:
    running = ThreeScales(bootstrap, topic_prefix, tmp_path / "checkpoints")
    try:
        yield running
    finally:
        running.close()


def four_tasks_then_task_3_dies_after_completion_2(job: ThreeScales, crash: str) -> None:
    """Attempt 1: four tasks; checkpoint 1 committed; checkpoint 2 completed, task-3 SIGKILLed at
    ``crash`` of its commit while the others commit it; then every process of the attempt dies."""
    job.attempt(1, FOUR, crash={"task-3": (crash, 2)})
    job.words_for(FOUR)
    job.checkpoint(1, 1, FOUR)
    job.words_for(FOUR)
    job.checkpoint(2, 1, FOUR)
    for task in FOUR[:3]:
        job.committed(task, 2)
    job.children["task-3"].said(f"stopped at {crash} 2")
    job.kill_all()


@pytest.mark.parametrize("crash", ["committing", "open"], ids=["before-the-commit", "during-the-commit"])
def test_exactly_once_transactional_output_survives_a_rescale_from_4_to_2_to_8_tasks(
    job: ThreeScales, crash: str
) -> None:
    # given: 4 tasks, task-3 killed after checkpoint 2 completed, at ``crash`` of its commit
    four_tasks_then_task_3_dies_after_completion_2(job, crash)
    # and: 2 tasks restore 2 (task-1 takes over task-3, task-0 task-2); checkpoint 3 completes and
    # task-1 is killed at the same point of its commit: its output of 3 pending
    job.attempt(2, TWO, restored=2, crash={"task-1": (crash, 3)})
    job.children["task-1"].said("took over task-3 commit=[2] delete=[]")
    job.children["task-0"].said("took over task-2 commit=[] delete=[]")
    job.words_for(TWO)
    job.checkpoint(3, 2, TWO)
    job.committed("task-0", 3)
    job.children["task-1"].said(f"stopped at {crash} 3")
    job.kill_all()
    # when: 8 tasks restore 3 (tasks 2..7 have no snapshot in it: they read on from what was produced)
    job.attempt(3, EIGHT, restored=3, fresh=tuple(EIGHT[2:]))
    # then: task-1 commits its own pending output of 3; task-2 and task-3 find theirs committed by the
    # takeover (their markers say 2); nobody takes over anything (every task of before is back)
    job.children["task-1"].said("recovered commit=[3] delete=[]")
    for task in EIGHT[2:]:
        job.children[task].said("recovered commit=[] delete=[]")
    assert not any(line.startswith("took over") for c in job.children.values() for line in c.lines)
    # and, after more words and checkpoint 4 of eight tasks, every copy is committed exactly once
    job.words_for(EIGHT)
    job.checkpoint(4, 3, EIGHT)
    for task in EIGHT:
        job.committed(task, 4)
    job.assert_exactly_once()
    # both dead transactions were aborted: their copies are there twice, uncommitted (before the commit,
    # only where the records were sent ahead: not those that came while the previous commit ran)
    both = copies_of(job, "task-3", 2) | copies_of(job, "task-1", 3)
    if crash == "open":
        assert job.repeated_uncommitted() == both
    else:
        assert job.repeated_uncommitted() <= both


def test_exactly_once_when_the_task_taking_over_is_killed_during_its_commit(job: ThreeScales) -> None:
    # given: 4 tasks, task-3 killed after checkpoint 2 completed, before its commit
    four_tasks_then_task_3_dies_after_completion_2(job, "committing")
    # and: the job restores 2 with 2 tasks, and task-1 is killed while it commits task-3's output
    # (under task-3's transactional id: the transaction open, before it is committed)
    job.launch_task("task-0", 2, TWO, restored=2).said("ready")
    job.launch_task("task-1", 2, TWO, restored=2, crash=("open", 2)).said("stopped at open 2")
    job.kill_all()
    # when: the job restores 2 again, with 8 tasks (4..7 new)
    job.attempt(3, EIGHT, restored=2, fresh=tuple(EIGHT[4:]))
    # then: task-3 is back and recovers its own output: it fences the open transaction (aborted) and
    # commits its checkpoint 2 again
    job.children["task-3"].said("recovered commit=[2] delete=[]")
    job.words_for(EIGHT)
    job.checkpoint(3, 3, EIGHT)
    for task in EIGHT:
        job.committed(task, 3)
    job.assert_exactly_once()
    # and: task-1's open transaction was aborted: its copies are there beside the committed ones (three
    # copies where task-3 had sent them ahead before it died: that transaction was aborted too)
    assert job.repeated_uncommitted() == copies_of(job, "task-3", 2)
