"""cutline's Kafka client settings (librdkafka's names: ``CUTLINE_KAFKA_CONFIG``, ``--kafka-config``) as
the ``kafka.``-prefixed Java client options of Spark's ``kafka`` connector, so that a checkpointed job
on a secured cluster reads with the connector as cutline's own clients connect (docs/spark.md,
"On a secured cluster").

:func:`connector_security_options` translates what it can translate exactly and raises
:class:`ConnectorSecurityRefused` for anything else, naming the setting (never a secret's value) and
saying what to do: ``--source cutline-kafka``, or the ``kafka.*`` options given by hand. It reads
nothing but through its injected ``read_text`` (which checks that a PEM file holds what the Java client
takes), and imports no Spark.

=============================================  ============================================================
librdkafka                                     Spark's connector (Java client)
=============================================  ============================================================
``security.protocol``                          ``kafka.security.protocol`` (upper case)
``sasl.mechanism(s)`` PLAIN, SCRAM-SHA-256/512  ``kafka.sasl.mechanism``; with ``sasl.username`` and
                                               ``sasl.password``: ``kafka.sasl.jaas.config``
``ssl.ca.location`` (a PEM file)               ``kafka.ssl.truststore.type=PEM``, ``…truststore.location``
``ssl.ca.pem``                                 ``kafka.ssl.truststore.type=PEM``, ``…truststore.certificates``
``ssl.certificate.location`` =                 ``kafka.ssl.keystore.type=PEM``, ``…keystore.location``,
``ssl.key.location`` (one PEM file, PKCS#8),   ``kafka.ssl.key.password``
``ssl.key.password``
``ssl.keystore.location``, ``…password``       ``kafka.ssl.keystore.type=PKCS12``, ``…location``,
(PKCS#12)                                      ``…password``
``ssl.endpoint.identification.algorithm``      ``kafka.ssl.endpoint.identification.algorithm``
                                               (``none`` → empty, ``https`` → ``https``)
=============================================  ============================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Final, NoReturn

__all__ = [
    "ConnectorSecurityRefused",
    "connector_security_options",
    "jaas_config",
]

PROTOCOLS: Final = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})

LOGIN_MODULES: Final = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
"""The Java client's login module for each SASL mechanism the translation takes."""

TRANSLATED: Final = frozenset(
    {
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.ca.pem",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.endpoint.identification.algorithm",
    }
)
"""The ``sasl.*`` and ``ssl.*`` settings with an exact Java counterpart; any other is refused."""

OWN_SECURITY: Final = "kafka.security.protocol"
"""A user's own connector option that takes the connector's security out of cutline's hands."""

_PKCS8: Final = ("-----BEGIN PRIVATE KEY-----", "-----BEGIN ENCRYPTED PRIVATE KEY-----")
_CERTIFICATE: Final = "-----BEGIN CERTIFICATE-----"

_WHAT_TO_DO: Final = (
    "read with --source cutline-kafka (JobSettings(source='cutline-kafka')), or give the connector's "
    "security yourself as kafka.* options (kafka.security.protocol and the rest, in the Java client's "
    "names; then cutline translates nothing)"
)


class ConnectorSecurityRefused(ValueError):
    """A Kafka client setting has no exact counterpart in the connector's Java client; the message
    names it (never a secret's value) and says what to do, :attr:`reason` only the first."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"Spark's kafka connector cannot get cutline's Kafka client settings: {reason}; {_WHAT_TO_DO}"
        )
        self.reason = reason


def _read_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8", errors="replace")


def connector_security_options(
    properties: Mapping[str, str],
    *,
    given: Iterable[str] = (),
    read_text: Callable[[str], str] = _read_text,
) -> dict[str, str]:
    """The connector's ``kafka.*`` security options for librdkafka client ``properties``: none for a
    PLAINTEXT connection, or when the job's own options (``given``, their names) set
    :data:`OWN_SECURITY`. ``read_text`` reads a PEM file named by a ``*.location`` setting, to check
    that the Java client takes it. Raises :class:`ConnectorSecurityRefused` for what has no exact
    counterpart."""
    if any(name.strip().lower() == OWN_SECURITY for name in given):
        return {}
    protocol = properties.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        _refuse(f"security.protocol={protocol!r} is none of {', '.join(sorted(PROTOCOLS))}")
    if protocol == "PLAINTEXT":
        return {}
    unknown = sorted(
        name for name in properties if name.startswith(("sasl.", "ssl.")) and name not in TRANSLATED
    )
    if unknown:
        _refuse(f"{', '.join(unknown)} {'has' if len(unknown) == 1 else 'have'} no translation here")
    if properties.get("enable.ssl.certificate.verification", "true").strip().lower() == "false":
        _refuse("enable.ssl.certificate.verification=false has no counterpart in the Java client")
    options = {OWN_SECURITY: protocol}
    if protocol.startswith("SASL_"):
        options |= _sasl_options(properties)
    if protocol.endswith("SSL"):
        options |= _trust_options(properties, read_text)
        options |= _key_options(properties, read_text)
        options |= _endpoint_options(properties)
    return options


def jaas_config(mechanism: str, username: str, password: str) -> str:
    """The Java client's ``sasl.jaas.config`` for ``mechanism`` (PLAIN or SCRAM): its login module,
    ``required``, the user and the password quoted as Kafka's JAAS parser (Java's
    ``StreamTokenizer``) reads them back: a backslash, a quote, a line break escaped."""
    return f"{LOGIN_MODULES[mechanism]} required username={_quoted(username)} password={_quoted(password)};"


def _quoted(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


def _sasl_options(properties: Mapping[str, str]) -> dict[str, str]:
    named = properties.get("sasl.mechanism", properties.get("sasl.mechanisms"))
    mechanism = (named or "GSSAPI").strip().upper()
    setting = "sasl.mechanism" if named is not None else "sasl.mechanism (unset: librdkafka's default)"
    if mechanism == "GSSAPI":
        _refuse(
            f"{setting}=GSSAPI (Kerberos) needs a keytab and a JAAS login the Java client takes its own way"
        )
    if mechanism == "OAUTHBEARER":
        _refuse(f"{setting}=OAUTHBEARER needs a token provider the Java client configures its own way")
    if mechanism not in LOGIN_MODULES:
        _refuse(f"{setting}={mechanism!r} is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
    username, password = properties.get("sasl.username"), properties.get("sasl.password")
    if username is None or password is None:
        missing = " and ".join(
            n for n, v in (("sasl.username", username), ("sasl.password", password)) if v is None
        )
        _refuse(f"sasl.mechanism={mechanism} needs sasl.username and sasl.password; {missing} unset")
    return {
        "kafka.sasl.mechanism": mechanism,
        "kafka.sasl.jaas.config": jaas_config(mechanism, username, password),
    }


def _trust_options(properties: Mapping[str, str], read_text: Callable[[str], str]) -> dict[str, str]:
    """The CA the broker's certificate is checked against; none given: the JVM's own trusted CAs (as
    librdkafka then trusts the system's)."""
    location, pem = properties.get("ssl.ca.location"), properties.get("ssl.ca.pem")
    if location is not None and pem is not None:
        _refuse("ssl.ca.location and ssl.ca.pem are both set: give one")
    if pem is not None:
        if _CERTIFICATE not in pem:
            _refuse("ssl.ca.pem holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        return {"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.certificates": pem}
    if location is None:
        return {}
    if location.strip().lower() == "probe":
        _refuse(
            "ssl.ca.location=probe (librdkafka's search of the system's CA paths) has no Java counterpart"
        )
    if _CERTIFICATE not in _read(read_text, "ssl.ca.location", location):
        _refuse(f"ssl.ca.location={location} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    return {"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": location}


def _key_options(properties: Mapping[str, str], read_text: Callable[[str], str]) -> dict[str, str]:
    """The client's own certificate and key (mutual TLS): one PEM file, or a PKCS#12 keystore."""
    certificate, key = properties.get("ssl.certificate.location"), properties.get("ssl.key.location")
    keystore = properties.get("ssl.keystore.location")
    if keystore is not None:
        if certificate is not None or key is not None:
            _refuse(
                "ssl.keystore.location and ssl.certificate.location/ssl.key.location are both set: give one"
            )
        options = {"kafka.ssl.keystore.type": "PKCS12", "kafka.ssl.keystore.location": keystore}
        if "ssl.keystore.password" in properties:
            options["kafka.ssl.keystore.password"] = properties["ssl.keystore.password"]
        return options
    if certificate is None and key is None:
        if "ssl.key.password" in properties:
            _refuse("ssl.key.password is set without ssl.certificate.location and ssl.key.location")
        return {}
    if certificate is None or key is None:
        _refuse("mutual TLS needs both ssl.certificate.location and ssl.key.location")
    if certificate != key:
        _refuse(
            f"ssl.certificate.location={certificate} and ssl.key.location={key} are two files, and the Java "
            "client's PEM keystore takes one (or the key's text itself as an option, which cutline does not "
            "spread into a query's options): put both in one file (cat certificate.pem key.pem > "
            "client.pem, mode 0600) and name it in both settings"
        )
    _check_pem_keystore(_read(read_text, "ssl.key.location", key), key)
    options = {"kafka.ssl.keystore.type": "PEM", "kafka.ssl.keystore.location": key}
    if "ssl.key.password" in properties:
        options["kafka.ssl.key.password"] = properties["ssl.key.password"]
    return options


def _check_pem_keystore(text: str, location: str) -> None:
    if _CERTIFICATE not in text:
        _refuse(f"ssl.certificate.location={location} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    if not any(header in text for header in _PKCS8):
        _refuse(
            f"ssl.key.location={location} holds no PKCS#8 private key (-----BEGIN PRIVATE KEY----- or "
            "-----BEGIN ENCRYPTED PRIVATE KEY-----), the only kind the Java client's PEM keystore takes: "
            "convert it (openssl pkcs8 -topk8 -in key.pem -out key.pkcs8.pem, with -nocrypt to leave it "
            "unencrypted)"
        )


def _endpoint_options(properties: Mapping[str, str]) -> dict[str, str]:
    algorithm = properties.get("ssl.endpoint.identification.algorithm")
    if algorithm is None:
        return {}
    chosen = algorithm.strip().lower()
    if chosen not in ("none", "https"):
        _refuse(f"ssl.endpoint.identification.algorithm={algorithm!r} is neither none nor https")
    return {"kafka.ssl.endpoint.identification.algorithm": "" if chosen == "none" else "https"}


def _read(read_text: Callable[[str], str], setting: str, location: str) -> str:
    try:
        return read_text(location)
    except OSError as exc:
        _refuse(f"{setting}={location} cannot be read ({exc.strerror or type(exc).__name__})")


def _refuse(reason: str) -> NoReturn:
    raise ConnectorSecurityRefused(reason)
