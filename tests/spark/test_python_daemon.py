"""The tests' Spark applications fork their Python workers from ``spark_tasks.daemon`` (set for every
application by tests/conftest.py), which has imported ``pyspark.worker`` before the fork
(tests/unit/test_spark_daemon.py)."""

from __future__ import annotations

from typing import Any


def test_python_workers_are_forked_by_cutlines_daemon(spark: Any) -> None:
    def parent_command(_: object) -> list[str]:  # defined here: pickled by value for the workers
        import os

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as command:
            return [command.read().replace(b"\0", b" ").decode()]

    parents = spark.sparkContext.parallelize(range(2), 2).flatMap(parent_command).collect()

    assert 2 == len(parents)
    for parent in parents:
        assert "-m spark_tasks.daemon pyspark.worker" in parent, parent


def test_python_workers_import_the_installed_pyspark_not_the_copy_in_sparks_zip(spark: Any) -> None:
    """Spark puts ``pyspark.zip`` first on a worker's path; the daemon imports the installed package
    it was copied from, whose bytecode Python caches (spark_tasks.workers.prefer_installed_pyspark)."""
    import pyspark

    def where_pyspark_is(_: object) -> list[str]:
        import pyspark

        return [pyspark.__file__ or ""]

    found = spark.sparkContext.parallelize(range(2), 2).flatMap(where_pyspark_is).collect()

    assert [pyspark.__file__] * 2 == found
    assert ".zip" not in str(pyspark.__file__)
