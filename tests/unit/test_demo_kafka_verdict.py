"""The demo's exactly-once line for its Kafka output (cutline_demo/demo.py, ``kafka_verdict``): what a
``read_committed`` consumer saw, judged against what was produced, on Apache Kafka and on Tansu."""

from __future__ import annotations

import dataclasses
from collections import Counter

from cutline_demo.demo import DemoResult, KafkaOutput, kafka_verdict

PRODUCED = Counter({"barrier": 3, "kafka": 2})


def result(
    counted: Counter[str], final: dict[str, int], *, tansu: bool, again: tuple[int, ...] = ()
) -> DemoResult:
    kafka = KafkaOutput("cutline.word-counts", counted, final, shows_aborted=tansu, committed_again=again)
    return DemoResult(
        produced=PRODUCED,
        counted=PRODUCED,
        final=dict(PRODUCED),
        completed=6,
        failed=1,
        restored_from=3,
        crashed=True,
        seconds=60.0,
        kafka=kafka,
    )


def test_every_word_once_on_apache_kafka_is_ok() -> None:
    # given: a read_committed consumer of Apache Kafka saw every word counted once
    # when
    held, line = kafka_verdict(result(Counter(PRODUCED), dict(PRODUCED), tansu=False))
    # then
    assert held is True
    assert line == (
        "exactly-once to Kafka: OK for a read_committed consumer, 5 words in cutline.word-counts = 5 produced"
    )


def test_every_word_once_on_tansu_is_ok_and_says_what_tansu_cannot_show() -> None:
    held, line = kafka_verdict(result(Counter(PRODUCED), dict(PRODUCED), tansu=True))
    assert held is True
    assert "OK as a read_committed consumer sees it" in line
    assert "on Tansu it would see aborted transactions too (--broker kafka hides them)" in line


def test_a_duplicate_on_apache_kafka_fails() -> None:
    # given: a checkpoint's rows committed twice (the counts of the second copy are the same)
    held, line = kafka_verdict(
        result(Counter({"barrier": 5, "kafka": 2}), dict(PRODUCED), tansu=False, again=(4,))
    )
    assert held is False
    assert line.startswith("exactly-once to Kafka: FAILED, 7 words")


def test_a_lost_word_fails_on_tansu_too() -> None:
    held, _ = kafka_verdict(
        result(Counter({"barrier": 3, "kafka": 1}), {"barrier": 3, "kafka": 1}, tansu=True, again=(4,))
    )
    assert held is False


def test_on_tansu_the_copies_of_an_aborted_commit_are_not_shown_either_way() -> None:
    # given: the crash fell in checkpoint 4's commit; its recovery committed it again, and Tansu
    # shows the aborted first try to read_committed consumers: more words, none lost, final counts right
    held, line = kafka_verdict(
        result(Counter({"barrier": 5, "kafka": 2}), dict(PRODUCED), tansu=True, again=(4,))
    )
    # then: neither OK nor FAILED
    assert held is None
    assert line.startswith("exactly-once to Kafka: not shown on Tansu")


def test_on_tansu_extra_words_without_a_commit_done_again_fail() -> None:
    # given: no crash in a commit, so no aborted transaction to explain the extra words
    held, _ = kafka_verdict(result(Counter({"barrier": 5, "kafka": 2}), dict(PRODUCED), tansu=True))
    assert held is False


def test_no_restore_fails_even_with_every_word_once() -> None:
    plain = result(Counter(PRODUCED), dict(PRODUCED), tansu=False)
    plain.restored_from = None
    assert kafka_verdict(plain)[0] is False


def test_on_the_connector_the_kafka_output_is_judged_as_on_cutline_kafka() -> None:
    # given: the job read with Spark's kafka connector and wrote its counts through the sink
    on_connector = dataclasses.replace(result(Counter(PRODUCED), dict(PRODUCED), tansu=False), source="kafka")
    duplicated = dataclasses.replace(
        result(PRODUCED + Counter({"kafka": 1}), {}, tansu=False), source="kafka"
    )
    # when / then: every word once holds, a duplicate fails, with the same lines
    assert kafka_verdict(on_connector) == kafka_verdict(
        result(Counter(PRODUCED), dict(PRODUCED), tansu=False)
    )
    assert kafka_verdict(duplicated)[0] is False


def test_no_kafka_output_on_the_connector_fails() -> None:
    held, line = kafka_verdict(
        dataclasses.replace(result(Counter(), {}, tansu=False), kafka=None, source="kafka")
    )
    assert held is False
    assert line == "exactly-once to Kafka: not checked"


def test_no_kafka_output_on_cutline_kafka_fails() -> None:
    held, line = kafka_verdict(dataclasses.replace(result(Counter(), {}, tansu=False), kafka=None))
    assert (False, "exactly-once to Kafka: not checked") == (held, line)
