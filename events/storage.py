"""Where task snapshots live: the local file system, or any fsspec file system (S3 with the ``s3``
extra: ``pip install 'cutline[s3]'``).

``file:`` URIs (and plain paths) are written as before: a temporary file, fsync, rename, fsync of the
directory. Other schemes go through fsspec: an object store's PUT of a whole object is atomic, so a
reader sees the old object or all of the new one. fsspec finds the file system by the URI's scheme
and configures it the usual way (for S3: the ``AWS_*`` variables or ``~/.aws``, and
``AWS_ENDPOINT_URL`` for an S3-compatible store).
"""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import urlsplit

from events.extras import MissingExtra, require


def is_local(uri: str) -> bool:
    return urlsplit(uri).scheme in ("", "file")


def _filesystem(uri: str) -> tuple[Any, str]:
    scheme = urlsplit(uri).scheme
    if scheme in ("s3", "s3a"):
        require("s3", f"a snapshot on {scheme}:")
    try:
        from fsspec.core import url_to_fs
    except ImportError:  # pragma: no cover - the s3 extra brings fsspec
        raise MissingExtra(
            f"{uri}: storage other than file: needs fsspec: pip install 'cutline[s3]'"
        ) from None
    try:
        return url_to_fs(uri)  # type: ignore[no-any-return,unused-ignore]
    except (ImportError, ValueError) as exc:
        raise MissingExtra(f"{uri}: no file system for {scheme!r} is installed ({exc})") from None


def write_bytes(uri: str, data: bytes) -> None:
    """Write ``data`` at ``uri``, all or nothing, durably."""
    from events.participant import local_path, write_atomic

    if is_local(uri):
        write_atomic(local_path(uri), data)
        return
    filesystem, path = _filesystem(uri)
    filesystem.pipe_file(path, data)


def read_bytes(uri: str) -> bytes:
    from events.participant import local_path

    if is_local(uri):
        return local_path(uri).read_bytes()
    filesystem, path = _filesystem(uri)
    data: bytes = filesystem.cat_file(path)
    return data


def delete(uri: str) -> None:
    """Delete the object at ``uri``; nothing if it is not there."""
    from events.participant import local_path

    if is_local(uri):
        local_path(uri).unlink(missing_ok=True)
        return
    filesystem, path = _filesystem(uri)
    with contextlib.suppress(FileNotFoundError):
        filesystem.rm_file(path)


def exists(uri: str) -> bool:
    from events.participant import local_path

    if is_local(uri):
        return local_path(uri).exists()
    filesystem, path = _filesystem(uri)
    return bool(filesystem.exists(path))
