"""The core install (``pip install cutline``, no extras) in a fresh venv: the coordinator, the CLI
and the participant library work without PySpark or matplotlib, and a command that needs an extra
names it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = os.environ.get("UV") or shutil.which("uv")


@pytest.fixture(scope="module", name="python")
def _python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if UV is None:
        pytest.skip(reason="uv is not on PATH here (`uv run pytest` puts it there)")
    venv = tmp_path_factory.mktemp("lean") / "venv"
    subprocess.run([UV, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [UV, "pip", "install", "--quiet", "--python", str(python), str(ROOT)], check=True, timeout=600
    )
    return python


def run(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH: the tests' startup hook (tests/conftest.py), which no user's install has
    environment = {
        k: v for k, v in os.environ.items() if k not in ("CUTLINE_BOOTSTRAP", "VIRTUAL_ENV", "PYTHONPATH")
    }
    return subprocess.run(
        [str(python), *args], capture_output=True, text=True, timeout=120, env=environment, cwd=python.parent
    )


def test_the_core_install_has_neither_pyspark_nor_matplotlib(python: Path) -> None:
    probe = run(
        python,
        "-c",
        "import importlib.util as u; "
        "print([m for m in ('pyspark', 'matplotlib', 'pandas', 's3fs') if u.find_spec(m)])",
    )

    assert ("[]", 0) == (probe.stdout.strip(), probe.returncode), probe.stderr


def test_the_coordinator_and_the_participant_library_work_without_them(python: Path) -> None:
    coordinator = run(python, "-m", "coordinator.cli", "coordinator", "--help")
    library = run(python, "-c", "import events.task.participant, coordinator.service.app, coordinator.cli")

    assert 0 == coordinator.returncode, coordinator.stderr
    assert "--savepoint-root" in coordinator.stdout
    assert 0 == library.returncode, library.stderr


def test_a_command_that_needs_an_extra_names_it(python: Path, tmp_path: Path) -> None:
    journal = tmp_path / "journal.cutline"
    written = run(python, "-m", "coordinator.cli", "journal-demo", "--out", str(journal), "--events", "200")
    assert 0 == written.returncode, written.stdout + written.stderr

    plot = run(
        python,
        "-m",
        "coordinator.cli",
        "replay",
        "--from-file",
        str(journal),
        "--plot",
        str(tmp_path / "p.png"),
    )
    demo = run(python, "-m", "coordinator.cli", "demo")

    assert 2 == plot.returncode
    assert "needs the 'plot' extra" in plot.stderr and "pip install 'cutline[plot]'" in plot.stderr
    assert 2 == demo.returncode
    assert "needs the 'spark' extra" in demo.stderr and "pip install 'cutline[spark]'" in demo.stderr
    s3 = run(
        python, "-c", "from events.task import storage; storage.write_bytes('s3://bucket/chk-1/task-0', b'x')"
    )
    assert "needs the 's3' extra" in s3.stderr and "pip install 'cutline[s3]'" in s3.stderr
