"""Who waits at each barrier, and how much of the workers' time do the barriers cost over a run?

BSP ends every round with a barrier; ElasticBSP places one only where ZipLine predicts the workers
arrive close together, and lets fast workers run several iterations in between. This draws, for each
run with barriers, a heatmap of every worker's idle time at every barrier (a column spans the
superstep the barrier ends, so column widths are superstep lengths and the time axis is shared), and
below it the share of all worker time spent idle at barriers so far, against wall time. ``report``
shows waiting per iteration and per worker, not per barrier or over time.

A worker's idle time at a barrier is the time from its arrival (its push) to the barrier's release:
for ElasticBSP from the server's ``barriers`` (``t_released``) and ``barrier_members``
(``arrival_t``) tables; for BSP, whose rounds are implicit, from the ``pulls`` table
(``t_reply - t_request``), where a round is the replies that bring the workers a new version (a stop
reply repeats the version a worker has). Runs of other sync models have no barrier and are left out;
of several seeds of one sweep member, the first is drawn.

Input: a sweep with BSP and ElasticBSP members, e.g.::

    python -m ebsp_mpi sweep jobs/sweeps/stragglers.toml -n 5 --seeds 3 --out runs/stragglers
    python analysis/barrier_waits.py runs/stragglers --out barrier_waits.png

or, with no MPI, two simulated runs in one directory::

    python -m ebsp_mpi simulate jobs/stragglers/base.toml -n 4 --set sync.model=bsp --out sim/bsp
    python -m ebsp_mpi simulate jobs/stragglers/base.toml -n 4 --set sync.model=elasticbsp --out sim/ebsp
    python analysis/barrier_waits.py sim
"""

from __future__ import annotations

import sys

import numpy as np
from common import PALETTE, NoData, main, named, note, save
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

#: Idle times below this (ms) share the lowest colour: the last worker to arrive waits ~0.
FLOOR_MS = 0.1


def barrier_waits(frames) -> tuple[np.ndarray, np.ndarray] | None:
    """(superstep edges (s), idle ms of shape (workers, barriers), NaN where a worker was not a member)
    of a run, or None where it has no barrier."""
    workers = frames.workers
    barriers = frames.table("barriers")
    if len(barriers):  # ElasticBSP: ZipLine's barriers
        members = frames.table("barrier_members").merge(barriers[["barrier", "t_released"]], on="barrier")
        members["idle"] = members["t_released"] - members["arrival_t"]
        released = barriers.sort_values("barrier")["t_released"].to_numpy()
        column = members["barrier"].to_numpy()
    elif frames.sync == "bsp":  # BSP: one round per version; version 0 is the start, not a barrier
        pulls = frames.table("pulls").sort_values(["worker", "t_request"])
        # a round's reply brings a worker a newer version; a stop reply repeats the one it has
        newer = pulls.groupby("worker")["version"].diff().fillna(1) > 0
        members = pulls[newer & (pulls["version"] > 0)].copy()
        members["idle"] = members["t_reply"] - members["t_request"]
        rounds = members.groupby("version")["t_reply"].max().sort_index()
        released = rounds.to_numpy()
        column = members["version"].map({v: i for i, v in enumerate(rounds.index)}).to_numpy()
    else:
        return None
    if not len(released):
        return None
    idle = np.full((workers, len(released)), np.nan)
    idle[members["worker"].to_numpy(), column] = 1000 * members["idle"].to_numpy()
    return np.concatenate([[0.0], released]), idle


def draw(runs, out: str) -> None:
    data, without = {}, []
    for label, frames in runs:
        waits = barrier_waits(frames)
        if waits is None:
            without.append(named(label, frames))
        elif label not in data:  # several seeds of one member: the first is drawn
            data[label] = (frames, *waits)
    if not data:
        raise NoData(f"no barriers (BSP or ElasticBSP) in {', '.join(without)}")
    note(*(f"left out {name}: no barriers" for name in without))

    top = max(np.nanmax(idle) for _, _, idle in data.values())
    norm = LogNorm(vmin=FLOOR_MS, vmax=max(top, 10 * FLOOR_MS))
    rows = [0.6 + 0.25 * min(max(f.workers, 4), 16) for f, _, _ in data.values()]  # inches per panel
    fig = Figure(figsize=(11, 2.6 + sum(rows)), layout="constrained")
    axes = fig.subplots(len(data) + 1, 1, sharex=True, height_ratios=[*rows, 2.2])
    shares = {}
    for k, (ax, (label, (frames, edges, idle))) in enumerate(zip(axes[:-1], data.items(), strict=True)):
        mesh = ax.pcolormesh(edges, np.arange(frames.workers + 1) - 0.5, np.maximum(idle, FLOOR_MS),
                             norm=norm, cmap="magma_r")
        steps = np.diff(edges)
        ax.set_title(f"{label}: {idle.shape[1]} barriers, a superstep every {1000 * np.median(steps):.0f} ms "
                     f"(median)", loc="left", fontsize=10.5)
        ax.set_ylabel("worker")
        ax.set_yticks(range(frames.workers) if frames.workers <= 16 else
                      np.linspace(0, frames.workers - 1, 5).round())
        ax.invert_yaxis()

        # share of worker time idle at barriers up to each release: cumulative idle over the seconds
        # the workers had run by then (a worker that has stopped no longer counts)
        spent = np.nancumsum(np.nansum(idle, axis=0)) / 1000
        stopped = frames.table("iterations").groupby("worker")["t_end"].max().to_numpy()
        share = 100 * spent / np.minimum(edges[1:, None], stopped[None, :]).sum(axis=1)
        shares[label] = share[-1]
        axes[-1].plot(edges[1:], share, color=PALETTE[k % len(PALETTE)], lw=1.8, label=label)
    fig.colorbar(mesh, ax=axes[:-1], label="idle at the barrier (ms, log scale)", shrink=0.9)
    axes[-1].set_ylabel("worker time idle at\nbarriers so far (%)")
    axes[-1].set_xlabel("wall time (s): a column spans the superstep its barrier ends")
    axes[-1].set_ylim(0, None)
    axes[-1].grid(alpha=0.3)
    axes[-1].legend(title="run", fontsize=9, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save(fig, out, "Idle at barriers over the whole run: "
         + ", ".join(f"{share:.0f}% of worker time under {label}" for label, share in shares.items()))


if __name__ == "__main__":
    sys.exit(main(draw, __doc__, "barrier_waits.png"))
