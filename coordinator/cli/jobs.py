"""A job's commands: ``cutline run``, ``status``, ``trigger`` and ``tail``."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from confluent_kafka import KafkaException
from rich.console import Console

from coordinator.cli.common import (
    Bootstrap,
    TopicPrefix,
    as_uri,
    fail,
    need_bootstrap,
)
from events.wire.codec import default_codec
from events.wire.records import RestartStrategyKind
from events.wire.topics import DEFAULT_PREFIX, Topics

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
        int, typer.Option(help="exponential-delay: restarts in a row before giving up.")
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
    from coordinator.restart import strategy_problem
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
    job: Annotated[str, typer.Argument(help="The job id.")],
    url: Annotated[str, typer.Option("--url", help="The coordinator's web views.")] = "http://127.0.0.1:6066",
) -> None:
    """Print a job's checkpoint statistics (the coordinator's /jobs/JOB/checkpoints) as tables.

    Any worker of the coordinator group answers: one that does not own JOB asks the owner."""
    import json
    import urllib.error
    import urllib.request

    from coordinator.timeline import render_status

    errors = Console(stderr=True, highlight=False)
    base = url.rstrip("/")
    try:
        with urllib.request.urlopen(f"{base}/jobs/{job}/checkpoints", timeout=10) as response:
            stats = json.load(response)
            owner = response.headers.get("Cutline-Owner")
        with urllib.request.urlopen(f"{base}/jobs/{job}/checkpoints/config", timeout=10) as response:
            config = json.load(response)
        latency = _latency(base, job)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            fail(
                errors,
                f"the coordinator group at {base} knows no job {job!r}; `curl {base}/jobs` lists its jobs",
            )
        fail(errors, f"the coordinator at {base} answered {exc.code}: {_errors_of(exc) or exc.reason}")
    except (urllib.error.URLError, OSError) as exc:
        fail(
            errors,
            f"no coordinator answers at {base} ({exc}); start one with `cutline coordinator` or pass --url",
        )
    Console(highlight=False).print(render_status(job, stats, config, owner=owner, latency=latency))


def _errors_of(answer: Any) -> str:
    """The ``errors`` of a coordinator's JSON error answer, joined; empty when it has none."""
    import json

    try:
        return "; ".join(str(e) for e in json.load(answer).get("errors", []))
    except (ValueError, AttributeError, OSError):
        return ""


def _latency(base: str, job: str) -> dict[str, object] | None:
    """The job's ``/jobs/JOB/latency``, or None from a coordinator that has no such view."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base}/jobs/{job}/latency", timeout=10) as response:
            return dict(json.load(response))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def trigger(
    job: Annotated[str, typer.Argument(help="The job id.")],
    savepoint: Annotated[
        str | None, typer.Option("--savepoint", help="Take a savepoint into this directory (a URI) instead.")
    ] = None,
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
) -> None:
    """Ask the coordinator for a checkpoint (or a savepoint) of JOB now."""
    import time
    import uuid

    from events.task.participant import JobDriver
    from events.wire.records import CheckpointKind, CheckpointRequested

    errors = Console(stderr=True, highlight=False)
    bootstrap = need_bootstrap(errors, bootstrap)
    target = None if savepoint is None else as_uri(savepoint)
    request = CheckpointRequested(
        job_id=job,
        kind=CheckpointKind.SAVEPOINT if savepoint is not None else CheckpointKind.CHECKPOINT,
        timestamp_ms=time.time_ns() // 1_000_000,
        request_id=uuid.uuid4().hex,
        target=target,
    )
    with JobDriver(bootstrap, job, Topics(topic_prefix)) as driver:
        driver.request(request)
    Console(highlight=False).print(
        f"requested {request.kind.lower()} of {job} (request {request.request_id})"
        + (f" into {target}" if target else "")
        + f"; follow it with `cutline tail {Topics(topic_prefix).checkpoints}`",
        soft_wrap=True,
    )


StopTimeout = Annotated[
    float, typer.Option("--timeout", help="Seconds to wait for the savepoint, then for the job's end.")
]


def stop(
    job: Annotated[str, typer.Argument(help="The job id.")],
    savepoint: Annotated[
        str | None,
        typer.Option("--savepoint", help="The savepoint's directory (a URI); default: by the checkpoints."),
    ] = None,
    drain: Annotated[
        bool, typer.Option("--drain", help="The job treats the savepoint's cut as the end of its input.")
    ] = False,
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    timeout: StopTimeout = 120.0,
) -> None:
    """Stop JOB with a savepoint (Flink's `flink stop`): its tasks read nothing after the savepoint's
    cut, the savepoint completes, the job ends FINISHED. If the savepoint fails the job keeps running,
    and this command says why and exits 1."""
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
    raise typer.Exit(_follow_stop(bootstrap, Topics(topic_prefix), request, timeout))


def _follow_stop(bootstrap: str, topics: Topics, request: Any, timeout: float) -> int:
    """Send ``request`` (a stop or a cancel) and follow the job's journal to its outcome; the exit code."""
    import time

    from coordinator.stop_outcome import StopFollower
    from events.kafka.feed import JobFeed
    from events.task.participant import JobDriver

    console = Console(highlight=False)
    follower = StopFollower(request)
    feed = JobFeed(bootstrap, request.job_id, (topics.checkpoints,), claims_topic=topics.checkpoints)
    try:
        with JobDriver(bootstrap, request.job_id, topics) as driver:
            driver.request(request)
        deadline = time.monotonic() + timeout
        while follower.exit_code is None and time.monotonic() < deadline:
            for entry in feed.poll(0.2):
                if entry.record is None:
                    continue
                for line in follower.read(entry.record):
                    console.print(line, soft_wrap=True)
    finally:
        feed.close()
    if follower.exit_code is None:
        console.print(follower.timed_out(timeout), soft_wrap=True)
        return 1
    return follower.exit_code


def cancel(
    job: Annotated[str, typer.Argument(help="The job id.")],
    bootstrap: Bootstrap = None,
    topic_prefix: TopicPrefix = DEFAULT_PREFIX,
    timeout: StopTimeout = 60.0,
) -> None:
    """Cancel JOB (Flink's `flink cancel`): no savepoint; its driver stops and the job ends CANCELED."""
    import time
    import uuid

    from events.wire.records import JobCancelRequested

    errors = Console(stderr=True, highlight=False)
    bootstrap = need_bootstrap(errors, bootstrap)
    request = JobCancelRequested(job, time.time_ns() // 1_000_000, uuid.uuid4().hex)
    raise typer.Exit(_follow_stop(bootstrap, Topics(topic_prefix), request, timeout))


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

    from coordinator.timeline import describe_record, record_json
    from events.kafka.clients import consumer_config
    from events.kafka.log import partitions_of

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
        console = Console(highlight=False)
        codec = default_codec()
        seen, last = 0, time.monotonic()
        while (count is None or seen < count) and (idle is None or time.monotonic() - last < idle):
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            last = time.monotonic()
            seen += 1
            headers = message.headers() or []
            pairs = list(headers.items()) if isinstance(headers, dict) else list(headers)
            if as_json:
                record = record_json(
                    codec, name, message.partition(), message.offset(), message.key(), message.value(), pairs
                )
                print(json.dumps(record), flush=True)
                continue
            console.print(
                describe_record(codec, message.partition(), message.offset(), message.value(), pairs),
                soft_wrap=True,
            )
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
