"""``python -m ebsp_mpi profile JOB``: time each layer's forward and backward on the worker's device and
measure a step's activation memory, for OSDP's planner (``python -m ebsp_mpi plan``).

For each batch size (``--batch-sizes``, default the job's ``data.batch_size``) the job's model runs
``--warmup`` then ``--reps`` training steps on random inputs of the data set's shape, layer by layer as
``Model.loss_and_grad`` runs them (the first layer with parameters computes no input gradient); each
layer's forward and backward and the loss are timed separately (``time.perf_counter``, the device
synchronized before and after on CuPy) and the medians kept. Then each layer with parameters runs in s
slices for every s of ``--splits`` up to its rows (``forward_slice`` and ``backward_slice``, as an
on-demand worker runs them), in turn with the whole layer, on the inputs and output gradients of a step;
the medians give how many times its whole forward and backward all s slices take, and the layer's step
times scaled by that are kept: the planner times a slice from these. One more step, untimed, measures
the activation memory A(b): on NumPy the peak of ``tracemalloc`` above what was traced before the step
(the minibatch, activations and temporaries; the parameters and gradients already existed), on CuPy the
bytes the memory pool holds after the step, emptied before it. Last, the servers' update: the job's
optimizer step over its share of the parameters (all of them over ``runtime.servers``), on the host as
a server runs it, median of ``--reps`` (``update_s``).

Whether a fetch overlaps compute is ``--overlap``: by default not on NumPy (on one node MPI's receiving
rank copies a large message: the worker's own core), and yes on CuPy. The network figures come from a
``bench mpi`` result (``--bench FILE``, written by ``mpiexec -n 2 python -m ebsp_mpi bench mpi --json
FILE`` on the same machine), or ``--latency`` and ``--bandwidth``; without either, nominal figures are
used and the file says so. The profile is JSON (:mod:`ebsp_mpi.plan.osdp_files`).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from ..safe_text import integer

DEFAULT_OUT = "osdp-profile.json"
#: Used when neither --bench nor --latency/--bandwidth is given (and recorded as such).
NOMINAL_LATENCY_S = 10e-6
NOMINAL_BANDWIDTH = 1e9


def add_parser(subparsers) -> None:
    """Register ``profile`` on the CLI's subparsers (``ebsp_mpi.cli``)."""
    from ..helptext import plain
    from .arguments import add_job_arguments

    p = subparsers.add_parser("profile", help="time each layer's forward and backward and a step's memory for "
                                              "OSDP's planner; writes a profile (JSON)",
                              description=plain(__doc__.split("\n\n")[0]))
    add_job_arguments(p, DEFAULT_OUT, "profile")
    add_profile_options(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(run=main)


def add_profile_options(p: argparse.ArgumentParser) -> None:
    """The options of a profile, shared with ``plan JOB`` (which profiles when given no --profile)."""
    p.add_argument("--batch-sizes", metavar="B,B,...", help="batch sizes to profile (default: data.batch_size)")
    p.add_argument("--splits", default="2,4,8", metavar="S,S,...",
                   help="slice counts a split layer may use: profiled, and planned (default 2,4,8; each >= 2; "
                        "empty: no splits)")
    p.add_argument("--reps", type=integer, default=20, help="timed steps per batch size (medians; default 20)")
    p.add_argument("--warmup", type=integer, default=3, help="untimed steps first (default 3)")
    p.add_argument("--bench", metavar="FILE", help="latency and bandwidth from bench mpi --json FILE")
    p.add_argument("--latency", metavar="SECONDS", help="one-way latency worker <-> server, e.g. 5e-6")
    p.add_argument("--bandwidth", metavar="SIZE/s", help="bandwidth worker <-> server, e.g. 5GB/s or 4GiB/s")
    p.add_argument("--overlap", choices=("yes", "no"),
                   help="whether a fetch overlaps compute (default: no on NumPy, where the worker's own core "
                        "copies what it receives; yes on CuPy)")
    p.add_argument("--overhead", metavar="SECONDS",
                   help="seconds added to every predicted iteration (what the model does not see: the server, "
                        "the barrier); default 0, or the profile's")


def main(args) -> int:
    from ..config import load_job
    from ..plan.osdp_files import write_json

    job = load_job(args.job, args.overrides)
    doc = run_profile(job, args)
    write_json(args.out, doc)
    print_profile(doc)
    print(f"wrote {args.out}")
    return 0


def run_profile(job, args) -> dict:
    """Profile `job`'s model as the options in `args` say; the profile document."""
    from .. import build
    from ..backend import resolve_backend
    from ..errors import UsageError
    from ..progress import Progress
    from ..plan.osdp_files import PROFILE_FORMAT, PROFILE_VERSION, check_batches_fit, model_identity, model_layers

    batch_sizes = parse_batch_sizes(args.batch_sizes) if args.batch_sizes else [job.data.batch_size]
    splits = parse_splits(args.splits)
    if args.reps < 1 or args.warmup < 0:
        raise UsageError(f"--reps {args.reps} --warmup {args.warmup}: need reps >= 1 and warmup >= 0")
    network = network_options(args)
    overhead = _seconds(args.overhead, "--overhead") if args.overhead is not None else 0.0
    backend = resolve_backend(job.backend)
    network["overlap"] = args.overlap == "yes" if args.overlap else backend.name == "cupy"
    ds = build.dataset(job)
    model = build.model(job, ds, xp=backend.xp)
    given = f"--batch-sizes {args.batch_sizes}" if args.batch_sizes else f"data.batch_size = {job.data.batch_size}"
    check_batches_fit(model, batch_sizes, given)  # one line, not a MemoryError at the first step
    layers = model_layers(model)
    for entry in layers:
        entry["forward_s"], entry["backward_s"] = [], []
        if entry["params"]:
            entry["slices_s"] = {str(n): {"forward_s": [], "backward_s": []} for n in splits if n <= entry["rows"]}
    progress = Progress(len(batch_sizes) * (args.warmup + args.reps + 1), unit="step",
                        enabled=not getattr(args, "quiet", False))
    steps = itertools.count(1)
    loss_s, activations = [], []
    for b in batch_sizes:
        loss, activation = _profile_batch(model, backend, ds.num_classes, layers, b, args,
                                          lambda b=b: progress.update(next(steps), batch=b))
        loss_s.append(loss)
        activations.append(activation)
    progress.close(progress.total)  # every batch size took warmup + reps + 1 steps
    update = update_time(job, model.space.size, args.reps, args.warmup)
    return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "model": model_identity(model),
            "backend": backend.name, "device": backend.describe(), "dtype": str(model.space.dtype),
            "itemsize": int(model.space.dtype.itemsize), "reps": args.reps, "batch_sizes": batch_sizes,
            "splits": list(splits),
            "layers": layers, "loss_s": loss_s, "activation_bytes": activations, "update_s": update,
            "network": network, "overhead_s": overhead}


def _profile_batch(model, backend, num_classes: int, layers: list[dict], b: int, args,
                   step_done: Callable[[], None]) -> tuple[float, int]:
    """Batch size `b`: each layer's median step times and its slices' appended to `layers`; the loss's
    median seconds and the step's activation bytes returned. `step_done` is called after each step."""
    x, y = _inputs(model, num_classes, b)
    times = [[] for _ in layers]
    losses = []
    for rep in range(args.warmup + args.reps):
        step = time_step(model, backend, backend.asarray(x), backend.asarray(y))
        if rep >= args.warmup:
            for t, (f, bw) in zip(times, step[0], strict=True):
                t.append((f, bw))
            losses.append(step[1])
        step_done()
    for entry, t in zip(layers, times, strict=True):
        entry["forward_s"].append(statistics.median(f for f, _ in t))
        entry["backward_s"].append(statistics.median(bw for _, bw in t))
    for entry, per_count in zip(layers, slice_times(model, backend, layers, x, y, args.reps, args.warmup),
                                strict=True):
        for n, (f, bw) in per_count.items():  # the step's time of the layer, scaled
            entry["slices_s"][str(n)]["forward_s"].append(f * entry["forward_s"][-1])
            entry["slices_s"][str(n)]["backward_s"].append(bw * entry["backward_s"][-1])
    activation = activation_bytes(model, backend, x, y)
    step_done()
    return statistics.median(losses), activation


def _inputs(model, num_classes: int, b: int):
    import numpy as np

    rng = np.random.default_rng(b)
    x = rng.standard_normal((b, *model.in_shape)).astype(model.space.dtype)
    return x, rng.integers(0, num_classes, size=b)


def time_step(model, backend, x, y) -> tuple[list[tuple[float, float]], float]:
    """One training step, layer by layer as ``Model.loss_and_grad`` runs it: per layer ``(forward,
    backward)`` seconds (backward 0 below the first layer with parameters), and the loss's."""
    from ..nn.losses import softmax_cross_entropy

    clock, sync = time.perf_counter, backend.synchronize
    n = len(model.layers)
    forward, backward = [0.0] * n, [0.0] * n
    h = x
    sync()
    for i, layer in enumerate(model.layers):
        t = clock()
        h = layer.forward(h, True)
        sync()
        forward[i] = clock() - t
    t = clock()
    _, dy = softmax_cross_entropy(h, y)
    sync()
    loss = clock() - t
    stop = next((i for i, layer in enumerate(model.layers) if layer.tensor_names), 0)
    for i in range(n - 1, stop - 1, -1):
        t = clock()
        dy = model.layers[i].backward(dy, need_dx=i > stop)
        sync()
        backward[i] = clock() - t
    return list(zip(forward, backward, strict=True)), loss


def update_time(job, params: int, reps: int, warmup: int) -> float:
    """Seconds of one server's optimizer step over its shard (``runtime.servers`` share the
    parameters), on NumPy as the servers run it, on a gradient of small random values."""
    import numpy as np

    from .. import build
    from ..bench.report import median_seconds

    n = -(-params // job.runtime.servers)
    rng = np.random.default_rng(0)
    weights = rng.standard_normal(n, dtype=np.float32)
    grad = rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)
    opt = build.optimizer(job, n)
    return median_seconds(lambda: opt.step(weights, grad, job.optim.lr), reps, warmup)


def slice_times(model, backend, layers: list[dict], x_host, y_host, reps: int, warmup: int) -> list[dict]:
    """Per layer (`layers`: ``model_layers`` with ``slices_s`` on those with parameters): ``{s: (forward,
    backward)}``, how many times its whole forward and backward all s slices of the layer take, each slice's
    weights in an array of their own as the fetch buffer holds them. The slices and the whole layer (as one
    slice) run in turn on the layer's input and output gradient of one step: run alone, a layer finds its
    operands in cache, which a step does not, so only their ratio carries over to the step's times.
    """
    from ..nn.losses import softmax_cross_entropy

    xp, clock, sync = backend.xp, time.perf_counter, backend.synchronize
    h, inputs = backend.asarray(x_host), []
    for layer in model.layers:
        inputs.append(h)
        h = layer.forward(h, True)
    _, dy = softmax_cross_entropy(h, backend.asarray(y_host))
    stop = next((i for i, layer in enumerate(model.layers) if layer.tensor_names), 0)
    grads = [None] * len(model.layers)
    for i in range(len(model.layers) - 1, stop - 1, -1):
        grads[i] = dy
        dy = model.layers[i].backward(dy, need_dx=i > stop)
    out = []
    for i, (layer, entry) in enumerate(zip(model.layers, layers, strict=True)):
        counts = [int(n) for n in entry.get("slices_s", {})]
        if not counts:
            out.append({})
            continue
        need_dx, x, g = i > stop, inputs[i], grads[i]
        # the whole layer is its one slice: the same code and copies as its slices, with no partial sums
        units = {n: _slice_units(model, layer, entry, n) for n in [1, *counts]}
        temp = xp.empty(x.shape[0] * entry["bias_elems"], dtype=model.space.dtype)
        times = {n: ([], []) for n in units}
        for rep in range(warmup + reps):
            for n, slices in units.items():
                for (w, b, _), (w0, b0) in slices:  # the weights again: backward wrote dW over them
                    w[...], b[...] = w0, b0
                sync()
                t0 = clock()
                for (w, b, a), _ in slices:
                    layer.forward_slice(x, w, b, a, temp)
                sync()
                t1 = clock()
                for (w, b, a), _ in reversed(slices):
                    layer.backward_slice(g, w, b, a, need_dx)
                sync()
                if rep >= warmup:
                    times[n][0].append(t1 - t0)
                    times[n][1].append(clock() - t1)
        whole = [statistics.median(t) for t in times[1]]
        out.append({n: tuple(statistics.median(t) / w if w > 0 else 1.0 for t, w in zip(times[n], whole, strict=True))
                    for n in counts})
    return out


def _slice_units(model, layer, entry: dict, n: int) -> list:
    """The `n` slices of `layer`: ``((W rows, b part, first row), (their values))``, forward order; b
    goes per row (Conv2D) or whole with the last slice (Dense)."""
    from ..plan.osdp import split_rows

    W, b = (model.space.param(t) for t in layer.tensor_names)
    units, row = [], 0
    for k, rows in enumerate(split_rows(entry["rows"], n)):
        w = W[row:row + rows].reshape(-1).copy()
        part = b[row:row + rows] if entry["bias_per_row"] else b if k == n - 1 else b[:0]
        units.append(((w, part.copy(), row), (w.copy(), part.copy())))
        row += rows
    return units


def activation_bytes(model, backend, x_host, y_host) -> int:
    """Bytes a training step allocates above what existed before it: the minibatch, the activations
    kept for backward and the temporaries, at their peak."""
    if backend.name == "cupy":
        pool = backend.xp.get_default_memory_pool()
        backend.synchronize()
        pool.free_all_blocks()
        before = pool.total_bytes()
        model.loss_and_grad(backend.asarray(x_host), backend.asarray(y_host))
        backend.synchronize()
        return int(pool.total_bytes() - before)
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        model.loss_and_grad(x_host.copy(), y_host.copy())
        return int(tracemalloc.get_traced_memory()[1] - before)
    finally:
        tracemalloc.stop()


def parse_batch_sizes(text: str) -> list[int]:
    from ..errors import UsageError

    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--batch-sizes {text!r}: expected integers >= 1 separated by commas, e.g. 32,64,128")
    return sorted(set(sizes))


def parse_splits(text: str) -> tuple[int, ...]:
    """``--splits``: slice counts, each >= 2 (empty: none)."""
    from ..errors import UsageError

    try:
        splits = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        splits = (0,)
    if any(s < 2 for s in splits):
        raise UsageError(f"--splits {text!r}: slice counts must be integers >= 2, e.g. 2,4,8 (empty: no splits)")
    return splits


def network_options(args) -> dict:
    """Latency and bandwidth from ``--bench FILE`` or ``--latency``/``--bandwidth`` (nominal without)."""
    from ..errors import UsageError
    from ..plan.osdp_files import network_from_bench
    from ..plan.sizes import parse_size

    if args.bench and (args.latency or args.bandwidth):
        raise UsageError("--bench FILE gives latency and bandwidth: give it or --latency/--bandwidth, not both")
    if args.bench:
        latency, bandwidth = network_from_bench(args.bench)
        source = f"bench mpi {args.bench}"
    else:
        latency = _seconds(args.latency, "--latency") if args.latency else NOMINAL_LATENCY_S
        bandwidth = NOMINAL_BANDWIDTH
        if args.bandwidth:
            try:
                bandwidth = parse_size(args.bandwidth.strip().removesuffix("/s").removesuffix("ps"), "--bandwidth")
            except ValueError as e:
                raise UsageError(f"{e}, per second (e.g. 5GB/s)") from None
        source = "options" if args.latency or args.bandwidth else "nominal (not measured: give --bench FILE)"
    return {"latency_s": latency, "bandwidth_bytes_per_s": float(bandwidth), "source": source}


def _seconds(text: str, what: str) -> float:
    from ..errors import UsageError

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise UsageError(f"{what} {text!r}: expected seconds, a finite number >= 0 (e.g. 5e-6)")
    return value


def print_profile(doc: dict, out=None) -> None:
    """Per layer and batch size: forward and backward milliseconds; then activations and network."""
    from ..plan.sizes import format_size

    out = out or sys.stdout
    sizes = doc["batch_sizes"]
    print(f"profile of {doc['model'].get('kind')} ({doc['model'].get('params')} parameters) on {doc['device']}, "
          f"median of {doc['reps']} steps", file=out)
    head = f"{'layer':<10} {'params':>9} " + " ".join(f"{'b=' + str(b) + ' fwd/bwd ms':>20}" for b in sizes)
    print(head, file=out)
    print("-" * len(head), file=out)
    for layer in doc["layers"]:
        cells = " ".join(f"{f * 1e3:>9.3f}/{bw * 1e3:<10.3f}"
                         for f, bw in zip(layer["forward_s"], layer["backward_s"], strict=True))
        print(f"{layer['name']:<10} {layer['params']:>9} {cells}", file=out)
    print(f"{'loss':<10} {'':>9} " + " ".join(f"{t * 1e3:>9.3f}{'':11}" for t in doc["loss_s"]), file=out)
    split = [(layer["name"], n, t) for layer in doc["layers"] for n, t in layer.get("slices_s", {}).items()]
    if split:
        print("in slices (fwd/bwd ms of all the layer's slices):", file=out)
        for name, n, t in split:
            cells = " ".join(f"{f * 1e3:>9.3f}/{bw * 1e3:<10.3f}"
                             for f, bw in zip(t["forward_s"], t["backward_s"], strict=True))
            print(f"{name:<10} {'s=' + n:>9} {cells}", file=out)
    found = zip(sizes, doc["activation_bytes"], strict=True)
    print("activations: " + ", ".join(f"b={b}: {format_size(a)}" for b, a in found), file=out)
    print(f"servers' update: {doc['update_s'] * 1e3:.3f} ms per optimizer step", file=out)
    net = doc["network"]
    print(f"network: latency {net['latency_s'] * 1e6:.2f} us, bandwidth {net['bandwidth_bytes_per_s'] / 1e9:.3f} GB/s "
          f"({net['source']}); fetches {'overlap' if net.get('overlap') else 'do not overlap'} compute", file=out)
