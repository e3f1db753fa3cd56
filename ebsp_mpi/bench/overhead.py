"""Benchmark: seconds per iteration of one worker plus the server under BSP, against the single-process
trainer on the same model, batch and data.

``mpiexec -n 2 python -m ebsp_mpi bench overhead``. The job: an MLP 784 -> 1024 -> 256 -> 10
(1,068,810 parameters) on synthetic data, batch 64, momentum SGD, no stragglers, no periodic
evaluation (``--set`` changes any of it). Rank 0 runs ``reference.train`` (world size 1, one worker) while
rank 1 sleeps; then ranks 0 and 1 run the same job through the runtime (``Server`` + ``Worker``, BSP),
with traces on as users run them and, with ``--traces both`` (the default), again with traces off.
Each is repeated ``--reps`` times, alternately. The traces of the traced runs also tell where an
iteration's time goes (compute, push, server + pull), printed below the table.

The figure is the iteration period, the seconds between the starts of consecutive gradient
computations (median over the iterations after ``--warmup``; the median of the repetitions), read in
both trainers by the same clock around the model's ``loss_and_grad``. The ratio MPI / single process
is the runtime's overhead plus one; target <= 1.15.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from pathlib import Path

import numpy as np

from .ranks import abort_on_failure, idle_barrier, require_ranks, subgroup, world
from .report import human, print_table, record
from .runjob import breakdown, gradient_clock, run_job
from ..safe_text import integer

JOB = ["data.name=synthetic", "data.synthetic_features=784", "data.synthetic_samples=10000",
       "model.kind=mlp", "model.hidden=[1024,256]", "data.batch_size=64", "sync.model=bsp",
       "stop.epochs=0", "eval.every_seconds=1e9", "straggler.enabled=false"]
TARGET = ("<=", 1.15)


def make_job(iterations: int, trace: bool, overrides: list[str]):
    from ..config import load_job

    return load_job(None, JOB + [f"stop.iterations={iterations}", f"trace.enabled={str(trace).lower()}"]
                    + overrides)


def _timings(spans: list[tuple[float, float]], warmup: int) -> tuple[float, float]:
    """Median iteration period and median forward + backward seconds, after `warmup` iterations."""
    starts = np.array([s for s, _ in spans])
    durations = np.array([e - s for s, e in spans])
    return float(np.median(np.diff(starts)[warmup:])), float(np.median(durations[warmup:]))


def local_timing(job, warmup: int) -> tuple[float, float]:
    """Iteration period and forward + backward seconds (medians) of the single-process trainer on
    `job` (one worker)."""
    from .. import reference
    from ..run_description import read_osdp_plan

    with tempfile.TemporaryDirectory(prefix="ebsp-bench-local-") as path, gradient_clock() as spans:
        reference.train(job, Path(path), 1, show_progress=False, plan=read_osdp_plan(job))
    return _timings(spans, warmup)


def mpi_timing(ctx, job, warmup: int) -> tuple[float, float, dict | None]:
    """Iteration period and forward + backward seconds (medians) of the worker (rank 1 of `ctx`)
    running `job` with the server, and on rank 0, when the job writes traces, where an iteration's
    time goes (:func:`~ebsp_mpi.bench.runjob.breakdown`)."""
    read = (lambda run_dir: breakdown(run_dir, warmup)) if job.trace.enabled else None
    with gradient_clock() as spans:
        result = run_job(ctx, job, read=read)
    period, compute = ctx.comm.bcast(_timings(spans, warmup) if ctx.rank == 1 else None, root=1)
    parts = result[1] if ctx.rank == 0 and read is not None else None
    return period, compute, parts


def measure(comm, args) -> tuple[list[dict], dict, dict, dict]:
    """Alternate the single-process and the MPI runs on ranks 0 and 1.

    Returns, on rank 0, the records, the median breakdown of the traced runs' iterations, the median
    forward + backward seconds of each trainer, and each repetition's ratio of the MPI period to the
    single-process period measured just before it (elsewhere nothing).
    """
    from ..runtime.rank.start import setup

    traces = {"both": (True, False), "on": (True,), "off": (False,)}[args.traces]
    sub = subgroup(comm, 2)
    found: list[dict] = []
    median_parts: dict = {}
    computes: dict = {}
    paired: dict = {}
    if sub is not None:
        ctx = setup(sub)
        total = args.warmup + args.iterations + 1
        local_s: list[tuple[float, float]] = []
        mpi_s: dict[bool, list[tuple[float, float]]] = {t: [] for t in traces}
        parts: list[dict] = []
        for _ in range(args.reps):
            if ctx.rank == 0:
                local_s.append(local_timing(make_job(total, False, args.set), args.warmup))
            idle_barrier(ctx.comm)
            for trace in traces:
                period, compute, found_parts = mpi_timing(ctx, make_job(total, trace, args.set), args.warmup)
                mpi_s[trace].append((period, compute))
                if found_parts:
                    parts.append(found_parts)
        if ctx.rank == 0:
            params = _parameter_count(make_job(1, False, args.set))
            reference = statistics.median(p for p, _ in local_s)
            computes["single process"] = statistics.median(c for _, c in local_s)
            for trace in traces:
                found.append(record("overhead", f"BSP, 1 worker + server, traces {'on' if trace else 'off'}: "
                                                f"{params:,} params, batch {_batch(args.set)}",
                                    statistics.median(p for p, _ in mpi_s[trace]), "s", "single process", reference))
                traces = f"traces {'on' if trace else 'off'}"
                computes[f"BSP worker, {traces}"] = statistics.median(c for _, c in mpi_s[trace])
                paired[traces] = [m / s for (m, _), (s, _) in zip(mpi_s[trace], local_s, strict=True)]
            if parts:
                median_parts = {name: statistics.median(p[name] for p in parts) for name in parts[0]}
        ctx.comm.Free()
        sub.Free()
    idle_barrier(comm)
    return found, median_parts, computes, paired


def _parameter_count(job) -> int:
    from .. import build

    return build.model(job, build.dataset(job)).space.size


def _batch(overrides: list[str]) -> int:
    return make_job(1, False, overrides).data.batch_size


def main(argv=None, records: list | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi bench overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=integer, default=200, help="timed iterations per run (median)")
    parser.add_argument("--warmup", type=integer, default=20, help="iterations left out first")
    parser.add_argument("--reps", type=integer, default=5, help="runs of each trainer, alternately (median)")
    parser.add_argument("--traces", choices=("both", "on", "off"), default="both",
                        help="MPI runs with traces on, off, or both (default)")
    parser.add_argument("--set", dest="set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the benchmark's job, e.g. --set model.hidden=[512]")
    args = parser.parse_args(argv)
    require_ranks("overhead", 2)
    make_job(1, False, args.set)  # a bad --set fails here, on every rank alike
    comm = world()
    logging.getLogger("ebsp_mpi").setLevel(logging.WARNING)
    with abort_on_failure():
        found, parts, computes, paired = measure(comm, args)
    if comm.Get_rank() == 0:
        print_table(f"seconds per iteration (median of {args.iterations} after {args.warmup}; median of "
                    f"{args.reps} runs)", found, {r["case"]: TARGET for r in found})
        if parts:
            print("where a traced BSP iteration's time goes (medians, from the run's traces): " +
                  ", ".join(f"{name} {human(value, 's')}" for name, value in parts.items()))
        if computes:
            print("forward + backward alone (loss_and_grad; medians): " +
                  ", ".join(f"{name} {human(value, 's')}" for name, value in computes.items()))
        if paired:  # how much of the spread is the machine's drift from one repetition to the next
            print("ratio in each repetition (against the single-process run just before it): " +
                  "; ".join(f"{name} " + ", ".join(f"{r:.3f}" for r in ratios) for name, ratios in paired.items()))
        if records is not None:
            records += found
    return 0
