"""What a failed Spark query's FAILING status says (spark_tasks.job.failure_summary): no Spark."""

from __future__ import annotations

from spark_tasks.job import failure_summary


class TestFailureSummary:
    """What a failed query's FAILING status says: the user's error, not py4j's wrapper."""

    def test_the_last_error_line_that_is_not_py4j_s_names_the_cause(self) -> None:
        spark_error = (
            "py4j.Py4JException: An exception was raised by the Python Proxy. Return Message: Traceback "
            '(most recent call last):\n  File "worker.py", line 3, in step\n'
            "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            "RuntimeError: boom: injected\n\n\tat org.apache.spark.api.python.BasePythonRunner.read(x:1)\n"
        )

        assert "RuntimeError: boom: injected" == failure_summary(spark_error)

    def test_without_an_error_line_the_first_line_is_kept_and_cut(self) -> None:
        assert "the query stopped" == failure_summary("the query stopped\nmore")
        assert 10 == len(failure_summary("x" * 50, limit=10))
