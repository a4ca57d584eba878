"""Imported by Python at the start of every Python process the tests start (tests/conftest.py puts
this directory on ``PYTHONPATH``): the Python processes that Spark starts and cutline's daemon does
not fork (streaming source runners, data source planners) import the installed PySpark and its
bytecode, not the copy in Spark's zip (:func:`spark_tasks.workers.prefer_installed_pyspark`)."""

try:
    from spark_tasks.workers import prefer_installed_pyspark
except Exception:  # an environment without cutline's Spark extra (the lean-install tests): no zip
    pass
else:
    prefer_installed_pyspark()
