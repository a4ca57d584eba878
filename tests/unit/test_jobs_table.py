"""``cutline list``: the jobs of the coordinator group's ``/jobs`` as a table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console

from coordinator.cli.jobs import _jobs_table

COUNTS = {"total": 3, "completed": 3, "in_progress": 0, "failed": 0}


def printed(jobs: list[Mapping[str, Any]]) -> str:
    console = Console(record=True, width=240, color_system=None)
    console.print(_jobs_table(jobs, "jobs"))
    return console.export_text()


def job(job_id: str, undecided: str | None = None) -> dict[str, Any]:
    return {
        "id": job_id, "undecided": undecided, "status": "RUNNING", "attempt": 1, "restarts": 0,
        "counts": COUNTS, "last_completed": None, "owner": "http://127.0.0.1:6066",
    }  # fmt: skip


def test_a_job_decided_now_is_listed_without_a_note() -> None:
    text = printed([job("orders")])

    assert "RUNNING" in text
    assert "not decided now" not in text


def test_a_job_whose_partition_recovers_again_says_it_is_not_decided_now_and_why() -> None:
    """After a failed journal write its worker recovers the partition again; the job is listed as it
    stood, and the table says why it is not decided."""
    why = "recovering: reading its snapshot and the journal after it; the last try: a write failed (x)"

    text = printed([job("orders"), job("payments", why)])

    assert "RUNNING (not decided now)" in text
    assert 1 == text.count("(not decided now)")
    assert f"payments: {why}" in " ".join(text.split())
