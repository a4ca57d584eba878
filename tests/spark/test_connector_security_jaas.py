"""The connector's ``kafka.sasl.jaas.config`` (spark_tasks/connector_security.py, ``jaas_config``) read
back by Kafka's own JAAS parser, in the connector's ``kafka-clients`` jar: every user name and password
comes back as it was, whatever quotes, backslashes, line breaks or comment-like text it holds."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from spark_tasks.connector import kafka_connector, spark_jars_dir
from spark_tasks.connector_security import jaas_config

PARSE = """
import java.io.*;
import java.util.Map;
import org.apache.kafka.common.config.types.Password;
import org.apache.kafka.common.security.JaasContext;

public class Parse {
    public static void main(String[] args) throws Exception {
        var lines = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        var out = new PrintStream(System.out, true, "UTF-8");
        for (String line = lines.readLine(); line != null; line = lines.readLine()) {
            var context = JaasContext.loadClientContext(Map.of("sasl.jaas.config", new Password(line)));
            var entry = context.configurationEntries().get(0);
            out.print(entry.getLoginModuleName() + "\\u0000" + entry.getOptions().get("username") + "\\u0000"
                + entry.getOptions().get("password") + "\\u0001");
        }
    }
}
"""
"""Reads one ``sasl.jaas.config`` a line (a raw line break is always escaped in one) and prints its
login module, user name and password."""

CREDENTIALS = [
    ("spark", "token_urlsafe-_AZ09"),
    ('we"ird\\', 's3cr"et\\pw'),
    ("line\nbreak", "a\nb\rc\td"),
    ("ü ☃", "semi;colon }{ // not a comment /* nor this */ \\n"),
]


@pytest.mark.skipif(shutil.which("java") is None, reason="needs Java, as Spark does")
def test_kafka_s_jaas_parser_reads_back_every_user_and_password_as_given(tmp_path: Path) -> None:
    classpath = [*kafka_connector().jars, *spark_jars_dir().glob("slf4j-api-*.jar")]
    source = tmp_path / "Parse.java"
    source.write_text(PARSE)
    lines = [jaas_config(mechanism, user, password) for mechanism in ("PLAIN", "SCRAM-SHA-512")
             for user, password in CREDENTIALS]  # fmt: skip

    parsed = subprocess.run(
        ["java", "-cp", ":".join(map(str, classpath)), str(source)],
        input=("\n".join(lines) + "\n").encode(),
        capture_output=True,
        timeout=120,
    )  # fmt: skip  (bytes: text mode would turn a password's carriage return into a line feed)

    assert 0 == parsed.returncode, parsed.stderr.decode()
    entries = [tuple(entry.split("\0")) for entry in parsed.stdout.decode().split("\1") if entry]
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
    assert [(plain, u, p) for u, p in CREDENTIALS] + [(scram, u, p) for u, p in CREDENTIALS] == entries
