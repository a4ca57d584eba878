"""A job's commands: ``cutline run``, ``status``, ``trigger`` and ``tail``."""

from __future__ import annotations

from typing import Annotated

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
from events.codec import default_codec
from events.records import RestartStrategyKind
from events.topics import DEFAULT_PREFIX, Topics

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
    from events.records import RestartStrategy

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
    """Print a job's checkpoint statistics (the coordinator's /jobs/JOB/checkpoints) as tables."""
    import json
    import urllib.error
    import urllib.request

    from coordinator.timeline import render_status

    errors = Console(stderr=True, highlight=False)
    base = url.rstrip("/")
    try:
        with urllib.request.urlopen(f"{base}/jobs/{job}/checkpoints", timeout=10) as response:
            stats = json.load(response)
        with urllib.request.urlopen(f"{base}/jobs/{job}/checkpoints/config", timeout=10) as response:
            config = json.load(response)
        latency = _latency(base, job)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            fail(errors, f"the coordinator at {base} knows no job {job!r}; `curl {base}/jobs` lists them")
        fail(errors, f"the coordinator at {base} answered {exc.code}: {exc.reason}")
    except (urllib.error.URLError, OSError) as exc:
        fail(
            errors,
            f"no coordinator answers at {base} ({exc}); start one with `cutline coordinator` or pass --url",
        )
    Console(highlight=False).print(render_status(job, stats, config, latency))


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

    from events.participant import JobDriver
    from events.records import CheckpointKind, CheckpointRequested

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
    from events.kafka import consumer_config
    from events.log import partitions_of

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
