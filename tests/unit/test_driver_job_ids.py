"""A driver refuses, before it publishes, a job id the coordinator would refuse (issue 51).

Before, ``JobDriver.running()`` returned normally for a job id such as ``a/b``; the coordinator
dead-lettered the status (``INVALID_CONFIG``) and the app ran for ever with no checkpoint.
Both apply one rule, :func:`events.wire.validation.job_directory_problem`.
"""

from __future__ import annotations

import pytest

from coordinator.core.checks import Rejection
from coordinator.core.testing import config, given, running
from events.task.participant import JobDriver
from events.wire.records import CheckpointConfig
from events.wire.topics import Topics
from events.wire.validation import job_directory_problem

LOCATION = "file:///tmp/cutline-checkpoints"
CONFIG = CheckpointConfig(interval_ms=1000, location=LOCATION)


@pytest.mark.parametrize("job_id", ["a/b", "..", ".", ""])
def test_a_job_id_that_names_no_single_directory_is_refused_by_the_driver(job_id: str) -> None:
    driver = JobDriver("127.0.0.1:1", job_id, Topics("unused."))
    try:
        with pytest.raises(ValueError, match="cannot name a directory of checkpoint location"):
            driver.running(("t0",), CONFIG, attempt=1, heartbeats=False)
    finally:
        driver.close()


@pytest.mark.parametrize("job_id", ["a/b", "..", "zürich orders", "orders-2026"])
def test_the_driver_and_the_coordinator_apply_one_rule(job_id: str) -> None:
    """The coordinator refuses exactly the job ids the driver refuses."""
    refused_by_driver = job_directory_problem(job_id, LOCATION) is not None
    decided = given(job_id=job_id).when(running(job_id=job_id, cfg=config(location=LOCATION))).events

    refused_by_coordinator = bool(decided) and getattr(decided[0], "reason", None) is Rejection.INVALID_CONFIG
    assert refused_by_driver == refused_by_coordinator
