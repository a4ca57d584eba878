"""A one-task participant that copies its input to an output topic through an ExactlyOnceSink: the
child process tests/integration/test_exactly_once_sink.py SIGKILLs at each crash point.

Its settings are the JSON in ``EXACTLY_ONCE_APP``: it reads partition ``partition`` (0 unless given)
of the input, and ``tasks`` (every task of the attempt, when given) makes its recovery take over the
tasks of earlier attempts that the attempt has not. It says on stdout what it does (``ready``,
``processed N``, ``step NAME CHECKPOINT``, the sink's warnings and its input's errors as ``log
MESSAGE``; SIGUSR1 dumps every thread's stack on stderr), and at the step
``crash`` names it says ``stopped at NAME CHECKPOINT`` and waits there for its SIGKILL; at the step
``hold`` names (``[NAME, CHECKPOINT, FILE]``)
it says ``held at NAME CHECKPOINT`` and goes on once FILE exists. ``offset`` (when given) is where it
reads its partition from, instead of its snapshot's in the restored checkpoint (a task a rescale
added has none). ``variant: no-marker`` recovers without reading the
marker (it commits every completed staged checkpoint again): the broken sink the tests must catch;
``variant: resnapshot`` takes a snapshot (and stages its output) again for a barrier a newer
coordinator sends again, instead of answering as before: the broken participant the failover test
must catch (once a file of ``resent`` names a checkpoint, its completion waits for its barrier again).
When the job stops it says ``job FINISHED`` or ``job CANCELED`` with what its sink committed and
aborted.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from events.kafka.clients import consume_available, consumer_config
from events.task.exactly_once import Completion, ExactlyOnceSink, Marker, RecoveryPlan, Staged, recovery_plan
from events.task.participant import JobDriver, Participant, load_task_snapshot
from events.wire.records import CheckpointAborted, CheckpointBarrier, CheckpointCompleted, JobStatus
from events.wire.topics import Topics


def say(line: str) -> None:
    """One line on stdout in one write: ``print`` writes the text and the newline apart, and the
    committing thread's lines then broke into the main thread's (``processed 10step open 1``)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class SayWarnings(logging.Handler):
    """The sink's warnings on stdout too (``log MESSAGE``): a failed commit is a fact a test waits on."""

    def emit(self, record: logging.LogRecord) -> None:
        say(f"log {record.getMessage()}")


def without_marker(
    marker: Marker | None, staged: Iterable[Staged], completions: Iterable[Completion], restored: int | None
) -> RecoveryPlan:
    return recovery_plan(None, staged, completions, restored)


def snapshot_every_barrier(participant: Participant, resent: list[Path]) -> None:
    """Make ``participant`` forget its answers: a barrier sent again is a new cut (broken on purpose).

    Once a file of ``resent`` names a checkpoint first (a coordinator that is about to die writes it), the
    completion of that checkpoint waits for its barrier to come again: the order
    in which this participant loses the checkpoint's output, made certain (the completion and the
    barrier sent again come on two partitions, in either order)."""
    on_barrier, on_journal = participant._on_barrier, participant._on_journal
    barriers: Counter[int] = Counter()
    deferred: list[CheckpointCompleted] = []

    def again(barrier: CheckpointBarrier, epoch: int = 0) -> None:
        participant._replies.clear()
        participant._last_id = 0
        on_barrier(barrier, epoch)
        barriers[barrier.checkpoint_id] += 1
        for completion in [c for c in deferred if barriers[c.checkpoint_id] > 1]:
            deferred.remove(completion)
            on_journal(completion)

    def waits(record: CheckpointCompleted | CheckpointAborted) -> bool:
        if not isinstance(record, CheckpointCompleted) or barriers[record.checkpoint_id] > 1:
            return False
        named = [int(path.read_text().split()[0]) for path in resent if path.exists()]
        return record.checkpoint_id in named

    def journal(record: CheckpointCompleted | CheckpointAborted) -> None:
        if waits(record):
            assert isinstance(record, CheckpointCompleted)
            say(f"deferred completion {record.checkpoint_id}")
            deferred.append(record)
        else:
            on_journal(record)

    participant._on_barrier = again  # type: ignore[method-assign]
    participant._on_journal = journal  # type: ignore[method-assign]


def restored_offset(bootstrap: str, job: str, task: str, topics: Topics, restored: int | None) -> int:
    if restored is None:
        return 0
    with JobDriver(bootstrap, job, topics) as driver:
        completed = driver.completed_checkpoint(restored)
    assert completed is not None, f"checkpoint {restored} is not in the journal"
    offset: int = json.loads(load_task_snapshot(completed.handles[task]))["offset"]
    return offset


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    faulthandler.register(signal.SIGUSR1)  # the test asks for every thread's stack when it gives up waiting
    logging.getLogger("events.task.exactly_once").addHandler(SayWarnings(logging.WARNING))
    settings = json.loads(os.environ["EXACTLY_ONCE_APP"])
    bootstrap, job, task = settings["bootstrap"], settings["job"], settings["task"]
    topics = Topics(settings["prefix"])
    crash = tuple(settings["crash"]) if settings.get("crash") else None
    hold = settings.get("hold")

    def step(name: str, checkpoint_id: int) -> None:
        say(f"step {name} {checkpoint_id}")
        if crash == (name, checkpoint_id):
            say(f"stopped at {name} {checkpoint_id}")
            threading.Event().wait()  # until the test's SIGKILL
        if hold and (hold[0], hold[1]) == (name, checkpoint_id):
            say(f"held at {name} {checkpoint_id}")
            while not Path(hold[2]).exists():  # until the test lets it go on
                time.sleep(0.02)

    restored = settings.get("restored")
    offset = settings.get("offset")
    if offset is None:
        offset = restored_offset(bootstrap, job, task, topics, restored)
    position = {"offset": offset}
    timeout = float(settings.get("timeout_s", 30.0))  # the sink's wait for a commit, a flush, a fence
    transaction_timeout_ms = settings.get("transaction_timeout_ms")  # the broker aborts a dead one sooner
    extra = {"transaction.timeout.ms": transaction_timeout_ms} if transaction_timeout_ms else None
    sink = ExactlyOnceSink(
        bootstrap, job, task, topics, uid="copy", step=step, timeout=timeout, producer_extra=extra
    )
    recovered = sink.recover(
        restored,
        plan=without_marker if settings.get("variant") == "no-marker" else None,
        tasks=settings.get("tasks"),
    )
    say(f"recovered commit={list(recovered.plan.commit)} delete={list(recovered.plan.delete)}")
    for orphan, theirs in recovered.adopted:
        say(f"took over {orphan} commit={list(theirs.plan.commit)} delete={list(theirs.plan.delete)}")

    def snapshot(barrier: CheckpointBarrier) -> bytes:
        staged = sink.stage(barrier)
        output = {"name": staged.uri.rsplit("/", 1)[-1], "sha256": staged.sha256}
        return json.dumps({"offset": position["offset"], "output": output}).encode()

    def offsets() -> dict[str, int]:
        return {f"{settings['input']}:{partition}": position["offset"]}

    partition = int(settings.get("partition", 0))
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(settings["input"], partition, position["offset"])])

    def stopped(status: JobStatus, drain: bool) -> None:
        sink.on_stop(status, drain)
        say(f"job {status.value} committed={sink.committed} aborted={sink.aborted}")

    participant = Participant(
        bootstrap,
        job,
        task,
        settings["attempt"],
        topics,
        snapshot,
        offsets,
        on_complete=sink.complete,
        on_stop=stopped,
    )
    if settings.get("variant") == "resnapshot":
        snapshot_every_barrier(participant, [Path(path) for path in settings.get("resent", [])])
    say("ready")
    while True:
        for msg in consume_available(consumer, 100, 0.02):
            if msg.error() is not None or msg.offset() is None:
                say(f"log the input consumer: {msg.error()}")
                continue
            sink.send(settings["output"], msg.value(), key=str(msg.offset()).encode())
            position["offset"] = (msg.offset() or 0) + 1
            say(f"processed {position['offset']}")
        participant.poll(0.02)


if __name__ == "__main__":
    sys.exit(main())
