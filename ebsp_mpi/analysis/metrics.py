"""Statistics of a run from its trace DataFrames: per worker (rates, waiting) and per run (the summary row).

Times are seconds on rank 0's clock. A worker's *active span* runs from its first iteration's start to
its last iteration's end; rates and shares are taken over it, so a worker that finished early (ASP) is
not charged for the time after it stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..trace.frames import RunFrames
from .runs import RunInfo


@dataclass
class Run:
    """A run for the report: its identity (:class:`RunInfo`) and its trace tables (:class:`RunFrames`)."""

    info: RunInfo
    frames: RunFrames

    @property
    def label(self) -> str:
        return self.info.label


def worker_stats(frames: RunFrames) -> pd.DataFrame:
    """One row per worker: iterations, active span (s), iterations per second, seconds of compute,
    injected delay, push and wait, the share of the span spent waiting, and per-iteration wait
    quantiles (s). Indexed by worker."""
    it = frames.table("iterations")
    if it.empty:
        return pd.DataFrame(columns=["iterations", "span_s", "iterations_per_s", "compute_s", "delay_s",
                                     "push_s", "wait_s", "wait_share", "wait_median_s", "wait_p90_s"])
    g = it.groupby("worker")
    span = g["t_end"].max() - g["t_start"].min()
    out = pd.DataFrame({
        "iterations": g.size(),
        "span_s": span,
        "compute_s": g["compute_s"].sum(),
        "delay_s": g["delay_s"].sum(),
        "push_s": g["push_s"].sum(),
        "wait_s": g["wait_s"].sum(),
        "wait_median_s": g["wait_s"].median(),
        "wait_p90_s": g["wait_s"].quantile(0.9),
    })
    out["iterations_per_s"] = out["iterations"] / span.where(span > 0)
    out["wait_share"] = out["wait_s"] / span.where(span > 0)
    return out


def slowest_worker(frames: RunFrames) -> int | None:
    """The straggler: the worker whose iterations take longest but for the time the sync model held its
    pulls at the server. That is its compute, its injected delay and the transfer of its pushes and
    replies, so a slow link shows as a slow CPU does; without the server's ``pulls`` table, its compute
    and injected delay (median).

    None of it depends on the sync model, so this names the same worker in every run of a sweep,
    unlike the iteration rate (equal for all workers under BSP).
    """
    it = frames.table("iterations")
    if it.empty:
        return None
    pulls = frames.table("pulls")
    if pulls.empty:
        return int((it["compute_s"] + it["delay_s"]).groupby(it["worker"]).median().idxmax())
    g = it.groupby("worker")
    busy = (it["t_end"] - it["t_start"]).groupby(it["worker"]).sum()
    held = (pulls["t_reply"] - pulls["t_request"]).groupby(pulls["worker"]).sum()  # the first pull holds 0
    return int(((busy - held.reindex(busy.index, fill_value=0.0)) / g.size()).idxmax())


def accuracy_curve(frames: RunFrames) -> pd.DataFrame:
    """Test evaluations in time order: ``t`` (s), ``test_acc`` (fraction), ``test_loss``, ``version``."""
    ev = frames.table("evals")
    return ev.sort_values("t")[["t", "test_acc", "test_loss", "version"]].reset_index(drop=True)


def barrier_times(frames: RunFrames) -> np.ndarray:
    """Times (s) at which every worker was released together.

    ElasticBSP records its barriers (``t_released``). BSP's barrier is implicit: each round ends when the
    server answers every worker's pull with the same new version, so its release time is the first reply
    of each version in the ``pulls`` table. Other models have no barriers (an empty array).
    """
    barriers = frames.table("barriers")
    if len(barriers):
        return np.sort(barriers["t_released"].to_numpy())
    if frames.sync == "bsp":
        pulls = frames.table("pulls")
        if len(pulls):
            return np.sort(pulls.groupby("version")["t_reply"].min().to_numpy())
    return np.zeros(0)


def spreads(frames: RunFrames) -> pd.DataFrame:
    """ElasticBSP barriers of two or more workers: ZipLine's predicted spread and the observed one (s).

    The observed spread is the longest wait at the barrier: last minus first arrival of the workers'
    barrier pushes (ICDM 2019, Sec. III; the quantity ZipLine minimises).
    """
    b = frames.table("barriers")
    members = frames.table("barrier_members")
    if len(members):
        # a barrier of one worker (the others have finished) has a spread of 0 by definition
        size = members.dropna(subset=["arrival_t"]).groupby("barrier").size()
        b = b[b["barrier"].map(size).fillna(0) >= 2]
    return b[["barrier", "t_decided", "predicted_spread", "observed_spread"]].dropna().reset_index(drop=True)


def spread_table(runs: list[Run]) -> pd.DataFrame:
    """Per label of the runs with ElasticBSP barriers: how many runs, the median of their barrier counts,
    and over the barriers of two or more workers of all of them (pooled): the median predicted and
    observed spread and the median and 90th percentile of observed minus predicted, in ms.

    Empty (no rows) when no run has barriers; this is ZipLine's prediction error per variant.
    """
    rows = []
    for label in dict.fromkeys(r.label for r in runs):
        group = [(r, spreads(r.frames)) for r in runs if r.label == label]
        group = [(r, sp) for r, sp in group if len(r.frames.table("barriers"))]
        if not group:
            continue
        pred = 1000 * np.concatenate([sp["predicted_spread"].to_numpy() for _, sp in group])
        obs = 1000 * np.concatenate([sp["observed_spread"].to_numpy() for _, sp in group])
        error = obs - pred
        counts = [r.info.summary.get("barriers", len(r.frames.table("barriers"))) for r, _ in group]
        rows.append({"model": label, "runs": len(group), "barriers_per_run": float(np.median(counts)),
                     "barriers_of_2_or_more": len(error),
                     "predicted_spread_ms": float(np.median(pred)) if len(pred) else math.nan,
                     "observed_spread_ms": float(np.median(obs)) if len(obs) else math.nan,
                     "error_median_ms": float(np.median(error)) if len(error) else math.nan,
                     "error_p90_ms": float(np.percentile(error, 90)) if len(error) else math.nan})
    return pd.DataFrame(rows, columns=["model", "runs", "barriers_per_run", "barriers_of_2_or_more",
                                       "predicted_spread_ms", "observed_spread_ms", "error_median_ms",
                                       "error_p90_ms"])


def _time_to(summary: dict) -> dict:
    return {float(k): v for k, v in (summary.get("time_to_accuracy") or {}).items()}


def summary_row(run: Run) -> dict:
    """The run's line in the report's summary table (times in s, accuracies as fractions)."""
    f, s = run.frames, run.info.summary
    stats = worker_stats(f)
    pushes = f.table("pushes")
    curve = accuracy_curve(f)
    final_acc = s.get("test_accuracy", curve["test_acc"].iloc[-1] if len(curve) else math.nan)
    row = {
        "run": run.info.path.name,
        "model": run.label,
        "seed": run.info.seed,
        "workers": f.workers,
        "wall_s": f.wall_seconds,
        "final_test_accuracy": final_acc,
        "final_test_loss": s.get("test_loss", curve["test_loss"].iloc[-1] if len(curve) else math.nan),
        "iterations": int(stats["iterations"].sum()) if len(stats) else 0,
        "samples_per_s": s.get("samples_per_second", math.nan),
        "min_it_per_s": stats["iterations_per_s"].min() if len(stats) else math.nan,
        "max_it_per_s": stats["iterations_per_s"].max() if len(stats) else math.nan,
        "mean_wait_share": stats["wait_share"].mean() if len(stats) else math.nan,
        "barriers": s.get("barriers", len(barrier_times(f))),
        "median_staleness": float(pushes["staleness"].median()) if len(pushes) else math.nan,
        "max_staleness": int(pushes["staleness"].max()) if len(pushes) else 0,
        "rejected_pushes": s.get("rejected_pushes", int(pushes["rejected"].sum()) if len(pushes) else 0),
    }
    for target, t in sorted(_time_to(s).items()):
        row[f"time_to_{target:g}_s"] = math.inf if t is None else t
    return row


def summary_table(runs: list[Run]) -> pd.DataFrame:
    """:func:`summary_row` of every run, one row each."""
    return pd.DataFrame([summary_row(r) for r in runs])
