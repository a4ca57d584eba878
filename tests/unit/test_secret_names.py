"""One rule (events.kafka.client_config.is_secret) decides which client settings are secret, for every
name librdkafka, aiokafka and Faust accept; the lists and their reviewed verdicts are in
tests/client_properties/ (see generate.py there for where each list comes from)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from events.kafka.client_config import REDACTED, is_secret, redacted, redacted_value

LISTS = Path(__file__).parent.parent / "client_properties"
_spec = importlib.util.spec_from_file_location("client_properties_generate", LISTS / "generate.py")
assert _spec is not None and _spec.loader is not None
generate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate)


@pytest.mark.parametrize("file", sorted(generate.SOURCES))
def test_each_list_is_every_name_the_installed_library_accepts(file: str) -> None:
    """Given the installed library, its names are those of the committed list: a new name after an
    upgrade needs a verdict (run generate.py and review it)."""
    listed = generate.read(LISTS / file)

    assert sorted(listed) == generate.SOURCES[file]()
    assert [] == [name for name, verdict in listed.items() if verdict not in ("secret", "shown")]


@pytest.mark.parametrize("file", sorted(generate.SOURCES))
def test_is_secret_gives_every_listed_name_its_reviewed_verdict(file: str) -> None:
    listed = generate.read(LISTS / file)

    wrong = {name: verdict for name, verdict in listed.items() if is_secret(name) != (verdict == "secret")}

    assert {} == wrong


@pytest.mark.parametrize(
    "name",
    [
        "sasl.oauthbearer.assertion.private.key.passphrase", "ssl.key.pem", "ssl.keystore.password",
        "sasl.oauthbearer.client.secret", "ssl_password", "sasl_plain_password", "sasl_oauth_token_provider",
        "sasl.jaas.config", "SASL.PASSWORD", "ssl-key-password",
        # the Java client's and Schema Registry's: a PEM private key, a user:password pair
        "ssl.keystore.key", "basic.auth.user.info", "schema.registry.basic.auth.user.info",
    ],
)  # fmt: skip
def test_names_that_hold_secrets_are_secret(name: str) -> None:
    assert is_secret(name)


@pytest.mark.parametrize(
    "name",
    [
        "ssl.key.location", "sasl.oauthbearer.assertion.private.key.file", "sasl.username", "key_serializer",
        "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.client.credentials.client.id", "",
        "ssl.keystore.location", "ssl.keystore.certificate.chain", "ssl.keystore.type",
    ],
)  # fmt: skip
def test_names_that_point_at_or_name_things_are_shown(name: str) -> None:
    assert not is_secret(name)


def test_a_urls_password_is_redacted_whatever_the_name() -> None:
    """A URL (Faust's broker or cache, an endpoint) may carry user:password@: the password goes."""
    shown = redacted_value("sasl.oauthbearer.token.endpoint.url", "https://app:s3cr3t@idp.example/token")

    assert f"https://app:{REDACTED}@idp.example/token" == shown
    assert {"a.password": REDACTED, "b": 1} == redacted({"a.password": "x", "b": 1})


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://app:p@ss@idp.example/token", f"https://app:{REDACTED}@idp.example/token"),
        ("kafka://u:a@b@c@h1:9092", f"kafka://u:{REDACTED}@h1:9092"),
        ("https://me@example.com:s3cr3t@idp.example", f"https://me@example.com:{REDACTED}@idp.example"),
        ("kafka://u:p@1@h1,kafka://v:q@2@h2", f"kafka://u:{REDACTED}@h1,kafka://v:{REDACTED}@h2"),
        ("https://idp.example:8443/a@b", "https://idp.example:8443/a@b"),
        ("https://idp.example/x?to=a:b@c", "https://idp.example/x?to=a:b@c"),
    ],
)
def test_a_urls_password_is_redacted_up_to_the_last_at_of_its_authority(url: str, shown: str) -> None:
    """As urllib splits a URL: the authority ends at the first /, ? or #, the user information at its
    last @, the user at the first : of it. An @ in the password (unencoded) hides no part of it,
    and an @ after the authority is no password's."""
    assert shown == redacted_value("broker", url)
