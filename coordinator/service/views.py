"""The coordinator's web views: the dashboard, its JSON views and Prometheus metrics (read-only)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import faust
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from coordinator.ownership import Phase
from coordinator.service.gc_schedule import ScheduledCollections
from coordinator.service.metrics import CoordinatorCollector, InputLag, PartitionView, registry_for
from coordinator.service.runtime import Coordinator
from coordinator.service.worker import Worker
from coordinator.state import state_json
from coordinator.stats import checkpoints_json, config_json, entry_json
from events.topics import Topics

DASHBOARD = {
    path.name: path.read_bytes() for path in (Path(__file__).parent / "dashboard").iterdir() if path.is_file()
}
"""The web dashboard's static files (coordinator/service/dashboard/), served at ``/``."""
ASSET_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}


def partition_json(view: PartitionView, worker: Worker) -> dict[str, Any]:
    """One held partition in ``/ready``."""
    shown: dict[str, Any] = {"epoch": view.epoch, "ready": view.ready, "phase": view.phase}
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


def register_views(
    app: faust.App,
    coordinator: Coordinator,
    worker: Worker,
    topics: Topics,
    recovered: Callable[[], bool],
    input_lag: Callable[[], Iterable[InputLag]],
    collections: ScheduledCollections,
) -> None:
    """Add every web view to ``app``."""

    @app.page("/ready")
    async def get_ready(web: Any, request: Any) -> Any:
        """Recovered once assigned and every held partition is decided; each partition's phase (a
        ``STEPPED_DOWN`` one names the claim that fenced this worker)."""
        return web.json(
            {
                "recovered": recovered(),
                "jobs": len(coordinator.states),
                "worker": worker.worker_id,
                "pid": os.getpid(),
                "partitions": {str(view.partition): partition_json(view, worker) for view in worker.views()},
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

    metrics = registry_for(CoordinatorCollector(coordinator, worker.views, input_lag, collections))

    @app.page("/metrics")
    async def get_metrics(web: Any, request: Any) -> Any:
        """Prometheus text format (coordinator/service/metrics.py)."""
        return web.bytes(generate_latest(metrics), headers={"Content-Type": CONTENT_TYPE_LATEST})
