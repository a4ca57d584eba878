"""The coordinator workers' logs in a failed test's report.

A test that starts ``cutline coordinator`` processes (:class:`CoordinatorProcess`) and fails says
what its journal held; what the workers did (rebalances, dropped fetches, slow batches) is in their
logs, which a CI run's output has no other way to show. :func:`follow_launches` notes every worker
launched in this pytest process; :func:`report` gives, for a failed test, the tail of each that the
test launched or that still runs (a module's workers).
"""

from __future__ import annotations

import functools
from typing import Any

from coordinator.service.supervisor import CoordinatorProcess

TAIL_LINES = 30

_launched: list[tuple[str, CoordinatorProcess]] = []
"""Every worker launched in this process, with the id of the test that was running then."""
_current = {"test": ""}


def follow_launches() -> None:
    """Note each launch of a :class:`CoordinatorProcess` from now on (once per process)."""
    if getattr(CoordinatorProcess.launch, "followed", False):
        return
    launch = CoordinatorProcess.launch

    @functools.wraps(launch)
    def noted(self: CoordinatorProcess) -> Any:
        if all(worker is not self for _, worker in _launched):
            _launched.append((_current["test"], self))
        return launch(self)

    noted.followed = True  # type: ignore[attr-defined]
    CoordinatorProcess.launch = noted  # type: ignore[method-assign]


def running_test(nodeid: str) -> None:
    _current["test"] = nodeid


def report(nodeid: str) -> str:
    """The log tails of the workers test ``nodeid`` launched or that still run ("" if none)."""
    sections = []
    for launched_by, worker in _launched:
        running = worker.exit_code() is None and worker.pid is not None
        if launched_by == nodeid or running:
            state = "running" if running else f"exited {worker.exit_code()}"
            heading = f"--- worker {worker.pid} ({state}), {worker.log_path}:"
            sections.append(f"{heading}\n{worker.tail(TAIL_LINES)}")
    return "\n".join(sections)
