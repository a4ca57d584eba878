"""The worker's probe of its broker: does it answer a metadata request, now?

A worker whose broker died keeps answering its views from memory, and its Kafka clients retry in
the background: nothing in its state changes. So a thread of its own asks the broker for the
journal topic's metadata every :data:`PROBE_INTERVAL_S`, waiting at most :data:`PROBE_TIMEOUT_S`,
and folds each answer into a :class:`~coordinator.service.health.BrokerHealth` (pure:
:func:`coordinator.service.health.probed`), which ``/ready`` and the dashboard read. It logs one line when
the broker becomes unreachable and one when it answers again, never one per probe; its own client
logs nothing (the worker's other clients say enough about a refused connection).

A metadata request names the journal topic only (a broker with many topics answers it as cheaply)
and never creates it (``allow.auto.create.topics`` off: a fresh empty broker must not get a journal
with its default retention). A fresh broker on the same address is found by its cluster id, which
differs from the one the worker first read its journal on: the worker's own Kafka clients may have
auto-created the journal there already (:func:`coordinator.service.health.metadata_error`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from coordinator.service.health import BrokerHealth, metadata_error, probed
from events.wire.sizes import excerpt

log = logging.getLogger("cutline.coordinator")

PROBE_INTERVAL_S = 1.0
"""Between the end of one probe and the start of the next."""
PROBE_TIMEOUT_S = 2.0
"""How long one metadata request may take before the probe counts as failed."""

Ask = Callable[[], str | None]
"""One probe: None when the broker answered, else why not."""


def metadata_probe(bootstrap: str, topic: str, timeout: float = PROBE_TIMEOUT_S) -> Ask:
    """A probe asking ``bootstrap`` for ``topic``'s metadata through a client of its own (made at the
    first probe, with the worker's client settings)."""
    from confluent_kafka import KafkaException, Producer

    from events.kafka.clients import producer_config

    client: list[Producer] = []
    first_cluster: list[str] = []

    def ask() -> str | None:
        if not client:
            settings = {
                "client.id": "cutline-broker-probe",
                "allow.auto.create.topics": False,
                "reconnect.backoff.max.ms": 1000,  # a broker back up is noticed within a probe or two
                "log_level": 0,
            }
            client.append(Producer(producer_config(bootstrap, settings)))
        try:
            metadata = client[0].list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            return str(getattr(error, "str", lambda: error)())
        found = metadata.topics.get(topic)
        journal_found = found is not None and found.error is None
        cluster = metadata.cluster_id or None
        if journal_found and cluster is not None and not first_cluster:
            first_cluster.append(cluster)  # the cluster whose journal the worker reads
        return metadata_error(
            topic,
            bootstrap,
            journal_found=journal_found,
            first_cluster=first_cluster[0] if first_cluster else None,
            cluster=cluster,
        )

    return ask


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class BrokerProbe:
    """Probes the broker in a daemon thread; :attr:`health` is what it found so far."""

    def __init__(
        self,
        bootstrap: str,
        ask: Ask,
        *,
        interval: float = PROBE_INTERVAL_S,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.bootstrap = bootstrap
        self.health = BrokerHealth()
        """Replaced whole after each probe (read from any thread without a lock)."""
        self._ask, self._interval, self._clock = ask, interval, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> BrokerProbe:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cutline-broker-probe", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop probing (the thread ends after the probe under way, if any; it is not waited for)."""
        self._stop.set()

    def probe(self) -> BrokerHealth:
        """Probe once, note what changed, and return the health after it."""
        try:
            error = self._ask()
        except Exception as exc:  # a client that could not even be made: the broker is not reached
            error = f"{type(exc).__name__}: {excerpt(str(exc))}"
        before = self.health
        after = self.health = probed(before, self._clock(), error)
        self._say(before, after)
        return after

    def _say(self, before: BrokerHealth, after: BrokerHealth) -> None:
        if after.reachable is False and before.reachable is not False:
            log.error(
                "the broker at %s is unreachable (%d probes failed: %s); /ready answers 503 until it "
                "answers again",
                self.bootstrap,
                after.failures,
                after.error,
            )
        elif after.reachable and before.reachable is False and before.since_ms is not None:
            log.warning(
                "the broker at %s answers again, after %.1f s unreachable",
                self.bootstrap,
                (self._clock() - before.since_ms) / 1000,
            )

    def _run(self) -> None:
        while not self._stop.is_set():
            self.probe()
            self._stop.wait(self._interval)
