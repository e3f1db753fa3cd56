"""Benchmark: our layers' forward + backward against PyTorch's, on the CPU (one thread each) or a GPU.

Each case does the same work in both libraries: the forward pass of one layer on a random float32
batch, then the backward pass producing the input gradient and the weight and bias gradients
(``torch.autograd.grad`` on ``[x, W, b]``, so PyTorch does not accumulate into ``.grad``). The two
are timed alternately, ``--warmup`` times untimed then ``--reps`` times; the table shows medians in
milliseconds and the speed relative to PyTorch, ``torch_ms / ours_ms`` (above 1: we are faster).
Targets on the CPU: Dense >= 0.8, Conv2D >= 0.5. MaxPool2D and the SGD step (10M parameters, Nesterov
momentum and weight decay, against ``torch.optim.SGD``) are shown for information.

``--device cuda`` runs our layers on CuPy and PyTorch's on the same GPU, at batch 64 to 256, each
call timed until its stream has finished (targets: Dense and Conv2D >= 0.7).

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
from dataclasses import dataclass
from typing import Any

import numpy as np

from ebsp_mpi.backend import BackendError, resolve_backend
from ebsp_mpi.errors import UsageError
from ebsp_mpi.bench.report import record
from ebsp_mpi.nn import SGD, Conv2D, Dense, MaxPool2D, ParamSpace
from ..safe_text import integer

DENSE = ((64, 784, 1024), (64, 1024, 1024), (64, 4096, 1000))          # batch, in, out
CONV = ((32, 3, 32, 32), (32, 32, 64, 16), (32, 64, 64, 8))            # batch, C, O, H=W; 3x3, pad 1
POOL = ((32, 32, 32),)                                                 # batch, C, H=W; 2x2
# On a GPU, batch 64 to 256 as a GPU worker trains: batch 32 would time kernel launches, not layers
GPU_DENSE = ((64, 784, 1024), (256, 1024, 1024), (256, 4096, 1000))
GPU_CONV = ((64, 3, 32, 32), (256, 32, 64, 16), (256, 64, 64, 8))
GPU_POOL = ((256, 32, 32),)
SGD_SIZE = 10_000_000
TARGETS = {"cpu": {"Dense": 0.8, "Conv2D": 0.5}, "cuda": {"Dense": 0.7, "Conv2D": 0.7}}
INSTALL_HINT = ("bench nn compares our layers with PyTorch's, and torch is not installed here: "
                "pip install torch (the CPU build will do)")


@dataclass(frozen=True)
class Device:
    """Where both sides compute: our array module and PyTorch's device, and how to wait for each."""

    name: str                      # "cpu" or "cuda"
    xp: Any                        # numpy or cupy
    torch_device: str
    sync_ours: Callable[[], None]
    sync_theirs: Callable[[], None]
    label: str = "cpu"             # our side's device, e.g. "cupy:0 (NVIDIA H100 80GB HBM3)"

    def to_host(self, a) -> np.ndarray:
        return a.get() if self.xp is not np else np.asarray(a)


def _device(name: str, torch) -> Device:
    """The CPU, or the current CUDA device for CuPy and PyTorch alike (a clear error where none)."""
    if name == "cpu":
        return Device("cpu", np, "cpu", lambda: None, lambda: None)
    backend = resolve_backend("cupy")          # BackendError, one line, where CuPy sees no GPU
    if not torch.cuda.is_available():
        raise BackendError("bench nn --device cuda: PyTorch sees no CUDA device (a CPU-only build?)")
    stream = backend.xp.cuda.get_current_stream
    return Device("cuda", backend.xp, f"cuda:{backend.device}", lambda: stream().synchronize(),
                  torch.cuda.synchronize, backend.describe())


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


def _bound(layer, in_shape, xp):
    specs, out_shape = layer.build(in_shape, "bench")
    space = ParamSpace(specs, xp=xp, dtype=np.float32)
    layer.bind(space)
    space.init(0)
    return out_shape


def _time_pair(ours: Callable[[], object], theirs: Callable[[], object], warmup: int,
               reps: int, device: Device) -> tuple[float, float]:
    """Median seconds of ``ours`` and ``theirs``, timed alternately so load drifts hit both; on a GPU
    each call ends when its device has finished the work it queued."""
    def timed(fn, sync):
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    for _ in range(warmup):
        timed(ours, device.sync_ours), timed(theirs, device.sync_theirs)
    a, b = [], []
    for _ in range(reps):
        a.append(timed(ours, device.sync_ours))
        b.append(timed(theirs, device.sync_theirs))
    return float(np.median(a)), float(np.median(b))


def _layer_cases(torch, rng, device: Device):
    """(kind, description, ours, theirs) for every layer case, both sides' arrays on `device`."""
    f = torch.nn.functional
    gpu = device.name == "cuda"

    def arrays(shape):
        x = rng.standard_normal(shape, dtype=np.float32)
        return device.xp.asarray(x), torch.from_numpy(x.copy()).to(device.torch_device).requires_grad_()

    def weights(host):
        return torch.from_numpy(host).to(device.torch_device).requires_grad_()

    def step(layer, x, dy):
        return lambda: (layer.forward(x, train=True), layer.backward(dy))

    for n, d, o in GPU_DENSE if gpu else DENSE:
        layer = Dense(o)
        out = _bound(layer, (d,), device.xp)
        (x, tx), (dy, tdy) = arrays((n, d)), arrays((n,) + out)
        w, b = weights(device.to_host(layer.W).T.copy()), weights(np.zeros(o, np.float32))  # PyTorch: (out, in)
        yield ("Dense", f"batch {n}: {d} -> {o}", step(layer, x, dy),
               lambda tx=tx, w=w, b=b, tdy=tdy: torch.autograd.grad(f.linear(tx, w, b), [tx, w, b], tdy))

    for n, c, o, hw in GPU_CONV if gpu else CONV:
        layer = Conv2D(o, 3, padding=1)
        out = _bound(layer, (c, hw, hw), device.xp)
        (x, tx), (dy, tdy) = arrays((n, c, hw, hw)), arrays((n,) + out)
        w = weights(device.to_host(layer.W2).reshape(o, c, 3, 3).copy())
        b = weights(np.zeros(o, np.float32))
        yield ("Conv2D", f"batch {n}: {c}->{o} ch, {hw}x{hw}, k3 p1", step(layer, x, dy),
               lambda tx=tx, w=w, b=b, tdy=tdy: torch.autograd.grad(f.conv2d(tx, w, b, padding=1),
                                                                    [tx, w, b], tdy))

    for n, c, hw in GPU_POOL if gpu else POOL:
        layer = MaxPool2D(2)
        out = _bound(layer, (c, hw, hw), device.xp)
        (x, tx), (dy, tdy) = arrays((n, c, hw, hw)), arrays((n,) + out)
        yield ("MaxPool2D", f"batch {n}: {c} ch, {hw}x{hw}, 2x2", step(layer, x, dy),
               lambda tx=tx, tdy=tdy: torch.autograd.grad(f.max_pool2d(tx, 2), [tx], tdy))


def _sgd_case(torch, rng, device: Device):
    p = device.xp.asarray(rng.standard_normal(SGD_SIZE, dtype=np.float32))
    g = device.xp.asarray(rng.standard_normal(SGD_SIZE, dtype=np.float32))
    opt = SGD(SGD_SIZE, momentum=0.9, nesterov=True, weight_decay=5e-4, xp=device.xp)
    tp = torch.from_numpy(device.to_host(p)).to(device.torch_device).requires_grad_()
    tp.grad = torch.from_numpy(device.to_host(g)).to(device.torch_device)
    topt = torch.optim.SGD([tp], lr=1e-6, momentum=0.9, nesterov=True, weight_decay=5e-4)
    return (lambda: opt.step(p, g, 1e-6)), topt.step


def _suffix(device: Device) -> str:
    return " (cuda)" if device.name == "cuda" else ""


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi bench nn", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: NumPy against PyTorch on the CPU; cuda: CuPy against PyTorch on "
                             "the same GPU (default cpu)")
    parser.add_argument("--reps", type=integer, default=20, help="timed repetitions per case (median)")
    parser.add_argument("--warmup", type=integer, default=3, help="untimed repetitions first")
    parser.add_argument("--threads", type=integer, default=1, help="BLAS and PyTorch threads")
    parser.add_argument("--seed", type=integer, default=0)
    parser.add_argument("--no-sgd", action="store_true", help="skip the SGD step comparison")
    parser.add_argument("--check", action="store_true",
                        help="exit with status 1 when a Dense or Conv2D case misses its target")
    return parser.parse_args(argv)


def _describe(torch, device: Device, blas: str, args) -> str:
    if device.name == "cuda":
        ours = f"cupy {device.xp.__version__} on {device.label}"
        theirs = f"torch {torch.__version__} on {device.torch_device}"
    else:
        ours = f"numpy {np.__version__} [{blas}]"
        theirs = f"torch {torch.__version__} ({torch.get_num_threads()} thread(s))"
    return (f"nn benchmark: {ours}, {theirs}, {platform.processor() or platform.machine()}; float32, "
            f"forward + backward (input, weight and bias gradients), median of {args.reps} after "
            f"{args.warmup} warm-up")


def _sgd_rows(torch, rng, device: Device, reps: int, records: list | None) -> None:
    """The SGD step against torch.optim.SGD, and the memory bandwidth a plain copy reaches."""
    step, torch_step = _sgd_case(torch, rng, device)
    t_ours, t_torch = _time_pair(step, torch_step, 1, max(3, reps // 4), device)
    moved = 5 * 4 * SGD_SIZE   # bytes: read p, grad, velocity; write p, velocity
    desc = f"{SGD_SIZE / 1e6:g}M params, nesterov, wd"
    print(f"{'SGD.step':<10} {desc:<34} | {t_ours * 1e3:9.3f} {t_torch * 1e3:9.3f} | "
          f"{t_torch / t_ours:13.2f}x {'':>7} {'':>4}")
    if records is not None:
        records.append(record("nn", f"SGD.step {desc}{_suffix(device)}", t_ours, "s", "torch.optim.SGD", t_torch))
    src = device.xp.ones(SGD_SIZE, dtype=np.float32)
    dst = device.xp.empty_like(src)
    t_copy, _ = _time_pair(lambda: device.xp.copyto(dst, src), lambda: None, 1, 5, device)
    print(f"SGD.step moves {moved / t_ours / 1e9:.1f} GB/s of its {moved / 1e6:.0f} MB; "
          f"a plain {device.xp.__name__} copy here moves {2 * 4 * SGD_SIZE / t_copy / 1e9:.1f} GB/s")


def main(argv=None, records: list | None = None) -> int:
    """Run the comparison; with `records` (a list), append one record per case to it
    (:mod:`ebsp_mpi.bench.report`: figure = our median seconds, reference = PyTorch's)."""
    args = _parse(argv)
    try:
        import torch
    except ImportError:  # one line and exit 2 (ebsp_mpi.cli), before --json would write an empty file
        raise UsageError(INSTALL_HINT) from None
    torch.set_num_threads(args.threads)
    blas = _limit_threads(args.threads)
    device = _device(args.device, torch)
    rng = np.random.default_rng(args.seed)
    targets = TARGETS[device.name]
    print(_describe(torch, device, blas, args))
    header = (f"{'layer':<10} {'case':<34} | {'ours ms':>9} {'torch ms':>9} | "
              f"{'speed vs torch':>14} {'target':>7} {'met':>4}")
    print(header)
    print("-" * len(header))
    missed = []
    for kind, desc, ours, theirs in _layer_cases(torch, rng, device):
        t_ours, t_torch = _time_pair(ours, theirs, args.warmup, args.reps, device)
        speed = t_torch / t_ours
        target = targets.get(kind)
        met = "" if target is None else ("yes" if speed >= target else "NO")
        if met == "NO":
            missed.append(f"{kind} {desc}")
        print(f"{kind:<10} {desc:<34} | {t_ours * 1e3:9.3f} {t_torch * 1e3:9.3f} | "
              f"{speed:13.2f}x {'' if target is None else f'>={target}':>7} {met:>4}")
        if records is not None:
            records.append(record("nn", f"{kind} {desc}{_suffix(device)}", t_ours, "s", "torch", t_torch))
    if not args.no_sgd:
        _sgd_rows(torch, rng, device, args.reps, records)
    if missed:
        print("below target: " + "; ".join(missed))
    return 1 if (args.check and missed) else 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except UsageError as err:  # as python -m ebsp_mpi bench nn says it: one line, exit 2
        print(f"ebsp_mpi: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
