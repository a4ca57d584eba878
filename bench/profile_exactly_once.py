"""Where the sending thread's time goes, for each way of bench_exactly_once.py's participant throughput
run (the idempotent producer, ``ExactlyOnceSink``, and with ``--batch`` their batch loops): one run
unprofiled for the sending thread's CPU per record, then one under ``cProfile`` for where it goes (the
profiler's own cost per Python call inflates the second; docs/benchmarks.md, "Exactly-once output to
Kafka").

    uv run python bench/profile_exactly_once.py [--records 500000] [--top 12] [--batch 0]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
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
    parser.add_argument("--batch", type=int, default=0, help="also the batch loops, this many a call")
    args = parser.parse_args()
    run = argparse.Namespace(interval_ms=1000, size=100, batch=args.batch)
    ways = (bench.IDEMPOTENT, bench.EXACTLY_ONCE) + (bench.BATCHED if args.batch else ())
    with broker("kafka") as (bootstrap, _, pid), tempfile.TemporaryDirectory() as scratch:
        for way in ways[:2]:  # unmeasured: the first transaction creates the transaction log
            bench.participant_throughput(way, bootstrap, pid, run, Path(scratch), 2000)
        for way in ways:
            plain = bench.participant_throughput(way, bootstrap, pid, run, Path(scratch), args.records)
            profile = cProfile.Profile()
            profile.enable()
            profiled = bench.participant_throughput(way, bootstrap, pid, run, Path(scratch), args.records)
            profile.disable()
            print(
                f"{way}: sending thread {plain.sender_cpu_us:.2f} CPU µs a record, process "
                f"{plain.client_cpu_us:.2f}, {plain.per_s:,.0f} records/s; under the profiler "
                f"{profiled.sender_cpu_us:.2f} µs a record:"
            )
            pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
