"""Record sizes against Apache Kafka's own 1 MB limit (issue 47, step 3).

The tests of tests/integration/test_record_limits.py, run here against an Apache Kafka node of this
module's, which enforces ``max.message.bytes`` itself (``MSG_SIZE_TOO_LARGE``: test_apache_kafka.py):
a 600 KB task id ends as one bounded dead letter, and a job of 100,000 tasks completes its
checkpoints, every record of every topic within its topic's limit. On the embedded broker, which
has no limit, the same tests can only compare each record with the limit. Where the session's broker
is the tests' own Apache Kafka (the default), test_record_limits.py already runs them on it, with
the same default limit: the module skips rather than run them twice.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import test_record_limits
from support import TEST_BROKER_VARIABLE, broker_kind
from test_record_limits import _coordinator, _settings  # noqa: F401 (the fixtures of the tests below)

from events.dev.apache_kafka import ApacheKafka

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        broker_kind() == "kafka" and not os.environ.get("CUTLINE_BOOTSTRAP"),
        reason="test_record_limits.py runs these tests on the session's Apache Kafka, with the same "
        f"default limit (they run here with {TEST_BROKER_VARIABLE}=tansu or CUTLINE_BOOTSTRAP)",
    ),
]


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    """One Apache Kafka node for the module, with the broker's defaults for record sizes."""
    with ApacheKafka() as kafka:
        yield kafka.bootstrap


@pytest.fixture(autouse=True)
def _settings_of_a_real_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apache Kafka refuses a session timeout under 6 s (``group.min.session.timeout.ms``)."""
    monkeypatch.setenv("CUTLINE_SESSION_TIMEOUT", "6")


test_a_600_kb_task_id_is_a_bounded_dead_letter_and_the_partition_goes_on = (
    test_record_limits.test_a_600_kb_task_id_is_a_bounded_dead_letter_and_the_partition_goes_on
)
test_a_job_of_100000_tasks_completes_its_checkpoints = (
    test_record_limits.test_a_job_of_100000_tasks_completes_its_checkpoints
)
