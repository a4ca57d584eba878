"""The main job, as a user runs it: ``cutline demo``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_survives_a_crash_exactly_once(tmp_path: object) -> None:
    """`cutline demo --duration 20` crashes and restores its job and exits 0 with the exactly-once
    line of its summary."""
    environment = {k: v for k, v in os.environ.items() if k != "CUTLINE_BOOTSTRAP"}
    bootstrap = os.environ.get("CUTLINE_BOOTSTRAP")
    args = ["--bootstrap", bootstrap] if bootstrap else []

    result = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "demo", "--duration", "20", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**environment, "COLUMNS": "160"},
    )

    assert 0 == result.returncode, result.stdout[-3000:] + result.stderr[-3000:]
    assert "exactly-once: OK" in result.stdout
    assert "SIGKILL of the job" in result.stdout
