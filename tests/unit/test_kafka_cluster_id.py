"""The cluster id :class:`events.dev.apache_kafka.ApacheKafka` formats its nodes' storage with."""

from __future__ import annotations

import base64
import uuid

import pytest

from events.dev import apache_kafka


def test_a_cluster_id_that_would_start_with_a_dash_is_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """``StorageTool format -t -Xyz...`` takes the id for an option and fails, so an id starting with
    ``-`` (one draw in 64) is never used, as Kafka's own ``Uuid.randomUuid`` draws again."""
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=bytes(16))])
    monkeypatch.setattr(apache_kafka.uuid, "uuid4", lambda: next(draws))

    cluster_id = apache_kafka.new_cluster_id()

    assert "A" * 22 == cluster_id
    assert base64.urlsafe_b64encode(b"\xf8" + bytes(15)).decode().startswith("-")  # what was skipped
