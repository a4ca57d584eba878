"""The journal keeps every record (docs/design.md, "Ownership and fencing"): the coordinator refuses a
journal topic that
deletes old records or compacts them, and says how to fix it (a topic config, no broker)."""

from __future__ import annotations

import pytest

from coordinator.service.app import JournalRetentionError, Settings, check_journal_retention
from coordinator.service.doctor import CheckStatus, check_retention

SETTINGS = Settings("broker:9092", "t.")


def refusal(config: dict[str, str]) -> str:
    with pytest.raises(JournalRetentionError) as failure:
        check_journal_retention(SETTINGS, config)
    return str(failure.value)


class TestCheckJournalRetention:
    @pytest.mark.parametrize(
        "config",
        [
            {},
            {"retention.ms": "-1", "retention.bytes": "-1"},
            {"cleanup.policy": "delete", "retention.ms": "-1"},
        ],
    )
    def test_a_journal_that_keeps_every_record_is_accepted(self, config: dict[str, str]) -> None:
        """Given infinite retention and no compaction, when the coordinator checks, it starts."""
        check_journal_retention(SETTINGS, config)

    def test_finite_retention_is_refused_with_the_fix(self) -> None:
        """Given retention.ms of a week, the refusal names it and the kafka-configs.sh command."""
        message = refusal({"cleanup.policy": "delete", "retention.ms": "604800000"})

        assert "finite retention (retention.ms=604800000)" in message
        assert "compact" not in message
        assert (
            "kafka-configs.sh --bootstrap-server broker:9092 --alter --entity-type topics "
            "--entity-name t.checkpoints --add-config retention.ms=-1,retention.bytes=-1"
        ) in message

    @pytest.mark.parametrize(
        "policy", ["compact", "compact,delete", "delete,compact", " compact , delete", "[compact, delete]"]
    )
    def test_a_compacted_journal_is_refused_with_the_fix(self, policy: str) -> None:
        """Given a cleanup.policy with compact (even with infinite retention), the refusal says
        that compaction keeps one record per job id and how to turn it off, without starting to
        delete by the default retention."""
        message = refusal({"cleanup.policy": policy, "retention.ms": "-1", "retention.bytes": "-1"})

        assert f"cleanup.policy={policy}: compaction keeps one record per key" in message
        assert "keyed by job id" in message
        assert "--add-config cleanup.policy=delete,retention.ms=-1,retention.bytes=-1" in message

    def test_compaction_with_finite_retention_names_both(self) -> None:
        """Given compact,delete and a week's retention, both problems are named, one command fixes both."""
        message = refusal({"cleanup.policy": "compact,delete", "retention.ms": "604800000"})

        assert "cleanup.policy=compact,delete" in message
        assert "finite retention (retention.ms=604800000)" in message
        assert message.count("kafka-configs.sh") == 1

    def test_compact_alone_with_finite_retention_is_refused_for_compaction(self) -> None:
        """Given compact alone, retention.ms deletes nothing; compaction is the problem named."""
        message = refusal({"cleanup.policy": "compact", "retention.ms": "604800000"})

        assert "compaction keeps one record per key" in message
        assert "finite retention" not in message


class TestDoctor:
    def test_doctor_reports_a_compacted_journal(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """``cutline doctor`` fails the journal retention check of a compacted journal, with the fix."""
        monkeypatch.setattr(
            "coordinator.service.app.topic_config", lambda bootstrap, topic: {"cleanup.policy": "compact"}
        )

        check = check_retention("broker:9092", "t.")

        assert CheckStatus.FAIL == check.verdict
        assert "compaction keeps one record per key" in check.found
        assert check.fix.startswith("keep every record for ever:")
        assert "cleanup.policy=delete,retention.ms=-1,retention.bytes=-1" in check.fix

    def test_doctor_accepts_a_journal_kept_for_ever(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A journal with infinite retention and no compaction passes."""
        monkeypatch.setattr(
            "coordinator.service.app.topic_config", lambda bootstrap, topic: {"retention.ms": "-1"}
        )

        assert CheckStatus.OK == check_retention("broker:9092", "t.").verdict
