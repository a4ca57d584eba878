"""What every cutline function does first in a Spark Python worker, whatever its task, and what a
Python process that Spark starts may do before it imports PySpark."""

from __future__ import annotations

import gc
import os
import sys

__all__ = ["freeze_worker_heap", "prefer_installed_pyspark"]


def freeze_worker_heap() -> None:
    """Take every object alive now out of the cyclic garbage collector's sight (``gc.freeze``).

    PySpark's daemon runs a full ``gc.collect()`` after every task of a reused Python worker, and a
    full collection walks every tracked object: in a worker that has imported pyarrow, pandas and
    cutline that walk cost each task more than a keyed step's own work on a micro-batch. Called
    at the start of a task, it leaves the collection after the task only the task's own objects.
    Frozen objects are still freed by reference counting; only reference cycles among them stay.
    """
    gc.freeze()


def _package_in(zip_name: str) -> str | None:
    """The package a zip of ``$SPARK_HOME/python/lib`` holds: ``pyspark.zip``, ``py4j-<version>-src.zip``."""
    if zip_name == "pyspark.zip":
        return "pyspark"
    return "py4j" if zip_name.startswith("py4j-") and zip_name.endswith("-src.zip") else None


def prefer_installed_pyspark(path: list[str] | None = None) -> list[str]:
    """Move the copies of PySpark that Spark puts first on a Python process's path behind the
    installed PySpark they were copied from; the entries moved.

    Spark starts every Python process (daemons, workers, data source planners, streaming source
    runners) with ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on ``PYTHONPATH``.
    Where PySpark was installed by pip, ``SPARK_HOME`` is that package and the zips are copies of it,
    but Python caches no bytecode for a module in a zip: each such process compiles every PySpark
    module it imports from source, about 0.5 s of CPU. A zip moves only when it lies in
    ``<entry>/pyspark/python/lib/`` for an ``<entry>`` of the path that holds the package it copies:
    the same files, installed together. The zips of a Spark distribution (``SPARK_HOME`` elsewhere,
    which a cluster's JVMs may match and the installed package not) stay first.
    """
    entries = sys.path if path is None else path
    roots = {os.path.abspath(entry or os.curdir) for entry in entries if not entry.endswith(".zip")}
    moved = []
    for entry in list(entries):
        lib, name = os.path.split(os.path.abspath(entry))
        package = _package_in(name)
        home = os.path.dirname(os.path.dirname(lib))  # <entry>/pyspark/python/lib -> <entry>/pyspark
        root = os.path.dirname(home)
        if (
            package is not None
            and os.path.basename(home) == "pyspark"
            and lib == os.path.join(home, "python", "lib")
            and root in roots
            and os.path.isfile(os.path.join(root, package, "__init__.py"))
        ):
            entries.remove(entry)
            entries.append(entry)
            moved.append(entry)
    return moved
