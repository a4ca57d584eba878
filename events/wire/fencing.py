"""The fencing rule of the journal (docs/design.md, "Ownership and fencing"), the one every journal reader
applies.

A coordinator worker owns a journal partition from its ``CoordinatorClaimed``
on: every record it writes to the journal or the barriers topic carries the
Kafka header ``cutline.epoch`` (ASCII decimal; absent: epoch 0), once. One
function, :func:`header_epoch`, reads a record's epoch for every reader: a record
with two or more epoch headers, or one that is not ASCII decimal digits, is void
(:data:`VOID_EPOCH`), claimed partition or not. Reading a partition in offset order:

- a claim whose epoch is higher than the current one is valid and becomes the
  current epoch; any other claim is void, and so is a claim with a void header;
- any other record is void when its epoch is lower than the current epoch, or void.

So a paused or cut-off worker (a zombie) can still append, but nothing it
appends after a newer claim counts, and every reader agrees on that from the
log alone, on any broker. Pure: no Kafka here, only headers and epochs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, cast

from events.wire.vocabulary import EPOCH_HEADER

__all__ = [
    "EPOCH_HEADER",
    "VOID_EPOCH",
    "Fence",
    "HeaderDict",
    "epoch_header",
    "epoch_of",
    "epoch_problem",
    "epoch_value",
    "header_epoch",
]

MAX_EPOCH_DIGITS: Final = 18
"""An epoch header longer than this is malformed (a long's range, and no parser surprises)."""

VOID_EPOCH: Final = -1
"""The epoch of a record whose epoch cannot be read (see :func:`header_epoch`).

Such a record says it was written under some epoch without saying which, so it cannot be
attributed to any owner: it is void always, in a partition that was never claimed too
(:meth:`Fence.admit` refuses it whatever the fence's epoch)."""


def epoch_header(epoch: int) -> tuple[str, bytes]:
    """The ``cutline.epoch`` header of a record written under ``epoch``."""
    return EPOCH_HEADER, str(epoch).encode("ascii")


HeaderValue = str | bytes | None
Headers = Mapping[str, bytes] | Mapping[str, HeaderValue] | Iterable[tuple[str, HeaderValue]] | None
"""A record's headers in any form a Kafka client gives them: confluent-kafka's list of
``(name, value)`` pairs (or None), aiokafka's sequence of pairs, or a mapping by name."""


class HeaderDict(dict[str, bytes]):
    """A record's headers by name (bytes values; a repeated name keeps its last value) that
    remembers every header as the record carried them, in order (``pairs``).

    A dict cannot hold two ``cutline.epoch`` headers, nor one without a value, and either makes
    the record void: :func:`header_epoch` reads ``pairs``, so a reader of the dict (such as
    :class:`events.kafka.log.LogMessage`'s) reads the record's epoch as every other reader does.
    """

    __slots__ = ("pairs",)

    def __init__(self, pairs: Iterable[tuple[str, HeaderValue]] | None = ()) -> None:
        self.pairs: tuple[tuple[str, HeaderValue], ...] = tuple(pairs or ())
        super().__init__((str(k), v) for k, v in self.pairs if isinstance(v, bytes))


_ABSENT: Final = object()


def header_epoch(headers: Headers) -> int | None:
    """The epoch a record's headers name, the one reading every reader applies
    (docs/design.md, "Ownership and fencing").

    - no ``cutline.epoch`` header: None (the record belongs to epoch 0: :func:`epoch_of`);
    - exactly one, of 1 to :data:`MAX_EPOCH_DIGITS` ASCII decimal digits: its value;
    - two or more (equal or not), or one whose value is empty, null, or anything but ASCII
      digits (a sign, '²', '٣', a space, too long): :data:`VOID_EPOCH`, the record is void.

    Values may be ``bytes`` (or a bytes-like object) or ``str``; headers a list of pairs, a
    mapping, or a :class:`HeaderDict`.
    """
    if headers is None:  # not `not headers`: an empty HeaderDict may hold a null epoch header
        return None
    # The coordinator reads one per ack: lists (confluent-kafka's, aiokafka's) take no ABC check.
    items = headers if type(headers) is list or type(headers) is tuple else _pairs(headers)
    found: object = _ABSENT
    for name, value in items:
        if name == EPOCH_HEADER:
            if found is not _ABSENT:
                return VOID_EPOCH  # two epoch headers: which one the writer meant is unknowable
            found = value
    if found is _ABSENT:
        return None
    if type(found) is bytes:
        return _parsed_epoch(found)
    return epoch_value(cast(HeaderValue, found))


def _pairs(headers: Headers) -> Iterable[tuple[str, HeaderValue]]:
    """Every header of a record, in order, from any of the forms :data:`Headers` names."""
    if isinstance(headers, HeaderDict):
        return headers.pairs
    if isinstance(headers, Mapping):
        return cast(Iterable[tuple[str, HeaderValue]], headers.items())
    return headers or ()


def epoch_of(headers: Headers) -> int:
    """The epoch a record's headers name: 0 without the header, :data:`VOID_EPOCH` when the
    record is void (two epoch headers, or a malformed one): :func:`header_epoch`."""
    epoch = header_epoch(headers)
    return 0 if epoch is None else epoch


def epoch_problem(headers: Headers) -> str | None:
    """Why a record's epoch cannot be read (it is void), for people; None when it can."""
    if header_epoch(headers) != VOID_EPOCH:
        return None
    values = [value for name, value in _pairs(headers) if name == EPOCH_HEADER]
    if len(values) > 1:
        shown = ", ".join(repr(v) for v in values)
        return f"{len(values)} {EPOCH_HEADER} headers ({shown}): a record names one epoch"
    if not values:
        return f"an unreadable {EPOCH_HEADER} header"  # headers that could be read only once
    value = values[0]
    if value is None or len(value) == 0:
        return f"an empty {EPOCH_HEADER} header"
    return (
        f"a malformed {EPOCH_HEADER} header {value!r} "
        f"(an epoch is 1 to {MAX_EPOCH_DIGITS} ASCII decimal digits)"
    )


def epoch_value(value: HeaderValue) -> int:
    """The epoch one ``cutline.epoch`` header's value names; :data:`VOID_EPOCH` when it is
    malformed (not 1 to :data:`MAX_EPOCH_DIGITS` ASCII decimal digits)."""
    if isinstance(value, str):
        try:
            value = value.encode("ascii")
        except UnicodeEncodeError:
            return VOID_EPOCH
    if value is None:
        return VOID_EPOCH
    return _parsed_epoch(value if type(value) is bytes else bytes(value))  # hashable for the memo


@functools.lru_cache(maxsize=256)
def _parsed_epoch(value: bytes) -> int:
    """A memo: every ack of a barrier names the same epoch (the coordinator reads one per ack)."""
    if not (0 < len(value) <= MAX_EPOCH_DIGITS) or not value.isdigit():
        return VOID_EPOCH  # bytes.isdigit is ASCII only: no '²', no '٣'
    return int(value)


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
        """Is a (non-claim) record of ``epoch`` valid here, and the fence after it.

        A record of :data:`VOID_EPOCH` is void under every fence, ``Fence()`` included."""
        if epoch < self.epoch or epoch < 0:
            return False, self
        if self.learning and epoch > self.epoch:
            return True, Fence(epoch, self.learning)
        return True, self

    def claim(self, epoch: int) -> tuple[bool, Fence]:
        """Is a claim of ``epoch`` valid here, and the fence after it."""
        if epoch > self.epoch:
            return True, Fence(epoch, self.learning)
        return False, self
