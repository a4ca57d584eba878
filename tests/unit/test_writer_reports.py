"""How the writer counts the broker's delivery reports (the reports themselves stand in for
librdkafka's; the writer against a real broker: tests/integration/test_writer.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from coordinator.service.writer import Written, _Pending


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
