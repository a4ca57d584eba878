"""The wire settings are chosen by a process's caller; the environment is read only on request."""

from __future__ import annotations

import pytest

from events.wire.codec import codec_for, default_codec, process_wire, use_wire
from events.wire.schema_registry import wire_environment, wire_from_environment
from events.wire.wire_settings import WireFormatError, WireSettings


def test_the_default_is_single_object_framing_whatever_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUTLINE_WIRE_FORMAT", "confluent")
    monkeypatch.setenv("CUTLINE_SCHEMA_REGISTRY_URL", "http://registry:8081")

    assert WireSettings() == process_wire()
    assert default_codec().confluent is None


def test_a_caller_sets_the_process_codec_and_can_set_it_back() -> None:
    chosen = WireSettings("http://registry:8081", "single-object")
    before = process_wire()
    use_wire(chosen)
    try:
        assert chosen == process_wire()
        assert default_codec() is codec_for(chosen)
        assert default_codec().confluent is not None  # reads Confluent frames, writes single-object
    finally:
        use_wire(before)
    assert default_codec().confluent is None


def test_the_confluent_format_needs_a_registry_and_says_which_option_to_pass() -> None:
    with pytest.raises(WireFormatError, match="--schema-registry URL"):
        WireSettings(None, "confluent")
    with pytest.raises(WireFormatError, match="single-object, confluent"):
        WireSettings(None, "protobuf")


def test_the_environment_round_trips_for_the_processes_a_command_starts() -> None:
    wire = WireSettings("http://registry:8081", "confluent")

    assert wire == wire_from_environment(wire_environment(wire))
    assert WireSettings() == wire_from_environment({})


def test_a_bad_environment_names_the_variables() -> None:
    with pytest.raises(WireFormatError, match="CUTLINE_WIRE_FORMAT=confluent"):
        wire_from_environment({"CUTLINE_WIRE_FORMAT": "confluent"})
