"""How a process frames records (docs/wire-format.md, "Confluent framing"): the settings alone,
which the codec (:func:`events.wire.codec.codec_for`) and the schema registry's framing both read."""

from __future__ import annotations

import dataclasses

__all__ = ["WIRE_FORMATS", "WireFormatError", "WireSettings"]

WIRE_FORMATS = ("single-object", "confluent")


class WireFormatError(ValueError):
    """The wire format settings do not fit together; says how to fix them."""


@dataclasses.dataclass(frozen=True)
class WireSettings:
    """How a process frames records: single-object (the default), or Confluent frames through a
    schema registry (docs/wire-format.md, "Confluent framing").

    Set by a process's caller: the ``cutline`` command from its options, a job from
    ``JobSettings.wire``, a program from :func:`events.wire.schema_registry.wire_from_environment`,
    then made the process's with :func:`use_wire`. Tasks carry their driver's settings.
    """

    schema_registry_url: str | None = None
    """Every reader also decodes Confluent frames through this registry."""
    wire_format: str = "single-object"
    """How records are written: ``single-object`` or ``confluent`` (needs the registry)."""

    def __post_init__(self) -> None:
        if self.wire_format not in WIRE_FORMATS:
            raise WireFormatError(f"wire format {self.wire_format!r}: use one of {', '.join(WIRE_FORMATS)}")
        if self.wire_format == "confluent" and not self.schema_registry_url:
            raise WireFormatError(
                "the confluent wire format needs a schema registry: pass --schema-registry URL "
                "(or set CUTLINE_SCHEMA_REGISTRY_URL)"
            )
