"""One view of the coordinator group: every job of every worker, with the worker that owns it.

Each worker knows only the jobs of its own journal partitions. The group's assignment (which
member holds which partition, and each member's web address) is known to every member, so a
worker's ``/jobs`` asks its peers for their own jobs and merges the answers here. Pure: the web
shell (coordinator/service/views.py) does the asking, with short timeouts, and hands over what
each peer answered or why it did not.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.service.web_trust import linkable

WEB_CLIENT_PREFIX = "cutline-web-"
"""The Kafka client ids of the coordinator's workers: this, then the port of the worker's views."""


def web_client_id(port: int) -> str:
    """The Kafka client id of a worker whose views answer on ``port``: the coordinator group's
    description (each member's host and client id) then tells a command with nothing but the
    cluster's address where the views are (``cutline status --bootstrap``)."""
    return f"{WEB_CLIENT_PREFIX}{port}"


def views_url(client_id: str, host: str) -> str | None:
    """The views of the member with ``client_id`` on ``host`` (as the broker saw it: ``/10.0.0.7``);
    None for a member that is not a cutline worker, or does not say its port."""
    port = client_id.removeprefix(WEB_CLIENT_PREFIX)
    if port == client_id or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    host = host.lstrip("/")
    return f"http://{f'[{host}]' if ':' in host else host}:{int(port)}"


LOCAL_ONLY = "local"
"""The query parameter that asks a worker for its own view only: the one a worker sends its peers,
so that no view asks another in a loop."""


@dataclass(frozen=True)
class PeerAnswered:
    """A peer's ``/jobs?local=1``, as decoded JSON (not trusted: it is checked when merged)."""

    url: str
    body: object


@dataclass(frozen=True)
class PeerFailed:
    """A peer that could not be asked, or did not answer in time, and why."""

    url: str
    reason: str


PeerAnswer = PeerAnswered | PeerFailed


@dataclass(frozen=True)
class OwnedJob:
    """One job of the group as its owner reports it, and the owner's web address."""

    owner: str
    job: Mapping[str, Any]

    @property
    def job_id(self) -> str:
        return str(self.job["id"])


@dataclass(frozen=True)
class GroupView:
    """Every job of the group, each once, by id; and the peers whose jobs are missing from it."""

    jobs: tuple[OwnedJob, ...]
    unreachable: tuple[PeerFailed, ...]


def owner_of(partition: int, assignment: Mapping[str, Collection[int]]) -> str | None:
    """The member whose assigned partitions hold ``partition`` (the lowest address if, in the
    middle of a handover, two members' metadata name it); None when no member holds it."""
    holders = sorted(url for url, partitions in assignment.items() if partition in partitions)
    return holders[0] if holders else None


def peers_to_ask(self_url: str, members: Iterable[str]) -> tuple[list[str], list[PeerFailed]]:
    """The members other than this worker that may be asked (an ``http(s)`` address), and those
    refused without asking."""
    asked, refused = [], []
    for url in sorted(set(members) - {self_url}):
        if linkable(url):
            asked.append(url)
        else:
            refused.append(PeerFailed(url, "its advertised address is not an http(s) URL: not asked"))
    return asked, refused


def jobs_in(body: object) -> list[Mapping[str, Any]] | None:
    """The jobs of a peer's answer, each a JSON object with a string ``id``; None when the answer is
    not shaped as ``{"jobs": [...]}``. Entries without a string id are left out."""
    if not isinstance(body, Mapping):
        return None
    jobs = body.get("jobs")
    if not isinstance(jobs, list):
        return None
    return [job for job in jobs if isinstance(job, Mapping) and isinstance(job.get("id"), str)]


def group_view(
    self_url: str,
    local_jobs: Sequence[Mapping[str, Any]],
    answers: Sequence[PeerAnswer],
    assigned_owner: Callable[[str], str | None],
) -> GroupView:
    """Merge this worker's jobs with its peers' answers into the group's jobs, sorted by id.

    A job reported by two workers (one hands it over while the other claims it) is shown once: as
    the member the group's assignment names (``assigned_owner``) reports it, else as this worker
    does, else as the peer with the lowest address does. A peer that failed, or answered something
    other than a list of jobs, is listed as unreachable: its jobs are missing from the view."""
    reported: dict[str, list[OwnedJob]] = {}
    for job in local_jobs:
        reported.setdefault(str(job["id"]), []).append(OwnedJob(self_url, job))
    unreachable = []
    for answer in sorted(answers, key=lambda a: a.url):
        if isinstance(answer, PeerFailed):
            unreachable.append(answer)
            continue
        jobs = jobs_in(answer.body)
        if jobs is None:
            unreachable.append(PeerFailed(answer.url, "its answer is not a list of jobs"))
        else:
            for job in jobs:
                reported.setdefault(str(job["id"]), []).append(OwnedJob(answer.url, job))
    return GroupView(
        tuple(_pick(job_id, reported[job_id], self_url, assigned_owner) for job_id in sorted(reported)),
        tuple(unreachable),
    )


def _pick(
    job_id: str, candidates: list[OwnedJob], self_url: str, assigned_owner: Callable[[str], str | None]
) -> OwnedJob:
    """The one report of a job that :func:`group_view` shows."""
    assigned = assigned_owner(job_id)

    def rank(candidate: OwnedJob) -> tuple[int, str]:
        if candidate.owner == assigned:
            return 0, ""
        return (1, "") if candidate.owner == self_url else (2, candidate.owner)

    return min(candidates, key=rank)
