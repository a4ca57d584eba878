"""Every ``cutline`` command: its happy path and one bad input (a clear message, a non-zero exit).

The commands run as real processes (``python -m coordinator.cli``), against the
session's broker and one coordinator shared by the tests of this module.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from support import create_protocol_topics, eventually

from coordinator.service.supervisor import CoordinatorProcess
from events.dev.broker import create_topics, free_port, topic_config, wait_for_broker
from events.kafka.clients import consumer_config
from events.kafka.log import read_to_end
from events.task.participant import JobDriver, Participant
from events.wire.codec import decode
from events.wire.records import (
    CheckpointBarrier,
    CheckpointConfig,
    CheckpointKind,
    CheckpointTriggered,
    JobStatus,
)
from events.wire.topics import Topics

JOB = "cli-job"


def cutline(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "CUTLINE_BOOTSTRAP"}
    environment.update(env or {}, COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "coordinator.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )


@pytest.fixture(scope="module", name="prefix")
def _prefix() -> str:
    return f"cli{os.getpid()}."


@pytest.fixture(scope="module", name="service")
def _service(
    bootstrap: str, prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    """A coordinator with one running job of one participant task."""
    topics = Topics(prefix)
    create_protocol_topics(bootstrap, topics.prefix)
    process = CoordinatorProcess(bootstrap, prefix).start()
    location = f"file://{tmp_path_factory.mktemp('checkpoints')}"

    def snapshot(barrier: CheckpointBarrier) -> bytes:
        return b"state"

    participant = Participant(bootstrap, JOB, "t0", 1, topics, snapshot, lambda: {"in:0": 1})
    participant.run_in_thread()
    with JobDriver(bootstrap, JOB, topics) as driver:
        driver.running(["t0"], CheckpointConfig(interval_ms=500, location=location), attempt=1)
    eventually(
        lambda: process.get(f"/jobs/{JOB}/checkpoints").get("counts", {}),
        lambda counts: counts.get("completed", 0) >= 1,
        what="a completed checkpoint",
    )
    yield process
    participant.close()
    process.stop()


def a_job(bootstrap: str, prefix: str, service: CoordinatorProcess, job_id: str, root: Path) -> JobDriver:
    """A RUNNING job of one task that never answers (its first checkpoint stays pending), once the
    coordinator knows it; the caller closes its driver."""
    driver = JobDriver(bootstrap, job_id, Topics(prefix))
    driver.running(["t0"], CheckpointConfig(interval_ms=60_000, location=root.as_uri()), attempt=1)
    eventually(lambda: job_status(service, job_id) == "RUNNING", what=f"job {job_id!r} RUNNING")
    return driver


def job_status(service: CoordinatorProcess, job_id: str) -> str | None:
    """The job's status in the coordinator's /jobs, None while it does not list the job."""
    return next((job["status"] for job in service.get("/jobs")["jobs"] if job["id"] == job_id), None)


def topic_names(bootstrap: str) -> set[str]:
    consumer = Consumer(consumer_config(bootstrap))
    try:
        return set(consumer.list_topics(timeout=10).topics)
    finally:
        consumer.close()


@pytest.mark.tansu
class TestBroker:
    """`cutline broker`: the embedded Tansu broker (`--kafka`'s Apache Kafka: test_apache_kafka.py)."""

    def test_runs_until_interrupted(self) -> None:
        """`cutline broker --port N` prints its bootstrap address, serves Kafka, and stops on Ctrl-C."""
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "coordinator.cli", "broker", "--port", str(port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert f"bootstrap: 127.0.0.1:{port}" == line.strip()
            assert wait_for_broker(f"127.0.0.1:{port}", timeout=10)
        finally:
            process.send_signal(signal.SIGINT)
            assert 0 == process.wait(20)

    def test_a_taken_port_is_a_clear_error(self, bootstrap: str) -> None:
        """A port another broker holds fails with a message and exit code 2."""
        port = bootstrap.rsplit(":", 1)[1]
        if os.environ.get("CUTLINE_BOOTSTRAP"):
            pytest.skip(reason="needs the embedded broker; CUTLINE_BOOTSTRAP points elsewhere")

        result = cutline("broker", "--port", port)

        assert 2 == result.returncode
        assert "did not start" in result.stderr


class TestTopics:
    def test_create_is_idempotent(self, bootstrap: str) -> None:
        """`topics create` creates every topic (the journal kept for ever, the snapshots compacted),
        and a second run finds them all."""
        prefix = f"topics{os.getpid()}."

        first = cutline("topics", "create", "--bootstrap", bootstrap, "--topic-prefix", prefix)
        second = cutline("topics", "create", "--bootstrap", bootstrap, "--topic-prefix", prefix)

        assert 0 == first.returncode, first.stderr
        assert 9 == first.stdout.count("created")
        assert 9 == second.stdout.count("exists")
        assert "-1" == topic_config(bootstrap, Topics(prefix).checkpoints)["retention.ms"]
        assert "compact" == topic_config(bootstrap, Topics(prefix).snapshots)["cleanup.policy"]

    def test_the_partition_count_may_come_from_the_environment(self, bootstrap: str) -> None:
        """`CUTLINE_PARTITIONS=3` and no `--partitions`: a new prefix's topics get 3 partitions."""
        prefix = f"env{os.getpid()}."

        result = cutline(
            "topics",
            "create",
            "--bootstrap",
            bootstrap,
            "--topic-prefix",
            prefix,
            env={"CUTLINE_PARTITIONS": "3"},
        )

        assert 0 == result.returncode, result.stderr
        assert 9 == result.stdout.count("(3 partitions)")

    def test_missing_topics_get_the_count_of_the_existing_ones(self, bootstrap: str) -> None:
        """Topics made earlier with 2 partitions, then `topics create --partitions 4`: the missing ones
        are made with 2 as well, and it says so (a prefix has one count)."""
        prefix = f"some{os.getpid()}."
        create_topics(bootstrap, [Topics(prefix).acks, Topics(prefix).checkpoints], partitions=2)

        result = cutline(
            "topics", "create", "--bootstrap", bootstrap, "--topic-prefix", prefix, "--partitions", "4"
        )

        assert 0 == result.returncode, result.stderr
        assert f"exists   {Topics(prefix).acks}  (2 partitions)" in result.stdout
        assert f"created  {Topics(prefix).barriers}  (2 partitions)" in result.stdout
        assert "the missing ones get 2 too" in result.stderr

    def test_existing_topics_of_different_counts_are_refused(self, bootstrap: str) -> None:
        """Existing topics of 2 and 3 partitions: it creates nothing, and says the counts differ and
        what to do."""
        prefix = f"mixed{os.getpid()}."
        create_topics(bootstrap, [Topics(prefix).acks], partitions=2)
        create_topics(bootstrap, [Topics(prefix).checkpoints], partitions=3)

        result = cutline("topics", "create", "--bootstrap", bootstrap, "--topic-prefix", prefix)

        assert 2 == result.returncode
        assert "different partition counts (2 partitions: " in result.stderr
        assert "--topic-prefix <new prefix>" in result.stderr
        assert "created" not in result.stdout

    def test_without_a_cluster(self) -> None:
        """Without --bootstrap or CUTLINE_BOOTSTRAP it says how to give one."""
        result = cutline("topics", "create")

        assert 2 == result.returncode
        assert "--bootstrap HOST:PORT" in result.stderr

    def test_an_unreachable_cluster(self) -> None:
        """A bootstrap address where nothing answers is reported, not hung on."""
        result = cutline("topics", "create", "--bootstrap", f"127.0.0.1:{free_port()}")

        assert 2 == result.returncode
        assert "no Kafka broker answers" in result.stderr


class TestCoordinator:
    def test_serves_its_views(self, service: CoordinatorProcess) -> None:
        """`cutline coordinator` (started by the fixture) recovers and serves /jobs."""
        jobs = {job["id"]: job for job in service.get("/jobs")["jobs"]}
        assert ("RUNNING", 1) == (jobs[JOB]["status"], jobs[JOB]["attempt"])

    def test_without_a_cluster(self) -> None:
        """Without a cluster it refuses to start and says how to give one."""
        result = cutline("coordinator")

        assert 2 == result.returncode
        assert "cutline broker" in result.stderr

    def test_on_a_web_port_in_use(self, bootstrap: str, prefix: str) -> None:
        """A second worker on a machine with the first one's web port: refused at once, saying to pass
        --web-port (Faust would fail later with a traceback)."""
        port = free_port()
        with socket.create_server(("127.0.0.1", port)):
            result = cutline(
                "coordinator", "--bootstrap", bootstrap, "--topic-prefix", prefix, "--web-port", str(port)
            )

        assert 2 == result.returncode
        assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
        assert "--web-port" in result.stderr
        assert "Traceback" not in result.stderr


class TestStatus:
    def test_prints_the_statistics(self, service: CoordinatorProcess) -> None:
        """`cutline status JOB` prints counts, history and configuration."""
        result = cutline("status", JOB, "--url", service.url)

        assert 0 == result.returncode, result.stderr
        assert f"checkpoints of {JOB}" in result.stdout
        assert "COMPLETED" in result.stdout
        assert re.search(r"interval\s+\S?\s*500", result.stdout)

    def test_an_unknown_job(self, service: CoordinatorProcess) -> None:
        """An unknown job id says so and how to list the known ones."""
        result = cutline("status", "no-such-job", "--url", service.url)

        assert 2 == result.returncode
        assert "knows no job 'no-such-job'" in result.stderr

    def test_no_coordinator(self) -> None:
        """No coordinator at the URL says how to start one."""
        result = cutline("status", JOB, "--url", f"http://127.0.0.1:{free_port()}")

        assert 2 == result.returncode
        assert "cutline coordinator" in result.stderr

    def test_a_job_id_with_a_space_and_a_non_ascii_letter(
        self, bootstrap: str, prefix: str, service: CoordinatorProcess, tmp_path: Path
    ) -> None:
        """A job id the coordinator and the dashboard accept, `zürich orders`: its statistics, as for
        any other job (the id is URL-quoted, not sent raw)."""
        with a_job(bootstrap, prefix, service, "zürich orders", tmp_path):
            result = cutline("status", "zürich orders", "--url", service.url)

        assert 0 == result.returncode, result.stderr
        assert "checkpoints of zürich orders" in result.stdout


class TestList:
    def test_a_table_of_the_jobs_and_their_status(self, service: CoordinatorProcess) -> None:
        """`cutline list` prints every job the coordinator group knows, with its status."""
        result = cutline("list", "--url", service.url)

        assert 0 == result.returncode, result.stderr
        row = next(line for line in result.stdout.splitlines() if f" {JOB} " in line)
        assert "RUNNING" in row

    def test_json_lines(self, service: CoordinatorProcess) -> None:
        """`cutline list --json`: one JSON object per job, with its status, attempt, checkpoint counts
        and the worker that owns it."""
        result = cutline("list", "--url", service.url, "--json")

        assert 0 == result.returncode, result.stderr
        jobs = {job["id"]: job for job in map(json.loads, result.stdout.splitlines())}
        assert ("RUNNING", 1) == (jobs[JOB]["status"], jobs[JOB]["attempt"])
        assert jobs[JOB]["counts"]["completed"] >= 1
        assert jobs[JOB]["owner"].endswith(f":{service.web_port}")

    def test_no_coordinator(self) -> None:
        """No coordinator at the URL says how to start one."""
        result = cutline("list", "--url", f"http://127.0.0.1:{free_port()}")

        assert 2 == result.returncode
        assert "cutline coordinator" in result.stderr


def kafka_args(bootstrap: str, prefix: str) -> tuple[str, ...]:
    return ("--bootstrap", bootstrap, "--topic-prefix", prefix)


class TestTrigger:
    def test_a_checkpoint_is_reported_triggered_then_completed(
        self, bootstrap: str, prefix: str, service: CoordinatorProcess
    ) -> None:
        """`cutline trigger JOB` waits for the checkpoint it asked for: it names its id when it is
        triggered and exits 0 when it completed."""
        result = cutline("trigger", JOB, *kafka_args(bootstrap, prefix))

        assert 0 == result.returncode, result.stdout + result.stderr
        triggered = re.search(r"checkpoint (\d+) triggered", result.stdout)
        assert triggered is not None, result.stdout
        assert f"checkpoint {triggered.group(1)} completed at file://" in result.stdout

    def test_a_savepoint_on_request(
        self, bootstrap: str, prefix: str, service: CoordinatorProcess, tmp_path: Path
    ) -> None:
        """`cutline trigger JOB --savepoint DIR` leads to a savepoint into DIR: it names the savepoint
        when it is triggered and says where it completed."""
        result = cutline("trigger", JOB, "--savepoint", str(tmp_path), *kafka_args(bootstrap, prefix))

        assert 0 == result.returncode, result.stdout + result.stderr
        triggered = re.search(r"savepoint (\d+) triggered into (\S+)", result.stdout)
        assert triggered is not None, result.stdout
        journal = [decode(m.value) for m in read_to_end(bootstrap, Topics(prefix).checkpoints) if m.value]
        savepoint = next(
            e
            for e in journal
            if isinstance(e, CheckpointTriggered) and e.checkpoint_id == int(triggered.group(1))
        )
        assert (CheckpointKind.SAVEPOINT, savepoint.location) == (savepoint.kind, triggered.group(2))
        assert savepoint.location.startswith(tmp_path.as_uri())
        assert f"savepoint {savepoint.checkpoint_id} completed at {savepoint.location}" in result.stdout

    def test_an_unknown_job_is_refused(
        self, bootstrap: str, prefix: str, service: CoordinatorProcess
    ) -> None:
        """A job that never reported a status: the coordinator's refusal (a dead letter) is the
        command's answer, with its reason and message, and exit code 1."""
        result = cutline("trigger", "nobody", *kafka_args(bootstrap, prefix), timeout=30)

        assert 1 == result.returncode, result.stdout + result.stderr
        assert "refused (UNKNOWN_JOB)" in result.stdout
        assert "no job status was ever reported for job 'nobody'" in result.stdout

    def test_a_savepoint_outside_the_allowed_directories_is_refused(
        self, bootstrap: str, prefix: str, service: CoordinatorProcess
    ) -> None:
        """A savepoint target the coordinator does not allow: its journaled refusal, exit code 1."""
        target = f"/cutline-nowhere-{os.getpid()}/savepoints"

        result = cutline("trigger", JOB, "--savepoint", target, *kafka_args(bootstrap, prefix), timeout=30)

        assert 1 == result.returncode, result.stdout + result.stderr
        assert "savepoint of cli-job refused (SAVEPOINT_TARGET_NOT_ALLOWED)" in result.stdout
        assert "--savepoint-root" in result.stdout

    def test_no_wait_only_sends_the_request(
        self, bootstrap: str, prefix: str, service: CoordinatorProcess
    ) -> None:
        """`--no-wait`: fire and forget; it says what it sent and exits 0, refused or not."""
        result = cutline("trigger", "nobody", "--no-wait", *kafka_args(bootstrap, prefix))

        assert 0 == result.returncode, result.stdout + result.stderr
        assert "requested checkpoint of nobody (request " in result.stdout

    def test_without_a_cluster(self) -> None:
        """Without a cluster it says how to give one."""
        result = cutline("trigger", JOB)

        assert 2 == result.returncode
        assert "--bootstrap" in result.stderr


class TestStopAndCancel:
    """Their happy paths and failed savepoints: tests/integration/test_stop_with_savepoint.py."""

    @pytest.mark.parametrize("command", ["stop", "cancel"])
    def test_an_unknown_job_is_refused_at_once(
        self, bootstrap: str, prefix: str, service: CoordinatorProcess, command: str
    ) -> None:
        """`stop`/`cancel` of a job that never reported a status answer with the coordinator's refusal
        within seconds (not after their 120 s/60 s timeouts), exit code 1."""
        started = time.monotonic()

        result = cutline(command, "nobody", *kafka_args(bootstrap, prefix), timeout=30)

        assert 1 == result.returncode, result.stdout + result.stderr
        assert f"{command} refused (UNKNOWN_JOB)" in result.stdout
        assert time.monotonic() - started < 20

    def test_a_repeated_cancel_of_a_canceled_job_answers_at_once(
        self, bootstrap: str, prefix: str, service: CoordinatorProcess, tmp_path: Path
    ) -> None:
        """A job that has ended CANCELED: another `cancel` says so at once and exits 0 (the coordinator
        journals nothing for it)."""
        with a_job(bootstrap, prefix, service, "canceled-job", tmp_path) as driver:
            driver.status(JobStatus.CANCELED)
            eventually(lambda: job_status(service, "canceled-job") == "CANCELED", what="the job CANCELED")

        result = cutline("cancel", "canceled-job", *kafka_args(bootstrap, prefix), timeout=30)

        assert 0 == result.returncode, result.stdout + result.stderr
        assert "job canceled-job has already ended: CANCELED" in result.stdout

    def test_cancel_of_a_finished_job_is_refused(
        self, bootstrap: str, prefix: str, service: CoordinatorProcess, tmp_path: Path
    ) -> None:
        """A job that has ended FINISHED cannot be canceled: it says so at once and exits 1."""
        with a_job(bootstrap, prefix, service, "finished-job", tmp_path) as driver:
            driver.status(JobStatus.FINISHED)
            eventually(lambda: job_status(service, "finished-job") == "FINISHED", what="the job FINISHED")

        result = cutline("cancel", "finished-job", *kafka_args(bootstrap, prefix), timeout=30)

        assert 1 == result.returncode, result.stdout + result.stderr
        assert "job finished-job has already ended: FINISHED" in result.stdout


class TestMissingTopics:
    @pytest.mark.parametrize(
        "command",
        [
            ("trigger", JOB),
            ("trigger", JOB, "--no-wait"),
            ("trigger", JOB, "--savepoint", "/tmp/savepoints"),
            ("stop", JOB),
            ("cancel", JOB),
            ("savepoints", "list", JOB),
        ],
        ids=" ".join,
    )
    def test_a_wrong_topic_prefix(
        self, bootstrap: str, service: CoordinatorProcess, command: tuple[str, ...]
    ) -> None:
        """A prefix whose topics do not exist: one line saying that they are missing and what to do,
        no traceback, exit code 2; and no stray topic is created on the way."""
        prefix = f"nope{os.getpid()}."

        result = cutline(*command, "--bootstrap", bootstrap, "--topic-prefix", prefix, timeout=30)

        assert 2 == result.returncode, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        assert 1 == len(result.stderr.strip().splitlines()), result.stderr
        assert f"no topic {prefix}" in result.stderr
        assert "`cutline topics create" in result.stderr and "--topic-prefix" in result.stderr
        assert not {name for name in topic_names(bootstrap) if name.startswith(prefix)}


class TestTail:
    def test_prints_decoded_events(self, bootstrap: str, prefix: str, service: CoordinatorProcess) -> None:
        """`cutline tail checkpoints --from-beginning` prints decoded journal events, the workers'
        claims of the journal's partitions among them."""
        result = cutline(
            "tail",
            "checkpoints",
            "--from-beginning",
            "--count",
            "12",
            "--bootstrap",
            bootstrap,
            "--topic-prefix",
            prefix,
        )

        assert 0 == result.returncode, result.stderr
        assert "SchedulerStarted" in result.stdout
        assert "CoordinatorClaimed" in result.stdout
        assert 12 == len(result.stdout.strip().splitlines())

    def test_json_lines_for_any_tool(self, bootstrap: str, prefix: str, service: CoordinatorProcess) -> None:
        """`cutline tail checkpoints --json`: one JSON object per message with its place, key,
        headers (the epoch among them) and the decoded record."""
        result = cutline(
            "tail", "checkpoints", "--from-beginning", "--count", "40", "--idle", "10", "--json",
            "--bootstrap", bootstrap, "--topic-prefix", prefix,
        )  # fmt: skip

        assert 0 == result.returncode, result.stderr
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        # 40 messages: the claims of the partitions, each job's partition from its claim on
        assert 40 == len(lines)
        assert all(line["topic"] == Topics(prefix).checkpoints for line in lines)
        claim = next(line for line in lines if line["type"] == "CoordinatorClaimed")
        assert claim["record"]["epoch"] >= 1 and "cutline.epoch" in claim["headers"]
        # other tests of the module run jobs of their own: the first 40 may start with any of them
        started = [line for line in lines if line["type"] == "SchedulerStarted"]
        assert started and all(line["key"] == line["record"]["job_id"] for line in started)

    def test_an_unknown_topic(self, bootstrap: str, prefix: str) -> None:
        """An unknown topic lists cutline's topics."""
        result = cutline(
            "tail", "nonsense", "--bootstrap", bootstrap, "--topic-prefix", prefix, "--idle", "1"
        )

        assert 2 == result.returncode
        assert "dead-letters" in result.stderr


class TestReplayFromKafka:
    def test_folds_and_verifies_the_journal_topic(
        self, bootstrap: str, prefix: str, service: CoordinatorProcess
    ) -> None:
        """`cutline replay --bootstrap ... --verify` folds the journal topic and finds no violation."""
        result = cutline(
            "replay", "--bootstrap", bootstrap, "--topic-prefix", prefix, "--job", JOB, "--verify", "--quiet"
        )

        assert 0 == result.returncode, result.stderr + result.stdout
        assert "verified:" in result.stdout
        assert f"{Topics(prefix).checkpoints} at {bootstrap}" in result.stdout

    def test_an_unknown_job(self, bootstrap: str, prefix: str, service: CoordinatorProcess) -> None:
        """A job with no events in the journal topic names the jobs it has."""
        result = cutline(
            "replay", "--bootstrap", bootstrap, "--topic-prefix", prefix, "--job", "nobody", "--quiet"
        )

        assert 2 == result.returncode
        assert JOB in result.stderr


class TestDemo:
    def test_too_short_a_duration(self) -> None:
        """A duration under 10 s is refused before anything starts (the happy path: tests/e2e)."""
        result = cutline("demo", "--duration", "3")

        assert 2 == result.returncode
        assert "--duration" in result.stderr
