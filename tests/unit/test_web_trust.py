"""What the web server trusts (coordinator/service/web_trust.py): only ``http(s)`` peer addresses become
links,
and only requests whose Host header names the coordinator are answered (DNS rebinding)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.service.web_trust import allowed_hosts, host_of, host_refusal, linkable


class TestLinkable:
    @pytest.mark.parametrize(
        "url",
        [
            "http://127.0.0.1:6066",
            "https://coordinator-1.example/",
            "HTTP://Coordinator:6066",
            "http://[::1]:6066",
        ],
    )
    def test_an_http_or_https_address_with_a_host_is_linked(self, url: str) -> None:
        assert linkable(url)

    @pytest.mark.parametrize(
        "url",
        [
            "javascript:alert(1)",
            "JavaScript:alert(document.cookie)//http://x",
            "java\tscript:alert(1)",
            "data:text/html,<script>alert(1)</script>",
            "file:///etc/passwd",
            "ftp://coordinator:21",
            "/jobs",
            "coordinator-1:6066",
            "//evil.example/jobs",
            "http:/jobs",
            "http://",
            "http://[::1",
            "http://coordinator:99999",
            "http://coordinator:port",
            "http://user:secret@coordinator:6066",
            "http://trusted.example@evil.example",
            " http://coordinator:6066",
            "http://coordinator:6066/\n<script>",
            "",
        ],
    )
    def test_anything_else_is_not(self, url: str) -> None:
        """Scripts, data, files, other schemes, relative, scheme-relative, host-less, malformed,
        with credentials or with white space: none becomes a link."""
        assert not linkable(url)

    @pytest.mark.parametrize("url", [None, 6066, b"http://coordinator:6066", ["http://x"]])
    def test_what_is_not_a_string_is_not(self, url: object) -> None:
        """A member's metadata is not trusted to hold strings."""
        assert not linkable(url)

    @given(st.tuples(st.sampled_from(["", "http://", "HTTPS://", "javascript:", "data:", "//"]), st.text()))
    def test_whatever_is_linked_starts_with_http_or_https(self, parts: tuple[str, str]) -> None:
        """No text is linked that a browser would run or open as anything but a web page."""
        url = "".join(parts)
        if linkable(url):
            assert url.lower().startswith(("http://", "https://"))


ALLOWED = allowed_hosts("coordinator-1", "0.0.0.0", ["dashboard.example"])


class TestAllowedHosts:
    def test_localhost_names_the_advertised_host_and_extras(self) -> None:
        """The default names, the advertised host and ``--web-allowed-host``; never the wildcard
        bind address."""
        assert {"localhost", "127.0.0.1", "::1", "coordinator-1", "dashboard.example"} == ALLOWED

    def test_a_bound_address_that_is_not_a_wildcard_is_allowed(self) -> None:
        assert "10.0.0.5" in allowed_hosts("coordinator-1", "10.0.0.5")

    def test_names_are_compared_in_lower_case_without_brackets_or_trailing_dot(self) -> None:
        assert {"localhost", "127.0.0.1", "::1", "coordinator.example"} == allowed_hosts(
            "Coordinator.Example.", "[::1]"
        )


class TestHostRefusal:
    @pytest.mark.parametrize(
        "header",
        [
            "127.0.0.1:6066",
            "localhost",
            "LOCALHOST:6066",
            "[::1]:6066",
            "coordinator-1:6066",
            "dashboard.example.",
        ],
    )
    def test_a_request_naming_the_coordinator_is_answered(self, header: str) -> None:
        assert host_refusal(header, ALLOWED) is None

    def test_another_name_is_refused_naming_the_setting_that_allows_it(self) -> None:
        """A rebound name (attacker.example resolving to 127.0.0.1) is refused, and the message says
        how to allow a name that is in fact the coordinator's."""
        refusal = host_refusal("attacker.example:6066", ALLOWED)

        assert refusal is not None
        assert "'attacker.example'" in refusal and "DNS rebinding" in refusal
        assert "cutline coordinator --web-allowed-host attacker.example" in refusal

    @pytest.mark.parametrize(
        "header",
        ["127.0.0.1:port", "[::1", "[::1]x", "::1", "127.0.0.1:6066:1", "a b", "evil/x", "u@localhost"],
    )
    def test_a_malformed_host_header_is_refused(self, header: str) -> None:
        refusal = host_refusal(header, ALLOWED)

        assert refusal is not None and "malformed" in refusal

    @pytest.mark.parametrize("header", [None, ""])
    def test_a_request_without_a_host_header_is_refused(self, header: str | None) -> None:
        refusal = host_refusal(header, ALLOWED)

        assert refusal is not None and "without a Host header" in refusal

    def test_a_long_header_is_quoted_only_in_part(self) -> None:
        refusal = host_refusal("a" * 10_000 + ":x", ALLOWED)

        assert refusal is not None and len(refusal) < 300


class TestHostOf:
    @pytest.mark.parametrize(
        ("header", "name"),
        [("Coordinator:6066", "coordinator"), ("[::1]", "::1"), ("[::1]:80", "::1"), ("host.", "host")],
    )
    def test_the_name_without_port_in_lower_case(self, header: str, name: str) -> None:
        assert name == host_of(header)
