"""The one parser of offsets keys (topic:partition) shared by the Spark driver, tasks and participants."""

from __future__ import annotations

import pytest

from events.wire.validation import MAX_PARTITION, parse_offsets, parse_offsets_key


class TestParseOffsetsKey:
    @pytest.mark.parametrize(
        ("key", "expected"),
        [
            ("words:0", ("words", 0)),
            ("words:17", ("words", 17)),
            ("my.topic_v-2:3", ("my.topic_v-2", 3)),
            (f"t:{MAX_PARTITION}", ("t", MAX_PARTITION)),
            ("t:1:2", ("t:1", 2)),
            ("::0", (":", 0)),
        ],
    )
    def test_well_formed_keys(self, key: str, expected: tuple[str, int]) -> None:
        """A key splits at its last colon into a non-empty topic and a decimal partition."""
        assert expected == parse_offsets_key(key)

    @pytest.mark.parametrize(
        ("key", "problem"),
        [
            ("t:²", "ASCII digits"),  # str.isdigit() says yes, int() says no
            ("t:١", "ASCII digits"),  # an Arabic-Indic one: int() would even accept it
            ("t:-1", "ASCII digits"),
            ("t:+1", "ASCII digits"),
            ("t: 1", "ASCII digits"),
            ("t:1 ", "ASCII digits"),
            ("t:1.0", "ASCII digits"),
            ("t:0x1", "ASCII digits"),
            ("t:01", "leading zero"),
            (f"t:{MAX_PARTITION + 1}", "maximum"),
            ("t:", "partition is empty"),
            (":1", "topic is empty"),
            (":", "topic is empty"),
            ("t1", "no ':'"),
            ("", "no ':'"),
        ],
    )
    def test_malformed_keys(self, key: str, problem: str) -> None:
        """A malformed key raises ValueError naming the key and what is wrong with it."""
        with pytest.raises(ValueError, match=problem) as raised:
            parse_offsets_key(key)

        assert repr(key) in str(raised.value)


class TestParseOffsets:
    def test_a_map_of_offsets(self) -> None:
        """Every entry is parsed; the result is keyed by (topic, partition)."""
        assert {("a", 0): 5, ("b:c", 1): 0} == parse_offsets({"a:0": 5, "b:c:1": 0})

    @pytest.mark.parametrize("offset", [-1, True, 1.5, "3"])
    def test_offsets_must_be_non_negative_ints(self, offset: object) -> None:
        """A negative or non-int offset is refused like a malformed key."""
        with pytest.raises(ValueError, match="non-negative int"):
            parse_offsets({"a:0": offset})  # type: ignore[dict-item]

    def test_the_first_bad_key_fails_the_map(self) -> None:
        """One bad key is enough: the caller ignores the whole record."""
        with pytest.raises(ValueError, match="'t:²'"):
            parse_offsets({"a:0": 1, "t:²": 2})
