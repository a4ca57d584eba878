"""The coordinator service over a real broker, with real participants, in its own process.

The module's tests share one ``cutline coordinator`` child process and its topic
prefix, each driving a job of its own with the participant library, as jobs share a
coordinator in production; a test that kills or restarts the coordinator, or reads
what it counted over all its inputs, has one of its own (``own_coordinator``). They
check what the journal topic, the dead-letter topic, the consumer group and the web
views say.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from uuid import uuid4

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from support import create_protocol_topics, eventually

from coordinator.core.decider import fold_jobs
from coordinator.core.invariants import first_violation
from coordinator.core.state import state_json
from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import create_topics
from events.kafka.clients import consumer_config, producer_config
from events.kafka.log import LogMessage, read_journal_topic, read_to_end
from events.task.latency import MAX_HISTOGRAMS, MAX_LATENCY_ID_BYTES, LatencyMarker
from events.task.participant import JobDriver, Participant
from events.wire.codec import decode, encode
from events.wire.records import (
    CheckpointAborted,
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointFailureThresholdExceeded,
    CheckpointTriggered,
    DeadLetter,
    JobStatus,
    JournalEvent,
    SchedulerStopped,
)
from events.wire.topics import Topics


def _topics_of(bootstrap: str) -> Topics:
    topics = Topics(f"t{uuid4().hex[:8]}.")
    create_protocol_topics(bootstrap, topics.prefix)
    return topics


@pytest.fixture(name="coordinator", scope="module")
def _coordinator(bootstrap: str) -> Iterator[CoordinatorProcess]:
    """The coordinator the module's tests share, on a prefix of the module's."""
    with CoordinatorProcess(bootstrap, _topics_of(bootstrap).prefix) as process:
        yield process


@pytest.fixture(name="own_coordinator")
def _own_coordinator(bootstrap: str) -> Iterator[CoordinatorProcess]:
    """A coordinator of the test's own, on a prefix of the test's own."""
    with CoordinatorProcess(bootstrap, _topics_of(bootstrap).prefix) as process:
        yield process


@dataclass
class Task:
    """One participant task: a counter over its own input partition."""

    index: int
    participant: Participant
    consumer: Consumer
    processed: int = 0
    fail_on: set[int] = field(default_factory=set)


class Job:
    """A job of ``n`` participant tasks, each owning one partition of the job's input topic; its id,
    input topic and consumer group are its own."""

    def __init__(
        self, bootstrap: str, topics: Topics, n: int, tmp: str, **hooks: Callable[..., object]
    ) -> None:
        self.bootstrap, self.topics, self.tmp = bootstrap, topics, tmp
        self.id = f"wordcount-{uuid4().hex[:6]}"
        self.input = f"{topics.prefix}words-{self.id}"
        self.group = f"{self.id}-app"
        create_topics(bootstrap, [self.input], partitions=n)
        self.driver = JobDriver(bootstrap, self.id, topics)
        self.tasks: list[Task] = []
        slow = hooks.get("slow")
        for i in range(n):
            consumer = Consumer(consumer_config(bootstrap, self.group))
            consumer.assign([TopicPartition(self.input, i, 0)])
            task_holder: dict[str, Task] = {}

            def snapshot(barrier: CheckpointBarrier, holder: dict[str, Task] = task_holder) -> bytes:
                task = holder["task"]
                if barrier.checkpoint_id in task.fail_on:
                    raise RuntimeError(f"snapshot of checkpoint {barrier.checkpoint_id} failed on purpose")
                if slow is not None:
                    slow(task, barrier)
                task.processed += 10  # the "records" this task has read before the cut
                return str(task.processed).encode()

            def offsets(holder: dict[str, Task] = task_holder, i: int = i) -> dict[str, int]:
                return {f"{self.input}:{i}": holder["task"].processed}

            participant = Participant(
                bootstrap, self.id, f"task-{i}", 1, topics, snapshot, offsets, commit_consumer=consumer
            )
            task = Task(i, participant, consumer)
            task_holder["task"] = task
            self.tasks.append(task)

    def start(self, config: CheckpointConfig, extra_tasks: tuple[str, ...] = ()) -> None:
        for task in self.tasks:
            task.participant.run_in_thread()
        names = tuple(f"task-{t.index}" for t in self.tasks) + extra_tasks
        self.driver.running(names, config, attempt=1)

    def journal(self) -> list[JournalEvent]:
        """The job's events in the journal topic (skipping what is not a journal event, as the
        coordinator does)."""
        journal = read_journal_topic(self.bootstrap, self.topics.checkpoints, lambda message, problem: None)
        return [event for event, _ in journal if event.job_id == self.id]

    def wait_for(
        self, predicate: Callable[[list[JournalEvent]], bool], timeout: float = 30.0
    ) -> list[JournalEvent]:

        def matches(journal: list[JournalEvent]) -> bool:
            assert predicate(journal), f"last events: {[type(e).__name__ for e in journal][-20:]}"
            return True

        return eventually(self.journal, matches, timeout=timeout, interval=0.2, what="the journal to match")

    def wait_for_dead_letters(self, n: int, timeout: float = 30.0) -> list[DeadLetter]:
        def dead_letters() -> list[DeadLetter]:
            return [
                letter
                for m in read_to_end(self.bootstrap, self.topics.dead_letters)
                if m.value and isinstance(letter := decode(m.value), DeadLetter)
            ]

        return eventually(
            dead_letters,
            lambda letters: len(letters) >= n,
            timeout=timeout,
            interval=0.2,
            what=f"{n} dead letters",
        )

    def committed(self) -> dict[str, int]:
        reader = Consumer(consumer_config(self.bootstrap, self.group))
        try:
            tps = reader.committed([TopicPartition(self.input, t.index) for t in self.tasks], timeout=10)
            return {f"{tp.topic}:{tp.partition}": tp.offset for tp in tps if tp.offset >= 0}
        finally:
            reader.close()

    def close(self) -> None:
        """Close the tasks; a job still running is canceled, so that a shared coordinator stops
        triggering its checkpoints."""
        if self.driver.attempt and not any(isinstance(e, SchedulerStopped) for e in self.journal()):
            self.driver.status(JobStatus.CANCELED)
        for task in self.tasks:
            task.participant.close()
            task.consumer.close()
        self.driver.close()


@pytest.fixture(name="make_job")
def _make_job(bootstrap: str, tmp_path: object) -> Iterator[Callable[..., Job]]:
    """``make_job(coordinator, n)``: a job of ``n`` tasks on ``coordinator``'s topics."""
    jobs: list[Job] = []

    def make(coordinator: CoordinatorProcess, n: int = 3, **hooks: Callable[..., object]) -> Job:
        job = Job(bootstrap, Topics(coordinator.prefix), n, str(tmp_path), **hooks)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.close()


def config(tmp_path: object, **overrides: int) -> CheckpointConfig:
    values = {"interval_ms": 300, "timeout_ms": 10_000, "tolerable_failures": 100}
    values.update(overrides)
    return CheckpointConfig(location=f"file://{tmp_path}/checkpoints", **values)  # type: ignore[arg-type]


def scrape(coordinator: CoordinatorProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``GET /metrics``, parsed by prometheus_client: (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(coordinator.url + "/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def completions(journal: list[JournalEvent]) -> list[CheckpointCompleted]:
    return [e for e in journal if isinstance(e, CheckpointCompleted)]


def trigger_ids(journal: list[JournalEvent]) -> list[int]:
    return [e.checkpoint_id for e in journal if isinstance(e, CheckpointTriggered)]


class TestCheckpointing:
    def test_three_participants_complete_checkpoints(
        self, coordinator: CoordinatorProcess, make_job: Callable[..., Job], tmp_path: object
    ) -> None:
        """With three participants and a 300 ms interval, checkpoints complete with one handle per
        task, ids strictly increase, and the group's offsets equal the last completed checkpoint's."""
        job = make_job(coordinator, 3)
        job.start(config(tmp_path))

        journal = job.wait_for(lambda j: len(completions(j)) >= 4)

        ids = trigger_ids(journal)
        assert sorted(set(ids)) == ids
        for completed in completions(journal):
            assert {"task-0", "task-1", "task-2"} == set(completed.handles)
        assert first_violation(journal) is None
        job.driver.status(JobStatus.FINISHED)
        journal = job.wait_for(lambda j: any(isinstance(e, SchedulerStopped) for e in j))
        last = completions(journal)[-1]
        eventually(
            job.committed,
            lambda committed: dict(last.offsets) == committed,
            timeout=10,
            interval=0.2,
            what=f"the group's offsets to be the last completed checkpoint's, {dict(last.offsets)}",
        )

    def test_a_task_started_after_the_first_trigger_gets_its_barrier_again(
        self, bootstrap: str, coordinator: CoordinatorProcess, make_job: Callable[..., Job], tmp_path: object
    ) -> None:
        """A participant started after its job's RUNNING and after checkpoint 1 was triggered (issue
        51: it sat IN_PROGRESS 1/2 until its timeout, the barrier never sent again). Once listening it
        reports RUNNING, the coordinator sends it checkpoint 1's barrier again, and checkpoint 1
        completes long before its 60 s timeout, with the late task's snapshot in it."""
        job = make_job(coordinator, 1)
        job.start(config(tmp_path, timeout_ms=60_000), extra_tasks=("late",))
        job.wait_for(lambda j: 1 in trigger_ids(j))
        late = Participant(bootstrap, job.id, "late", 1, job.topics, lambda barrier: b"late", dict)
        try:
            late.run_in_thread()
            journal = job.wait_for(lambda j: 1 in [c.checkpoint_id for c in completions(j)], timeout=20)
        finally:
            late.close()

        (first,) = [c for c in completions(journal) if c.checkpoint_id == 1]
        assert {"task-0", "late"} == set(first.handles)

    def test_the_web_views_show_flink_shaped_statistics(
        self, coordinator: CoordinatorProcess, make_job: Callable[..., Job], tmp_path: object
    ) -> None:
        """/jobs/<id>/checkpoints has counts, summary, latest and history; /config the config."""
        job = make_job(coordinator, 2)
        job.start(config(tmp_path))
        job.wait_for(lambda j: len(completions(j)) >= 2)

        stats = coordinator.get(f"/jobs/{job.id}/checkpoints")
        cfg = coordinator.get(f"/jobs/{job.id}/checkpoints/config")

        assert stats["counts"]["completed"] >= 2
        assert {"counts", "summary", "latest", "history"} <= set(stats)
        assert "completed" == stats["latest"]["completed"]["@class"]
        assert 2 == stats["latest"]["completed"]["num_acknowledged_subtasks"]
        assert 300 == cfg["interval"]
        assert coordinator.get("/jobs/nobody/checkpoints")["errors"]


class TestFailures:
    def test_a_decline_aborts_that_checkpoint(
        self, coordinator: CoordinatorProcess, make_job: Callable[..., Job], tmp_path: object
    ) -> None:
        """A task that cannot snapshot checkpoint 2 declines it: CHECKPOINT_DECLINED, and later
        checkpoints complete."""
        job = make_job(coordinator, 2)
        job.tasks[1].fail_on.add(2)
        job.start(config(tmp_path))

        journal = job.wait_for(lambda j: any(c.checkpoint_id > 2 for c in completions(j)))

        aborted = [e for e in journal if isinstance(e, CheckpointAborted)]
        assert [(2, "CHECKPOINT_DECLINED", "task-1")] == [
            (a.checkpoint_id, a.reason, a.task_id) for a in aborted
        ]

    def test_a_silent_participant_makes_checkpoints_expire_past_the_threshold(
        self, coordinator: CoordinatorProcess, make_job: Callable[..., Job], tmp_path: object
    ) -> None:
        """A task that never acknowledges makes checkpoints expire (CHECKPOINT_EXPIRED); more than
        tolerable_failures of them yield CheckpointFailureThresholdExceeded."""
        job = make_job(coordinator, 1)
        job.start(config(tmp_path, timeout_ms=600, tolerable_failures=1), extra_tasks=("silent",))

        journal = job.wait_for(
            lambda j: any(isinstance(e, CheckpointFailureThresholdExceeded) for e in j), timeout=20
        )

        expired = [
            e for e in journal if isinstance(e, CheckpointAborted) and e.reason == "CHECKPOINT_EXPIRED"
        ]
        assert len(expired) >= 2
        exceeded = next(e for e in journal if isinstance(e, CheckpointFailureThresholdExceeded))
        assert (2, 1) == (exceeded.failures, exceeded.tolerable)

    def test_a_job_that_stops_running_stops_triggers(
        self, coordinator: CoordinatorProcess, make_job: Callable[..., Job], tmp_path: object
    ) -> None:
        """A CANCELED job status aborts the pending checkpoint (CHECKPOINT_COORDINATOR_SUSPEND) and
        no checkpoint is triggered afterwards."""
        job = make_job(coordinator, 1)
        job.start(config(tmp_path), extra_tasks=("silent",))
        job.wait_for(lambda j: len(trigger_ids(j)) >= 1)

        job.driver.status(JobStatus.CANCELED)
        journal = job.wait_for(lambda j: any(isinstance(e, SchedulerStopped) for e in j))
        time.sleep(1.0)  # three intervals
        after = job.journal()

        stopped_at = next(i for i, e in enumerate(after) if isinstance(e, SchedulerStopped))
        assert [] == [e for e in after[stopped_at:] if isinstance(e, CheckpointTriggered)]
        suspended = [e for e in journal if isinstance(e, CheckpointAborted)]
        assert ["CHECKPOINT_COORDINATOR_SUSPEND"] == [a.reason for a in suspended]


class TestBadInput:
    @pytest.mark.slow
    def test_garbage_on_every_input_topic_goes_to_dead_letters(
        self,
        bootstrap: str,
        own_coordinator: CoordinatorProcess,
        make_job: Callable[..., Job],
        tmp_path: object,
    ) -> None:
        """Undecodable bytes, a record on the wrong topic, an unknown job and a wrong key end in
        dead-letters with their reason and original bytes, while checkpoints keep completing."""
        job = make_job(own_coordinator, 2)
        job.start(config(tmp_path))
        job.wait_for(lambda j: len(completions(j)) >= 1)
        topics = job.topics
        producer = Producer(producer_config(bootstrap))
        garbage = {
            topics.job_status: b"\x00not avro at all",
            topics.requests: b"\xc3\x01" + b"\xff" * 8 + b"unknown fingerprint",
            topics.acks: encode(CheckpointAcknowledged("nobody", 1, 1, "t", 0)),
            topics.declines: encode(CheckpointAcknowledged(job.id, 1, 1, "task-0", 0)),
        }
        for topic, value in garbage.items():
            key = b"nobody" if b"nobody" in value else job.id.encode()
            producer.produce(topic, key=key, value=value)
        producer.produce(
            topics.acks, key=b"other-key", value=encode(CheckpointAcknowledged(job.id, 1, 1, "task-0", 0))
        )
        producer.flush(10)
        seen = len(completions(job.journal()))

        job.wait_for(lambda j: len(completions(j)) >= seen + 3)

        letters = [decode(m.value) for m in read_to_end(bootstrap, topics.dead_letters) if m.value]
        assert all(isinstance(letter, DeadLetter) for letter in letters)
        by_topic = {(letter.topic, letter.reason) for letter in letters}  # type: ignore[union-attr]
        assert {
            (topics.job_status, "BAD_MAGIC"),
            (topics.requests, "UNKNOWN_SCHEMA"),
            (topics.acks, "UNKNOWN_JOB"),
            (topics.declines, "WRONG_TOPIC"),
            (topics.acks, "KEY_MISMATCH"),
        } == by_topic
        originals = {letter.value for letter in letters}  # type: ignore[union-attr]
        assert set(garbage.values()) <= originals

    @pytest.mark.slow
    def test_20_000_hostile_latency_measurements_leave_metrics_under_1_mb(
        self,
        bootstrap: str,
        coordinator: CoordinatorProcess,
        make_job: Callable[..., Job],
        tmp_path: object,
    ) -> None:
        """Given 20,000 LatencyMeasured records of a running job, each of a histogram key of its own and
        with ids of the most bytes accepted, /metrics stays under 1 MB: the job keeps MAX_HISTOGRAMS
        histograms and counts the other measurements as dropped, the log says so in a line or two,
        and the job's checkpoints go on."""
        job = make_job(coordinator, 1)
        job.start(config(tmp_path))
        job.wait_for(lambda j: len(completions(j)) >= 1)
        producer = Producer(producer_config(bootstrap))
        source = "s" * MAX_LATENCY_ID_BYTES
        for i in range(20_000):
            measured = LatencyMarker(0, source, i).measured(job.id, 1, f"{i:0{MAX_LATENCY_ID_BYTES}}", i, 1)
            producer.produce(job.topics.acks, key=job.id.encode(), value=encode(measured))
            producer.poll(0)
        # then, in the same partition, a KEY_MISMATCH dead letter: once it is written, all are decided
        sentinel = encode(CheckpointAcknowledged(f"not-{job.id}", 1, 1, "t", 0))
        producer.produce(job.topics.acks, key=job.id.encode(), value=sentinel)
        assert 0 == producer.flush(30)

        def sentinel_letters() -> list[DeadLetter]:
            return [
                letter
                for m in read_to_end(bootstrap, job.topics.dead_letters)
                if m.value and isinstance(letter := decode(m.value), DeadLetter) and letter.value == sentinel
            ]

        eventually(sentinel_letters, bool, timeout=120, interval=0.5, what="the sentinel's dead letter")
        with urllib.request.urlopen(coordinator.url + "/metrics", timeout=60) as response:
            size = len(response.read())
        seen = len(completions(job.journal()))
        job.wait_for(lambda j: len(completions(j)) >= seen + 2)

        assert size < 1_000_000
        dropped = ("cutline_job_latency_measurements_dropped_total", (("job_id", job.id),))
        assert 20_000 - MAX_HISTOGRAMS == scrape(coordinator)[dropped]
        log = coordinator.log_path.read_text().splitlines()
        assert 1 <= len([line for line in log if "dropped" in line and job.id in line]) <= 4


@pytest.mark.slow
class TestRecovery:
    def test_sigkill_in_the_middle_of_a_checkpoint(
        self, own_coordinator: CoordinatorProcess, make_job: Callable[..., Job], tmp_path: object
    ) -> None:
        """Killed with SIGKILL while a checkpoint is pending and started again, the coordinator
        recovers: no id is reused, the pending checkpoint ends by the rules, and nothing completed
        is lost."""
        hold = {"checkpoint": 0}

        def slow(task: Task, barrier: CheckpointBarrier) -> None:
            if task.index == 0 and barrier.checkpoint_id == hold["checkpoint"]:
                time.sleep(2.0)

        job = make_job(own_coordinator, 3, slow=slow)
        job.start(config(tmp_path))
        before = job.wait_for(lambda j: len(completions(j)) >= 2)
        hold["checkpoint"] = max(trigger_ids(before)) + 2
        job.wait_for(lambda j: hold["checkpoint"] in trigger_ids(j))
        completed_before = [c.checkpoint_id for c in completions(job.journal())]

        own_coordinator.kill()
        own_coordinator.start()
        journal = job.wait_for(
            lambda j: max(c.checkpoint_id for c in completions(j)) > hold["checkpoint"] + 1
        )

        ids = trigger_ids(journal)
        assert sorted(set(ids)) == ids, "a checkpoint id was used twice"
        ended = {c.checkpoint_id for c in completions(journal)} | {
            e.checkpoint_id for e in journal if isinstance(e, CheckpointAborted)
        }
        assert hold["checkpoint"] in ended
        assert set(completed_before) <= {c.checkpoint_id for c in completions(journal)}
        assert first_violation(journal) is None

    def test_decided_input_is_committed_to_the_coordinator_s_group(
        self,
        bootstrap: str,
        own_coordinator: CoordinatorProcess,
        make_job: Callable[..., Job],
        tmp_path: object,
    ) -> None:
        """Inputs reach the coordinator a fetched batch at a time (coordinator/service/direct.py),
        outside Faust's streams; Faust still commits their offsets once decided: after the job
        finished, the group's committed offset of every job-status and acks partition is its end."""
        job = make_job(own_coordinator, 2)
        topics = job.topics
        job.start(config(tmp_path))
        job.wait_for(lambda j: len(completions(j)) >= 2)
        job.driver.status(JobStatus.FINISHED)
        job.wait_for(lambda j: any(isinstance(e, SchedulerStopped) for e in j))
        ends: dict[tuple[str, int], int] = {}
        for topic in (topics.job_status, topics.acks):
            for message in read_to_end(bootstrap, topic):
                ends[(topic, message.partition)] = message.offset + 1
        assert {topics.job_status, topics.acks} == {topic for topic, _ in ends}

        reader = Consumer(consumer_config(bootstrap, f"{topics.prefix}coordinator"))
        try:

            def committed() -> dict[tuple[str, int], int]:
                tps = reader.committed([TopicPartition(t, p) for t, p in ends], timeout=10)
                return {(tp.topic, tp.partition): tp.offset for tp in tps}

            eventually(  # Faust commits every 2.8 s
                committed,
                lambda offsets: ends == offsets,
                timeout=20,
                interval=0.5,
                what=f"the group's committed offsets to be the ends, {ends}",
            )
        finally:
            reader.close()

    def test_metrics_match_the_journal(
        self,
        bootstrap: str,
        own_coordinator: CoordinatorProcess,
        make_job: Callable[..., Job],
        tmp_path: object,
    ) -> None:
        """``/metrics`` in Prometheus' text format, scraped while the job checkpoints and after it
        finished: Flink's checkpoint metrics and the worker's counters say what the journal says."""
        job = make_job(own_coordinator, 2)
        topics = job.topics
        job.start(config(tmp_path))
        job.wait_for(lambda j: len(completions(j)) >= 2)
        running = scrape(own_coordinator)
        assert running[("cutline_job_numberOfCompletedCheckpoints", (("job_id", job.id),))] >= 2
        assert 1 == running[("cutline_job_isRunning", (("job_id", job.id),))]
        garbage = Producer(producer_config(bootstrap))
        garbage.produce(topics.acks, key=job.id.encode(), value=b"not an ack")
        garbage.flush(10)
        job.driver.status(JobStatus.FINISHED)
        journal = job.wait_for(lambda j: any(isinstance(e, SchedulerStopped) for e in j))
        letters = job.wait_for_dead_letters(1)

        def every_ack_decided() -> tuple[
            list[LogMessage], dict[tuple[str, tuple[tuple[str, str], ...]], float]
        ]:
            acks = list(read_to_end(bootstrap, topics.acks))
            metrics = scrape(own_coordinator)
            decided = metrics[("cutline_coordinator_inputs_decided_total", (("topic", topics.acks),))]
            assert len(acks) == decided, "acks on the topic, decided"
            return acks, metrics

        # A late ack may still be on its way to the coordinator.
        acks, metrics = eventually(every_ack_decided, timeout=15, interval=0.5, what="every ack decided")
        decided = metrics[("cutline_coordinator_inputs_decided_total", (("topic", topics.acks),))]

        label = (("job_id", job.id),)
        done = completions(journal)
        assert len(done) == metrics[("cutline_job_numberOfCompletedCheckpoints", label)]
        assert len(trigger_ids(journal)) == metrics[("cutline_job_totalNumberOfCheckpoints", label)]
        aborted = [e for e in journal if isinstance(e, CheckpointAborted)]
        assert len(aborted) == metrics[("cutline_job_numberOfFailedCheckpoints", label)]
        assert 0 == metrics[("cutline_job_numberOfInProgressCheckpoints", label)]
        assert done[-1].checkpoint_id == metrics[("cutline_job_lastCompletedCheckpointId", label)]
        assert done[-1].duration_ms == metrics[("cutline_job_lastCheckpointDuration", label)]
        assert 0 == metrics[("cutline_job_isRunning", label)]
        assert len(acks) == decided
        [letter] = letters
        assert 1 == metrics[("cutline_coordinator_dead_letters_total", (("reason", letter.reason),))]
        partition = str(next(m.partition for m in acks))
        assert 1 == metrics[("cutline_coordinator_partition_ready", (("partition", partition),))]
        assert metrics[("cutline_coordinator_partition_epoch", (("partition", partition),))] >= 1
        assert (
            0
            == metrics[("cutline_coordinator_input_lag", (("partition", partition), ("topic", topics.acks)))]
        )
        # The worker switched the automatic collector off and collects on a clock (one a second).
        assert metrics[("cutline_coordinator_gc_collections_total", ())] >= 1

    def test_replaying_the_journal_reproduces_the_table(
        self, coordinator: CoordinatorProcess, make_job: Callable[..., Job], tmp_path: object
    ) -> None:
        """Folding the journal topic gives exactly the state the running coordinator holds."""
        job = make_job(coordinator, 2)
        job.start(config(tmp_path))
        job.wait_for(lambda j: len(completions(j)) >= 3)
        job.driver.status(JobStatus.FINISHED)
        journal = job.wait_for(lambda j: any(isinstance(e, SchedulerStopped) for e in j))

        replayed = state_json(fold_jobs(journal)[job.id])
        assert replayed == coordinator.get(f"/jobs/{job.id}/state")

    def test_garbage_in_the_journal_does_not_stop_a_restart(
        self,
        bootstrap: str,
        own_coordinator: CoordinatorProcess,
        make_job: Callable[..., Job],
        tmp_path: object,
    ) -> None:
        """Bytes someone wrote into the journal topic by mistake are skipped (and logged) when the
        coordinator folds its journal at start; checkpoints go on."""
        job = make_job(own_coordinator, 1)
        job.start(config(tmp_path))
        job.wait_for(lambda j: len(completions(j)) >= 1)
        own_coordinator.stop()
        producer = Producer(producer_config(bootstrap))
        producer.produce(job.topics.checkpoints, key=job.id.encode(), value=b"not a journal event")
        producer.produce(
            job.topics.checkpoints,
            key=job.id.encode(),
            value=encode(CheckpointAcknowledged(job.id, 1, 1, "t", 0)),
        )
        producer.flush(10)
        seen = max(c.checkpoint_id for c in completions(job.journal()))

        own_coordinator.start()

        job.wait_for(lambda j: max(c.checkpoint_id for c in completions(j)) > seen)
        assert "skipped: frame starts with 6e6f" in own_coordinator.tail(200)
        assert "skipped: a CheckpointAcknowledged is not a journal event" in own_coordinator.tail(200)
