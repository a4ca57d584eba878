"""What an app hears when its input topics (or partitions) do not exist
(``events.kafka.clients.topics_problem``, behind ``require_topics``)."""

from __future__ import annotations

from events.kafka.clients import topics_problem

BOOTSTRAP = "broker:9092"
EXISTING = {"words": 2, "cutline.checkpoints": 8}


def test_existing_topics_and_partitions_are_no_problem() -> None:
    assert topics_problem(BOOTSTRAP, ["words", "words:0", "words:1"], EXISTING) is None


def test_a_missing_topic_is_named_with_what_to_do() -> None:
    assert topics_problem(BOOTSTRAP, ["wrods:0"], EXISTING) == (
        "topic wrods does not exist at broker:9092: create it (cutline topics create creates only "
        "cutline's topics) or check the name"
    )


def test_a_missing_partition_says_how_many_the_topic_has() -> None:
    assert topics_problem(BOOTSTRAP, ["words:2"], EXISTING) == (
        "topic words has 2 partitions at broker:9092, no partition 2: check the partition, or add "
        "partitions to the topic"
    )


def test_every_problem_is_said_once() -> None:
    problem = topics_problem(BOOTSTRAP, ["a", "a", "b:0", "words:x"], EXISTING)

    assert problem is not None
    said = [" ".join(p.split()[:3]) for p in problem.split("; ")]
    assert ["topic a does", "topic b does", "topic words has"] == said
