"""Record sizes and topic limits (docs/design.md, "Record sizes"): pure rules, no Kafka client.

Every topic cutline creates has an explicit ``max.message.bytes``; a writer never produces a
record over its topic's limit. What counts against the limit is the record batch the broker
stores: one record alone in its batch when it is large (a producer's ``batch.size`` is below the
limit), so a record's size here is its key, value and headers plus the fixed overhead of a batch
of one (:data:`RECORD_OVERHEAD`, generous: Kafka's batch header is 61 bytes and a record's own
varints at most 25 more).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "EXCERPT_CHARS",
    "MAX_LOGGED_CHARS",
    "RECORD_OVERHEAD",
    "TopicLimits",
    "bounded",
    "excerpt",
    "record_size",
]

DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
"""Apache Kafka's default ``max.message.bytes``: what every protocol topic and the journal are
created with, and what a topic that reports no limit (the embedded broker reports only the
settings it was created with) is taken to have."""

RECORD_OVERHEAD = 128
"""Bytes a record costs beyond its key, value and headers, counted against the topic's limit."""

MAX_LOGGED_CHARS = 1_000
"""A log line quotes at most this many characters of anything an input brought."""


def record_size(
    key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes | None]] = ()
) -> int:
    """What one record costs against its topic's ``max.message.bytes`` (alone in its batch)."""
    size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
    for name, header in headers:
        size += len(name.encode()) + len(header or b"") + 10
    return size


@dataclass(frozen=True, slots=True)
class TopicLimits:
    """The ``max.message.bytes`` of each topic a writer writes to; ``default`` for the others."""

    limits: Mapping[str, int] = field(default_factory=dict)
    default: int = DEFAULT_MAX_MESSAGE_BYTES

    def of(self, topic: str) -> int:
        """The limit of ``topic``."""
        return self.limits.get(topic, self.default)

    def over(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes | None]] = (),
    ) -> int | None:
        """The record's size when it is over ``topic``'s limit; None when it fits."""
        size = record_size(key, value, headers)
        return size if size > self.of(topic) else None


EXCERPT_CHARS = 200
"""What a log line, a dead letter's message or a web view's error quotes of one input field (a
job id, a task id, a path segment): :func:`excerpt`."""


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """One input field as a log line or an error message may quote it: on one line (control
    characters escaped as ``repr`` does, so a field cannot forge a log line) and cut to ``limit``
    characters, saying how long it was. Quote every field an input or a journal record brought
    with it (``log.warning("task %s ...", excerpt(task_id))``), never the field itself."""
    text = value if isinstance(value, str) else repr(value)
    cut = text[:limit]
    shown = cut if cut.isprintable() else repr(cut)[1:-1]
    return shown if len(text) <= limit else f"{shown}... ({len(text)} characters)"


def bounded(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters, cut to {limit})"
