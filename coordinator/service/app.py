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
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, cast

import faust
from confluent_kafka import Producer
from faust.tables import TableManager
from faust.transport.drivers import aiokafka as faust_aiokafka

from coordinator.core.ownership import UNKNOWN_GENERATION
from coordinator.core.snapshot import PartitionSnapshot
from coordinator.service.broker_probe import BrokerProbe, metadata_probe
from coordinator.service.claims import PartitionRecovery, new_worker_id, snapshot_message
from coordinator.service.direct import DirectConsumer, use_direct_consumer
from coordinator.service.gc_schedule import GC_INTERVAL_S, ScheduledCollections
from coordinator.service.group_view import web_client_id
from coordinator.service.inputs import InputLoop, Ticker
from coordinator.service.metrics import InputLag, RefetchCounts
from coordinator.service.ports import SystemClock, ThreadExecutor
from coordinator.service.runtime import Coordinator, Outgoing
from coordinator.service.throttled_log import throttle_repeated_lines
from coordinator.service.views import host_guard, register_views
from coordinator.service.watchdog import MEMBER_FILE_ENV, membership_of, record_membership
from coordinator.service.watcher import JournalWatcher
from coordinator.service.web_trust import allowed_hosts
from coordinator.service.worker import Worker
from coordinator.service.writer import Writer, Written
from events.dev.broker import create_topics, max_message_bytes, partition_counts, topic_config
from events.kafka.client_config import aiokafka_security, client_properties, faust_credentials
from events.kafka.clients import producer_config
from events.task.latency import Granularity
from events.wire.sizes import DEFAULT_MAX_MESSAGE_BYTES, TopicLimits
from events.wire.topics import DEFAULT_PARTITIONS, DEFAULT_PREFIX, Topics

log = logging.getLogger("cutline.coordinator")


@dataclass(frozen=True)
class Settings:
    """How to run the coordinator."""

    bootstrap: str
    prefix: str = DEFAULT_PREFIX
    web_host: str = "127.0.0.1"
    """The address the web views listen on."""
    web_port: int = 6066
    web_advertised_host: str | None = None
    """The host name in the web address this worker advertises to its group (the dashboard links
    to it, and the other workers ask it for its jobs); None: ``web_host``."""
    web_allowed_hosts: tuple[str, ...] = ()
    """Host names the web views answer besides localhost, the advertised host and ``web_host``
    (a guard against DNS rebinding: docs/security.md)."""
    partitions: int = DEFAULT_PARTITIONS
    tick_interval: float = 0.01
    """Seconds between two ticks of a job that is due and not ticked yet (the resolution of the
    checkpoint timers)."""
    snapshot_interval: float = 10.0
    """Seconds between fold snapshots of an owned partition whose journal moved
    (docs/design.md, "Ownership and fencing")."""
    fetch_wait_ms: int = 2
    """``fetch.wait.max.ms`` of the input consumers (``--fetch-wait-ms``): short for the embedded
    broker, which answers a fetch that finds nothing only after half of it."""
    session_timeout: float = 6.0
    data_dir: Path = field(default_factory=lambda: Path(".cutline") / "coordinator")
    savepoint_roots: tuple[str, ...] = ()
    """Storage URIs savepoint targets must lie in (``--savepoint-root``); none: the parent of each
    job's checkpoint location (docs/security.md)."""
    latency_granularity: Granularity = Granularity.OPERATOR
    """What one latency histogram tells apart (Flink's ``metrics.latency.granularity``)."""

    @cached_property
    def topics(self) -> Topics:
        """Every topic name of ``prefix``, the coordinator's internal ones too."""
        return Topics(self.prefix)

    @property
    def app_id(self) -> str:
        return f"{self.prefix}coordinator"

    @property
    def advertised_host(self) -> str:
        return self.web_advertised_host or self.web_host


def now_ms() -> int:
    return time.time_ns() // 1_000_000


LOG_FLUSH_S = 1.0
"""Seconds between two looks for throttled log windows that ended (the count of the dead letters
a window held back is logged within this of its end: coordinator/service/log_throttle.py)."""


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


class TablelessManager(TableManager):
    """Faust's table manager, without the 1 s it sleeps at start so that tables declared late are
    still recovered: the coordinator declares no table (its state is the journal's fold), so that
    second only held every worker's start, before it joined its group. An app that declared a
    table gets Faust's wait back."""

    async def on_start(self) -> None:
        if self:
            await super().on_start()
        elif not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


MAX_RECORD_BYTES = DEFAULT_MAX_MESSAGE_BYTES
"""``max.message.bytes`` of the protocol topics, the journal and the ticks topic (Apache Kafka's
default): the coordinator never writes a record over a topic's limit (docs/design.md, "Record sizes")."""

TOPIC_CONFIG = {"max.message.bytes": str(MAX_RECORD_BYTES)}
"""Every protocol topic and the ticks topic."""

JOURNAL_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", **TOPIC_CONFIG}
"""The journal is the state: it is kept for ever (docs/design.md, "Ownership and fencing")."""

MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024
"""A partition's snapshot grows with its jobs' tasks (about 4 MB for 100 jobs of 100 tasks)."""

SNAPSHOTS_CONFIG = {"cleanup.policy": "compact", "max.message.bytes": str(MAX_SNAPSHOT_BYTES)}


def _patch_idempotence(enabled: bool) -> None:
    """Faust asks aiokafka for an idempotent producer only inside transactions; the coordinator
    wants one always
    (docs/design.md, "Ownership and fencing": a retried journal write must not land twice), where the broker
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

    # The probe's refusal is the answer, not an error: aiokafka's sender would log it as an ERROR
    # (with its own traceback) at every start on a broker that grants no producer id.
    sender = logging.getLogger("aiokafka.producer.sender")
    level = sender.level
    sender.setLevel(logging.CRITICAL)
    try:
        return asyncio.run(probe())
    finally:
        sender.setLevel(level)


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
    names = [*settings.topics.all, *settings.topics.internal]
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
    others = [n for n in (*topics.all, settings.topics.ticks) if n != topics.checkpoints]
    created = create_topics(
        settings.bootstrap, [topics.checkpoints], partitions=settings.partitions, config=JOURNAL_CONFIG
    )
    created += create_topics(
        settings.bootstrap,
        [settings.topics.snapshots],
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


def check_journal_retention(settings: Settings, config: dict[str, str] | None = None) -> None:
    """Refuse a journal topic that loses records (docs/design.md, "Ownership and fencing"), saying how to
    fix it: finite
    retention deletes old records, and compaction (``cleanup.policy`` with ``compact``) keeps one
    record per key, and journal records are keyed by job id. ``config`` is the topic's config
    (default: asked of the broker)."""
    topic = settings.topics.checkpoints
    if config is None:
        config = topic_config(settings.bootstrap, topic)
    policies = {p.strip(" []") for p in config.get("cleanup.policy", "delete").split(",")}
    compacted = "compact" in policies
    finite = {
        key: value
        for key, value in config.items()
        if key in ("retention.ms", "retention.bytes") and value.strip() not in ("-1", "")
    }
    if "delete" not in policies:
        finite.clear()  # nothing is deleted by time or size (compaction is refused below)
    if not finite and not compacted:
        return
    found = []
    if compacted:
        found.append(
            f"cleanup.policy={config['cleanup.policy']}: compaction keeps one record per key and "
            "journal records are keyed by job id, so the coordinator would forget checkpoints and "
            "jobs (what was compacted away is gone)"
        )
    if finite:
        settings_text = ", ".join(f"{k}={v}" for k, v in sorted(finite.items()))
        found.append(
            f"finite retention ({settings_text}): the coordinator would forget jobs and reuse "
            "checkpoint ids once old records are deleted"
        )
    # Leaving compaction for delete must not start deleting by the default 7 days: -1 goes too.
    fix = ("cleanup.policy=delete," if compacted else "") + "retention.ms=-1,retention.bytes=-1"
    raise JournalRetentionError(
        f"the journal topic {topic} loses records: {'; and '.join(found)}. Keep every record for "
        f"ever:\n  kafka-configs.sh --bootstrap-server {settings.bootstrap} --alter --entity-type "
        f"topics --entity-name {topic} --add-config {fix}"
    )


def create_app(settings: Settings, *, idempotent: bool = False) -> faust.App:
    """Build the Faust app for ``settings`` (topics must exist: :func:`ensure_topics`); its writes
    are idempotent when the broker supports it (:func:`broker_supports_idempotence`)."""
    _patch_fetch_wait(settings.fetch_wait_ms)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.bootstrap}",
        # the group's description then tells a CLI where each worker's views are (web_client_id)
        broker_client_id=web_client_id(settings.web_port),
        store="memory://",
        TableManager=TablelessManager,
        datadir=str(settings.data_dir),
        topic_partitions=settings.partitions,
        topic_replication_factor=1,
        broker_session_timeout=settings.session_timeout,
        broker_heartbeat_interval=min(1.0, settings.session_timeout / 3),
        consumer_auto_offset_reset="earliest",
        web_enabled=True,
        # Faust's own views (/router, /table, /graph, statistics) are none of cutline's: off, so that
        # the worker serves only its views, which answer a bad path with a 4xx (docs/security.md)
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
        web_stats_enabled=False,
        web_metrics_enabled=False,
        web_bind=settings.web_host,
        web_host=settings.advertised_host,
        web_port=settings.web_port,
        web_application_options={
            "middlewares": [
                host_guard(
                    allowed_hosts(settings.advertised_host, settings.web_host, settings.web_allowed_hosts)
                )
            ]
        },
        producer_linger=0.0,
        producer_max_request_size=MAX_SNAPSHOT_BYTES,
        stream_wait_empty=False,
        broker_credentials=faust_credentials(client_properties()),
    )
    shell = Shell(app, settings, idempotent)
    use_direct_consumer(
        app,
        [raw_topic(app, name, settings.partitions) for name in sorted(shell.input_topics)],
        shell.inputs.decide_batch,
        between_batches=shell.collections.collect_deferred,
    )
    app.task(shell.tick_when_due)
    app.task(shell.probe_broker)
    app.timer(settings.snapshot_interval)(shell.worker.write_snapshots)
    app.timer(GC_INTERVAL_S)(shell.collect_garbage)
    app.timer(LOG_FLUSH_S)(shell.flush_logs)
    app.on_partitions_revoked.connect(shell.on_revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(shell.on_assigned)  # type: ignore[arg-type]
    app.on_before_shutdown.connect(shell.close)  # type: ignore[arg-type]
    register_views(
        app, shell.coordinator, shell.worker, settings.topics, shell.worker.recovered, shell.input_lag,
        shell.collections, shell.broker, shell.refetches,
    )  # fmt: skip
    app.cutline_coordinator = shell.coordinator  # type: ignore[attr-defined]
    app.cutline_worker = shell.worker  # type: ignore[attr-defined]
    return app


class Shell:
    """What the Faust app does with what Faust hands it: batches of input decided and published,
    ticks, rebalances told to the :class:`~coordinator.service.worker.Worker`, writes and clean-up."""

    def __init__(self, app: faust.App, settings: Settings, idempotent: bool) -> None:
        self.app, self.settings, self.idempotent = app, settings, idempotent
        self.topics = topics = settings.topics
        self.collections = ScheduledCollections()
        self.limits = topic_limits(settings)
        self.coordinator = Coordinator(
            topics,
            partitions=settings.partitions,
            savepoint_roots=settings.savepoint_roots,
            limits=self.limits,
            latency_granularity=settings.latency_granularity,
        )
        self.publish_lock = asyncio.Lock()
        self.input_topics = {*topics.inputs, settings.topics.ticks}
        self.member_file = os.environ.get(MEMBER_FILE_ENV)
        self.ticks_topic = raw_topic(app, settings.topics.ticks, settings.partitions)
        self._writer: Writer | None = None
        self._claim_producer: Producer | None = None
        self._watcher: JournalWatcher | None = None
        self.broker = BrokerProbe(settings.bootstrap, metadata_probe(settings.bootstrap, topics.checkpoints))
        """Whether the broker answers (``/ready``, the dashboard): probed once the worker runs."""
        self.clock = SystemClock()
        self.worker = Worker(
            new_worker_id(),
            self.coordinator,
            self.publish_lock,
            self,
            self.new_recovery,
            ThreadExecutor(),
            self.clock,
            self,
            on_jobs_changed=lambda: self.ticker.due_moved.set(),
        )
        self.ticker = Ticker(self.worker, self.clock, self.send_tick, settings.tick_interval)
        self.inputs = InputLoop(
            self.worker,
            self.clock,
            topics,
            consumer=self,
            on_decided=self.ticker.due_moved.set,
            on_tick=self.ticker.decided,
        )

    # ------------------------------------------------------------ writes

    def writer(self) -> Writer:
        """The coordinator's producer for its writes, made on first use (on the worker's loop)."""
        if self._writer is None:
            self._writer = Writer(
                self.settings.bootstrap,
                idempotent=self.idempotent,
                home=self.home,
                limits=self.limits,  # the topics' own max.message.bytes: nothing over them is sent
            )
        return self._writer

    def home(self, key: bytes | None) -> int:
        """The partition of the job a record is keyed by (-1 for no key)."""
        return self.coordinator.partition_of(key.decode("utf-8", "replace")) if key else -1

    async def write(self, messages: Sequence[Outgoing]) -> Written:
        """:class:`~coordinator.service.ports.Writes`: the journal, barriers and dead letters,
        through the worker's own producer."""
        return await self.writer().write(messages)

    async def write_snapshot(self, snapshot: PartitionSnapshot) -> bool:
        """Write ``snapshot`` to the snapshots topic and wait for the broker; False if it failed."""
        key, value, headers = await asyncio.get_running_loop().run_in_executor(
            None, snapshot_message, snapshot, self.settings.partitions
        )
        producer = cast(Any, self.app.producer)._ensure_producer()
        try:
            future = await producer.send(
                self.settings.topics.snapshots,
                value=value,
                key=key,
                partition=snapshot.partition,
                headers=headers,
            )
            await future
        except Exception:
            log.exception("snapshot of journal partition %d not written", snapshot.partition)
            return False
        return True

    def new_recovery(self, partition: int) -> PartitionRecovery:
        """The I/O of one recovery of ``partition``, with the worker's one claim producer."""
        if self._claim_producer is None:
            self._claim_producer = Producer(producer_config(self.settings.bootstrap))
        return PartitionRecovery(
            self.settings.bootstrap,
            self.topics,
            self.settings.topics.snapshots,
            self.settings.partitions,
            partition,
            self.worker.worker_id,
            producer=self._claim_producer,
        )

    async def close(self, sender: Any = None, **kwargs: Any) -> None:
        loop = asyncio.get_running_loop()
        self.broker.close()
        await self.worker.close()
        if self._watcher is not None:
            await loop.run_in_executor(None, self._watcher.close)
        if self._writer is not None:
            await loop.run_in_executor(None, self._writer.close)
        if self._claim_producer is not None:
            await loop.run_in_executor(None, self._claim_producer.flush, 10)

    # ------------------------------------------------------------ input

    def prefetch(self) -> None:
        """:class:`~coordinator.service.ports.InputConsumer`: the next batch comes in while the
        journal is written (:meth:`DirectConsumer.prefetch`)."""
        consumer = self.app.consumer
        if isinstance(consumer, DirectConsumer):
            consumer.prefetch()

    def next_offset(self, topic: str, partition: int) -> int | None:
        consumer = self.app.consumer
        return consumer.next_offset(topic, partition) if isinstance(consumer, DirectConsumer) else None

    def committed(self, topic: str, partition: int) -> int | None:
        consumer = self.app.consumer
        return consumer.committed(topic, partition) if isinstance(consumer, DirectConsumer) else None

    async def rewind(self, topic: str, partition: int, offset: int) -> None:
        consumer = self.app.consumer
        if isinstance(consumer, DirectConsumer):
            await consumer.rewind(topic, partition, offset)

    # ------------------------------------------------------------ timers

    async def probe_broker(self) -> None:
        """Start probing the broker (in a thread of the probe's own: a probe blocks up to 2 s)."""
        self.broker.start()

    async def tick_when_due(self) -> None:
        """The ticker's loop (:class:`~coordinator.service.inputs.Ticker`), until the app stops."""
        await self.ticker.run(lambda: bool(self.app.should_stop))

    async def send_tick(self, job_id: str, now: int) -> None:
        await self.ticks_topic.send(key=job_id.encode(), value=str(now).encode())

    async def flush_logs(self) -> None:
        """Log how many dead letters (and dropped latency measurements) each ended window of the
        throttled logs held back, and the journal partitions held here too long undecided."""
        now = now_ms()
        self.coordinator.dead_letter_log.flush(now)
        self.coordinator.latency_log.flush(now)
        self.worker.log_undecided()

    async def collect_garbage(self) -> None:
        """The cycle collector's work, on a clock, in a worker that switched it off (:func:`run`)."""
        if gc.isenabled():
            return
        if self.publish_lock.locked():
            self.collections.defer()  # a batch is being decided: collect once its objects are freed
        else:
            self.collections.collect()

    # ------------------------------------------------------------ rebalances

    async def on_revoked(self, sender: Any, revoked: set[Any], **kwargs: Any) -> None:
        """Stop deciding revoked partitions at once (the worker drops their state under the lock)."""
        self.worker.revoked({tp.partition for tp in revoked if tp.topic in self.input_topics})

    def watch(self, partition: int, start: int) -> None:
        """:class:`~coordinator.service.ports.Watch`: the journal watcher (started on first use, on
        the worker's loop) tails ``partition`` from ``start``."""
        if self._watcher is None:
            self._watcher = JournalWatcher(
                self.settings.bootstrap,
                self.topics.checkpoints,
                asyncio.get_running_loop(),
                self.worker.journal_read,
            )
        self._watcher.watch(partition, start)

    def unwatch(self, partition: int) -> None:
        if self._watcher is not None:
            self._watcher.unwatch(partition)

    async def on_assigned(self, sender: Any, assigned: set[Any], **kwargs: Any) -> None:
        """Tell the worker its whole assignment and the generation (it claims in the background)."""
        generation = getattr(self.app, "consumer_generation_id", UNKNOWN_GENERATION)
        self.worker.assigned(generation, {tp.partition for tp in assigned if tp.topic in self.input_topics})
        if self.member_file:
            membership = membership_of(self.app.consumer)
            if membership is not None:
                record_membership(Path(self.member_file), membership)  # for the watchdog, should this die

    def refetches(self) -> RefetchCounts:
        consumer = self.app.consumer
        if not isinstance(consumer, DirectConsumer):
            return RefetchCounts()
        return RefetchCounts(consumer.records_fetched_again, consumer.partitions_sought_back)

    def input_lag(self) -> list[InputLag]:
        consumer = self.app.consumer
        read = consumer.read_offsets() if isinstance(consumer, DirectConsumer) else {}
        lags = []
        for tp in consumer.assignment():
            position, highwater = read.get(tp), consumer.highwater(tp)
            if tp.topic in self.input_topics and position is not None and highwater is not None:
                lags.append(InputLag(tp.topic, tp.partition, max(0, highwater - position - 1)))
        return lags


def raw_topic(app: faust.App, name: str, partitions: int) -> faust.TopicT:
    """A topic of raw bytes keys and values."""
    return app.topic(
        name,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=partitions,
    )


def run_coordinator(settings: Settings, loglevel: str = "warning") -> None:
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
        ""
        if idempotent
        else "; a journal write retried after a lost acknowledgement may land twice, next to itself "
        "(every reader acts on a repeated completion once). The embedded Tansu broker grants no "
        "producer id (docs/embedded-broker.md); Apache Kafka does",
    )
    app = create_app(settings, idempotent=idempotent)

    @app.task
    async def throttle_client_logs() -> None:
        """Once the worker has set its logging up: with the broker gone, one line per repeated
        client error and 10 s, with a count (docs/coordinator.md, "Logs")."""
        throttle_repeated_lines()

    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    # Faust always makes a terminal spinner, and for it sets the root logger to DEBUG: every debug
    # call of aiokafka and Faust (several per message) then builds a LogRecord that the WARNING
    # handler drops. No spinner keeps the root logger at ``loglevel`` (that work is paid per ack).
    worker.spinner = None
    freeze_heap()
    gc.disable()  # from here on collections run on a clock: create_app's collect_garbage timer
    worker.execute_from_commandline()


def freeze_heap() -> None:
    """Take every object alive now out of the garbage collector's sight (``gc.freeze``).

    A started worker holds a few hundred thousand long-lived objects (Faust, aiokafka, mode, the
    app) that every full collection walks again, a large share of the worker's CPU during an ack
    flood. Frozen, they are never walked or collected; whatever of them becomes garbage later is
    still freed by reference counting, and the collection first frees the cycles that are garbage
    now (docs/benchmarks.md)."""
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


__all__ = ["Settings", "create_app", "ensure_topics", "run_coordinator"]
