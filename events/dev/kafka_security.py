"""A secured Apache Kafka for :class:`~events.dev.apache_kafka.ApacheKafka`: SASL_SSL with SCRAM-SHA-512.

:class:`SaslSsl` says who may log in (SCRAM users with random passwords, created when the storage
is formatted, so no broker ever runs without them) and makes what the broker needs: a CA and a
broker certificate for 127.0.0.1 and ``localhost`` (:func:`make_certificates`, with the JDK's
``keytool``, which is wherever Apache Kafka runs), the listeners, and Kafka's ``StandardAuthorizer``
with one super user (:data:`ADMIN`), the brokers' own principal. Every other principal may do only
what ACLs grant it (``allow.everyone.if.no.acl.found`` stays false), as in a production cluster.

The controllers talk SASL_PLAINTEXT with PLAIN among themselves (Kafka's controllers cannot read SCRAM
credentials before the metadata log holds them); clients and brokers use SASL_SSL with SCRAM.
Passwords never appear on a command line: the storage tool gets salted SCRAM credentials, clients get
them from :meth:`SaslSsl.client_properties` or a properties file of mode 0600
(:meth:`SaslSsl.properties_file`), as cutline's clients take them (``--kafka-config``,
``CUTLINE_KAFKA_CONFIG``: events/kafka/client_config.py).
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ADMIN",
    "MECHANISM",
    "Certificates",
    "SaslSsl",
    "keytool_binary",
    "make_certificates",
    "scram_credential",
]

MECHANISM = "SCRAM-SHA-512"
"""The SASL mechanism clients and brokers use."""

ADMIN = "admin"
"""The super user: the brokers' and controllers' own principal, and the one that creates ACLs."""

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"

SCRAM_ITERATIONS = 8192
"""Kafka's own default for SCRAM-SHA-512 credentials (``kafka-configs.sh --add-config``)."""

LISTENER = "SASL_SSL"
"""The name (and protocol) of the listener clients and brokers use."""

CONTROLLER = "CONTROLLER"


class SecurityError(RuntimeError):
    """A certificate or a key could not be made; says which command failed and why."""


def keytool_binary(java: str | None = None) -> str:
    """The JDK's ``keytool`` beside ``java`` (``$JAVA_HOME/bin``), else the one on the PATH."""
    if java is not None:
        beside = Path(java).resolve().parent / "keytool"
        if beside.is_file():
            return str(beside)
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "keytool").is_file():
        return str(Path(home) / "bin" / "keytool")
    found = shutil.which("keytool")
    if found is None:
        raise SecurityError(
            "a SASL_SSL broker needs the JDK's keytool, and none is on the PATH or in $JAVA_HOME"
        )
    return found


@dataclass(frozen=True)
class Certificates:
    """What :func:`make_certificates` made: the CA's certificate for clients (PEM), and the brokers'
    key and certificate chain (PKCS12) with its password."""

    ca_pem: Path
    keystore: Path
    keystore_password: str = field(repr=False)


def make_certificates(directory: Path, java: str | None = None, days: int = 7) -> Certificates:
    """A CA, and a broker certificate it signs for ``127.0.0.1`` and ``localhost`` (EC P-256), in
    ``directory`` (mode 0700). Clients trust ``ca.pem``; the brokers serve ``broker.p12``."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    keytool = keytool_binary(java)
    ca_store, broker_store = directory / "ca.p12", directory / "broker.p12"
    ca_pem, request, signed = directory / "ca.pem", directory / "broker.csr", directory / "broker.pem"
    ca_password, broker_password = secrets.token_urlsafe(18), secrets.token_urlsafe(18)
    key = ["-keyalg", "EC", "-groupname", "secp256r1", "-validity", str(days), "-storetype", "PKCS12"]
    ca = ["-keystore", str(ca_store), "-storepass:env", "CA_PASSWORD"]
    broker = ["-keystore", str(broker_store), "-storepass:env", "BROKER_PASSWORD"]
    steps = [
        ["-genkeypair", "-alias", "ca", *key, "-dname", "CN=cutline test CA", *ca,
         "-keypass:env", "CA_PASSWORD", "-ext", "bc:c=ca:true", "-ext", "ku:c=keyCertSign,cRLSign"],
        ["-exportcert", "-rfc", "-alias", "ca", *ca, "-file", str(ca_pem)],
        ["-genkeypair", "-alias", "broker", *key, "-dname", "CN=localhost", *broker,
         "-keypass:env", "BROKER_PASSWORD"],
        ["-certreq", "-alias", "broker", *broker, "-file", str(request)],
        ["-gencert", "-alias", "ca", *ca, "-infile", str(request), "-outfile", str(signed), "-rfc",
         "-validity", str(days), "-ext", "san=ip:127.0.0.1,dns:localhost", "-ext", "eku=serverAuth"],
        ["-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_pem), *broker],
        ["-importcert", "-alias", "broker", "-file", str(signed), *broker],
    ]  # fmt: skip
    environment = {**os.environ, "CA_PASSWORD": ca_password, "BROKER_PASSWORD": broker_password}
    for step in steps:
        done = subprocess.run(
            [keytool, *step], capture_output=True, text=True, env=environment, timeout=60, check=False
        )
        if done.returncode != 0:
            raise SecurityError(
                f"keytool {step[0]} failed (exit {done.returncode}): {done.stdout}{done.stderr}"
            )
    request.unlink()
    return Certificates(ca_pem, broker_store, broker_password)


def scram_credential(password: str, salt: bytes, iterations: int = SCRAM_ITERATIONS) -> str:
    """The storage tool's ``--add-scram`` value for a SCRAM-SHA-512 user, salted here so that the
    password itself is never on a command line: ``SaltedPassword := Hi(password, salt, i)`` of RFC
    5802, PBKDF2 with HMAC-SHA-512 (Kafka's ``ScramFormatter.saltedPassword``)."""
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    encoded = base64.b64encode(salt).decode(), base64.b64encode(salted).decode()
    return f'iterations={iterations},salt="{encoded[0]}",saltedpassword="{encoded[1]}"'


@dataclass(frozen=True)
class SaslSsl:
    """SASL_SSL listeners with SCRAM-SHA-512, the ``StandardAuthorizer``, and these users (name to
    password; :data:`ADMIN`, the super user, always among them). Make one with :meth:`with_users`."""

    users: Mapping[str, str] = field(repr=False)

    @classmethod
    def with_users(cls, names: Iterable[str]) -> SaslSsl:
        """:data:`ADMIN` and ``names``, each with a random password."""
        return cls({name: secrets.token_urlsafe(24) for name in (ADMIN, *names)})

    @property
    def admin_password(self) -> str:
        return self.users[ADMIN]

    def scram_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments that create every user's SCRAM credential."""
        arguments = []
        for name, password in self.users.items():
            credential = scram_credential(password, secrets.token_bytes(16))
            arguments += ["--add-scram", f"{MECHANISM}=[name={name},{credential}]"]
        return arguments

    def server_properties(
        self, host: str, port: int, controller_port: int, tls: Certificates
    ) -> dict[str, str]:
        """What a node's ``server.properties`` takes (over the plaintext test node's): one SASL_SSL
        listener for clients and brokers, a SASL_PLAINTEXT controller listener, the authorizer."""
        admin = f'username="{ADMIN}" password="{self.admin_password}"'
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
        plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
        return {
            "listeners": f"{LISTENER}://{host}:{port},{CONTROLLER}://{host}:{controller_port}",
            "advertised.listeners": f"{LISTENER}://{host}:{port}",
            "listener.security.protocol.map": f"{LISTENER}:SASL_SSL,{CONTROLLER}:SASL_PLAINTEXT",
            "inter.broker.listener.name": LISTENER,
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.{LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config": (
                f"{scram} required {admin};"
            ),
            "sasl.mechanism.controller.protocol": "PLAIN",
            f"listener.name.{CONTROLLER.lower()}.sasl.enabled.mechanisms": "PLAIN",
            f"listener.name.{CONTROLLER.lower()}.plain.sasl.jaas.config": (
                f'{plain} required {admin} user_{ADMIN}="{self.admin_password}";'
            ),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(tls.keystore),
            "ssl.keystore.password": tls.keystore_password,
            "ssl.key.password": tls.keystore_password,
            # brokers are each other's clients: they trust the CA (an entry of the same store)
            "ssl.truststore.type": "PKCS12",
            "ssl.truststore.location": str(tls.keystore),
            "ssl.truststore.password": tls.keystore_password,
            "ssl.client.auth": "none",
            "authorizer.class.name": AUTHORIZER,
            "super.users": f"User:{ADMIN}",
            "allow.everyone.if.no.acl.found": "false",
        }

    def client_properties(self, user: str, tls: Certificates) -> dict[str, str]:
        """librdkafka's properties for ``user`` (the names cutline's clients take: client_config.py)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.username": user,
            "sasl.password": self.users[user],
            "ssl.ca.location": str(tls.ca_pem),
        }

    def properties_file(self, user: str, tls: Certificates, path: Path) -> Path:
        """``user``'s :meth:`client_properties` in a properties file only its owner can read
        (``--kafka-config FILE``, ``CUTLINE_KAFKA_CONFIG``)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.writelines(
                f"{name}={value}\n" for name, value in self.client_properties(user, tls).items()
            )
        return path
