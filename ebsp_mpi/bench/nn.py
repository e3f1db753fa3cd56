"""Benchmark: our layers' forward + backward against PyTorch's on the CPU, one thread each.

Each case does the same work in both libraries: the forward pass of one layer on a random float32
batch, then the backward pass producing the input gradient and the weight and bias gradients
(``torch.autograd.grad`` on ``[x, W, b]``, so PyTorch does not accumulate into ``.grad``). The two
are timed alternately, ``--warmup`` times untimed then ``--reps`` times; the table shows medians in
milliseconds and the speed relative to PyTorch, ``torch_ms / ours_ms`` (above 1: we are faster).
Targets: Dense >= 0.8, Conv2D >= 0.5. MaxPool2D and the SGD step (10M parameters, Nesterov momentum
and weight decay, against ``torch.optim.SGD``) are shown for information.

BLAS and PyTorch are limited to ``--threads`` threads (default 1) through threadpoolctl and
``torch.set_num_threads``; the thread variables are also set here before NumPy loads when this
module is imported first (``python -m ebsp_mpi bench nn`` does so).
"""

from __future__ import annotations

import os
import sys

if "numpy" not in sys.modules:   # effective only before NumPy loads its BLAS
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import argparse
import platform
import time
from collections.abc import Callable

import numpy as np

from ebsp_mpi.bench.report import record
from ebsp_mpi.nn import SGD, Conv2D, Dense, MaxPool2D, ParamSpace

DENSE = ((64, 784, 1024), (64, 1024, 1024), (64, 4096, 1000))          # batch, in, out
CONV = ((32, 3, 32, 32), (32, 32, 64, 16), (32, 64, 64, 8))            # batch, C, O, H=W; 3x3, pad 1
POOL = ((32, 32, 32),)                                                 # batch, C, H=W; 2x2
SGD_SIZE = 10_000_000
TARGETS = {"Dense": 0.8, "Conv2D": 0.5}
INSTALL_HINT = ("PyTorch is needed for this comparison and is not installed.\n"
                "Install the CPU build into this environment: pip install torch")


def _limit_threads(n: int) -> str:
    """Limit BLAS (via threadpoolctl when present) and PyTorch to ``n`` threads; describe BLAS."""
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        return f"BLAS threads from OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    threadpool_limits(n)
    blas = [f"{i['internal_api']} {i.get('version') or ''} ({i['num_threads']} thread(s))"
            for i in threadpool_info() if i["user_api"] == "blas"]
    return ", ".join(blas) or "no BLAS found by threadpoolctl"


def _bound(layer, in_shape):
    specs, out_shape = layer.build(in_shape, "bench")
    space = ParamSpace(specs, dtype=np.float32)
    layer.bind(space)
    space.init(0)
    return out_shape


def _time_pair(ours: Callable[[], object], theirs: Callable[[], object], warmup: int,
               reps: int) -> tuple[float, float]:
    """Median seconds of ``ours`` and ``theirs``, timed alternately so load drifts hit both."""
    for _ in range(warmup):
        ours(), theirs()
    a, b = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        ours()
        t1 = time.perf_counter()
        theirs()
        t2 = time.perf_counter()
        a.append(t1 - t0)
        b.append(t2 - t1)
    return float(np.median(a)), float(np.median(b))


def _layer_cases(torch, rng):
    """(kind, description, ours, theirs) for every layer case."""
    f = torch.nn.functional

    def arrays(shape):
        x = rng.standard_normal(shape, dtype=np.float32)
        return x, torch.from_numpy(x.copy()).requires_grad_()

    for n, d, o in DENSE:
        layer = Dense(o)
        out = _bound(layer, (d,))
        x, tx = arrays((n, d))
        dy, tdy = arrays((n,) + out)
        w = torch.from_numpy(layer.W.T.copy()).requires_grad_()    # PyTorch keeps (out, in)
        b = torch.zeros(o, requires_grad=True)

        def ours(layer=layer, x=x, dy=dy):
            layer.forward(x, train=True)
            layer.backward(dy)

        def theirs(tx=tx, w=w, b=b, tdy=tdy):
            torch.autograd.grad(f.linear(tx, w, b), [tx, w, b], tdy)

        yield "Dense", f"batch {n}: {d} -> {o}", ours, theirs

    for n, c, o, hw in CONV:
        layer = Conv2D(o, 3, padding=1)
        out = _bound(layer, (c, hw, hw))
        x, tx = arrays((n, c, hw, hw))
        dy, tdy = arrays((n,) + out)
        w = torch.from_numpy(layer.W2.reshape(o, c, 3, 3).copy()).requires_grad_()
        b = torch.zeros(o, requires_grad=True)

        def ours(layer=layer, x=x, dy=dy):
            layer.forward(x, train=True)
            layer.backward(dy)

        def theirs(tx=tx, w=w, b=b, tdy=tdy):
            torch.autograd.grad(f.conv2d(tx, w, b, padding=1), [tx, w, b], tdy)

        yield "Conv2D", f"batch {n}: {c}->{o} ch, {hw}x{hw}, k3 p1", ours, theirs

    for n, c, hw in POOL:
        layer = MaxPool2D(2)
        out = _bound(layer, (c, hw, hw))
        x, tx = arrays((n, c, hw, hw))
        dy, tdy = arrays((n,) + out)

        def ours(layer=layer, x=x, dy=dy):
            layer.forward(x, train=True)
            layer.backward(dy)

        def theirs(tx=tx, tdy=tdy):
            torch.autograd.grad(f.max_pool2d(tx, 2), [tx], tdy)

        yield "MaxPool2D", f"batch {n}: {c} ch, {hw}x{hw}, 2x2", ours, theirs


def _sgd_case(torch, rng):
    p = rng.standard_normal(SGD_SIZE, dtype=np.float32)
    g = rng.standard_normal(SGD_SIZE, dtype=np.float32)
    opt = SGD(SGD_SIZE, momentum=0.9, nesterov=True, weight_decay=5e-4)
    tp = torch.from_numpy(p.copy()).requires_grad_()
    tp.grad = torch.from_numpy(g.copy())
    topt = torch.optim.SGD([tp], lr=1e-6, momentum=0.9, nesterov=True, weight_decay=5e-4)
    return (lambda: opt.step(p, g, 1e-6)), topt.step


def main(argv=None, records: list | None = None) -> int:
    """Run the comparison; with `records` (a list), append one record per case to it
    (:mod:`ebsp_mpi.bench.report`: figure = our median seconds, reference = PyTorch's)."""
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi bench nn", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per case (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed repetitions first")
    parser.add_argument("--threads", type=int, default=1, help="BLAS and PyTorch threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-sgd", action="store_true", help="skip the SGD step comparison")
    parser.add_argument("--check", action="store_true",
                        help="exit with status 1 when a Dense or Conv2D case misses its target")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    blas = _limit_threads(args.threads)
    rng = np.random.default_rng(args.seed)

    print(f"nn benchmark: numpy {np.__version__} [{blas}], torch {torch.__version__} "
          f"({torch.get_num_threads()} thread(s)), {platform.processor() or platform.machine()}; "
          f"float32, forward + backward (input, weight and bias gradients), median of {args.reps} "
          f"after {args.warmup} warm-up")
    header = (f"{'layer':<10} {'case':<34} | {'ours ms':>9} {'torch ms':>9} | "
              f"{'speed vs torch':>14} {'target':>7} {'met':>4}")
    print(header)
    print("-" * len(header))
    missed = []
    for kind, desc, ours, theirs in _layer_cases(torch, rng):
        t_ours, t_torch = _time_pair(ours, theirs, args.warmup, args.reps)
        speed = t_torch / t_ours
        target = TARGETS.get(kind)
        met = "" if target is None else ("yes" if speed >= target else "NO")
        if met == "NO":
            missed.append(f"{kind} {desc}")
        print(f"{kind:<10} {desc:<34} | {t_ours * 1e3:9.3f} {t_torch * 1e3:9.3f} | "
              f"{speed:13.2f}x {'' if target is None else f'>={target}':>7} {met:>4}")
        if records is not None:
            records.append(record("nn", f"{kind} {desc}", t_ours, "s", "torch", t_torch))

    if not args.no_sgd:
        step, torch_step = _sgd_case(torch, rng)
        t_ours, t_torch = _time_pair(step, torch_step, 1, max(3, args.reps // 4))
        moved = 5 * 4 * SGD_SIZE   # bytes: read p, grad, velocity; write p, velocity
        desc = f"{SGD_SIZE / 1e6:g}M params, nesterov, wd"
        print(f"{'SGD.step':<10} {desc:<34} | {t_ours * 1e3:9.3f} {t_torch * 1e3:9.3f} | "
              f"{t_torch / t_ours:13.2f}x {'':>7} {'':>4}")
        if records is not None:
            records.append(record("nn", f"SGD.step {desc}", t_ours, "s", "torch.optim.SGD", t_torch))
        src = np.ones(SGD_SIZE, dtype=np.float32)
        dst = np.empty_like(src)
        t_copy, _ = _time_pair(lambda: np.copyto(dst, src), lambda: None, 1, 5)
        print(f"SGD.step moves {moved / t_ours / 1e9:.1f} GB/s of its {moved / 1e6:.0f} MB; "
              f"a plain NumPy copy here moves {2 * 4 * SGD_SIZE / t_copy / 1e9:.1f} GB/s")

    if missed:
        print("below target: " + "; ".join(missed))
    return 1 if (args.check and missed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
