"""Which source a checkpointed word count reads Kafka with: Spark's own ``kafka`` connector where it can
(its jars resolve, :mod:`spark_tasks.connector`), ``cutline-kafka`` otherwise, and why, in one line.

:func:`choose_source` decides from what was asked (``--source``, or nothing: the connector when
available), the job's shape, whether the connector's jars resolve (injected, so the decision is
tested without Maven) and whether the job's Kafka client settings translate into the connector's
(:func:`security_refusal`, :mod:`spark_tasks.connector_security`). ``python -m spark_tasks.wordcount``
and ``cutline demo`` report its :attr:`SourceChoice.line`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from spark_tasks.connector import ConnectorUnavailable, KafkaConnector
from spark_tasks.connector_security import ConnectorSecurityRefused, connector_security_options

__all__ = [
    "CONNECTOR",
    "CUTLINE_KAFKA",
    "SourceChoice",
    "SourceUnavailable",
    "choose_source",
    "security_refusal",
]

CONNECTOR: Final = "kafka"
"""Spark's own Kafka connector (``format("kafka")``, ``spark-sql-kafka-0-10``)."""
CUTLINE_KAFKA: Final = "cutline-kafka"
"""cutline's Python Data Source: no jar needed."""


class SourceUnavailable(ValueError):
    """The source asked for cannot read this job here; the message says what to do."""


@dataclass(frozen=True)
class SourceChoice:
    """The source a job reads with, why, and the connector's jars when it is the connector."""

    source: Literal["kafka", "cutline-kafka"]
    """:data:`CONNECTOR` or :data:`CUTLINE_KAFKA` (``JobSettings.source``)."""
    why: str
    connector: KafkaConnector | None = None
    """The connector's jars for the session's ``spark.jars`` (None on a Connect server: its own)."""

    @property
    def on_connector(self) -> bool:
        return self.source == CONNECTOR

    @property
    def line(self) -> str:
        """One line for a user: ``source: Spark's kafka connector 4.2.0 on PySpark 4.3.0 (why)``."""
        name = "Spark's kafka connector" if self.on_connector else "cutline-kafka"
        connector = self.connector
        if connector is not None:
            name += f" {connector.version}" + (
                "" if connector.exact else f" on PySpark {connector.spark_version}"
            )
        return f"source: {name} ({self.why})"


def choose_source(
    requested: str | None,
    *,
    remote: bool,
    resolve: Callable[[], KafkaConnector],
    refused: ConnectorSecurityRefused | None = None,
) -> SourceChoice:
    """The source for a word count (keyed or per partition): ``requested`` (:data:`CONNECTOR` or
    :data:`CUTLINE_KAFKA`), or when None the connector where its jars resolve (``resolve``, which raises
    :class:`~spark_tasks.connector.ConnectorUnavailable` where they do not), ``cutline-kafka`` otherwise.

    A job on a Spark Connect server (``remote``) gets the connector only when asked: the server's jars
    are its own. A job whose Kafka client settings the connector cannot get (``refused``:
    :func:`security_refusal`) reads with ``cutline-kafka``, and says why. Raises
    :class:`SourceUnavailable` when the connector is asked for and cannot be."""
    if requested not in (None, CONNECTOR, CUTLINE_KAFKA):
        raise SourceUnavailable(f"--source is {CONNECTOR!r} or {CUTLINE_KAFKA!r}, not {requested!r}")
    if requested == CUTLINE_KAFKA:
        return SourceChoice(CUTLINE_KAFKA, "as asked")
    if refused is not None:
        if requested == CONNECTOR:
            raise SourceUnavailable(f"--source kafka: {refused}") from refused
        return SourceChoice(
            CUTLINE_KAFKA, f"Spark's kafka connector cannot get the Kafka client settings: {refused.reason}"
        )
    if remote:
        if requested == CONNECTOR:
            return SourceChoice(CONNECTOR, "as asked; the Spark Connect server's own jars")
        return SourceChoice(
            CUTLINE_KAFKA,
            "on Spark Connect the server's jars are its own: --source kafka if it has the connector",
        )
    try:
        connector = resolve()
    except ConnectorUnavailable as exc:
        if requested == CONNECTOR:
            raise SourceUnavailable(f"--source kafka: {exc}") from exc
        return SourceChoice(CUTLINE_KAFKA, f"Spark's kafka connector is not available: {_first_line(exc)}")
    return SourceChoice(CONNECTOR, "as asked" if requested == CONNECTOR else "its jars resolve", connector)


def security_refusal(
    properties: Mapping[str, str], given: Iterable[str] = ()
) -> ConnectorSecurityRefused | None:
    """Why the connector cannot get Kafka client ``properties`` (:func:`connector_security_options`,
    which reads the PEM files they name), or None: they translate, or the job's own options (``given``,
    their names) set the connector's security themselves."""
    try:
        connector_security_options(properties, given=given)
    except ConnectorSecurityRefused as exc:
        return exc
    return None


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
