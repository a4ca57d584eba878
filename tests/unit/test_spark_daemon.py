"""``spark_tasks.daemon`` may import ``pyspark.worker`` before it forks: the import starts no thread
and brings in neither pandas nor pyarrow (which start threads), with the installed PySpark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from spark_tasks.workers import prefer_installed_pyspark

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


class TestPreferInstalledPyspark:
    """Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on the path of every
    Python process it starts; they move behind the installed packages they are copies of."""

    @staticmethod
    def installed(root: Path, *packages: str) -> str:
        for package in packages:
            (root / package).mkdir(parents=True)
            (root / package / "__init__.py").touch()
        (root / "pyspark" / "python" / "lib").mkdir(parents=True)
        return str(root)

    def test_the_zips_of_a_pip_installed_pyspark_move_behind_it(self, tmp_path: Path) -> None:
        site = self.installed(tmp_path / "site-packages", "pyspark", "py4j")
        lib = f"{site}/pyspark/python/lib"
        path = [f"{lib}/pyspark.zip", f"{lib}/py4j-0.10.9.9-src.zip", "/work/job", site]

        moved = prefer_installed_pyspark(path)

        assert [f"{lib}/pyspark.zip", f"{lib}/py4j-0.10.9.9-src.zip"] == moved
        assert ["/work/job", site, f"{lib}/pyspark.zip", f"{lib}/py4j-0.10.9.9-src.zip"] == path

    def test_the_zips_of_a_spark_distribution_stay_first(self, tmp_path: Path) -> None:
        site = self.installed(tmp_path / "site-packages", "pyspark", "py4j")
        path = ["/opt/spark/python/lib/pyspark.zip", "/opt/spark/python/lib/py4j-0.10.9.9-src.zip", site]

        assert [] == prefer_installed_pyspark(path)
        assert "/opt/spark/python/lib/pyspark.zip" == path[0]

    def test_a_zip_stays_when_the_package_it_copies_is_not_installed_beside_it(self, tmp_path: Path) -> None:
        site = self.installed(tmp_path / "site-packages", "pyspark")  # no py4j package
        lib = f"{site}/pyspark/python/lib"
        path = [f"{lib}/py4j-0.10.9.9-src.zip", f"{lib}/pyspark.zip", site]

        assert [f"{lib}/pyspark.zip"] == prefer_installed_pyspark(path)
        assert [f"{lib}/py4j-0.10.9.9-src.zip", site, f"{lib}/pyspark.zip"] == path

    def test_a_zip_stays_when_its_installation_is_not_on_the_path(self, tmp_path: Path) -> None:
        site = self.installed(tmp_path / "site-packages", "pyspark", "py4j")
        path = [f"{site}/pyspark/python/lib/pyspark.zip", "/work/job"]

        assert [] == prefer_installed_pyspark(path)
