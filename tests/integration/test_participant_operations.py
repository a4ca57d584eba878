"""What an operator meets running Python participant jobs, against a real broker: an input topic
that does not exist is said at start.
"""

from __future__ import annotations

import subprocess
import sys
from uuid import uuid4

import pytest

from events.dev.broker import create_topics
from events.task.participant import MissingTopics, require_topics

# ------------------------------------------------------------- the input topic


def test_require_topics_names_a_missing_topic_and_what_to_do(bootstrap: str) -> None:
    missing = f"words-{uuid4().hex[:8]}"

    with pytest.raises(MissingTopics) as raised:
        require_topics(bootstrap, [missing])

    assert str(raised.value) == (
        f"topic {missing} does not exist at {bootstrap}: create it (cutline topics create creates "
        "only cutline's topics) or check the name"
    )


def test_require_topics_passes_existing_topics_and_partitions_and_names_a_missing_partition(
    bootstrap: str,
) -> None:
    words = f"words-{uuid4().hex[:8]}"
    create_topics(bootstrap, [words], partitions=2)

    require_topics(bootstrap, [words, f"{words}:0", f"{words}:1"])
    with pytest.raises(MissingTopics, match=f"topic {words} has 2 partitions at .*, no partition 2"):
        require_topics(bootstrap, [f"{words}:2"])


def test_the_example_app_on_a_missing_topic_fails_at_once_saying_what_to_do(bootstrap: str) -> None:
    """No participant starts and no empty checkpoint completes: the app exits 2 with one line."""
    missing = f"words-{uuid4().hex[:8]}"
    command = [sys.executable, "-m", "events.dev.example_app", "--bootstrap", bootstrap]
    command += ["--job", f"wc-{uuid4().hex[:6]}", "--task", "t0"]
    command += ["--topic", missing, "--partition", "0", "--driver"]

    done = subprocess.run(command, capture_output=True, text=True, timeout=60)

    assert 2 == done.returncode, done.stdout + done.stderr
    assert f"topic {missing} does not exist at {bootstrap}: create it" in done.stderr
    assert "Traceback" not in done.stderr
