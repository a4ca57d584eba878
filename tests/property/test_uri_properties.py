"""``parse_below`` is ``parse_uri`` (events/wire/validation.py): the shortcut for a state handle below its
checkpoint location gives the same answer, and the same refusal, for any string."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from events.wire.validation import MAX_URI_LENGTH, InvalidUri, StorageUri, parse_below, parse_uri

# Names as tasks write them, and the pieces hostile ones are made of: traversal, escapes, empty
# segments, forbidden and control characters, a trailing slash.
PIECES = st.sampled_from(
    [
        "task-0",
        "chk-7",
        "a",
        "x:y",
        "my dir",
        ".",
        "..",
        "",
        "%2e",
        "%2F",
        "%41",
        "%",
        "?",
        "#",
        "\\",
        "\x00",
        "é",
        "/",
        "//",
    ]
)
SUFFIXES = st.lists(PIECES, max_size=6).map("/".join) | st.text(max_size=40)
PARENTS = st.sampled_from(
    [
        "file:///data/checkpoints/job/chk-1",
        "file:///data/checkpoints/job/chk-1/",
        "file:///",
        "file:///a%41",
        "file://",
        "file:/data",
        "FILE:///data",
        "s3://bucket",
        "s3://bucket/state/job/chk-2",
        "hdfs://namenode:8020/x",
        "http://example.com/x",
        "",
    ]
)


def outcome(parse: object, *args: str) -> StorageUri | str:
    try:
        return parse(*args)  # type: ignore[operator, no-any-return]
    except InvalidUri as exc:
        return f"InvalidUri: {exc}"


@given(parent=PARENTS, separator=st.sampled_from(["/", "", "//"]), suffix=SUFFIXES)
@example(parent="file:///data/checkpoints/job/chk-1", separator="/", suffix="task-0")
@example(parent="file:///data/checkpoints/job/chk-1", separator="/", suffix="task-0/")
@example(parent="file:///data/checkpoints/job/chk-1", separator="/", suffix="../../etc/passwd")
@example(parent="file:///data/checkpoints/job/chk-1", separator="/", suffix="a" * MAX_URI_LENGTH)
@example(parent="s3://bucket", separator="/", suffix="key")
@example(parent="file://", separator="/", suffix="a")
def test_a_handle_parsed_below_its_location_is_parsed_as_parse_uri_parses_it(
    parent: str, separator: str, suffix: str
) -> None:
    """Given any location and any handle string made from it, when parsed below the location,
    then the result (or the refusal and its message) is parse_uri's."""
    uri = parent + separator + suffix

    assert outcome(parse_uri, uri) == outcome(parse_below, uri, parent)


@given(uri=st.text(max_size=60), parent=st.text(max_size=30))
def test_any_two_strings(uri: str, parent: str) -> None:
    """Given strings that need not be related at all, parse_below still answers as parse_uri."""
    assert outcome(parse_uri, uri) == outcome(parse_below, uri, parent)
