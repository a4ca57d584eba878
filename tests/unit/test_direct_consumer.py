"""The direct consumer (coordinator/service/direct.py) overrides a private Faust method: these pin
the parts of faust-streaming it relies on, so an upgrade that moves them fails here, not in a
worker that silently stops committing."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import faust
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.structs import ConsumerRecord
from faust.transport.consumer import CONSUMER_FETCHING, Consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from faust.types.tuples import ack_lock

from coordinator.service.direct import DirectConsumer, use_direct_consumer


def test_faust_s_fetch_loop_is_where_the_direct_consumer_expects_it() -> None:
    assert "fetcher" in inspect.signature(Consumer._drain_messages).parameters
    assert inspect.isasyncgenfunction(Consumer.getmany)
    assert ["self", "timeout"] == list(inspect.signature(Consumer._wait_next_records).parameters)
    assert inspect.iscoroutinefunction(Consumer.perform_seek)
    assert ["self", "tp", "record"] == list(inspect.signature(faust_aiokafka.Consumer._to_message).parameters)
    assert ["self", "tp"] == list(inspect.signature(Consumer._new_offset).parameters)
    assert hasattr(ack_lock, "__enter__")
    assert ["self", "tp", "offset_from", "offset_to"] == list(inspect.signature(Consumer._add_gap).parameters)
    assert ["self", "message"] == list(inspect.signature(Consumer.ack).parameters)
    assert issubclass(DirectConsumer, faust_aiokafka.Consumer)
    assert isinstance(CONSUMER_FETCHING, str)


def test_the_app_s_consumer_hands_its_topics_to_the_handler_and_subscribes_them() -> None:
    async def handler(messages: Sequence[Any]) -> Sequence[Any]:
        raise AssertionError("nothing is fetched here")

    def between_batches() -> None:
        raise AssertionError("no batch ends here")

    async def build() -> tuple[Any, set[str]]:
        app = faust.App("direct-consumer-test", broker="kafka://127.0.0.1:1", web_enabled=False)
        topics = [
            app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
            for name in ("t.acks", "t.ticks")
        ]
        use_direct_consumer(app, topics, handler, between_batches=between_batches)
        subscribed = {name for topic in app.topics._topics for name in topic.topics}
        return app.consumer, subscribed

    consumer, subscribed = asyncio.run(build())

    assert isinstance(consumer, DirectConsumer)
    assert frozenset({"t.acks", "t.ticks"}) == consumer.direct_topics
    assert handler is consumer.batch_handler
    assert between_batches is consumer.between_batches
    assert {"t.acks", "t.ticks"} <= subscribed


def _record(tp: TP, offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(tp.topic, tp.partition, offset, 0, 0, b"job", b"ack", None, 3, 3, ())


def test_a_decided_batch_s_offsets_become_committable_once_each() -> None:
    """``_ack_offsets`` does for a batch of records what Faust's ``ack`` does per message: the
    consumer's next commit covers every offset decided, and an offset counts once."""

    async def handler(messages: Sequence[Any]) -> Sequence[Any]:
        raise AssertionError("nothing is fetched here")

    async def ack_twice() -> tuple[int, int | None, int | None]:
        app = faust.App("direct-consumer-ack-test", broker="kafka://127.0.0.1:1", web_enabled=False)
        topic = app.topic(
            "t.acks", key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )
        use_direct_consumer(app, [topic], handler)
        await app.topics._update_indices()  # as at start: the topic's offsets are acked
        consumer = app.consumer
        tp, other = TP("t.acks", 2), TP("t.acks", 5)
        batch = [(tp, _record(tp, offset)) for offset in range(5, 9)] + [(other, _record(other, 40))]

        consumer._ack_offsets(batch)
        consumer._ack_offsets(batch[:2])  # decided again (a retried batch): nothing new

        return consumer._n_acked, consumer._new_offset(tp), consumer._new_offset(other)

    n_acked, next_offset, next_other = asyncio.run(ack_twice())

    assert 5 == n_acked
    assert 9 == next_offset  # committed offset: the one after the last decided
    assert 41 == next_other


def test_a_prefetched_batch_is_the_next_one_handed_on_and_is_fetched_once() -> None:
    """Given a handler that asks for the next batch while its journal is written (``prefetch``),
    when the fetch loop goes on, then it takes that batch (no second fetch), and asking twice
    starts one fetch."""

    async def handler(messages: Sequence[Any]) -> Sequence[Any]:
        raise AssertionError("nothing is fetched here")

    async def scenario() -> tuple[list[Any], list[Any], int]:
        app = faust.App("direct-consumer-prefetch-test", broker="kafka://127.0.0.1:1", web_enabled=False)
        topic = app.topic(
            "t.acks", key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )
        use_direct_consumer(app, [topic], handler)
        consumer = app.consumer
        tp = TP("t.acks", 0)
        fetches: list[int] = []

        async def fetch(timeout: float) -> list[tuple[TP, Any]]:
            fetches.append(len(fetches))
            await asyncio.sleep(0)
            return [(tp, _record(tp, 10 * len(fetches)))]

        consumer._fetch_direct = fetch  # type: ignore[method-assign]
        consumer.prefetch()
        consumer.prefetch()  # a retried batch asks again: still one fetch
        first = await consumer._next_fetch()
        second = await consumer._next_fetch()  # nothing prefetched: fetched now
        return first, second, len(fetches)

    first, second, fetches = asyncio.run(scenario())

    assert [10] == [record.offset for _, record in first]
    assert [20] == [record.offset for _, record in second]
    assert 2 == fetches


def test_the_batch_after_a_prefetch_takes_what_arrived_while_the_journal_was_written() -> None:
    """Given a prefetch that returned the first ack (offset 10) at once and two more acks fetched
    while the batch's journal writes were acknowledged, when the fetch loop takes the next batch,
    then it holds all three, asked for without waiting (one decision round, not two)."""

    async def handler(messages: Sequence[Any]) -> Sequence[Any]:
        raise AssertionError("nothing is fetched here")

    async def scenario() -> tuple[list[int], list[float], list[int]]:
        app = _direct_app("direct-consumer-arrived", handler)
        consumer, tp = app.consumer, TP("t.acks", 0)
        timeouts: list[float] = []
        waiting = [[10], [11, 12], [13], [14]]

        async def fetch(timeout: float) -> list[tuple[TP, Any]]:
            timeouts.append(timeout)
            return [(tp, _record(tp, offset)) for offset in waiting.pop(0)]

        consumer._fetch_direct = fetch
        consumer._get_active_partitions = lambda: {tp}
        consumer.prefetch()
        batch = await consumer._next_fetch()
        consumer._get_active_partitions = set  # no partition active: nothing asked, no sleep
        consumer.prefetch()
        alone = await consumer._next_fetch()
        consumer._get_active_partitions = lambda: {tp}
        app.rebalancing = True  # nor during a rebalance: the fetch would wait for its end
        consumer.prefetch()
        rebalancing = await consumer._next_fetch()
        return [r.offset for _, r in batch], timeouts, [r.offset for _, r in alone + rebalancing]

    batch, timeouts, alone = asyncio.run(scenario())

    assert [10, 11, 12] == batch
    assert [1.0, 0.0, 1.0, 1.0] == timeouts
    assert [13, 14] == alone


def _direct_app(name: str, handler: Any) -> Any:
    app = faust.App(name, broker="kafka://127.0.0.1:1", web_enabled=False)
    topic = app.topic(
        "t.acks", key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )
    use_direct_consumer(app, [topic], handler)
    return app


def test_only_the_records_the_handler_returns_become_committable() -> None:
    """Given a batch of offsets 5-8 whose handler returns 5 and 6 (7 and 8 belong to a partition it
    did not decide under a claim it still holds), then the next commit covers 5 and 6 only.
    Until 2026-11 the whole batch was acked unless Faust said a rebalance had started: a late
    claim's void window was committed undecided (issue 53)."""
    tp = TP("t.acks", 2)
    batch = [(tp, _record(tp, offset)) for offset in range(5, 9)]

    async def scenario() -> tuple[int, int | None]:
        async def handler(messages: Sequence[Any]) -> Sequence[Any]:
            return [m for m in messages if m.offset < 7]

        app = _direct_app("direct-consumer-handler-acks", handler)
        await app.topics._update_indices()
        await app.consumer._handle_direct(batch)
        return app.consumer._n_acked, app.consumer._new_offset(tp)

    assert (2, 7) == asyncio.run(scenario())


def test_a_rewind_hands_records_again_and_nothing_past_it_stays_acked_or_prefetched() -> None:
    """Given offsets 10-19 acked (committed 10), a prefetch under way with records 20-21 of the
    partition and one of another, when the partition is rewound to 12: its fetch position and read
    offset are 12, the next commit covers 10-11 only, the committed offset stays 10 (it is not past
    12), the prefetched records of the partition are dropped and the other's kept."""
    tp, other = TP("t.acks", 2), TP("t.acks", 3)

    async def handler(messages: Sequence[Any]) -> Sequence[Any]:
        raise AssertionError("nothing is fetched here")

    async def scenario() -> tuple[list[tuple[TP, int]], int | None, Any, int | None, list[int]]:
        app = _direct_app("direct-consumer-rewind", handler)
        await app.topics._update_indices()
        consumer = app.consumer
        sought: list[tuple[TP, int]] = []

        async def seek(partition: TP, offset: int) -> None:
            sought.append((partition, offset))

        async def fetch(timeout: float) -> list[tuple[TP, Any]]:
            return [(tp, _record(tp, 20)), (tp, _record(tp, 21)), (other, _record(other, 5))]

        consumer._seek = seek
        consumer._fetch_direct = fetch
        consumer.assignment = lambda: {tp, other}
        consumer._committed_offset[tp] = 10
        consumer._ack_offsets([(tp, _record(tp, offset)) for offset in range(10, 20)])
        consumer.prefetch()
        await consumer.rewind(tp.topic, tp.partition, 12)
        prefetched = await consumer._next_fetch()
        return (
            sought,
            consumer._new_offset(tp),
            consumer._read_offset[tp],
            consumer.next_offset(tp.topic, tp.partition),
            [record.offset for _, record in prefetched],
        )

    sought, next_commit, read_offset, next_offset, prefetched = asyncio.run(scenario())

    assert [(tp, 12)] == sought
    assert 12 == next_commit
    assert 12 == read_offset
    assert 12 == next_offset
    assert [5] == prefetched


def test_a_partition_revoked_meanwhile_is_not_rewound() -> None:
    tp = TP("t.acks", 2)

    async def handler(messages: Sequence[Any]) -> Sequence[Any]:
        raise AssertionError("nothing is fetched here")

    async def scenario() -> int | None:
        app = _direct_app("direct-consumer-rewind-revoked", handler)
        consumer = app.consumer

        async def seek(partition: TP, offset: int) -> None:
            raise AssertionError("a partition not assigned is not sought")

        consumer._seek = seek
        consumer.assignment = lambda: set()
        consumer._committed_offset[tp] = 20
        await consumer.rewind(tp.topic, tp.partition, 12)
        return consumer.committed(tp.topic, tp.partition)

    assert 20 == asyncio.run(scenario())


def test_a_rewind_below_the_committed_offset_commits_it_at_once() -> None:
    """The inputs of a void window were committed: rewound below, the committed offset goes back
    at once (a worker that dies before deciding them again must not leave them committed)."""
    tp = TP("t.acks", 2)

    async def handler(messages: Sequence[Any]) -> Sequence[Any]:
        raise AssertionError("nothing is fetched here")

    async def scenario() -> tuple[list[dict[TP, int]], int | None]:
        app = _direct_app("direct-consumer-rewind-commit", handler)
        await app.topics._update_indices()
        consumer = app.consumer
        commits: list[dict[TP, int]] = []

        async def seek(partition: TP, offset: int) -> None:
            pass

        async def commit(offsets: dict[TP, int]) -> bool:
            commits.append(dict(offsets))
            return True

        consumer._seek, consumer._commit = seek, commit
        consumer.assignment = lambda: {tp}
        consumer._committed_offset[tp] = 20
        await consumer.rewind(tp.topic, tp.partition, 12)
        return commits, consumer.committed(tp.topic, tp.partition)

    commits, committed = asyncio.run(scenario())

    assert [{tp: 12}] == commits
    assert 12 == committed


def test_nothing_is_committed_during_a_rebalance() -> None:
    """A commit then would carry the old generation (on the embedded broker: a second rebalance)."""

    async def handler(messages: Sequence[Any]) -> Sequence[Any]:
        raise AssertionError("nothing is fetched here")

    async def scenario() -> tuple[bool, list[str]]:
        app = _direct_app("direct-consumer-commit-test", handler)
        forced: list[str] = []

        async def force_commit(topics: Any = None, start_new_transaction: bool = True) -> bool:
            forced.append("rebalancing" if app.rebalancing else "assigned")
            return True

        app.consumer.force_commit = force_commit
        app.rebalancing = True
        during = await app.consumer.commit()
        app.rebalancing = False
        after = await app.consumer.commit()
        return during or not after, forced

    committed_during, forced = asyncio.run(scenario())

    assert not committed_during
    assert ["assigned"] == forced


def test_a_batch_prefetched_before_a_rebalance_s_seek_is_dropped_and_the_sought_records_come_next() -> None:
    """Given a prefetch that fetched offsets 266-269 of a partition whose committed offset is 248
    (248-265 handed on and acked, not committed), when a rebalance revokes the partitions and seeks
    the consumer to the committed offsets, then the prefetched batch is dropped, and the next batch
    is the one from 248. Handed on after the seek, the stale batch moved the read offset to 269: the
    fetch loop then skipped 248-265 as handled, they were never acked again, and Faust commits
    nothing past a gap at the head of a partition's acks, so the committed offset stayed at 248 for
    good (a CI run of the rebalance storm, 2026-11-30)."""
    tp = TP("t.acks", 51)

    async def handler(messages: Sequence[Any]) -> Sequence[Any]:
        raise AssertionError("nothing is fetched here")

    async def scenario() -> tuple[list[int], list[int], int | None]:
        app = _direct_app("direct-consumer-prefetch-before-seek", handler)
        consumer = app.consumer
        fetched = [[266, 267, 268, 269], [248, 249, 250]]

        async def fetch(timeout: float) -> list[tuple[TP, Any]]:
            return [(tp, _record(tp, offset)) for offset in fetched.pop(0)]

        async def seek_to_committed() -> dict[TP, int]:
            return {tp: 248}

        def position(partition: TP) -> int:
            return 248  # sought back: the dropped records come again without another seek

        async def seek(partition: TP, offset: int) -> None:
            raise AssertionError(f"sought {partition} to {offset}: past the records the seek brings back")

        consumer._fetch_direct = fetch
        consumer.seek_to_committed = seek_to_committed
        consumer.assignment, consumer.fetch_position, consumer._seek = lambda: {tp}, position, seek
        consumer.prefetch()
        await asyncio.sleep(0)  # the prefetch has its records
        await consumer.on_partitions_revoked({tp})
        await consumer.perform_seek()
        after_the_seek = await consumer._next_fetch()
        then = await consumer._next_fetch()
        return (
            [record.offset for _, record in after_the_seek],
            [record.offset for _, record in then],
            consumer._read_offset[tp],
        )

    after_the_seek, then, read_offset = asyncio.run(scenario())

    assert [] == after_the_seek
    assert [248, 249, 250] == then
    assert 248 == read_offset


def test_records_a_fetch_waited_for_across_a_rebalance_s_seek_are_dropped() -> None:
    """Given a fetch waiting for records when a rebalance seeks the consumer to the committed
    offsets, when the records it was waiting for come (fetched from before the seek), then it hands
    none of them on: they come again from the committed offset."""
    tp = TP("t.acks", 51)

    async def handler(messages: Sequence[Any]) -> Sequence[Any]:
        raise AssertionError("nothing is fetched here")

    async def scenario() -> list[Any]:
        app = _direct_app("direct-consumer-fetch-across-seek", handler)
        consumer = app.consumer
        seek_done = asyncio.Event()

        async def wait_next_records(timeout: float) -> tuple[dict[TP, list[Any]], set[TP]]:
            await seek_done.wait()
            return {tp: [_record(tp, 266)]}, {tp}

        async def seek_to_committed() -> dict[TP, int]:
            return {tp: 248}

        def position(partition: TP) -> int:
            return 248

        consumer._wait_next_records = wait_next_records
        consumer.seek_to_committed = seek_to_committed
        consumer.assignment, consumer.fetch_position = lambda: {tp}, position
        fetching = asyncio.ensure_future(consumer._fetch_direct(timeout=1.0))
        await asyncio.sleep(0)
        await consumer.perform_seek()
        seek_done.set()
        return await fetching

    assert [] == asyncio.run(scenario())


def _dropped_then_next(
    name: str, drop: str, committed: int | None
) -> tuple[list[tuple[TP, int]], list[int], int | None, tuple[int, int]]:
    """A partition whose consumer position is 2 after a fetch of its offsets 0-1, which is dropped
    (``drop``: a rebalance's seek came while it was prefetched, or it came while the flow was
    stopped); the seek to the committed offsets finds ``committed``. Returns the seeks made, the
    offsets of the next fetch (from the position then), the offset the handler gets next, and the
    consumer's counts of records fetched again and partitions sought back (its ``/metrics``)."""
    tp = TP("t.job-status", 4)

    async def handler(messages: Sequence[Any]) -> Sequence[Any]:
        raise AssertionError("nothing is fetched here")

    async def scenario() -> tuple[list[tuple[TP, int]], list[int], int | None, tuple[int, int]]:
        app = _direct_app(name, handler)
        consumer = app.consumer
        fetch_position = {tp: 2}
        sought: list[tuple[TP, int]] = []

        async def seek_to_committed() -> dict[TP, int | None]:
            if committed:  # aiokafka seeks only to a committed offset past 0
                fetch_position[tp] = committed
            return {tp: committed}

        def position(partition: TP) -> int:
            return fetch_position[partition]

        async def seek(partition: TP, offset: int) -> None:
            sought.append((partition, offset))
            fetch_position[partition] = offset

        fetches: list[int] = []

        async def wait_next_records(timeout: float) -> tuple[dict[TP, list[Any]], set[TP]]:
            fetches.append(len(fetches))
            if drop == "stopped flow" and len(fetches) == 1:
                consumer.flow_active = False
                return {tp: [_record(tp, 0), _record(tp, 1)]}, {tp}
            consumer.flow_active = True
            return {tp: [_record(tp, offset) for offset in range(fetch_position[tp], 3)]}, {tp}

        async def prefetched(timeout: float) -> list[tuple[TP, Any]]:
            await consumer.on_partitions_revoked(set())
            await consumer.perform_seek()
            return [(tp, _record(tp, 0)), (tp, _record(tp, 1))]

        consumer.seek_to_committed, consumer.fetch_position, consumer._seek = (
            seek_to_committed,
            position,
            seek,
        )
        consumer.assignment, consumer.highwater = lambda: {tp}, lambda partition: 3
        consumer._wait_next_records = wait_next_records
        if drop == "rebalance":
            consumer._fetch_direct = prefetched
            consumer.prefetch()
            assert [] == await consumer._next_fetch()
            del consumer._fetch_direct
        else:
            assert [] == await consumer._fetch_direct(timeout=1.0)
        after = await consumer._fetch_direct(timeout=1.0)
        counts = (consumer.records_fetched_again, consumer.partitions_sought_back)
        return (
            sought,
            [record.offset for _, record in after],
            consumer.next_offset(tp.topic, tp.partition),
            counts,
        )

    return asyncio.run(scenario())


def test_the_dropped_first_records_of_a_partition_with_nothing_committed_come_again() -> None:
    """Given a partition with nothing committed (a job's first status on a new topic), whose offsets
    0-1 a fetch had when a rebalance's seek came (or that came while the flow was stopped), when
    they are dropped, then the partition is sought back to 0, and the next fetch has them. The seek
    to the committed offsets does not move a partition with none: without the seek back, the
    consumer read on from 2 and the job was never triggered (a CI run, 2026-11-30)."""
    tp = TP("t.job-status", 4)
    for drop in ("rebalance", "stopped flow"):
        sought, next_fetched, next_offset, counts = _dropped_then_next(
            f"direct-consumer-first-{drop}", drop, None
        )

        assert [(tp, 0)] == sought, drop
        assert [0, 1, 2] == next_fetched, drop
        assert 0 == next_offset, drop
        assert (2, 1) == counts, drop


def test_dropped_records_past_a_committed_offset_come_again_from_it_without_another_seek() -> None:
    sought, next_fetched, _, counts = _dropped_then_next("direct-consumer-first-committed", "stopped flow", 1)

    assert [] == sought
    assert [1, 2] == next_fetched
    assert (2, 0) == counts


def test_the_fetch_position_is_aiokafka_s_without_waiting_for_one() -> None:
    """``fetch_position`` reads the position aiokafka keeps per assigned partition (None while it has
    none: after an assignment, until reset to the committed offset; or not assigned)."""
    tp, other = TP("t.job-status", 4), TP("t.job-status", 5)

    async def handler(messages: Sequence[Any]) -> Sequence[Any]:
        raise AssertionError("nothing is fetched here")

    async def scenario() -> tuple[int | None, int | None, int | None]:
        consumer = _direct_app("direct-consumer-fetch-position", handler).consumer
        subscription = SubscriptionState()
        subscription.assign_from_user({tp})
        consumer._thread._ensure_consumer = lambda: SimpleNamespace(_subscription=subscription)
        before = consumer.fetch_position(tp)
        subscription.seek(tp, 7)
        return before, consumer.fetch_position(tp), consumer.fetch_position(other)

    assert (None, 7, None) == asyncio.run(scenario())
