"""Which decisions fit their topics (docs/design.md, "Record sizes"): pure rules, no I/O.

The encoder (:mod:`coordinator.core.encoding`) encodes each decision's records and asks these rules
before anything is journaled or the state changes: an input whose decision would not fit is
refused (``RECORD_TOO_LARGE``, a dead letter), and a completion too large for the journal goes to
a metadata object instead (:mod:`events.wire.metadata`).
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.core.commands import ChangeJobStatus, Command
from events.wire.sizes import MAX_LOGGED_CHARS
from events.wire.validation import MAX_REQUEST_ID_BYTES, MAX_TARGET_BYTES

__all__ = [
    "DEAD_LETTER_ROOM",
    "MAX_DEAD_LETTER_KEY",
    "MAX_DEAD_LETTER_MESSAGE",
    "TRIGGER_HEADROOM",
    "Preview",
    "journal_budget",
    "preview",
    "too_large",
]

TRIGGER_HEADROOM = 4_096 + MAX_TARGET_BYTES + MAX_REQUEST_ID_BYTES + 256
"""Bytes a RUNNING status leaves free in the journal's limit: its ``SchedulerStarted`` carries the
task list and the config, and every ``CheckpointTriggered`` of the job carries the same list, a
location (a savepoint's: a target of up to ``MAX_TARGET_BYTES`` and its directory name), a request
id of up to ``MAX_REQUEST_ID_BYTES`` and a few numbers. Admitting the status only when its records
fit with this room to spare means all its triggers fit too (a tick is no input that could be
refused, and a request admitted within its bounds must not be refused for the job's size)."""

MAX_DEAD_LETTER_MESSAGE = 4_096
"""Characters of a dead letter's reason message (it may quote the input: a task id, a URI)."""

MAX_DEAD_LETTER_KEY = 16_384
"""Bytes of the input's key a dead letter keeps."""

DEAD_LETTER_ROOM = 2_048
"""Bytes of a dead letter's limit kept for its other fields (topic, reason, numbers, headers) and
the record's own overhead."""


def journal_budget(command: Command, limit: int) -> int:
    """The most bytes one journal record of ``command``'s decision may take, under ``limit``."""
    if isinstance(command, ChangeJobStatus):
        return max(0, limit - TRIGGER_HEADROOM)
    return limit


def too_large(what: str, topic: str, size: int, budget: int) -> str:
    """The dead-letter message of an input whose ``what`` record would not fit ``topic``."""
    return (
        f"its decision would write a {what} of {size} bytes to {topic}, over the {budget} bytes a record "
        "there may take (the topic's max.message.bytes): refused, nothing of it was journaled. Use "
        "shorter ids, fewer tasks per job, or raise max.message.bytes of the topic"
    )


@dataclass(frozen=True, slots=True)
class Preview:
    """What a dead letter keeps of its input: bounded message, key and value."""

    message: str
    key: bytes | None
    value: bytes | None
    job_id: str | None


def preview(
    message: str, key: bytes | None, value: bytes | None, job_id: str | None, limit: int, max_value: int
) -> Preview:
    """A dead letter's message, key, value and job id cut so that the whole letter stays within
    ``limit`` (the dead-letter topic's max.message.bytes), each cut saying so in the message."""
    notes = []
    cut_at = min(MAX_DEAD_LETTER_MESSAGE, limit // 8)
    if len(message) > cut_at:
        message = message[:cut_at] + f"... ({len(message)} characters, cut)"
    if job_id is not None and len(job_id) > MAX_LOGGED_CHARS:
        job_id = job_id[:MAX_LOGGED_CHARS]
        notes.append(f"the job id is cut to its first {MAX_LOGGED_CHARS} characters")
    key_at = min(MAX_DEAD_LETTER_KEY, limit // 8)
    if key is not None and len(key) > key_at:
        notes.append(f"the key is cut to its first {key_at} of {len(key)} bytes")
        key = key[:key_at]
    # The key is written twice (the record's key and the letter's field); text as UTF-8.
    used = len(message.encode("utf-8", "backslashreplace")) + 2 * len(key or b"")
    used += len((job_id or "").encode("utf-8", "backslashreplace")) + 400  # the notes below
    keep = max(0, min(max_value, limit - DEAD_LETTER_ROOM - used))
    if value is not None and len(value) > keep:
        notes.append(f"the value is cut to its first {keep} of {len(value)} bytes")
        value = value[:keep]
    if notes:
        message += " (" + "; ".join(notes) + ")"
    return Preview(message, key, value, job_id)
