"""Follows a checkpointed Spark job's journal partition in the driver, in a daemon thread, and commits a
completed checkpoint's offsets to the job's consumer group.

It reads from the journal's real end through :class:`~events.kafka.feed.JobFeed`, fenced by the
journal's own claims like every journal reader (:mod:`events.wire.fencing`; docs/design.md, "Ownership
and fencing"): a record a zombie coordinator wrote after a newer claim never reaches the job. What each
admitted record makes the job do is the job's (its :class:`~events.task.ledger.JobLedger` decides).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import cast

from confluent_kafka import Consumer, TopicPartition

from events.kafka.clients import commit_offsets, consumer_config
from events.kafka.feed import JobFeed
from events.wire.fencing import Fence
from events.wire.records import Record
from spark_tasks.kafka_source import BACKGROUND_FETCH_WAIT_MAX_MS

__all__ = ["JournalFollower"]

log = logging.getLogger(__name__)


class JournalFollower:
    """Hands every valid record of job ``job_id``'s partition of ``journal_topic`` to ``on_record``, in
    offset order, from a daemon thread started at once; commits offsets for group ``group``."""

    def __init__(
        self,
        bootstrap: str,
        job_id: str,
        journal_topic: str,
        group: str,
        on_record: Callable[[Record], None],
        *,
        timeout: float,
    ) -> None:
        self.job_id = job_id
        self.on_record = on_record
        self.committer = Consumer(consumer_config(bootstrap, group))
        # Completions need no millisecond latency: fetch rarely (see BACKGROUND_FETCH_WAIT_MAX_MS).
        self._feed = JobFeed(
            bootstrap,
            job_id,
            (journal_topic,),
            claims_topic=journal_topic,
            config={"fetch.wait.max.ms": BACKGROUND_FETCH_WAIT_MAX_MS},
            timeout=timeout,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"cutline-journal-{job_id}", daemon=True)
        self._thread.start()

    @property
    def void(self) -> Mapping[str, int]:
        """The void records the follower dropped (a zombie coordinator's writes), by topic."""
        return self._feed.records.void

    @property
    def fence(self) -> Fence:
        """The journal's fence as of the last record handed out."""
        return self._feed.fence

    def commit(self, checkpoint_id: int, commit: Sequence[tuple[str, int, int]]) -> None:
        """Commit a completed checkpoint's offsets (topic, partition, offset) to the group; a failure is
        logged (the next completion commits newer offsets)."""
        offsets = [TopicPartition(topic, partition, offset) for topic, partition, offset in commit]
        if not offsets:
            return
        problem = commit_offsets(self.committer, offsets)
        if problem is not None:
            log.warning("could not commit checkpoint %d's offsets: %s", checkpoint_id, problem)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                entries = self._feed.poll(0.05)
            except Exception:  # a fatal consumer error: say so, and keep trying
                log.exception("journal follower of job %s", self.job_id)
                time.sleep(0.5)
                continue
            for entry in entries:
                try:
                    self.on_record(cast(Record, entry.record))
                except Exception:  # one bad record must not stop the follower: the rest still count
                    log.exception("journal follower of job %s at offset %d", self.job_id, entry.offset)

    def close(self) -> None:
        """Stop the thread (waiting up to 5 s), then close the feed and the committer."""
        self._stop.set()
        self._thread.join(5)
        self._feed.close()
        self.committer.close()
