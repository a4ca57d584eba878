"""The tests' one polling helper: it returns what it awaited, and when it gives up it says what it
awaited and what it saw last."""

from __future__ import annotations

import itertools

import pytest
from support import eventually


def test_it_returns_the_first_value_that_passes() -> None:
    counter = itertools.count()

    assert 3 == eventually(lambda: next(counter), lambda n: n >= 3, interval=0)


def test_a_truthy_value_passes_without_a_predicate() -> None:
    values = iter([None, [], ["found"]])

    assert ["found"] == eventually(lambda: next(values), interval=0)


def test_an_assertion_counts_as_not_yet() -> None:
    attempts = itertools.count(1)

    def third_time_lucky() -> str:
        attempt = next(attempts)
        assert attempt >= 3, f"attempt {attempt}"
        return "done"

    assert "done" == eventually(third_time_lucky, interval=0)


def test_giving_up_names_what_was_awaited_and_the_last_value_seen() -> None:
    counter = itertools.count()

    with pytest.raises(AssertionError) as failure:
        eventually(
            lambda: next(counter), lambda n: n < 0, timeout=0.05, interval=0.01, what="a negative count"
        )

    message = str(failure.value)
    assert message.startswith("gave up after 0.05s waiting for a negative count; last seen: ")
    assert int(message.rsplit(" ", 1)[1]) >= 2  # it polled more than once


def test_giving_up_shows_the_last_assertion() -> None:
    def never() -> None:
        raise AssertionError("still 2 of 3 replies")

    with pytest.raises(AssertionError, match="waiting for never; last seen: AssertionError: still 2 of 3"):
        eventually(never, timeout=0.01, interval=0)


def test_other_errors_end_the_wait_at_once() -> None:
    calls = itertools.count(1)

    def broken() -> None:
        next(calls)
        raise KeyError("no such view")

    with pytest.raises(KeyError):
        eventually(broken, timeout=5)
    assert 2 == next(calls)  # called once
