"""``cutline tail``'s lines for a record carrying inline state: its bytes are counted on the line,
and given whole (base64) in ``--json``."""

from __future__ import annotations

import base64
import hashlib

from coordinator.timeline import describe_record, record_json
from events.wire.codec import Codec
from events.wire.records import CheckpointAcknowledged, StateHandle

CODEC = Codec()
STATE = bytes(range(256)) * 80  # 20 KiB, the size Flink's default memory threshold allows
ACK = CheckpointAcknowledged(
    "job-1",
    7,
    1,
    "t0",
    1_767_225_600_000,
    StateHandle("file:///c/job-1/chk-7/t0", len(STATE), hashlib.sha256(STATE).hexdigest(), STATE),
    {"in:0": 42},
)


def test_a_line_shows_how_many_bytes_ride_inline_not_the_bytes() -> None:
    line = describe_record(CODEC, 0, 12, CODEC.encode(ACK)).plain

    assert "'inline': <20480 bytes>" in line
    assert len(line) < 600


def test_json_carries_the_inline_bytes_whole() -> None:
    body = record_json(CODEC, "cutline.acks", 0, 12, b"job-1", CODEC.encode(ACK))

    record = body["record"]
    assert isinstance(record, dict)
    assert STATE == base64.b64decode(record["state"]["inline"])


class TestVoidEpochs:
    """``cutline tail`` marks a record whose epoch cannot be read as void, and says why."""

    def test_a_line_with_two_epoch_headers_is_marked_void(self) -> None:
        """Given two ``cutline.epoch`` headers, the line says VOID and that there are two."""
        line = describe_record(
            CODEC, 0, 12, CODEC.encode(ACK), [("cutline.epoch", b"1"), ("cutline.epoch", b"2")]
        ).plain

        assert "VOID: 2 cutline.epoch headers (b'1', b'2')" in line

    def test_a_line_with_a_malformed_epoch_is_marked_void(self) -> None:
        """Given an epoch header that is not ASCII digits, the line says VOID and why."""
        line = describe_record(CODEC, 0, 12, CODEC.encode(ACK), [("cutline.epoch", "²".encode())]).plain

        assert "VOID: a malformed cutline.epoch header" in line

    def test_a_line_with_one_epoch_header_is_not_marked(self) -> None:
        """A well-formed epoch, or none, marks nothing."""
        for headers in ([("cutline.epoch", b"3")], [], None):
            assert "VOID" not in describe_record(CODEC, 0, 12, CODEC.encode(ACK), headers).plain

    def test_json_says_why_a_record_is_void(self) -> None:
        """``--json`` carries ``void`` with the reason, only for a void record."""
        void = record_json(CODEC, "t", 0, 12, b"job-1", CODEC.encode(ACK), [("cutline.epoch", b"")])
        valid = record_json(CODEC, "t", 0, 12, b"job-1", CODEC.encode(ACK), [("cutline.epoch", b"1")])

        assert ("an empty cutline.epoch header", None) == (void["void"], valid.get("void"))
