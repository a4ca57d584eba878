"""PySpark's daemon with ``pyspark.worker`` imported once, before it forks the Python workers.

Spark 4's daemon imports the worker module in each forked worker: a module may start threads when
it is imported (pandas and pyarrow do), and a fork copies none of them. ``pyspark.worker`` starts
none and imports neither (``tests/unit/test_spark_daemon.py`` pins it, for the installed PySpark),
so it is safe to import before the fork, as Spark 3's daemon did, and each worker then starts
without that import. Any other worker module (the Python data source's planners) is still imported
in the forked worker, by PySpark's code.

PySpark is imported from the installed package rather than the zip Spark puts first on the path,
where it is that package's copy (:func:`spark_tasks.workers.prefer_installed_pyspark`): the daemon
and every worker it forks then load bytecode instead of compiling PySpark from source.

Use it with ``spark.python.daemon.module=spark_tasks.daemon`` (docs/spark.md); the tests do.
"""

from __future__ import annotations

from spark_tasks.workers import prefer_installed_pyspark

prefer_installed_pyspark()

import pyspark.worker  # noqa: E402, F401  (the reason for this module: imported before any fork)
from pyspark.daemon import manager  # noqa: E402

if __name__ == "__main__":
    manager()
