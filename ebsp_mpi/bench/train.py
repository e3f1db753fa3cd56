"""Benchmark: end-to-end training throughput, the samples per second a user sees in ``summary.json``.

``python -m ebsp_mpi bench train`` (no mpiexec: it launches the runs itself). For each model size and
sync model it runs, alternately, ``--reps`` times each:

- the job under MPI: ``mpiexec -n N+1 python -m ebsp_mpi train`` (the server and N workers);
- the single-process trainer on the same job with ``sync.workers = N`` (the same N gradients per step,
  the same samples, no messages): the reference;
- PyTorch DDP (gloo) on the same job, N processes (``bench/ddp.py``), where ``torch`` imports.

``--device cuda`` trains every run of ours on CuPy (``backend = "cupy"``, every worker on the one
GPU, the server on the CPU as always) and puts a single-process PyTorch loop of the same model, batch
and optimizer on the same GPU (``bench/torch_peer.py``) in DDP's place.

Sizes: ``small`` is the digits MLP 64-128-64-10 at batch 32 (latency-bound: a message round trip
costs more than the gradient); ``large`` an MLP 784-1024-256-10 (1,068,810 parameters) on synthetic
data at batch 64 (bandwidth-bound); ``cnn`` the LeNet-like CNN (3x3 convolutions of 32 and 64
channels, each with a 2x2 pool, a dense layer of 128; 545,098 parameters) on 4,096 random 3x32x32
images with random labels, written to a temporary HDF5 file, at batch 64 (compute-bound, for GPUs:
not in the default sizes). Every run writes traces as users' runs do, evaluates only at the end
(outside the clock) and has no injected stragglers; every process has one BLAS thread. The figure is
the median of the repetitions; ``--json`` writes each median with its reference.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..helptext import plain
from .report import print_table, record
from ..safe_text import integer, number

UNIT = "samples/s"
SIZES = {
    "small": ["model.hidden=[128,64]", "data.batch_size=32", "stop.iterations=300"],
    "large": ["data.name=synthetic", "data.synthetic_features=784", "data.synthetic_samples=10000",
              "model.hidden=[1024,256]", "data.batch_size=64", "stop.iterations=60"],
    "cnn": ["data.name=hdf5", "data.path={images}", "model.kind=cnn", "model.channels=[32,64]",
            "model.hidden=[128]", "data.batch_size=64", "stop.iterations=60"],
}
COMMON = ["stop.epochs=0", "straggler.enabled=false", "eval.every_seconds=1e9"]
IMAGES = (4096, 3, 32, 32)   # the cnn size's random images: samples, channels, height, width
DDP, TORCH_GPU = "PyTorch DDP (gloo)", "PyTorch (cuda)"
#: targets (docs/performance.md): the small MLP under BSP is latency-bound, where a slow message loop
#: shows first (it once ran at 0.07x the single process and 1.4x DDP); on a GPU, BSP with one worker
#: against PyTorch's own loop on the same device
TARGETS = {("small", "bsp", "single process"): (">=", 0.30), ("small", "bsp", DDP): (">=", 5.0),
           ("large", "bsp", TORCH_GPU): (">=", 0.7), ("cnn", "bsp", TORCH_GPU): (">=", 0.7)}


@contextlib.contextmanager
def random_images(shape=IMAGES, classes: int = 10, seed: int = 0):
    """A temporary HDF5 file of random float32 images and labels (the ``cnn`` size's data): its path."""
    import h5py

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="ebsp-bench-images-") as tmp:
        path = Path(tmp) / "images.h5"
        with h5py.File(path, "w") as f:
            f["x"] = rng.standard_normal(shape, dtype=np.float32)
            f["y"] = rng.integers(0, classes, shape[0]).astype(np.int64)
        yield path


def size_overrides(size: str, images: Path | None, device: str) -> list[str]:
    """The `size`'s keys, with the image file's path filled in, and the backend for `device`."""
    keys = [k.replace("{images}", str(images)) for k in SIZES[size]]
    return keys + COMMON + (["backend=cupy"] if device == "cuda" else [])


def _env(mpiexec: list[str] | None = None) -> dict:
    """One BLAS thread per process; for Open MPI's launcher run as root, its permission too."""
    import os

    from ..runtime.transport.env import cap_blas_threads, launch_env

    env = cap_blas_threads(dict(os.environ))
    return launch_env(mpiexec, env) if mpiexec else env


def _run(cmd: list[str], timeout: float, env: dict, who: str) -> str:
    """Run one trainer (`who` names it in errors); its standard output. The command and every process
    it starts (mpiexec's ranks, DDP's spawned workers) are killed once `timeout` seconds have passed.

    Raises
    ------
    UsageError
        The run did not finish within ``--timeout`` (one line).
    RuntimeError
        It exited with an error (its last lines of standard error).
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise UsageError(f"bench train: {who} did not finish within --timeout {timeout:g} s; "
                         f"give it longer") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{who} exited {proc.returncode}:\n{err[-2000:]}")
    return out


def _run_summary(cmd: list[str], timeout: float, env: dict, who: str) -> dict:
    """Run one training command in a fresh run directory; its summary.json."""
    with tempfile.TemporaryDirectory(prefix="ebsp-bench-train-") as tmp:
        out = Path(tmp) / "run"
        _run([*cmd, "-q", "--out", str(out)], timeout, env, who)
        return json.loads((out / "summary.json").read_text())


def mpi_run(mpiexec: list[str], workers: int, overrides: list[str], timeout: float) -> float:
    sets = [a for o in overrides for a in ("--set", o)]
    from ..runtime.transport.env import launch_command

    cmd = [*launch_command(mpiexec, workers + 1), sys.executable, "-m", "ebsp_mpi", "train", *sets]
    return _run_summary(cmd, timeout, _env(mpiexec), "the MPI run")["samples_per_second"]


def single_run(workers: int, overrides: list[str], timeout: float) -> float:
    sets = [a for o in overrides + [f"sync.workers={workers}"] for a in ("--set", o)]
    return _run_summary([sys.executable, "-m", "ebsp_mpi", "train", *sets], timeout, _env(),
                        "the single-process trainer")["samples_per_second"]


def ddp_run(workers: int, overrides: list[str], timeout: float) -> float:
    sets = [a for o in overrides for a in ("--set", o)]
    out = _run([sys.executable, "-m", "ebsp_mpi.bench.ddp", "--workers", str(workers), *sets], timeout, _env(),
               "the DDP peer")
    return json.loads(out.strip().splitlines()[-1])["samples_per_second"]


def torch_gpu_run(overrides: list[str], timeout: float) -> float:
    sets = [a for o in overrides for a in ("--set", o)]
    out = _run([sys.executable, "-m", "ebsp_mpi.bench.torch_peer", "--device", "cuda", *sets], timeout, _env(),
               "the PyTorch peer")
    return json.loads(out.strip().splitlines()[-1])["samples_per_second"]


def torch_missing(device: str) -> str:
    """Why PyTorch cannot be the peer on `device` ("" when it can)."""
    try:
        import torch
    except ImportError:
        return "torch does not import (pip install torch)"
    if device == "cuda" and not torch.cuda.is_available():
        return "PyTorch sees no CUDA device (a CPU-only build?)"
    return ""


def measure(args, mpiexec: list[str], with_torch: bool, images: Path | None) -> tuple[list[dict], dict, dict]:
    """The records (medians), their targets by case, and per case every repetition's figures."""
    records, targets, spreads = [], {}, {}
    for size in args.sizes:
        for model in args.models:
            overrides = size_overrides(size, images, args.device) + [f"sync.model={model}"] + args.set
            runs = {"mpi": lambda o=overrides: mpi_run(mpiexec, args.workers, o, args.timeout),
                    "single process": lambda o=overrides: single_run(args.workers, o, args.timeout)}
            if with_torch and args.device == "cuda":
                runs[TORCH_GPU] = lambda o=overrides: torch_gpu_run(o, args.timeout)
            elif with_torch:
                runs[DDP] = lambda o=overrides: ddp_run(args.workers, o, args.timeout)
            figures: dict[str, list[float]] = {name: [] for name in runs}
            for rep in range(args.reps):
                for name, run in runs.items():
                    figures[name].append(run())
                print(f"  {size} {model} rep {rep + 1}/{args.reps}: " +
                      ", ".join(f"{name} {values[-1]:,.0f}" for name, values in figures.items()), flush=True)
            case = f"{size}, {model.upper()}, {args.workers} workers" + (" (cuda)" if args.device == "cuda" else "")
            spreads[case] = figures
            for reference in [name for name in runs if name != "mpi"]:
                row = record("train", f"{case} / {reference}", statistics.median(figures["mpi"]), UNIT,
                             reference, statistics.median(figures[reference]))
                records.append(row)
                # on a GPU the target is one worker's: four share the device, PyTorch has it alone
                if (size, model, reference) in TARGETS and (reference != TORCH_GPU or args.workers == 1):
                    targets[row["case"]] = TARGETS[(size, model, reference)]
    return records, targets, spreads


def main(argv=None, records: list | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi bench train", description=plain(__doc__.split("\n\n")[0]))
    parser.add_argument("--workers", type=integer, default=4, help="workers (the MPI run has one rank more)")
    parser.add_argument("--reps", type=integer, default=3, help="runs of each trainer, alternately (median)")
    parser.add_argument("--sizes", default="small,large", help="comma-separated: small, large, cnn")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: our runs on CuPy, PyTorch's loop on the same GPU (default cpu)")
    parser.add_argument("--models", default="bsp,asp", help="comma-separated sync models")
    parser.add_argument("--no-ddp", action="store_true",
                        help="leave PyTorch (DDP, or its loop on the GPU) out even where torch imports")
    parser.add_argument("--timeout", type=number, default=300.0, help="seconds one run may take")
    parser.add_argument("--mpiexec", help="the launcher (default: as the sweeps find it)")
    parser.add_argument("--set", dest="set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of every run's job")
    args = parser.parse_args(argv)
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [s for s in args.sizes if s not in SIZES]
    if args.workers < 1 or args.reps < 1:
        raise UsageError(f"bench train: --workers {args.workers}, --reps {args.reps}: each must be at least 1")
    if unknown:
        raise UsageError(f"bench train: --sizes takes {', '.join(SIZES)} (got {', '.join(map(repr, unknown))})")
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise UsageError(f"bench train: --timeout {args.timeout:g}: must be a number of seconds above 0")
    from ..config import load_job
    from ..runtime.transport.env import find_mpiexec

    for size in args.sizes:  # a bad --set or sync model is one line, before anything runs
        for model in args.models:
            load_job(None, size_overrides(size, Path("images.h5"), "cpu") + [f"sync.model={model}"] + args.set)
    if args.device == "cuda":
        from ..backend import resolve_backend

        resolve_backend("cupy")   # one line where CuPy sees no GPU, before anything runs
    missing = "--no-ddp" if args.no_ddp else torch_missing(args.device)
    if missing:
        print(f"PyTorch left out: {missing}")
    with contextlib.ExitStack() as stack:
        images = stack.enter_context(random_images()) if "cnn" in args.sizes else None
        found, targets, spreads = measure(args, find_mpiexec(args.mpiexec), not missing, images)
    print_table(f"training throughput (median of {args.reps} runs each, alternately)", found, targets)
    print("every run (samples/s): " + "; ".join(
        f"{case}: " + ", ".join(f"{name} " + "/".join(f"{v:,.0f}" for v in values) for name, values in figs.items())
        for case, figs in spreads.items()))
    if records is not None:
        records += found
    return 0
