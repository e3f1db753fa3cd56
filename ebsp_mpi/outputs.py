"""Run outputs shared by the single-process trainer and the MPI server: the run directory,
``summary.json``, ``model.h5`` and the time-to-accuracy bookkeeping (DESIGN.md, "Run outputs")."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from . import __version__


def make_run_dir(out: str | None, name: str) -> Path:
    """``out`` if given, else ``runs/<name>-<UTC timestamp>``; created, never overwritten silently.

    An existing non-empty directory is refused so that no earlier run's files are lost.
    """
    path = Path(out) if out else Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"output directory {path} exists and is not empty; choose another --out")
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class AccuracyTargets:
    """First wall second at which the evaluated test accuracy reached each target (``eval.targets``)."""

    targets: list[float]
    reached: dict = field(default_factory=dict)

    def observe(self, t: float, accuracy: float) -> None:
        for target in self.targets:
            if target not in self.reached and accuracy >= target:
                self.reached[target] = t

    def as_dict(self) -> dict:
        """JSON keys are the thresholds as text (``"0.95"``); a target never reached maps to null."""
        return {repr(float(t)): self.reached.get(t) for t in self.targets}


def write_summary(run_dir: Path, summary: dict) -> Path:
    """Write ``summary.json`` atomically (a crash mid-write never leaves half a file)."""
    path = run_dir / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=_jsonable) + "\n")
    os.replace(tmp, path)
    return path


def write_model(run_dir: Path, tensors: dict[str, np.ndarray], *, version: int, step: int,
                attrs: dict | None = None) -> Path:
    """``model.h5``: one dataset per named tensor; attributes ``version`` and ``step`` (and `attrs`)."""
    path = run_dir / "model.h5"
    tmp = path.with_suffix(".h5.tmp")
    with h5py.File(tmp, "w") as f:
        for name, array in tensors.items():
            f.create_dataset(name, data=np.asarray(array))
        f.attrs["version"] = int(version)
        f.attrs["step"] = int(step)
        f.attrs["package_version"] = __version__
        for key, value in (attrs or {}).items():
            f.attrs[key] = value if isinstance(value, (int, float, str)) else json.dumps(value, default=_jsonable)
    os.replace(tmp, path)
    return path


def read_model(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """The tensors and attributes of a ``model.h5``."""
    with h5py.File(path, "r") as f:
        tensors = {}
        f.visititems(lambda name, obj: tensors.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
        return tensors, dict(f.attrs)


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, Path):
        return str(v)
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")
