"""Storage URIs and offsets keys at the coordinator's boundary (events.wire.validation)."""

from __future__ import annotations

import pytest

from events.wire.validation import (
    MAX_URI_LENGTH,
    InvalidUri,
    StorageUri,
    canonical_uri,
    is_within,
    parse_offsets_key,
    parse_uri,
)

LOCATION = "file:///data/checkpoints/job/chk-1"


class TestParseUri:
    @pytest.mark.parametrize(
        ("uri", "parsed"),
        [
            ("file:///data/ckpt", StorageUri("file", "", ("data", "ckpt"))),
            ("file:///data/ckpt/", StorageUri("file", "", ("data", "ckpt"))),
            ("file:///", StorageUri("file", "", ())),
            ("file:///a/my%20dir/x%3Ay", StorageUri("file", "", ("a", "my dir", "x:y"))),
            ("s3://bucket/a/b", StorageUri("s3", "bucket", ("a", "b"))),
            ("s3://bucket", StorageUri("s3", "bucket", ())),
            ("gs://b/k", StorageUri("gs", "b", ("k",))),
            ("abfs://c@a.dfs.core.windows.net/k", StorageUri("abfs", "c@a.dfs.core.windows.net", ("k",))),
            ("hdfs://namenode:8020/user/x", StorageUri("hdfs", "namenode:8020", ("user", "x"))),
            ("memory://store/x", StorageUri("memory", "store", ("x",))),
        ],
    )
    def test_accepted_forms(self, uri: str, parsed: StorageUri) -> None:
        """Given file:///abs/path or scheme://bucket/key, when parsed, then scheme, authority and decoded
        segments come out."""
        assert parsed == parse_uri(uri)

    @pytest.mark.parametrize(
        ("uri", "why"),
        [
            ("file://[x", "file:///absolute/path"),
            ("file:/data/ckpt", "file:///absolute/path"),
            ("file:data", "file:///absolute/path"),
            ("file://host/data", "file:///absolute/path"),
            ("file://localhost/data", "file:///absolute/path"),
            ("FILE:///data", "lower case"),
            ("File:///data", "lower case"),
            ("S3://bucket/k", "lower case"),
            ("/data/ckpt", "not a URI"),
            ("data/ckpt", "not a URI"),
            ("", "empty"),
            ("http://example.com/x", "unsupported scheme"),
            ("s3:///key", "needs a bucket"),
            ("s3:/bucket/key", "s3://bucket/key"),
            ("s3://bu%63ket/key", "needs a bucket"),
            ("file:///data/../etc", "'..' segment"),
            ("file:///data/./x", "'.' segment"),
            ("file:///data/%2e%2e/etc", "encodes '.'"),
            ("file:///data/%2E%2E/etc", "encodes '.'"),
            ("file:///data/.%2e/etc", "encodes '.'"),
            ("file:///data/a%2fb", "encodes '/'"),
            ("file:///data/a%5cb", "encodes '\\'"),
            ("file:///data/%252e%252e", "encodes '%'"),
            ("file:///data/a%00b", "control character"),
            ("file:///data/a%0ab", "control character"),
            ("file:///data/a\\..\\b", "contains"),
            ("file:///data/a\x00b", "contains"),
            ("file:///data/a?x=1", "contains"),
            ("file:///data/a#x", "contains"),
            ("file:///data/a%zz", "malformed percent escape"),
            ("file:///data/a%4", "malformed percent escape"),
            ("file:///data/%ff%fe", "not UTF-8"),
            ("file:///data//x", "empty path segment"),
            ("file:////data", "empty path segment"),
            ("file:///" + "a" * MAX_URI_LENGTH, "longer than"),
        ],
    )
    def test_refused_forms(self, uri: str, why: str) -> None:
        """Given any other spelling, when parsed, then InvalidUri says why."""
        with pytest.raises(InvalidUri) as refused:
            parse_uri(uri)

        assert why in str(refused.value)

    def test_invalid_uri_is_a_value_error(self) -> None:
        """Given a caller that catches ValueError, when a URI is refused, then it catches InvalidUri too."""
        assert issubclass(InvalidUri, ValueError)


class TestCanonicalUri:
    @pytest.mark.parametrize(
        ("uri", "canonical"),
        [
            ("file:///data/ckpt/", "file:///data/ckpt"),
            ("file:///data/%41b", "file:///data/Ab"),
            ("file:///data/my dir", "file:///data/my%20dir"),
            ("file:///data/my%20dir", "file:///data/my%20dir"),
            ("file:///data/words:0", "file:///data/words:0"),
            ("file:///", "file:///"),
            ("s3://bucket/", "s3://bucket"),
        ],
    )
    def test_one_spelling(self, uri: str, canonical: str) -> None:
        """Given equivalent spellings, when canonicalised, then they give one URI that parses the same."""
        assert canonical == canonical_uri(uri)
        assert parse_uri(uri) == parse_uri(canonical)


class TestIsWithin:
    @pytest.mark.parametrize(
        "uri",
        [f"{LOCATION}/task-0", f"{LOCATION}/a/b", f"{LOCATION}/task%2D0", f"{LOCATION}/x/"],
    )
    def test_below_the_location(self, uri: str) -> None:
        """Given a URI strictly below the location, when checked, then it is within."""
        assert is_within(uri, LOCATION)

    @pytest.mark.parametrize(
        "uri",
        [
            LOCATION,
            f"{LOCATION}/",
            "file:///data/checkpoints/job/chk-10/task-0",
            "file:///data/checkpoints/job/chk-1/../chk-2/t",
            "file:///data/checkpoints/job/chk-1/%2e%2e/chk-2/t",
            "file://[x",
            "FILE:///data/checkpoints/job/chk-1/t",
            "file:/data/checkpoints/job/chk-1/t",
            "file://host/data/checkpoints/job/chk-1/t",
            "s3://bucket/data/checkpoints/job/chk-1/t",
            "file:///etc/passwd",
        ],
    )
    def test_anything_else_is_not(self, uri: str) -> None:
        """Given the location itself, a sibling, another scheme or host, or an invalid URI, when checked,
        then it is not within."""
        assert not is_within(uri, LOCATION)

    def test_buckets_must_match(self) -> None:
        """Given object-store URIs, when checked, then only those of the location's bucket are within."""
        assert is_within("s3://b/ckpt/chk-1/t", "s3://b/ckpt/chk-1")
        assert not is_within("s3://other/ckpt/chk-1/t", "s3://b/ckpt/chk-1")
        assert not is_within("gs://b/ckpt/chk-1/t", "s3://b/ckpt/chk-1")

    def test_an_invalid_location_contains_nothing(self) -> None:
        """Given a location that does not parse, when anything is checked, then nothing is within it."""
        assert not is_within("file:///data/x/t", "file:/data/x")

    def test_within_a_root_not_strictly(self) -> None:
        """Given a root, when ``within(strict=False)`` checks the root itself, then it is accepted (how
        savepoint targets are checked)."""
        root = parse_uri("file:///savepoints")

        assert parse_uri("file:///savepoints/").within(root, strict=False)
        assert not parse_uri("file:///savepoints").within(root)


class TestParseOffsetsKey:
    @pytest.mark.parametrize(
        ("key", "parsed"),
        [("words:0", ("words", 0)), ("a:b:c:12", ("a:b:c", 12))],
    )
    def test_topic_before_the_last_colon(self, key: str, parsed: tuple[str, int]) -> None:
        """Given topic:partition, when parsed, then the topic is everything before the last colon."""
        assert parsed == parse_offsets_key(key)

    @pytest.mark.parametrize("key", ["t:²", "t:-1", "t:+1", "t: 1", "t:", ":1", "t", "", "t:1.0", "t:١"])
    def test_refused(self, key: str) -> None:
        """Given non-ASCII digits, a sign, an empty part or no colon, when parsed, then ValueError."""
        with pytest.raises(ValueError, match="offsets key"):
            parse_offsets_key(key)
