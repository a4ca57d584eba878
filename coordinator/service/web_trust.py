"""What the coordinator's web server trusts: which addresses become links, which Host names it answers.

Pure (no web framework). Two guards, both about addresses that the coordinator does not choose:

- a member of the coordinator group advertises its web address in the group's metadata, which
  anyone who may join the group can write: only an ``http(s)`` address with a host is linked from
  the dashboard or asked for its views (``javascript:`` or ``data:`` never becomes a link);
- a page on another site can make a browser send requests to the coordinator under that site's
  own name by rebinding the name's DNS record to the coordinator's address (DNS rebinding): the
  web server answers only requests whose ``Host`` header names it (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

LINKED_SCHEMES = ("http", "https")
"""The only URL schemes of a peer's address that are linked or asked."""

LOCAL_HOST_NAMES = ("localhost", "127.0.0.1", "::1")
"""Names every coordinator answers to: a browser on its own machine."""

WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")
"""Bind addresses that mean "every interface": never a name a request may use (a browser may send
a request for 0.0.0.0 to the local machine)."""

ALLOWED_HOST_OPTION = "--web-allowed-host"
"""The ``cutline coordinator`` option that adds a name to the allowed Host names."""


def linkable(url: object) -> bool:
    """Is ``url`` an absolute ``http(s)`` URL with a host, no credentials, no control characters or
    white space? Only such a peer address is linked or asked."""
    if not isinstance(url, str) or not url or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number, or out of range, raises)
    except ValueError:
        return False
    return (
        parts.scheme in LINKED_SCHEMES
        and bool(parts.hostname)
        and parts.username is None
        and parts.password is None
    )


def host_name(name: str) -> str:
    """``name`` as Host names are compared: lower case, no IPv6 brackets, no trailing dot."""
    name = name.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name.rstrip(".")


def host_of(header: str) -> str | None:
    """The host name of a ``Host`` header (``name``, ``name:port``, ``[v6]`` or ``[v6]:port``) as
    :func:`host_name` gives it; None when the header is malformed."""
    if header.startswith("["):
        end = header.find("]")
        name, rest = header[1:end], header[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdecimal())):
            return None
    else:
        name, colon, port = header.partition(":")
        if colon and not port.isdecimal():
            return None
    name = host_name(name)
    if not name or any(c.isspace() or ord(c) < 32 or ord(c) == 127 or c in "/@\\" for c in name):
        return None
    return name


def allowed_hosts(advertised: str, bound: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host names a coordinator answers: localhost names, the host it advertises to its group,
    the address it listens on (unless a wildcard) and ``extra`` (``--web-allowed-host``)."""
    names = {*LOCAL_HOST_NAMES, advertised, *extra}
    if host_name(bound) not in WILDCARD_ADDRESSES:
        names.add(bound)
    return frozenset(host_name(n) for n in names if host_name(n) not in WILDCARD_ADDRESSES)


def host_refusal(header: str | None, allowed: frozenset[str]) -> str | None:
    """Why a request with this ``Host`` header is not answered; None when it is."""
    if not header:
        return "a request without a Host header is not answered (a guard against DNS rebinding)"
    shown = header if len(header) <= 100 else header[:100] + "..."
    name = host_of(header)
    if name is None:
        return f"the Host header {shown!r} is malformed"
    if name in allowed:
        return None
    return (
        f"this coordinator does not answer to the name {name!r} (a guard against DNS rebinding: "
        f"it answers to {', '.join(sorted(allowed))}). If {name!r} is a name of this coordinator, "
        f"allow it: cutline coordinator {ALLOWED_HOST_OPTION} {name}"
    )
