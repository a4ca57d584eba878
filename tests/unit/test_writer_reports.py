"""How the writer counts the broker's delivery reports (the reports themselves stand in for
librdkafka's; the writer against a real broker: tests/integration/test_writer.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from coordinator.service import writer as writer_module
from coordinator.service.runtime import Outgoing
from coordinator.service.writer import Writer, Written, _Pending


@dataclass
class Report:
    """The parts of a ``confluent_kafka.Message`` a delivery report is read by."""

    where: tuple[str, int | None]
    at: int | None = None
    job: bytes | None = b"job-a"

    def topic(self) -> str:
        return self.where[0]

    def partition(self) -> int | None:
        return self.where[1]

    def offset(self) -> int | None:
        return self.at

    def key(self) -> bytes | None:
        return self.job


def _answered(reports: list[tuple[str | None, Report]]) -> Written:
    async def run() -> Written:
        loop = asyncio.get_running_loop()
        pending = _Pending(loop.create_future(), loop, lambda key: 7, outstanding=len(reports) + 1)
        for error, report in reports:
            pending.delivered(error, report)  # type: ignore[arg-type]
        pending.handed_over()
        return await asyncio.wait_for(pending.future, 1.0)

    return asyncio.run(run())


def test_the_last_offset_of_each_partition_is_reported() -> None:
    written = _answered([(None, Report(("journal", 1), 10)), (None, Report(("journal", 1), 11))])

    assert {("journal", 1): 11} == written.last_offsets
    assert {} == written.failed


def test_a_failed_record_fails_its_partition_and_the_others_still_count() -> None:
    written = _answered(
        [
            (None, Report(("journal", 1), 10)),
            ("REQUEST_TIMED_OUT", Report(("journal", 2))),
            ("NOT_LEADER", Report(("journal", 2))),
        ]
    )

    assert {("journal", 2): "REQUEST_TIMED_OUT"} == written.failed  # the first error is kept
    assert {("journal", 1): 10} == written.last_offsets


def test_a_record_that_failed_before_it_had_a_partition_fails_its_job_s_partition() -> None:
    written = _answered([("UNKNOWN_TOPIC", Report(("journal", -1)))])

    assert {("journal", 7): "UNKNOWN_TOPIC"} == written.failed


def test_the_write_is_answered_only_after_every_record_and_the_end_of_handing_over() -> None:
    async def run() -> list[bool]:
        loop = asyncio.get_running_loop()
        pending = _Pending(loop.create_future(), loop, lambda key: 0, outstanding=3)
        seen = []
        pending.delivered(None, Report(("journal", 0), 1))  # type: ignore[arg-type]
        pending.handed_over()
        await asyncio.sleep(0.01)
        seen.append(pending.future.done())
        pending.delivered(None, Report(("journal", 0), 2))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        seen.append(pending.future.done())
        return seen

    assert [False, True] == asyncio.run(run())


def test_a_report_that_comes_after_the_loop_closed_is_dropped_quietly() -> None:
    loop = asyncio.new_event_loop()
    pending = _Pending(loop.create_future(), loop, lambda key: 0, outstanding=1)
    loop.close()

    pending.delivered(None, Report(("journal", 0), 3))  # type: ignore[arg-type]

    assert {("journal", 0): 3} == pending.written.last_offsets


class FullQueue:
    """Stands in for librdkafka's producer: its local queue is full ``times`` times, then it takes
    the record."""

    def __init__(self, times: int) -> None:
        self.times = times
        self.calls = 0

    def produce(self, topic: str, **kwargs: object) -> None:
        self.calls += 1
        if self.calls <= self.times:
            raise BufferError("Local: Queue full")


def _writer_over(producer: FullQueue) -> Writer:
    writer = Writer.__new__(Writer)  # no broker, no thread: only _produce is exercised
    writer._producer = producer  # type: ignore[assignment]
    return writer


RECORD = Outgoing("t.checkpoints", b"job-a", b"value", (("cutline.epoch", b"1"),))


def test_a_full_local_queue_is_waited_out() -> None:
    """The writer's thread drains librdkafka's queue; a record that meets a full queue is tried
    again until it is taken."""
    producer = FullQueue(times=3)

    _writer_over(producer)._produce(RECORD, lambda error, message: None)

    assert 4 == producer.calls


def test_a_queue_that_stays_full_refuses_the_record_after_five_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five seconds after the first refusal the record fails (``write`` then fails its partition)."""
    clock = iter(range(0, 1000))
    monkeypatch.setattr(writer_module.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(writer_module.time, "sleep", lambda seconds: None)
    producer = FullQueue(times=10**6)

    with pytest.raises(BufferError):
        _writer_over(producer)._produce(RECORD, lambda error, message: None)

    assert 7 == producer.calls  # refused at t = 0 (deadline 5), 1, 2, 3, 4, 5; at t = 6 it gives up
