"""Fetched batches straight to the coordinator: Faust's consumer without its per-message stream path.

Faust hands every fetched message to the conductor, which puts it on a stream's
queue for an agent: several asyncio tasks, a decode and an ack chain per
message, many times the CPU of the same batches handed straight to a handler
(``docs/benchmarks.md``). The coordinator decides a
batch as one unit anyway (one decision pass, one journal batch per partition),
so :class:`DirectConsumer` gives it each fetched batch of its topics at once,
as the records aiokafka fetched (no Faust message per record), and acks the
batch's offsets in one pass.

Everything else stays Faust's: group membership and rebalance callbacks, the
consumer thread, offset commits (an offset is acked only when the handler
returns it, that is after its journal writes are acknowledged), the producer,
timers and web views. The handler can also rewind an input partition
(:meth:`DirectConsumer.rewind`): its records come again from an offset, and
what was fetched or acked of it past that offset before counts for nothing.
Messages of other topics take Faust's usual path. It overrides
``Consumer._drain_messages`` and repeats the loop of ``Consumer.getmany`` and
the bookkeeping of ``Consumer.ack``, all private: the faust-streaming version
is bounded in ``pyproject.toml`` and
``tests/unit/test_direct_consumer.py`` checks the parts it relies on.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import faust
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from faust.types.tuples import ack_lock
from mode.utils.futures import notify

BatchHandler = Callable[[Sequence[Any]], Awaitable[Sequence[Any]]]
"""Decides a batch of fetched records (aiokafka's ``ConsumerRecord``: topic, partition, offset,
timestamp in ms, key, value, headers), in order per partition; returns, once their effects are
durable, the records whose offsets may be committed (the others come again after a rewind, or
from the committed offset after a rebalance). Also called with no record when a fetch found
none (the handler may rewind)."""


class DirectConsumer(faust_aiokafka.Consumer):
    """Faust's aiokafka consumer; fetched messages of ``direct_topics`` go to ``batch_handler``."""

    direct_topics: frozenset[str] = frozenset()
    batch_handler: BatchHandler | None = None
    between_batches: Callable[[], object] | None = None
    """Called after each direct batch, once the loop holds none of its messages."""

    async def _drain_messages(self, fetcher: Any) -> None:
        """Faust's fetch loop (``Consumer._drain_messages``) with the direct batches taken out.

        A fetch is gone through as a list, not an async iterator: Faust's loop awaits each record
        of its ``getmany`` (an async generator), a cost per record that an ack flood pays on the
        main thread (docs/benchmarks.md)."""
        callback = self.callback
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        read_offset = self._read_offset
        handed = self._handed
        direct_topics = self.direct_topics
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                self.diag.set_flag(CONSUMER_FETCHING)
                direct: list[tuple[TP, Any]] = []
                fetched = await self._next_fetch()
                await self.sleep(0)
                if not self.should_stop:
                    for tp, message in fetched:
                        r_offset = read_offset[tp]
                        offset = message.offset
                        if r_offset is not None and offset < r_offset:
                            continue  # fetched again after a seek: it was handled
                        if r_offset and offset - r_offset > 1 and self.app.topics.acks_enabled_for(tp.topic):
                            await self._add_gap(tp, r_offset + 1, offset)  # compacted or aborted offsets
                        if tp.topic in direct_topics:
                            direct.append((tp, message))
                            handed[tp] = offset + 1
                        else:
                            await self.wait_first(callback(message), self.suspend_flow.wait())
                        read_offset[tp] = offset
                    if direct or (not fetched and self.flow_active):
                        await self._handle_direct(direct)
                        direct = []
                        if self.between_batches is not None:
                            self.between_batches()
                self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)
            if self._prefetch is not None:
                self._prefetch.cancel()
                self._prefetch = None

    _prefetch: asyncio.Task[list[tuple[TP, Any]]] | None = None
    _stale: set[TP]
    """Partitions rewound while a prefetch was under way: its records of them are dropped."""
    _sought = 0
    """How many times the consumer was sought to the committed offsets or had partitions revoked
    (a rebalance): records fetched before the latest of those are stale (:meth:`_since_sought`)."""
    _prefetch_sought = 0
    """:attr:`_sought` when the prefetch under way started."""
    _handed: dict[TP, int]
    """Per direct partition, the offset after the last record handed to the handler since the
    consumer was last sought (to the committed offsets, or by a rewind)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stale, self._handed = set(), {}
        self.records_fetched_again = 0
        """Records fetched and dropped (before a rebalance's seek, or while Faust's flow was stopped):
        they are fetched again (:meth:`_fetch_again`). A rebalance's cost, at ``/metrics``."""
        self.partitions_sought_back = 0
        """Times a partition was sought back to the first of such records."""

    def prefetch(self) -> None:
        """Start fetching the next batch now. The handler calls this once it has decided a batch
        and waits for the broker to acknowledge its journal writes: the consumer thread then turns
        the next fetched records into Python objects while this thread has nothing to do, rather
        than after (docs/benchmarks.md). Offsets are acked, and
        the next batch decided, only after the handler returns, as before."""
        if self._prefetch is None and not self.should_stop:
            self._prefetch_sought = self._sought
            self._prefetch = asyncio.ensure_future(self._fetch_direct(timeout=1.0))

    async def _next_fetch(self) -> list[tuple[TP, Any]]:
        """The next batch: the prefetch's, with what arrived after it returned (:meth:`_arrived`), or
        a fetch now."""
        prefetched, self._prefetch = self._prefetch, None
        if prefetched is not None:
            fetched = await self._since_sought(await prefetched, self._prefetch_sought)
            stale, self._stale = self._stale, set()
            if stale:
                fetched = [(tp, record) for tp, record in fetched if tp not in stale]
            return fetched + await self._arrived()
        return await self._fetch_direct(timeout=1.0)

    async def _arrived(self) -> list[tuple[TP, Any]]:
        """The records fetched since the prefetch returned, without waiting for more.

        A prefetch returns as soon as one record is there: the first of 32 acks that arrive while
        the batch's journal writes are acknowledged. Without these, the others waited for a batch
        each, a journal write apart (docs/benchmarks.md, "Latency under load"). None while no
        partition is active (Faust's fetch would sleep a second then), the flow is stopped or a
        rebalance runs (it would wait for them: the batch in hand goes on to the handler)."""
        if not self.flow_active or self.app.rebalancing or not self._get_active_partitions():
            return []
        return await self._fetch_direct(timeout=0.0)

    async def _fetch_direct(self, timeout: float) -> list[tuple[TP, Any]]:
        """Faust's ``Consumer.getmany``, as a list, except that a record of ``direct_topics`` comes
        as aiokafka fetched it (topic, partition, offset, timestamp in ms, key, value, headers), not
        made into a Faust message, and the high watermark Faust's monitor shows is noted once per
        partition and fetch rather than per record: Faust's per-record work is paid on the
        worker's main thread in an ack flood (docs/benchmarks.md)."""
        sought = self._sought
        records, active_partitions = await self._wait_next_records(timeout)
        generation_id = self.app.consumer_generation_id
        if records is None or self.should_stop:
            return []
        stale = self._sought != sought  # fetched before a rebalance's seek
        if stale or not self.flow_active:
            if not stale:
                self.log.dev("getmany called while flow not active. Seek back to committed offsets.")
                try:
                    await self.perform_seek()
                except Exception as ex:
                    self.log.warning(f"exception performing seek when flow not active {ex}")
            self.records_fetched_again += sum(len(batch) for batch in records.values())
            await self._fetch_again({tp: batch[0].offset for tp, batch in records.items() if batch})
            return []
        direct_topics = self.direct_topics
        to_message = self._to_message
        buffered = self._buffered_partitions
        track_end = self.app.monitor.track_tp_end_offset
        noted: set[TP] = set()
        fetched: list[tuple[TP, Any]] = []
        for tp, record in self.scheduler.iterate(records):
            if not self.flow_active:
                break
            if self.app.consumer_generation_id != generation_id:
                self.log.dev("Generation id changed from %r. Cancelling getmany.", generation_id)
                break
            if active_partitions is None or tp in active_partitions or tp in buffered:
                if tp.topic in direct_topics:
                    if tp not in noted:
                        noted.add(tp)
                        track_end(tp, self.highwater(tp))
                    fetched.append((tp, record))
                else:
                    track_end(tp, self.highwater(tp))
                    fetched.append((tp, to_message(tp, record)))
        return fetched

    def next_offset(self, topic: str, partition: int) -> int | None:
        """The offset of the next record of ``topic[partition]`` the handler gets (None: nothing
        handed over nor committed: the partition is read from its beginning)."""
        tp = TP(topic, partition)
        handed = self._handed.get(tp)
        return handed if handed is not None else self._committed_offset.get(tp)

    def committed(self, topic: str, partition: int) -> int | None:
        """The committed offset of ``topic[partition]`` as Faust knows it."""
        return self._committed_offset.get(TP(topic, partition))

    async def rewind(self, topic: str, partition: int, offset: int) -> None:
        """Hand the records of ``topic[partition]`` to the handler again from ``offset`` on.

        Its acks at or past that offset are forgotten, and so is what a prefetch under way
        fetched of it; a committed offset past it moves back to it (at once, and the next commit
        counts from it), so that a worker that dies before deciding the rewound records again does
        not leave them committed. Faust's ``seek`` moves the fetch position and the read offset."""
        tp = TP(topic, partition)
        if tp not in self.assignment():
            return  # revoked meanwhile: the next owner starts from the committed offset
        target = offset
        with ack_lock:
            committed = self._committed_offset.get(tp)
            acked = [o for o in self._acked.get(tp, ()) if o < target]
            self._acked[tp] = acked
            self._acked_index[tp] = set(acked)
            if tp in self._gap:
                self._gap[tp].chop(target, sys.maxsize)
            if committed is None or committed > target:
                self._committed_offset[tp] = target
        if self._prefetch is not None:
            self._stale.add(tp)
        self._handed[tp] = target
        await self.seek(tp, target)
        moved_back = committed is not None and committed > target
        if moved_back and not self.app.rebalancing:
            with contextlib.suppress(Exception):
                await self._commit({tp: target})

    async def perform_seek(self) -> None:
        """Faust's seek to the committed offsets (after an assignment): nothing is handed over since,
        and nothing fetched before it will be."""
        self._handed.clear()
        self._sought += 1
        await super().perform_seek()

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        self._sought += 1
        for tp in revoked:
            self._handed.pop(tp, None)
        await super().on_partitions_revoked(revoked)

    async def _since_sought(self, fetched: list[tuple[TP, Any]], sought: int) -> list[tuple[TP, Any]]:
        """``fetched`` (by a fetch that started when :attr:`_sought` was ``sought``), or nothing if
        a rebalance revoked partitions or sought the consumer since (they come again:
        :meth:`_fetch_again`).

        Such records were fetched from positions before the seek. Handed on after it, they moved
        the read offset past the records the seek brings back, which were then skipped as handled
        and never acked, and Faust never commits past a gap of more than one offset at the head of a
        partition's acks (its ``_new_offset`` lets one offset pass, as a transaction marker's): its
        committed offset stayed behind for good (a CI run of the rebalance storm, 2026-11-30)."""
        if self._sought == sought:
            return fetched
        self.log.info("dropped %d records fetched before a rebalance's seek: they come again", len(fetched))
        self.records_fetched_again += len(fetched)
        first: dict[TP, int] = {}
        for tp, record in fetched:
            if tp not in self._stale:  # rewound meanwhile: the rewind says where it reads from
                first.setdefault(tp, record.offset)
        await self._fetch_again(first)
        return []

    async def _fetch_again(self, first: dict[TP, int]) -> None:
        """Make the dropped records of each partition (from offset ``first[tp]`` on) come again.

        A seek to the committed offsets moves only the partitions with a committed offset past 0
        (aiokafka's ``seek_to_committed``): a partition with none kept its position, past the records
        dropped. Unless it was sought back, it is sought to the first of them here (never below its
        committed offset: those are decided); a partition no longer assigned is left to its next
        owner. Without this the first records of a new partition (a job's first status, say) were
        lost when a rebalance or a stopped flow dropped the fetch that had them: that job was never
        triggered (a CI run, 2026-11-30)."""
        assigned = self.assignment()
        for tp, offset in first.items():
            if tp not in assigned:
                continue
            position = self.fetch_position(tp)
            committed = self._committed_offset.get(tp)
            target = offset if committed is None else max(offset, committed)
            if position is not None and position > target:
                self.log.warning(
                    "%s sought back from %d to %d: the records dropped come again", tp, position, target
                )
                self._handed[tp] = target
                self.partitions_sought_back += 1
                await self.seek(tp, target)

    def fetch_position(self, tp: TP) -> int | None:
        """Where the consumer fetches ``tp`` from next, read without waiting as aiokafka's
        ``highwater`` is; None while it has none (reset to the committed offset after an assignment,
        or not assigned). Not aiokafka's ``position``, which waits for one: in the fetch loop, during
        a rebalance, that could wait for the rebalance, which may wait for the loop."""
        consumer: Any = self._thread._ensure_consumer()
        subscription = consumer._subscription.subscription
        assignment = subscription.assignment if subscription is not None else None
        state = assignment.state_value(tp) if assignment is not None else None
        if state is None or not state.has_valid_position:
            return None
        return int(state.position)

    def read_offsets(self) -> dict[Any, int | None]:
        """The offset last read (handed on) per topic partition."""
        return dict(self._read_offset)

    async def _handle_direct(self, fetched: list[tuple[TP, Any]]) -> None:
        """The handler decides the batch; then the offsets it returns count as processed
        (committable), and no other.

        Which records those are is the handler's to say: only it knows which it decided under a
        claim it still holds. Until 2026-11 every record was acked unless Faust said a rebalance
        had started meanwhile, so the records of a partition whose decisions a late claim had
        voided for a moment were committed undecided, and lost (issue 53)."""
        if self.batch_handler is None:
            raise RuntimeError("DirectConsumer has no batch_handler for its direct topics")
        committable = await self.batch_handler([record for _, record in fetched])
        if not committable:
            return
        self._ack_offsets([(TP(record.topic, record.partition), record) for record in committable])
        commit_every = self._commit_every
        if commit_every is not None and self._n_acked >= commit_every:
            self._n_acked = 0
            await self.commit()

    async def commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        """Faust's commit, except during a rebalance, when there is nothing this worker may commit:
        Faust dropped the revoked partitions' pending acks. A commit then would carry the old
        generation. The embedded broker starts the new generation at once and answers such a
        commit ILLEGAL_GENERATION only after the held join (docs/embedded-broker.md). aiokafka
        then drops the generation it has just joined with, and the group rebalances a second
        time: 3 s more of every failover that hit it."""
        if self.app.rebalancing:
            return False
        return await super().commit(topics, start_new_transaction)

    def _ack_offsets(self, fetched: list[tuple[TP, Any]]) -> None:
        """Faust's ``Consumer.ack`` for a batch of records (not Faust messages): each offset becomes
        committable once, as it would one message at a time, under Faust's ``ack_lock``. Done per
        partition with set and list operations rather than per record."""
        offsets: dict[TP, list[int]] = {}
        for tp, record in fetched:
            offsets.setdefault(tp, []).append(record.offset)
        with ack_lock:
            acked_now = 0
            for tp, decided in offsets.items():
                if not self.app.topics.acks_enabled_for(tp.topic):
                    continue
                committed = self._committed_offset[tp]
                acked_index = self._acked_index[tp]
                new = [
                    offset
                    for offset in dict.fromkeys(decided)  # once each, in order
                    if (committed is None or offset >= committed) and offset not in acked_index
                ]
                acked_index.update(new)
                self._acked[tp].extend(new)
                acked_now += len(new)
            self._n_acked += acked_now
            notify(self._waiting_for_ack)


def use_direct_consumer(
    app: faust.App,
    topics: Sequence[faust.TopicT],
    handler: BatchHandler,
    between_batches: Callable[[], object] | None = None,
) -> None:
    """Make ``app``'s consumer a :class:`DirectConsumer` handing the messages of ``topics`` to
    ``handler`` (and calling ``between_batches`` after each batch), and subscribe them (no agent
    reads them). Call before the app starts."""
    consumer_class = type(
        "CoordinatorConsumer",
        (DirectConsumer,),
        {
            "direct_topics": frozenset(name for topic in topics for name in topic.topics),
            "batch_handler": staticmethod(handler),
            "between_batches": None if between_batches is None else staticmethod(between_batches),
        },
    )
    # The transport builds the app's consumer from its ``Consumer`` class attribute (a ClassVar).
    app.transport.Consumer = consumer_class  # type: ignore[misc]
    for topic in topics:
        app.topics.add(topic)
