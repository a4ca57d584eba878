"""``spark_tasks.daemon`` may import ``pyspark.worker`` before it forks: the import starts no thread
and brings in neither pandas nor pyarrow (which start threads), with the installed PySpark."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys, threading
import spark_tasks.daemon
print(json.dumps({
    "threads": threading.active_count(),
    "loaded": sorted(m for m in ("pandas", "pyarrow", "numpy", "pyspark.worker") if m in sys.modules),
}))
"""


def test_importing_the_daemon_loads_the_worker_module_and_starts_no_thread() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )

    found = json.loads(probe.stdout)

    assert {"threads": 1, "loaded": ["pyspark.worker"]} == found
