"""A coordinator worker that SIGKILLs itself at a chosen point of a job's checkpoint: the failover tests
of exactly-once output, for a participant (tests/integration) and for a Spark job (tests/spark)."""

from __future__ import annotations

import sys

from support import eventually

from coordinator.service.supervisor import CoordinatorProcess


class DyingWorker(CoordinatorProcess):
    """A coordinator worker that SIGKILLs itself at a chosen point of a job's checkpoint, once asked.

    The test writes ``<point> <job> <offset>`` to :attr:`request`: ``ack``, when the job's first ack
    of a checkpoint whose input offsets reach past ``offset`` reaches the worker, before it decides
    it; ``completion``, once it decided such a completion of the job, before the completion is
    written to the journal. The worker writes the checkpoint's id and the offset it reached to
    :attr:`died` and SIGKILLs itself there (no watchdog: the group notices after the session
    timeout)."""

    HOOK = """
import os, signal, sys
from coordinator.service import runtime
from events.wire.codec import decode
from events.wire.records import CheckpointAcknowledged, CheckpointCompleted
request = sys.argv.pop(1)
handle = runtime.Coordinator.handle
def die(checkpoint_id, offsets):
    with open(request + ".dying", "w") as died:
        died.write(f"{checkpoint_id} {max(offsets.values())}")
    os.replace(request + ".dying", request + ".died")  # whole, never read half written
    os.kill(os.getpid(), signal.SIGKILL)
def past(asked, job_id, offsets):
    return job_id == asked[1] and any(reached > int(asked[2]) for reached in offsets.values())
def dying_handle(self, topic, partition, offset, key, value, now_ms, *args, **kwargs):
    asked = open(request).read().split() if os.path.exists(request) else None
    if asked and asked[0] == "ack":
        try:
            record = decode(value or b"")
        except Exception:
            record = None
        if isinstance(record, CheckpointAcknowledged) and past(asked, record.job_id, record.offsets):
            die(record.checkpoint_id, record.offsets)
    outcome = handle(self, topic, partition, offset, key, value, now_ms, *args, **kwargs)
    if asked and asked[0] == "completion":
        for event in outcome.journal:
            if isinstance(event, CheckpointCompleted) and past(asked, event.job_id, event.offsets):
                die(event.checkpoint_id, event.offsets)
    return outcome
runtime.Coordinator.handle = dying_handle
from coordinator.cli import main
main()
"""

    def __init__(self, bootstrap: str, prefix: str) -> None:
        super().__init__(bootstrap, prefix, watchdog=False)  # the hook runs the worker in this process
        self.request = self.log_path.parent / "die-request"
        self.died = self.log_path.parent / "die-request.died"

    def command(self) -> list[str]:
        plain = super().command()
        assert plain[1:3] == ["-m", "coordinator.cli"], plain
        return [sys.executable, "-c", self.HOOK, str(self.request), *plain[3:]]

    def ask(self, point: str, job_id: str, past: int) -> None:
        """Die at ``point`` of ``job_id``'s first checkpoint whose input offsets reach past ``past``."""
        asking = self.request.with_suffix(".asking")
        asking.write_text(f"{point} {job_id} {past}")
        asking.replace(self.request)  # whole: the worker reads it at every record

    def death(self) -> int | None:
        """The id of the checkpoint it died in, once it did."""
        return int(self.died.read_text().split()[0]) if self.died.exists() else None

    def reached(self) -> int:
        """The input offset the checkpoint it died in reached (once it died)."""
        return int(self.died.read_text().split()[1])

    def holds(self, job_id: str) -> bool:
        """Whether it runs and its views hold ``job_id`` (it decides the job's partition)."""
        if self._process is None or self._process.poll() is not None:
            return False
        try:
            return job_id in {j["id"] for j in self.get("/jobs?local=1")["jobs"]}
        except OSError:  # its views not answering for a moment: not known yet
            return False


def owner_of(workers: list[DyingWorker], job_id: str, timeout: float) -> DyingWorker:
    """The worker of ``workers`` that decides ``job_id``'s partition, once one does."""
    found = eventually(
        lambda: next((w for w in workers if w.holds(job_id)), None),
        timeout=timeout,
        interval=0.2,
        what=f"the worker that holds {job_id}",
    )
    assert found is not None
    return found
