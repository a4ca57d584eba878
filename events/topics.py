"""Topic names of the wire protocol (DESIGN §3), all under one configurable prefix."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "cutline."
DEFAULT_PARTITIONS = 8


@dataclass(frozen=True, slots=True)
class Topics:
    """The seven topics of one cutline installation.

    Every message is keyed by ``job_id``, and every topic has the same partition
    count, so all events of one job share a partition number everywhere (Faust
    needs this to co-partition its table with its input streams).
    """

    prefix: str = DEFAULT_PREFIX

    @property
    def job_status(self) -> str:
        return f"{self.prefix}job-status"

    @property
    def requests(self) -> str:
        return f"{self.prefix}requests"

    @property
    def acks(self) -> str:
        return f"{self.prefix}acks"

    @property
    def declines(self) -> str:
        return f"{self.prefix}declines"

    @property
    def barriers(self) -> str:
        return f"{self.prefix}barriers"

    @property
    def checkpoints(self) -> str:
        """The journal: every event the coordinator decided, in order."""
        return f"{self.prefix}checkpoints"

    @property
    def dead_letters(self) -> str:
        return f"{self.prefix}dead-letters"

    @property
    def inputs(self) -> tuple[str, ...]:
        """Topics the coordinator reads commands from."""
        return (self.job_status, self.requests, self.acks, self.declines)

    @property
    def all(self) -> tuple[str, ...]:
        return (*self.inputs, self.barriers, self.checkpoints, self.dead_letters)
