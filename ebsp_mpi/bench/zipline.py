"""Benchmark: ZipLine's production scan against a plain heapq scan and brute force.

Instances are shaped like the authors' (Zhao et al., ML 2021, Sec. 6): every worker has a constant
iteration interval drawn from U[1000, 1500] ms and a random phase; row i holds its next R pushes,
``offset_i + k · interval_i`` for k = 1..R. Each implementation is run once to warm up, then timed
``--reps`` times; the table shows medians in milliseconds and ratios to the production form. Brute
force runs only where R**n is at most ``--brute-limit``. Results are checked to agree.

Robust ZipLine (``sync.zipline_z``) runs on the same M with the error scale the policy learns under
the "last interval" predictor, ``σ_ik = s_i · k`` (s_i uniform in [10, 50] ms, z = 2); its rows are
the production scan's peer (``robust/zipline``), and brute force checks it where it runs.

Run single-threaded for comparable figures: ``OMP_NUM_THREADS=1 python -m ebsp_mpi bench zipline``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable

import numpy as np

from ebsp_mpi.bench.report import record
from ebsp_mpi.sync.zipline import zipline, zipline_brute, zipline_heap, zipline_robust, zipline_robust_brute
from ..safe_text import integer, number

SIZES = ((4, 15), (4, 150), (64, 15), (64, 150), (1000, 15), (1000, 150))


def authors_like(n: int, R: int, rng: np.random.Generator) -> np.ndarray:
    """(n, R) predicted push times in ms: constant interval U[1000, 1500] per worker, random phase."""
    interval = rng.uniform(1000.0, 1500.0, n)
    offset = rng.uniform(0.0, 1500.0, n)
    return offset[:, None] + interval[:, None] * np.arange(1, R + 1)


def authors_like_sigma(n: int, R: int, rng: np.random.Generator) -> np.ndarray:
    """(n, R) error scales in ms growing linearly with k, as the last-interval predictor's do."""
    return rng.uniform(10.0, 50.0, n)[:, None] * np.arange(1, R + 1)


def median_seconds(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def main(argv=None, records: list | None = None) -> int:
    """Run the comparison; with `records` (a list), append to it per instance ZipLine's median
    seconds against the heap scan's and, where run, brute force's (:mod:`ebsp_mpi.bench.report`)."""
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi bench zipline", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=integer, default=7, help="timed repetitions per cell (median)")
    parser.add_argument("--seed", type=integer, default=0)
    parser.add_argument("--brute-limit", type=number, default=2e5,
                        help="run brute force only where R**n is at most this")
    parser.add_argument("--z", type=number, default=2.0, help="robust ZipLine's z")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)

    print(f"ZipLine benchmark — numpy {np.__version__}, {platform.processor() or platform.machine()}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, median of {args.reps}")
    header = (f"{'n':>5} {'R':>4} | {'zipline ms':>10} {'heap ms':>9} {'brute ms':>9} {'robust ms':>9} | "
              f"{'heap/zipline':>12} {'brute/zipline':>13} {'robust/zipline':>14} | {'spread':>8}")
    print(header)
    print("-" * len(header))
    for n, R in SIZES:
        M = authors_like(n, R, rng)
        sigma = authors_like_sigma(n, R, rng)
        fast = zipline(M)
        heap = zipline_heap(M)
        if not (np.array_equal(fast.index, heap.index) and fast.spread == heap.spread):
            raise RuntimeError(f"zipline and zipline_heap disagree at n={n}, R={R}")
        t_fast = median_seconds(lambda M=M: zipline(M), args.reps)
        t_heap = median_seconds(lambda M=M: zipline_heap(M), args.reps)
        t_robust = median_seconds(lambda M=M, s=sigma: zipline_robust(M, s, args.z), args.reps)
        brute_cell, ratio_cell = f"{'-':>9}", f"{'-':>13}"
        if n * np.log10(R) <= np.log10(args.brute_limit):
            brute = zipline_brute(M)
            if not (np.array_equal(fast.index, brute.index) and fast.spread == brute.spread):
                raise RuntimeError(f"zipline and zipline_brute disagree at n={n}, R={R}")
            robust, oracle = zipline_robust(M, sigma, args.z), zipline_robust_brute(M, sigma, args.z)
            if not (np.array_equal(robust.index, oracle.index) and robust.cost == oracle.cost):
                raise RuntimeError(f"zipline_robust and zipline_robust_brute disagree at n={n}, R={R}")
            t_brute = median_seconds(lambda M=M: zipline_brute(M), max(1, args.reps // 2))
            brute_cell, ratio_cell = f"{t_brute * 1e3:9.2f}", f"{t_brute / t_fast:13.1f}"
            if records is not None:
                records.append(record("zipline", f"n={n} R={R}", t_fast, "s", "brute force", t_brute))
        if records is not None:
            records.append(record("zipline", f"n={n} R={R}", t_fast, "s", "heapq scan", t_heap))
            records.append(record("zipline", f"robust z={args.z:g} n={n} R={R}", t_robust, "s", "zipline", t_fast))
        print(f"{n:>5} {R:>4} | {t_fast * 1e3:10.3f} {t_heap * 1e3:9.2f} {brute_cell} {t_robust * 1e3:9.3f} | "
              f"{t_heap / t_fast:12.1f} {ratio_cell} {t_robust / t_fast:14.2f} | {fast.spread:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
