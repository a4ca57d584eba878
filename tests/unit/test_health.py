"""A worker's readiness and its broker's health: what ``/ready`` and the dashboard's banner say."""

from __future__ import annotations

import logging

import pytest

from coordinator.service.broker_probe import BrokerProbe
from coordinator.service.health import (
    FAILURES_BEFORE_UNREACHABLE,
    BrokerHealth,
    Readiness,
    broker_json,
    metadata_error,
    probed,
    readiness,
)

BROKER = "127.0.0.1:9092"
DOWN = "Failed to get metadata: Local: Broker transport failure"


def after(*probes: tuple[int, str | None]) -> BrokerHealth:
    """The health after probes at the given times, each answered (None) or failed (its error)."""
    health = BrokerHealth()
    for at, error in probes:
        health = probed(health, at, error)
    return health


def ready(
    health: BrokerHealth, *, pending: bool = False, phases: dict[int, str] | None = None, now: int = 0
) -> Readiness:
    return readiness(health, BROKER, now, assignment_pending=pending, phases=phases or {0: "DECIDING"})


class TestBrokerHealth:
    def test_nothing_is_known_before_the_first_probe(self) -> None:
        assert BrokerHealth() == after()
        assert ready(BrokerHealth()).ready

    def test_an_answered_probe_makes_the_broker_reachable_since_then(self) -> None:
        health = after((1000, None), (2000, None))

        assert (True, 1000, 2000, None) == (
            health.reachable,
            health.since_ms,
            health.last_reached_ms,
            health.error,
        )

    def test_one_failed_probe_is_not_an_outage(self) -> None:
        """A single probe that timed out on a busy machine changes nothing but the error shown."""
        health = after((1000, None), (2000, DOWN))

        assert (True, 1000, DOWN, 1) == (health.reachable, health.since_ms, health.error, health.failures)

    def test_failed_probes_in_a_row_make_it_unreachable_since_the_verdict(self) -> None:
        probes = [(1000, None), *((1000 * (2 + i), DOWN) for i in range(FAILURES_BEFORE_UNREACHABLE + 2))]
        health = after(*probes)

        verdict_at = 1000 * (1 + FAILURES_BEFORE_UNREACHABLE)
        assert (False, verdict_at, 1000, DOWN) == (
            health.reachable,
            health.since_ms,
            health.last_reached_ms,
            health.error,
        )

    def test_an_answer_after_an_outage_makes_it_reachable_again(self) -> None:
        health = after((1000, DOWN), (2000, DOWN), (3000, DOWN), (4000, None))

        assert (True, 4000, 4000, None, 0) == (
            health.reachable,
            health.since_ms,
            health.last_reached_ms,
            health.error,
            health.failures,
        )

    def test_a_broker_never_reached_is_unreachable_too(self) -> None:
        health = after((1000, DOWN), (2000, DOWN))

        assert (False, 2000, None) == (health.reachable, health.since_ms, health.last_reached_ms)

    def test_the_json_names_the_broker_and_the_error(self) -> None:
        body = broker_json(after((1000, DOWN), (2000, DOWN)), BROKER)

        assert {
            "bootstrap": BROKER,
            "reachable": False,
            "since": 2000,
            "last_reached": None,
            "error": DOWN,
            "failed_probes": 2,
        } == body


class TestReadiness:
    def test_ready_when_the_broker_answers_and_every_partition_is_decided(self) -> None:
        verdict = ready(after((1000, None)), phases={0: "DECIDING", 1: "DECIDING"})

        assert (True, ()) == (verdict.ready, verdict.problems)

    def test_an_unreachable_broker_makes_a_recovered_worker_unready_and_says_since_when(self) -> None:
        verdict = ready(after((1000, None), (2000, DOWN), (3000, DOWN)), now=15_000)

        assert not verdict.ready
        (problem,) = verdict.problems
        assert problem.startswith(f"the broker at {BROKER} is unreachable (for 12 s: {DOWN})")

    def test_a_worker_waiting_for_its_assignment_is_not_ready(self) -> None:
        verdict = ready(after((1000, None)), pending=True, phases={})

        assert not verdict.ready
        assert ["waiting for the group to assign journal partitions"] == [
            p.split(" (")[0] for p in verdict.problems
        ]

    def test_a_worker_still_recovering_a_partition_is_not_ready_and_names_it(self) -> None:
        verdict = ready(after((1000, None)), phases={0: "DECIDING", 1: "RECOVERING", 2: "STEPPED_DOWN"})

        assert not verdict.ready
        assert (
            "not recovered yet: journal partitions 1 (RECOVERING), 2 (STEPPED_DOWN) are not decided here",
        ) == verdict.problems

    def test_a_partition_that_is_not_decided_says_why(self) -> None:
        """Issue 52: a partition that cannot be decided says why, never silently."""
        why = {1: "recovering: reading its snapshot and the journal after it; the last try: timed out"}
        verdict = readiness(
            after((1000, None)), BROKER, 0, assignment_pending=False, phases={1: "RECOVERING"}, why=why
        )

        assert (
            "not recovered yet: journal partitions 1 (RECOVERING: recovering: reading its snapshot and the "
            "journal after it; the last try: timed out) are not decided here",
        ) == verdict.problems

    def test_every_problem_is_listed(self) -> None:
        verdict = ready(after((1, DOWN), (2, DOWN)), pending=True, phases={3: "CLAIMING"})

        assert 3 == len(verdict.problems)


class TestProbe:
    def test_the_probe_folds_each_answer_and_logs_only_the_changes(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        answers = iter([None, DOWN, DOWN, DOWN, None, None])
        clock = iter(range(1000, 100_000, 1000))
        probe = BrokerProbe(BROKER, lambda: next(answers), clock=lambda: next(clock))

        with caplog.at_level(logging.INFO, logger="cutline.coordinator"):
            seen = [probe.probe().reachable for _ in range(6)]

        assert [True, True, False, False, True, True] == seen
        messages = [r.getMessage() for r in caplog.records]
        assert 2 == len(messages), messages
        assert f"the broker at {BROKER} is unreachable" in messages[0]
        assert "/ready answers 503" in messages[0]
        assert f"the broker at {BROKER} answers again" in messages[1]

    def test_a_probe_that_raises_counts_as_failed(self) -> None:
        def broken() -> str | None:
            raise RuntimeError("no client")

        probe = BrokerProbe(BROKER, broken, clock=lambda: 5)
        for _ in range(FAILURES_BEFORE_UNREACHABLE):
            probe.probe()

        assert (False, "RuntimeError: no client") == (probe.health.reachable, probe.health.error)


class TestAFreshBrokerOnTheSameAddress:
    """A broker that answers is not enough: it must be the cluster whose journal the worker read."""

    def test_the_cluster_the_worker_started_on_with_its_journal_is_fine(self) -> None:
        assert (
            metadata_error("p.checkpoints", BROKER, journal_found=True, first_cluster="a", cluster="a")
            is None
        )

    def test_another_cluster_id_is_named_with_what_to_do_even_when_it_has_a_journal(self) -> None:
        # given: a fresh broker where one of the worker's own clients auto-created the journal again
        error = metadata_error("p.checkpoints", BROKER, journal_found=True, first_cluster="a", cluster="b")
        # then: the cluster ids, the journal and both ways out are named
        assert error is not None
        for named in ("cluster id b", "started on a", "p.checkpoints", "`cutline topics create`", "restart"):
            assert named in error, named

    def test_a_missing_journal_is_named_before_any_cluster_was_seen(self) -> None:
        error = metadata_error("p.checkpoints", BROKER, journal_found=False, first_cluster=None, cluster="a")
        assert error is not None and "no journal topic p.checkpoints" in error

    def test_a_broker_that_tells_no_cluster_id_is_judged_by_its_journal_alone(self) -> None:
        assert (
            metadata_error("p.checkpoints", BROKER, journal_found=True, first_cluster="a", cluster=None)
            is None
        )
