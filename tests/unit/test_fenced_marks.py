"""``cutline tail`` marks the journal records every reader leaves out (issue 53).

The marks come from the one fencing function (:func:`events.kafka.log.fenced_journal`), so what
the tail shows as fenced out is exactly what replay, the participants and the coordinator ignore.
"""

from __future__ import annotations

from coordinator.core.state import Reason
from events.kafka.log import FencedMarks, LogMessage
from events.wire.codec import encode
from events.wire.fencing import epoch_header
from events.wire.records import CheckpointAborted, CoordinatorClaimed

TOPIC = "t.checkpoints"


def message(offset: int, record: object, epoch: int | None, partition: int = 0) -> LogMessage:
    headers = dict([epoch_header(epoch)]) if epoch is not None else {}
    return LogMessage(TOPIC, partition, offset, 0, b"job", encode(record), headers)  # type: ignore[arg-type]


def claim(epoch: int) -> CoordinatorClaimed:
    return CoordinatorClaimed(partition=0, epoch=epoch, worker_id="worker-2", timestamp_ms=0)


ABORTED = CheckpointAborted("job", 7, 0, Reason.CHECKPOINT_EXPIRED, "expired")


def test_a_record_of_a_superseded_epoch_is_marked_fenced_out() -> None:
    """Given the claim of epoch 2, a record of epoch 1 (the old owner, a zombie) is fenced out and
    one of epoch 2 is valid."""
    marks = FencedMarks(learning=False)

    assert marks.void(message(0, claim(2), 2)) is None
    stale = marks.void(message(1, ABORTED, 1))
    assert stale is not None and "fenced out" in stale and "epoch 1, below the partition's epoch 2" in stale
    assert marks.void(message(2, ABORTED, 2)) is None


def test_an_older_claim_is_marked_too_and_partitions_are_fenced_apart() -> None:
    marks = FencedMarks(learning=False)
    marks.void(message(0, claim(3), 3))

    assert marks.void(message(1, claim(2), 2)) is not None
    assert marks.void(message(0, ABORTED, 1, partition=1)) is None


def test_read_from_the_end_a_higher_epoch_proves_its_claim() -> None:
    """Started at the partition's end (no claim seen), a record of epoch 5 raises the fence: a later
    record of epoch 4 is fenced out."""
    marks = FencedMarks(learning=True)

    assert marks.void(message(10, ABORTED, 5)) is None
    assert marks.void(message(11, ABORTED, 4)) is not None
