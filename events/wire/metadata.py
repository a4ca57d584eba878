"""A completion too large for one journal record (docs/design.md, "Record sizes"), after Flink's
``_metadata``.

When a ``CheckpointCompleted`` with its handles and offsets would not fit in the journal topic's
``max.message.bytes``, the coordinator writes that whole record, as one Avro single-object frame
(the format of every cutline record, :mod:`events.wire.codec`), to ``<location>/_metadata`` (temporary
name, then rename; one PUT on object stores), and journals the same completion with empty
``handles`` and ``offsets`` and ``metadata`` = the object's ``StateHandle(uri, size_bytes,
sha256)``. The fold keeps that reference as data; a reader that needs the handles or offsets
(participants committing offsets, a restore, ``cutline savepoints show``) calls
:func:`resolve_completion`, which reads the object, checks its size and sha256, and returns the
full record. The object is the same ``_metadata`` a Spark job's driver writes into a completed
checkpoint's directory (:data:`METADATA_FILE`): one format, one name.
"""

from __future__ import annotations

import dataclasses
import hashlib

from events.task import storage
from events.wire.codec import Codec, DecodeError, default_codec
from events.wire.records import CheckpointCompleted, StateHandle

__all__ = [
    "METADATA_FILE",
    "MetadataUnavailable",
    "by_reference",
    "metadata_uri",
    "resolve_completion",
    "write_completion_metadata",
]

METADATA_FILE = "_metadata"
"""The name of a completed checkpoint's or savepoint's metadata object in its location."""


class MetadataUnavailable(OSError):
    """A completion's metadata object cannot be read, or is not the one its reference names."""


def metadata_uri(location: str) -> str:
    """Where the metadata object of a checkpoint at ``location`` lives."""
    return storage.join(location.rstrip("/") or location, METADATA_FILE)


def by_reference(completed: CheckpointCompleted, frame: bytes) -> CheckpointCompleted:
    """``completed`` as journaled when ``frame`` (its own encoding) went to its metadata object:
    no handles or offsets, a reference to the object instead. Pure."""
    reference = StateHandle(metadata_uri(completed.location), len(frame), hashlib.sha256(frame).hexdigest())
    return dataclasses.replace(completed, handles={}, offsets={}, metadata=reference)


def write_completion_metadata(
    completed: CheckpointCompleted, codec: Codec | None = None
) -> CheckpointCompleted:
    """Write ``completed`` (handles and offsets inline) to its metadata object, all or nothing, and
    return the completion to journal in its place (:func:`by_reference`). Raises OSError (or the
    storage's error) when it cannot be written."""
    if completed.metadata is not None:
        raise ValueError("the completion refers to a metadata object already")
    frame = (codec or default_codec()).encode(completed)
    journaled = by_reference(completed, frame)
    assert journaled.metadata is not None
    storage.write_bytes(journaled.metadata.uri, frame)
    return journaled


def resolve_completion(completed: CheckpointCompleted, codec: Codec | None = None) -> CheckpointCompleted:
    """``completed`` with its handles and offsets: itself when it carries them, else the record in
    its metadata object, checked against the reference (size, sha256, job, id).
    :class:`MetadataUnavailable` says why it cannot be."""
    reference = completed.metadata
    if reference is None:
        return completed
    try:
        data = storage.read_bytes(reference.uri)
    except (OSError, ValueError, ImportError) as exc:
        raise MetadataUnavailable(
            f"checkpoint {completed.checkpoint_id} of job {completed.job_id!r}: its metadata object "
            f"{reference.uri} cannot be read ({type(exc).__name__}: {exc})"
        ) from exc
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
