"""How the word count and ``spark_session`` are pointed at a cluster (docs/spark.md, "Deploying on a
cluster"): the master, Spark settings and the environment executors get; no Spark is started."""

from __future__ import annotations

import pytest

pytest.importorskip("pyarrow")

from spark_tasks.session import spark_session  # noqa: E402
from spark_tasks.wordcount import build_parser  # noqa: E402

ARGS = ("--bootstrap", "b:9092", "--job", "wc", "--topic", "words", "--work-dir", "/w", "--location",
        "file:///c", "--out", "/o")  # fmt: skip


class TestWordCountOnACluster:
    def test_it_runs_on_local_two_cores_unless_told_otherwise(self) -> None:
        """Without ``--master`` the word count is the local job it always was."""
        args = build_parser().parse_args(ARGS)

        assert ("local[2]", [], []) == (args.master, args.conf, args.executor_env)

    def test_master_settings_and_executor_variables_are_taken_as_given(self) -> None:
        """``--conf`` splits at the first ``=`` (values may hold more), as spark-submit's does."""
        args = build_parser().parse_args(
            [*ARGS, "--master", "spark://h:7077", "--conf", "spark.executor.cores=1",
             "--conf", "spark.executor.extraJavaOptions=-Da=b", "--executor-env", "AWS_ENDPOINT_URL"]
        )  # fmt: skip

        assert "spark://h:7077" == args.master
        assert {"spark.executor.cores": "1", "spark.executor.extraJavaOptions": "-Da=b"} == dict(args.conf)
        assert ["AWS_ENDPOINT_URL"] == args.executor_env

    def test_a_setting_without_a_value_is_refused(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit):
            build_parser().parse_args([*ARGS, "--conf", "spark.executor.cores"])

        assert "is not KEY=VALUE" in capsys.readouterr().err


class TestSparkSession:
    def test_a_variable_executors_cannot_be_given_is_refused_before_spark_starts(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An executor would otherwise start without it (an S3 endpoint: snapshots written elsewhere)."""
        monkeypatch.delenv("CUTLINE_TEST_NOT_SET", raising=False)

        with pytest.raises(ValueError, match="CUTLINE_TEST_NOT_SET"):
            spark_session("spark://nowhere:7077", executor_env=["CUTLINE_TEST_NOT_SET"])
