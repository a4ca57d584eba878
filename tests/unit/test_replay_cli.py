"""``cutline replay`` and ``cutline journal-demo`` (coordinator/cli/replay.py), end to end on journal
files."""

from __future__ import annotations

import io
import itertools
import random
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from coordinator.cli import Cut, app, common, parse_until
from coordinator.core.decider import fold_jobs
from coordinator.core.state import JobState
from coordinator.core.testing import config, heartbeat, run_commands, running, tick
from coordinator.replay.journal import read_journal_events, write_journal
from coordinator.replay.timeline import format_time, job_summary
from coordinator.simulation.traffic import Rates, simulate
from events.wire.records import (
    CheckpointCompleted,
    JournalEvent,
    RestartStrategy,
    RestartStrategyKind,
    TaskAcknowledged,
)

WIDTH = 120
EVENTS = 3000
RATES = Rates(decline=0.03, stuck=0.02, task_failure=0.01, savepoint_every_ms=4000, manual_every_ms=3000)


@pytest.fixture(name="events", scope="module")
def _events() -> list[JournalEvent]:
    return list(itertools.islice(simulate(random.Random(11), jobs=3, rates=RATES), EVENTS))


@pytest.fixture(name="journal", scope="module")
def _journal(tmp_path_factory: pytest.TempPathFactory, events: list[JournalEvent]) -> Path:
    path = tmp_path_factory.mktemp("journal") / "journal.avro"
    write_journal(path, events)
    return path


@pytest.fixture(autouse=True)
def _no_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replay from files here, even where CUTLINE_BOOTSTRAP points the other tests at a broker."""
    monkeypatch.delenv("CUTLINE_BOOTSTRAP", raising=False)


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": str(WIDTH)})


def rendered(state: JobState) -> str:
    """The job's summary panel as the command prints it."""
    out = io.StringIO()
    Console(file=out, width=WIDTH, highlight=False).print(job_summary(state))
    return out.getvalue()


def assert_states(states: dict[str, JobState], output: str, jobs: Iterable[str]) -> None:
    for job_id in jobs:
        assert rendered(states[job_id]) in output, job_id


class TestReplay:
    def test_prints_the_timeline_and_the_final_state(self, journal: Path, events: list[JournalEvent]) -> None:
        """Replay prints one line per event, then each job's state after the whole journal."""
        result = invoke("replay", "--from-file", journal)

        assert 0 == result.exit_code, result.output
        assert "CheckpointTriggered" in result.output
        assert "acks 1/" in result.output
        assert format_time(events[-1].timestamp_ms) in result.output
        assert f"replayed {EVENTS:,} of {EVENTS:,} events" in result.output
        assert_states(fold_jobs(events), result.output, ["job-0", "job-1", "job-2"])

    def test_until_an_offset_gives_the_state_at_that_offset(
        self, journal: Path, events: list[JournalEvent]
    ) -> None:
        """--until 1234 folds offsets 0 to 1234: the state a fold of that prefix gives."""
        result = invoke("replay", "--from-file", journal, "--until", "1234", "--quiet")

        assert 0 == result.exit_code, result.output
        assert_states(fold_jobs(events[:1235]), result.output, ["job-0", "job-1", "job-2"])
        assert "replayed 1,235 of 3,000 events up to offset 1234" in result.output

    @pytest.mark.parametrize("form", ["iso", "ms"])
    def test_until_a_time_gives_the_state_at_that_time(
        self, journal: Path, events: list[JournalEvent], form: str
    ) -> None:
        """--until TIME (ISO 8601 or epoch ms) folds every event up to that time, and no later one."""
        at = events[2000].timestamp_ms
        until = format_time(at) if form == "iso" else f"{at}ms"
        prefix = [e for e in events if e.timestamp_ms <= at]

        result = invoke("replay", "--from-file", journal, "--until", until, "--quiet")

        assert 0 == result.exit_code, result.output
        assert events[: len(prefix)] == prefix  # simulated time never goes back: a prefix
        assert_states(fold_jobs(prefix), result.output, ["job-0", "job-1", "job-2"])
        assert f"replayed {len(prefix):,} of" in result.output

    def test_job_filters_timeline_and_state(self, journal: Path, events: list[JournalEvent]) -> None:
        """--job shows only that job's events and state."""
        result = invoke("replay", "--from-file", journal, "--job", "job-1")
        lines = [line for line in result.output.splitlines() if line.startswith("2026-")]

        assert 0 == result.exit_code, result.output
        assert lines
        assert all(" job-1 " in line for line in lines)
        assert_states(fold_jobs(events), result.output, ["job-1"])
        assert "job job-0" not in result.output
        count = sum(1 for e in events if e.job_id == "job-1")
        assert f"replayed {count:,} of {EVENTS:,} events of job job-1" in result.output

    def test_quiet_prints_no_timeline(self, journal: Path) -> None:
        """--quiet skips the timeline but still prints the states."""
        result = invoke("replay", "--from-file", journal, "--quiet")

        assert 0 == result.exit_code, result.output
        assert "TaskAcknowledged" not in result.output
        assert "job job-0" in result.output

    def test_long_timelines_show_their_ends(self, tmp_path: Path) -> None:
        """Past 10,000 events only the first and last 20 lines print, with a count of the rest."""
        path = tmp_path / "long.avro"
        write_journal(path, itertools.islice(simulate(random.Random(4), jobs=2), 10_050))

        result = invoke("replay", "--from-file", path)
        lines = [line for line in result.output.splitlines() if line.startswith("2026-")]

        assert 0 == result.exit_code, result.output
        assert 40 == len(lines)
        assert "... 10,010 more events (--all prints every line) ..." in result.output
        assert "10049 " in lines[-1]


class TestVerify:
    def test_a_good_journal_verifies(self, journal: Path) -> None:
        """--verify on the decider's own journal finds nothing and exits 0."""
        result = invoke("replay", "--from-file", journal, "--verify", "--quiet")

        assert 0 == result.exit_code, result.output
        assert f"verified: {EVENTS:,} events, no violation" in result.output

    def test_a_corrupted_journal_fails_naming_the_rule(
        self, tmp_path: Path, events: list[JournalEvent]
    ) -> None:
        """Dropping the last ack before a completion is caught: exit 1, the rule, the job and the offset."""
        completed = next(i for i, e in enumerate(events) if isinstance(e, CheckpointCompleted) and i > 100)
        dropped = events[completed - 1]
        assert isinstance(dropped, TaskAcknowledged)
        path = tmp_path / "corrupted.avro"
        write_journal(path, events[: completed - 1] + events[completed:])

        result = invoke("replay", "--from-file", path, "--verify", "--quiet")

        assert 1 == result.exit_code, result.output
        assert "violation complete-after-every-ack" in result.output
        assert f"offset {completed - 1}" in result.output  # the completion moved up into the gap
        assert f"job {dropped.job_id}" in result.output
        assert f"without acknowledgements from {dropped.task_id}" in result.output

    def test_verify_stops_where_until_stops(self, tmp_path: Path, events: list[JournalEvent]) -> None:
        """A violation after --until is not part of the replay, so it is not reported."""
        completed = next(i for i, e in enumerate(events) if isinstance(e, CheckpointCompleted) and i > 100)
        path = tmp_path / "corrupted.avro"
        write_journal(path, events[: completed - 1] + events[completed:])

        result = invoke("replay", "--from-file", path, "--verify", "--quiet", "--until", str(completed - 2))

        assert 0 == result.exit_code, result.output
        assert f"verified: {completed - 1:,} events, no violation" in result.output


class TestErrors:
    @pytest.fixture(autouse=True)
    def _no_broker_answers_soon(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Nothing listens at 127.0.0.1:9: the message comes after the broker wait, shortened here."""
        monkeypatch.setattr(common, "BROKER_WAIT_S", 0.3)

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--from-file", "missing.avro"], "no such file"),
            (["--from-file", "notes.txt"], "not an Avro object container file"),
            (["--from-file", "JOURNAL", "--until", "yesterday"], "--until 'yesterday' is neither"),
            (["--from-file", "JOURNAL", "--job", "nobody"], "job 'nobody' has no events"),
            ([], "replay needs a journal: --from-file F"),
            (["--bootstrap", "127.0.0.1:9"], "no Kafka broker answers at 127.0.0.1:9"),
        ],
    )
    def test_bad_input_exits_2_with_a_message(
        self, tmp_path: Path, journal: Path, args: list[str], message: str
    ) -> None:
        """Bad files and options say what to do and exit 2, without a traceback."""
        (tmp_path / "notes.txt").write_text("not a journal\n")
        args = [
            str(journal) if a == "JOURNAL" else str(tmp_path / a) if a.endswith((".avro", ".txt")) else a
            for a in args
        ]

        result = invoke("replay", *args)

        assert 2 == result.exit_code, result.output
        assert message in result.output
        assert "Traceback" not in result.output
        assert isinstance(result.exception, SystemExit)

    def test_bootstrap_from_the_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """CUTLINE_BOOTSTRAP counts as --bootstrap when no file is given."""
        monkeypatch.setenv("CUTLINE_BOOTSTRAP", "127.0.0.1:9")

        result = CliRunner().invoke(app, ["replay"])

        assert 2 == result.exit_code
        assert "no Kafka broker answers at 127.0.0.1:9" in result.output

    @pytest.mark.parametrize(
        ("text", "cut"),
        [
            ("1234", Cut(offset=1234)),
            ("1795338000000ms", Cut(time_ms=1_795_338_000_000)),
            ("2026-11-22T09:00:00Z", Cut(time_ms=1_795_338_000_000)),
            ("2026-11-22T09:00:00.250+00:00", Cut(time_ms=1_795_338_000_250)),
            ("2026-11-22T10:00:00+01:00", Cut(time_ms=1_795_338_000_000)),
            ("2026-11-22T09:00:00", Cut(time_ms=1_795_338_000_000)),
            (None, Cut()),
        ],
    )
    def test_until_forms(self, text: str | None, cut: Cut) -> None:
        """--until takes an offset, epoch milliseconds, or an ISO 8601 time (UTC without a zone)."""
        assert cut == parse_until(text)


class TestJournalDemo:
    def test_writes_a_journal_of_simulated_traffic(self, tmp_path: Path) -> None:
        """journal-demo writes N events of K jobs, the same for the same seed."""
        first, second = tmp_path / "a.avro", tmp_path / "b.avro"
        for path in (first, second):
            result = invoke("journal-demo", "--out", path, "--events", "500", "--jobs", "2", "--seed", "9")
            assert 0 == result.exit_code, result.output

        events = [event for event, _, _ in read_journal_events(first)]

        assert 500 == len(events)
        assert {"job-0", "job-1"} == {e.job_id for e in events}
        assert events == [event for event, _, _ in read_journal_events(second)]

    def test_is_hidden_from_help(self) -> None:
        """The demo helper does not clutter `cutline --help`; replay is listed."""
        result = invoke("--help")

        assert "replay" in result.output
        assert "journal-demo" not in result.output


def test_console_script_replays_and_verifies(journal: Path) -> None:
    """The real entry point (python -m coordinator.cli) replays and verifies a journal."""
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "coordinator.cli",
            "replay",
            "--from-file",
            str(journal),
            "--quiet",
            "--verify",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": str(WIDTH)},
    )

    assert 0 == completed.returncode, completed.stderr
    assert f"verified: {EVENTS:,} events, no violation" in completed.stdout


def test_the_job_panel_shows_the_restart_strategy_and_a_scheduled_restart() -> None:
    """After a missed heartbeat the panel names the strategy, its count and the restart it scheduled."""
    cfg = config(restart_strategy=RestartStrategy(RestartStrategyKind.FIXED_DELAY, attempts=2, delay_ms=500))
    state, _ = run_commands([running(cfg=cfg, at=0), heartbeat(at=10), tick(50_010)])

    out = io.StringIO()
    Console(file=out, width=400, highlight=False).print(job_summary(state))  # wide: nothing wraps
    panel = out.getvalue()

    assert "fixed-delay, 1 counted" in panel
    assert "attempt 2 scheduled at" in panel and "restoring nothing" in panel
