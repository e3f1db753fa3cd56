"""``simulate --sweep FILE``: every member of a sweep file simulated in turn, then one scaling table.

A sweep file is the one ``sweep`` reads (:mod:`ebsp_mpi.sweep.spec`); each member names its number of
workers with ``sync.workers``. The output directory holds one run directory per member and the sweep
manifest (``sweep.json``), so ``compare`` and ``report`` read it as a sweep, and:

- ``scaling.csv``, ``scaling.md``: one row per member: its status (``ok``, or ``diverged`` for a member
  whose training diverged: the command then exits 1), model, workers, pushes, simulated seconds per
  1,000 pushes and against ASP at the same n (the time a model without waiting needs for as many
  pushes), the share of the workers' time spent waiting, staleness (mean, also divided by n: every
  push is a version, so staleness in versions grows with n; 99th percentile, max), and
  for ElasticBSP the barriers' median r, predicted and observed spread;
- ``scaling.png``: those figures against n, one line per model.

The table reads only the summaries (``simulation`` holds the staleness and barrier statistics), so the
sweep may set ``trace.enabled = false`` to skip the traces of its large members.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from ..errors import UsageError

#: columns of scaling.csv, in order
COLUMNS = ("member", "status", "model", "seed", "workers", "pushes", "simulated_s", "s_per_1000_pushes", "vs_asp",
           "wait_share",
           "staleness_mean", "staleness_rounds", "staleness_p99", "staleness_max", "barriers", "r_median",
           "predicted_spread_ms", "observed_spread_ms", "interval_spread_ms", "observed_over_interval",
           "error_median_ms", "error_p99_ms", "z", "simulation_s")


def _checked_jobs(sweep, base: str | None, train: bool) -> list:
    """Every member's job, each checked before the first runs: its keys, its ``sync.workers``, and all
    its own run would refuse (its shards, its limits, its memory)."""
    from ..config import load_job
    from ..sweep.spec import SweepError
    from .run import check_simulation

    jobs = []
    for m in sweep.members:
        try:
            job = load_job(base, m.overrides)
        except UsageError as e:
            raise SweepError(f"{sweep.path}: member {m.name!r}: {e}") from None
        if not job.sync.workers:
            raise SweepError(f"{sweep.path}: member {m.name!r}: set sync.workers (the virtual workers)")
        try:
            check_simulation(job, job.sync.workers, train=train)
        except UsageError as e:
            raise SweepError(f"{sweep.path}: member {m.name!r}: {e}") from None
        jobs.append(job)
    return jobs


def run_sweep(path: str, out: str | None, show_progress: bool = True, train: bool = False) -> Path:
    """Simulate every member of the sweep file `path` into `out`; write the manifest and the table.
    With `train`, every member trains real weights (``simulate --train``), and the accuracy table and
    figure come too (:mod:`.accuracy`).

    Raises
    ------
    UsageError
        For a bad sweep file, a member without ``sync.workers``, or a member the simulation refuses:
        every member is checked (:func:`~.run.check_simulation`) before the first one runs.

    A member whose training diverged (``outputs.training_failed``) runs to its end, as live, and is
    ``failed`` in the manifest and marked in the tables: :func:`sweep_failure` says so.
    """
    from ..outputs import make_run_dir, release_lock, remove_if_unused, training_failed
    from ..sweep.runner import Outcome, default_out, write_manifest
    from ..sweep.spec import SweepError, load_sweep
    from .run import simulate_job

    sweep = load_sweep(path)
    base = str(sweep.base) if sweep.base else None
    jobs = _checked_jobs(sweep, base, train)
    out_dir = Path(out) if out else default_out(sweep)
    made_out = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    outcomes, made = [], []
    for i, (m, job) in enumerate(zip(sweep.members, jobs, strict=True)):
        command = [sys.executable, "-m", "ebsp_mpi", "simulate", *([base] if base else []), *(["--train"] * train),
                   *[a for o in m.overrides for a in ("--set", o)], "--out", str(out_dir / m.name), "-q"]
        outcome = Outcome(name=m.name, group=m.group, seed=m.seed, dir=m.name, command=command,
                          overrides=list(m.overrides))
        started = time.monotonic()
        try:
            run_dir = make_run_dir(str(out_dir / m.name), job.name)
        except (UsageError, FileExistsError) as e:
            _undo(out_dir, made_out, made)
            raise SweepError(f"{sweep.path}: member {m.name!r}: {e}") from None
        made.append(run_dir)
        try:
            summary = simulate_job(job, job.sync.workers, run_dir, show_progress=False, train=train)
        except UsageError as e:  # a refusal only the run could find (evaluations past the bound): undone whole
            _undo(out_dir, made_out, made)
            raise SweepError(f"{sweep.path}: member {m.name!r}: {e}") from None
        except BaseException:
            remove_if_unused(run_dir)
            raise
        release_lock(run_dir)
        failed = training_failed(summary) if train else None
        outcome.seconds, outcome.status, outcome.returncode = time.monotonic() - started, "ok", 0
        if failed:  # as a live member whose run exits 1: its files stay, its row says so
            outcome.status, outcome.returncode, outcome.message = "failed", 1, failed
        outcomes.append(outcome)
        if show_progress:
            print(f"[{i + 1:>{len(str(len(jobs)))}}/{len(jobs)}] {m.name:<28} {outcome.seconds:7.1f} s  "
                  f"{summary['simulation']['pushes']:>9} pushes", file=sys.stderr)
        write_manifest(out_dir, sweep, 0, outcomes)
    rows = scaling_rows(out_dir)
    write_table(rows, out_dir)
    scaling_figure(rows, out_dir / "scaling.png")
    print(f"{len(rows)} simulations -> {out_dir} (scaling.md, scaling.csv, scaling.png)")
    if train:
        from .accuracy import write_accuracy

        write_accuracy(out_dir)
        print(f"accuracy -> {out_dir} (accuracy.md, accuracy.csv, accuracy.png)")
    return out_dir


def _undo(out_dir: Path, made_out: bool, made: list[Path]) -> None:
    """A refused sweep leaves nothing: the directory it made, or in a directory that was there, the
    member directories and the manifest it wrote."""
    import shutil

    from ..outputs import release_lock
    from ..sweep.runner import MANIFEST

    for run_dir in made:
        release_lock(run_dir)
    if made_out:
        shutil.rmtree(out_dir, ignore_errors=True)
        return
    for run_dir in made:
        shutil.rmtree(run_dir, ignore_errors=True)
    if made:
        (out_dir / MANIFEST).unlink(missing_ok=True)


def sweep_failure(out_dir: Path) -> str | None:
    """Why the sweep in `out_dir` must not exit 0 (members whose training failed), or None."""
    members = json.loads((out_dir / "sweep.json").read_text())["members"]
    failed = [m for m in members if m.get("status") != "ok"]
    if not failed:
        return None
    names = ", ".join(m["name"] for m in failed)
    why = failed[0].get("message") or failed[0].get("status")
    return f"{len(failed)} of {len(members)} members failed ({names}): {failed[0]['name']}: {why}"


def _label(summary: dict) -> str:
    from ..analysis.runs import model_label

    return model_label(summary.get("config") or {})


def _why(message: str) -> str:
    """A failed member's mark in the tables: ``diverged`` or ``not trained`` (every push rejected)."""
    return "diverged" if "diverged" in message else "not trained" if "rejected" in message else ""


def scaling_rows(out_dir: Path) -> list[dict]:
    """One row of :data:`COLUMNS` per member of the sweep in `out_dir` (in the manifest's order)."""
    manifest = json.loads((out_dir / "sweep.json").read_text())
    summaries = [(m["name"], json.loads((out_dir / m["dir"] / "summary.json").read_text()))
                 for m in manifest["members"]]
    status = {m["name"]: "ok" if m.get("status", "ok") == "ok" else _why(m.get("message", "")) or m["status"]
              for m in manifest["members"]}
    # ASP of the same n and seed: a sweep over seeds compares each run with its own reference
    def key(s):
        return s["workers"], (s.get("config") or {}).get("seed")

    asp = {key(s): s["wall_seconds"] / sum(s["iterations"]) for _, s in summaries if s["sync"] == "asp"}
    rows = []
    for name, s in summaries:
        sim = s["simulation"]
        pushes, wall = sum(s["iterations"]), s["wall_seconds"]
        spread = sim.get("barrier_spread") or {}
        staleness = sim.get("staleness") or {}
        per_push = wall / pushes if pushes else math.nan
        # the workers' busy time is what they did not wait: the share is of the sum of both
        waited = sum(s["wait_seconds"])
        busy = sum(s["injected_delay_seconds"]) + sum(s["compute_seconds"])
        rows.append({
            "member": name, "status": status[name], "model": _label(s), "seed": key(s)[1],
            "workers": s["workers"], "pushes": pushes, "simulated_s": wall,
            "s_per_1000_pushes": 1000 * per_push,
            "vs_asp": per_push / asp[key(s)] if key(s) in asp else math.nan,
            "wait_share": waited / (waited + busy) if waited + busy > 0 else math.nan,
            "staleness_mean": staleness.get("mean", math.nan),
            "staleness_rounds": staleness.get("mean", math.nan) / s["workers"],
            "staleness_p99": staleness.get("p99", math.nan),
            "staleness_max": staleness.get("max", math.nan), "barriers": s["barriers"],
            "r_median": spread.get("r_median", math.nan),
            "predicted_spread_ms": 1000 * spread.get("predicted_median_s", math.nan),
            "observed_spread_ms": 1000 * spread.get("observed_median_s", math.nan),
            "interval_spread_ms": 1000 * spread.get("interval_median_s", math.nan),
            "observed_over_interval": (spread.get("observed_median_s", math.nan) / spread["interval_median_s"]
                                       if spread.get("interval_median_s") else math.nan),
            "error_median_ms": 1000 * spread.get("error_median_s", math.nan),
            "error_p99_ms": 1000 * spread.get("error_p99_s", math.nan),
            "z": spread.get("z_last", math.nan),
            "simulation_s": sim["simulation_seconds"],
        })
    return rows


def _cell(column: str, value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if column in ("wait_share",):
            return f"{value:.1%}"
        if column in ("vs_asp", "staleness_mean", "staleness_rounds", "s_per_1000_pushes", "observed_over_interval"):
            return f"{value:.3f}"
        return f"{value:.1f}"
    return str(value)


def write_table(rows: list[dict], out_dir: Path) -> None:
    """``scaling.csv`` (every column) and ``scaling.md`` (the columns a reader compares)."""
    import csv

    with (out_dir / "scaling.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    shown = ("model", "status", "seed", "workers", "pushes", "s_per_1000_pushes", "vs_asp", "wait_share",
             "staleness_mean",
             "staleness_rounds", "staleness_max", "r_median", "predicted_spread_ms", "observed_spread_ms",
             "interval_spread_ms", "observed_over_interval", "error_median_ms", "z")
    lines = ["| " + " | ".join(shown) + " |", "|" + "|".join("---" for _ in shown) + "|"]
    lines += ["| " + " | ".join(_cell(c, r[c]) for c in shown) + " |" for r in rows]
    (out_dir / "scaling.md").write_text("\n".join(lines) + "\n")


def scaling_figure(rows: list[dict], path: Path) -> None:
    """Time per push against ASP, waiting share, mean staleness and ElasticBSP's spreads against n."""
    scaling_axes(rows).savefig(path, dpi=80)


def scaling_axes(rows: list[dict]):
    """The figure of :func:`scaling_figure`, not yet saved (a test measures where its texts fall)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from ..analysis.figures import PALETTE

    models = list(dict.fromkeys(r["model"] for r in rows))
    colour = {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(models)}
    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    panels = (("vs_asp", "time per push / ASP's (1 = no waiting)"),
              ("wait_share", "share of the workers' time spent waiting"),
              ("staleness_rounds", "mean staleness / workers (versions per worker)"))
    for ax, (column, title) in zip(axes, panels, strict=False):
        for m in models:
            mine = sorted((r["workers"], r[column]) for r in rows if r["model"] == m)
            ax.plot([n for n, _ in mine], [v for _, v in mine], marker="o", ms=4, color=colour[m], label=m)
        ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=10.5, loc="left")
        ax.set_xlabel("workers")
        ax.grid(alpha=0.3)
    ax = axes[3]
    for m in models:
        # the interval spread is what robust ZipLine promised (the predicted spread at z = 0)
        mine = sorted((r["workers"], r["predicted_spread_ms"] if math.isnan(r.get("interval_spread_ms", math.nan))
                       else r["interval_spread_ms"], r["observed_spread_ms"]) for r in rows
                      if r["model"] == m and not math.isnan(r["observed_spread_ms"]))
        if mine:
            ax.plot([n for n, _, _ in mine], [o for _, _, o in mine], marker="o", ms=4, color=colour[m])
            ax.plot([n for n, _, _ in mine], [p for _, p, _ in mine], ls="--", marker="x", ms=4, color=colour[m])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    # two lines: in one, the title ran past the panel's right edge and off the figure
    ax.set_title("ElasticBSP: median barrier spread (ms)\npredicted: the interval spread", fontsize=10.5, loc="left")
    ax.set_xlabel("workers")
    ax.grid(alpha=0.3)
    if ax.get_lines():  # a sweep without ElasticBSP has no spread to show
        ax.legend(handles=[Line2D([], [], color="dimgrey", marker="o", ms=4, label="observed"),
                           Line2D([], [], color="dimgrey", ls="--", marker="x", ms=4, label="predicted")],
                  fontsize=8.5, loc="lower right")
    # one legend for the four panels, under them: inside a panel it covered the lines
    fig.legend(handles=axes[0].get_lines(), loc="outside lower center", ncol=min(len(models), 4), fontsize=9,
               title="sync model", title_fontsize=9.5)
    fig.suptitle("Sync models from 4 to 4,096 simulated workers (log-uniform speeds over 4x, jitter, slow phases)",
                 fontsize=12, fontweight="bold")
    return fig
