"""With its broker dead, a coordinator stops within 10 s of SIGTERM and logs the clients' repeated
errors once per 10 s with a count (issue 51: it took ~60 s and ended in tracebacks, and each worker
logged ~130 ERROR lines a second)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import TEST_PARTITIONS, eventually, local_broker

from coordinator.service.app import Settings, ensure_topics
from coordinator.service.supervisor import CoordinatorProcess

PREFIX = "deadstop."


@pytest.mark.slow
def test_a_coordinator_whose_broker_died_stops_within_10_s_and_logs_boundedly(tmp_path: Path) -> None:
    log_path = tmp_path / "coordinator.log"
    with local_broker() as broker:
        ensure_topics(Settings(broker.bootstrap, PREFIX, partitions=TEST_PARTITIONS))
        coordinator = CoordinatorProcess(broker.bootstrap, PREFIX, log_path=log_path)
        coordinator.start()
        try:
            for pid in broker.pids:
                os.kill(pid, signal.SIGKILL)
            eventually(
                lambda: "unreachable" in log_path.read_text() and "more like it" in log_path.read_text(),
                timeout=60,
                what="the worker to say the broker is unreachable, and to count a repeated client error",
            )
            process = coordinator._process
            assert process is not None
            sent = time.monotonic()
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running 15 s after SIGTERM; log:\n{coordinator.tail()}")
            took = time.monotonic() - sent
        finally:
            coordinator.kill_all()

    errors = [line for line in log_path.read_text().splitlines() if "[ERROR]" in line]
    assert took < 10.0, f"stopped {took:.1f} s after SIGTERM"
    assert len(errors) < 60, "\n".join(errors[:80])
