"""Every long-running command stops within 10 s of a SIGTERM, at any moment of its start-up or its
running, also as a background job of a non-interactive shell (SIGINT ignored), and leaves no
process behind: the Tansu broker, the coordinator's worker, the job's driver and what it started,
Spark's JVM. ``bench/bench_sigterm.py`` sweeps 20 moments of each command. ``cutline broker`` and
``cutline demo`` start the embedded Tansu broker (marked ``tansu``); the others run on the session's."""

from __future__ import annotations

import os
import random
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support import create_protocol_topics

from events.dev.broker import free_port
from events.dev.stop_check import StopResult, sigterm_at

CUTLINE = str(Path(sys.executable).parent / "cutline")
LIMIT_S = 10.0


def _sweep(
    argvs: Sequence[Sequence[str]], moments: Sequence[float], logs: Path, env: dict[str, str] | None = None
) -> list[StopResult]:
    """SIGTERM each command at its moment, three at a time; every result."""
    with ThreadPoolExecutor(3) as pool:
        futures = [
            pool.submit(sigterm_at, argv, moment, limit=LIMIT_S, env=env, log=logs / f"{i}.log")
            for i, (argv, moment) in enumerate(zip(argvs, moments, strict=True))
        ]
        return [future.result() for future in futures]


def _assert_stopped(results: Sequence[StopResult]) -> None:
    for result in results:
        assert result.sigint_ignored, result
        assert result.exited_after is not None, f"still running {LIMIT_S:g} s after SIGTERM: {result}"
        assert [] == result.left, result


@pytest.mark.tansu
def test_broker_stops(tmp_path: Path) -> None:
    """``cutline broker``: 20 moments over its start-up (well under a second) and running."""
    rng = random.Random(34)
    moments = [rng.uniform(0.0, 1.5) for _ in range(20)]
    _assert_stopped(_sweep([[CUTLINE, "broker"]] * len(moments), moments, tmp_path))


@pytest.mark.slow
def test_coordinator_stops(bootstrap: str, tmp_path: Path) -> None:
    """``cutline coordinator`` (its watchdog and Faust worker): before, while and after the worker
    joins its group."""
    rng = random.Random(35)
    moments = [rng.uniform(0.0, 6.0) for _ in range(8)]
    argvs = [
        [
            CUTLINE, "coordinator", "--bootstrap", bootstrap, "--topic-prefix", f"sig{i}{os.getpid()}.",
            "--web-port", str(free_port()), "--data-dir", str(tmp_path / f"data-{i}"),
        ]
        for i in range(len(moments))
    ]  # fmt: skip
    _assert_stopped(_sweep(argvs, moments, tmp_path))


def test_run_stops(bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    """``cutline run``: its driver (a shell that started a child of its own) and the driver's
    process group are gone too."""
    create_protocol_topics(bootstrap, topic_prefix)
    rng = random.Random(36)
    moments = [rng.uniform(0.0, 3.0) for _ in range(5)]
    driver = ["sh", "-c", "sleep 600 & sleep 600"]
    argvs = [
        [CUTLINE, "run", "--job", f"sig-{i}", "--bootstrap", bootstrap, "--topic-prefix", topic_prefix,
         "--", *driver]
        for i in range(len(moments))
    ]  # fmt: skip
    _assert_stopped(_sweep(argvs, moments, tmp_path))


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.tansu
@pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java")
def test_demo_stops(tmp_path: Path) -> None:
    """``cutline demo`` (its own broker, coordinator, ``cutline run`` and Spark driver): while the
    broker and the coordinator start, and while Spark starts and runs."""
    env = {k: v for k, v in os.environ.items() if k != "CUTLINE_BOOTSTRAP"}
    rng = random.Random(37)
    moments = [rng.uniform(1.0, 4.0), rng.uniform(6.0, 12.0), rng.uniform(12.0, 20.0)]
    results = _sweep([[CUTLINE, "demo"]] * len(moments), moments, tmp_path, env)
    _assert_stopped(results)
