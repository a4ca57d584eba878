"""The Confluent Schema Registry wire format for cutline's topics (optional, the ``registry`` extra).

Single-object encoding (docs/design.md, "Wire protocol") stays the default. With a registry URL
(:class:`events.wire.wire_settings.WireSettings`, ``--schema-registry URL``) every reader also decodes
Confluent frames (magic byte 0, a 4-byte schema id, the Avro body); with the ``confluent`` wire format the
writers write them, so kcat, Kafka UI, AKHQ, Redpanda Console and Kafdrop show the records.
A topic carries several record types, so subjects follow Confluent's TopicRecordNameStrategy:
``<topic>-cutline.<Record>``, registered on first use. The registry is asked once per schema
(confluent-kafka's client caches ids and schemas).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from events.extras import require
from events.wire.wire_settings import WIRE_FORMATS, WireFormatError, WireSettings
from events.wire.writer_schema import NAMESPACE, WriterSchema

URL_VARIABLE = "CUTLINE_SCHEMA_REGISTRY_URL"
FORMAT_VARIABLE = "CUTLINE_WIRE_FORMAT"
__all__ = [
    "FORMAT_VARIABLE",
    "URL_VARIABLE",
    "WIRE_FORMATS",
    "RegistryFraming",
    "WireFormatError",
    "subject",
    "wire_from_environment",
]


def subject(topic: str, writer: WriterSchema) -> str:
    """Confluent's TopicRecordNameStrategy: ``<topic>-<fully qualified record name>``."""
    return f"{topic}-{NAMESPACE}.{writer.name}"


class RegistryFraming:
    """Confluent framing through ``confluent_kafka.schema_registry.SchemaRegistryClient``."""

    def __init__(self, url: str, writes: bool) -> None:
        require("registry", "the Confluent Schema Registry wire format")
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url = url
        self.writes = writes
        self._client = SchemaRegistryClient({"url": url})
        self._ids: dict[tuple[str, bytes], int] = {}

    def schema_id(self, topic: str, writer: WriterSchema) -> int:
        from confluent_kafka.schema_registry import Schema

        key = (topic, writer.fingerprint)
        schema_id = self._ids.get(key)
        if schema_id is None:
            text = json.dumps(writer.parsed, separators=(",", ":"))
            schema_id = self._ids[key] = self._client.register_schema(
                subject(topic, writer), Schema(text, "AVRO")
            )
        return schema_id

    def schema(self, schema_id: int) -> Mapping[str, Any]:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            schema = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            raise LookupError(str(exc)) from None
        if (schema.schema_type or "AVRO") != "AVRO" or schema.schema_str is None:
            raise LookupError(f"schema {schema_id} is a {schema.schema_type} schema, not Avro")
        parsed: Mapping[str, Any] = json.loads(schema.schema_str)
        return parsed


def wire_from_environment(environ: Mapping[str, str] | None = None) -> WireSettings:
    """The wire settings that ``CUTLINE_SCHEMA_REGISTRY_URL`` and ``CUTLINE_WIRE_FORMAT`` name: for a
    program's entry point (the ``cutline`` command exports them to the processes it starts)."""
    environ = os.environ if environ is None else environ
    url = environ.get(URL_VARIABLE, "").strip() or None
    wire_format = environ.get(FORMAT_VARIABLE, "").strip() or "single-object"
    try:
        return WireSettings(url, wire_format)
    except WireFormatError as exc:
        raise WireFormatError(f"{FORMAT_VARIABLE}={wire_format}, {URL_VARIABLE}={url or ''}: {exc}") from None


def wire_environment(wire: WireSettings) -> dict[str, str]:
    """The variables :func:`wire_from_environment` reads back as ``wire``."""
    variables = {FORMAT_VARIABLE: wire.wire_format}
    if wire.schema_registry_url:
        variables[URL_VARIABLE] = wire.schema_registry_url
    return variables
