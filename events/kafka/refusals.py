"""What a client says when the broker refuses its principal: the ACL it lacks, never "does not exist".

A secured cluster (Kafka's ``StandardAuthorizer``, docs/security.md) answers a request its principal
may not make with an authorization error: ``TOPIC_AUTHORIZATION_FAILED``,
``GROUP_AUTHORIZATION_FAILED``, ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED`` or
``CLUSTER_AUTHORIZATION_FAILED``. It also leaves the topics a principal may not Describe out of a
listing, and answers for one of them as for a refused one whether it exists or not. No waiting heals
a refusal, and creating the topic does not either: :func:`refusal_message` names the operation, the
resource and the principal, and the ``kafka-acls.sh`` command that grants it; :func:`explain` maps a
broker's error to it (None for any other error); every place that turns a Kafka error into a user's
message asks it first, and raises :class:`AccessRefused`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from events.kafka.client_config import client_properties

__all__ = [
    "AUTHORIZATION_ERRORS",
    "CLUSTER",
    "PLACEHOLDER_BOOTSTRAP",
    "AccessRefused",
    "error_name",
    "explain",
    "grant_command",
    "is_refusal",
    "principal_of",
    "refusal_message",
]

AUTHORIZATION_ERRORS: Mapping[str, str] = MappingProxyType(
    {
        "TOPIC_AUTHORIZATION_FAILED": "topic",
        "GROUP_AUTHORIZATION_FAILED": "group",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "transactional-id",
        "CLUSTER_AUTHORIZATION_FAILED": "cluster",
    }
)
"""librdkafka's name of each error a broker refuses a principal with -> the kind of resource refused."""

CLUSTER = "kafka-cluster"
"""The name of the one cluster resource."""

PLACEHOLDER_BOOTSTRAP = "BROKER:9093"
"""The ``--bootstrap-server`` of a command whose cluster the caller does not know."""

RESOURCE_OPTIONS = MappingProxyType(
    {"topic": "--topic", "group": "--group", "transactional-id": "--transactional-id", "cluster": "--cluster"}
)
"""``kafka-acls.sh``'s option for each kind of resource."""

GUIDE = 'docs/security.md, "Kafka ACLs per principal", lists what each role needs'


class AccessRefused(PermissionError):
    """The broker refused the principal an operation on a resource: the message names the ACL it lacks
    and the command that grants it (:func:`refusal_message`)."""


def principal_of(properties: Mapping[str, str]) -> str:
    """The principal the client settings log in as: ``User:<sasl.username>``, else a placeholder
    (an mTLS principal is the certificate's distinguished name)."""
    username = properties.get("sasl.username")
    return f"User:{username}" if username else "User:<principal>"


def grant_command(
    principal: str,
    kind: str,
    name: str,
    operations: Sequence[str],
    *,
    prefixed: bool = False,
    bootstrap: str = PLACEHOLDER_BOOTSTRAP,
) -> str:
    """The ``kafka-acls.sh`` command that allows ``principal`` ``operations`` on the ``kind`` resource
    ``name`` (by its prefix with ``prefixed``; the cluster takes no name)."""
    words = ["kafka-acls.sh", "--bootstrap-server", bootstrap, "--command-config", "admin.properties"]
    words += ["--add", "--allow-principal", principal]
    for operation in operations:
        words += ["--operation", operation]
    words.append(RESOURCE_OPTIONS[kind])
    if kind != "cluster":
        words.append(name)
    if prefixed:
        words += ["--resource-pattern-type", "prefixed"]
    return shlex.join(words)


def refusal_message(
    operation: str,
    kind: str,
    name: str,
    *,
    bootstrap: str = PLACEHOLDER_BOOTSTRAP,
    properties: Mapping[str, str] | None = None,
    error: str | None = None,
    also: Sequence[str] = (),
) -> str:
    """What a client the broker refused ``operation`` on the ``kind`` resource ``name`` says: the
    principal, the ACL it lacks (with Describe, which every other operation needs too, and ``also``:
    what the caller will need next, e.g. Write where Describe was refused), and the command that grants
    it. ``properties`` are the client's settings (the process's by default)."""
    principal = principal_of(client_properties() if properties is None else properties)
    wanted = (*also, operation, "Describe") if kind != "cluster" else (operation,)
    operations = tuple(dict.fromkeys(wanted))
    resource = CLUSTER if kind == "cluster" else name
    unseen = (
        "; the broker does not say whether a topic exists to a principal without Describe on it"
        if kind == "topic" and operation == "Describe"
        else ""
    )
    command = grant_command(principal, kind, resource, operations, bootstrap=bootstrap)
    more = [op for op in dict.fromkeys(also) if op not in (operation, "Describe")]
    needed = f", and the {' and '.join(more)} this needs too," if more else ""
    return (
        f"{principal} may not {operation} {kind} {resource} ({error or _error_of(kind)}): the cluster's "
        f"ACLs do not allow it ({GUIDE}{unseen}). An administrator grants it{needed} with:\n  {command}"
    )


def _error_of(kind: str) -> str:
    return next(name for name, refused in AUTHORIZATION_ERRORS.items() if refused == kind)


def error_name(error: Any) -> str | None:
    """librdkafka's name of ``error``: a ``KafkaError``, a ``KafkaException`` carrying one, or None."""
    if isinstance(error, BaseException) and error.args:
        error = error.args[0]  # a KafkaException's KafkaError
    name = getattr(error, "name", None)
    return str(name()) if callable(name) else None


def is_refusal(error: Any) -> bool:
    """Whether ``error`` (a ``KafkaError`` or ``KafkaException``) is the broker's refusal of the
    principal: an authorization error."""
    return error_name(error) in AUTHORIZATION_ERRORS


def explain(
    error: Any,
    operation: str,
    name: str,
    *,
    bootstrap: str = PLACEHOLDER_BOOTSTRAP,
    properties: Mapping[str, str] | None = None,
) -> str | None:
    """The message for ``error`` when it is the broker's refusal of ``operation`` on ``name`` (the topic,
    group or transactional id the request was about; the error says which kind): None for any other
    error, which the caller reports as before."""
    found = error_name(error)
    kind = AUTHORIZATION_ERRORS.get(found or "")
    if kind is None:
        return None
    return refusal_message(operation, kind, name, bootstrap=bootstrap, properties=properties, error=found)
