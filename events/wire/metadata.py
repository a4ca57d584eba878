"""A completion too large for one journal record (docs/design.md, "Record sizes"), after Flink's
``_metadata``.

When a ``CheckpointCompleted`` with its handles and offsets would not fit in the journal topic's
``max.message.bytes``, the coordinator writes that whole record, as one Avro single-object frame
(the format of every cutline record, :mod:`events.wire.codec`), to ``<location>/_metadata`` (temporary
name, then rename; one PUT on object stores), and journals the same completion with empty
``handles`` and ``offsets`` and ``metadata`` = the object's ``StateHandle(uri, size_bytes,
sha256)``. The fold keeps that reference as data; a reader that needs the handles or offsets
(participants committing offsets, a restore, ``cutline savepoints show``) calls
:func:`events.task.completion_metadata.resolve_completion`, which reads the object and hands its bytes
to :func:`completion_in_object` here: it checks their size and sha256 and returns the full record.
This module is the wire's part, pure; storage is the task side's. The object is the same
``_metadata`` a Spark job's driver writes into a completed checkpoint's directory
(:data:`METADATA_FILE`): one format, one name.
"""

from __future__ import annotations

import dataclasses
import hashlib

from events.wire.codec import Codec, DecodeError, default_codec
from events.wire.records import CheckpointCompleted, StateHandle

__all__ = [
    "METADATA_FILE",
    "MetadataUnavailable",
    "by_reference",
    "completion_in_object",
    "metadata_uri",
]

METADATA_FILE = "_metadata"
"""The name of a completed checkpoint's or savepoint's metadata object in its location."""


class MetadataUnavailable(OSError):
    """A completion's metadata object cannot be read, or is not the one its reference names."""


def metadata_uri(location: str) -> str:
    """Where the metadata object of a checkpoint at ``location`` lives."""
    return f"{location.rstrip('/')}/{METADATA_FILE}"


def by_reference(completed: CheckpointCompleted, frame: bytes) -> CheckpointCompleted:
    """``completed`` as journaled when ``frame`` (its own encoding) went to its metadata object:
    no handles or offsets, a reference to the object instead. Pure."""
    reference = StateHandle(metadata_uri(completed.location), len(frame), hashlib.sha256(frame).hexdigest())
    return dataclasses.replace(completed, handles={}, offsets={}, metadata=reference)


def completion_in_object(
    completed: CheckpointCompleted, data: bytes, codec: Codec | None = None
) -> CheckpointCompleted:
    """The full record that ``data``, the bytes of ``completed``'s metadata object, holds, checked
    against the reference (size, sha256, job, id). Pure: :class:`MetadataUnavailable` says why not."""
    reference = completed.metadata
    assert reference is not None, "a completion that refers to no metadata object"
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != reference.size_bytes or digest != reference.sha256.lower():
        raise MetadataUnavailable(
            f"checkpoint {completed.checkpoint_id} of job {completed.job_id!r}: its metadata object "
            f"{reference.uri} is not the one journaled: expected {reference.size_bytes} bytes with sha256 "
            f"{reference.sha256}, found {len(data)} bytes with sha256 {digest}"
        )
    try:
        record = (codec or default_codec()).decode(data)
    except DecodeError as exc:
        raise MetadataUnavailable(f"{reference.uri} is not a cutline completion: {exc}") from exc
    if (
        not isinstance(record, CheckpointCompleted)
        or record.metadata is not None
        or (record.job_id, record.checkpoint_id) != (completed.job_id, completed.checkpoint_id)
    ):
        raise MetadataUnavailable(
            f"{reference.uri} does not hold the completion of checkpoint {completed.checkpoint_id} "
            f"of job {completed.job_id!r}"
        )
    return record
