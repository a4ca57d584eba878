"""Topic names of the wire protocol (docs/design.md, "Wire protocol"), all under one configurable prefix."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_PREFIX = "cutline."
DEFAULT_PARTITIONS = 8


@dataclass(frozen=True, slots=True)
class Topics:
    """The topics of one cutline installation: the seven of the wire protocol (``all``) and the
    coordinator's two internal ones (``internal``).

    Every message of a job is keyed by ``job_id`` (a ``CoordinatorClaimed``, about a journal
    partition, has a null key), and every topic has the same partition
    count, so all events of one job share a partition number everywhere (Faust
    needs this to co-partition its table with its input streams).
    """

    prefix: str = DEFAULT_PREFIX
    job_status: str = field(init=False, repr=False, compare=False)
    requests: str = field(init=False, repr=False, compare=False)
    acks: str = field(init=False, repr=False, compare=False)
    declines: str = field(init=False, repr=False, compare=False)
    barriers: str = field(init=False, repr=False, compare=False)
    checkpoints: str = field(init=False, repr=False, compare=False)
    """The journal: every event the coordinator decided, in order."""
    dead_letters: str = field(init=False, repr=False, compare=False)
    ticks: str = field(init=False, repr=False, compare=False)
    """Internal: ticks travel through Kafka so they reach the worker that owns the job."""
    snapshots: str = field(init=False, repr=False, compare=False)
    """Internal, compacted: per journal partition, snapshots of its fold and claim intents
    (docs/design.md, "Ownership and fencing")."""

    def __post_init__(self) -> None:
        # Spelled out once, not per access: the coordinator asks for these names for every
        # message it decides and publishes (a property built a new string each time).
        for name, suffix in _SUFFIXES.items():
            object.__setattr__(self, name, f"{self.prefix}{suffix}")

    @property
    def inputs(self) -> tuple[str, ...]:
        """Topics the coordinator reads commands from."""
        return (self.job_status, self.requests, self.acks, self.declines)

    @property
    def all(self) -> tuple[str, ...]:
        """The seven topics of the wire protocol."""
        return (*self.inputs, self.barriers, self.checkpoints, self.dead_letters)

    @property
    def internal(self) -> tuple[str, ...]:
        """The coordinator's own topics: nobody else reads or writes them."""
        return (self.ticks, self.snapshots)


_SUFFIXES = {
    "job_status": "job-status",
    "requests": "requests",
    "acks": "acks",
    "declines": "declines",
    "barriers": "barriers",
    "checkpoints": "checkpoints",
    "dead_letters": "dead-letters",
    "ticks": "coordinator-ticks",
    "snapshots": "coordinator-snapshots",
}
"""Each topic's name after the prefix."""
