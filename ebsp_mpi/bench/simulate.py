"""Benchmark: the simulator's pushes per second under each sync policy, against a bare heapq loop.

Workload (the scaling study's pattern, docs/simulation.md): n workers whose speeds spread
log-uniformly over 4x, each iteration times a log-normal jitter (sigma 0.2), cycled from a seeded
(n, 256) table. Every policy runs ``--iterations`` pushes per worker through
:func:`ebsp_mpi.sim.events.simulate` (ElasticBSP calling ZipLine at every barrier, its time
included). The peer, timed in the same run, is the bare loop of the same events: pop the next push
from a :mod:`heapq`, look up the worker's next interval, push it back; no policy, no bookkeeping, the
floor of any event loop written in Python. The ratio is policy seconds over bare-loop seconds.

Single-threaded: ``OMP_NUM_THREADS=1 python -m ebsp_mpi bench simulate`` (defaults: 1,024 workers x
10,000 iterations, a few minutes in all). ``--train`` times emulated training instead
(:mod:`ebsp_mpi.bench.emulate`).
"""

from __future__ import annotations

import argparse
import heapq
import platform
import time

import numpy as np

from ebsp_mpi.bench.workload import POLICIES, chosen, intervals, keep, print_header, timed_simulation
from ..safe_text import integer


def bare_loop(table: np.ndarray, iterations: int) -> float:
    """Seconds of the same events with no policy: heappop, next interval, heappush."""
    rows, m = table.tolist(), table.shape[1]
    started = time.perf_counter()
    heap = [(0.0 + rows[w][0], w) for w in range(len(rows))]
    heapq.heapify(heap)
    count = [1] * len(rows)
    heappop, heappush = heapq.heappop, heapq.heappush
    while heap:
        t, w = heappop(heap)
        k = count[w]
        if k < iterations:
            count[w] = k + 1
            heappush(heap, (t + rows[w][k % m], w))
    return time.perf_counter() - started


def main(argv=None, records: list | None = None) -> int:
    """Run every policy once and the bare loop once; with `records`, append each policy's seconds
    against the bare loop's (:mod:`ebsp_mpi.bench.report`)."""
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi bench simulate", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=integer, default=1024)
    parser.add_argument("--iterations", type=integer, default=10_000, help="pushes per worker")
    parser.add_argument("--seed", type=integer, default=0)
    parser.add_argument("--policies", default=",".join(label.split("(")[0] for label, _ in POLICIES),
                        help="comma-separated models to time (default: all)")
    parser.add_argument("--train", action="store_true",
                        help="emulated training (simulate --train) against a bare loop of the same gradients "
                             "and steps (bench.emulate; give e.g. --iterations 50)")
    parser.add_argument("--reps", type=integer, default=3,
                        help="with --train: pairs of runs (bare loop, emulation) per policy; medians (default 3)")
    args = parser.parse_args(argv)
    wanted = args.policies.split(",")
    if args.train:
        from ebsp_mpi.bench.emulate import main_train

        return main_train(args.workers, args.iterations, args.seed, wanted, records, max(1, args.reps))
    table = intervals(args.workers, args.seed)
    events = args.workers * args.iterations
    bare = bare_loop(table, args.iterations)
    print(f"simulator benchmark: {args.workers} workers x {args.iterations} iterations = {events:,} pushes; "
          f"python {platform.python_version()}, {platform.processor() or platform.machine()}")
    print(f"bare heapq loop: {bare:.2f} s, {events / bare / 1e3:,.0f} k pushes/s")
    header = (f"{'policy':<18} | {'seconds':>8} {'k pushes/s':>11} | {'x bare loop':>11} | "
              f"{'barriers':>8} {'ZipLine s':>9}")
    print_header(header)
    for label, sync in chosen(wanted):
        result, seconds = timed_simulation(sync, args.workers, table, args.iterations, args.seed)
        zipline = sum(r.row["seconds"] for r in result.records if r.table == "zipline")
        print(f"{label:<18} | {seconds:8.2f} {result.pushes / seconds / 1e3:11.0f} | {seconds / bare:11.2f} | "
              f"{result.barriers:>8} {zipline:9.2f}")
        keep(records, f"{label} n={args.workers} K={args.iterations}", seconds, "bare heapq loop", bare)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
