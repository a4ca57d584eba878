"""Run the deterministic simulator of N coordinator workers, one seed or many.

The simulator (:mod:`coordinator.simulation`) runs the production shell (the
:class:`~coordinator.service.worker.Worker`, the input loop, the ticker, the runtime and the real
decider) of 1-4 workers over a simulated group and log, from ``random.Random(seed)``: no wall
clock, no threads, no I/O. It checks the invariants of docs/design.md ("Ownership and fencing")
after every event; a failing seed prints itself, its last trace lines and the command that
replays it exactly.

Run it::

    uv run python -m coordinator.simulation.run --seed 7 -v        # one seed, every line
    CUTLINE_SIM_SEED=7 uv run python -m coordinator.simulation.run  # the same
    uv run python -m coordinator.simulation.run --seeds 2000 --start 0 --processes 2
    uv run python -m coordinator.simulation.run --storm --seed 1     # issue 52's black-box run
    uv run python -m coordinator.simulation.run --seed 7 --rules legacy

A million seeds overnight: ``--seeds 1000000 --start N --processes $(nproc)``. Seeds are
independent, so the rate grows with the processes; give each night a new ``--start``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from coordinator.simulation.oracle import (
    Deciding,
    Oracle,
    RecoveryReads,
    Violation,
    Window,
    Written,
    check_inputs_decided,
    check_live_state,
    check_liveness,
    check_recovered,
    check_recovery,
    check_step_down,
    check_window,
)
from coordinator.simulation.world import (
    Result,
    Rules,
    Scenario,
    SimulationFailed,
    rebalance_storm,
    simulate,
)

__all__ = [
    "SEED_ENV",
    "Deciding",
    "Oracle",
    "RecoveryReads",
    "Result",
    "Rules",
    "Scenario",
    "SimulationFailed",
    "Summary",
    "Violation",
    "Window",
    "Written",
    "check_inputs_decided",
    "check_live_state",
    "check_liveness",
    "check_recovered",
    "check_recovery",
    "check_step_down",
    "check_window",
    "main",
    "rebalance_storm",
    "run_seeds",
    "simulate",
]

SEED_ENV = "CUTLINE_SIM_SEED"
"""Replays this one seed (as ``--seed``)."""


@dataclass(frozen=True, slots=True)
class Summary:
    """Many seeds' runs, added up."""

    seeds: int = 0
    steps: int = 0
    faults: int = 0
    checks: int = 0
    windows: int = 0
    failures: tuple[str, ...] = ()
    """Each failed seed's report (its seed, time, violation, trace and replay command)."""

    def __add__(self, other: Summary) -> Summary:
        return Summary(
            self.seeds + other.seeds,
            self.steps + other.steps,
            self.faults + other.faults,
            self.checks + other.checks,
            self.windows + other.windows,
            self.failures + other.failures,
        )


GC_THRESHOLD = 20_000
"""The cyclic collector's first threshold while seeds run (Python's default is 700)."""


def _run_batch(args: tuple[int, int, str]) -> Summary:
    start, count, rules = args
    total = Summary()
    with _collecting_less():
        for seed in range(start, start + count):
            try:
                result = simulate(seed, Rules(rules))
            except SimulationFailed as failed:
                total += Summary(1, failed.step, 0, 0, 0, (str(failed),))
                continue
            total += Summary(1, result.steps, result.faults, result.checks, result.windows_checked)
    return total


@contextlib.contextmanager
def _collecting_less() -> Iterator[None]:
    """A seed makes and drops millions of small objects (futures, handles, records), few of them in
    cycles: the cyclic collector runs less often meanwhile. For speed only; it still runs."""
    thresholds = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def run_seeds(
    start: int,
    count: int,
    rules: Rules = Rules.CURRENT,
    *,
    processes: int = 1,
    on_batch: Callable[[Summary], None] | None = None,
) -> Summary:
    """Run seeds ``start`` .. ``start + count - 1`` in ``processes`` processes; ``on_batch`` hears
    of each batch as it ends (in seed order)."""
    size = max(1, min(100, count // (processes * 8) or 1))
    batches = [
        (first, min(size, start + count - first), rules.value) for first in range(start, start + count, size)
    ]
    total = Summary()
    results: Iterable[Summary]
    if processes <= 1:
        results = map(_run_batch, batches)
        for batch in results:
            total += batch
            if on_batch is not None:
                on_batch(batch)
        return total
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=processes) as pool:
        for batch in pool.map(_run_batch, batches):
            total += batch
            if on_batch is not None:
                on_batch(batch)
    return total


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m coordinator.simulation.run``: one seed exactly, or many."""
    parser = argparse.ArgumentParser(
        prog="python -m coordinator.simulation.run", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--seed", type=int, help=f"replay this one seed exactly (or set {SEED_ENV})")
    parser.add_argument("--seeds", type=int, default=1000, help="how many consecutive seeds to run")
    parser.add_argument("--start", type=int, default=0, help="the first of them")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--rules", choices=[r.value for r in Rules], default=Rules.CURRENT.value)
    storm = "issue 52's run: a join while 64 claims are queued, then 10 rebalances back to back"
    parser.add_argument("--storm", action="store_true", help=storm)
    parser.add_argument("-v", "--verbose", action="store_true", help="print every line of the trace")
    args = parser.parse_args(argv)
    rules = Rules(args.rules)
    seed = args.seed if args.seed is not None else _seed_from_env()
    if seed is not None or args.storm:
        return _one(seed or 0, rules, rebalance_storm() if args.storm else None, args.verbose)
    return _many(args.start, args.seeds, args.processes, rules)


def _seed_from_env() -> int | None:
    value = os.environ.get(SEED_ENV, "").strip()
    return int(value) if value else None


def _one(seed: int, rules: Rules, scenario: Scenario | None, verbose: bool) -> int:
    try:
        result = simulate(seed, rules, scenario=scenario, verbose=verbose)
    except SimulationFailed as failed:
        print(f"FAILED: {failed}", file=sys.stderr)
        return 1
    print(
        f"seed {result.seed} ({rules.value} rules): {result.simulated_s:.1f} simulated seconds, "
        f"{result.steps} events, {result.faults} faults, {result.rebalances} rebalances, "
        f"{result.windows_checked} liveness windows, {result.checks} invariant checks, "
        f"{result.recoveries} recoveries (longest tail {result.max_tail} records), trace {result.digest[:16]}"
    )
    return 0


def _many(start: int, count: int, processes: int, rules: Rules) -> int:
    began = time.perf_counter()  # the report's clock only: the simulation never reads one
    done = Summary()

    def on_batch(batch: Summary) -> None:
        nonlocal done
        done += batch
        for failure in batch.failures:
            print(f"FAILED {failure}", file=sys.stderr)
        rate = done.seeds / max(time.perf_counter() - began, 1e-9)
        print(
            f"  {done.seeds}/{count} seeds, {rate:.0f} seeds/s, {len(done.failures)} failed", file=sys.stderr
        )

    total = run_seeds(start, count, rules, processes=processes, on_batch=on_batch)
    elapsed = time.perf_counter() - began
    print(
        f"{total.seeds} seeds ({start}..{start + count - 1}, {rules.value} rules, {processes} processes) in "
        f"{elapsed:.1f} s ({total.seeds / max(elapsed, 1e-9):.0f} seeds/s): {total.steps} events, "
        f"{total.faults} faults injected, {total.windows} liveness windows, {total.checks} invariant checks, "
        f"{len(total.failures)} failed"
    )
    for failure in total.failures:
        first = failure.split("\n", 1)[0]
        replay = failure.rsplit("replay: ", 1)[-1]
        print(f"FAILED {first}\n  replay: {replay}")
    return 1 if total.failures else 0


if __name__ == "__main__":
    sys.exit(main())
