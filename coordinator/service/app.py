"""The coordinator service: a Faust app around :class:`coordinator.service.runtime.Coordinator`.

Each fetched batch of the input topics and the ticks topic goes straight to
the coordinator (:mod:`coordinator.service.direct`, no per-message agent path),
a timer turns the clock into ticks, and web views show Flink's checkpoint
statistics. A batch is the same few steps: decode → decide → evolve the
per-job state → append to the journal (the runtime does the first three in
memory; this module publishes), and only then are its offsets committable.

The per-job state table is the journal itself: start-up recovery folds the
journal topic into the states, skips inputs the journal already reflects when
Kafka redelivers them, and sends the barriers of pending checkpoints again.
There is no Faust table with a changelog: the changelog would be a second copy
of the journal, and Faust's changelog recovery hangs on the embedded broker,
whose ListOffsets answers are wrong (docs/embedded-broker.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from coordinator.service.direct import DirectConsumer, use_direct_consumer
from coordinator.service.gc_schedule import GC_INTERVAL_S, ScheduledCollections
from coordinator.service.metrics import CoordinatorCollector, InputLag, PartitionView, registry_for
from coordinator.service.ownership import (
    PartitionCountChanged,
    claim_partition,
    new_worker_id,
    snapshot_message,
)
from coordinator.service.runtime import Coordinator, Outcome
from coordinator.service.watchdog import MEMBER_FILE_ENV, membership_of, record_membership
from coordinator.service.writer import Writer, Written
from coordinator.snapshot import PartitionSnapshot
from coordinator.state import state_json
from coordinator.stats import checkpoints_json, config_json, entry_json
from events.broker import create_topics, max_message_bytes, partition_counts, topic_config
from events.client_config import aiokafka_security, client_properties, faust_credentials
from events.sizes import DEFAULT_MAX_MESSAGE_BYTES, TopicLimits
from events.topics import DEFAULT_PARTITIONS, DEFAULT_PREFIX, Topics

log = logging.getLogger("cutline.coordinator")


@dataclass(slots=True, eq=False)
class Owner:
    """This worker's hold on one partition: ``ready`` once it is claimed and folded (and set again,
    with ``revoked``, when it is taken away, to wake what waits for it)."""

    epoch: int = 0
    journal_offset: int = -1
    """The last journal offset this worker has written (or read to) in the partition."""
    snapshot_offset: int = -1
    """The journal offset the last snapshot it wrote covers."""
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    revoked: bool = False
    task: asyncio.Future[None] | None = None
    recovery_seconds: float | None = None
    """How long claiming and folding the partition took (for metrics)."""


@dataclass(frozen=True)
class Settings:
    """How to run the coordinator."""

    bootstrap: str
    prefix: str = DEFAULT_PREFIX
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    partitions: int = DEFAULT_PARTITIONS
    tick_interval: float = 0.01
    snapshot_interval: float = 10.0
    """Seconds between fold snapshots of an owned partition whose journal moved (DESIGN §4a)."""
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
    def snapshots_topic(self) -> str:
        """Compacted: per journal partition, snapshots of its fold and claim intents (DESIGN §4a)."""
        return f"{self.prefix}coordinator-snapshots"

    @property
    def ticks_topic(self) -> str:
        """Internal: ticks travel through Kafka so they reach the worker that owns the job."""
        return f"{self.prefix}coordinator-ticks"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


RECLAIM_MISPLACED_S = 30.0
"""Seconds between claims of a partition whose jobs belong elsewhere (``PartitionCountChanged``):
only an operator can fix that, so the error is logged twice a minute, not every second."""

SLOW_BATCH_S = 1.0
"""A batch of input that took longer than this from its fetch to its durable journal writes, or
whose oldest message was older than this when fetched, is logged (with where the time went)."""


def _report_slow_batch(
    messages: Sequence[Any], arrived: float, deciding: float, decided: float, published: float
) -> None:
    """Log a batch that waited, or whose journal writes took, more than ``SLOW_BATCH_S``: a checkpoint
    then completes that much later, and the log says in which step (an input that reached the
    broker late shows as its age at the fetch: the message's CreateTime against this clock)."""
    fetched_at = time.time() - (published - arrived)  # the wall clock when the batch arrived
    timestamps = [m.timestamp for m in messages if getattr(m, "timestamp", None)]  # CreateTime, ms
    age = fetched_at - min(timestamps) / 1000 if timestamps else 0.0
    if max(published - arrived, age) <= SLOW_BATCH_S:
        return
    log.warning(
        "slow batch of %d inputs (first %s[%d]@%d): %.2f s old when fetched, %.2f s waiting for its "
        "partitions and the publish lock, %.2f s deciding, %.2f s until the journal writes were acked",
        len(messages),
        messages[0].topic,
        messages[0].partition,
        messages[0].offset,
        age,
        deciding - arrived,
        decided - deciding,
        published - decided,
    )


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


DASHBOARD = {
    path.name: path.read_bytes() for path in (Path(__file__).parent / "dashboard").iterdir() if path.is_file()
}
"""The web dashboard's static files (coordinator/service/dashboard/), served at ``/``."""
ASSET_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}

MAX_RECORD_BYTES = DEFAULT_MAX_MESSAGE_BYTES
"""``max.message.bytes`` of the protocol topics, the journal and the ticks topic (Apache Kafka's
default): the coordinator never writes a record over a topic's limit (DESIGN §4a "Sizes")."""

TOPIC_CONFIG = {"max.message.bytes": str(MAX_RECORD_BYTES)}
"""Every protocol topic and the ticks topic."""

JOURNAL_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", **TOPIC_CONFIG}
"""The journal is the state: it is kept for ever (DESIGN §4a)."""

MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024
"""A partition's snapshot grows with its jobs' tasks (about 4 MB for 100 jobs of 100 tasks)."""

SNAPSHOTS_CONFIG = {"cleanup.policy": "compact", "max.message.bytes": str(MAX_SNAPSHOT_BYTES)}


def _patch_idempotence(enabled: bool) -> None:
    """Faust asks aiokafka for an idempotent producer only inside transactions; the coordinator
    wants one always (DESIGN §4a: a retried journal write must not land twice), where the broker
    supports it."""
    original = getattr(faust_aiokafka.Producer, "_cutline_original_extra", None)
    if original is None:
        original = faust_aiokafka.Producer._settings_extra
        faust_aiokafka.Producer._cutline_original_extra = original  # type: ignore[attr-defined]

    def extra(self: Any) -> Any:
        settings = dict(original(self))
        if enabled:
            settings.update({"acks": "all", "enable_idempotence": True})
        return settings

    faust_aiokafka.Producer._settings_extra = extra  # type: ignore[method-assign]


def broker_supports_idempotence(bootstrap: str, timeout: float = 10.0) -> tuple[bool, str]:
    """Can an aiokafka producer (Faust's) be idempotent against ``bootstrap``? And why not.

    The embedded broker (Tansu 0.6) answers aiokafka's InitProducerId v0 with an unknown error
    (docs/embedded-broker.md); Apache Kafka accepts it."""
    from aiokafka import AIOKafkaProducer

    async def probe() -> tuple[bool, str]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, enable_idempotence=True, **aiokafka_security(client_properties())
        )
        try:
            await asyncio.wait_for(producer.start(), timeout)
            return True, "the broker granted a producer id"
        except Exception as exc:
            return False, f"the broker refused an idempotent producer ({type(exc).__name__}: {exc})"
        finally:
            with contextlib.suppress(Exception):
                await producer.stop()

    return asyncio.run(probe())


class TopicLayoutError(RuntimeError):
    """The topics of one prefix do not all have the same number of partitions."""


def settle_partitions(settings: Settings) -> Settings:
    """``settings`` with the partition count the prefix's topics already have.

    A job's inputs, journal records, fold snapshots and ticks are in the same partition number of
    every topic. The coordinator works that number out from the job's key and the partition count
    (``Coordinator.partition_of``): to fold a claimed partition, to snapshot it, to drop it when it
    is revoked. With a count other than the topics' own, a claim would leave out the jobs it owns,
    and a restarted or new owner would not know them. So the count is the one the topics were
    created with (``cutline topics create --partitions N``). ``settings.partitions`` applies only
    when none of them exists yet, and they are then created with it. Raises
    :class:`TopicLayoutError` when existing topics differ."""
    names = [*settings.topics.all, settings.ticks_topic, settings.snapshots_topic]
    counts = partition_counts(settings.bootstrap, names)
    found = sorted(set(counts.values()))
    if not found:
        return settings
    if len(found) > 1:
        listing = "; ".join(
            f"{n} partitions: {', '.join(sorted(t for t, c in counts.items() if c == n))}" for n in found
        )
        raise TopicLayoutError(
            f"the topics of prefix {settings.prefix!r} have different partition counts ({listing}). A job's "
            "records go to the same partition number of each, so they need one count. Recreate the odd "
            "ones, or create all of them under a new prefix: cutline topics create --bootstrap "
            f"{settings.bootstrap} --topic-prefix <new prefix> --partitions N (the journal's count cannot "
            "change once jobs have run)"
        )
    (count,) = found
    if count != settings.partitions:
        log.info("the topics of prefix %r have %d partitions each: using %d", settings.prefix, count, count)
    return replace(settings, partitions=count)


def ensure_topics(settings: Settings) -> list[str]:
    """Create every protocol topic, the internal ticks topic and the snapshots topic that is missing;
    the journal with infinite retention, the snapshots compacted; each with an explicit
    ``max.message.bytes`` (the snapshots' larger)."""
    topics = settings.topics
    others = [n for n in (*topics.all, settings.ticks_topic) if n != topics.checkpoints]
    created = create_topics(
        settings.bootstrap, [topics.checkpoints], partitions=settings.partitions, config=JOURNAL_CONFIG
    )
    created += create_topics(
        settings.bootstrap,
        [settings.snapshots_topic],
        partitions=settings.partitions,
        config=SNAPSHOTS_CONFIG,
    )
    return created + create_topics(
        settings.bootstrap, others, partitions=settings.partitions, config=TOPIC_CONFIG
    )


def topic_limits(settings: Settings) -> TopicLimits:
    """The ``max.message.bytes`` of every topic the coordinator writes to, as the cluster reports
    them (read once at start): the runtime admits no decision whose records would not fit, and
    the writer sends no record over them."""
    topics = settings.topics
    written = [topics.checkpoints, topics.barriers, topics.dead_letters]
    return TopicLimits(max_message_bytes(settings.bootstrap, written))


class JournalRetentionError(RuntimeError):
    """The journal topic deletes old records: a restarted coordinator would forget jobs."""


def check_journal_retention(settings: Settings) -> None:
    """Refuse a journal topic whose retention is finite (DESIGN §4a), saying how to fix it."""
    topic = settings.topics.checkpoints
    config = topic_config(settings.bootstrap, topic)
    finite = {
        key: value
        for key, value in config.items()
        if key in ("retention.ms", "retention.bytes") and value.strip() not in ("-1", "")
    }
    if "delete" not in config.get("cleanup.policy", "delete"):
        finite.pop("retention.ms", None)  # compact only: nothing is deleted by time
        finite.pop("retention.bytes", None)
    if finite:
        settings_text = ", ".join(f"{k}={v}" for k, v in sorted(finite.items()))
        raise JournalRetentionError(
            f"the journal topic {topic} has finite retention ({settings_text}): the coordinator would "
            "forget jobs and reuse checkpoint ids once old records are deleted. Keep it for ever:\n"
            f"  kafka-configs.sh --bootstrap-server {settings.bootstrap} --alter --entity-type topics "
            f"--entity-name {topic} --add-config retention.ms=-1,retention.bytes=-1"
        )


def create_app(settings: Settings, *, idempotent: bool = False) -> faust.App:
    """Build the Faust app for ``settings`` (topics must exist: :func:`ensure_topics`); its writes
    are idempotent when the broker supports it (:func:`broker_supports_idempotence`)."""
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
        producer_max_request_size=MAX_SNAPSHOT_BYTES,
        stream_wait_empty=False,
        broker_credentials=faust_credentials(client_properties()),
    )
    collections = ScheduledCollections()
    limits = topic_limits(settings)
    coordinator = Coordinator(
        topics, partitions=settings.partitions, savepoint_roots=settings.savepoint_roots, limits=limits
    )
    recovered = asyncio.Event()
    publish_lock = asyncio.Lock()
    owners: dict[int, Owner] = {}
    input_topics = {*topics.inputs, settings.ticks_topic}
    worker_id = new_worker_id()
    member_file = os.environ.get(MEMBER_FILE_ENV)

    def raw_topic(name: str) -> faust.TopicT:
        return app.topic(
            name,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=settings.partitions,
        )

    ticks_topic = raw_topic(settings.ticks_topic)

    async def publish(outcomes: Sequence[Outcome]) -> set[int]:
        """Journal first; barriers and dead letters once the broker holds the journal records.

        Every write is awaited: input offsets are committed (acked) only after every journal
        write of the input is acknowledged. Returns the partitions whose writes failed."""
        journal = [m for o in outcomes for m in o.messages if m.topic == topics.checkpoints]
        others = [m for o in outcomes for m in o.messages if m.topic != topics.checkpoints]
        failed = _note(await writer().write(journal))
        if others:
            failed |= _note(await writer().write([m for m in others if _home(m.key) not in failed]))
        return failed

    writers: list[Writer] = []

    def writer() -> Writer:
        """The coordinator's producer for its writes, made on first use (on the worker's loop)."""
        if not writers:
            writers.append(
                Writer(
                    settings.bootstrap,
                    idempotent=idempotent,
                    home=_home,
                    limits=limits,  # the topics' own max.message.bytes: nothing over them is sent
                )
            )
        return writers[0]

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def close_writer(sender: Any, **kwargs: Any) -> None:
        for made in writers:
            await asyncio.get_running_loop().run_in_executor(None, made.close)

    def _note(written: Written) -> set[int]:
        """The partitions whose writes failed; the journal offsets of the others move on."""
        for (topic, partition), error in written.failed.items():
            log.error("write to %s[%d] failed: %s; the partition recovers", topic, partition, error)
        for (topic, partition), offset in written.last_offsets.items():
            if topic == topics.checkpoints and partition in owners:
                owner = owners[partition]
                owner.journal_offset = max(owner.journal_offset, offset)
        return {partition for _, partition in written.failed if partition >= 0}  # -1: no job to recover

    def _home(key: bytes | None) -> int:
        """The partition of the job a record is keyed by (-1 for no key)."""
        return coordinator.partition_of(key.decode("utf-8", "replace")) if key else -1

    def assigned_partitions() -> set[int]:
        return {tp.partition for tp in app.consumer.assignment() if tp.topic in input_topics}

    async def wait_for_owners(partitions_of_batch: set[int]) -> None:
        """Hold a batch until each of its partitions is claimed and folded (or revoked).

        Faust may hand over messages of a new assignment before ``on_assigned`` has run (it
        resumes streams early when the app has no tables): such a partition is claimed here."""
        for partition in partitions_of_batch:
            if partition not in owners and partition in assigned_partitions():
                start_recovery(partition)
            owner = owners.get(partition)
            if owner is not None:
                await owner.ready.wait()

    async def decide_batch(messages: Sequence[Any], decide: Callable[[Any, Owner], Outcome | None]) -> None:
        """Decide ``messages`` in order as the owner of their partitions, publish, and retry what a
        failed write lost once its partition has recovered (inputs the journal holds are skipped)."""
        failures = 0
        arrived = time.monotonic()
        while True:
            await wait_for_owners({m.partition for m in messages})
            async with publish_lock:
                if any(not owners[m.partition].ready.is_set() for m in messages if m.partition in owners):
                    continue  # a partition started recovering meanwhile
                deciding = time.monotonic()
                outcomes = []
                with coordinator.batch():  # one view of the file system for the batch's link checks
                    for message in messages:
                        owner = owners.get(message.partition)
                        if owner is None or not owner.ready.is_set():
                            continue  # revoked: its new owner decides it
                        outcome = decide(message, owner)
                        if outcome is not None:
                            outcomes.append(outcome)
                decided = time.monotonic()
                if isinstance(app.consumer, DirectConsumer):
                    app.consumer.prefetch()  # the next batch comes in while the journal is written
                failed = await publish(outcomes)
                _report_slow_batch(messages, arrived, deciding, decided, time.monotonic())
                if not failed:
                    return
                for partition in failed:
                    start_recovery(partition, again=True)
            failures += 1
            # A write that keeps failing (a broker refusing the record) must not spin: back off.
            await asyncio.sleep(min(30.0, 0.25 * 2**failures))

    def decide_input(message: Any, owner: Owner) -> Outcome | None:
        if coordinator.already_decided(message.topic, message.partition, message.offset):
            return None
        return coordinator.handle(
            message.topic,
            message.partition,
            message.offset,
            message.key,
            message.value,
            now_ms(),
            headers=message.headers,
            epoch=owner.epoch,
        )

    def decide_tick(message: Any, owner: Owner) -> Outcome | None:
        try:
            job_id = message.key.decode()
        except (AttributeError, UnicodeDecodeError):
            log.warning(
                "tick without a job id at %s[%d]@%d skipped", message.topic, message.partition, message.offset
            )
            return None
        if job_id not in coordinator.states:
            return None  # a job of a partition this worker no longer (or not yet) holds
        return coordinator.tick(job_id, now_ms(), epoch=owner.epoch)

    def decide(message: Any, owner: Owner) -> Outcome | None:
        return (decide_tick if message.topic == settings.ticks_topic else decide_input)(message, owner)

    async def decide_fetched(messages: Sequence[Any]) -> None:
        """Each fetched batch of inputs and ticks, decided at once (coordinator/service/direct.py)."""
        await decide_batch(messages, decide)

    use_direct_consumer(
        app,
        [raw_topic(name) for name in sorted(input_topics)],
        decide_fetched,
        between_batches=collections.collect_deferred,
    )

    ticked: dict[str, int] = {}

    @app.timer(settings.tick_interval)
    async def send_ticks() -> None:
        # Every worker ticks the jobs it holds (those of its claimed partitions); a tick decides
        # nothing unless due.
        now = now_ms()
        for job_id in coordinator.due(now):
            if ticked.get(job_id, 0) + 50 > now:
                continue  # the last tick is still on its way
            ticked[job_id] = now
            await ticks_topic.send(key=job_id.encode(), value=str(now).encode())

    def start_recovery(partition: int, again: bool = False) -> None:
        """Claim and fold ``partition`` in the background; its input waits meanwhile."""
        previous = owners.get(partition)
        if previous is not None and not again:
            return
        if previous is not None:
            previous.revoked = True
        owner = owners[partition] = Owner()
        coordinator.drop_partition(partition)
        recovered.clear()
        owner.task = asyncio.ensure_future(recover_partition(partition, owner))

    async def recover_partition(partition: int, owner: Owner) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                claimed = await loop.run_in_executor(
                    None,
                    lambda: claim_partition(
                        settings.bootstrap,
                        topics,
                        settings.snapshots_topic,
                        settings.partitions,
                        partition,
                        worker_id,
                    ),
                )
                break
            except PartitionCountChanged as exc:
                if owner.revoked:
                    return
                log.error("%s; its jobs get no checkpoints. Trying again in %g s", exc, RECLAIM_MISPLACED_S)
                await asyncio.sleep(RECLAIM_MISPLACED_S)
            except Exception:
                if owner.revoked:
                    return
                log.exception("claiming journal partition %d failed; trying again in 1 s", partition)
                await asyncio.sleep(1.0)
        async with publish_lock:
            if owner.revoked or owners.get(partition) is not owner:
                return  # revoked while it folded: the claim is void or will be
            coordinator.merge(claimed.coordinator, partition)
            owner.epoch = claimed.epoch
            owner.journal_offset = claimed.claim_offset
            owner.recovery_seconds = claimed.seconds
            failed = await publish([Outcome(messages=coordinator.resume(now_ms(), partition, owner.epoch))])
            if failed:
                log.error("barriers of partition %d could not be resent; recovering it again", partition)
                start_recovery(partition, again=True)
                return
            # The first snapshot of this epoch, before any decision: a later claimer that sees this
            # epoch's intent finds its snapshot (ownership.py, "Claim intents").
            snapshot = coordinator.snapshot(partition, owner.epoch, owner.journal_offset, now_ms())
        if await write_snapshot(snapshot):
            owner.snapshot_offset = snapshot.journal_offset
        # else: a later claimer sees this epoch's intent without its snapshot and folds from the
        # start of the journal (ownership.py): slower, never wrong.
        log.info(
            "claimed journal partition %d with epoch %d at offset %d: %d records folded%s in %.2fs",
            partition,
            claimed.epoch,
            claimed.claim_offset,
            claimed.folded,
            "" if claimed.snapshot_offset is None else f" after the snapshot at {claimed.snapshot_offset}",
            claimed.seconds,
        )
        owner.ready.set()
        if all(o.ready.is_set() for o in owners.values()):
            recovered.set()

    async def write_snapshot(snapshot: PartitionSnapshot) -> bool:
        """Write ``snapshot`` to the snapshots topic and wait for the broker; False if it failed."""
        key, value, headers = await asyncio.get_running_loop().run_in_executor(
            None, snapshot_message, snapshot, settings.partitions
        )
        producer = cast(Any, app.producer)._ensure_producer()
        try:
            future = await producer.send(
                settings.snapshots_topic, value=value, key=key, partition=snapshot.partition, headers=headers
            )
            await future
        except Exception:
            log.exception("snapshot of journal partition %d not written", snapshot.partition)
            return False
        return True

    @app.timer(settings.snapshot_interval)
    async def write_snapshots() -> None:
        """Bounded recovery: a snapshot of each owned partition whose journal moved since its last."""
        for partition, owner in list(owners.items()):
            if not owner.ready.is_set() or owner.revoked or owner.journal_offset <= owner.snapshot_offset:
                continue
            async with publish_lock:  # no decision half-published: the state is the journal's fold
                if owners.get(partition) is not owner or not owner.ready.is_set():
                    continue
                snapshot = coordinator.snapshot(partition, owner.epoch, owner.journal_offset, now_ms())
            if await write_snapshot(snapshot):
                owner.snapshot_offset = snapshot.journal_offset

    @app.timer(GC_INTERVAL_S)
    async def collect_garbage() -> None:
        """The cycle collector's work, on a clock, in a worker that switched it off (:func:`run`)."""
        if gc.isenabled():
            return
        if publish_lock.locked():
            collections.defer()  # a batch is being decided: collect once its objects are freed
        else:
            collections.collect()

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, revoked: set[Any], **kwargs: Any) -> None:
        """Stop deciding revoked partitions at once; wait for a decision in flight and its writes."""
        gone = {tp.partition for tp in revoked if tp.topic in input_topics}
        for partition in gone:
            owner = owners.pop(partition, None)
            if owner is not None:
                owner.revoked = True
                owner.ready.set()  # wakes batches that wait for it; they skip a revoked partition
        async with publish_lock:
            for partition in gone:
                coordinator.drop_partition(partition)

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, assigned: set[Any], **kwargs: Any) -> None:
        """Claim every newly assigned partition (in the background: the rebalance must not wait)."""
        mine = {tp.partition for tp in assigned if tp.topic in input_topics}
        for partition in sorted(mine - owners.keys()):
            start_recovery(partition)
        app.cutline_assigned = True  # type: ignore[attr-defined]
        if member_file:
            membership = membership_of(app.consumer)
            if membership is not None:
                record_membership(Path(member_file), membership)  # for the watchdog, should this die
        if all(o.ready.is_set() for o in owners.values()):
            recovered.set()

    @app.page("/ready")
    async def get_ready(web: Any, request: Any) -> Any:
        return web.json(
            {
                "recovered": recovered.is_set(),
                "jobs": len(coordinator.states),
                "worker": worker_id,
                "pid": os.getpid(),
                "partitions": {
                    str(p): {"epoch": o.epoch, "ready": o.ready.is_set()} for p, o in owners.items()
                },
            }
        )

    @app.page("/jobs")
    async def get_jobs(web: Any, request: Any) -> Any:
        return web.json(
            {"jobs": [job_overview(job_id, state) for job_id, state in sorted(coordinator.states.items())]}
        )

    def job_overview(job_id: str, state: Any) -> dict[str, Any]:
        stats = coordinator.stats.get(job_id)
        latest = stats.latest_completed if stats else None
        return {
            "id": job_id,
            "status": state.status,
            "attempt": state.attempt,
            "restarts": state.restarts,
            "counts": {
                "total": stats.total if stats else 0,
                "completed": stats.completed if stats else 0,
                "in_progress": stats.in_progress if stats else 0,
                "failed": stats.failed if stats else 0,
            },
            "last_completed": None
            if latest is None
            else {"id": latest.id, "timestamp": latest.trigger_timestamp + (latest.end_to_end_duration or 0)},
        }

    @app.page("/workers")
    async def get_workers(web: Any, request: Any) -> Any:
        """This worker and every member of the group with the journal partitions it owns (Faust's
        assignor knows each member's web URL): the dashboard links to the others."""
        self_url = str(app.conf.canonical_url)
        held: dict[str, set[int]] = {self_url: set()}
        with contextlib.suppress(Exception):  # no assignment yet: only this worker
            for url, by_topic in app.router.external_topics_metadata().items():
                held.setdefault(str(url), set()).update(by_topic.get(topics.job_status, ()))
        return web.json(
            {
                "self": self_url,
                "workers": [{"url": u, "partitions": sorted(p)} for u, p in sorted(held.items())],
            }
        )

    @app.page("/jobs/{job_id}/checkpoints/trend")
    async def get_trend(web: Any, request: Any, job_id: str) -> Any:
        """Durations and sizes of the last completed checkpoints (at most 100), oldest first."""
        stats = coordinator.stats.get(job_id)
        if job_id not in coordinator.states:
            return web.json({"errors": [f"job {job_id} is not known"]}, status=404)
        return web.json(
            {
                "end_to_end_duration": list(stats.durations[-100:]) if stats else [],
                "state_size": list(stats.sizes[-100:]) if stats else [],
            }
        )

    @app.page("/")
    async def get_root(web: Any, request: Any) -> Any:
        return web.bytes(DASHBOARD["index.html"], headers={"Content-Type": "text/html; charset=utf-8"})

    @app.page("/dashboard/{name}")
    async def get_asset(web: Any, request: Any, name: str) -> Any:
        if name not in DASHBOARD:
            return web.json({"errors": [f"no dashboard file {name!r}"]}, status=404)
        return web.bytes(DASHBOARD[name], headers={"Content-Type": ASSET_TYPES[Path(name).suffix]})

    @app.page("/jobs/{job_id}/checkpoints")
    async def get_checkpoints(web: Any, request: Any, job_id: str) -> Any:
        if job_id not in coordinator.states:
            return web.json({"errors": [f"job {job_id} is not known"]}, status=404)
        return web.json(checkpoints_json(coordinator.checkpoint_stats(job_id)))

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
        stats = coordinator.checkpoint_stats(job_id)
        entry = stats.entry(int(checkpoint_id)) if stats and checkpoint_id.isdigit() else None
        if entry is None:
            return web.json(
                {"errors": [f"checkpoint {checkpoint_id} of {job_id} is not in the history"]}, status=404
            )
        return web.json(entry_json(entry))

    def partition_views() -> list[PartitionView]:
        return [
            PartitionView(p, o.epoch, o.ready.is_set(), o.journal_offset, o.recovery_seconds)
            for p, o in list(owners.items())
        ]

    def input_lag() -> list[InputLag]:
        consumer = app.consumer
        read = consumer.read_offsets() if isinstance(consumer, DirectConsumer) else {}
        lags = []
        for tp in consumer.assignment():
            position, highwater = read.get(tp), consumer.highwater(tp)
            if tp.topic in input_topics and position is not None and highwater is not None:
                lags.append(InputLag(tp.topic, tp.partition, max(0, highwater - position - 1)))
        return lags

    metrics = registry_for(CoordinatorCollector(coordinator, partition_views, input_lag, collections))

    @app.page("/metrics")
    async def get_metrics(web: Any, request: Any) -> Any:
        """Prometheus text format (coordinator/service/metrics.py)."""
        return web.bytes(generate_latest(metrics), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.cutline_coordinator = coordinator  # type: ignore[attr-defined]
    app.cutline_recovered = recovered  # type: ignore[attr-defined]
    return app


def run(settings: Settings, loglevel: str = "warning") -> None:
    """Create missing topics and run the coordinator worker until interrupted.

    With ``CUTLINE_PROFILE=<dir>`` in the environment (``bench/bench_coordinator.py --profile``),
    every thread runs under cProfile and the dumps go to ``dir`` at exit.
    """
    if os.environ.get("CUTLINE_PROFILE"):
        _profile_threads(Path(os.environ["CUTLINE_PROFILE"]))
    settings = settle_partitions(settings)  # missing topics are made with the existing ones' count
    created = ensure_topics(settings)
    if created:
        log.warning("created topics: %s", ", ".join(created))
        settings = settle_partitions(settings)  # another worker may have made some at the same time
    check_journal_retention(settings)
    idempotent, why = broker_supports_idempotence(settings.bootstrap)
    _patch_idempotence(idempotent)
    (log.info if idempotent else log.warning)(
        "idempotent producer: %s (%s)%s",
        "on" if idempotent else "off",
        why,
        "" if idempotent else "; a journal write the producer retries may land twice",
    )
    app = create_app(settings, idempotent=idempotent)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    # Faust always makes a terminal spinner, and for it sets the root logger to DEBUG: every debug
    # call of aiokafka and Faust (several per message) then builds a LogRecord that the WARNING
    # handler drops. No spinner keeps the root logger at ``loglevel`` (~10 % of the CPU per ack).
    worker.spinner = None
    freeze_heap()
    gc.disable()  # from here on collections run on a clock: create_app's collect_garbage timer
    worker.execute_from_commandline()


def freeze_heap() -> None:
    """Take every object alive now out of the garbage collector's sight (``gc.freeze``).

    A started worker holds a few hundred thousand long-lived objects (Faust, aiokafka, mode, the
    app) that every full collection walks again: during an ack flood, collections took about 15 %
    of the worker's CPU. Frozen, they are never walked or collected; whatever of them becomes
    garbage later is still freed by reference counting, and the collection first frees the cycles
    that are garbage now. Three alternated runs each: 6.5-7.2k acks/s without, 8.6-9.2k with
    (docs/benchmarks.md)."""
    gc.collect()
    gc.freeze()


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
