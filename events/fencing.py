"""The fencing rule of the journal (DESIGN §4a), the one every journal reader applies.

A coordinator worker owns a journal partition from its ``CoordinatorClaimed``
on: every record it writes to the journal or the barriers topic carries the
Kafka header ``cutline.epoch`` (ASCII decimal; absent: epoch 0). Reading a
partition in offset order:

- a claim whose epoch is higher than the current one is valid and becomes the
  current epoch; any other claim is void;
- any other record is void when its epoch is lower than the current epoch.

So a paused or cut-off worker (a zombie) can still append, but nothing it
appends after a newer claim counts, and every reader agrees on that from the
log alone, on any broker. Pure: no Kafka here, only headers and epochs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["EPOCH_HEADER", "Fence", "epoch_header", "epoch_of", "epoch_value"]

EPOCH_HEADER: Final = "cutline.epoch"
"""Kafka header of every journal and barrier record: the writer's claim epoch, ASCII decimal."""

MAX_EPOCH_DIGITS: Final = 18
"""An epoch header longer than this is malformed (a long's range, and no parser surprises)."""


def epoch_header(epoch: int) -> tuple[str, bytes]:
    """The ``cutline.epoch`` header of a record written under ``epoch``."""
    return EPOCH_HEADER, str(epoch).encode("ascii")


HeaderValue = str | bytes | None


def epoch_of(
    headers: Mapping[str, bytes] | Mapping[str, HeaderValue] | Iterable[tuple[str, HeaderValue]] | None,
) -> int:
    """The epoch a record's headers name: 0 without the header, -1 when it is malformed.

    A malformed epoch (not plain ASCII digits) is lower than every claim's, so such a
    record is void as soon as the partition has been claimed once.
    """
    if not headers:
        return 0
    items = headers.items() if isinstance(headers, Mapping) else headers
    for name, value in items:
        if name == EPOCH_HEADER:
            return epoch_value(value)
    return 0


def epoch_value(value: HeaderValue) -> int:
    """The epoch a ``cutline.epoch`` header's value names; -1 when it is malformed."""
    if isinstance(value, str):
        value = value.encode("utf-8")
    if value is None:
        return -1
    return _parsed_epoch(value if type(value) is bytes else bytes(value))  # hashable for the memo


@functools.lru_cache(maxsize=256)
def _parsed_epoch(value: bytes) -> int:
    """A memo: every ack of a barrier names the same epoch (the coordinator reads one per ack)."""
    if not (0 < len(value) <= MAX_EPOCH_DIGITS) or not value.isdigit():
        return -1
    try:
        return int(value.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return -1


@dataclass(frozen=True, slots=True)
class Fence:
    """The current epoch of one journal partition while it is read in offset order.

    ``learning`` is for readers that start in the middle of a partition (from its end,
    or after a snapshot) and so may not have seen the latest claim: a valid record
    with a higher epoch than the current one proves that claim exists before it, and
    raises the current epoch. Readers from the start of a partition do not learn.
    """

    epoch: int = 0
    learning: bool = False

    def admit(self, epoch: int) -> tuple[bool, Fence]:
        """Is a (non-claim) record of ``epoch`` valid here, and the fence after it."""
        if epoch < self.epoch:
            return False, self
        if self.learning and epoch > self.epoch:
            return True, Fence(epoch, self.learning)
        return True, self

    def claim(self, epoch: int) -> tuple[bool, Fence]:
        """Is a claim of ``epoch`` valid here, and the fence after it."""
        if epoch > self.epoch:
            return True, Fence(epoch, self.learning)
        return False, self
