"""Checkpoints of a run, and the job that ``train --resume DIR`` continues (DESIGN.md, "Checkpoint and
resume").

``DIR/checkpoint.h5`` holds what the server (or the single-process trainer) needs to go on as if the
run had not stopped: the parameters and the optimizer's velocity; the model version (the optimizer
steps taken, which the learning-rate schedule counts); per worker the iterations whose pushes were
taken in, and the seconds of compute, waiting and injected delay they took; the sync policy's state;
the evaluations so far and the accuracy targets reached; the run's clock (seconds of training); and the
resolved job. A worker's data position and random state follow from its iteration count: its batches
and its straggler jitter are drawn from ``(seed, worker, epoch)`` and ``(seed, worker, iteration)``.

It is written whole or not at all: into a temporary file renamed over the previous checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from .config import ConfigError, JobConfig, apply_overrides, job_from_dict, load_job, to_dict
from .errors import UsageError
from .outputs import atomic_path

CHECKPOINT_FILE = "checkpoint.h5"
FORMAT = 1
#: per-worker figures a checkpoint carries: seconds of compute, waiting and injected delay so far, and the
#: last minibatch loss (NaN before the first push)
TOTALS = ("compute_s", "wait_s", "injected_delay_s")
LAST_LOSS = "last_loss"
#: keys a resumed job may change: how long it runs and how often it checkpoints
RESUMABLE_CHANGES = ("stop.", "checkpoint.")


@dataclass
class Checkpoint:
    """A run's state at a point where it can go on (see the module docstring)."""

    params: np.ndarray
    velocity: np.ndarray
    version: int
    run_seconds: float
    iterations: np.ndarray  # per worker: pushes taken in (applied or rejected)
    totals: dict  # TOTALS and LAST_LOSS -> float64 array, one entry per worker
    rejected: int = 0
    policy: dict = field(default_factory=dict)
    evals: list = field(default_factory=list)  # (t, version, test loss, test accuracy)
    reached: dict = field(default_factory=dict)  # accuracy target -> first second it was reached
    config: dict = field(default_factory=dict)


def write_checkpoint(run_dir: Path, ckpt: Checkpoint) -> Path:
    """Write ``run_dir/checkpoint.h5`` atomically; OutputError (one line) if the disk refuses."""
    path = Path(run_dir) / CHECKPOINT_FILE
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("params", data=np.asarray(ckpt.params))
        f.create_dataset("velocity", data=np.asarray(ckpt.velocity))
        f.create_dataset("iterations", data=np.asarray(ckpt.iterations, dtype=np.int64))
        for name in (*TOTALS, LAST_LOSS):
            f.create_dataset(f"totals/{name}", data=np.asarray(ckpt.totals[name], dtype=np.float64))
        f.attrs.update(format=FORMAT, version=int(ckpt.version), run_seconds=float(ckpt.run_seconds),
                       rejected=int(ckpt.rejected), policy_json=json.dumps(ckpt.policy),
                       evals_json=json.dumps([list(e) for e in ckpt.evals]),
                       reached_json=json.dumps({repr(float(k)): v for k, v in ckpt.reached.items()}),
                       config_json=json.dumps(ckpt.config))
    return path


def read_checkpoint(run_dir, arrays: bool = True) -> Checkpoint:
    """The checkpoint of the run in `run_dir`; with ``arrays=False`` without the parameters and the
    velocity (empty arrays), for a quick look at the job and the iterations.

    Raises
    ------
    UsageError
        When `run_dir` holds no readable checkpoint of this format.
    """
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        raise UsageError(f"--resume {run_dir}: no {CHECKPOINT_FILE} there (a run writes one every "
                         f"checkpoint.every_seconds, on SIGTERM and at its end)")
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise UsageError(f"{path}: checkpoint format {f.attrs.get('format')!r}, expected {FORMAT}")
            empty = np.empty(0, dtype=np.float32)
            return Checkpoint(
                params=f["params"][()] if arrays else empty, velocity=f["velocity"][()] if arrays else empty,
                version=int(f.attrs["version"]), run_seconds=float(f.attrs["run_seconds"]),
                iterations=f["iterations"][()],
                totals={name: f[f"totals/{name}"][()] for name in (*TOTALS, LAST_LOSS)},
                rejected=int(f.attrs["rejected"]), policy=json.loads(f.attrs["policy_json"]),
                evals=[tuple(e) for e in json.loads(f.attrs["evals_json"])],
                reached={float(k): v for k, v in json.loads(f.attrs["reached_json"]).items()},
                config=json.loads(f.attrs["config_json"]))
    except (OSError, KeyError, ValueError) as e:
        raise UsageError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from None


def resume_job(run_dir, job_file: str | None, overrides) -> tuple[JobConfig, Checkpoint]:
    """The job a resumed run continues, and its checkpoint (without arrays).

    The job is the checkpoint's own. `job_file` and `overrides`, where given, must describe the same
    job: only the keys under ``stop.`` and ``checkpoint.`` may differ (to run longer, or checkpoint
    more often); any other difference is refused, naming the keys.
    """
    ckpt = read_checkpoint(run_dir, arrays=False)
    source = str(Path(run_dir) / CHECKPOINT_FILE)
    try:
        saved = job_from_dict(ckpt.config, source)
    except ConfigError as e:
        raise UsageError(f"--resume {run_dir}: the checkpoint's job does not load: {e}") from None
    if job_file is None and not overrides:
        return saved, ckpt
    given = load_job(job_file, overrides) if job_file is not None else \
        apply_overrides(job_from_dict(ckpt.config, source), overrides)
    changed = [key for key in _differing_keys(to_dict(saved), to_dict(given))
               if not key.startswith(RESUMABLE_CHANGES)]
    if changed:
        raise UsageError(f"--resume {run_dir}: the job differs from the checkpoint's in {', '.join(changed)}; "
                         f"a resumed run may change only stop.* and checkpoint.* (start a new run otherwise)")
    return given, ckpt


def _differing_keys(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            keys += _differing_keys(x, y, f"{prefix}{key}.")
        elif x != y:
            keys.append(f"{prefix}{key}")
    return keys
