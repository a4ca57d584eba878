"""Is a coordinator worker ready, and does it reach its broker? Pure.

A worker holds its jobs' state in memory, so without a broker it still answers every view, and
they all look healthy: a job RUNNING, partitions DECIDING. What tells the truth is a probe of the
broker (coordinator/service/broker_probe.py asks it for the journal topic's metadata every second):
:func:`probed` folds each answer into a :class:`BrokerHealth`, and :func:`readiness` turns it and
the worker's recovery into ``/ready``'s answer (200 or 503) and the dashboard's banner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from coordinator.service.units import format_duration

FAILURES_BEFORE_UNREACHABLE = 2
"""Failed probes in a row before the broker counts as unreachable: one probe that times out on a
busy machine is not an outage."""


@dataclass(frozen=True)
class BrokerHealth:
    """What the probes of the broker found so far."""

    reachable: bool | None = None
    """None until a probe answered or :data:`FAILURES_BEFORE_UNREACHABLE` failed."""
    since_ms: int | None = None
    """When ``reachable`` took its value."""
    last_reached_ms: int | None = None
    """The last probe the broker answered."""
    error: str | None = None
    """Why the latest probe failed (None after one that did not)."""
    failures: int = 0
    """Failed probes in a row."""


def probed(health: BrokerHealth, now_ms: int, error: str | None) -> BrokerHealth:
    """``health`` after a probe at ``now_ms`` that the broker answered (``error`` None) or not."""
    if error is None:
        since = health.since_ms if health.reachable else now_ms
        return BrokerHealth(reachable=True, since_ms=since, last_reached_ms=now_ms)
    failures = health.failures + 1
    if failures < FAILURES_BEFORE_UNREACHABLE:
        return replace(health, error=error, failures=failures)
    since = health.since_ms if health.reachable is False else now_ms
    return replace(health, reachable=False, since_ms=since, error=error, failures=failures)


def metadata_error(
    journal: str, bootstrap: str, *, journal_found: bool, first_cluster: str | None, cluster: str | None
) -> str | None:
    """Why a broker that answered a metadata request is not the one the worker reads, or None.

    A new, empty broker on the same address (the embedded broker restarted; an Apache Kafka
    formatted again) has another cluster id, and may have the journal again without its records,
    auto-created by one of the worker's own clients. So the cluster id the worker first saw
    (``first_cluster``) is compared with the one answering now (``cluster``; None when a broker does
    not tell), and a missing journal is named too.
    """
    if first_cluster is not None and cluster is not None and cluster != first_cluster:
        return (
            f"{bootstrap} is another Kafka cluster now (cluster id {cluster}, where this worker started on "
            f"{first_cluster}): a new, empty broker on the same address? Its topics are not the ones "
            f"this worker read. Create cutline's topics ({journal} and the rest) there with `cutline "
            "topics create` and restart the worker (the jobs start again), or point the coordinator "
            "at the broker that has them"
        )
    if not journal_found:
        return (
            f"it answers, but has no journal topic {journal} (a new, empty broker?): create cutline's "
            "topics with `cutline topics create` (and the jobs start again), or point the "
            "coordinator at the broker that has them"
        )
    return None


@dataclass(frozen=True)
class Readiness:
    """``/ready``'s verdict: ready (200) or not (503), and every reason why not."""

    ready: bool
    problems: tuple[str, ...] = ()


def readiness(
    health: BrokerHealth,
    bootstrap: str,
    now_ms: int,
    *,
    assignment_pending: bool,
    phases: Mapping[int, str],
    why: Mapping[int, str] | None = None,
) -> Readiness:
    """Ready when the broker is not known unreachable, the worker has its assignment and decides
    every journal partition it holds (``phases``: each held partition's phase, ``DECIDING`` when
    decided here; ``why``: why one is not, where known)."""
    problems = []
    if health.reachable is False:
        since = health.since_ms if health.since_ms is not None else now_ms
        problems.append(
            f"the broker at {bootstrap} is unreachable (for {format_duration(max(0, now_ms - since))}: "
            f"{health.error}); no checkpoint is triggered, acknowledged or completed until it answers, "
            "and what the views show is as of then"
        )
    if assignment_pending:
        problems.append("waiting for the group to assign journal partitions (a first join or a rebalance)")
    waiting = {p: phase for p, phase in sorted(phases.items()) if phase != "DECIDING"}
    if waiting:
        reasons = why or {}
        listed = ", ".join(
            f"{p} ({phase}: {reasons[p]})" if reasons.get(p) else f"{p} ({phase})"
            for p, phase in waiting.items()
        )
        problems.append(f"not recovered yet: journal partitions {listed} are not decided here")
    return Readiness(not problems, tuple(problems))


def broker_json(health: BrokerHealth, bootstrap: str) -> dict[str, Any]:
    """The broker as ``/ready`` and ``/overview`` show it."""
    return {
        "bootstrap": bootstrap,
        "reachable": health.reachable,
        "since": health.since_ms,
        "last_reached": health.last_reached_ms,
        "error": health.error,
        "failed_probes": health.failures,
    }
