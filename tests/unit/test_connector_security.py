"""cutline's Kafka client settings (librdkafka's names) as Spark's kafka connector's ``kafka.*`` Java
client options (spark_tasks/connector_security.py): each mapping, and each refusal naming the setting,
saying what to do, and showing no secret."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from spark_tasks.connector_security import (
    ConnectorSecurityRefused,
    connector_security_options,
    jaas_config,
)

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
PKCS8 = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
PASSWORD = 's3cr"et\\pw'
"""A password with a quote and a backslash, which the JAAS line must escape."""

SCRAM_OVER_TLS = {
    "security.protocol": "sasl_ssl",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "spark",
    "sasl.password": PASSWORD,
    "ssl.ca.location": "/etc/kafka/ca.pem",
}


def files(contents: dict[str, str]) -> Callable[[str], str]:
    """A ``read_text`` that knows only ``contents`` (path to text); any other path is missing."""

    def read_text(path: str) -> str:
        if path not in contents:
            raise FileNotFoundError(2, "No such file or directory", path)
        return contents[path]

    return read_text


def translate(properties: dict[str, str], given: tuple[str, ...] = ()) -> dict[str, str]:
    return connector_security_options(
        properties,
        given=given,
        read_text=files({"/etc/kafka/ca.pem": CA, "/etc/kafka/client.pem": CA + PKCS8}),
    )


def refusal(properties: dict[str, str], read_text: Callable[[str], str] | None = None) -> str:
    """The message of the refusal of ``properties``; it never holds the password."""
    with pytest.raises(ConnectorSecurityRefused) as refused:
        connector_security_options(properties, read_text=read_text or files({"/etc/kafka/ca.pem": CA}))
    message = str(refused.value)
    assert PASSWORD not in message and "s3cr" not in message
    assert "--source cutline-kafka" in message and "kafka.security.protocol" in message
    return message


class TestNothingToTranslate:
    def test_a_plaintext_connection_gives_the_connector_no_option(self) -> None:
        """No settings, or PLAINTEXT in any case, need nothing from the connector."""
        assert {} == translate({})
        assert {} == translate({"security.protocol": "plaintext", "client.id": "x"})

    def test_the_job_s_own_security_protocol_option_takes_the_connector_s_security_over(self) -> None:
        """A job that sets ``kafka.security.protocol`` itself gets nothing translated, even for a
        setting that could not be (GSSAPI)."""
        kerberos = {"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}

        assert {} == translate(kerberos, given=("kafka.security.protocol",))


class TestSasl:
    def test_scram_over_tls_becomes_the_mechanism_a_scram_jaas_line_and_a_pem_truststore(self) -> None:
        assert {
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                'username="spark" password="s3cr\\"et\\\\pw";'
            ),
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": "/etc/kafka/ca.pem",
        } == translate(SCRAM_OVER_TLS)

    @pytest.mark.parametrize(
        ("mechanism", "module"),
        [
            ("PLAIN", "org.apache.kafka.common.security.plain.PlainLoginModule"),
            ("scram-sha-256", "org.apache.kafka.common.security.scram.ScramLoginModule"),
        ],
    )
    def test_plain_and_scram_256_get_their_login_module_under_either_mechanism_name(
        self, mechanism: str, module: str
    ) -> None:
        """librdkafka's ``sasl.mechanisms`` is the same setting as ``sasl.mechanism``."""
        options = translate(
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": mechanism, "sasl.username": "u",
             "sasl.password": "p"}
        )  # fmt: skip

        assert mechanism.upper() == options["kafka.sasl.mechanism"]
        assert f'{module} required username="u" password="p";' == options["kafka.sasl.jaas.config"]
        assert "kafka.ssl.truststore.type" not in options  # no TLS on SASL_PLAINTEXT

    def test_a_line_break_in_a_password_is_escaped_as_kafka_s_jaas_parser_reads_it(self) -> None:
        """Java's ``StreamTokenizer`` ends a quoted string at a raw line break, and reads ``\\n``."""
        assert 'username="a\\nb" password="c\\rd";' in jaas_config("PLAIN", "a\nb", "c\rd")

    @pytest.mark.parametrize(
        ("mechanism", "said"),
        [(None, "GSSAPI"), ("GSSAPI", "Kerberos"), ("OAUTHBEARER", "token provider"), ("NTLM", "not PLAIN")],
    )
    def test_other_mechanisms_are_refused_naming_the_setting(self, mechanism: str | None, said: str) -> None:
        """librdkafka's default mechanism is GSSAPI: leaving it out is refused too."""
        properties = {"security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password": PASSWORD}
        if mechanism is not None:
            properties["sasl.mechanism"] = mechanism

        message = refusal(properties)

        assert "sasl.mechanism" in message and said in message

    def test_a_mechanism_without_a_password_is_refused_naming_what_is_missing(self) -> None:
        message = refusal(
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "u"}
        )

        assert "sasl.password unset" in message


class TestTls:
    def test_a_ca_given_as_pem_text_becomes_the_truststore_s_certificates(self) -> None:
        assert {
            "kafka.security.protocol": "SSL",
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.certificates": CA,
        } == translate({"security.protocol": "SSL", "ssl.ca.pem": CA})

    def test_no_ca_leaves_the_jvm_s_trusted_cas(self) -> None:
        assert {"kafka.security.protocol": "SSL"} == translate({"security.protocol": "SSL"})

    @pytest.mark.parametrize(("librdkafka", "java"), [("none", ""), ("https", "https"), ("HTTPS", "https")])
    def test_endpoint_identification_none_is_java_s_empty_string(self, librdkafka: str, java: str) -> None:
        options = translate({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": librdkafka})

        assert java == options["kafka.ssl.endpoint.identification.algorithm"]

    def test_mutual_tls_from_one_pem_file_becomes_a_pem_keystore_with_the_key_s_password(self) -> None:
        options = translate(
            {"security.protocol": "SSL", "ssl.certificate.location": "/etc/kafka/client.pem",
             "ssl.key.location": "/etc/kafka/client.pem", "ssl.key.password": PASSWORD}
        )  # fmt: skip

        assert {
            "kafka.ssl.keystore.type": "PEM",
            "kafka.ssl.keystore.location": "/etc/kafka/client.pem",
            "kafka.ssl.key.password": PASSWORD,
        }.items() <= options.items()

    def test_a_pkcs12_keystore_stays_one_with_its_password(self) -> None:
        options = translate(
            {"security.protocol": "SSL", "ssl.keystore.location": "/k.p12", "ssl.keystore.password": PASSWORD}
        )

        assert {
            "kafka.ssl.keystore.type": "PKCS12",
            "kafka.ssl.keystore.location": "/k.p12",
            "kafka.ssl.keystore.password": PASSWORD,
        }.items() <= options.items()

    def test_a_certificate_and_a_key_in_two_files_are_refused_with_how_to_make_one(self) -> None:
        message = refusal(
            {"security.protocol": "SSL", "ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem"}
        )

        assert "cat certificate.pem key.pem > client.pem" in message

    @pytest.mark.parametrize("header", ["RSA PRIVATE KEY", "EC PRIVATE KEY"])
    def test_a_key_java_s_pem_keystore_cannot_read_is_refused_with_how_to_convert_it(
        self, header: str
    ) -> None:
        """librdkafka reads PKCS#1 and SEC1 keys; the Java client's PEM keystore only PKCS#8."""
        key = f"-----BEGIN {header}-----\nMIIE\n-----END {header}-----\n"
        message = refusal(
            {"security.protocol": "SSL", "ssl.certificate.location": "/c.pem", "ssl.key.location": "/c.pem"},
            files({"/c.pem": CA + key}),
        )

        assert "ssl.key.location=/c.pem holds no PKCS#8 private key" in message
        assert "openssl pkcs8 -topk8" in message

    def test_a_ca_file_that_cannot_be_read_is_refused_naming_it(self) -> None:
        message = refusal({"security.protocol": "SSL", "ssl.ca.location": "/nowhere/ca.pem"})

        assert "ssl.ca.location=/nowhere/ca.pem cannot be read (No such file or directory)" in message

    @pytest.mark.parametrize(
        ("properties", "said"),
        [
            ({"ssl.ca.location": "probe"}, "ssl.ca.location=probe"),
            ({"enable.ssl.certificate.verification": "false"}, "enable.ssl.certificate.verification=false"),
            ({"ssl.endpoint.identification.algorithm": "dns"}, "ssl.endpoint.identification.algorithm='dns'"),
            ({"ssl.key.pem": PKCS8}, "ssl.key.pem has no translation"),
            (
                {"ssl.cipher.suites": "x", "sasl.kerberos.keytab": "/k"},
                "sasl.kerberos.keytab, ssl.cipher.suites",
            ),
            (
                {"ssl.certificate.location": "/c.pem"},
                "needs both ssl.certificate.location and ssl.key.location",
            ),
        ],
    )
    def test_what_has_no_exact_java_counterpart_is_refused_naming_it(
        self, properties: dict[str, str], said: str
    ) -> None:
        assert said in refusal({"security.protocol": "SSL", **properties})

    def test_an_unknown_protocol_is_refused(self) -> None:
        assert "security.protocol='TLS'" in refusal({"security.protocol": "tls"})


def test_a_refused_secret_setting_shows_its_name_only() -> None:
    """An inline key (``ssl.key.pem``) or a password under an unknown name is refused by name."""
    message = refusal({"security.protocol": "SSL", "ssl.keystore.secret": PASSWORD})

    assert "ssl.keystore.secret has no translation" in message
