"""The manifest of a keyed snapshot: which pieces rebuild a shuffle partition's key groups, and which
step wrote them (docs/spark.md, "Keyed state").

A keyed task's state handle names a manifest (JSON); the manifest lists the *pieces* (Arrow files
of ``(key_group, key, state)`` rows, oldest first, the first a full one) and the step's identity.
The Spark job reads it to restore; ``cutline savepoints dispose`` reads it to find a keyed
savepoint's pieces. Parsing it needs nothing but ``json``, so the CLI reads it without Spark.

**The step's identity** (:class:`StepIdentity`) is the ``uid`` the user gave the keyed step (as
Flink's operator uid) and the qualified name of its key function. A manifest written before
identities were recorded has none (``step`` is None): its state restores into any step, as it
did then.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from events.task.participant import SnapshotCorrupted

__all__ = [
    "MANIFEST_FORMAT",
    "Manifest",
    "Piece",
    "StepIdentity",
    "callable_name",
    "is_keyed_task",
]

MANIFEST_FORMAT = "cutline.keyed/1"

_KEYED_TASK = re.compile(r"^keyed-(\d+)$")


def is_keyed_task(task: str) -> bool:
    """Whether ``task`` is a keyed job's shuffle partition (``keyed-<index>``), whose handle is a manifest."""
    return _KEYED_TASK.match(task) is not None


def callable_name(function: Callable[..., Any]) -> str:
    """``module.qualified_name`` of a function (a lambda is ``module.<lambda>``); for another callable,
    the name of its type."""
    named = function if hasattr(function, "__qualname__") else type(function)
    return f"{getattr(named, '__module__', '?')}.{named.__qualname__}"


@dataclass(frozen=True)
class StepIdentity:
    """Which keyed step a snapshot's state belongs to: the user's ``uid`` (None if unset) and the
    qualified name of the key function (:func:`callable_name`)."""

    uid: str | None
    key_by: str
    state_type: str | None = field(default=None, compare=False)
    """The declared type of the step's state, encoded (:func:`events.task.keyed_pieces.encode_state_type`);
    None when the step declares none or the manifest predates it. Not part of the identity: a restore
    compares it on its own (:mod:`spark_tasks.restore`)."""

    def describe(self) -> str:
        uid = "no uid" if self.uid is None else f"uid {self.uid!r}"
        return f"{uid}, key function {self.key_by}"


@dataclass(frozen=True)
class Piece:
    """One file of a snapshot: ``full`` (every key of its key groups) or ``delta`` (changed keys)."""

    uri: str
    size: int
    sha256: str
    kind: str
    keys: int

    def as_json(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "size": self.size,
            "sha256": self.sha256,
            "kind": self.kind,
            "keys": self.keys,
        }


@dataclass(frozen=True)
class Manifest:
    """A shuffle partition's snapshot: the pieces that rebuild its key groups, oldest first (the
    first is a full piece), and the step that wrote it. Its JSON is the task's state handle."""

    task: str
    max_parallelism: int
    key_groups: range
    batch: int
    """The micro-batch of the barrier: the state is the one after every batch before it."""
    pieces: tuple[Piece, ...]
    step: StepIdentity | None = None
    """None: written before steps were recorded (it restores into any step)."""

    def to_bytes(self) -> bytes:
        document: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "task": self.task,
            "max_parallelism": self.max_parallelism,
            "key_groups": [self.key_groups.start, self.key_groups.stop],
            "batch": self.batch,
            "pieces": [piece.as_json() for piece in self.pieces],
        }
        if self.step is not None:
            document["step"] = {"uid": self.step.uid, "key_by": self.step.key_by}
            if self.step.state_type is not None:
                document["step"]["state_type"] = self.step.state_type
        return json.dumps(document, sort_keys=True, indent=1).encode()

    @staticmethod
    def from_bytes(data: bytes, where: str) -> Manifest:
        """Parse a manifest; :class:`SnapshotCorrupted` says what is wrong with it."""
        try:
            document = json.loads(data)
            if document.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"format {document.get('format')!r}, not {MANIFEST_FORMAT}")
            start, stop = document["key_groups"]
            pieces = tuple(
                Piece(str(p["uri"]), int(p["size"]), str(p["sha256"]), str(p["kind"]), int(p["keys"]))
                for p in document["pieces"]
            )
            step = document.get("step")
            manifest = Manifest(
                str(document["task"]),
                int(document["max_parallelism"]),
                range(int(start), int(stop)),
                int(document["batch"]),
                pieces,
                None if step is None else _identity(step),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SnapshotCorrupted(f"{where} is not a keyed snapshot manifest: {exc}") from exc
        if not pieces or pieces[0].kind != "full" or any(p.kind not in ("full", "delta") for p in pieces):
            raise SnapshotCorrupted(f"{where}: a manifest's pieces must start with a full piece")
        return manifest


def _identity(step: dict[str, Any]) -> StepIdentity:
    uid = step["uid"]
    if uid is not None and not isinstance(uid, str):
        raise TypeError(f"the step's uid {uid!r} is not a string")
    state_type = step.get("state_type")
    return StepIdentity(uid, str(step["key_by"]), None if state_type is None else str(state_type))
