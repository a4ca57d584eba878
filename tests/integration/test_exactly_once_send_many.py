"""``ExactlyOnceSink.send_many`` (docs/exactly-once.md, "Sending in batches"), on Apache Kafka: a batch
is kept and sent as its records sent one by one would be (in order, in the staged copy that recovery
reads, into the transaction sent ahead, committed once), and is refused whole when it does not fit.

The sink, its checkpoints and its output topic are made as in test_exactly_once_send_ahead.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Consumer
from support import on_apache_kafka
from test_exactly_once_send_ahead import (  # noqa: F401 (_output and _sinks: the fixtures output and sinks)
    _output,
    _sinks,
    barrier,
    completion,
    recovered_sink,
)

from events.kafka.clients import consumer_config, read_partition_to_end
from events.task.exactly_once import BufferFull, ExactlyOnceSink, OutputRecord, decode_staged
from events.task.storage import read_bytes

pytestmark = pytest.mark.skipif(
    not on_apache_kafka(), reason="Tansu shows aborted transactions to read_committed readers"
)


def read(bootstrap: str, topic: str, isolation: str) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of each record a reader of ``topic`` (one partition) sees to its end at
    ``isolation``; read_committed waits for a transaction still open to end."""
    consumer = Consumer(consumer_config(bootstrap, extra={"isolation.level": isolation}))
    try:
        return [(m.key(), m.value()) for m in read_partition_to_end(consumer, topic, 0, timeout=90)]
    finally:
        consumer.close()


def test_a_batch_is_staged_sent_ahead_and_committed_once_in_order_with_single_sends(
    bootstrap: str, topic_prefix: str, output: str, tmp_path: Path, sinks: list[ExactlyOnceSink]
) -> None:
    # given: a sink that sent one record, then a batch of three with keys, then one more
    sink = recovered_sink(bootstrap, topic_prefix, sinks)
    sink.send(output, b"a", b"k0")
    assert 3 == sink.send_many(output, [b"b", b"c", None], [b"k1", None, b"k3"])
    sink.send(output, b"e")
    # when: checkpoint 1's barrier stages them
    staged = sink.stage(barrier(1, tmp_path))
    # then: the staged copy, as recovery reads it, holds the five in order, keys and nulls kept
    expected = [(b"k0", b"a"), (b"k1", b"b"), (None, b"c"), (b"k3", None), (None, b"e")]
    records = decode_staged(read_bytes(staged.uri), staged.uri).records
    assert [OutputRecord(output, v, k) for k, v in expected] == list(records)
    # and they are at the broker, in the transaction sent ahead, not committed
    assert expected == read(bootstrap, output, "read_uncommitted")
    # when: the journal completes checkpoint 1
    sink.complete(completion(1, tmp_path))
    sink.wait_for_commits()
    # then: each is visible once, in order; none was sent twice
    assert expected == read(bootstrap, output, "read_committed")
    assert expected == read(bootstrap, output, "read_uncommitted")
    assert [1] == sink.committed


def test_a_batch_sent_while_a_commit_runs_goes_into_the_next_transaction(
    bootstrap: str, topic_prefix: str, output: str, tmp_path: Path, sinks: list[ExactlyOnceSink]
) -> None:
    # given: a sink with checkpoint 1 staged and completed, and a batch sent right after the completion
    sink = recovered_sink(bootstrap, topic_prefix, sinks)
    sink.send_many(output, [b"a", b"b"])
    sink.stage(barrier(1, tmp_path))
    sink.complete(completion(1, tmp_path))
    sink.send_many(output, [b"c", b"d"])
    sink.wait_for_commits()
    # when: checkpoint 2 is staged and completed
    sink.send_many(output, [b"e"])
    sink.stage(barrier(2, tmp_path))
    sink.complete(completion(2, tmp_path))
    sink.wait_for_commits()
    # then: every record visible once, in order
    expected = [(None, v) for v in (b"a", b"b", b"c", b"d", b"e")]
    assert expected == read(bootstrap, output, "read_committed")
    assert [1, 2] == sink.committed


def test_a_batch_past_the_bound_is_refused_whole(
    bootstrap: str, topic_prefix: str, output: str, tmp_path: Path, sinks: list[ExactlyOnceSink]
) -> None:
    # given: a sink that keeps at most 10 bytes between barriers, holding 5
    sink = recovered_sink(bootstrap, topic_prefix, sinks, max_buffered_bytes=10)
    sink.send(output, b"12345")
    # when: a batch of 6 more bytes comes, then a batch of keys that do not match its values
    with pytest.raises(BufferFull, match="max_buffered_bytes=10"):
        sink.send_many(output, [b"678", b"901"])
    with pytest.raises(ValueError, match="2 values and 1 keys"):
        sink.send_many(output, [b"6", b"7"], [b"k"])
    # then: neither batch is kept or sent; the checkpoint commits what came before
    assert 1 == sink.buffered
    sink.stage(barrier(1, tmp_path))
    sink.complete(completion(1, tmp_path))
    sink.wait_for_commits()
    assert [(None, b"12345")] == read(bootstrap, output, "read_committed")
    assert [(None, b"12345")] == read(bootstrap, output, "read_uncommitted")
