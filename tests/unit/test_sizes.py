"""Sizes (docs/design.md, "Record sizes"): no record over its topic's max.message.bytes, an oversize input
refused
without changing state, a completion too large for one record kept in its metadata object."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from coordinator.core.admission import (
    DEAD_LETTER_ROOM,
    MAX_DEAD_LETTER_MESSAGE,
    TRIGGER_HEADROOM,
    journal_budget,
    preview,
)
from coordinator.core.commands import ChangeJobStatus, Tick
from coordinator.core.decider import fold_jobs
from coordinator.service.ports import StoredMetadata
from coordinator.service.runtime import Coordinator, Outcome
from events.task.completion_metadata import resolve_completion
from events.wire.codec import decode, encode
from events.wire.metadata import MetadataUnavailable, by_reference
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointKind,
    DeadLetter,
    JobStatus,
    JobStatusChanged,
    JournalEvent,
)
from events.wire.sizes import DEFAULT_MAX_MESSAGE_BYTES, RECORD_OVERHEAD, TopicLimits, bounded, record_size
from events.wire.topics import Topics

TOPICS = Topics("s.")
JOB = "job"
LIMIT = 20_000
"""A small journal and dead-letter limit, so that the tests stay small."""


def _status(tasks: tuple[str, ...], location: str) -> JobStatusChanged:
    return JobStatusChanged(JOB, JobStatus.RUNNING, 0, 1, tasks, CheckpointConfig(100, location))


def _records(outcome: Outcome) -> list[object]:
    return [decode(m.value) for m in outcome.messages]


class TestSizeRules:
    def test_a_record_costs_its_bytes_and_a_batch_of_one(self) -> None:
        """Key, value and headers count, plus the fixed overhead of a batch of one."""
        assert RECORD_OVERHEAD + 3 + 5 + len("h") + 2 + 10 == record_size(b"key", b"value", [("h", b"xy")])

    def test_a_topic_without_a_reported_limit_has_kafkas_default(self) -> None:
        limits = TopicLimits({"a": 10_000})

        assert (10_000, DEFAULT_MAX_MESSAGE_BYTES) == (limits.of("a"), limits.of("b"))
        assert limits.over("a", b"k", b"x" * 10_000) is not None
        assert limits.over("a", b"k", b"x" * 100) is None

    def test_a_running_status_leaves_room_for_its_triggers(self) -> None:
        """A RUNNING status's records must fit with room for the triggers that repeat its task list."""
        status = ChangeJobStatus(_status(("a",), "file:///c"), 0)

        assert LIMIT - TRIGGER_HEADROOM == journal_budget(status, LIMIT)
        assert LIMIT == journal_budget(Tick(JOB, 0), LIMIT)

    def test_a_preview_fits_its_topic_and_says_what_was_cut(self) -> None:
        """A 600 KB quote in the message, a large key and value: each is cut, and the letter fits."""
        kept = preview(
            "unknown task " + "t" * 600_000, b"k" * 100_000, b"v" * 900_000, "j" * 5_000, LIMIT, 512 * 1024
        )

        assert len(kept.message) < MAX_DEAD_LETTER_MESSAGE + 400
        assert "cut" in kept.message and kept.key is not None and kept.value is not None
        used = (
            len(kept.message.encode())
            + 2 * len(kept.key)
            + len(kept.value)
            + len((kept.job_id or "").encode())
        )
        assert used + DEAD_LETTER_ROOM <= LIMIT
        assert kept.value  # some of the value is kept to look at

    def test_a_small_preview_is_kept_whole(self) -> None:
        assert ("m", b"k", b"v", "j") == tuple(vars_of(preview("m", b"k", b"v", "j", LIMIT, 512 * 1024)))

    def test_a_log_line_quotes_a_bounded_part(self) -> None:
        assert 1_100 > len(bounded("x" * 600_000)) and bounded("short") == "short"


def vars_of(kept: object) -> list[object]:
    return [getattr(kept, name) for name in ("message", "key", "value", "job_id")]


@pytest.fixture(name="location")
def _location(tmp_path: Path) -> str:
    return tmp_path.as_uri()


def _coordinator(journal_limit: int = LIMIT) -> Coordinator:
    limits = TopicLimits({TOPICS.checkpoints: journal_limit, TOPICS.dead_letters: LIMIT}, default=LIMIT)
    return Coordinator(TOPICS, rng=random.Random(1), partitions=1, limits=limits)


def _ack(task: str, offsets: dict[str, int], checkpoint_id: int = 1) -> bytes:
    return encode(CheckpointAcknowledged(JOB, checkpoint_id, 1, task, 0, None, offsets, {}))


class TestOversizeInput:
    def test_an_ack_whose_record_would_not_fit_is_refused_and_changes_nothing(self, location: str) -> None:
        """Given a pending checkpoint, when an ack's TaskAcknowledged would exceed the journal's limit,
        then it is a RECORD_TOO_LARGE dead letter, bounded, and the job's state is as it was."""
        coordinator = _coordinator()
        coordinator.handle(TOPICS.job_status, 0, 0, JOB.encode(), encode(_status(("a", "b"), location)), 0)
        coordinator.tick(JOB, 10_000)
        before = coordinator.states[JOB]
        huge = {f"topic-{i:06d}:0": i for i in range(2_000)}  # about 30 KB of offsets

        outcome = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), _ack("a", huge), 10_001)

        (letter,) = _records(outcome)
        assert isinstance(letter, DeadLetter) and "RECORD_TOO_LARGE" == letter.reason
        assert all(len(m.value) <= LIMIT for m in outcome.messages)
        assert before is coordinator.states[JOB]

    def test_a_running_status_whose_task_list_would_not_fit_is_refused(self, location: str) -> None:
        coordinator = _coordinator()
        tasks = tuple(f"task-{i:05d}" for i in range(1_700))  # ~19 KB: fits the input, not the headroom

        outcome = coordinator.handle(
            TOPICS.job_status, 0, 0, JOB.encode(), encode(_status(tasks, location)), 0
        )

        (letter,) = _records(outcome)
        assert isinstance(letter, DeadLetter) and "RECORD_TOO_LARGE" == letter.reason
        assert JOB not in coordinator.states

    def test_an_unknown_600_kb_task_id_is_a_bounded_dead_letter(self, location: str) -> None:
        """The reason quotes the task id: the letter is cut to the dead-letter topic's limit."""
        coordinator = _coordinator()
        coordinator.handle(TOPICS.job_status, 0, 0, JOB.encode(), encode(_status(("a",), location)), 0)
        coordinator.tick(JOB, 10_000)

        outcome = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), _ack("x" * 600_000, {}), 10_001)

        (message,) = outcome.messages
        letter = decode(message.value)
        assert isinstance(letter, DeadLetter) and "UNKNOWN_TASK" == letter.reason
        assert record_size(message.key, message.value, message.headers) <= LIMIT
        assert "cut" in letter.message


class TestCompletionByReference:
    def _complete(self, location: str, tasks: int = 40) -> tuple[Coordinator, list[JournalEvent]]:
        coordinator = _coordinator()
        names = tuple(f"t{i}" for i in range(tasks))
        journal: list[JournalEvent] = []
        outcome = coordinator.handle(
            TOPICS.job_status, 0, 0, JOB.encode(), encode(_status(names, location)), 0
        )
        journal += outcome.journal
        journal += coordinator.tick(JOB, 10_000).journal
        for i, task in enumerate(names):  # each ack ~1 KB of offsets: the completion ~40 KB
            offsets = {f"topic-{task}-{p:03d}:0": p for p in range(40)}
            outcome = coordinator.handle(TOPICS.acks, 0, i + 1, JOB.encode(), _ack(task, offsets), 10_001)
            assert outcome.rejected is None and not any(isinstance(r, DeadLetter) for r in _records(outcome))
            for written in outcome.metadata:  # as the worker does, before the journal records
                StoredMetadata().write(written.uri, written.frame)
            journal += outcome.journal
        return coordinator, journal

    def test_a_completion_too_large_for_the_journal_is_journaled_by_reference(self, location: str) -> None:
        """Given 40 tasks whose offsets make a 40 KB completion under a 20 KB journal, when the last
        ack comes, then the completion's handles and offsets are in <location>/_metadata and the
        journal carries its uri, size and sha256; every record fits."""
        coordinator, journal = self._complete(location)

        completed = journal[-1]
        assert isinstance(completed, CheckpointCompleted) and completed.metadata is not None
        assert ({}, {}) == (dict(completed.handles), dict(completed.offsets))
        assert completed.metadata.uri == f"{completed.location}/_metadata"
        assert len(encode(completed)) < LIMIT
        full = resolve_completion(completed)
        assert 40 * 40 == len(full.offsets) and full.metadata is None
        assert full.size_bytes == completed.size_bytes

    def test_the_fold_of_the_journal_is_the_live_state(self, location: str) -> None:
        """The live state holds the completion as journaled (the reference), as replay does."""
        coordinator, journal = self._complete(location)

        assert fold_jobs(journal)[JOB] == coordinator.states[JOB]
        assert coordinator.states[JOB].latest_completed == journal[-1]

    def test_a_metadata_object_that_is_not_the_one_journaled_is_refused(
        self, location: str, tmp_path: Path
    ) -> None:
        _, journal = self._complete(location)
        completed = journal[-1]
        assert isinstance(completed, CheckpointCompleted) and completed.metadata is not None
        (tmp_path / "job" / "chk-1" / "_metadata").write_bytes(b"\xc3\x01garbage")

        with pytest.raises(MetadataUnavailable, match="not the one journaled"):
            resolve_completion(completed)

    def test_a_completion_that_fits_stays_inline(self, location: str) -> None:
        coordinator, journal = self._complete(location, tasks=2)

        completed = journal[-1]
        assert isinstance(completed, CheckpointCompleted) and completed.metadata is None
        assert 80 == len(completed.offsets)

    def test_by_reference_names_the_frame(self) -> None:
        completed = CheckpointCompleted(
            JOB, 7, CheckpointKind.CHECKPOINT, 1, 1, {}, 0, {"t:0": 1}, 1, "file:///c/j/chk-7"
        )
        frame = encode(completed)

        journaled = by_reference(completed, frame)

        assert journaled.metadata is not None
        assert (len(frame), hashlib.sha256(frame).hexdigest()) == (
            journaled.metadata.size_bytes,
            journaled.metadata.sha256,
        )
        assert "file:///c/j/chk-7/_metadata" == journaled.metadata.uri


def test_an_excerpt_is_one_bounded_line_that_says_how_long_the_field_was() -> None:
    """A 500 KB field with a newline is quoted as at most 200 characters on one line; a short one
    as it is."""
    from events.wire.sizes import excerpt

    huge = excerpt("a\nb" + "x" * 500_000)

    assert "task-0" == excerpt("task-0")
    assert 1 == len(huge.splitlines())
    assert huge.endswith("(500003 characters)")
    assert len(huge) < 250
