"""Checkpoints of a run, and the job that ``train --resume DIR`` continues (docs/design.md,
"Checkpoint and resume").

``DIR/checkpoint.h5`` holds what the server (or the single-process trainer) needs to go on as if the
run had not stopped: the parameters and the optimizer's velocity; the model version (the optimizer
steps taken, which the learning-rate schedule counts); per worker the iterations whose pushes were
taken in, and the seconds of compute, waiting and injected delay they took; the sync policy's state;
the evaluations so far and the accuracy targets reached; the run's clock (seconds of training); and the
resolved job. A worker's data position and random state follow from its iteration count: its batches
and its straggler jitter are drawn from ``(seed, worker, epoch)`` and ``(seed, worker, iteration)``.

It is written whole or not at all: into a temporary file renamed over the previous checkpoint. An MPI
run's server writes it first as ``checkpoint.pending.h5`` and renames that over ``checkpoint.h5`` only
once every worker has flushed its trace up to the iterations the checkpoint counts (``commit_checkpoint``):
a run killed in between resumes from the previous checkpoint, so that no trace row of the work a
checkpoint counts can be missing. A pending file left by a killed run is never read. Every
array carries the SHA-256 of its values (attribute ``sha256``), and the file the SHA-256 of its
attributes (``attrs_sha256``: the job, the counts, the policy's state) and of the OSDP plan file the job
names (``plan_sha256``): a damaged checkpoint, or a plan file replaced since, is refused in one line
instead of trained on. It also holds the run's identity (``identity_json``, ``ebsp_mpi.identity``): its
run id, and the job, dataset files and code it was made from, which ``--resume`` checks
(:func:`check_identity`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from .config import ConfigError, JobConfig, apply_overrides, job_from_dict, load_job, to_dict
from .errors import OutputError, UsageError
from .outputs import array_digest, atomic_path, os_error_text

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.h5"
#: a checkpoint written and not yet committed (``write_checkpoint(pending=True)``, ``commit_checkpoint``)
PENDING_FILE = "checkpoint.pending.h5"
FORMAT = 3  # 2: the SHA-256 of every array, of the attributes and of the OSDP plan file; 3: the run's identity
#: formats read: 1, written before the checksums, is read unverified (with a warning); 1 and 2 have no identity
READABLE = (1, 2, 3)
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
    #: SHA-256 of the OSDP plan file the run trains with ("" without one), as the run read it
    #: (``run_description.OsdpPlan.sha256``): the file is not read again to write a checkpoint
    plan_sha256: str = ""
    #: the run's identity (``identity.Identity.as_dict``); None in a checkpoint written before format 3
    identity: dict | None = None


def _attrs_digest(attrs: dict) -> str:
    """SHA-256 of a checkpoint's attributes (all but the digest itself), as canonical JSON."""
    plain = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in attrs.items() if k != "attrs_sha256"}
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()


def write_checkpoint(run_dir: Path, ckpt: Checkpoint, pending: bool = False) -> Path:
    """Write ``run_dir/checkpoint.h5`` atomically, with the checksums of the module docstring, or with
    `pending` ``run_dir/checkpoint.pending.h5``, for :func:`commit_checkpoint`; OutputError (one line)
    if the disk refuses."""
    path = Path(run_dir) / (PENDING_FILE if pending else CHECKPOINT_FILE)
    arrays = {"params": np.asarray(ckpt.params), "velocity": np.asarray(ckpt.velocity),
              "iterations": np.asarray(ckpt.iterations, dtype=np.int64),
              **{f"totals/{name}": np.asarray(ckpt.totals[name], dtype=np.float64) for name in (*TOTALS, LAST_LOSS)}}
    attrs = dict(format=FORMAT, version=int(ckpt.version), run_seconds=float(ckpt.run_seconds),
                 rejected=int(ckpt.rejected), policy_json=json.dumps(ckpt.policy),
                 evals_json=json.dumps([list(e) for e in ckpt.evals]),
                 reached_json=json.dumps({repr(float(k)): v for k, v in ckpt.reached.items()}),
                 config_json=json.dumps(ckpt.config), plan_sha256=ckpt.plan_sha256,
                 identity_json=json.dumps(ckpt.identity))
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for name, values in arrays.items():
            f.create_dataset(name, data=values).attrs["sha256"] = array_digest(values)
        f.attrs.update(attrs)
        f.attrs["attrs_sha256"] = _attrs_digest(attrs)
    return path


def commit_checkpoint(run_dir: Path) -> Path:
    """Make the pending checkpoint of :func:`write_checkpoint` the run's checkpoint (a rename)."""
    path = Path(run_dir) / CHECKPOINT_FILE
    try:
        os.replace(path.with_name(PENDING_FILE), path)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {os_error_text(e)}") from None
    return path


def read_checkpoint(run_dir, arrays: bool = True) -> Checkpoint:
    """The checkpoint of the run in `run_dir`, every part read checked against its checksum; with
    ``arrays=False`` without the parameters and the velocity (empty arrays, not read), for a quick look
    at the job and the iterations.

    Raises
    ------
    UsageError
        When `run_dir` holds no readable checkpoint of a known format, or a part of it does not match
        its checksum (a damaged file): one line naming the file and the part.
    """
    path = Path(run_dir) / CHECKPOINT_FILE
    if path.exists() and not path.is_file():
        raise UsageError(f"--resume {run_dir}: {path} is not a file (a directory?), so not a checkpoint")
    if not path.is_file():
        pending = (f"; its {PENDING_FILE} was never committed: the run stopped before every worker's trace "
                   f"held what it counts") if path.with_name(PENDING_FILE).is_file() else ""
        raise UsageError(f"--resume {run_dir}: no {CHECKPOINT_FILE} there (a run writes one every "
                         f"checkpoint.every_seconds, on SIGTERM and at its end){pending}")
    try:
        with h5py.File(path, "r") as f:
            fmt = f.attrs.get("format")
            if fmt not in READABLE:
                raise UsageError(f"{path}: checkpoint format {fmt!r}, expected one of {READABLE}")
            verified = fmt >= 2
            if not verified:
                log.warning("%s: a checkpoint of format %s, written before checkpoints carried checksums: "
                            "it is read unverified", path, fmt)
            else:
                attrs = {k: f.attrs[k] for k in f.attrs}
                if _attrs_digest(attrs) != attrs.get("attrs_sha256"):
                    raise UsageError(_damaged(path, "its attributes (the job, the counts, the policy's state) do not "
                                                     "match the checksum written with them"))

            def read(name: str) -> np.ndarray:
                values = f[name][()]
                if verified and array_digest(values) != f[name].attrs.get("sha256"):
                    raise UsageError(_damaged(path, f"the array {name!r} does not match the checksum written with it"))
                return values

            empty = np.empty(0, dtype=np.float32)
            ckpt = Checkpoint(
                params=read("params") if arrays else empty, velocity=read("velocity") if arrays else empty,
                version=int(f.attrs["version"]), run_seconds=float(f.attrs["run_seconds"]),
                iterations=read("iterations"),
                totals={name: read(f"totals/{name}") for name in (*TOTALS, LAST_LOSS)},
                rejected=int(f.attrs["rejected"]), policy=json.loads(f.attrs["policy_json"]),
                evals=[tuple(e) for e in json.loads(f.attrs["evals_json"])],
                reached={float(k): v for k, v in json.loads(f.attrs["reached_json"]).items()},
                config=json.loads(f.attrs["config_json"]), plan_sha256=str(f.attrs.get("plan_sha256", "")),
                identity=json.loads(f.attrs["identity_json"]) if "identity_json" in f.attrs else None)
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise UsageError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from None
    _check_counts(path, ckpt)
    return ckpt


def _check_counts(path: Path, ckpt: Checkpoint) -> None:
    """The counts a resume trusts agree with each other: a worker's iterations are its pushes in the
    policy's state, and every per-worker total has one value a worker. A checksum only says the file is
    as written; a checkpoint written unverified (format 1) or by a faulty writer could still disagree,
    and the run would resume on counts that are not the model's."""
    iterations = [int(i) for i in ckpt.iterations]
    done = ckpt.policy.get("done") if isinstance(ckpt.policy, dict) else None
    if done is not None and [int(d) for d in done] != iterations:
        raise UsageError(_damaged(path, f"its iterations {iterations} disagree with the sync policy's pushes "
                                        f"{[int(d) for d in done]}"))
    for name, values in ckpt.totals.items():
        if len(values) != len(iterations):
            raise UsageError(_damaged(path, f"its total {name!r} has {len(values)} values for "
                                            f"{len(iterations)} workers"))


def _damaged(path: Path, what: str) -> str:
    return f"{path}: {what}: the checkpoint is damaged; resume from a copy of the run directory, or start a new run"


def resume_job(run_dir, job_file: str | None, overrides,
               accept: frozenset = frozenset()) -> tuple[JobConfig, Checkpoint]:
    """The job a resumed run continues, and its checkpoint (without arrays).

    The job is the checkpoint's own. `job_file` and `overrides`, where given, must describe the same
    job: only the keys under ``stop.`` and ``checkpoint.`` may differ (to run longer, or checkpoint
    more often). Any other difference is the ``job`` piece of the run's identity differing: refused in
    one line naming the keys, unless `accept` holds ``job``; even then the keys that shape what the
    checkpoint holds (:data:`STATE_KEYS`: the parameters, the data each worker reads, the policy's
    state) are refused.
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
    then, now = to_dict(saved), to_dict(given)
    changed = [key for key in _differing_keys(then, now) if not key.startswith(RESUMABLE_CHANGES)]
    if not changed:
        return given, ckpt
    where = f"--resume {run_dir}"
    first = changed[0]
    values = f"{first} = {_value_at(then, first)!r} then, {_value_at(now, first)!r} now"
    if "job" not in accept:
        raise UsageError(f"{where}: the job differs from the run's in {', '.join(changed)} ({values}); a resumed "
                         f"run may change only stop.* and checkpoint.*: start a new run, or give "
                         f"--accept-mismatch job to go on with this job (the summary records it)")
    fixed = [key for key in changed if key.startswith(STATE_KEYS)]
    if fixed:
        raise UsageError(f"{where}: the job differs from the run's in {', '.join(fixed)} ({values}), which shape "
                         f"what the checkpoint holds: no run can go on from it with that change, even with "
                         f"--accept-mismatch job; start a new run")
    return given, ckpt


#: keys a resumed run can never change, even with ``--accept-mismatch job``: the parameters' shapes,
#: the data each worker reads at each iteration, the policy whose state the checkpoint holds
STATE_KEYS = ("model.", "data.", "sync.", "seed", "runtime.servers", "osdp.")


def _value_at(config: dict, key: str):
    for part in key.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


def check_identity(run_dir, job: JobConfig, ckpt: Checkpoint, accept: frozenset = frozenset()):
    """The run in `run_dir` must be the one its checkpoint describes, made from the dataset files and
    code there are now (``ebsp_mpi.identity``): its run id against every trace and its summary, the
    dataset files' fingerprints, the code version. The job was checked by :func:`resume_job`. Returns
    the identity the resumed run goes on with; a piece that differs and is not in `accept` is
    refused in one line naming it and both values."""
    from . import identity
    from .trace.writer import trace_path

    where = f"--resume {run_dir}"
    recorded = identity.Identity.from_dict(ckpt.identity)
    if ckpt.identity is None:  # a checkpoint before identities: its job is recorded all the same
        recorded = identity.Identity(run_id=None, job=identity.job_fingerprint(ckpt.config), data=None, code=None)
    now = identity.current(to_dict(job))
    accepted = {}
    for path, found in _run_ids(run_dir, trace_path):
        if found != recorded.run_id:
            if "run" not in accept:
                raise UsageError(identity.mismatch_line(where, "run", recorded.run_id, found, f" ({path})"))
            accepted["run"] = {"recorded": recorded.run_id, "now": found}
            break
    accepted.update(identity.check(where, recorded, now, accept, pieces=("data", "code")))
    if now.job != recorded.job:  # the keys resume_job let through (or a checkpoint's job edited by its writer)
        accepted["job"] = {"recorded": recorded.job, "now": now.job}
    return identity.continued(recorded, now, accepted)


def _run_ids(run_dir, trace_path) -> list[tuple[str, str | None]]:
    """(file, run id it carries) of the run's summary (if any) and every rank's trace there is. A
    summary that does not read as JSON is no other run's: the resumed run writes it anew."""
    run_dir, found = Path(run_dir), []
    summary = run_dir / "summary.json"
    try:
        doc = json.loads(summary.read_text()) if summary.is_file() else None
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict):
        found.append((str(summary), doc.get("run_id")))
    traces = sorted(trace_path(run_dir, 0).parent.glob("rank-*.h5"))
    for path in traces:
        try:
            with h5py.File(path, "r") as f:
                run_id = f.attrs.get("run_id")
        except OSError:
            continue  # check_traces_resumable names it
        found.append((str(path), run_id.decode() if isinstance(run_id, bytes) else run_id))
    return found


def check_traces_resumable(run_dir, job: JobConfig, workers: int, world_size: int) -> None:
    """The traces a resumed run appends to must be whole, and every server's must be there: a server's
    trace holds the pushes, barriers and evaluations before the checkpoint, and a new one would start
    where the checkpoint is, with nothing naming the gap (a missing worker's trace is recorded as
    ``lost_iterations`` instead, since its iterations are counted in the server's pushes). A file that
    does not open would fail its rank's set-up with a traceback."""
    if not job.trace.enabled:
        return
    from .trace.writer import trace_path

    for rank in range(job.runtime.servers + workers):
        path = trace_path(run_dir, rank)
        if not path.exists():
            if rank < job.runtime.servers and world_size > 1:  # the single-process trainer has no server
                raise UsageError(f"--resume {run_dir}: the trace of server rank {rank}, {path}, is missing; it holds "
                                 f"the run's pushes before the checkpoint: put it back, or start a new run")
            continue
        try:
            with h5py.File(path, "r"):
                pass
        except OSError as e:
            raise UsageError(f"--resume {run_dir}: the trace {path} does not open ({e}); put back a whole copy, "
                             f"or remove it (a worker's: its iterations are recorded as lost)") from None


def check_plan_unchanged(run_dir, ckpt: Checkpoint, sha256: str) -> None:
    """The OSDP plan file a resumed run reads (its SHA-256 now: `sha256`) must be the one the run
    trained with: the same path with other contents would place other layers on demand, or slice them
    otherwise."""
    plan = (ckpt.config.get("osdp") or {}).get("plan") or ""
    if not plan or not ckpt.plan_sha256:  # no plan, or a checkpoint of format 1
        return
    if not sha256:
        raise UsageError(f"--resume {run_dir}: osdp.plan = {plan!r}, the plan the run trained with, cannot be read")
    if sha256 != ckpt.plan_sha256:
        raise UsageError(f"--resume {run_dir}: osdp.plan = {plan!r} has changed since the checkpoint (SHA-256 "
                         f"{ckpt.plan_sha256[:12]}... then, {sha256[:12]}... now); put back the plan the run trained "
                         f"with, or start a new run with this one")


def _differing_keys(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            keys += _differing_keys(x, y, f"{prefix}{key}.")
        elif x != y:
            keys.append(f"{prefix}{key}")
    return keys
