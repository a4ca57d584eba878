"""A Spark query's status, as a checkpointed job publishes it (docs/spark.md, "Spark Connect"): RUNNING
once the query has run its first trigger (so its source already listens for barriers), and its end.

On a classic session Spark's listener bus tells :class:`QueryStatusListener`; on Spark Connect a thread
polls the query (:func:`has_triggered`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from spark_tasks.session import is_connect_session

__all__ = ["TRIGGERED_STATUS", "QueryStatusListener", "has_triggered"]

log = logging.getLogger(__name__)


TRIGGERED_STATUS = frozenset({"Waiting for data to arrive", "Waiting for next trigger"})
"""Spark's status messages of a query whose first trigger has run to its end: its source has
answered ``latestOffset`` (so it listens for barriers) and its first batch, if any, is done.
(Before: ``Initializing …``, ``Getting offsets from …``, then ``Processing new data`` while the
first batch runs: a checkpoint triggered then waits for that batch, which on a cold start takes
most of a checkpoint's timeout.)"""


def has_triggered(status: Mapping[str, Any], has_progress: bool) -> bool:
    """Has a query run its first trigger to its end, by its ``status`` and whether it reported
    progress? What a classic session learns from the first progress or idle event, for a Spark
    Connect query."""
    return has_progress or status.get("message") in TRIGGERED_STATUS


class QueryStatusListener:
    """Tells a job when its query has run its first trigger (RUNNING) and when it ended, from Spark's
    query events.

    On a classic session a StreamingQueryListener (``LeanListener``, over Py4J) tells it. Spark
    Connect has no JVM in this process, and PySpark 4.3's client-side listener bus dies on the first
    accumulator update a Python data source sends (an ``UNKNOWN_RESPONSE``, SPARK-59135), so there
    a thread polls the query instead (:meth:`_poll`): its status until its first trigger has run,
    then whether it is still active (docs/spark.md, "Spark Connect").
    """

    def __init__(
        self,
        spark: Any,
        query_name: str,
        job_id: str,
        *,
        on_running: Callable[[], None],
        on_end: Callable[[str | None], None],
    ) -> None:
        """Follow the query named ``query_name`` on ``spark``: ``on_running()`` once its first trigger
        has run, ``on_end(failure)`` once it ended (Spark's message if it failed, else None)."""
        from pyspark.sql.streaming.listener import StreamingQueryListener

        outer = self

        class LeanListener:
            """Spark's Java listener interface, implemented over Py4J, reading only what the job needs.

            PySpark's own wrapper turns every event into Python objects field by field before the
            listener sees it: about a hundred Py4J calls per progress event, which the job pays on
            the JVM's listener thread and its compiler threads (``bench/bench_spark.py``).
            This one reads a run id until the query runs, then nothing.
            """

            def onQueryStarted(self, jevent: Any) -> None:
                outer.started(jevent.runId().toString(), jevent.name())

            def onQueryProgress(self, jevent: Any) -> None:
                if not outer.running.is_set():
                    outer.triggered(jevent.progress().runId().toString())

            def onQueryIdle(self, jevent: Any) -> None:
                if not outer.running.is_set():
                    outer.triggered(jevent.runId().toString())

            def onQueryTerminated(self, jevent: Any) -> None:
                exception = jevent.exception()
                outer.terminated(
                    jevent.runId().toString(), exception.get() if exception.isDefined() else None
                )

            class Java:
                implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]

        class Listener(StreamingQueryListener):
            # ``StreamManager.addListener`` registers ``_jlistener``; the event methods below are
            # never called through it, but the base class needs them.
            @property
            def _jlistener(self) -> Any:
                if not hasattr(self, "_lean"):
                    from pyspark import SparkContext

                    jvm = SparkContext._jvm
                    if jvm is None:
                        raise RuntimeError("no SparkContext: start the SparkSession before the job")
                    self._lean = jvm.PythonStreamingQueryListenerWrapper(LeanListener())
                return self._lean

            def onQueryStarted(self, event: Any) -> None:
                outer.started(str(event.runId), event.name)

            def onQueryProgress(self, event: Any) -> None:
                outer.triggered(str(event.progress.runId))

            def onQueryIdle(self, event: Any) -> None:
                outer.triggered(str(event.runId))

            def onQueryTerminated(self, event: Any) -> None:
                outer.terminated(str(event.runId), event.exception)

        self.spark = spark
        self.query_name = query_name
        self.job_id = job_id
        self.on_running = on_running
        self.on_end = on_end
        self.connect = is_connect_session(spark)
        self.spark_listener = None if self.connect else Listener()
        self.run_id: str | None = None
        self.running = threading.Event()
        self.ended = threading.Event()
        self.exception: str | None = None
        """Why the query failed (Spark's message), if it did."""
        self._unregistered = threading.Event()
        self._poller: threading.Thread | None = None

    def register(self) -> None:
        """Before the query starts: a classic session's listener joins Spark's listener bus."""
        if self.spark_listener is not None:
            self.spark.streams.addListener(self.spark_listener)

    def follow(self, query: Any) -> None:
        """Once the query has started: on Spark Connect, poll it in a daemon thread."""
        if self.connect:
            self._poller = threading.Thread(
                target=self._poll,
                args=(query,),
                name=f"cutline-query-{self.job_id}",
                daemon=True,
            )
            self._poller.start()

    def unregister(self) -> None:
        """Leave Spark's listener bus, or stop polling."""
        self._unregistered.set()
        if self._poller is not None:
            self._poller.join(5)
        if self.spark_listener is not None:
            self.spark.streams.removeListener(self.spark_listener)

    def _poll(self, query: Any) -> None:
        """Spark Connect: RUNNING once the query's first trigger has run (:func:`has_triggered`),
        polled every 0.1 s; then the query's end, polled every 0.5 s."""
        run_id = str(query.runId)
        self.started(run_id, query.name)
        while not self._unregistered.wait(0.5 if self.running.is_set() else 0.1):
            try:
                if not self.running.is_set() and has_triggered(query.status, query.lastProgress is not None):
                    self.triggered(run_id)
                if not query.isActive:
                    failure = query.exception()
                    self.terminated(run_id, None if failure is None else str(failure))
                    return
            except Exception as exc:  # the server is gone or did not answer: say so, and keep trying
                log.warning("job %s: cannot poll its query (%s)", self.job_id, exc)
                self._unregistered.wait(1.0)

    def started(self, run_id: str, name: str | None) -> None:
        if name == self.query_name and self.run_id is None:
            self.run_id = run_id

    def triggered(self, run_id: str) -> None:
        if run_id == self.run_id and not self.running.is_set():
            self.running.set()
            self.on_running()

    def terminated(self, run_id: str, exception: str | None) -> None:
        if run_id != self.run_id or self.ended.is_set():
            return
        self.exception = exception
        self.on_end(exception)
        self.ended.set()
