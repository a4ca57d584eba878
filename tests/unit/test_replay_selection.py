"""Which events ``cutline replay`` takes (a job, a cut), and how it reads the journal for them."""

from __future__ import annotations

import pytest

from coordinator.replay.selection import Cut, JournalSource, Selection, journal_source
from events.wire.records import CheckpointKind, CheckpointTriggered


def triggered(job: str, timestamp_ms: int) -> CheckpointTriggered:
    return CheckpointTriggered(
        job, 1, 0, CheckpointKind.CHECKPOINT, timestamp_ms, "file:///ck", ("t0",), timestamp_ms + 1_000
    )


class TestSelection:
    def test_a_job_and_an_offset_cut(self) -> None:
        """Given --job a --until 10, event b's and those past offset 10 are left out."""
        selection = Selection(Cut(offset=10), "a")

        assert [True, False, False] == [
            selection.wanted(triggered("a", 0), 10),
            selection.wanted(triggered("a", 0), 11),
            selection.wanted(triggered("b", 0), 3),
        ]

    def test_a_time_cut_includes_the_events_at_that_time(self) -> None:
        selection = Selection(Cut(time_ms=5_000))

        assert selection.wanted(triggered("a", 5_000), 99)
        assert not selection.wanted(triggered("a", 5_001), 0)

    def test_a_cut_says_where_it_is(self) -> None:
        assert ["offset 7", "2026-11-22T10:00:00.000Z", "the end"] == [
            str(Cut(offset=7)),
            str(Cut(time_ms=1_795_341_600_000)),
            str(Cut()),
        ]


class TestJournalSource:
    @pytest.mark.parametrize(
        ("selection", "quiet", "plot", "expected"),
        [
            (Selection(Cut()), True, False, JournalSource.SPLIT),
            (Selection(Cut()), False, False, JournalSource.FILE),
            (Selection(Cut()), True, True, JournalSource.FILE),
            (Selection(Cut(offset=3)), True, False, JournalSource.FILE),
            (Selection(Cut(), "a"), True, False, JournalSource.ONE_JOB),
        ],
    )
    def test_a_file(self, selection: Selection, quiet: bool, plot: bool, expected: JournalSource) -> None:
        """Only a whole file, quiet and without a plot, is split by job; one job's replay reads
        only its records."""
        assert expected == journal_source(from_file=True, selection=selection, quiet=quiet, plot=plot)

    def test_the_topic_is_read_whole(self) -> None:
        source = journal_source(from_file=False, selection=Selection(Cut(), "a"), quiet=True, plot=False)

        assert JournalSource.TOPIC == source
