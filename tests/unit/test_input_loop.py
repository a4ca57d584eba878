"""The input loop (coordinator/service/inputs.py): which records of a batch it decides, which it
lets be committed, and when it rewinds an input partition to the journal's position (issues 52
and 53). A real worker and runtime, with ports that record what they are asked."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TypeVar

from coordinator.core.snapshot import PartitionSnapshot
from coordinator.service.inputs import TICK_RESEND_MS, InputLoop, Ticker
from coordinator.service.runtime import Coordinator, Outgoing
from coordinator.service.worker import Owner, Worker
from coordinator.service.writer import Written
from events.wire.topics import Topics

T = TypeVar("T")
TOPICS = Topics("test.")
ACKS, STATUS, TICKS = TOPICS.acks, TOPICS.job_status, TOPICS.ticks


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None = b"job"
    value: bytes | None = b"not avro"
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int = 0


class Clock:
    def now_ms(self) -> int:
        return 1_800_000_000_000

    def monotonic(self) -> float:
        return 0.0


class Inline:
    async def call(
        self, work: Callable[..., T], *args: Any, guard: Callable[[], T | None] | None = None
    ) -> T:
        return work(*args)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        work.close()

    async def close(self) -> None:
        pass


@dataclass
class Writes:
    fail: set[int] = field(default_factory=set)
    """Partitions whose journal writes fail."""
    written: list[Outgoing] = field(default_factory=list)
    during_write: Callable[[], None] = lambda: None

    async def write(self, messages: Sequence[Outgoing]) -> Written:
        self.during_write()
        self.written.extend(messages)
        result = Written()
        for partition in self.fail:
            result.failed[(TOPICS.checkpoints, partition)] = "refused"
        return result

    async def write_snapshot(self, snapshot: PartitionSnapshot) -> bool:
        return True


@dataclass
class Consumer:
    """Where a consumer stands in each input partition, and the rewinds it was asked for."""

    next: dict[tuple[str, int], int] = field(default_factory=dict)
    commits: dict[tuple[str, int], int] = field(default_factory=dict)
    rewound: list[tuple[str, int, int]] = field(default_factory=list)
    prefetches: int = 0

    def next_offset(self, topic: str, partition: int) -> int | None:
        return self.next.get((topic, partition))

    def committed(self, topic: str, partition: int) -> int | None:
        return self.commits.get((topic, partition))

    async def rewind(self, topic: str, partition: int, offset: int) -> None:
        self.rewound.append((topic, partition, offset))
        self.next[(topic, partition)] = offset

    def prefetch(self) -> None:
        self.prefetches += 1


def loop_for(*deciding: tuple[int, int], writes: Writes | None = None) -> tuple[InputLoop, Worker, Consumer]:
    """An input loop whose worker decides each (partition, claim epoch) of ``deciding``."""
    runtime = Coordinator(TOPICS, partitions=4)
    no_recovery: Any = None
    worker = Worker("w0", runtime, asyncio.Lock(), writes or Writes(), no_recovery, Inline(), Clock())
    for partition, epoch in deciding:
        worker.owners[partition] = Owner(epoch, 0, 0.0)
    consumer = Consumer()
    return InputLoop(worker, Clock(), TOPICS, consumer=consumer), worker, consumer


def decide(loop: InputLoop, records: Sequence[Record]) -> list[tuple[str, int, int]]:
    """The batch decided: the (topic, partition, offset) of each record it lets be committed."""
    committable = asyncio.run(loop.decide_batch(records))
    return [(r.topic, r.partition, r.offset) for r in committable]


class TestWhatIsDecided:
    def test_records_of_a_partition_decided_here_are_decided_and_committable(self) -> None:
        loop, _, _ = loop_for((0, 3))

        committable = decide(loop, [Record(ACKS, 0, 0), Record(ACKS, 0, 1)])

        assert [(ACKS, 0, 0), (ACKS, 0, 1)] == committable
        assert 2 == loop.runtime.inputs_decided[ACKS]

    def test_a_partition_not_decided_here_holds_up_no_other(self) -> None:
        """Partition 1 is being recovered: its records wait (not decided, not committable, they come
        again once it is decided), and partition 0's are decided at once (issue 52: a batch used to
        wait until every partition in it was decided, so one slow claim held every job back)."""
        loop, _, _ = loop_for((0, 3))

        committable = decide(loop, [Record(ACKS, 1, 7), Record(ACKS, 0, 0), Record(ACKS, 1, 8)])

        assert [(ACKS, 0, 0)] == committable
        assert 1 == loop.runtime.inputs_decided[ACKS]

    def test_ticks_are_committable_whether_decided_here_or_not(self) -> None:
        """A tick only asks whether anything is due: the ticker sends another one."""
        loop, _, _ = loop_for((0, 3))

        committable = decide(loop, [Record(TICKS, 0, 4), Record(TICKS, 1, 9)])

        assert [(TICKS, 0, 4), (TICKS, 1, 9)] == committable

    def test_records_decided_under_a_claim_gone_before_the_writes_were_answered_are_not_committable(
        self,
    ) -> None:
        """A newer claim fenced the worker while its journal records were written: they may be void,
        so the inputs are not committed; the next owner (or this worker, claiming again) decides
        them again (issue 53)."""
        writes = Writes()
        loop, worker, _ = loop_for((0, 3), writes=writes)
        writes.during_write = lambda: worker.owners.clear()  # the watcher read a newer claim meanwhile

        committable = decide(loop, [Record(ACKS, 0, 0)])

        assert [] == committable
        assert writes.written  # decided, and its dead letter written

    def test_records_of_a_partition_whose_write_failed_are_not_committable_and_it_recovers(self) -> None:
        writes = Writes(fail={0})
        loop, worker, _ = loop_for((0, 3), (1, 5), writes=writes)
        failed: list[int] = []
        worker.write_failed = lambda partition, error: failed.append(partition)  # type: ignore[method-assign]

        committable = decide(loop, [Record(ACKS, 0, 0), Record(ACKS, 1, 0)])

        assert [(ACKS, 1, 0)] == committable
        assert [0] == failed


class TestRewinds:
    def test_a_partition_decided_under_a_new_claim_is_rewound_to_the_journals_position(self) -> None:
        """The worker decided acks 10-14 of partition 0 while a late claim voided its records, and
        claims again: the journal reflects the acks up to 9. Its next batch starts at 15, so the
        acks partition is rewound to 10, and 15 is not decided now (it comes again, after 10-14):
        the inputs of the void window are decided again, in order (issue 53)."""
        loop, _, consumer = loop_for((0, 4))
        loop.runtime.positions[(ACKS, 0)] = 9
        consumer.commits[(ACKS, 0)] = 15

        committable = decide(loop, [Record(ACKS, 0, 15), Record(ACKS, 0, 16)])

        assert [(ACKS, 0, 10)] == consumer.rewound
        assert [] == committable
        assert 0 == loop.runtime.inputs_decided[ACKS]

    def test_the_rewound_records_are_then_decided_in_order(self) -> None:
        loop, _, consumer = loop_for((0, 4))
        loop.runtime.positions[(ACKS, 0)] = 9
        consumer.commits[(ACKS, 0)] = 15
        decide(loop, [Record(ACKS, 0, 15)])

        committable = decide(loop, [Record(ACKS, 0, o) for o in range(10, 17)])

        assert [(ACKS, 0, o) for o in range(10, 17)] == committable
        assert [(ACKS, 0, 10)] == consumer.rewound  # once per claim

    def test_an_idle_consumer_past_the_journals_position_is_rewound_by_an_empty_batch(self) -> None:
        """No new input arrives: the consumer hands over an empty batch, and the inputs it consumed
        in the void window still come again."""
        loop, _, consumer = loop_for((0, 4))
        loop.runtime.positions[(ACKS, 0)] = 9
        consumer.next[(ACKS, 0)] = 12

        decide(loop, [])

        assert [(ACKS, 0, 10)] == consumer.rewound

    def test_no_rewind_when_the_consumer_is_not_past_the_journals_position(self) -> None:
        """The usual claim after a rebalance: the consumer starts at the committed offset, which the
        journal reflects; the batch is decided at once."""
        loop, _, consumer = loop_for((0, 4))
        loop.runtime.positions[(ACKS, 0)] = 9
        consumer.commits[(ACKS, 0)] = 10

        committable = decide(loop, [Record(ACKS, 0, 10)])

        assert [] == consumer.rewound
        assert [(ACKS, 0, 10)] == committable

    def test_records_handed_over_while_the_partition_was_recovered_come_again_from_the_committed_offset(
        self,
    ) -> None:
        """The consumer handed over acks 5-20 while partition 0 was recovered (not decided, not
        acked); the journal reflects up to 30 (an earlier owner decided them). Rewound to the
        committed 5, they come again: those the journal holds are skipped and committable, so the
        committed offset moves on (a gap there would hold every later commit back)."""
        loop, _, consumer = loop_for((0, 4))
        loop.runtime.positions[(ACKS, 0)] = 30
        consumer.commits[(ACKS, 0)] = 5
        consumer.next[(ACKS, 0)] = 21

        decide(loop, [])
        committable = decide(loop, [Record(ACKS, 0, o) for o in range(5, 8)])

        assert [(ACKS, 0, 5)] == consumer.rewound
        assert [(ACKS, 0, 5), (ACKS, 0, 6), (ACKS, 0, 7)] == committable
        assert 0 == loop.runtime.inputs_decided[ACKS]  # the journal holds them: skipped

    def test_without_a_position_in_the_journal_the_partition_is_rewound_to_its_beginning(self) -> None:
        loop, _, consumer = loop_for((0, 4))
        consumer.next[(STATUS, 0)] = 3

        decide(loop, [])

        assert [(STATUS, 0, 0)] == consumer.rewound


class TestTicker:
    def test_a_due_job_has_one_tick_on_its_way_until_it_is_decided_or_a_second_passed(self) -> None:
        """While the worker is behind, a due job stays due; a tick every 50 ms (as before) piled up in
        the very backlog it waited behind (issue 52)."""
        sent: list[int] = []
        clock = MovingClock()

        async def send(job_id: str, now: int) -> None:
            sent.append(now - clock.start)

        ticker = Ticker(SimpleNamespace(runtime=AlwaysDue()), clock, send, 0.01)  # type: ignore[arg-type]

        for at in (0, 50, 100):  # the first tick is on its way
            clock.at = at
            asyncio.run(ticker.send_ticks())
        ticker.decided("job")
        clock.at = 150
        asyncio.run(ticker.send_ticks())
        clock.at = 150 + TICK_RESEND_MS  # that one was lost: sent again
        asyncio.run(ticker.send_ticks())

        assert [0, 150, 150 + TICK_RESEND_MS] == sent


class AlwaysDue:
    states = {"job": None}

    def due(self, now: int) -> list[str]:
        return ["job"]


@dataclass
class MovingClock:
    start: int = 1_800_000_000_000
    at: int = 0

    def now_ms(self) -> int:
        return self.start + self.at

    def monotonic(self) -> float:
        return self.at / 1000
