"""The coordinator's web views: the dashboard, its JSON views and Prometheus metrics (read-only).

Any worker shows the whole group: ``/jobs`` asks the other members of the group for their own
jobs (``?local=1``) and merges the answers (coordinator/service/group_view.py), and a job's views on a
worker that does not own the job answer with the owner's. Peers are asked on the event loop with
short timeouts; one that is down or slow is shown as unreachable, never an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import faust
from aiohttp import web as aiohttp_web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from coordinator.core.ownership import Phase
from coordinator.core.state import JobState, state_json
from coordinator.core.stats import CheckpointStats, checkpoints_json, config_json, details_json, task_rows
from coordinator.service.broker_probe import BrokerProbe, now_ms
from coordinator.service.gc_schedule import ScheduledCollections
from coordinator.service.group_view import (
    LOCAL_ONLY,
    PeerAnswer,
    PeerAnswered,
    PeerFailed,
    group_view,
    owner_of,
    peers_to_ask,
)
from coordinator.service.health import Readiness, broker_json, readiness
from coordinator.service.job_view import config_rows, job_json, summary_json
from coordinator.service.metrics import (
    CoordinatorCollector,
    InputLag,
    PartitionView,
    RefetchCounts,
    registry_for,
)
from coordinator.service.runtime import Coordinator
from coordinator.service.web_trust import host_refusal, linkable
from coordinator.service.worker import Worker
from events.task.latency import LatencyHistograms, latency_json
from events.wire.sizes import excerpt
from events.wire.topics import Topics

log = logging.getLogger(__name__)

CHECKPOINT_ID = re.compile(r"[0-9]{1,18}")
"""A checkpoint id in a path: ASCII digits only (``str.isdigit`` takes ``²``, which ``int``
refuses), and few enough that ``int`` is cheap and the number fits a long."""

DASHBOARD = {
    path.name: path.read_bytes() for path in (Path(__file__).parent / "dashboard").iterdir() if path.is_file()
}
"""The web dashboard's static files (coordinator/service/dashboard/), served at ``/``."""
PEER_TIMEOUT_S = 1.0
"""How long a view waits for a peer's answer: the dashboard asks every second."""
MAX_PEER_ANSWER_BYTES = 16 * 1024 * 1024
"""A peer's answer larger than this is not read (a member of the group is not trusted that far)."""
OWNER_HEADER = "Cutline-Owner"
"""The response header of a job's views that names the web address of the worker owning the job."""

ASSET_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}


def partition_json(view: PartitionView, worker: Worker) -> dict[str, Any]:
    """One held partition in ``/ready``."""
    shown: dict[str, Any] = {"epoch": view.epoch, "ready": view.ready, "phase": view.phase}
    if view.why is not None:
        shown["why"] = view.why
        shown["undecided_seconds"] = round(view.undecided_seconds, 3)
    hold = worker.ownership.holds.get(view.partition)
    if view.phase == Phase.STEPPED_DOWN and hold is not None and hold.fenced_by is not None:
        claim = hold.fenced_by
        shown["fenced_by"] = {
            "worker": claim.worker_id,
            "epoch": claim.epoch,
            "generation": claim.generation,
            "offset": claim.offset,
        }
    return shown


def job_overview(
    job_id: str, state: JobState, stats: CheckpointStats | None, undecided: str | None = None
) -> dict[str, Any]:
    """One job in ``/jobs``; ``undecided`` says why its partition is not decided now (its state is
    as it stood when a journal write failed), None while it is."""
    latest = stats.latest_completed if stats else None
    return {
        "id": job_id,
        "undecided": undecided,
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


@dataclass(frozen=True)
class ViewContext:
    """What the views read: the coordinator's state, the worker's partitions, the metrics, the
    probe of the broker."""

    coordinator: Coordinator
    worker: Worker
    topics: Topics
    recovered: Callable[[], bool]
    metrics: CollectorRegistry
    broker: BrokerProbe

    def readiness(self) -> Readiness:
        """Whether this worker is ready (``/ready``'s status), and why not."""
        views = self.worker.views()
        return readiness(
            self.broker.health,
            self.broker.bootstrap,
            now_ms(),
            assignment_pending=self.worker.assignment_pending,
            phases={view.partition: view.phase for view in views},
            why={view.partition: view.why for view in views if view.why},
        )


def context(web: Any) -> ViewContext:
    """The context of the app a view serves (set by :func:`register_views`)."""
    return cast(ViewContext, web.app.cutline_views)


def register_views(
    app: faust.App,
    coordinator: Coordinator,
    worker: Worker,
    topics: Topics,
    recovered: Callable[[], bool],
    input_lag: Callable[[], Iterable[InputLag]],
    collections: ScheduledCollections,
    broker: BrokerProbe,
    refetches: Callable[[], RefetchCounts] = RefetchCounts,
) -> None:
    """Add every web view to ``app``."""
    metrics = registry_for(
        CoordinatorCollector(
            coordinator, worker.views, input_lag, collections, lambda: broker.health, refetches
        )
    )
    app.cutline_views = ViewContext(coordinator, worker, topics, recovered, metrics, broker)  # type: ignore[attr-defined]
    for path, view in ROUTES:
        app.page(path)(guarded(view))
    logging.getLogger("aiohttp.server").addFilter(one_line_http_errors)


def one_line_http_errors(record: logging.LogRecord) -> bool:
    """aiohttp's "Error handling request" for a request it cannot parse (a path over 8 KB, a bad
    escape) as one warning line, not an ERROR with a traceback: the client is at fault, and it is
    answered with a 400 already."""
    from aiohttp.http_exceptions import HttpProcessingError

    problem = record.exc_info[1] if record.exc_info else None
    if isinstance(problem, HttpProcessingError):
        record.msg, record.args = "bad HTTP request: %s", (excerpt(problem),)
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


def not_found(web: Any, what: str) -> Any:
    """A 404 with one error, quoting at most an excerpt of what the request named."""
    return web.json({"errors": [what]}, status=404)


def guarded(view: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``view``, answering a malformed request that it did not foresee with a one-line JSON 400
    and one log line, never a 500 and a traceback. Views parse their path segments themselves
    (a bad one is a 404 by design): this is the safety net for a ``ValueError`` (or
    ``LookupError``, ``UnicodeError``) that escapes them anyway."""

    @functools.wraps(view)
    async def answer(web: Any, request: Any, **segments: str) -> Any:
        try:
            return await view(web, request, **segments)
        except (ValueError, LookupError) as exc:  # UnicodeError is a ValueError
            path = excerpt(getattr(request, "path", "?"))
            log.warning("bad request %s: %s: %s", path, type(exc).__name__, excerpt(exc))
            return web.json({"errors": [f"bad request: {type(exc).__name__}: {excerpt(exc)}"]}, status=400)

    return answer


async def get_ready(web: Any, request: Any) -> Any:
    """200 when ready: the broker answers the worker's probe, and the worker is assigned and decides
    every partition it holds (``recovered``); else 503 with the same body, whose ``problems`` say
    why. Each partition's phase (a ``STEPPED_DOWN`` one names the claim that fenced this worker)."""
    views = context(web)
    verdict = views.readiness()
    return web.json(
        {
            "ready": verdict.ready,
            "problems": list(verdict.problems),
            "recovered": views.recovered(),
            "broker": broker_json(views.broker.health, views.broker.bootstrap),
            "jobs": len(views.coordinator.states),
            "worker": views.worker.worker_id,
            "topic_prefix": views.topics.prefix,
            "pid": os.getpid(),
            "partitions": {
                str(view.partition): partition_json(view, views.worker) for view in views.worker.views()
            },
        },
        status=200 if verdict.ready else 503,
    )


async def get_overview(web: Any, request: Any) -> Any:
    """This worker at a glance, for the dashboard's header (always 200, unlike ``/ready``): its
    address, whether it is ready and why not, the broker as its probe finds it, its jobs."""
    views = context(web)
    verdict = views.readiness()
    return web.json(
        {
            "self": str(web.app.conf.canonical_url),
            "worker": views.worker.worker_id,
            "ready": verdict.ready,
            "problems": list(verdict.problems),
            "recovered": views.recovered(),
            "broker": broker_json(views.broker.health, views.broker.bootstrap),
            "jobs": len(views.coordinator.states),
            "now": now_ms(),
        }
    )


def membership(web: Any, views: ViewContext) -> tuple[str, dict[str, set[int]]]:
    """This worker's web address, and every member of the group with the journal partitions it
    holds (Faust's assignor knows each member's web address); before an assignment, only this one."""
    self_url = str(web.app.conf.canonical_url)
    held: dict[str, set[int]] = {self_url: set()}
    with contextlib.suppress(Exception):  # no assignment yet: only this worker
        for url, by_topic in web.app.router.external_topics_metadata().items():
            held.setdefault(str(url), set()).update(by_topic.get(views.topics.job_status, ()))
    return self_url, held


class PeerError(Exception):
    """A peer did not answer, in time or at all; the message says why."""


async def fetch(session: aiohttp.ClientSession, url: str) -> tuple[int, object]:
    """GET a peer's JSON view within ``PEER_TIMEOUT_S``, following no redirect and reading at most
    ``MAX_PEER_ANSWER_BYTES``: its status and decoded body, or :class:`PeerError`."""
    timeout = aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)
    try:
        async with session.get(url, timeout=timeout, allow_redirects=False) as response:
            body = bytearray()
            async for chunk in response.content.iter_chunked(64 * 1024):
                body += chunk
                if len(body) > MAX_PEER_ANSWER_BYTES:
                    raise PeerError(f"its answer is over {MAX_PEER_ANSWER_BYTES} bytes")
            return response.status, json.loads(body)
    except TimeoutError:
        raise PeerError(f"no answer within {PEER_TIMEOUT_S:g} s") from None
    except (aiohttp.ClientError, ValueError) as exc:  # a refused connection, not JSON
        raise PeerError(f"{type(exc).__name__}: {excerpt(exc)}") from None


async def ask(session: aiohttp.ClientSession, url: str) -> PeerAnswer:
    """A peer's own jobs (its ``/jobs?local=1``), or why they are missing."""
    try:
        status, body = await fetch(session, f"{url.rstrip('/')}/jobs?{LOCAL_ONLY}=1")
    except PeerError as exc:
        return PeerFailed(url, str(exc))
    return PeerAnswered(url, body) if status == 200 else PeerFailed(url, f"it answered HTTP {status}")


def local_jobs(views: ViewContext) -> list[dict[str, Any]]:
    """The jobs this worker owns, as ``/jobs`` shows them: those it decides, and those of partitions
    it recovers again after a failed journal write, as they stood then."""
    decided = [
        job_overview(job_id, state, views.coordinator.stats.get(job_id))
        for job_id, state in views.coordinator.states.items()
    ]
    known = [
        job_overview(job.job_id, job.state, job.stats, job.why)
        for job in views.worker.last_known_jobs()
        if job.job_id not in views.coordinator.states
    ]
    return sorted([*decided, *known], key=lambda job: str(job["id"]))


def linked(url: str) -> str | None:
    """``url`` when the dashboard may link it (an http(s) URL, see coordinator/service/web_trust.py),
    else None."""
    return url if linkable(url) else None


async def get_jobs(web: Any, request: Any) -> Any:
    """Every job of the group, each with the web address of the worker that owns it, and the peers
    that could not be asked; with ``?local=1``, only this worker's jobs (what its peers ask)."""
    views = context(web)
    self_url, held = membership(web, views)
    jobs = local_jobs(views)
    # Partitions the group assigns here that a newer claim fenced: their jobs are not listed, and
    # get no checkpoints from this worker until the next assignment.
    stepped_down = [
        {"partition": view.partition, **partition_json(view, views.worker)}
        for view in views.worker.views()
        if view.phase == Phase.STEPPED_DOWN
    ]
    if LOCAL_ONLY in request.query:
        return web.json({"self": self_url, "jobs": jobs, "stepped_down": stepped_down})
    asked, refused = peers_to_ask(self_url, held)
    answers = await asyncio.gather(*(ask(web.app.http_client, url) for url in asked))
    group = group_view(
        self_url,
        jobs,
        [*answers, *refused],
        lambda job_id: owner_of(views.coordinator.partition_of(job_id), held),
    )
    return web.json(
        {
            "self": self_url,
            "jobs": [{**o.job, "owner": o.owner, "owner_link": linked(o.owner)} for o in group.jobs],
            "unreachable": [
                {"url": p.url, "link": linked(p.url), "reason": p.reason} for p in group.unreachable
            ],
            "stepped_down": stepped_down,
        }
    )


async def get_workers(web: Any, request: Any) -> Any:
    """This worker and every member of the group with the journal partitions it owns; ``link`` is
    the address when the dashboard may link it (http or https), else null."""
    self_url, held = membership(web, context(web))
    return web.json(
        {
            "self": self_url,
            "workers": [
                {"url": url, "link": linked(url), "partitions": sorted(partitions)}
                for url, partitions in sorted(held.items())
            ],
        }
    )


def answered_by_owner(view: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``view`` of one job, answered by the worker owning the job (the group's assignment says which)
    when that is not this one: the owner's own view, asked with ``?local=1``. The response names the
    owner's web address in the ``Cutline-Owner`` header."""

    @functools.wraps(view)
    async def answer(web: Any, request: Any, job_id: str, **segments: str) -> Any:
        views = context(web)
        if job_id in views.coordinator.states:
            response = await view(web, request, job_id=job_id, **segments)
            response.headers[OWNER_HEADER] = str(web.app.conf.canonical_url)
            return response
        if LOCAL_ONLY in request.query:
            return await view(web, request, job_id=job_id, **segments)  # its own "not known"
        self_url, held = membership(web, views)
        owner = owner_of(views.coordinator.partition_of(job_id), held)
        if owner is None or owner == self_url:
            return await view(web, request, job_id=job_id, **segments)
        return await from_owner(web, request, job_id, owner)

    return answer


async def from_owner(web: Any, request: Any, job_id: str, owner: str) -> Any:
    """The owner's answer to ``request`` (re-encoded as JSON, never passed through as it came), or a
    502 saying why there is none."""
    problem = None
    if not linkable(owner):
        problem = "its advertised address is not an http(s) URL"
    else:
        separator = "&" if "?" in request.raw_path else "?"
        try:
            status, body = await fetch(
                web.app.http_client, f"{owner.rstrip('/')}{request.raw_path}{separator}{LOCAL_ONLY}=1"
            )
            if 200 <= status < 500:
                return web.json(body, status=status, headers={OWNER_HEADER: owner})
            problem = f"it answered HTTP {status}"
        except PeerError as exc:
            problem = str(exc)
    why = (
        f"job {excerpt(job_id)} is owned by the worker at {excerpt(owner)}, which cannot be asked: {problem}"
    )
    return web.json({"errors": [why]}, status=502, headers={OWNER_HEADER: owner})


async def get_trend(web: Any, request: Any, job_id: str) -> Any:
    """Durations and sizes of the last completed checkpoints (at most 100), oldest first."""
    views = context(web)
    stats = views.coordinator.stats.get(job_id)
    if job_id not in views.coordinator.states:
        return not_found(web, f"job {excerpt(job_id)} is not known")
    return web.json(
        {
            "end_to_end_duration": list(stats.durations[-100:]) if stats else [],
            "state_size": list(stats.sizes[-100:]) if stats else [],
        }
    )


async def get_latency(web: Any, request: Any, job_id: str) -> Any:
    """The job's latency markers: per operator and per histogram, the recent quantiles (ms)."""
    views = context(web)
    coordinator = views.coordinator
    if job_id not in coordinator.states:
        return not_found(web, f"job {excerpt(job_id)} is not known")
    state = coordinator.latency.get(job_id) or LatencyHistograms(coordinator.latency_granularity)
    return web.json(latency_json(state))


async def get_root(web: Any, request: Any) -> Any:
    return web.bytes(DASHBOARD["index.html"], headers={"Content-Type": "text/html; charset=utf-8"})


async def get_asset(web: Any, request: Any, name: str) -> Any:
    if name not in DASHBOARD:
        return not_found(web, f"no dashboard file {excerpt(name)!r}")
    return web.bytes(DASHBOARD[name], headers={"Content-Type": ASSET_TYPES[Path(name).suffix]})


async def get_checkpoints(web: Any, request: Any, job_id: str) -> Any:
    views = context(web)
    if job_id not in views.coordinator.states:
        return not_found(web, f"job {excerpt(job_id)} is not known")
    return web.json(checkpoints_json(views.coordinator.checkpoint_stats(job_id)))


async def get_state(web: Any, request: Any, job_id: str) -> Any:
    views = context(web)
    state = views.coordinator.states.get(job_id)
    if state is None:
        return not_found(web, f"job {excerpt(job_id)} is not known")
    return web.json(state_json(state))


async def get_checkpoint_config(web: Any, request: Any, job_id: str) -> Any:
    """Flink's checkpoint configuration, and ``shown``: each setting with its unit (the dashboard's
    Configuration tab)."""
    views = context(web)
    state = views.coordinator.states.get(job_id)
    if state is None:
        return not_found(web, f"job {excerpt(job_id)} is not known")
    return web.json({**config_json(state.config), "shown": config_rows(state.config)})


async def get_checkpoint_details(web: Any, request: Any, job_id: str, checkpoint_id: str) -> Any:
    """One checkpoint of the history or a latest one (completed, savepoint, failed), with its tasks."""
    views = context(web)
    stats = views.coordinator.checkpoint_stats(job_id)
    number = int(checkpoint_id) if CHECKPOINT_ID.fullmatch(checkpoint_id) else None
    entry = stats.entry(number) if stats and number is not None else None
    if entry is None or number is None:
        return not_found(
            web,
            f"checkpoint {excerpt(checkpoint_id)} of {excerpt(job_id)} is neither in the history nor "
            "the latest completed, savepoint or failed one",
        )
    rows = task_rows(stats, views.coordinator.states.get(job_id), number)
    return web.json(details_json(entry, rows))


async def get_job(web: Any, request: Any, job_id: str) -> Any:
    """The job's status line: status, attempt, restarts, tasks, the latest acknowledgement."""
    views = context(web)
    state = views.coordinator.states.get(job_id)
    if state is None:
        return not_found(web, f"job {excerpt(job_id)} is not known")
    return web.json(job_json(job_id, state, views.coordinator.checkpoint_stats(job_id), now_ms()))


async def get_summary(web: Any, request: Any, job_id: str) -> Any:
    """Minimum, average, maximum and percentiles of the completed checkpoints (the Summary tab)."""
    views = context(web)
    if job_id not in views.coordinator.states:
        return not_found(web, f"job {excerpt(job_id)} is not known")
    return web.json(summary_json(views.coordinator.stats.get(job_id)))


async def get_metrics(web: Any, request: Any) -> Any:
    """Prometheus text format (coordinator/service/views.metrics.py)."""
    views = context(web)
    return web.bytes(generate_latest(views.metrics), headers={"Content-Type": CONTENT_TYPE_LATEST})


ROUTES: tuple[tuple[str, Callable[..., Awaitable[Any]]], ...] = (
    ("/ready", get_ready),
    ("/overview", get_overview),
    ("/jobs", get_jobs),
    ("/jobs/{job_id}", answered_by_owner(get_job)),
    ("/jobs/{job_id}/checkpoints/summary", answered_by_owner(get_summary)),
    ("/workers", get_workers),
    ("/jobs/{job_id}/checkpoints/trend", answered_by_owner(get_trend)),
    ("/jobs/{job_id}/latency", answered_by_owner(get_latency)),
    ("/", get_root),
    ("/dashboard/{name}", get_asset),
    ("/jobs/{job_id}/checkpoints", answered_by_owner(get_checkpoints)),
    ("/jobs/{job_id}/state", answered_by_owner(get_state)),
    ("/jobs/{job_id}/checkpoints/config", answered_by_owner(get_checkpoint_config)),
    ("/jobs/{job_id}/checkpoints/details/{checkpoint_id}", answered_by_owner(get_checkpoint_details)),
    ("/metrics", get_metrics),
)
"""Every view, by path (a job's views are answered by the job's owner: :func:`answered_by_owner`)."""


REFUSED_NAMES_LOGGED = 100
"""Refused Host names are logged once each, up to this many (a rebinding page may retry for ever)."""


def host_guard(allowed: frozenset[str]) -> Callable[..., Awaitable[aiohttp_web.StreamResponse]]:
    """An aiohttp middleware that answers 421 to a request whose Host header does not name this
    coordinator (DNS rebinding, coordinator/service/web_trust.py), saying which option allows a name."""
    logged: set[str] = set()

    @aiohttp_web.middleware
    async def check_host(request: aiohttp_web.Request, handler: Any) -> aiohttp_web.StreamResponse:
        refusal = host_refusal(request.headers.get("Host"), allowed)
        if refusal is None:
            return cast(aiohttp_web.StreamResponse, await handler(request))
        if len(logged) < REFUSED_NAMES_LOGGED and refusal not in logged:
            logged.add(refusal)
            log.warning("refused a request for %s: %s", excerpt(request.path), refusal)
        return aiohttp_web.json_response({"errors": [refusal]}, status=421)

    return check_host
