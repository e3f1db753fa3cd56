"""A simulated run: the job's sync policy driven by virtual workers, written as a run directory.

The run directory has the layout and schema of ``train``'s (docs/design.md, "Run outputs"), so ``report``,
``compare`` and ``timeline`` read it unchanged:

- ``summary.json`` with every key of :data:`ebsp_mpi.outputs.SUMMARY_KEYS` (``backend`` is
  ``"simulated"``; the test loss and accuracy, the loss and the MPI library are null: there are no
  weights and no MPI) and one more, ``simulation``: where the iteration times came from and how fast
  the simulation ran;
- ``trace/rank-0000.h5``, the server's ``pushes``, ``pulls``, the policy's own tables (ElasticBSP's
  ``barriers``, ``barrier_members`` and ``zipline``) and with ``--train`` its ``evals``, and
  ``trace/rank-NNNN.h5``, worker NNNN-1's ``iterations``; above :data:`WORKER_FILES_MAX` workers,
  every worker's ``iterations`` in one file, ``trace/workers.h5`` (``trace.schema.WORKERS_FILE``;
  100,000 workers wrote 82,445 files, 984 MB in 3 minutes); every file's root attributes say
  ``backend = "simulated"`` and ``simulated = true``.

Rows are built as whole NumPy arrays per table and written in one piece each (a Python call per row
would cost more than the simulation). Times are seconds since the simulated start.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from .. import __version__
from ..config import JobConfig, to_dict
from ..data.memory import exceeds_memory, format_bytes, memory_phrase
from ..errors import UsageError
from .. import identity as ids
from ..outputs import AccuracyTargets, build_summary, identity_keys, write_model, write_summary
from ..progress import Progress
from ..straggler import straggler_model
from ..sync.registry import make_policy
from .events import RecordingExhausted, ReplayMismatch, SimResult, simulate
from ..trace.schema import (BARRIER_MEMBERS, BARRIERS, EVALS, ITERATIONS, PULLS, PUSHES, TABLES,
                            WORKER_ITERATIONS, WORKERS_FILE, ZIPLINE)
from ..trace.writer import encode_attrs, trace_path, write_whole
from ..run_description import describe as describe_run
from .recorded import recorded_pushes
from .restarts import Cuts, simulate_resumed
from .training import EmulatedTrainer, check_emulable, check_evaluations
from .workers import ModelWorkers, ReplayWorkers

#: Workers above which the workers' iterations go into one file, not one file per rank.
WORKER_FILES_MAX = 1024
#: Bytes a virtual worker takes whatever it does (its block of jitter draws, 1,024 float64, its
#: records' arrays, its share of the trace tables), and a push (8-byte times and versions, the rows of
#: the trace tables), rounded down from runs of 100,000 workers (1.3 GB resident with 2 pushes each,
#: 1.6 GB with 20 and no traces): the check refuses what cannot fit, not what might; with real
#: weights, a batch stream more
WORKER_BYTES = 12288
PUSH_BYTES = 128
TRAINED_WORKER_BYTES = 1024


def _limits(job: JobConfig, workers: int, iterations: int | None, trainer) -> tuple[list[int | None], float]:
    """Per worker, its iterations, and the time limit: :func:`stop_rule`'s, or with real weights the
    server's (``stop.epochs`` counts too, on each worker's shard)."""
    if trainer is None:
        limit, until = stop_rule(job, iterations)
        return [limit] * workers, until
    until = job.stop.seconds or math.inf
    limits = [iterations] * workers if iterations is not None else list(trainer.description.limits)
    if None in limits and until == math.inf:
        raise UsageError("simulate --train: how long? give --iterations K, or stop.iterations, stop.epochs or "
                         "stop.seconds in the job")
    return limits, until


def stop_rule(job: JobConfig, iterations: int | None) -> tuple[int | None, float]:
    """(iterations per worker or None, time limit in seconds or inf) of the simulation.

    ``iterations`` (``--iterations``) wins; else the job's ``stop.iterations``; ``stop.seconds`` is a
    time limit. ``stop.epochs`` needs the dataset's size, which a simulation never loads, so a job
    stopped by epochs alone is refused.
    """
    limit = iterations if iterations is not None else (job.stop.iterations or None)
    until = job.stop.seconds or math.inf
    if limit is None and until == math.inf:
        raise UsageError("simulate: how long? the job stops by stop.epochs only, and a simulation has no data; "
                         "give --iterations K or --set stop.iterations=K (or stop.seconds)")
    return limit, until


def virtual_workers(job: JobConfig, workers: int, replay: str | os.PathLike | None):
    """The iteration times: a replay of ``replay``'s run, else the job's straggler model."""
    if replay is not None:
        return ReplayWorkers(replay, workers)
    try:
        model = straggler_model(job.straggler, workers, job.seed)
    except ValueError as e:
        raise UsageError(f"simulate with {workers} workers: {e}") from None
    return ModelWorkers(model)


def check_simulation(job: JobConfig, workers: int, *, replay=None, iterations: int | None = None,
                     train: bool = False) -> None:
    """Every check :func:`simulate_job` makes before it simulates, and nothing else: a sweep runs it on
    every member before the first one starts, so that no member is refused after others ran."""
    _prepare(job, workers, replay, iterations, train)


def check_workers_fit(job: JobConfig, workers: int, iterations: int | None, train: bool = False) -> None:
    """Refuse a number of workers whose records exceed the memory (``data.memory``, as the dataset and
    the model are), before anything is allocated: :data:`WORKER_BYTES` each, and :data:`PUSH_BYTES`
    per push where the pushes are known (``--iterations`` or ``stop.iterations``)."""
    per_worker = iterations if iterations is not None else (job.stop.iterations or 0)
    need = workers * (WORKER_BYTES + PUSH_BYTES * per_worker + (TRAINED_WORKER_BYTES if train else 0))
    if exceeds_memory(need):
        raise UsageError(f"simulate with {workers} workers: their records need about {format_bytes(need)}, more "
                         f"than {memory_phrase()} ({WORKER_BYTES} bytes a worker and {PUSH_BYTES} a push); "
                         f"simulate fewer workers or iterations")


def _prepare(job: JobConfig, workers: int, replay, iterations: int | None, train: bool):
    """The checks and the set-up of a simulation: ``(job, recording, trainer, limits, until, iteration
    times, policy)``."""
    if workers < 1:
        raise UsageError(f"simulate: --workers {workers}: needs at least 1 worker")
    backend = os.environ.get("EBSP_BACKEND") or job.backend
    if train and backend == "cupy":  # train refuses a CuPy it cannot have; this would compute on NumPy anyway
        source = "EBSP_BACKEND" if os.environ.get("EBSP_BACKEND") else "backend"
        raise UsageError(f"simulate --train: {source} = 'cupy', but the emulation computes on NumPy only; "
                         f"set backend = 'auto' or 'numpy'")
    check_workers_fit(job, workers, iterations, train)
    # one virtual server whatever the job's runtime.servers (a replayed run's may say 2): the run's
    # config then tells its readers that worker w is rank w + 1, as the files are written
    job = replace(job, runtime=replace(job.runtime, servers=1))
    recorded = recorded_pushes(replay, job, workers) if train and replay is not None else None
    if train:
        check_emulable(job)  # before the run is described: a job naming a plan is refused in one line
    trainer = EmulatedTrainer(describe_run(job, workers, None), recorded.chunk_bytes if recorded else None) \
        if train else None
    limits, until = _limits(job, workers, iterations, trainer)
    if trainer is not None:
        check_evaluations(job, until)
    source = virtual_workers(job, workers, replay)
    try:
        policy = make_policy(job.sync, workers, seed=job.seed)
    except ValueError as e:
        raise UsageError(f"simulate with {workers} workers: {e}") from None
    return job, recorded, trainer, limits, until, source, policy


def simulate_job(job: JobConfig, workers: int, run_dir: Path, *, replay=None, iterations: int | None = None,
                 show_progress: bool = True, train: bool = False, provenance=None) -> dict:
    """Simulate `job` with `workers` virtual workers into `run_dir`; returns the summary (also written).
    With `train`, real weights (``sim.training``): the run has a model, evaluations and ``model.h5``.
    `provenance`: for a replay, what ``sim.provenance.check_replay`` found (the mismatches accepted,
    the reasons the replay is not exact); checked here when not given.

    Raises
    ------
    UsageError
        For fewer than one worker, more workers than the memory holds, a policy or straggler model that
        does not fit `workers`, a replay directory that is not a run (or, with `train`, limits past its
        recording), or a job with no iteration or time limit (:func:`check_simulation`).
    """
    if replay is not None and provenance is None:
        from .provenance import check_replay

        provenance = check_replay(replay, job, train=train, accept=frozenset())
    accepted, reasons = provenance or ({}, [])
    job, recorded, trainer, limits, until, source, policy = _prepare(job, workers, replay, iterations, train)
    progress = Progress(sum(limits) if None not in limits else None, unit="push", enabled=show_progress)
    started = time.perf_counter()
    # a diverging run's overflows are its summary's to report (the CLI's one line, as live), not NumPy's
    with _diverging_quietly(trainer):
        result, cuts, restarts = _schedule(job, workers, source, policy, limits, until, recorded, trainer, progress)
    seconds = time.perf_counter() - started
    progress.close(result.pushes)
    policy_tables = _record_rows(result.records)  # written and summarised both

    parts = [source.parts(w, result.start[w], result.push[w]) for w in range(workers)]
    iterations, first = _iteration_table(result, parts, cuts)
    run_dir.mkdir(parents=True, exist_ok=True)  # the command made it; a caller of this function may not have
    # what the simulation is made from, its id on every file it writes (no dataset without real weights)
    identity = ids.current(to_dict(job), run_id=ids.new_run_id(), accepted=accepted).as_dict()
    if trainer is None:
        identity["data"] = None
    if trainer is not None:  # the last evaluations first: the server's trace holds them
        with _diverging_quietly(trainer):
            _finish_training(job, run_dir, trainer, result, policy.name)
    if job.trace.enabled:
        evals = _eval_rows(trainer.evals if trainer is not None else [])
        _write_traces(job, run_dir, workers, source, result, {**policy_tables, "evals": evals}, iterations, first,
                      identity)
    summary = _summary(job, policy.name, workers, result, parts, iterations, first, trainer)
    summary["simulation"] = {
        "source": source.source, "replay": None if replay is None else str(replay),
        "iterations_limit": limits[0] if len(set(limits)) == 1 else None,
        "seconds_limit": None if until == math.inf else until,
        "pushes": result.pushes, "simulation_seconds": seconds, "restarts": [r.t for r in restarts],
        "pushes_per_second": result.pushes / seconds if seconds > 0 else None,
        # exact only where the recorded order was replayed, with the job, data and code the run had
        "exact_replay": recorded is not None and not reasons,
        "exact_replay_reason": _not_exact(replay, train, recorded, reasons),
        "recorded_order": recorded is not None,
        **_statistics(result, policy_tables),
    }
    if trainer is not None:
        summary["simulation"]["training"] = trainer.statistics()
    summary.update(identity_keys(identity))
    write_summary(run_dir, summary)
    return summary


def _not_exact(replay, train: bool, recorded, reasons: list[str]) -> str | None:
    """Why the simulation is not an exact replay of a live run (None: it is one)."""
    if recorded is not None and not reasons:
        return None
    if replay is None or not train:
        return "not a replay with real weights (--replay RUN --train)"
    if recorded is None:
        return "the recorded order of pushes does not fit this job (another sync model or number of workers)"
    return "; ".join(reasons)


def _diverging_quietly(trainer):
    """No NumPy warnings from the weights' arithmetic: a step or a loss that is not finite is what the
    summary says, and the CLI reports it in one line (``outputs.training_failed``)."""
    return np.errstate(over="ignore", invalid="ignore", divide="ignore") if trainer is not None else \
        contextlib.nullcontext()


def _schedule(job: JobConfig, workers: int, source, policy, limits: list, until: float, recorded, trainer,
              progress: Progress) -> tuple[SimResult, Cuts, list]:
    """Run the simulation: ``(result, the iterations a restart cut short (``Cuts``), the restarts)``.
    A resumed run is replayed with its restarts (``sim.restarts``), worker for recorded worker; a
    recording (``sim.recorded``) gives the pushes' order and times."""
    restarts = getattr(source, "restarts", []) if getattr(source, "recorded", None) == workers else []
    where = f"simulate --train --replay {getattr(source, 'run_dir', '')}"
    if restarts and trainer is not None:
        raise UsageError(f"{where}: the run was resumed {len(restarts)} time(s), and the weights each restart "
                         "reloaded from its checkpoint are not replayed; replay it without --train, or a run "
                         "that was not resumed")
    if restarts:
        result, cuts = simulate_resumed(lambda: make_policy(job.sync, workers, seed=job.seed), source, limits[0],
                                        until, restarts)
        return result, cuts, restarts
    t0 = recorded.t0 if recorded is not None else 0.0
    if trainer is not None:
        trainer.begin(t0)
    try:
        result = simulate(policy, source, None, until=until, keep_releases=False, limits=limits, t0=t0,
                          progress=progress.update, trainer=trainer,
                          recorded=recorded.pushes if recorded is not None else None)
    except RecordingExhausted as e:
        asked = (f"--iterations {limits[0]}" if limits[0] is not None and len(set(limits)) == 1
                 else f"stop.seconds = {until:g}" if until < math.inf else "the limits")
        raise UsageError(f"{where}: {e}: {asked} goes past the recorded run; replay it with its own limits or "
                         "less, or without --train (its recorded times are then cycled)") from None
    except ReplayMismatch as e:
        raise UsageError(f"{where}: {e}; the recording cannot be paired") from None
    if recorded is not None:
        recorded.check(result)
    return result, Cuts.none(workers), []


def _write_traces(job: JobConfig, run_dir: Path, workers: int, source, result: SimResult,
                  server_tables: dict[str, np.ndarray], iterations: np.ndarray, first: np.ndarray,
                  identity: dict) -> None:
    """The server's trace (``pushes``, ``pulls`` and `server_tables`) and the workers' (one file each,
    or shared files past WORKER_FILES_MAX); `iterations` holds every worker's rows, worker w's from
    ``first[w]`` to ``first[w + 1]``."""
    attrs = _attrs(job, identity, workers, source)
    _write_rank(run_dir, 0, encode_attrs({**attrs, "role": "server", "rank": 0}), {
        "pushes": _push_rows(result), "pulls": _pull_rows(result), **server_tables})
    if workers <= WORKER_FILES_MAX:
        shared = encode_attrs({**attrs, "role": "worker"})  # the job's attributes, encoded once
        for w in range(workers):  # the rank, an int, is stored as it is
            _write_rank(run_dir, w + 1, {**shared, "rank": w + 1}, {"iterations": iterations[first[w]:first[w + 1]]})
    else:
        _write_workers(run_dir, attrs, iterations, first)


def _finish_training(job: JobConfig, run_dir: Path, trainer: EmulatedTrainer, result: SimResult, sync: str) -> None:
    """The last evaluations, and ``model.h5`` as the server writes it."""
    trainer.finish(float(np.nanmax(result.end)) if result.workers else 0.0)
    write_model(run_dir, trainer.state_dict(), version=result.versions, step=result.versions,
                attrs={"sync": sync, "config_json": to_dict(job), "simulated": True})


def _summary(job: JobConfig, sync: str, workers: int, result: SimResult, parts: list, iterations: np.ndarray,
             first: np.ndarray, trainer: EmulatedTrainer | None = None) -> dict:
    """The keys every run's summary has, as a simulation fills them (no MPI; without real weights, no
    loss and no accuracy either)."""
    trained = trainer is not None
    return build_summary(
        job, sync=sync, world_size=workers + 1, backend="simulated",
        wall_seconds=float(np.nanmax(result.end)) if workers else 0.0,
        iterations=[len(p) for p in result.push],
        wait_seconds=_per_worker_sums(iterations["wait_s"], first),
        compute_seconds=[float(p.compute[:-1].sum()) for p in parts],
        injected_delay_seconds=[float(p.delay[:-1].sum()) for p in parts],
        barriers=result.barriers, rejected_pushes=trainer.rejected if trained else 0, versions=result.versions,
        train_loss=trainer.statistics()["train_loss"] if trained else None,
        test_loss=trainer.evals[-1][2] if trained else None, test_accuracy=trainer.evals[-1][3] if trained else None,
        targets=trainer.targets if trained else AccuracyTargets([]), evals=trainer.evals if trained else [],
        mpi_library=None, divergence=trainer.divergence.finding if trained else None)


def _statistics(result: SimResult, policy_tables: dict[str, np.ndarray]) -> dict:
    """What a study of many simulations reads without the traces: the staleness of the pushes, and the
    barriers' predicted and observed spread (ElasticBSP; medians over barriers two or more workers
    reached). `policy_tables` are the policy's own tables (:func:`_record_rows`)."""
    staleness = np.concatenate([b - u for b, u in zip(result.before, result.used, strict=True)]) \
        if result.workers else np.zeros(0)
    out = {"staleness": {"mean": float(staleness.mean()), "median": float(np.median(staleness)),
                         "p99": float(np.percentile(staleness, 99)), "max": int(staleness.max())}
           if len(staleness) else None}
    barriers, members = policy_tables["barriers"], policy_tables["barrier_members"]
    # a member whose arrival is NaN left (stopped) before it got to its barrier
    numbers, arrivals = np.unique(members["barrier"][np.isfinite(members["arrival_t"])], return_counts=True)
    shared = barriers[np.isin(barriers["barrier"], numbers[arrivals >= 2])]
    arrived = members[np.isfinite(members["arrival_t"])]
    error = np.abs(arrived["arrival_t"] - arrived["predicted_t"])
    out["barrier_spread"] = {
        "barriers": len(shared),
        "predicted_median_s": float(np.median(shared["predicted_spread"])),
        "observed_median_s": float(np.median(shared["observed_spread"])),
        "r_median": float(np.median(members["r"])),
        # robust ZipLine's interval spread (the point spread at z = 0) and the size of the errors of
        # the predictions barriers were set on: what the calibration and the predictors are judged by
        "interval_median_s": float(np.median(shared["predicted_interval_spread"])),
        "error_median_s": float(np.median(error)) if len(error) else math.nan,
        "error_p99_s": float(np.percentile(error, 99)) if len(error) else math.nan,
        "z_last": float(barriers["z"][-1]),
    } if len(shared) else None
    return out


def describe(summary: dict, run_dir) -> str:
    """One line on a finished simulation, for the terminal."""
    sim = summary["simulation"]
    waited = sum(summary["wait_seconds"]) / max(1, sum(summary["iterations"]))
    trained = "" if summary["test_accuracy"] is None else f", test accuracy {summary['test_accuracy']:.4f}"
    return (f"{summary['sync']} (simulated, {sim['source']}): {summary['workers']} worker(s), "
            f"{sim['pushes']} pushes in {summary['wall_seconds']:.2f} simulated s, mean wait {1000 * waited:.2f} ms "
            f"per push{trained}; simulated in {sim['simulation_seconds']:.1f} s -> {run_dir}")


# -- the trace tables --------------------------------------------------------------------------------


def _iteration_table(result: SimResult, parts: list, cuts: Cuts) -> tuple[np.ndarray, np.ndarray]:
    """Every worker's ``iterations`` rows in one table, worker after worker, and where each worker's
    rows begin (``workers + 1`` offsets: worker w's are ``first[w]:first[w + 1]``).

    Built for all workers at once. Worker w's `parts` hold one iteration more than it did: the phases
    of the reply that stopped it (its transit ends the last iteration). `cuts`: iterations a restart
    cut short, each ended by a reply (its transit added) or by its recorded wait (``sim.restarts.Cuts``)."""
    counts = np.array([len(s) for s in result.start], dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(counts)])
    rows = np.zeros(int(first[-1]), dtype=ITERATIONS)
    # the parts come in blocks of count + 1: `head` takes each block's first `count`, `tail` its last
    head = np.ones(int(first[-1]) + len(counts), dtype=bool)
    head[first[1:] + np.arange(len(counts))] = False
    tail = np.ones_like(head)
    tail[first[:-1] + np.arange(len(counts))] = False
    down, compute, delay, push = (np.concatenate([getattr(p, name) for p in parts])
                                  for name in ("down", "compute", "delay", "push"))
    start = np.concatenate(result.start)
    rows["iteration"] = np.arange(len(rows)) - np.repeat(first[:-1], counts)
    rows["t_start"] = start + down[head]
    rows["t_compute_end"] = rows["t_start"] + compute[head] + delay[head]
    rows["t_push"] = rows["t_compute_end"] + push[head]
    # what ended each iteration: the worker's next release, or for its last the reply that stopped it
    replies = np.empty(len(rows))
    replies[:-1] = start[1:]
    worked = counts > 0
    replies[first[1:][worked] - 1] = result.end[worked]
    for w, cut in enumerate(cuts.replies):
        for i, t in cut.items():
            replies[first[w] + i] = t
    ends = replies + down[tail]
    for w, cut in enumerate(cuts.waits):
        for i, wait in cut.items():
            ends[first[w] + i] = rows["t_push"][first[w] + i] + wait
    rows["t_end"] = np.maximum(ends, rows["t_push"])
    rows["wait_s"] = rows["t_end"] - rows["t_push"]
    rows["version"] = np.concatenate(result.used)
    rows["loss"] = np.nan  # no weights, no loss
    rows["injected_delay_s"] = delay[head]
    rows["epoch"] = np.nan  # no data
    return rows, first


def _per_worker_sums(column: np.ndarray, first: np.ndarray) -> list[float]:
    """Each worker's sum of `column` (rows ``first[w]:first[w + 1]``; 0 for a worker with none), in
    one pass over the column."""
    counts = np.diff(first)
    owner = np.repeat(np.arange(len(counts)), counts)
    return np.bincount(owner, weights=column, minlength=len(counts)).tolist()


def _push_rows(result: SimResult) -> np.ndarray:
    """The server's ``pushes``, in the order it took them (time, then worker)."""
    n = result.workers
    sizes = [len(p) for p in result.push]
    rows = np.zeros(sum(sizes), dtype=PUSHES)
    rows["worker"] = np.repeat(np.arange(n), sizes)
    rows["iteration"] = np.concatenate([np.arange(s) for s in sizes]) if n else []
    rows["t"] = np.concatenate(result.push) if n else []
    before, used = np.concatenate(result.before), np.concatenate(result.used)
    rows["version_before"] = before
    rows["staleness"] = before - used
    return rows[np.lexsort((rows["worker"], rows["t"]))]


def _pull_rows(result: SimResult) -> np.ndarray:
    """The server's ``pulls``: each worker's first pull, one per push, the last answered by its stop.

    Built for all workers at once: worker w's k pushes give it k + 1 rows, its block of the table. A
    request is the first pull (at its first release, or at its stop if it never started) then each
    push; a reply is each release then the stop."""
    n = result.workers
    if not n:
        return np.zeros(0, dtype=PULLS)
    pushes = np.array([len(p) for p in result.push], dtype=np.int64)
    rows = np.zeros(int(pushes.sum()) + n, dtype=PULLS)
    first = np.concatenate([[0], np.cumsum(pushes + 1)[:-1]])  # each worker's first row
    last = first + pushes                                         # and its last, the stop
    inner = np.ones(len(rows), dtype=bool)
    inner[first] = False
    starts = np.concatenate(result.start)
    rows["worker"] = np.repeat(np.arange(n), pushes + 1)
    first_request = np.array(result.end, dtype=np.float64)  # a worker that never started: its stop
    started = pushes > 0
    first_request[started] = starts[(first - np.arange(n))[started]]  # its first release
    rows["t_request"][first] = first_request
    rows["t_request"][inner] = np.concatenate(result.push)
    outer = np.ones(len(rows), dtype=bool)  # every row but a worker's last is answered by a release
    outer[last] = False
    rows["t_reply"][outer] = starts
    rows["t_reply"][last] = result.end
    rows["version"][outer] = np.concatenate(result.used)
    rows["version"][last] = result.stop_version
    return rows[np.lexsort((rows["worker"], rows["t_reply"]))]


def _record_rows(records) -> dict[str, np.ndarray]:
    """The policy's own rows (ElasticBSP's barriers, members and ZipLine calls) as tables."""
    tables = {}
    for name, dtype in (("barriers", BARRIERS), ("barrier_members", BARRIER_MEMBERS), ("zipline", ZIPLINE)):
        rows = [tuple(r.row[f] for f in dtype.names) for r in records if r.table == name]
        tables[name] = np.array(rows, dtype=dtype)
    unknown = {r.table for r in records} - set(tables)
    if unknown:
        raise ValueError(f"the policy wrote rows of tables {sorted(unknown)} the simulated trace does not keep")
    return tables


# -- the files ---------------------------------------------------------------------------------------


def _attrs(job: JobConfig, identity: dict, workers: int, source) -> dict:
    return dict(run_id=identity["run_id"], identity=identity, world_size=workers + 1, host=socket.gethostname(),
                pid=os.getpid(),
                backend="simulated", device="virtual", mpi_library="", package_version=__version__,
                config=to_dict(job), clock_offset_s=0.0, simulated=True, simulation_source=source.source)


def _write_workers(run_dir: Path, attrs: dict, iterations: np.ndarray, first: np.ndarray) -> None:
    """Every worker's ``iterations`` in one file, ``trace/workers.h5``, with the worker index first
    (``trace.schema.WORKER_ITERATIONS``)."""
    table = np.empty(len(iterations), dtype=WORKER_ITERATIONS)
    table["worker"] = np.repeat(np.arange(len(first) - 1), np.diff(first))
    for name in ITERATIONS.names:
        table[name] = iterations[name]
    path = trace_path(run_dir, 0).with_name(WORKERS_FILE)
    write_whole(path, encode_attrs({**attrs, "role": "workers", "workers": len(first) - 1}),
                {"worker_iterations": table})


def _eval_rows(evals: list[tuple[float, int, float, float]]) -> np.ndarray:
    """The emulated evaluations as the live server records them (an emulated evaluation takes no
    virtual time); none without real weights."""
    return np.array([(t, version, loss, acc, 0.0) for t, version, loss, acc in evals], dtype=EVALS)


def _write_rank(run_dir: Path, rank: int, encoded_attrs: dict, tables: dict[str, np.ndarray]) -> None:
    """One rank's trace file, written whole (``trace.writer.write_whole``): the attributes as the live
    writer encodes them, the tables in bulk; a table without rows is left out, as live."""
    for name, rows in tables.items():
        assert not len(rows) or rows.dtype == TABLES[name], name
    write_whole(trace_path(run_dir, rank), encoded_attrs, tables)
