"""A writer schema as the codec and the schema registry's framing know it: the record it encodes,
its parsed form and its fingerprint."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

__all__ = ["NAMESPACE", "WriterSchema", "schema_fingerprint"]

NAMESPACE = "cutline"
"""The Avro namespace of every cutline record."""


def schema_fingerprint(parsed: dict[str, Any]) -> bytes:
    """The 8-byte little-endian CRC-64-AVRO fingerprint of a parsed schema."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


@dataclasses.dataclass(frozen=True, slots=True)
class WriterSchema:
    """One known writer schema: the record it encodes and its parsed form."""

    name: str
    fingerprint: bytes
    parsed: dict[str, Any]
    compiled: dict[str, Any] = dataclasses.field(init=False, repr=False, compare=False)
    """``parsed`` with fastavro's parse marker: fastavro's reader and writer take it as it is.
    Handed the unmarked ``parsed``, they parse the schema again on every call (about three
    quarters of the time of encoding an ack)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "compiled", parse_schema(self.parsed))
