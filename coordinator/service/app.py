"""The coordinator service: a Faust app around :class:`coordinator.service.runtime.Coordinator`.

One agent per input topic (concurrency 1), a timer that turns the clock into
ticks, and web views with Flink's checkpoint statistics. Every agent body is
the same few steps: decode → decide → evolve the per-job state → append to the
journal (the runtime does the first three in memory; this module publishes).

The per-job state table is the journal itself: start-up recovery folds the
journal topic into the states, skips inputs the journal already reflects when
Kafka redelivers them, and sends the barriers of pending checkpoints again.
There is no Faust table with a changelog: the changelog would be a second copy
of the journal, and Faust's changelog recovery hangs on the embedded broker,
whose ListOffsets answers are wrong (docs/embedded-broker.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from coordinator.service.runtime import CAUSE_HEADER, Coordinator, Outcome, Outgoing
from coordinator.state import state_json
from coordinator.stats import checkpoints_json, config_json, entry_json
from events.broker import create_topics
from events.log import LogMessage, read_journal_topic
from events.records import JournalEvent
from events.topics import DEFAULT_PARTITIONS, DEFAULT_PREFIX, Topics

log = logging.getLogger("cutline.coordinator")

BATCH_SIZE = 500
BATCH_WAIT = 0.001
"""A batch of input is decided at most this long after its first message arrived ..."""
BATCH_QUIET = 0.0002
"""... or as soon as no message came for this long: a lone ack waits 0.2 ms, not 1 ms."""


@dataclass(frozen=True)
class Settings:
    """How to run the coordinator."""

    bootstrap: str
    prefix: str = DEFAULT_PREFIX
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    partitions: int = DEFAULT_PARTITIONS
    tick_interval: float = 0.01
    fetch_wait_ms: int = 2
    session_timeout: float = 6.0
    data_dir: Path = field(default_factory=lambda: Path(".cutline") / "coordinator")
    savepoint_roots: tuple[str, ...] = ()
    """Storage URIs savepoint targets must lie in (``--savepoint-root``); none: the parent of each
    job's checkpoint location (docs/security.md)."""

    @property
    def topics(self) -> Topics:
        return Topics(self.prefix)

    @property
    def app_id(self) -> str:
        return f"{self.prefix}coordinator"

    @property
    def ticks_topic(self) -> str:
        """Internal: ticks travel through Kafka so they reach the worker that owns the job."""
        return f"{self.prefix}coordinator-ticks"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _patch_fetch_wait(wait_ms: int) -> None:
    """Faust hard-codes ``fetch_max_wait_ms=1500`` for its consumer. The embedded broker answers a
    waiting fetch only after about half that wait, not when data arrives (docs/embedded-broker.md),
    so every hop into the coordinator would take ~750 ms. Lower it."""
    original = getattr(faust_aiokafka.AIOKafkaConsumerThread, "_cutline_original", None)
    if original is None:
        original = faust_aiokafka.AIOKafkaConsumerThread._create_worker_consumer
        faust_aiokafka.AIOKafkaConsumerThread._cutline_original = original  # type: ignore[attr-defined]

    def create(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        consumer._fetch_max_wait_ms = wait_ms
        return consumer

    faust_aiokafka.AIOKafkaConsumerThread._create_worker_consumer = create  # type: ignore[method-assign]


def ensure_topics(settings: Settings) -> list[str]:
    """Create every protocol topic (and the internal ticks topic) that is missing."""
    names = [*settings.topics.all, settings.ticks_topic]
    return create_topics(settings.bootstrap, names, partitions=settings.partitions)


def create_app(settings: Settings) -> faust.App:
    """Build the Faust app for ``settings`` (topics must exist: :func:`ensure_topics`)."""
    _patch_fetch_wait(settings.fetch_wait_ms)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    topics = settings.topics
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.bootstrap}",
        store="memory://",
        datadir=str(settings.data_dir),
        topic_partitions=settings.partitions,
        topic_replication_factor=1,
        broker_session_timeout=settings.session_timeout,
        broker_heartbeat_interval=min(1.0, settings.session_timeout / 3),
        consumer_auto_offset_reset="earliest",
        web_enabled=True,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
        producer_linger=0.0,
        stream_wait_empty=False,
    )
    coordinator = Coordinator(topics, savepoint_roots=settings.savepoint_roots)
    recovered = asyncio.Event()
    publish_lock = asyncio.Lock()

    def raw_topic(name: str) -> faust.TopicT:
        return app.topic(
            name,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=settings.partitions,
        )

    journal_topic = raw_topic(topics.checkpoints)
    barriers_topic = raw_topic(topics.barriers)
    dead_letters_topic = raw_topic(topics.dead_letters)
    ticks_topic = raw_topic(settings.ticks_topic)
    outputs = {t.get_topic_name(): t for t in (journal_topic, barriers_topic, dead_letters_topic)}

    async def publish(outcomes: list[Outcome]) -> None:
        """Journal first; barriers only once the journal holds their trigger durably.

        The journal records of all the outcomes go out as one record batch per partition (one
        produce request), not one ``Topic.send`` per record."""
        journal = [m for o in outcomes for m in o.messages if m.topic == topics.checkpoints]
        others = [m for o in outcomes for m in o.messages if m.topic != topics.checkpoints]
        sent = await _send_batches(journal)
        if any(o.has_barriers for o in outcomes):
            await asyncio.gather(*sent)
        await _send_batches(others)

    partitions: dict[tuple[str, bytes], int] = {}

    async def _partition(producer: Any, topic: str, key: bytes) -> int:
        """The partition ``Topic.send`` would choose for ``key`` (the producer's partitioner)."""
        partition = partitions.get((topic, key))
        if partition is None:
            await producer.partitions_for(topic)  # the partitioner needs the topic's metadata
            partition = partitions[(topic, key)] = app.producer.key_partition(topic, key).partition
        return partition

    async def _send_batches(messages: Sequence[Outgoing]) -> list[asyncio.Future[Any]]:
        """Send ``messages`` in order, as one aiokafka record batch per topic and partition.

        They go through the app's own producer, so Faust's flush before each offset commit
        still covers them; each batch's future completes when the broker has it."""
        if not messages:
            return []
        producer = cast(Any, app.producer)._ensure_producer()  # the aiokafka producer under Faust's
        grouped: dict[tuple[str, int], list[Outgoing]] = {}
        for message in messages:
            tp = (message.topic, await _partition(producer, message.topic, message.key))
            grouped.setdefault(tp, []).append(message)
        futures = []
        for (topic, partition), group in grouped.items():
            batch = producer.create_batch()
            for message in group:
                record = {"key": message.key, "value": message.value, "headers": list(message.headers)}
                if batch.append(timestamp=None, **record) is None:
                    futures.append(await producer.send_batch(batch, topic, partition=partition))
                    batch = producer.create_batch()  # full: the next one (a lone record always fits)
                    batch.append(timestamp=None, **record)
            futures.append(await producer.send_batch(batch, topic, partition=partition))
        return futures

    async def _send(message: Outgoing) -> Any:
        return await outputs[message.topic].send(
            key=message.key, value=message.value, headers=list(message.headers)
        )

    async def process(events: Sequence[faust.EventT[Any]]) -> None:
        await recovered.wait()
        async with publish_lock:
            outcomes = []
            for event in events:
                message = event.message
                if coordinator.already_decided(message.topic, message.partition, message.offset):
                    continue
                outcomes.append(
                    coordinator.handle(
                        message.topic, message.partition, message.offset, message.key, message.value, now_ms()
                    )
                )
            await publish(outcomes)

    def input_agent(topic_name: str, name: str) -> None:
        async def agent(stream: faust.StreamT[Any]) -> None:
            # What has arrived is decided at once, in order; a lone message waits at most 1 ms.
            async for events in take_arrived(stream, BATCH_SIZE, BATCH_WAIT, BATCH_QUIET):
                await process(events)

        agent.__name__ = name
        app.agent(raw_topic(topic_name), name=name, concurrency=1)(agent)

    input_agent(topics.job_status, "handle_job_status")
    input_agent(topics.requests, "handle_requests")
    input_agent(topics.acks, "handle_acks")
    input_agent(topics.declines, "handle_declines")

    @app.agent(ticks_topic, name="handle_ticks", concurrency=1)
    async def handle_ticks(stream: faust.StreamT[Any]) -> None:
        async for event in stream.events():
            await recovered.wait()
            try:
                job_id = event.message.key.decode()
            except (AttributeError, UnicodeDecodeError):  # None, or not UTF-8: not one of our ticks
                log.warning("tick with key %r skipped: ticks are keyed by job id", event.message.key)
                continue
            async with publish_lock:
                await publish([coordinator.tick(job_id, now_ms())])

    ticked: dict[str, int] = {}

    @app.timer(settings.tick_interval)
    async def send_ticks() -> None:
        # Every worker ticks the jobs it holds; a tick decides nothing unless due.
        if not recovered.is_set():
            return
        now = now_ms()
        for job_id in coordinator.due(now):
            if ticked.get(job_id, 0) + 50 > now:
                continue  # the last tick is still on its way
            ticked[job_id] = now
            await ticks_topic.send(key=job_id.encode(), value=str(now).encode())

    @app.task
    async def recover() -> None:
        started = time.monotonic()
        events = await asyncio.get_running_loop().run_in_executor(
            None, _read_journal, settings.bootstrap, topics.checkpoints
        )
        count = coordinator.recover(events)
        log.info(
            "recovered %d journal events of %d jobs in %.2fs",
            count,
            len(coordinator.states),
            time.monotonic() - started,
        )
        recovered.set()
        for barrier in coordinator.resume(now_ms()):
            await _send(barrier)

    @app.page("/ready")
    async def get_ready(web: Any, request: Any) -> Any:
        return web.json({"recovered": recovered.is_set(), "jobs": len(coordinator.states)})

    @app.page("/jobs")
    async def get_jobs(web: Any, request: Any) -> Any:
        return web.json(
            {
                "jobs": [
                    {"id": job_id, "status": state.status, "attempt": state.attempt}
                    for job_id, state in sorted(coordinator.states.items())
                ]
            }
        )

    @app.page("/jobs/{job_id}/checkpoints")
    async def get_checkpoints(web: Any, request: Any, job_id: str) -> Any:
        if job_id not in coordinator.states:
            return web.json({"errors": [f"job {job_id} is not known"]}, status=404)
        return web.json(checkpoints_json(coordinator.stats.get(job_id)))

    @app.page("/jobs/{job_id}/state")
    async def get_state(web: Any, request: Any, job_id: str) -> Any:
        state = coordinator.states.get(job_id)
        if state is None:
            return web.json({"errors": [f"job {job_id} is not known"]}, status=404)
        return web.json(state_json(state))

    @app.page("/jobs/{job_id}/checkpoints/config")
    async def get_checkpoint_config(web: Any, request: Any, job_id: str) -> Any:
        state = coordinator.states.get(job_id)
        if state is None:
            return web.json({"errors": [f"job {job_id} is not known"]}, status=404)
        return web.json(config_json(state.config))

    @app.page("/jobs/{job_id}/checkpoints/details/{checkpoint_id}")
    async def get_checkpoint_details(web: Any, request: Any, job_id: str, checkpoint_id: str) -> Any:
        stats = coordinator.stats.get(job_id)
        entry = stats.entry(int(checkpoint_id)) if stats and checkpoint_id.isdigit() else None
        if entry is None:
            return web.json(
                {"errors": [f"checkpoint {checkpoint_id} of {job_id} is not in the history"]}, status=404
            )
        return web.json(entry_json(entry))

    app.cutline_coordinator = coordinator  # type: ignore[attr-defined]
    app.cutline_recovered = recovered  # type: ignore[attr-defined]
    return app


async def take_arrived(
    stream: Any, max_events: int, within: float, quiet: float
) -> AsyncIterator[list[faust.EventT[Any]]]:
    """The events of ``stream`` in batches, and its events acked once the caller is done with a
    batch, so Faust commits no input offset before its decision is journaled (Faust flushes the
    producer before it commits). A batch ends ``within`` seconds after its first event, when no
    event came for ``quiet`` seconds, or at ``max_events``, whichever comes first.

    ``Stream.take_events`` (a batch every ``within``) wakes every ``within`` to look, even when
    nothing arrives: with 1 ms and four input agents that is 4,000 wake-ups a second for an idle
    coordinator; and a lone message waits for the whole window. Here a timer runs only while a
    batch is open, so an idle stream costs nothing, and a lone message waits ``quiet``. Built the
    way ``take_events`` is: a processor fills the batch while the stream is drained in the
    background, with automatic acks off.
    """
    loop = asyncio.get_running_loop()
    buffer: list[faust.EventT[Any]] = []
    ready = asyncio.Event()
    room = asyncio.Event()
    room.set()
    timer: asyncio.TimerHandle | None = None
    first = last = 0.0

    def expire() -> None:
        # Runs every ``quiet`` at most while a batch is open (cheaper than a new timer per event).
        nonlocal timer
        now = loop.time()
        end = min(first + within, last + quiet)
        if now >= end:
            timer = None
            ready.set()
        else:
            timer = loop.call_at(end, expire)

    async def add(value: Any) -> Any:
        nonlocal timer, first, last
        event = stream.current_event
        if event is None:
            raise RuntimeError("take_arrived: no current event")
        buffer.append(event)
        last = loop.time()
        if len(buffer) == 1:
            first = last
            if timer is None:
                timer = loop.call_at(first + min(quiet, within), expire)
        if len(buffer) >= max_events:
            ready.set()
            room.clear()
            await stream.wait(room)  # hold the stream until the batch is taken
        return value

    enable_acks = stream.enable_acks
    stream.enable_acks = False
    stream.add_processor(add)
    stream._enable_passive(aiter(stream.channel))
    try:
        while not stream.should_stop:
            if await stream.wait_for_stopped(ready):
                break
            ready.clear()
            if timer is not None:
                timer.cancel()
                timer = None
            batch = buffer[:]
            buffer.clear()
            room.set()
            if not batch:
                continue
            yield batch
            # Acked only once the caller is back for more: if deciding raised, the input stays
            # uncommitted and comes again after a restart (the journal's causes skip what it has).
            for event in batch:
                await stream.ack(event)
    finally:
        stream.enable_acks = enable_acks
        stream._processors.remove(add)


def _read_journal(bootstrap: str, topic: str) -> list[tuple[JournalEvent, bytes | None]]:
    def skip(message: LogMessage, problem: str) -> None:
        # Only the coordinator writes here; anything else was written by mistake. Folding it
        # is impossible, stopping would leave every job without a coordinator: skip it loudly.
        log.error("journal %s[%d]@%d skipped: %s", topic, message.partition, message.offset, problem)

    return [
        (event, message.headers.get(CAUSE_HEADER))
        for event, message in read_journal_topic(bootstrap, topic, skip)
    ]


def run(settings: Settings, loglevel: str = "warning") -> None:
    """Create missing topics and run the coordinator worker until interrupted.

    With ``CUTLINE_PROFILE=<dir>`` in the environment (``bench/bench_coordinator.py --profile``),
    every thread runs under cProfile and the dumps go to ``dir`` at exit.
    """
    if os.environ.get("CUTLINE_PROFILE"):
        _profile_threads(Path(os.environ["CUTLINE_PROFILE"]))
    created = ensure_topics(settings)
    if created:
        log.warning("created topics: %s", ", ".join(created))
    app = create_app(settings)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    # Faust always makes a terminal spinner, and for it sets the root logger to DEBUG: every debug
    # call of aiokafka and Faust (several per message) then builds a LogRecord that the WARNING
    # handler drops. No spinner keeps the root logger at ``loglevel`` (~10 % of the CPU per ack).
    worker.spinner = None
    worker.execute_from_commandline()


def _profile_threads(directory: Path) -> None:
    """cProfile every thread of this process (Faust's consumer runs in its own thread) and write
    ``coordinator-<pid>-<thread>.prof`` per thread into ``directory`` when it ends, or at exit."""
    import atexit
    import cProfile
    import threading

    directory.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    profilers: dict[str, cProfile.Profile] = {"main": cProfile.Profile()}
    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def profiled(self: threading.Thread) -> None:  # mode's ServiceThread overrides run(): wrap below it
        profiler = profilers[f"{self.name}-{len(profilers)}"] = cProfile.Profile()
        profiler.enable()
        bootstrap(self)

    def dump() -> None:
        for name, profiler in profilers.items():
            profiler.disable()
            profiler.dump_stats(directory / f"coordinator-{pid}-{name}.prof")

    threading.Thread._bootstrap_inner = profiled  # type: ignore[attr-defined]
    atexit.register(dump)
    profilers["main"].enable()


__all__ = ["Settings", "create_app", "ensure_topics", "run"]
