"""A completion's metadata object read from storage (docs/design.md, "Record sizes"): the I/O
beside :mod:`events.wire.metadata`, which checks and decodes what is read."""

from __future__ import annotations

from events.task import storage
from events.wire.codec import Codec
from events.wire.metadata import MetadataUnavailable, completion_in_object
from events.wire.records import CheckpointCompleted

__all__ = ["MetadataUnavailable", "resolve_completion"]


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
    return completion_in_object(completed, data, codec)
