"""Where the sending thread's time goes: ``cProfile`` of one participant throughput run of each way of
bench_exactly_once.py (the idempotent producer, then ``ExactlyOnceSink``), with the thread's and the
process's CPU seconds (docs/benchmarks.md, "Exactly-once output to Kafka").

    uv run python bench/profile_exactly_once.py [--records 500000] [--top 12]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bench_exactly_once as bench  # noqa: E402
from bench.bench_coordinator import broker  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    run = argparse.Namespace(interval_ms=1000, size=100)
    with broker("kafka") as (bootstrap, _, pid), tempfile.TemporaryDirectory() as scratch:
        ways = (bench.IDEMPOTENT, bench.EXACTLY_ONCE)
        for way in ways:  # unmeasured: the first transaction creates the transaction log
            bench.participant_throughput(way, bootstrap, pid, run, Path(scratch), 2000)
        for way in ways:
            profile = cProfile.Profile()
            thread, process = time.thread_time(), time.process_time()
            profile.enable()
            per_s, _, _, _ = bench.participant_throughput(
                way, bootstrap, pid, run, Path(scratch), args.records
            )
            profile.disable()
            thread, process = time.thread_time() - thread, time.process_time() - process
            print(f"{way}: {per_s:,.0f} records/s; sending thread {thread:.2f} CPU s, process {process:.2f}")
            pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
