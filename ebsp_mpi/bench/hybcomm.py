"""Benchmark: dense gradients through the parameter server (PS) against sufficient-factor broadcasting
(SFB), measured bytes against HybComm's cost model, and where SFB starts to pay in time.

``mpiexec -n 5 python -m ebsp_mpi bench hybcomm``. For each dense layer shape ``IN x OUT`` at a
per-worker batch K (default: 4096x4096 at K = 32, where SFB's K·(M+N) floats are far fewer than the
M·N of the gradient; the same layer at K = 8, where rebuilding the gradient from the factors costs a
quarter of the arithmetic; and 256x16 at K = 64, where the cost model has PS win) and each number of
workers (default 2, 3 and 4; the ranks left over sleep in a barrier), a short BSP training job runs through
the real runtime (``Server`` on rank 0, ``Worker`` on the next ranks) once with each ``comm.hybrid``:
``ps``, ``sfb`` and ``auto``. The model is an MLP on synthetic data, ``IN -> OUT -> 2``: the layer
itself and a small classifier head; learning rate 1e-4, no stragglers, no evaluation, traces off.

Per run the table shows:

- **bytes per iteration** of the layer's weight, for a worker (the busiest one) and for the server, from
  the runtime's counters (``summary.json: bytes``, payload sent + received), less the first pull of the
  initial weights, divided by the iterations; beside them the cost model's prediction
  (``summary.json: hybrid``, ``plan.hybcomm``). Below the table, whether the two agree exactly on every
  rank for every tensor of the model and for the total;
- **seconds per iteration**: the period between the starts of consecutive gradient computations on
  every worker (median over the iterations after ``--warmup``), and its ratio to the ``ps`` run of the
  same shape and workers.

Then, per shape, the measured crossover (the fewest workers at which SFB's time beats PS's) beside
Poseidon's P* = 2MN / (K(M+N)) (colocated servers), this topology's byte model (SFB moves fewer
bytes on the busiest rank exactly when K < K*, ``plan.hybcomm.crossover_batch``) and what ``auto``
plans from, bytes plus SFB's fixed cost ``comm.sfb_overhead_bytes`` (K < K*_c,
``plan.hybcomm.crossover_batch_timed``); last, in how many cases auto's plan for the layer is the
scheme measured faster.
"""

from __future__ import annotations

import argparse
import logging
import math
import time

import numpy as np

from ..errors import UsageError
from .ranks import abort_on_failure, idle_barrier, require_ranks, subgroup, world
from .report import human, record
from .runjob import gradient_clock, run_job
from ..safe_text import integer, number

SHAPES = "4096x4096:32,4096x4096:8,256x16:64"
QUICK_SHAPES = "1024x1024:32,256x16:64"
MODES = ("ps", "sfb", "auto")
CLASSES = 2  # the classifier head after the layer: OUT -> 2
REFERENCE = "ps, same layer and workers"
#: small enough that no run drives the loss to 0: on a memorised batch the gradients shrink into the
#: float32 subnormals, and the arithmetic on them (not the communication) then sets the time, several-fold
LR = 1e-4


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``4096x4096:32,256x16:64`` -> ``[(4096, 4096, 32), (256, 16, 64)]``: (IN, OUT, K) per layer."""
    shapes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            dims, k = part.lower().split(":")
            d_in, d_out = dims.split("x")
            shape = (int(d_in), int(d_out), int(k))
        except ValueError:
            shape = (0, 0, 0)
        if min(shape) < 1:
            raise UsageError(f"--shapes: {part!r} is not IN x OUT : K (e.g. 4096x4096:32), all >= 1")
        shapes.append(shape)
    if not shapes:
        raise UsageError("--shapes: give at least one layer, e.g. 4096x4096:32")
    return shapes


def worker_counts(text: str, n: int) -> list[int]:
    """``--workers 2,3,4`` -> [2, 3, 4]; each in 1..n (default: 2 .. min(4, n))."""
    try:
        counts = [int(k) for k in text.split(",") if k.strip()] or list(range(2, min(4, n) + 1))
    except ValueError:
        counts = [0]
    if any(not 1 <= k <= n for k in counts):
        raise UsageError(f"--workers {text}: expected numbers in 1..{n} (the ranks after the server), "
                         f"comma-separated")
    return sorted(set(counts))


def job_for(shape: tuple[int, int, int], mode: str, iterations: int, max_workers: int, overrides=()):
    """A BSP job whose model is the layer IN -> OUT and a head OUT -> 2, on synthetic data with enough
    samples for two batches of K per worker, learning rate :data:`LR`; then `overrides`."""
    from ..config import load_job

    d_in, d_out, k = shape
    samples = max(100, math.ceil(2 * k * max_workers / 0.8) + 10)  # 80% train: >= 2 batches per shard
    return load_job(None, [
        "data.name=synthetic", f"data.synthetic_features={d_in}", f"data.synthetic_classes={CLASSES}",
        f"data.synthetic_samples={samples}", "data.synthetic_hidden=16", f"data.batch_size={k}",
        "model.kind=mlp", f"model.hidden=[{d_out}]", "sync.model=bsp", f"comm.hybrid={mode}",
        f"stop.iterations={iterations}", "stop.epochs=0", "eval.every_seconds=1e9",
        "straggler.enabled=false", "trace.enabled=false", f"optim.lr={LR}", *overrides])


def layer_name(plan: dict, shape: tuple[int, int, int]) -> str:
    """The weight tensor of the layer IN x OUT in a run's plan (Poseidon's M x N is OUT x IN)."""
    d_in, d_out, _ = shape
    return next(name for name, c in plan["layers"].items() if c["dense"] and (c["m"], c["n"]) == (d_out, d_in))


def moved(counts: dict, tensor: str) -> int:
    """Payload bytes one rank sent + received over the run for `tensor` (or ``"total"``), every scheme."""
    return sum(v["sent"] + v["received"] for v in counts.get(tensor, {}).values())


def per_iteration(summary: dict, layer: str) -> dict:
    """From a run's summary: bytes per iteration from the counters, less the first pull, against the
    cost model's, for every tensor and the total.

    A worker's counters hold its first pull (the whole model) and ``iterations`` rounds; the server's
    hold every worker's first pull and the same rounds. Returns ``layer``'s figures (the busiest
    worker's and the server's, measured and predicted), the first pull of the layer and of the whole
    model, and ``exact``: whether every rank's counters equal the model for every tensor and the total.
    """
    plan, counts, iterations = summary["hybrid"], summary["bytes"], summary["iterations"]
    if len(set(iterations)) != 1:
        raise RuntimeError(f"BSP workers ran different numbers of iterations: {iterations}")
    its, workers = iterations[0], len(iterations)
    fb = plan["float_bytes"]
    firsts = {name: c["m"] * c["n"] * fb for name, c in plan["layers"].items()}
    firsts["total"] = sum(firsts.values())
    found, exact = {}, True
    for name, first in firsts.items():
        choice = plan["total"] if name == "total" else plan["layers"][name][plan["layers"][name]["scheme"]]
        server = (moved(counts[0], name) - workers * first) / its
        each = [(moved(c, name) - first) / its for c in counts[1:]]
        exact &= server == choice["server"] and all(w == choice["worker"] for w in each)
        found[name] = {"worker": max(each), "workers": each, "server": server,
                       "model_worker": choice["worker"], "model_server": choice["server"], "first_pull": first}
    return {**found[layer], "iterations": its, "model_first_pull": firsts["total"], "exact": exact,
            "tensors": found}


def run_case(world_comm, shape, k: int, mode: str, args, max_workers: int) -> dict | None:
    """One BSP job on ranks 0..k; on rank 0 its bytes (:func:`per_iteration`), plan and median
    seconds per iteration, elsewhere None."""
    from ..runtime.rank.start import setup

    sub = subgroup(world_comm, k + 1)
    out = None
    if sub is not None:
        ctx = setup(sub)
        job = job_for(shape, mode, args.warmup + args.iterations, max_workers, args.set)
        with gradient_clock() as spans:
            result = run_job(ctx, job)
        periods = list(np.diff([s for s, _ in spans])[args.warmup:]) if ctx.rank > 0 else []
        periods = ctx.comm.gather(periods, root=0)
        if ctx.rank == 0:
            layer = layer_name(result["hybrid"], shape)
            out = per_iteration(result, layer)
            out["plan"], out["layer"] = result["hybrid"], layer
            out["seconds"] = float(np.median([p for ps in periods[1:] for p in ps]))
        ctx.comm.Free()
        sub.Free()
    idle_barrier(world_comm)
    return out


def label(shape) -> str:
    d_in, d_out, _ = shape
    return f"{d_in}x{d_out}"


def scheme_label(mode: str, plan: dict, layer: str) -> str:
    """``ps``, ``sfb``, or for ``auto`` what it chose for the layer (``auto: sfb``)."""
    return f"auto: {plan['layers'][layer]['scheme']}" if mode == "auto" else mode


def _int(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


def print_results(results: dict, shapes, counts, args) -> None:
    """The table, the check of the counters and the crossovers (rank 0)."""
    print(f"BSP, 1 server + P1 workers, one job per row ({args.warmup} warm-up + {args.iterations} timed "
          f"iterations); the model: the layer IN x OUT, a head OUT x {CLASSES}, biases")
    print("bytes per iteration of the layer's weight (payload sent + received) from the counters, less the "
          "first pull, and the cost model's; s/it: median iteration period over the workers")
    head = (f"{'layer':>10} | {'K':>3} | {'P1':>2} | {'scheme':<9} | {'worker B/it':>13} | {'model':>13} | "
            f"{'server B/it':>13} | {'model':>13} | {'s/it':>9} | {'vs ps':>6}")
    print(head)
    print("-" * len(head))
    for shape in shapes:
        for k in counts:
            ps_seconds = results[shape, k, "ps"]["seconds"]
            for mode in MODES:
                r = results[shape, k, mode]
                scheme = scheme_label(mode, r["plan"], r["layer"])
                print(f"{label(shape):>10} | {shape[2]:>3} | {k:>2} | {scheme:<9} | {_int(r['worker']):>13} | "
                      f"{_int(r['model_worker']):>13} | {_int(r['server']):>13} | {_int(r['model_server']):>13} | "
                      f"{human(r['seconds'], 's'):>9} | {r['seconds'] / ps_seconds:6.3f}")
    print()
    wrong = [key for key, r in results.items() if not r["exact"]]
    for shape, k, mode in wrong:
        tensors = results[shape, k, mode]["tensors"]
        print(f"counters against the model: NOT EQUAL in {label(shape)} K={shape[2]} P1={k} {mode}: " + "; ".join(
            f"{name} workers {t['workers']} server {t['server']} (model {t['model_worker']}, {t['model_server']})"
            for name, t in tensors.items()))
    if not wrong:
        firsts = ", ".join(sorted({f"{label(s)} {_int(results[s, counts[0], 'ps']['model_first_pull'])} B"
                                   for s in shapes}))
        print("counters against the model: equal in every run, on every rank, for every tensor and the total, "
              f"once the first pull (the whole model, once per worker) is taken off: {firsts}")
    print()
    print(f"crossover: the fewest workers at which SFB's time beats PS's by more than {args.margin:.0%} "
          f"(measured), against the byte models")
    for shape in shapes:
        print("  " + crossover_line(shape, counts, results, args.margin))
    print()
    print(auto_line(results, shapes, counts))
    print()


def auto_line(results: dict, shapes, counts) -> str:
    """Whether ``auto``'s plan for each layer is the scheme that was measured faster (sfb's time / ps's
    below 1: sfb), case by case."""
    wrong = []
    for shape in shapes:
        for p in counts:
            chose = results[shape, p, "auto"]["plan"]["layers"][results[shape, p, "auto"]["layer"]]["scheme"]
            ratio = results[shape, p, "sfb"]["seconds"] / results[shape, p, "ps"]["seconds"]
            if chose != ("sfb" if ratio < 1 else "ps"):
                wrong.append(f"{label(shape)} K={shape[2]} P1={p} (chose {chose}, sfb / ps time {ratio:.3f})")
    cases = len(shapes) * len(counts)
    return (f"auto chose the scheme measured faster in {cases - len(wrong)} of {cases} cases"
            + (f"; not in {', '.join(wrong)}" if wrong else ""))


def crossover_line(shape, counts, results, margin: float) -> str:
    from ..plan.hybcomm import crossover_batch, crossover_batch_timed, crossover_workers, ps_bytes, sfb_bytes

    d_in, d_out, k = shape
    m, n = d_out, d_in
    top = max(counts)
    ratios = {p: results[shape, p, "sfb"]["seconds"] / results[shape, p, "ps"]["seconds"] for p in counts}
    faster = [p for p in counts if ratios[p] < 1 - margin]
    fewer = [p for p in counts if sfb_bytes(m, n, k, p).busiest < ps_bytes(m, n, p).busiest]
    c = results[shape, top, "auto"]["plan"]["sfb_overhead_bytes"]  # what auto's runs weighed
    cheaper = [p for p in counts if k < crossover_batch_timed(m, n, p, overhead_bytes=c)]
    measured = f"{faster[0]} workers" if faster else f"none up to {top}"
    predicted = f"{fewer[0]} workers" if fewer else f"none up to {top}"
    timed = f"{cheaper[0]} workers" if cheaper else f"none up to {top}"
    kstar = ", ".join(f"{crossover_batch(m, n, p):.1f} at {p}" for p in counts)
    kstar_c = ", ".join(f"{crossover_batch_timed(m, n, p, overhead_bytes=c):.1f} at {p}" for p in counts)
    times = ", ".join(f"{r:.3f} at {p}" for p, r in ratios.items())
    return (f"{label(shape)}, K = {k}: measured {measured} (sfb / ps time: {times}); Poseidon's P* = "
            f"{crossover_workers(m, n, k):.2f} nodes (SFB moves fewer bytes below it); this topology: SFB's "
            f"busiest rank moves fewer bytes from {predicted} (K* = {kstar} workers; SFB wins when K < K*); "
            f"auto, bytes + {c:,.0f} B per SFB layer: SFB from {timed} (K*_c = {kstar_c})")


def main(argv=None, records: list | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi bench hybcomm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=None, help=f"dense layers IN x OUT : K (per-worker batch), "
                                                       f"comma-separated (default {SHAPES})")
    parser.add_argument("--workers", default="", help="numbers of workers, comma-separated (default 2 .. "
                                                      "min(4, N-1))")
    parser.add_argument("--iterations", type=integer, default=None, help="timed iterations per run (median; "
                                                                     "default 24, --quick 12)")
    parser.add_argument("--warmup", type=integer, default=None, help="iterations left out first (default 4, "
                                                                 "--quick 3)")
    parser.add_argument("--margin", type=number, default=0.05,
                        help="SFB beats PS when its time is below (1 - margin) times PS's (default 0.05: one run "
                             "per case, and runs of the same plan differ by a few percent)")
    parser.add_argument("--quick", action="store_true", help=f"a smaller run: shapes {QUICK_SHAPES}, "
                                                             f"fewer iterations")
    parser.add_argument("--set", dest="set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of every run's job, e.g. --set runtime.chunk_bytes=524288")
    args = parser.parse_args(argv)
    args.iterations = args.iterations if args.iterations is not None else (12 if args.quick else 24)
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 4)
    if args.iterations < 2 or args.warmup < 0:
        raise UsageError("--iterations must be >= 2 and --warmup >= 0")
    shapes = parse_shapes(args.shapes or (QUICK_SHAPES if args.quick else SHAPES))
    require_ranks("hybcomm", 3)
    comm = world()
    counts = worker_counts(args.workers, comm.Get_size() - 1)
    job_for(shapes[0], "auto", 1, max(counts), args.set)  # a bad --set fails here, on every rank alike
    logging.getLogger("ebsp_mpi").setLevel(logging.WARNING)

    results: dict = {}
    start = time.perf_counter()
    with abort_on_failure():
        for shape in shapes:
            for k in counts:
                for mode in MODES:
                    r = run_case(comm, shape, k, mode, args, max(counts))
                    if r is not None:
                        results[shape, k, mode] = r
    if comm.Get_rank() == 0:
        print_results(results, shapes, counts, args)
        print(f"{len(results)} runs in {time.perf_counter() - start:.0f} s")
        found = []
        for shape in shapes:
            for k in counts:
                ps_seconds = results[shape, k, "ps"]["seconds"]
                for mode in MODES[1:]:
                    r = results[shape, k, mode]
                    found.append(record("hybcomm", f"BSP {label(shape)} K={shape[2]}, {k} workers, "
                                                   f"{scheme_label(mode, r['plan'], r['layer'])}",
                                        r["seconds"], "s", REFERENCE, ps_seconds))
        if records is not None:
            records += found
    return 0
