"""Which worker was slow, when, and by how much: the straggler pattern a run really had.

A job makes stragglers with ``[straggler]``: a constant slowdown per worker, log-normal jitter and
transient slow phases (``ebsp_mpi/straggler.py``). A worker sleeps after its forward and backward pass
until the iteration has taken the emulated time, ``(compute + base_s) × slowdown × phase × jitter``.
This draws one row per worker of one run: on the left each iteration's *work* (its start to the end of
the sleep: ``compute_s + delay_s`` of the ``iterations`` table) and its compute alone, against the time
it started, with the level the job asks for (jitter's median; slow phases shaded); on the right the
distribution of both and of the interval between iteration starts, which adds the push and the time the
sync model made the worker wait. ``report`` shows mean rates and a short window of the timeline, not
the pattern over the whole run.

The compute the trace holds is the work less the sleep, so it also counts the copy of the weights, the
wait for the previous push to complete and the sleep's overrun, none of which the slowdown scales; the
level uses the forward and backward time the summary measured (``compute_seconds``).

Given a sweep, it draws its first member (in the order BSP, ASP, SSP, ...): the pattern comes from the
job and the seed, not the sync model. Beyond 8 workers it shows 8: those with slow phases, then
others spread from the fastest to the slowest.

Input: any run, e.g. the straggler study's base job with a slow phase added::

    mpiexec -n 5 python -m ebsp_mpi train jobs/stragglers/base.toml --out runs/phases \\
        --set 'straggler.phases=[{worker = 0, t1 = 2.0, t2 = 4.0, factor = 4.0}]'
    python analysis/straggler_pattern.py runs/phases --out straggler_pattern.png

or ``python -m ebsp_mpi simulate`` with the same job, ``-n 4`` and ``--out``: it writes the same traces.
"""

from __future__ import annotations

import sys

import numpy as np
from common import PALETTE, NoData, main, named, note, save
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ebsp_mpi.sim.workers import NOMINAL_BASE_S
from ebsp_mpi.straggler import SlowPhase, StragglerModel

ROWS = 8


def job_model(frames) -> tuple[StragglerModel, float] | None:
    """The run's straggler model and the seconds it scales (base_s, or a simulation's stand-in for 0),
    or None where the iteration times did not come from it (model off, a replayed simulation)."""
    s = frames.config.get("straggler") or {}
    simulation = frames.summary.get("simulation")
    if not s.get("enabled", True) or (simulation and simulation.get("replay")):
        return None
    model = StragglerModel(frames.workers, slowdown=s.get("slowdown", []), jitter_sigma=s.get("jitter_sigma", 0.0),
                           base_s=s.get("base_s", 0.0), spread=s.get("spread", 1.0),
                           phases=[SlowPhase(**p) for p in s.get("phases", [])], seed=frames.config.get("seed", 0))
    base = model.base_s if (model.base_s > 0 or not simulation) else NOMINAL_BASE_S
    return model, base


def shown(it, model) -> list[int]:
    """All workers, or ROWS of them: those with slow phases, then others evenly over their speeds."""
    by_speed = (it["compute_s"] + it["delay_s"]).groupby(it["worker"]).median().sort_values().index.tolist()
    if len(by_speed) <= ROWS:
        return sorted(by_speed)
    picks = list(dict.fromkeys(p.worker for p in model.phases)) if model else []
    for i in np.linspace(0, len(by_speed) - 1, ROWS).round().astype(int):
        if len(picks) < ROWS and by_speed[i] not in picks:
            picks.append(by_speed[i])
    return sorted(picks[:ROWS])


def gradient_compute(frames, it) -> dict[int, float]:
    """Seconds of forward and backward pass per iteration of each worker, as the summary measured them
    (what the straggler model scales), else the median of the traced ``compute_s``."""
    measured, counts = frames.summary.get("compute_seconds"), frames.summary.get("iterations")
    if isinstance(measured, list) and isinstance(counts, list) and len(measured) == len(counts) == frames.workers:
        return {w: s / n if n else 0.0 for w, (s, n) in enumerate(zip(measured, counts, strict=True))}
    return it.groupby("worker")["compute_s"].median().to_dict()


def draw_worker(left, right, mine, series, bins, title: str, level=None, phases=()) -> None:
    """One worker's row: its iterations over time (left) and their distribution (right)."""
    t = mine["t_start"]
    for column, colour, name in series:
        left.scatter(t, 1000 * mine[column], s=4, color=colour, label=name)
        right.hist(1000 * mine[column], bins=bins, orientation="horizontal", color=colour, alpha=0.6)
    right.hist(1000 * mine["interval_s"].dropna(), bins=bins, orientation="horizontal", histtype="step",
               color=PALETTE[3], lw=1.3)
    if level is not None:
        left.plot(*level, color="black", lw=1, drawstyle="steps-post",
                  label="the job's level: (compute + base_s) × slowdown × phase")
    for p in phases:
        left.axvspan(p.t1, min(p.t2, t.max()), color="grey", alpha=0.2, lw=0)
        during = (t >= p.t1) & (t < p.t2)
        if during.any() and (~during).any():
            seen = mine["work_s"][during].median() / mine["work_s"][~during].median()
            title += f"; slow phase ×{p.factor:g} at {p.t1:g}–{p.t2:g} s: ×{seen:.1f} observed"
    left.set_title(title, loc="left", fontsize=10)
    left.set_yscale("log")
    left.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    left.yaxis.set_minor_formatter(NullFormatter())
    left.set_ylabel("ms")
    left.grid(alpha=0.3, which="both")
    right.grid(alpha=0.3)


def draw(runs, out: str) -> None:
    label, frames = next(((lab, f) for lab, f in runs if len(f.table("iterations"))), (None, None))
    if frames is None:
        raise NoData(", ".join(lab for lab, _ in runs) + ": no worker iterations in the traces")
    if len(runs) > 1:
        note(f"drawing {label} ({frames.path}), the first of {len(runs)} runs")
    it = frames.table("iterations").copy()
    it["work_s"] = it["compute_s"] + it["delay_s"]  # t_start to t_compute_end: compute, then the sleep
    it["interval_s"] = -it.groupby("worker")["t_start"].diff(-1)  # to the start of the next iteration
    found = job_model(frames)
    model, base = found if found else (None, 0.0)
    compute = gradient_compute(frames, it)
    workers = shown(it, model)
    simulated = bool(frames.summary.get("simulation")) or not (it["compute_s"] > 0).any()

    values = 1000 * it[["work_s", "interval_s", "compute_s"]].to_numpy().ravel()
    values = values[values > 0]
    bins = np.geomspace(values.min(), values.max(), 50)
    end = float(it["t_end"].max())
    fastest = float(it.groupby("worker")["work_s"].median().min())
    fig = Figure(figsize=(12, 1.4 + 1.5 * len(workers)), layout="constrained")
    axes = fig.subplots(len(workers), 2, sharex="col", sharey=True, squeeze=False, width_ratios=[4, 1])
    series = [("work_s", PALETTE[1], "compute + injected delay (the work)")]
    if not simulated:
        traced = "compute as traced (with the copy of the weights, the previous push and the sleep's overrun)"
        series.append(("compute_s", PALETTE[0], traced))
    grid = np.linspace(0, end, 2000)
    for (left, right), w in zip(axes, workers, strict=True):
        mine = it[it["worker"] == w]
        title = f"worker {w}: work {mine['work_s'].median() / fastest:.1f}× the fastest worker's (medians)"
        if model is None:
            draw_worker(left, right, mine, series, bins, title)
            continue
        level = (compute[w] + base) * model.slowdown[w] * np.array([model.phase_factor(w, x) for x in grid])
        draw_worker(left, right, mine, series, bins, title, (grid, 1000 * level),
                    [p for p in model.phases if p.worker == w])
    axes[-1, 0].set_xlabel("wall time at the iteration's start (s)")
    axes[-1, 0].set_xlim(0, end)
    axes[-1, 1].set_xlabel("iterations")
    handles, names = axes[0, 0].get_legend_handles_labels()
    handles.append(Line2D([], [], color=PALETTE[3], lw=1.3))
    names.append("interval between iteration starts (work + push + wait; histogram only)")
    fig.legend(handles, names, loc="outside lower center", ncols=2, fontsize=9, markerscale=3)
    if simulated:
        summary = " (a simulation: no real compute)"
    else:
        measured = sum(compute[w] * n for w, n in it.groupby("worker").size().items())
        summary = (f": compute as traced {it['compute_s'].sum() / it['work_s'].sum():.0%} of the work, "
                f"measured forward + backward {measured / it['work_s'].sum():.0%}")
    save(fig, out, f"Straggler pattern of {named(label, frames)}{summary}")


if __name__ == "__main__":
    sys.exit(main(draw, __doc__, "straggler_pattern.png"))
