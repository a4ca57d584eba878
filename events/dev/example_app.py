"""A word count over one Kafka partition that takes part in checkpoints (the participant library's demo).

    python -m events.dev.example_app --bootstrap 127.0.0.1:9092 --job wc --task wc-0 \\
        --topic words --partition 0 [--driver --location file:///tmp/cutline --interval-ms 1000]

State is a Counter of lower-cased words, snapshotted as JSON. On start the app
restores from the latest completed checkpoint of the job (its own snapshot and
its partition's offset), or starts at the beginning of the partition. With
``--driver`` it is also the job driver of a one-task job: it publishes RUNNING
(after its participant started, so it cannot miss the first barrier) and
FINISHED or CANCELED when it stops. Completed checkpoints commit the offset to
the consumer group ``--group``, so lag tools see the progress.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from events.kafka.clients import consumer_config, watermark_offsets
from events.stopping import Stop, StopSignals
from events.task.participant import JobDriver, MissingTopics, Participant, load_task_snapshot, require_topics
from events.wire.codec import use_wire
from events.wire.records import CheckpointBarrier, CheckpointCompleted, CheckpointConfig, JobStatus
from events.wire.schema_registry import wire_from_environment
from events.wire.topics import DEFAULT_PREFIX, Topics

log = logging.getLogger(__name__)


class WordCount:
    """Counts the words of one input partition; one checkpoint task."""

    def __init__(
        self,
        bootstrap: str,
        job_id: str,
        task_id: str,
        topic: str,
        partition: int,
        *,
        topics: Topics | None = None,
        group: str | None = None,
        attempt: int = 1,
    ) -> None:
        self.bootstrap = bootstrap
        self.job_id = job_id
        self.task_id = task_id
        self.topic = topic
        self.partition = partition
        self.topics = topics or Topics()
        self.group = group or job_id
        self.attempt = attempt
        self.counts: Counter[str] = Counter()
        self.next_offset = -1
        self.restored: CheckpointCompleted | None = None
        self.records = 0
        self.participant: Participant | None = None
        """The running participant (set once it sees barriers)."""
        self._lock = threading.Lock()

    @property
    def key(self) -> str:
        """This task's ``topic:partition`` offset key."""
        return f"{self.topic}:{self.partition}"

    # -- the two callbacks of the participant: the cut is taken between two records

    def snapshot(self, barrier: CheckpointBarrier) -> bytes:
        with self._lock:
            state = {"counts": dict(sorted(self.counts.items())), "offset": self.next_offset}
        return json.dumps(state, separators=(",", ":")).encode()

    def offsets(self) -> dict[str, int]:
        with self._lock:
            return {self.key: self.next_offset}

    # -- restore and run

    def restore(self, driver: JobDriver) -> CheckpointCompleted | None:
        """Load the state and offset of the latest completed checkpoint, if any."""
        completed = driver.latest_completed()
        if completed is None:
            return None
        handle = completed.handles.get(self.task_id)
        if handle is None:
            raise LookupError(f"checkpoint {completed.checkpoint_id} has no snapshot of task {self.task_id}")
        state = json.loads(load_task_snapshot(handle))
        self.counts = Counter({str(word): int(n) for word, n in state["counts"].items()})
        self.next_offset = int(completed.offsets.get(self.key, state["offset"]))
        self.restored = completed
        self.attempt = max(self.attempt, completed.attempt + 1)
        log.info(
            "restored checkpoint %d: %d words, offset %d",
            completed.checkpoint_id,
            len(self.counts),
            self.next_offset,
        )
        return completed

    def run(
        self,
        stop: Stop,
        *,
        driver: JobDriver | None = None,
        config: CheckpointConfig | None = None,
        idle_exit: float | None = None,
        max_records: int | None = None,
    ) -> Counter[str]:
        """Restore, then count until ``stop`` is set, ``idle_exit`` s pass without input, or
        ``max_records`` records were counted in this run; returns the counts.

        With ``driver`` and ``config`` this app also publishes the job's status. Its input
        partition must exist: :class:`MissingTopics` says what to do, before anything starts.
        """
        if driver is None:
            with JobDriver(self.bootstrap, self.job_id, self.topics) as driver:
                return self.run(
                    stop, driver=driver, config=config, idle_exit=idle_exit, max_records=max_records
                )
        require_topics(self.bootstrap, [self.key])
        self.restore(driver)
        consumer = Consumer(consumer_config(self.bootstrap, self.group))
        tp = TopicPartition(self.topic, self.partition)
        if self.next_offset < 0:  # ListOffsets "earliest" is right (only "latest" is not, on Tansu)
            low, _ = watermark_offsets(consumer, tp, timeout=10)  # again while not led yet (Kafka)
            self.next_offset = max(low, 0)
        # an explicit offset: a logical one (OFFSET_BEGINNING) assigned before librdkafka knows
        # the leader waits for a 500 ms offset-query timer
        consumer.assign([TopicPartition(self.topic, self.partition, self.next_offset)])
        try:
            participant = Participant(
                self.bootstrap,
                self.job_id,
                self.task_id,
                self.attempt,
                self.topics,
                snapshot=self.snapshot,
                offsets=self.offsets,
                commit_consumer=consumer,
            )
        except BaseException:
            consumer.close()
            raise
        self.participant = participant
        status = JobStatus.FINISHED
        try:
            if config is not None:
                restored = self.restored
                driver.running(
                    [self.task_id],
                    config,
                    self.attempt,
                    restored_checkpoint_id=None if restored is None else restored.checkpoint_id,
                    restored_location=None if restored is None else restored.location or None,
                )
            last_input = time.monotonic()
            counted = 0
            while not stop.is_set():
                msg = consumer.poll(0.005)
                offset = None if msg is None or msg.error() is not None else msg.offset()
                if msg is not None and offset is not None:
                    words = (msg.value() or b"").decode("utf-8", "replace").lower().split()
                    with self._lock:
                        self.counts.update(words)
                        self.next_offset = offset + 1
                        self.records += 1
                    counted += 1
                    last_input = time.monotonic()
                elif msg is not None and msg.error() is not None:
                    log.warning("input consumer: %s", msg.error())
                participant.poll(0)  # between records: the cut sees exactly what was counted
                if max_records is not None and counted >= max_records:
                    break
                if idle_exit is not None and time.monotonic() - last_input > idle_exit:
                    break
            else:
                status = JobStatus.CANCELED
        except BaseException as exc:
            status = JobStatus.FAILING  # the restart strategy decides what comes next
            if config is not None:
                driver.status(status, error=repr(exc))
            raise
        finally:
            participant.close()
            consumer.close()
        if config is not None:
            driver.status(status)
        return self.counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m events.dev.example_app", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", type=int, required=True)
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="cutline topic prefix")
    parser.add_argument("--group", help="consumer group to commit offsets to (default: the job id)")
    parser.add_argument(
        "--attempt",
        type=int,
        default=int(os.environ.get("CUTLINE_ATTEMPT", "1")),
        help="job attempt, raised past a restored one (default: CUTLINE_ATTEMPT, set by cutline run, or 1)",
    )
    parser.add_argument("--driver", action="store_true", help="also publish the job's status (one-task job)")
    parser.add_argument("--location", default="file:///tmp/cutline/checkpoints", help="checkpoint root")
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument(
        "--inline-threshold-bytes",
        type=int,
        default=0,
        help="snapshots up to this size ride in the ack, no file (Flink's memory threshold; 0: files)",
    )
    parser.add_argument("--idle-exit", type=float, help="stop after this many seconds without input")
    parser.add_argument("--output", type=Path, help="write the final counts here as JSON")
    args = parser.parse_args(argv)
    use_wire(wire_from_environment())  # as `cutline run` exported them
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    app = WordCount(
        args.bootstrap,
        args.job,
        args.task,
        args.topic,
        args.partition,
        topics=Topics(args.prefix),
        group=args.group,
        attempt=args.attempt,
    )
    config = (
        CheckpointConfig(
            interval_ms=args.interval_ms,
            location=args.location,
            inline_threshold_bytes=args.inline_threshold_bytes,
        )
        if args.driver
        else None
    )
    with StopSignals() as stop:
        try:
            counts = app.run(stop, config=config, idle_exit=args.idle_exit)
        except MissingTopics as exc:
            log.error("%s", exc)
            return 2
    text = json.dumps(dict(counts.most_common()), indent=2)
    if args.output is not None:
        args.output.write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
