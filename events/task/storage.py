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
import itertools
import os
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from events.extras import MissingExtra, require


class UnsupportedLocation(ValueError):
    """A checkpoint location or state handle URI this library cannot write or read."""


def local_path(uri: str) -> Path:
    """The local file system path of a ``file:`` URI (or of a plain path).

    Raises :class:`UnsupportedLocation` for other schemes and remote hosts.
    """
    parts = urlsplit(uri)
    if parts.scheme == "":
        if not uri:
            raise UnsupportedLocation("empty checkpoint location")
        return Path(uri)
    if parts.scheme != "file":
        raise UnsupportedLocation(
            f"unsupported checkpoint location scheme {parts.scheme!r} in {uri!r}: "
            "the participant library writes only file:// URIs (or plain local paths)"
        )
    if parts.netloc not in ("", "localhost"):
        raise UnsupportedLocation(f"file URI {uri!r} names host {parts.netloc!r}; only local files work")
    return Path(unquote(parts.path))


_TEMPORARY_NAMES = itertools.count()
_PROCESS_TOKEN = uuid.uuid4().hex[:8]
"""With the process id and a counter, names a temporary file no other writer names (several hosts
may share a file system; a forked child has its own pid)."""

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def _create_temporary(path: Path) -> tuple[Path, int]:
    """A new temporary file next to ``path`` (its directories made if missing), open for writing."""
    while True:
        tmp = path.with_name(f".{path.name}.{_PROCESS_TOKEN}-{os.getpid()}-{next(_TEMPORARY_NAMES)}.tmp")
        try:
            return tmp, os.open(tmp, _CREATE, 0o666)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            return tmp, os.open(tmp, _CREATE, 0o666)
        except FileExistsError:  # pragma: no cover - only a writer that reuses our names gets here
            continue


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so readers see the old file or all of the new one, durably.

    Creates missing directories; writes a temporary file in the same directory,
    fsyncs it, renames it over ``path`` and fsyncs the directory. ``durable=False``
    leaves out the fsyncs: still all or nothing for readers, but an OS crash may
    lose it (for files that are rebuilt from a checkpoint anyway, as Spark's state
    store does not sync either).

    Written with ``os`` calls rather than ``open()``, a ``mkdir`` and a ``uuid4`` per file: those
    cost six more system calls per file (``mkdir``, ``stat``, ``getrandom``, ``fstat``, ``ioctl``,
    ``lseek``; strace), and each releases and takes back the GIL, which the other tasks of the
    process writing their snapshots at the same moment wait for (docs/benchmarks.md).
    """
    directory = path.parent
    tmp, fd = _create_temporary(path)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    if not durable:
        return
    with contextlib.suppress(OSError):  # not every file system can fsync a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def is_local(uri: str) -> bool:
    return urlsplit(uri).scheme in ("", "file")


def stays_within(uri: str, root: str) -> bool:
    """Whether ``uri``, with every symbolic link resolved, still lies below ``root`` (resolved too).

    Object stores have no links: True for them. The URIs are compared as strings elsewhere
    (:func:`events.wire.validation.is_within`); a link inside a checkpoint directory that points out
    of it passes that, and a restore would read whatever it names."""
    if not (is_local(uri) and is_local(root)):
        return True
    return local_path(uri).resolve().is_relative_to(local_path(root).resolve())


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


def write_bytes(uri: str, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` at ``uri``, all or nothing, durably (``durable=False``: see :func:`write_atomic`;
    an object store's PUT is durable either way)."""
    if is_local(uri):
        write_atomic(local_path(uri), data, durable=durable)
        return
    filesystem, path = _filesystem(uri)
    filesystem.pipe_file(path, data)


def read_bytes(uri: str) -> bytes:
    if is_local(uri):
        return local_path(uri).read_bytes()
    filesystem, path = _filesystem(uri)
    data: bytes = filesystem.cat_file(path)
    return data


def delete(uri: str) -> None:
    """Delete the object at ``uri``; nothing if it is not there."""
    if is_local(uri):
        local_path(uri).unlink(missing_ok=True)
        return
    filesystem, path = _filesystem(uri)
    with contextlib.suppress(FileNotFoundError):
        filesystem.rm_file(path)


def exists(uri: str) -> bool:
    if is_local(uri):
        return local_path(uri).exists()
    filesystem, path = _filesystem(uri)
    filesystem.invalidate_cache(path)  # not an answer from a listing cached before another process wrote
    return bool(filesystem.exists(path))


def list_names(uri: str) -> list[str]:
    """The names of the files directly in directory ``uri`` (none if it does not exist)."""
    if is_local(uri):
        try:
            return [entry.name for entry in os.scandir(local_path(uri)) if entry.is_file()]
        except (FileNotFoundError, NotADirectoryError):
            return []
    filesystem, path = _filesystem(uri)
    # fsspec file systems cache listings (s3fs's dircache) per process: a version another executor
    # wrote since would be missed. A listing here must be the store's current one.
    filesystem.invalidate_cache(path)
    try:
        entries = filesystem.ls(path, detail=True)
    except FileNotFoundError:
        return []
    return [str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "file"]


def size(uri: str) -> int:
    """The size in bytes of the object at ``uri``; FileNotFoundError if it is not there."""
    if is_local(uri):
        return local_path(uri).stat().st_size
    filesystem, path = _filesystem(uri)
    filesystem.invalidate_cache(path)
    return int(filesystem.size(path))


def remove_empty_directory(uri: str) -> None:
    """Remove directory ``uri`` if nothing is in it (object stores have no directories: nothing)."""
    if is_local(uri):
        with contextlib.suppress(OSError):
            local_path(uri).rmdir()


def join(directory: str, name: str) -> str:
    """The URI (or path) of file ``name`` in ``directory``."""
    return f"{directory.rstrip('/')}/{name}"
