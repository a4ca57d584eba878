"""A job's commands: ``cutline run``, ``status``, ``list``, ``trigger``, ``stop``, ``cancel`` and ``tail``.

``trigger``, ``stop`` and ``cancel`` send a request and follow its outcome in the job's journal and
dead letters (the rules: coordinator/replay/stop_outcome.py)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from confluent_kafka import KafkaException
from rich.console import Console

from coordinator.cli.common import (
    Bootstrap,
    CoordinatorUrl,
    TopicPrefix,
    as_uri,
    fail,
    need_bootstrap,
    need_topics,
    resolve_url,
)
from events.wire.codec import default_codec
from events.wire.records import RestartStrategyKind
from events.wire.topics import DEFAULT_PREFIX, Topics

if TYPE_CHECKING:
    from coordinator.replay.stop_outcome import Request, Sent
    from events.wire.records import JobStatus

FAILED = 1
"""The exit code of a request that was refused or failed (coordinator/replay/stop_outcome.py's)."""

STRATEGY_NAMES = {kind.flink_name: kind for kind in RestartStrategyKind}


def run(
    command: Annotated[list[str], typer.Argument(help="The job's driver: a command and its arguments.")],
    job: Annotated[str, typer.Option("--job", "-j", help="The job id (what the driver reports).")],
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    restart_strategy: Annotated[
        str | None,
        typer.Option(
            "--restart-strategy",
            help="none, fixed-delay, exponential-delay or failure-rate (restart-strategy.type); "
            "default: the driver's CheckpointConfig.restart_strategy (exponential-delay).",
        ),
    ] = None,
    attempts: Annotated[int, typer.Option(help="fixed-delay: restarts before giving up.")] = 1,
    delay_ms: Annotated[int, typer.Option(help="fixed-delay, failure-rate: wait before a restart.")] = 1_000,
    initial_backoff_ms: Annotated[int, typer.Option(help="exponential-delay: the first wait.")] = 1_000,
    max_backoff_ms: Annotated[int, typer.Option(help="exponential-delay: the longest wait.")] = 60_000,
    backoff_multiplier: Annotated[float, typer.Option(help="exponential-delay: growth per failure.")] = 1.5,
    reset_backoff_threshold_ms: Annotated[
        int, typer.Option(help="exponential-delay: quiet time that resets the backoff.")
    ] = 3_600_000,
    jitter_factor: Annotated[
        float, typer.Option(help="exponential-delay: +- this fraction of a wait.")
    ] = 0.1,
    attempts_before_reset_backoff: Annotated[
        int,
        typer.Option(
            help="exponential-delay: restarts in a row before giving up.",
            show_default="unlimited",
        ),
    ] = 2**31 - 1,
    max_failures_per_interval: Annotated[int, typer.Option(help="failure-rate: failures tolerated.")] = 1,
    failure_rate_interval_ms: Annotated[int, typer.Option(help="failure-rate: the window.")] = 60_000,
    stop_timeout_s: Annotated[
        float,
        typer.Option(
            help="Seconds a driver gets to stop after SIGTERM before SIGKILL (a second Ctrl-C or "
            "SIGTERM: at once). With the default, cutline run stops within 10 s."
        ),
    ] = 8.0,
) -> None:
    """Run a job's driver and restart it as its restart strategy decides (Flink's restart strategies).

    The coordinator decides (a missed heartbeat or an exit with an error fails the attempt);
    this command carries it out: it waits the delay and starts the next attempt with
    CUTLINE_ATTEMPT and CUTLINE_RESTORE set, or exits 1 when the strategy gives up.
    Ctrl-C cancels the job. Example: cutline run --job wc --restart-strategy fixed-delay
    --attempts 3 -- python -m spark_tasks.wordcount ...
    """
    from coordinator.core.restart import strategy_problem
    from coordinator.service.job_runner import RunSettings, supervise
    from events.wire.records import RestartStrategy

    errors = Console(stderr=True, highlight=False)
    bootstrap = need_bootstrap(errors, bootstrap)
    strategy = None
    if restart_strategy is not None:
        kind = STRATEGY_NAMES.get(restart_strategy)
        if kind is None:
            fail(
                errors,
                f"unknown restart strategy {restart_strategy!r}: use one of {', '.join(STRATEGY_NAMES)}",
            )
        strategy = RestartStrategy(
            kind, attempts, delay_ms, initial_backoff_ms, max_backoff_ms, backoff_multiplier,
            reset_backoff_threshold_ms, jitter_factor, attempts_before_reset_backoff,
            max_failures_per_interval, failure_rate_interval_ms,
        )  # fmt: skip
        problem = strategy_problem(strategy)
        if problem is not None:
            fail(errors, f"--restart-strategy {restart_strategy}: {problem}")
    settings = RunSettings(bootstrap, topic_prefix, job, tuple(command), strategy, stop_timeout_s)
    raise typer.Exit(supervise(settings, Console(highlight=False)))


def status(
    job: Annotated[str, typer.Argument(metavar="JOB", help="The job id.")],
    url: CoordinatorUrl = None,
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
) -> None:
    """Print a job's checkpoint statistics (the coordinator's /jobs/JOB/checkpoints) as tables.

    Any worker of the coordinator group answers: one that does not own JOB asks the owner."""
    from coordinator.replay.timeline import render_status

    errors = Console(stderr=True, highlight=False)
    base = resolve_url(errors, url, bootstrap, topic_prefix).rstrip("/")
    path = f"/jobs/{_quoted(job)}"
    with _coordinator_errors(errors, base, job):
        stats, headers = _get(base, f"{path}/checkpoints")
        config, _ = _get(base, f"{path}/checkpoints/config")
        latency = _latency(base, path)
    owner = headers.get("Cutline-Owner")
    Console(highlight=False).print(render_status(job, stats, config, owner=owner, latency=latency))


def _quoted(job: str) -> str:
    """``job`` as one segment of a URL path: a space, a slash, a non-ASCII letter percent-encoded."""
    from urllib.parse import quote

    return quote(job, safe="")


def _get(base: str, path: str) -> tuple[Any, Mapping[str, str]]:
    """The decoded JSON of a coordinator's view, and the answer's headers."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{base}{path}", timeout=10) as response:
        return json.load(response), response.headers


@contextmanager
def _coordinator_errors(errors: Console, base: str, job: str | None = None) -> Iterator[None]:
    """Fail, saying what to do, when the coordinator at ``base`` does not answer or answers an error."""
    import urllib.error

    try:
        yield
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and job is not None:
            fail(
                errors,
                f"the coordinator group at {base} knows no job {job!r}; "
                f"`cutline list --url {base}` lists its jobs",
            )
        fail(errors, f"the coordinator at {base} answered {exc.code}: {_errors_of(exc) or exc.reason}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        fail(
            errors,
            f"no coordinator answers at {base} ({exc}); start one with `cutline coordinator` or pass --url",
        )


def _errors_of(answer: Any) -> str:
    """The ``errors`` of a coordinator's JSON error answer, joined; empty when it has none."""
    import json

    try:
        return "; ".join(str(e) for e in json.load(answer).get("errors", []))
    except (ValueError, AttributeError, OSError):
        return ""


def _latency(base: str, path: str) -> dict[str, object] | None:
    """The job's ``/jobs/JOB/latency`` (``path`` is ``/jobs/JOB``, quoted), or None from a
    coordinator that has no such view."""
    import urllib.error

    try:
        return dict(_get(base, f"{path}/latency")[0])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def jobs_list(
    url: CoordinatorUrl = None,
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="One JSON object per job (the coordinator's /jobs), for any tool."),
    ] = False,
) -> None:
    """List the jobs the coordinator group knows, with their status (Flink's `flink list`).

    Any worker answers for the whole group; a worker that did not answer is named, its jobs missing."""
    import json

    from rich.text import Text

    errors = Console(stderr=True, highlight=False)
    base = resolve_url(errors, url, bootstrap, topic_prefix).rstrip("/")
    with _coordinator_errors(errors, base):
        answer, _ = _get(base, "/jobs")
    for peer in answer.get("unreachable", []):
        errors.print(
            Text(
                f"the worker at {peer.get('url')} did not answer ({peer.get('reason')}): "
                "its jobs are missing",
                "yellow",
            ),
            soft_wrap=True,
        )
    jobs = answer.get("jobs", [])
    if as_json:
        for job in jobs:
            print(json.dumps(job, ensure_ascii=False))
        return
    if not jobs:
        Console(highlight=False).print(
            f"the coordinator group at {base} knows no job yet: "
            "a job is known once its driver reported a status"
        )
        return
    Console(highlight=False).print(_jobs_table(jobs, f"jobs of the coordinator group at {base}"))


def _jobs_table(jobs: list[Mapping[str, Any]], title: str) -> Any:
    """The jobs of ``/jobs`` as a table; the owner column only when the jobs have several owners."""
    from rich.console import RenderableType
    from rich.table import Table
    from rich.text import Text

    from coordinator.replay.timeline import format_time

    owners = len({job.get("owner") for job in jobs}) > 1
    table = Table(title=title)
    table.add_column("job", overflow="fold")
    table.add_column("status", no_wrap=True)
    for column in ("attempt", "restarts", "checkpoints"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("last completed", overflow="fold")
    if owners:
        table.add_column("owner", overflow="fold")
    undecided: dict[str, str] = {}
    for job in jobs:
        counts, last = job.get("counts") or {}, job.get("last_completed")
        status = Text(str(job.get("status") or "-"), _STATUS_STYLES.get(str(job.get("status")), ""))
        if job.get("undecided"):  # its worker recovers its partition again after a failed write
            undecided[str(job.get("id"))] = str(job["undecided"])
            status.append(" (not decided now)", "yellow")
        cells: list[RenderableType] = [
            Text(str(job.get("id"))),
            status,
            str(job.get("attempt", "-")),
            str(job.get("restarts", "-")),
            _counts(counts),
            "-" if not last else f"#{last.get('id')} at {format_time(last.get('timestamp'))}",
        ]
        table.add_row(*cells, *([Text(str(job.get("owner", "-")))] if owners else []))
    if undecided:
        table.caption = "not decided now, as they stood when a journal write failed: " + "; ".join(
            f"{job_id}: {why}" for job_id, why in undecided.items()
        )
    return table


_STATUS_STYLES = {"RUNNING": "green", "FAILED": "red", "FAILING": "red", "RESTARTING": "yellow"}


def _counts(counts: Mapping[str, Any]) -> str:
    """``12 completed``, with the checkpoints in progress and failed when there are any."""
    parts = [f"{counts.get('completed', 0)} completed"]
    parts += [f"{counts[key]} {name}" for key, name in _OTHER_COUNTS if counts.get(key)]
    return ", ".join(parts)


_OTHER_COUNTS = (("in_progress", "in progress"), ("failed", "failed"))


Wait = Annotated[
    bool,
    typer.Option(
        "--wait/--no-wait",
        help="Wait for the coordinator's answer and exit 1 if it refused (--no-wait: only send the request).",
    ),
]


def trigger(
    job: Annotated[str, typer.Argument(metavar="JOB", help="The job id.")],
    savepoint: Annotated[
        str | None,
        typer.Option(
            "--savepoint", metavar="DIR", help="Take a savepoint into this directory (a URI) instead."
        ),
    ] = None,
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    wait: Wait = True,
    timeout: Annotated[
        float,
        typer.Option("--timeout", metavar="SECONDS", help="Seconds to wait for the checkpoint to complete."),
    ] = 120.0,
) -> None:
    """Take a checkpoint (or a savepoint) of JOB now, and wait until it completes.

    Says the checkpoint's id when it is triggered and where it completed; exits 1 with the
    coordinator's reason when it refuses the request (an unknown job, a savepoint target it does not
    allow, ...) or the checkpoint fails."""
    import time
    import uuid

    from events.wire.records import CheckpointKind, CheckpointRequested

    errors = Console(stderr=True, highlight=False)
    bootstrap = need_bootstrap(errors, bootstrap)
    request = CheckpointRequested(
        job_id=job,
        kind=CheckpointKind.SAVEPOINT if savepoint is not None else CheckpointKind.CHECKPOINT,
        timestamp_ms=time.time_ns() // 1_000_000,
        request_id=uuid.uuid4().hex,
        target=None if savepoint is None else as_uri(savepoint),
    )
    raise typer.Exit(_send_and_follow(errors, bootstrap, Topics(topic_prefix), request, wait, timeout))


def stop(
    job: Annotated[str, typer.Argument(metavar="JOB", help="The job id.")],
    savepoint: Annotated[
        str | None,
        typer.Option(
            "--savepoint",
            metavar="DIR",
            help="The savepoint's directory (a URI); default: by the checkpoints.",
        ),
    ] = None,
    drain: Annotated[
        bool, typer.Option("--drain", help="The job treats the savepoint's cut as the end of its input.")
    ] = False,
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    wait: Wait = True,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", metavar="SECONDS", help="Seconds to wait for the savepoint, then for the job's end."
        ),
    ] = 120.0,
) -> None:
    """Stop JOB with a savepoint (Flink's `flink stop`); the job ends FINISHED.

    Its tasks read nothing after the savepoint's cut, the savepoint completes, the job ends FINISHED.
    If the coordinator refuses the stop or the savepoint fails, the job keeps running, and this
    command says why and exits 1."""
    import time
    import uuid

    from events.wire.records import JobStopRequested

    errors = Console(stderr=True, highlight=False)
    bootstrap = need_bootstrap(errors, bootstrap)
    request = JobStopRequested(
        job_id=job,
        timestamp_ms=time.time_ns() // 1_000_000,
        request_id=uuid.uuid4().hex,
        target=None if savepoint is None else as_uri(savepoint),
        drain=drain,
    )
    raise typer.Exit(_send_and_follow(errors, bootstrap, Topics(topic_prefix), request, wait, timeout))


def cancel(
    job: Annotated[str, typer.Argument(metavar="JOB", help="The job id.")],
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    wait: Wait = True,
    timeout: Annotated[
        float,
        typer.Option("--timeout", metavar="SECONDS", help="Seconds to wait for the job to end CANCELED."),
    ] = 60.0,
) -> None:
    """Cancel JOB (Flink's `flink cancel`): no savepoint; its driver stops and the job ends CANCELED.

    Exits 1 with the coordinator's reason when it refuses (an unknown job); a job that has ended
    already is answered at once (exit 0 if it is CANCELED)."""
    import time
    import uuid

    from events.wire.records import JobCancelRequested

    errors = Console(stderr=True, highlight=False)
    bootstrap = need_bootstrap(errors, bootstrap)
    request = JobCancelRequested(job, time.time_ns() // 1_000_000, uuid.uuid4().hex)
    raise typer.Exit(_send_and_follow(errors, bootstrap, Topics(topic_prefix), request, wait, timeout))


def _send_and_follow(
    errors: Console, bootstrap: str, topics: Topics, request: Request, wait: bool, timeout: float
) -> int:
    """Send ``request`` (unless the journal already answers it) and, with ``wait``, follow the job's
    journal and dead letters to its outcome; the exit code."""
    from coordinator.replay.stop_outcome import requested

    console = Console(highlight=False)
    if not wait:
        need_topics(errors, bootstrap, topics.prefix, {topics.requests: "Write"})
        _send(errors, bootstrap, topics.requests, request)
        console.print(requested(request, topics.checkpoints), soft_wrap=True)
        return 0
    reads = {topics.checkpoints: "Read", topics.dead_letters: "Read"}
    need_topics(errors, bootstrap, topics.prefix, {topics.requests: "Write", **reads})
    return _follow(errors, console, bootstrap, topics, request, timeout)


def _follow(
    errors: Console, console: Console, bootstrap: str, topics: Topics, request: Request, timeout: float
) -> int:
    import time

    from coordinator.replay.stop_outcome import Progress, answer_before_sending, follow, timed_out
    from events.kafka.feed import JobFeed

    job = request.job_id
    # From the ends as they are before the request is sent: its answer is after them.
    journal = JobFeed(bootstrap, job, (topics.checkpoints,), claims_topic=topics.checkpoints)
    # Apart: the journal's claims raise its fence, and dead letters carry no epoch.
    dead_letters = JobFeed(bootstrap, job, (topics.dead_letters,))
    try:
        answered = answer_before_sending(request, _journaled_status(bootstrap, topics, request))
        if answered is not None:
            progress, lines = answered
            for line in lines:
                console.print(line, soft_wrap=True)
            return FAILED if progress.exit_code is None else progress.exit_code
        progress = Progress(request, sent=_send(errors, bootstrap, topics.requests, request))
        deadline = time.monotonic() + timeout
        while progress.exit_code is None and time.monotonic() < deadline:
            for entry in [*journal.poll(0.1), *dead_letters.poll(0.1)]:
                if entry.record is None:
                    continue
                progress, lines = follow(progress, entry.record)
                for line in lines:
                    console.print(line, soft_wrap=True)
    finally:
        journal.close()
        dead_letters.close()
    if progress.exit_code is None:
        console.print(timed_out(progress, timeout), soft_wrap=True)
        return FAILED
    return progress.exit_code


def _journaled_status(bootstrap: str, topics: Topics, request: Request) -> JobStatus | None:
    """The job's status as its journal has it now, for a cancel (None for other requests, which the
    coordinator always answers)."""
    from coordinator.core.decider import fold
    from coordinator.core.state import initial_state
    from events.kafka.feed import read_job_partition
    from events.wire.records import (
        JobCancelRequested,
        JobFailedPermanently,
        JobRestartScheduled,
        SchedulerStarted,
        SchedulerStopped,
    )

    if not isinstance(request, JobCancelRequested):
        return None
    kinds = (SchedulerStarted, SchedulerStopped, JobRestartScheduled, JobFailedPermanently)
    found = read_job_partition(
        bootstrap,
        request.job_id,
        topics.checkpoints,
        claims_topic=topics.checkpoints,
        kinds={kind.__name__ for kind in kinds},
    )
    events = [entry.record for entry in found if isinstance(entry.record, kinds)]
    return fold(events, initial_state(request.job_id)).status


def _send(errors: Console, bootstrap: str, topic: str, request: Request) -> Sent:
    """Produce ``request`` to ``topic`` and wait until the broker has it: where it landed. A topic
    that does not exist is not created (``allow.auto.create.topics`` is off)."""
    from confluent_kafka import Message, Producer

    from coordinator.replay.stop_outcome import Sent
    from events.kafka.acls import is_refusal, refusal
    from events.kafka.client_config import client_properties
    from events.kafka.clients import produce_record, producer_config

    producer = Producer(producer_config(bootstrap, {"allow.auto.create.topics": False}))
    delivered: list[Message] = []
    problems: list[str] = []

    def on_delivery(error: Any, message: Message) -> None:
        if error is not None:
            problems.append(str(error))
            refused.extend([error] if is_refusal(error) else [])
        else:
            delivered.append(message)

    refused: list[Any] = []
    produce_record(producer, topic, request, on_delivery=on_delivery)
    producer.flush(SEND_TIMEOUT_S)
    if refused:
        fail(errors, refusal("Write", topic, client_properties(), bootstrap))
    if problems or not delivered:
        why = problems[0] if problems else f"not delivered within {SEND_TIMEOUT_S:g} s"
        fail(errors, f"the request could not be sent to {topic} at {bootstrap}: {why}")
    partition, offset = delivered[0].partition(), delivered[0].offset()
    assert partition is not None and offset is not None, "a delivered message has its place"
    return Sent(topic, partition, offset)


SEND_TIMEOUT_S = 10.0


def tail(
    topic: Annotated[
        str, typer.Argument(help="A topic name, or a short name: checkpoints, acks, barriers, ...")
    ],
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="Start at the oldest message.")
    ] = False,
    count: Annotated[int | None, typer.Option("--count", "-n", help="Stop after this many messages.")] = None,
    idle: Annotated[
        float | None, typer.Option("--idle", help="Stop after this many seconds without messages.")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="One JSON object per message (topic, offset, key, headers, decoded record)."
        ),
    ] = False,
) -> None:
    """Print the decoded events of a topic as they arrive (as JSON lines with --json, for any tool)."""
    import json
    import time

    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition
    from rich.text import Text

    from coordinator.replay.timeline import describe_record, record_json
    from events.kafka.clients import consumer_config
    from events.kafka.log import FencedMarks, log_message, partitions_of
    from events.kafka.refusals import explain

    errors = Console(stderr=True, highlight=False)
    bootstrap = need_bootstrap(errors, bootstrap)
    topics = Topics(topic_prefix)
    short = {name.removeprefix(topic_prefix): name for name in topics.all}
    name = short.get(topic, topic)
    consumer = Consumer(consumer_config(bootstrap))
    try:
        try:
            partitions = partitions_of(consumer, name)
        except KafkaException:
            known = ", ".join(sorted(short))
            fail(
                errors,
                f"topic {name!r} does not exist; cutline's topics are: {known} "
                f"(with prefix {topic_prefix!r})",
            )
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        consumer.assign([TopicPartition(name, p, start) for p in partitions])
        # the journal's records a superseded coordinator wrote are marked as every reader judges them
        marks = FencedMarks(learning=not from_beginning) if name == topics.checkpoints else None
        console = Console(highlight=False)
        codec = default_codec()
        seen, last = 0, time.monotonic()
        while (count is None or seen < count) and (idle is None or time.monotonic() - last < idle):
            message = consumer.poll(0.2)
            refused = None if message is None else explain(message.error(), "Read", name, bootstrap=bootstrap)
            if refused is not None:
                fail(errors, refused)  # no waiting heals a refusal: say it at once
            if message is None or message.error() is not None:
                continue
            last = time.monotonic()
            seen += 1
            headers = message.headers() or []
            pairs = list(headers.items()) if isinstance(headers, dict) else list(headers)
            fenced = None if marks is None else marks.void(log_message(message))
            if as_json:
                record = record_json(
                    codec, name, message.partition(), message.offset(), message.key(), message.value(), pairs
                )
                if fenced is not None:
                    record["void"] = fenced
                print(json.dumps(record), flush=True)
                continue
            line = describe_record(codec, message.partition(), message.offset(), message.value(), pairs)
            if fenced is not None and "VOID" not in line.plain:
                line.append_text(Text(f"  VOID: {fenced}", "bold red"))
            console.print(line, soft_wrap=True)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
