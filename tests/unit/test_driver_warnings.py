"""The demo's timeout names cutline's own warnings from the driver's log (spark_tasks/wordcount.py,
``cutline_warnings``): a tail of Spark's lines may have scrolled past them; and what the demo's own
fenced reader of the journal saw (cutline_demo/demo.py, ``journal_seen``)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyarrow")

from spark_tasks.wordcount import cutline_warnings  # noqa: E402

LOG = """\
WARNING: Using incubator modules: jdk.incubator.vector
WARNING:spark_tasks.connector:Spark's Kafka connector 4.2.0 runs on PySpark 4.3.0
26/11/30 13:33:26 WARN NativeCodeLoader: Unable to load native-hadoop library
INFO:spark_tasks.job:job wc: attempt 1
WARNING:events.kafka.feed:job wc: a void record at offset 7 (epoch 1 after claim 2)
ERROR:py4j.clientserver:Error while sending or receiving
ERROR:spark_tasks.job:job wc: checkpoint 3 completed before RUNNING was read
"""


def test_only_cutline_s_own_warnings_and_errors_are_picked() -> None:
    assert cutline_warnings(LOG) == [
        "WARNING:spark_tasks.connector:Spark's Kafka connector 4.2.0 runs on PySpark 4.3.0",
        "WARNING:events.kafka.feed:job wc: a void record at offset 7 (epoch 1 after claim 2)",
        "ERROR:spark_tasks.job:job wc: checkpoint 3 completed before RUNNING was read",
    ]


def test_the_last_ones_are_kept_when_there_are_many() -> None:
    log = "\n".join(f"WARNING:spark_tasks.job:warning {n}" for n in range(30))
    assert cutline_warnings(log, limit=2) == [
        "WARNING:spark_tasks.job:warning 28",
        "WARNING:spark_tasks.job:warning 29",
    ]


def test_a_log_without_any_gives_none() -> None:
    assert cutline_warnings("INFO:spark_tasks.job:fine\nWARNING: Using incubator modules\n") == []


def test_the_demo_says_what_its_own_fenced_reader_of_the_journal_saw() -> None:
    """Beside a driver that never confirmed RUNNING, the demo's timeout says whether the journal had
    a valid SchedulerStarted for it (cutline_demo/demo.py, ``journal_seen``)."""
    from cutline_demo.demo import journal_seen

    seen = journal_seen(["RUNNING (attempt 1)", "FAILING (attempt 1)"], {"cutline.checkpoints": 2})
    assert seen == (
        "the job's journal, read fenced: RUNNING (attempt 1) → FAILING (attempt 1); "
        "void records: 2 on cutline.checkpoints"
    )
    assert journal_seen([], {}) == "the job's journal, read fenced: no status yet; void records: none"
