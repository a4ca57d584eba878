"""Kafka client settings shared by every client in cutline: secured clusters (SASL, SSL).

One set of librdkafka properties (the names kcat and the Java client use: ``security.protocol``,
``sasl.mechanism``, ``sasl.username``, ``ssl.ca.location`` ...), from, later ones winning:

1. a properties file named by ``CUTLINE_KAFKA_CONFIG`` (``--kafka-config FILE``);
2. environment variables ``CUTLINE_KAFKA_<NAME>``, the name upper-cased with ``_`` for ``.``
   (``CUTLINE_KAFKA_SASL_PASSWORD`` is ``sasl.password``);
3. ``-X name=value`` on the command line, which the CLI turns into such variables.

Being environment variables, they reach every process cutline starts (coordinator workers, a
Spark driver under ``cutline run``, local Spark's Python workers). confluent-kafka clients get
the properties as they are; Faust and aiokafka get them translated into their own terms
(:func:`aiokafka_security`, :func:`faust_credentials`). Secrets are never logged or printed:
:func:`redacted` is what any message may show.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

CONFIG_FILE_VARIABLE = "CUTLINE_KAFKA_CONFIG"
VARIABLE_PREFIX = "CUTLINE_KAFKA_"
FETCH_WAIT_VARIABLE = "CUTLINE_FETCH_WAIT_MS"
"""``fetch.wait.max.ms`` of cutline's consumers that do not choose their own (and of the
coordinator's workers, ``cutline coordinator --fetch-wait-ms``)."""

FETCH_WAIT_MS = 500
"""The default ``fetch.wait.max.ms`` of cutline's consumers that follow a topic: Apache Kafka
answers a fetch as soon as records arrive, so a long wait costs no latency and spares the brokers
a fetch every few milliseconds per idle consumer. Reads to a partition's end choose their own short
wait (there Apache Kafka waits the whole of it)."""

EMBEDDED_BROKER_FETCH_WAIT_MS = 5
"""``CUTLINE_FETCH_WAIT_MS`` where the embedded Tansu broker runs: it answers a fetch that finds
nothing only after half of its wait, not when records arrive (docs/embedded-broker.md), so a hop
costs half the wait. :class:`events.dev.broker.EmbeddedBroker` sets it for its process and the
processes that process starts, unless it is set already."""

NOT_CLIENT_PROPERTIES = frozenset({CONFIG_FILE_VARIABLE, "CUTLINE_KAFKA_CACHE", "CUTLINE_KAFKA_LIBS"})
"""``CUTLINE_KAFKA_*`` variables that are not client properties: the properties file, and where
Apache Kafka's jars are cached or found (events/dev/apache_kafka.py, spark_tasks/connector.py); taken
for properties, every client failed (``No such configuration property: "cache"``)."""

REDACTED = "[redacted]"
"""What a message shows instead of a secret's value."""

SECRET_WORDS = frozenset({"password", "passphrase", "secret", "token", "jaas", "credentials"})
"""Words (of a name split at ``.``, ``_`` and ``-``) that say the value is or yields a credential: a
password, a private key's passphrase, an OAuth client secret, a token or what makes one (aiokafka's
``sasl_oauth_token_provider``), a JAAS login line, Faust's ``broker_credentials``."""

KEY_MATERIAL = (("ssl", "key"), ("keystore", "key"), ("private", "key"), ("user", "info"), ("oauth", "cb"))
"""Word pairs naming a private key, a user's credentials or a token callback: the value is the key
itself (``ssl.key.pem``, librdkafka's ``ssl_key``, the Java client's ``ssl.keystore.key``,
``sasl.oauthbearer.assertion.private.key.pem``), a ``user:password`` pair (Schema Registry's
``basic.auth.user.info``) or returns tokens (confluent-kafka's and Faust's ``oauth_cb``), unless a
reference word ends the name."""

FREE_FORM_SASL = frozenset({"config", "extensions", "cmd"})
"""Last words of ``sasl.*`` settings whose value is free text handed to the login
(``sasl.oauthbearer.config``, ``sasl.oauthbearer.extensions``, ``sasl.kerberos.kinit.cmd``): it
may embed a password or a token, so it is never shown."""

REFERENCE_WORDS = frozenset({"location", "file", "path", "paths", "url", "id", "name", "keytab"})
"""Last words of names whose value *points at* a secret or names a principal, and holds none: a file
path (``ssl.key.location``, ``sasl.oauthbearer.assertion.private.key.file``), an endpoint, an id
(``sasl.oauthbearer.client.credentials.client.id``). Shown, except for a URL's password (see
:func:`redacted_value`)."""


class ClientConfigError(ValueError):
    """The Kafka client settings cannot be read or cannot be given to a client; says which."""


def is_secret(name: str) -> bool:
    """Whether a client setting's value can hold a secret, for any name librdkafka (with
    confluent-kafka), aiokafka or Faust accepts: the one rule every message and warning obeys.

    The name is split into words at ``.``, ``_`` and ``-``. A name ending in a reference word
    (:data:`REFERENCE_WORDS`: a path, a URL, an id) is not secret; otherwise it is if a word says
    credential (:data:`SECRET_WORDS`), a word pair says private key or token callback
    (:data:`KEY_MATERIAL`), or it is a free-form SASL setting (:data:`FREE_FORM_SASL`). Tested
    against each library's full list of names (tests/client_properties/)."""
    words = [word for word in re.split(r"[._\-]+", name.lower()) if word]
    if not words or words[-1] in REFERENCE_WORDS:
        return False
    if words[0] == "sasl" and words[-1] in FREE_FORM_SASL:
        return True
    if any(pair in KEY_MATERIAL for pair in zip(words, words[1:], strict=False)):
        return True
    return not SECRET_WORDS.isdisjoint(words)


_URL_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/?#\s]*):[^/?#\s]*@")
"""A URL's ``user:password@``, split as urllib splits it: the authority ends at the first ``/``,
``?`` or ``#`` (or a space), the user information at the authority's last ``@`` (the greedy password
backtracks to it), the user at its first ``:``. So an unencoded ``@`` in a password, or in a user
name (an e-mail address), leaves no part of the password shown."""


def redacted_value(name: str, value: Any) -> Any:
    """What a message may show of one setting: :data:`REDACTED` for a secret (:func:`is_secret`),
    else the value with any URL's password (``scheme://user:password@``, :data:`_URL_PASSWORD`)
    replaced."""
    if is_secret(name):
        return REDACTED
    if isinstance(value, str) and "@" in value:
        return _URL_PASSWORD.sub(rf"\g<scheme>\g<user>:{REDACTED}@", value)
    return value


def redacted(properties: Mapping[str, Any]) -> dict[str, Any]:
    """``properties`` with every secret's value replaced: what a log line or an error may show."""
    return {name: redacted_value(name, value) for name, value in properties.items()}


def scrubbed(text: str, properties: Mapping[str, Any]) -> str:
    """``text`` (a client library's error, which may quote a setting) with the value of every secret
    setting of ``properties`` replaced by :data:`REDACTED`, longest value first."""
    secrets = {str(value) for name, value in properties.items() if is_secret(name) and str(value)}
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def parse_properties(text: str, source: str = "properties") -> dict[str, str]:
    """``name=value`` lines (``name: value`` too), ``#`` and ``!`` comments, blank lines.

    Written here rather than taken from a library: kcat's ``-F`` files and the Java client's
    ``client.properties`` in practice use only this subset, with no escapes or continuations."""
    properties: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        separator = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if separator < 0:
            raise ClientConfigError(f"{source}, line {number}: expected name=value")
        properties[line[:separator].strip()] = line[separator + 1 :].strip()
    return properties


def variable_name(property_name: str) -> str:
    """``sasl.password`` -> ``CUTLINE_KAFKA_SASL_PASSWORD``."""
    return VARIABLE_PREFIX + property_name.upper().replace(".", "_")


def fetch_wait_ms(default: int = FETCH_WAIT_MS, environ: Mapping[str, str] | None = None) -> int:
    """``CUTLINE_FETCH_WAIT_MS`` if set, else ``default`` (:data:`FETCH_WAIT_MS`, right for Apache
    Kafka; the embedded broker sets the variable to :data:`EMBEDDED_BROKER_FETCH_WAIT_MS`)."""
    environ = os.environ if environ is None else environ
    value = environ.get(FETCH_WAIT_VARIABLE, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise ClientConfigError(
            f"{FETCH_WAIT_VARIABLE}={value!r}: give a whole number of milliseconds, 1 or more"
        )
    return int(value)


def client_properties(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The shared librdkafka properties (file, then environment; see the module docstring)."""
    environ = os.environ if environ is None else environ
    properties: dict[str, str] = {}
    path = environ.get(CONFIG_FILE_VARIABLE)
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ClientConfigError(
                f"the Kafka client config {path} ({CONFIG_FILE_VARIABLE}) is unreadable: {exc}"
            ) from None
        properties.update(parse_properties(text, path))
    for name, value in sorted(environ.items()):
        if name.startswith(VARIABLE_PREFIX) and name not in NOT_CLIENT_PROPERTIES:
            properties[name.removeprefix(VARIABLE_PREFIX).lower().replace("_", ".")] = value
    properties.pop("bootstrap.servers", None)  # --bootstrap / CUTLINE_BOOTSTRAP say where
    return _without_jaas(properties)


_JAAS_OPTION = re.compile(r'\b(username|password)\s*=\s*"([^"]*)"')


def _without_jaas(properties: dict[str, str]) -> dict[str, str]:
    """The Java client's ``sasl.jaas.config`` (PlainLoginModule, ScramLoginModule) as librdkafka's
    ``sasl.username`` and ``sasl.password``: librdkafka refuses the JAAS property itself."""
    jaas = properties.pop("sasl.jaas.config", None)
    if jaas is not None:
        for name, value in _JAAS_OPTION.findall(jaas):
            properties.setdefault(f"sasl.{name}", value)
    return properties


def override(settings: list[str], environ: MutableMapping[str, str] | None = None) -> None:
    """Apply ``-X name=value`` settings to ``environ`` (this process's environment by default)."""
    environ = os.environ if environ is None else environ
    for setting in settings:
        name, equals, value = setting.partition("=")
        if not equals or not name.strip():
            raise ClientConfigError(f"-X {setting.split('=')[0]!r}...: expected -X name=value")
        environ[variable_name(name.strip())] = value


def command_line_warnings(settings: list[str]) -> list[str]:
    """One warning per ``-X`` setting of a secret: a command line is readable by every user of the
    host (``ps``, ``/proc/<pid>/cmdline``) for as long as the process runs; says what to use."""
    names = sorted({setting.partition("=")[0].strip() for setting in settings})
    return [
        f"-X {name}=...: a secret on the command line is readable by every user of this host "
        f"(ps, /proc/<pid>/cmdline) while cutline runs; put it in a properties file only you can "
        f"read (--kafka-config FILE, chmod 600 FILE) or in the variable {variable_name(name)} instead "
        "(docs/security.md)"
        for name in names
        if is_secret(name)
    ]


# ----------------------------------------------------------------- aiokafka and Faust

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def ssl_context(properties: Mapping[str, str]) -> ssl.SSLContext:
    """An SSL context from librdkafka's ``ssl.*`` properties (PEM files)."""
    context = ssl.create_default_context(cafile=properties.get("ssl.ca.location"))
    certificate = properties.get("ssl.certificate.location")
    if certificate:
        context.load_cert_chain(
            certificate, properties.get("ssl.key.location"), properties.get("ssl.key.password")
        )
    if properties.get("enable.ssl.certificate.verification", "true").lower() == "false":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif properties.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        context.check_hostname = False
    return context


def aiokafka_security(properties: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments of an aiokafka client for the shared properties' security settings."""
    protocol = properties.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ClientConfigError(f"security.protocol={protocol} is not one Kafka knows")
    arguments: dict[str, Any] = {"security_protocol": protocol}
    if protocol.startswith("SASL"):
        mechanism = properties.get("sasl.mechanism", properties.get("sasl.mechanisms", "PLAIN")).upper()
        if mechanism not in MECHANISMS:
            raise ClientConfigError(
                f"sasl.mechanism={mechanism}: the coordinator (aiokafka) supports {', '.join(MECHANISMS)}"
            )
        arguments.update(
            sasl_mechanism=mechanism,
            sasl_plain_username=properties.get("sasl.username"),
            sasl_plain_password=properties.get("sasl.password"),
        )
    if protocol.endswith("SSL"):
        arguments["ssl_context"] = ssl_context(properties)
    return arguments


def faust_credentials(properties: Mapping[str, str]) -> Any:
    """Faust's ``broker_credentials`` for the shared properties (None for PLAINTEXT)."""
    import faust

    security = aiokafka_security(properties)
    protocol = security["security_protocol"]
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return faust.SSLCredentials(security["ssl_context"])
    return faust.SASLCredentials(
        username=security["sasl_plain_username"],
        password=security["sasl_plain_password"],
        mechanism=security["sasl_mechanism"],
        ssl_context=security.get("ssl_context"),
    )
