"""Every reader reads a record's epoch as :func:`events.wire.fencing.header_epoch` does
(docs/design.md, "Ownership and fencing"),
on arbitrary header lists: no header is epoch 0, one well-formed header its value, anything else
(two or more, empty, malformed) void."""

from __future__ import annotations

from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from coordinator.core.checks import stale_answer
from coordinator.replay.timeline import record_json
from events.kafka.clients import job_key
from events.kafka.feed import JobRecords
from events.kafka.log import fenced_journal, log_message
from events.wire.codec import default_codec, encode
from events.wire.fencing import MAX_EPOCH_DIGITS, VOID_EPOCH, HeaderValue, epoch_of, header_epoch
from events.wire.records import CheckpointAcknowledged, JobStatus, SchedulerStopped, StateHandle
from events.wire.vocabulary import EPOCH_HEADER

JOB = "job-1"
STOPPED = SchedulerStopped(JOB, 1, 0, JobStatus.CANCELED)
ACK = CheckpointAcknowledged(JOB, 1, 1, "a", 10_001, StateHandle("file:///c", 1, "00"), {}, {})

values = st.one_of(
    st.none(),
    st.integers(0, 10**20).map(lambda n: str(n).encode()),
    st.binary(max_size=24),
    st.text(max_size=8),
    st.sampled_from(["²", "٣", "３", "", " 1", "-1", "+2", "1" * 19]),
)
headers = st.lists(st.tuples(st.sampled_from([EPOCH_HEADER, "cutline.cause", "other"]), values), max_size=5)


def rule(pairs: list[tuple[str, HeaderValue]]) -> int | None:
    """The rule, written out again: what header_epoch must say."""
    found = [v for name, v in pairs if name == EPOCH_HEADER]
    if not found:
        return None
    if len(found) > 1 or found[0] is None:
        return VOID_EPOCH
    raw = found[0].encode("utf-8") if isinstance(found[0], str) else found[0]
    digits = all(48 <= b <= 57 for b in raw)
    return int(raw) if raw and digits and len(raw) <= MAX_EPOCH_DIGITS else VOID_EPOCH


def confluent(pairs: list[tuple[str, HeaderValue]], value: bytes, topic: str = "j") -> Message:
    encoded = [(n, v.encode("utf-8") if isinstance(v, str) else v) for n, v in pairs]
    return Message(
        topic=topic, partition=0, offset=5, key=job_key(JOB), value=value, headers=encoded or None,
        timestamp=(1, 0),
    )  # fmt: skip


@given(headers)
def test_header_epoch_is_the_rule(pairs: list[tuple[str, HeaderValue]]) -> None:
    """The one function says what the rule says, for a list and for aiokafka's tuple of pairs."""
    expected = rule(pairs)
    assert expected == header_epoch(pairs) == header_epoch(tuple(pairs))
    assert (0 if expected is None else expected) == epoch_of(pairs)


@given(headers)
def test_every_reader_agrees_with_header_epoch(pairs: list[tuple[str, HeaderValue]]) -> None:
    """The journal readers (via LogMessage), the job feed, the ack check and tail agree with it."""
    expected = epoch_of(pairs)
    void = expected == VOID_EPOCH

    # The coordinator's fold, replay and --verify: LogMessage headers through fenced_journal.
    message = log_message(confluent(pairs, encode(STOPPED)))
    assert expected == epoch_of(message.headers)
    kept = list(fenced_journal([message], lambda *_: None, on_void=lambda *_: None))
    assert void == (kept == [])

    # Participants, the shared feed and the Spark driver: JobRecords.admit.
    records = JobRecords(JOB, learning=True)
    admitted = records.admit(confluent(pairs, encode(STOPPED)))
    assert (None if void else expected) == (admitted.epoch if admitted is not None else None)

    # The coordinator's ack check (checkpoint 1 triggered in epoch 0, the worker deciding in 0).
    encoded = [(n, v.encode("utf-8") if isinstance(v, str) else v) for n, v in pairs]
    stale = stale_answer(ACK, encoded, 0, 0, None)
    assert void == (stale is not None and stale[0] == "VOID_EPOCH")

    # cutline tail --json.
    assert void == ("void" in record_json(default_codec(), "j", 0, 5, None, encode(STOPPED), encoded))
