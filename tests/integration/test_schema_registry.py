"""The Confluent Schema Registry wire format, against a registry **stub** that speaks the part of
the REST API confluent-kafka's client uses (register a schema under a subject, fetch a schema by
id). No registry server can be installed here: Confluent's needs Maven artifacts (no Maven here)
and Karapace is not on PyPI; docs/wire-format.md says so.

The coordinator runs as a real process writing Confluent frames; the job's status arrives in
single-object encoding, so it reads both."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from confluent_kafka import Producer
from support import create_protocol_topics, eventually

from coordinator.service.supervisor import CoordinatorProcess
from events.kafka.clients import producer_config
from events.kafka.log import read_journal_topic, read_to_end
from events.task.participant import Participant
from events.wire.codec import Codec, UnknownSchemaId, default_codec, process_wire, use_wire
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointConfig,
    JobStatus,
    JobStatusChanged,
)
from events.wire.schema_registry import RegistryFraming, wire_environment
from events.wire.topics import Topics
from events.wire.wire_settings import WireSettings

JOB = "registry-job"


class RegistryStub(ThreadingHTTPServer):
    """POST /subjects/{subject}/versions and GET /schemas/ids/{id}, in memory."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.schemas: list[str] = []
        self.subjects: dict[str, set[int]] = {}
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: RegistryStub

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        match = re.fullmatch(r"/subjects/([^/?]+)/versions(\?.*)?", self.path)
        if match is None:
            return self._answer(404, {"error_code": 404, "message": f"no route {self.path}"})
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            if body["schema"] not in self.server.schemas:
                self.server.schemas.append(body["schema"])
            schema_id = self.server.schemas.index(body["schema"]) + 1
            self.server.subjects.setdefault(match.group(1), set()).add(schema_id)
        return self._answer(200, {"id": schema_id})

    def do_GET(self) -> None:  # noqa: N802
        match = re.fullmatch(r"/schemas/ids/(\d+)(\?.*)?", self.path)
        schema_id = int(match.group(1)) if match else 0
        with self.server.lock:
            if not 0 < schema_id <= len(self.server.schemas):
                return self._answer(404, {"error_code": 40403, "message": "Schema not found"})
            return self._answer(200, {"schema": self.server.schemas[schema_id - 1]})

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture(name="registry")
def _registry() -> Iterator[RegistryStub]:
    server = RegistryStub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


ACK = CheckpointAcknowledged(JOB, 3, 1, "task-0", 1_000, offsets={"in:0": 7})


def test_a_record_round_trips_through_the_registry(registry: RegistryStub) -> None:
    writer = Codec(confluent=RegistryFraming(registry.url, writes=True))
    reader = Codec(confluent=RegistryFraming(registry.url, writes=False))

    frame = writer.encode(ACK, "p.acks")

    assert b"\x00" == frame[:1] and 1 == int.from_bytes(frame[1:5], "big")
    assert ACK == reader.decode(frame)
    assert {"p.acks-cutline.CheckpointAcknowledged": {1}} == registry.subjects
    assert ACK == reader.decode(Codec().encode(ACK))  # single-object frames still decode
    with pytest.raises(UnknownSchemaId, match="no schema 99"):
        reader.decode(b"\x00" + (99).to_bytes(4, "big") + frame[5:])


@pytest.fixture(name="confluent_environment")
def _confluent_environment(registry: RegistryStub, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process (its caller's settings) and the processes it starts (the variables the
    ``cutline`` command exports) write Confluent frames through the stub."""
    wire = WireSettings(registry.url, "confluent")
    for name, value in wire_environment(wire).items():
        monkeypatch.setenv(name, value)
    before = process_wire()
    use_wire(wire)
    try:
        yield
    finally:
        use_wire(before)
        monkeypatch.undo()


@pytest.mark.slow
def test_a_job_checkpoints_with_confluent_frames_and_tail_shows_them(
    bootstrap: str, topic_prefix: str, tmp_path: Path, registry: RegistryStub, confluent_environment: None
) -> None:
    topics = Topics(topic_prefix)
    create_protocol_topics(bootstrap, topics.prefix)
    participant = Participant(bootstrap, JOB, "task-0", 1, topics, lambda b: b"state", lambda: {"in:0": 1})
    participant.run_in_thread()
    config = CheckpointConfig(interval_ms=300, location=f"file://{tmp_path}/checkpoints")
    running = JobStatusChanged(JOB, JobStatus.RUNNING, int(time.time() * 1000), 1, ("task-0",), config)
    producer = Producer(producer_config(bootstrap))
    producer.produce(topics.job_status, key=JOB.encode(), value=Codec().encode(running))  # single-object
    producer.flush(10)
    try:
        with CoordinatorProcess(bootstrap, topic_prefix):
            eventually(
                lambda: any(
                    isinstance(e, CheckpointCompleted)
                    for e, _ in read_journal_topic(bootstrap, topics.checkpoints, _skip)
                ),
                timeout=60,
                interval=0.3,
                what="a completed checkpoint",
            )
    finally:
        participant.close()

    journal = [m.value for m in read_to_end(bootstrap, topics.checkpoints) if m.value]
    barriers = [m.value for m in read_to_end(bootstrap, topics.barriers) if m.value]
    acks = [m.value for m in read_to_end(bootstrap, topics.acks) if m.value]
    assert all(value[:1] == b"\x00" for value in journal + barriers + acks)
    assert {
        f"{topics.checkpoints}-cutline.CheckpointTriggered",
        f"{topics.checkpoints}-cutline.CheckpointCompleted",
        f"{topics.barriers}-cutline.CheckpointBarrier",
        f"{topics.acks}-cutline.CheckpointAcknowledged",
    } <= set(registry.subjects)
    assert isinstance(default_codec().decode(barriers[0]), CheckpointBarrier)

    environment = {k: v for k, v in os.environ.items() if not k.startswith("CUTLINE_")}
    tail = [sys.executable, "-m", "coordinator.cli", "--schema-registry", registry.url, "tail", "checkpoints"]
    shown = subprocess.run(
        [*tail, "--from-beginning", "--json", "--count", "4", "--bootstrap", bootstrap, "--topic-prefix",
         topic_prefix],
        capture_output=True, text=True, timeout=60, env=environment,
    )  # fmt: skip
    without = subprocess.run(
        [*tail[:3], *tail[5:], "--from-beginning", "--json", "--count", "1", "--bootstrap", bootstrap,
         "--topic-prefix", topic_prefix],
        capture_output=True, text=True, timeout=60, env=environment,
    )  # fmt: skip

    assert 0 == shown.returncode, shown.stderr
    assert all(json.loads(line)["type"] for line in shown.stdout.splitlines())
    assert "pass --schema-registry" in json.loads(without.stdout.splitlines()[0])["error"]


def _skip(message: object, problem: str) -> None:
    pass
