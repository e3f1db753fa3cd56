"""Run outputs shared by the single-process trainer and the MPI server: the run directory,
``summary.json`` (one builder, one key set), ``model.h5`` and the time-to-accuracy bookkeeping
(docs/design.md, "Run outputs")."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from . import __version__
from .config import to_dict
from .errors import OutputError, UsageError
from .safe_text import clean_text, clean_tree, path_label


#: the file in a run directory that the run holds locked while it writes there
LOCK_FILE = ".lock"
_held_locks: list = []  # open lock files: the kernel drops a lock when its process ends, however


def make_run_dir(out: str | None, name: str, resume: bool = False) -> Path:
    """``out`` if given, else ``runs/<name>-<UTC timestamp>`` (the name as a label,
    ``safe_text.path_label``); created, never overwritten silently.

    The run holds an exclusive lock on ``DIR/.lock`` (``flock``) for as long as its process lives, so
    a second run given the same directory at the same time is refused, not interleaved with the first;
    an existing directory that holds anything else is refused so that no earlier run's files are lost,
    unless the run `resume`s the run that wrote them (``train --resume DIR``).

    Raises
    ------
    FileExistsError
        The directory is in use by another run, or not empty.
    UsageError
        The directory cannot be created or written (a path under a file, no permission, a read-only
        file system).
    """
    path = Path(out) if out else Path("runs") / f"{path_label(name)}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    if resume and not path.is_dir():
        raise UsageError(f"--resume {path}: not a run directory")
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        _lock(path)
    except FileExistsError:  # the lock is taken
        raise
    except OSError as e:
        raise UsageError(f"--out {path}: cannot create or write the run directory: {e.strerror or e}") from None
    if not resume and any(p.name != LOCK_FILE for p in path.iterdir()):
        raise FileExistsError(f"output directory {path} exists and is not empty; choose another --out")
    return path


def remove_if_unused(run_dir: Path) -> None:
    """Remove `run_dir` if it holds nothing but its lock file: a run that failed in its set-up (a bad
    dataset file, say) leaves no empty directory behind for the next run to trip over."""
    with contextlib.suppress(OSError):
        if {p.name for p in run_dir.iterdir()} <= {LOCK_FILE}:
            release_lock(run_dir)  # no run left to guard
            (run_dir / LOCK_FILE).unlink(missing_ok=True)
            run_dir.rmdir()


def release_lock(run_dir: Path) -> None:
    """Let go of `run_dir`'s lock once its run has written all it writes: a process that runs many
    (a sweep of simulations, the tests) holds no file open for each finished one."""
    for f in [f for f in _held_locks if Path(f.name).parent == Path(run_dir)]:
        _held_locks.remove(f)
        f.close()


def _lock(run_dir: Path) -> None:
    """Take the run directory's lock for the life of this process; FileExistsError if another holds it.
    Where the file system has no ``flock`` (some NFS or Lustre mounts) the run goes on unlocked."""
    f = open(run_dir / LOCK_FILE, "a+")  # held open on purpose: the lock lasts as long as the file is open
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise FileExistsError(f"output directory {run_dir} is in use by another run; choose another --out") \
            from None
    except OSError:  # no locking on this file system
        pass
    _held_locks.append(f)


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


#: Every key of ``summary.json``, in the order written; the single-process trainer and the server give
#: all of them (a key that does not apply to a run is null).
SUMMARY_KEYS = ("name", "sync", "workers", "world_size", "backend", "wall_seconds", "iterations", "wait_seconds",
                "compute_seconds", "injected_delay_seconds", "barriers", "rejected_pushes", "versions",
                "train_loss", "test_loss", "test_accuracy", "samples_per_second", "time_to_accuracy", "evals",
                "divergence", "hybrid", "bytes", "osdp", "package_version", "mpi_library", "config", "run_id",
                "identity", "accepted_mismatch")


def build_summary(job, *, sync: str, world_size: int, backend: str, wall_seconds: float, iterations: list[int],
                  wait_seconds: list[float], compute_seconds: list[float] | None,
                  injected_delay_seconds: list[float] | None, barriers: int, rejected_pushes: int, versions: int,
                  train_loss: float | None, test_loss: float, test_accuracy: float, targets: AccuracyTargets,
                  evals: list[tuple[float, int, float, float]], mpi_library: str | None, hybrid: dict | None = None,
                  byte_counts: list[dict] | None = None, osdp: dict | None = None,
                  divergence: dict | None = None) -> dict:
    """The run's ``summary.json`` as a dict with exactly :data:`SUMMARY_KEYS`.

    Parameters
    ----------
    job : JobConfig
        The resolved job (``name``, ``data.batch_size`` and the whole config are taken from it).
    iterations, wait_seconds, compute_seconds, injected_delay_seconds : list, one entry per worker
        Iterations done, and seconds blocked on pulls, in forward + backward, and slept to emulate a
        straggler; None where the run has no such figure (the single process injects no delay).
    evals : list of (t, version, test_loss, test_acc)
        Every evaluation, in order; the last one is the final model's.
    mpi_library : str or None
        ``MPI.Get_library_version()``'s first line; None without MPI.
    hybrid : dict or None
        ``comm.hybrid``'s plan: the scheme of each weight tensor and the cost model's bytes; None
        without MPI.
    byte_counts : list of dict or None
        Per rank (the server first), the payload bytes it sent and received per tensor and scheme;
        None without MPI.
    osdp : dict or None
        With an OSDP plan (``osdp.plan``): the plan file, whether ranks shared cores
        (``ranks_share_cores``: the predicted time assumes a core per rank), its prediction
        (``peak_bytes``, ``iteration_s``) and per worker what was measured (``peak_bytes``;
        ``iteration_s``, the median start-to-start time of its last 1024 iterations; ``transfer_wait_s``,
        the median seconds one of them waited on on-demand fetches and pushes; ``transfer_messages``, their messages per
        iteration); None without a plan.
    divergence : dict or None
        What ``divergence.DivergenceWatch`` found (``seen``: ``chance`` or ``loss``, ``t``, ``version``,
        ``mean_staleness``, ``message``, ...); None when the run showed no sign of diverging.

    A float that is not finite (a diverged loss) is written as null, so the file is strict JSON.
    """
    return {
        "name": job.name,
        "sync": sync,
        "workers": len(iterations),
        "world_size": world_size,
        "backend": backend,
        "wall_seconds": wall_seconds,
        **_per_worker(iterations, wait_seconds, compute_seconds, injected_delay_seconds),
        "barriers": int(barriers),
        "rejected_pushes": int(rejected_pushes),
        "versions": int(versions),
        "train_loss": _finite_or_none(train_loss),
        "test_loss": _finite_or_none(test_loss),
        "test_accuracy": _finite_or_none(test_accuracy),
        "samples_per_second": sum(iterations) * job.data.batch_size / wall_seconds if wall_seconds > 0 else 0.0,
        "time_to_accuracy": targets.as_dict(),
        "evals": _eval_rows(evals),
        "divergence": divergence,
        "hybrid": hybrid,
        "bytes": byte_counts,
        "osdp": osdp,
        "package_version": __version__,
        "mpi_library": mpi_library,
        "config": to_dict(job),
        **identity_keys(None),
    }


def identity_keys(identity: dict | None) -> dict:
    """The summary's keys of the run's identity (``ebsp_mpi.identity``): its id, the identity, and the
    mismatches the user accepted (``--accept-mismatch``), null where the run has none."""
    identity = identity or {}
    return {"run_id": identity.get("run_id"), "identity": identity or None,
            "accepted_mismatch": identity.get("accepted") or None}


def _per_worker(iterations, wait_seconds, compute_seconds, injected_delay_seconds) -> dict:
    """The summary's lists of one entry per worker, in :data:`SUMMARY_KEYS`' order (None: no such figure)."""
    return {"iterations": [int(i) for i in iterations],
            "wait_seconds": list(wait_seconds),
            "compute_seconds": None if compute_seconds is None else list(compute_seconds),
            "injected_delay_seconds": None if injected_delay_seconds is None else list(injected_delay_seconds)}


def _eval_rows(evals: list[tuple[float, int, float, float]]) -> list[dict]:
    return [{"t": t, "version": int(v), "test_loss": _finite_or_none(loss), "test_acc": _finite_or_none(acc)}
            for t, v, loss, acc in evals]


def describe_run(summary: dict, run_dir) -> str:
    """One line on how a run ended, for the terminal."""
    def fmt(x):
        return "n/a" if x is None else f"{x:.4f}"

    # a single process pushes nothing: it has no pushes to reject
    rejected = f", {summary['rejected_pushes']} rejected pushes" if summary["world_size"] > 1 else ""
    return (f"{summary['sync']}: {summary['workers']} worker(s), {summary['wall_seconds']:.1f} s, test accuracy "
            f"{fmt(summary['test_accuracy'])}, test loss {fmt(summary['test_loss'])}{rejected} -> {run_dir}")


def training_failed(summary: dict) -> str | None:
    """Why a run that ran to its end did not train, or None: every push was rejected (NaN or Inf in
    every gradient), or its loss is not a finite number. Such a run must not exit 0."""
    pushes = sum(summary["iterations"])
    if pushes and summary["rejected_pushes"] >= pushes:
        return (f"all {pushes} pushes were rejected (NaN or Inf in every gradient): nothing was trained; "
                f"lower optim.lr or check the data")
    if pushes and (summary["test_loss"] is None or summary["train_loss"] is None):
        return "the loss is not a finite number (the training diverged); lower optim.lr or check the data"
    return None


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def write_summary(run_dir: Path, summary: dict) -> Path:
    """Write ``summary.json`` atomically (a crash mid-write never leaves half a file), as strict JSON:
    a float that is not finite is written as null, and every string goes through
    :func:`~ebsp_mpi.safe_text.clean_text` (the MPI library's version, paths and names in the job)."""
    path = run_dir / "summary.json"
    text = json.dumps(_strict(clean_tree(summary)), indent=2, default=_jsonable, allow_nan=False) + "\n"
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return path


@contextlib.contextmanager
def atomic_path(path: Path):
    """Yield a temporary path beside `path`, then rename it to `path`; on any failure remove it and
    raise :class:`OutputError` for an OSError (a full disk, a quota), so that nothing half-written
    stays and the user reads one line."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        # h5py, closing a file whose write failed, raises a RuntimeError in the handling of the OSError
        cause = next((x for x in (e, e.__context__) if isinstance(x, OSError)), None)
        if cause is not None:
            raise OutputError(f"cannot write {path}: {os_error_text(cause)}") from None
        raise


def os_error_text(e: OSError) -> str:
    """What went wrong, in a few words: the system's text for the error number where there is one
    (h5py's messages run over several lines of HDF5's error stack)."""
    return os.strerror(e.errno) if e.errno else str(e).splitlines()[0]


def _strict(value):
    """`value` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def write_model(run_dir: Path, tensors: dict[str, np.ndarray], *, version: int, step: int,
                attrs: dict | None = None) -> Path:
    """``model.h5``: one dataset per named tensor, each with the SHA-256 of its values (attribute
    ``sha256``, checked by :func:`read_model`); attributes ``version`` and ``step`` (and `attrs`)."""
    path = run_dir / "model.h5"
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for name, array in tensors.items():
            values = np.asarray(array)
            f.create_dataset(name, data=values).attrs["sha256"] = array_digest(values)
        f.attrs["version"] = int(version)
        f.attrs["step"] = int(step)
        f.attrs["package_version"] = __version__
        for key, value in (attrs or {}).items():
            if isinstance(value, (str, bytes)):
                f.attrs[key] = clean_text(value)
            elif isinstance(value, (int, float)):
                f.attrs[key] = value
            else:
                f.attrs[key] = json.dumps(clean_tree(value), default=_jsonable)
    return path


def array_digest(values: np.ndarray) -> str:
    """SHA-256 of an array's dtype, shape and values (hex): what ``model.h5`` and ``checkpoint.h5``
    keep beside each array, to refuse a damaged file."""
    a = np.ascontiguousarray(values)
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a)
    return h.hexdigest()


def read_model(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """The tensors and attributes of a ``model.h5``, each tensor checked against the checksum written
    with it (a file written before the checksums has none to check).

    Raises
    ------
    UsageError
        The file is missing or unreadable, or a tensor does not match its checksum (a damaged file):
        one line naming the file and the tensor.
    """
    tensors: dict[str, np.ndarray] = {}
    damaged: list[str] = []

    def take(name: str, obj) -> None:
        if isinstance(obj, h5py.Dataset):
            tensors[name] = obj[()]
            stored = obj.attrs.get("sha256")
            if stored is not None and array_digest(tensors[name]) != stored:
                damaged.append(name)

    try:
        with h5py.File(path, "r") as f:
            f.visititems(take)
            attrs = dict(f.attrs)
    except (OSError, KeyError, ValueError) as e:
        raise UsageError(f"{path}: not a readable model file ({type(e).__name__}: {e})") from None
    if damaged:
        raise UsageError(f"{path}: tensor {', '.join(damaged)} does not match the checksum written with it: "
                         f"the file is damaged")
    return tensors, attrs


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, Path):
        return str(v)
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")
