"""The Spark source's offset probe under a burst: a bound of the product (each call answers within
its timeout), so the test runs alone (``timed``, tests/alone.py). In the Spark tests' file it ran at
their niceness beside the other workers' tests, and on a loaded CI machine one call read 188,404
records in its 5 s and failed."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from confluent_kafka import Producer

from events.dev.broker import create_topics
from events.kafka.clients import producer_config
from spark_tasks.kafka_source.probes import OffsetProbe

pytestmark = [pytest.mark.integration, pytest.mark.timed]


class BurstWriter:
    """A thread that writes 100-byte records to ``topic`` as fast as its producer takes them: at least
    ``count``, and on until :meth:`finish` (at most ``limit``). ``queued`` is never less than the
    records handed to the producer so far."""

    def __init__(self, bootstrap: str, topic: str, count: int, limit: int) -> None:
        self.queued = 0
        self._producer = Producer(producer_config(bootstrap, {"linger.ms": 5}))
        self._topic, self._count, self._limit = topic, count, limit
        self._finish = threading.Event()
        self._thread = threading.Thread(target=self._write, daemon=True)
        self._thread.start()

    def _write(self) -> None:
        while self.queued < self._limit and (self.queued < self._count or not self._finish.is_set()):
            # counted before the hand-over: counted after it, a record could reach the broker (and
            # a probe's end) while this thread waits for the GIL between the two
            self.queued += 1
            try:
                self._producer.produce(self._topic, b"x" * 100)
            except BufferError:
                self.queued -= 1
                self._producer.poll(0.05)
        self._producer.flush(60)

    def finish(self) -> None:
        """Stop once ``count`` records are written."""
        self._finish.set()

    def writing(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> None:
        self._thread.join(60)


def test_the_probe_finds_the_ends_promptly_while_a_burst_is_written(
    bootstrap: str, topic_prefix: str
) -> None:
    """Given a burst of at least 1,000,000 records into 4 partitions, which goes on until the probe
    has been asked three times, each call of the source's probe (a batch's latestOffset) answers
    within its 5 s timeout, at or after the ends of the call before and never past what was written.
    (At librdkafka's default fetch.queue.backoff.ms the probe, reading on to a watermark through
    the burst, waited 1 s for every 1 MB it read: 3-28 s a call.)"""
    topic = topic_prefix + "burst"
    create_topics(bootstrap, [topic], partitions=4)
    tps = [(topic, p) for p in range(4)]
    calls: list[dict[tuple[str, int], int]] = []
    with OffsetProbe(bootstrap, timeout=5) as probe:
        probe.latest(tps)  # connected, the partitions' leaders known
        # a fixed burst could end before a slow machine's third call: it ended after two in a CI run
        writer = BurstWriter(bootstrap, topic, 1_000_000, limit=3_000_000)
        try:
            while writer.writing():
                calls.append(probe.latest(tps))
                assert sum(calls[-1].values()) <= writer.queued
                if len(calls) >= 3:
                    writer.finish()
                time.sleep(0.2)
        finally:
            writer.finish()
            writer.join()

    assert len(calls) >= 3, "the burst reached its limit before the probe was asked three times"
    for before, after in itertools.pairwise(calls):
        assert all(before[tp] <= after[tp] for tp in tps), (before, after)
