"""Fuzzing the coordinator's edge: whatever bytes arrive, ``Coordinator.handle`` answers.

Three kinds of input, each drawn by Hypothesis and bounded in time (a few
seconds per test): arbitrary bytes; valid frames cut, spliced or with flipped
bytes; and well-formed records whose fields are hostile (URIs with traversal
tricks, huge and negative numbers, odd offsets keys, ...). For every one of them
``handle`` returns (never raises) and yields journal events, or one dead letter,
or nothing at all for a harmless repeat; the coordinator's states stay what
folding its journal gives; and the decider itself never raises (no input reaches
the ``INTERNAL_ERROR`` guard).
"""

from __future__ import annotations

import posixpath
import random
from urllib.parse import unquote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.core.decider import fold_jobs
from coordinator.service.runtime import Coordinator, Outcome
from events.wire.codec import decode, encode
from events.wire.records import (
    CheckpointAcknowledged,
    CheckpointConfig,
    CheckpointDeclined,
    CheckpointKind,
    CheckpointRequested,
    DeadLetter,
    ExecutionState,
    JobStatus,
    JobStatusChanged,
    JournalEvent,
    Record,
    StateHandle,
    TaskStatusChanged,
)
from events.wire.topics import Topics
from events.wire.vocabulary import DeadLetterReason

TOPICS = Topics("fuzz.")
JOB = "job"
LOCATION = "file:///data/checkpoints"
CHECKPOINT = f"{LOCATION}/{JOB}/chk-1"

FUZZ = settings(
    max_examples=150,
    deadline=2000,  # ms per example: generous on a shared 2-core machine, still bounded
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)

INT = st.integers(-(2**31), 2**31 - 1)
LONG = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, -1, 2**62, 2**62 + 1, 2**63 - 1]))
HOSTILE_URIS = st.sampled_from(
    [
        "file://[x",
        f"{CHECKPOINT}/%2e%2e/%2e%2e/etc/passwd",
        f"{CHECKPOINT}/%252e%252e/x",
        f"{CHECKPOINT}/a%2fb",
        f"{CHECKPOINT}/a%00b",
        f"{CHECKPOINT}/a\\..\\..\\b",
        f"{CHECKPOINT}/../../x",
        f"{CHECKPOINT}/./t",
        f"{CHECKPOINT}//t",
        f"FILE://{CHECKPOINT[7:]}/t",
        f"file:{CHECKPOINT[7:]}/t",
        f"file://host{CHECKPOINT[7:]}/t",
        f"s3://bucket{CHECKPOINT[7:]}/t",
        "s3://",
        "s3:///k",
        "memory://x/%zz",
        "file:///" + "a/" * 3000,
        f"{CHECKPOINT}/t",
        f"{CHECKPOINT}/t%20x",
        "",
        "/data/checkpoints",
        "file:///data/savepoints",
        "file:///etc",
    ]
)
URIS = st.one_of(HOSTILE_URIS, st.text(max_size=80), HOSTILE_URIS.map(lambda u: u + "/x"))
NAMES = st.one_of(st.sampled_from([JOB, "t0", "t1", "..", "a/b", "", "%2e", "x" * 300]), st.text(max_size=20))
OFFSET_KEYS = st.one_of(
    st.sampled_from(["t:0", "t:²", "t:-1", "t:007", "t", ":1", "t:", f"t:{2**31}", "a:b:3", "t:١"]),
    st.text(max_size=12),
)


def started() -> Coordinator:
    """A coordinator with job ``job`` RUNNING (tasks t0, t1) and checkpoint 1 pending."""
    coordinator = Coordinator(TOPICS, rng=random.Random(0))
    status = JobStatusChanged(JOB, JobStatus.RUNNING, 0, 1, ("t0", "t1"), CheckpointConfig(100, LOCATION))
    coordinator.handle(TOPICS.job_status, 0, 0, JOB.encode(), encode(status), 0)
    coordinator.tick(JOB, 10_000)
    assert 1 in coordinator.states[JOB].pending
    return coordinator


def configs() -> st.SearchStrategy[CheckpointConfig]:
    return st.builds(
        CheckpointConfig,
        interval_ms=LONG,
        location=URIS,
        timeout_ms=LONG,
        min_pause_ms=LONG,
        max_concurrent=INT,
        tolerable_failures=INT,
        retained=INT,
    )


def mostly(value: object, other: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """``value`` three times in four, so that most inputs get past the first checks to the deep ones."""
    return st.one_of(st.just(value), st.just(value), st.just(value), other)


def records() -> st.SearchStrategy[tuple[str, Record]]:
    """(topic, record) with hostile field values, each record on the topic it belongs to."""
    jobs = mostly(JOB, NAMES)
    tasks = mostly("t0", st.one_of(st.just("t1"), NAMES))
    attempts = mostly(1, INT)
    ids = mostly(1, LONG)
    acks = st.builds(
        CheckpointAcknowledged,
        job_id=jobs,
        checkpoint_id=ids,
        attempt=attempts,
        task_id=tasks,
        timestamp_ms=LONG,
        state=st.one_of(
            st.none(), st.builds(StateHandle, uri=URIS, size_bytes=LONG, sha256=st.text(max_size=70))
        ),
        offsets=st.dictionaries(OFFSET_KEYS, LONG, max_size=5),
        metrics=st.dictionaries(st.text(max_size=5), LONG, max_size=3),
    )
    declines = st.builds(
        CheckpointDeclined,
        job_id=jobs,
        checkpoint_id=ids,
        attempt=attempts,
        task_id=tasks,
        timestamp_ms=LONG,
        reason=st.text(max_size=10),
        message=st.text(max_size=10),
    )
    requests = st.builds(
        CheckpointRequested,
        job_id=jobs,
        kind=st.sampled_from(CheckpointKind),
        timestamp_ms=LONG,
        request_id=st.text(max_size=10),
        target=st.one_of(st.none(), URIS),
    )
    statuses = st.builds(
        JobStatusChanged,
        job_id=jobs,
        status=st.sampled_from(JobStatus),
        timestamp_ms=LONG,
        attempt=attempts,
        tasks=mostly(("t0", "t1"), st.lists(NAMES, max_size=4).map(tuple)),
        config=st.one_of(st.none(), configs()),
        error=st.one_of(st.none(), st.text(max_size=10)),
        restored_checkpoint_id=st.one_of(st.none(), LONG),
        restored_location=st.one_of(st.none(), URIS),
    )
    task_statuses = st.builds(
        TaskStatusChanged,
        job_id=jobs,
        task_id=tasks,
        attempt=attempts,
        status=st.sampled_from(ExecutionState),
        timestamp_ms=LONG,
    )
    return st.one_of(
        acks.map(lambda r: (TOPICS.acks, r)),
        declines.map(lambda r: (TOPICS.declines, r)),
        requests.map(lambda r: (TOPICS.requests, r)),
        statuses.map(lambda r: (TOPICS.job_status, r)),
        task_statuses.map(lambda r: (TOPICS.job_status, r)),
    )


def answered(outcome: Outcome) -> bool:
    """Journal events (perhaps with barriers), or exactly one dead letter, or nothing (a no-op)."""
    topics = [m.topic for m in outcome.messages]
    if topics == [TOPICS.dead_letters]:
        return isinstance(decode(outcome.messages[0].value), DeadLetter) and not outcome.journal
    journal = [m for m in outcome.messages if m.topic == TOPICS.checkpoints]
    return len(journal) == len(outcome.journal) and set(topics) <= {TOPICS.checkpoints, TOPICS.barriers}


def reason(outcome: Outcome) -> str | None:
    if [m.topic for m in outcome.messages] != [TOPICS.dead_letters]:
        return None
    letter = decode(outcome.messages[0].value)
    assert isinstance(letter, DeadLetter)
    return letter.reason


class TestArbitraryBytes:
    @FUZZ
    @given(
        topic=st.sampled_from([*TOPICS.inputs, TOPICS.barriers, "elsewhere"]),
        key=st.one_of(st.none(), st.binary(max_size=20)),
        value=st.one_of(
            st.none(), st.binary(max_size=300), st.binary(max_size=40).map(lambda b: b"\xc3\x01" + b)
        ),
    )
    def test_bytes_never_raise_and_become_one_dead_letter(
        self, topic: str, key: bytes | None, value: bytes | None
    ) -> None:
        """Any key and value on any topic give exactly one dead letter and change no state."""
        coordinator = started()
        before = dict(coordinator.states)

        outcome = coordinator.handle(topic, 0, 1, key, value, 20_000)

        assert reason(outcome) is not None
        assert before == coordinator.states


class TestDamagedFrames:
    @FUZZ
    @given(
        data=records(),
        cut=st.integers(0, 400),
        flips=st.lists(st.tuples(st.integers(0, 400), st.integers(1, 255)), max_size=4),
        splice=st.binary(max_size=8),
    )
    def test_damaged_frames_are_answered(
        self, data: tuple[str, Record], cut: int, flips: list[tuple[int, int]], splice: bytes
    ) -> None:
        """A valid frame cut short, with bytes flipped or spliced in, is answered and never raises."""
        topic, record = data
        try:
            frame = bytearray(encode(record))
        except (ValueError, OverflowError, TypeError):
            return  # not encodable: no writer could have sent it
        for at, xor in flips:
            frame[at % len(frame)] ^= xor
        damaged = bytes(frame[:cut]) + splice + bytes(frame[cut:]) if splice else bytes(frame[: max(cut, 1)])
        coordinator = started()

        outcome = coordinator.handle(topic, 0, 1, JOB.encode(), damaged, 20_000)

        assert answered(outcome)
        assert DeadLetterReason.INTERNAL_ERROR != reason(outcome)


def suffixes() -> st.SearchStrategy[str]:
    """Path tails built from the pieces traversal tricks are made of."""
    pieces = st.sampled_from(
        [
            "t0",
            "..",
            ".",
            "%2e",
            "%2E",
            "%252e",
            "%2f",
            "%5c",
            "\\",
            "%00",
            "%",
            "%zz",
            "/",
            "//",
            "a",
            "%20",
            "?",
            "#",
        ]
    )
    return st.lists(pieces, max_size=6).map("".join)


class TestHostileStateHandles:
    @FUZZ
    @given(
        uri=st.one_of(URIS, suffixes().map(lambda tail: f"{CHECKPOINT}/{tail}"), suffixes()),
        offsets=st.dictionaries(OFFSET_KEYS, LONG, max_size=3),
    )
    def test_an_accepted_handle_never_leaves_the_location(self, uri: str, offsets: dict[str, int]) -> None:
        """An ack of the pending checkpoint is accepted only if its state URI, decoded any number of
        times and normalised, stays strictly below the checkpoint location; otherwise it is a dead
        letter; never an INTERNAL_ERROR."""
        coordinator = started()
        ack = CheckpointAcknowledged(JOB, 1, 1, "t0", 0, StateHandle(uri, 1, "0" * 64), offsets)
        try:
            value = encode(ack)
        except (ValueError, OverflowError, TypeError):
            return  # not encodable: no writer could have sent it

        outcome = coordinator.handle(TOPICS.acks, 0, 1, JOB.encode(), value, 20_000)

        assert answered(outcome)
        assert DeadLetterReason.INTERNAL_ERROR != reason(outcome)
        if outcome.journal:
            path = uri.removeprefix("file://")
            for _ in range(4):
                path = unquote(path)
            assert posixpath.normpath(path).startswith(CHECKPOINT.removeprefix("file://") + "/")
            assert "\\" not in path and "\x00" not in path


class TestHostileRecords:
    @FUZZ
    @given(inputs=st.lists(records(), min_size=1, max_size=8), times=st.lists(LONG.map(abs), max_size=3))
    def test_hostile_records_are_decided_and_the_journal_stays_the_truth(
        self, inputs: list[tuple[str, Record]], times: list[int]
    ) -> None:
        """Well-formed records with hostile fields never reach the INTERNAL_ERROR guard, every one is
        answered, and the states always equal the fold of the journal written so far."""
        coordinator = started()
        journal: list[JournalEvent] = list(fold_journal_of(coordinator))
        for offset, (topic, record) in enumerate(inputs, start=1):
            try:
                value = encode(record)
            except (ValueError, OverflowError, TypeError):
                continue  # not encodable: no writer could have sent it
            key = getattr(record, "job_id", JOB).encode("utf-8", "surrogatepass")
            outcome = coordinator.handle(topic, 0, offset, key, value, 20_000 + offset)
            assert answered(outcome)
            assert DeadLetterReason.INTERNAL_ERROR != reason(outcome), outcome
            journal += outcome.journal
        for now in times:
            for job_id in list(coordinator.states):
                outcome = coordinator.tick(job_id, min(now, 2**50))
                assert DeadLetterReason.INTERNAL_ERROR != reason(outcome), outcome
                journal += outcome.journal

        assert fold_jobs(journal) == coordinator.states
        for event in journal:
            assert event == decode(encode(event))


def fold_journal_of(coordinator: Coordinator) -> list[JournalEvent]:
    """The journal that ``started()`` wrote, rebuilt by deciding the same inputs again."""
    fresh = Coordinator(TOPICS, rng=random.Random(0))
    status = JobStatusChanged(JOB, JobStatus.RUNNING, 0, 1, ("t0", "t1"), CheckpointConfig(100, LOCATION))
    events = fresh.handle(TOPICS.job_status, 0, 0, JOB.encode(), encode(status), 0).journal
    events += fresh.tick(JOB, 10_000).journal
    assert fresh.states == coordinator.states
    return events
