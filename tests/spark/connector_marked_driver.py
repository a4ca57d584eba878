"""``python connector_marked_driver.py --latency-interval-ms N <connector_session.py job's arguments>``:
the word count's driver on a session with the connector (:func:`connector_session.run_job`), its job
emitting latency markers every ``N`` ms (the word count's command line has no option for them)."""

from __future__ import annotations

import dataclasses
import sys

from connector_session import run_job

import spark_tasks.wordcount as wordcount


def main(argv: list[str]) -> int:
    at = argv.index("--latency-interval-ms")
    interval, rest = int(argv[at + 1]), argv[:at] + argv[at + 2 :]
    settings_of = wordcount.job_settings

    def with_markers(*args: object, **kwargs: object) -> object:
        return dataclasses.replace(settings_of(*args, **kwargs), latency_interval_ms=interval)  # type: ignore[arg-type]

    wordcount.job_settings = with_markers  # type: ignore[assignment]  # run_job imports it when called
    return run_job(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
