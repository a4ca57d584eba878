"""Checks of values that arrive from the wire, shared by every reader (pure: no I/O).

Offsets keys
------------

Acks and completed checkpoints map ``topic:partition`` to the next offset to
read (DESIGN §3). :func:`parse_offsets_key` is the one parser of such a key,
used by the Spark driver, the Spark tasks and the participants alike:

- the key splits at its **last** colon: ``t:1:2`` is topic ``t:1``, partition 2.
  Kafka topic names cannot hold a colon, but the wire contract does not say
  so, and the coordinator splits the same way; so every reader agrees on what a
  key means, even a strange one;
- the topic is any non-empty string;
- the partition is a non-negative int in canonical ASCII decimal: digits
  ``0-9`` only (no sign, no space, no ``²`` or other Unicode digits that
  :meth:`str.isdigit` accepts but :class:`int` refuses), no leading zero
  (``t:01`` would name the same partition as ``t:1``), at most 2**31 - 1
  (Kafka's partition ids are Java ints).

A key that breaks a rule raises :class:`ValueError` with a message naming the
key and the rule. Readers ignore a record with such a key (with a log line);
they never let the error out of their poll loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["MAX_PARTITION", "parse_offsets", "parse_offsets_key"]

MAX_PARTITION: Final = 2**31 - 1
"""The highest partition id Kafka can have (a Java int)."""

_DIGITS: Final = frozenset("0123456789")


def parse_offsets_key(key: str) -> tuple[str, int]:
    """The ``(topic, partition)`` an offsets key ``topic:partition`` names; ValueError if it is malformed.

    See the module docstring for the rules: split at the last colon, a non-empty
    topic, a partition in canonical ASCII decimal between 0 and 2**31 - 1.
    """
    if not isinstance(key, str):
        raise ValueError(f"offsets key {key!r} is not a string")
    topic, colon, partition = key.rpartition(":")
    if not colon:
        raise ValueError(f"offsets key {key!r} is not 'topic:partition': it has no ':'")
    if not topic:
        raise ValueError(f"offsets key {key!r} is not 'topic:partition': the topic is empty")
    if not partition:
        raise ValueError(f"offsets key {key!r} is not 'topic:partition': the partition is empty")
    if not set(partition) <= _DIGITS:
        raise ValueError(
            f"offsets key {key!r}: partition {partition!r} is not a non-negative decimal number "
            "(ASCII digits 0-9 only)"
        )
    if len(partition) > 1 and partition[0] == "0":
        raise ValueError(f"offsets key {key!r}: partition {partition!r} has a leading zero")
    number = int(partition)
    if number > MAX_PARTITION:
        raise ValueError(f"offsets key {key!r}: partition {number} is above Kafka's maximum {MAX_PARTITION}")
    return topic, number


def parse_offsets(offsets: Mapping[str, int]) -> dict[tuple[str, int], int]:
    """``{topic:partition: offset}`` as ``{(topic, partition): offset}``; ValueError on the first bad entry.

    Keys follow :func:`parse_offsets_key`; offsets must be non-negative ints (the
    next offset to read).
    """
    parsed: dict[tuple[str, int], int] = {}
    for key, offset in offsets.items():
        tp = parse_offsets_key(key)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset {offset!r} of {key!r} is not a non-negative int")
        parsed[tp] = offset
    return parsed
