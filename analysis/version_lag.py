"""How far behind the global model is each worker, and how does that change over the run?

A worker computes its gradient on the weights of some version; by the time the push arrives, the
server has applied other workers' gradients and the global model has moved on. That lag is the push's
*staleness* (``pushes.staleness``: ``version_before`` minus the version the gradient was computed
from). This draws one panel per run: each worker's staleness at each of its applied pushes against
the time the push arrived (dots), with a running median (line); ElasticBSP's barriers are marked on
the time axis. What to look for: which worker lags, whether it lags steadily (a slow worker) or for a
while (a slow phase: the others push more during each of its iterations), and what the sync model
makes of it (BSP: 0; SSP bounds the workers' iteration gap, not this lag). With more than 8 workers a
panel shows the median over the workers and the band of the middle 80%, in time bins. ``report``
shows the distribution of staleness per sync model, not per worker nor over time. Of several seeds
of one sweep member, the first is drawn.

Input: a sweep of several sync models, e.g. the straggler study (5 sync models, one seed)::

    python -m ebsp_mpi sweep jobs/sweeps/stragglers.toml -n 5 --seeds 3 --out runs/stragglers
    python analysis/version_lag.py runs/stragglers --out version_lag.png

or one run (``train --out`` or ``simulate --out``).
"""

from __future__ import annotations

import sys

import numpy as np
from common import PALETTE, NoData, main, save
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

#: Pushes per worker in the running median.
WINDOW = 15
#: Above this many workers a panel shows quantiles over the workers instead of one line each.
MANY = 8


def applied_pushes(frames):
    pushes = frames.table("pushes")
    return pushes[pushes["rejected"] == 0].sort_values("t")


def per_worker(ax, pushes, workers: int) -> None:
    for w in range(workers):
        mine = pushes[pushes["worker"] == w]
        colour = PALETTE[w % len(PALETTE)]
        ax.scatter(mine["t"], mine["staleness"], s=5, color=colour, alpha=0.35, lw=0)
        running = mine["staleness"].rolling(WINDOW, center=True, min_periods=1).median()
        ax.plot(mine["t"], running, color=colour, lw=1.6, label=f"worker {w}")


def over_workers(ax, pushes, end: float) -> None:
    bins = np.linspace(0, end, 60)
    pushes = pushes.assign(bin=np.digitize(pushes["t"], bins))
    # each worker's mean lag in each time bin, then quantiles of those over the workers
    q = pushes.groupby(["bin", "worker"])["staleness"].mean().groupby("bin").quantile([0.1, 0.5, 0.9]).unstack()
    t = bins[np.clip(q.index.to_numpy() - 1, 0, len(bins) - 1)]
    ax.fill_between(t, q[0.1], q[0.9], color=PALETTE[0], alpha=0.25, lw=0, step="post",
                    label="10th–90th percentile over workers")
    ax.plot(t, q[0.5], color=PALETTE[0], lw=1.6, drawstyle="steps-post", label="median over workers")


def draw(runs, out: str) -> None:
    firsts = {}  # several seeds of one member: the first is drawn
    for label, frames in runs:
        pushes = applied_pushes(frames)
        if len(pushes) and label not in firsts:
            firsts[label] = (label, frames, pushes)
    runs = list(firsts.values())
    if not runs:
        raise NoData("no applied push in these runs' traces (the server's file, rank 0, holds them)")
    end = max(float(p["t"].max()) for _, _, p in runs)
    fig = Figure(figsize=(11, 1.2 + 2.3 * len(runs)), layout="constrained")
    axes = fig.subplots(len(runs), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    worst = {}
    for ax, (label, frames, pushes) in zip(axes, runs, strict=True):
        if frames.workers <= MANY:
            per_worker(ax, pushes, frames.workers)
        else:
            over_workers(ax, pushes, end)
        for t in frames.table("barriers")["t_released"]:  # ElasticBSP
            ax.axvline(t, ymin=0, ymax=0.04, color="black", lw=0.8)
        medians = pushes.groupby("worker")["staleness"].median()
        worst[label] = (int(medians.idxmax()), float(medians.max()))
        ax.set_title(f"{label}: median {pushes['staleness'].median():g}, max {pushes['staleness'].max()} "
                     f"over {len(pushes)} pushes", loc="left", fontsize=10.5)
        ax.set_ylabel("staleness\n(versions behind)")
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.5, None)
    axes[-1].set_xlim(0, end)
    axes[-1].set_xlabel("wall time of the push's arrival at the server (s)")
    handles, names = axes[0].get_legend_handles_labels()
    if any(len(f.table("barriers")) for _, f, _ in runs):
        handles.append(Line2D([], [], color="black", lw=0.8))
        names.append("ElasticBSP barrier (release)")
    many = runs[0][1].workers > MANY
    fig.legend(handles, names, loc="outside lower center", ncols=min(len(names), 5), fontsize=9,
               title=None if many else f"dots: pushes; lines: running median of {WINDOW} pushes")
    title = "Version lag at each push; the laggiest worker's median is " + ", ".join(
        f"{m:g} (worker {w}) under {label}" if m else f"0 under {label}" for label, (w, m) in worst.items())
    save(fig, out, title)


if __name__ == "__main__":
    sys.exit(main(draw, __doc__, "version_lag.png"))
