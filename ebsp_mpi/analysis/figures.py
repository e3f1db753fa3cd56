"""The report's figures, one function each, drawn with matplotlib's object API (Agg, no pyplot state).

Each function takes the runs (:class:`~ebsp_mpi.analysis.metrics.Run`), writes one PNG and returns its
title, which states what the figure shows in numbers computed from the runs (so the claim is true of
these runs, not of runs in general). Runs sharing a label (seeds of one sweep member) share a colour.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, SymmetricalLogLocator

from .compare import Comparison
from .metrics import Run, accuracy_curve, barrier_times, slowest_worker, spreads, worker_stats

#: Okabe–Ito colours: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442")

#: Phases of a worker iteration in the timeline, in time order: (name in the legend, colour).
PHASES = (("compute", "#0072B2"), ("injected straggler delay", "#9ecae1"), ("push", "#E69F00"),
          ("wait for the pull (held or in transit)", "#D55E00"))

DPI = 110

#: Above this many workers the per-worker figures aggregate: the timeline shows a sample of the workers
#: (spread over their speeds), waiting and iteration rates become lines and quantile bands over the
#: workers instead of one box or bar each (a simulated run may have thousands).
MANY_WORKERS = 32
#: Workers a timeline panel shows of a run with more than MANY_WORKERS.
TIMELINE_ROWS = 24


def labels_of(runs: Sequence[Run]) -> list[str]:
    return list(dict.fromkeys(r.label for r in runs))


def colours(runs: Sequence[Run]) -> dict[str, str]:
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels_of(runs))}


def _by_label(runs: Sequence[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(r.label, []).append(r)
    return out


def _save(fig: Figure, path: Path, title: str) -> str:
    # about 9 characters of the bold title font per inch of figure width
    fig.suptitle(textwrap.fill(title, width=int(9 * fig.get_figwidth())), fontsize=12.5, fontweight="bold")
    fig.savefig(path, dpi=DPI)
    return title


def _legend_label(label: str, n: int) -> str:
    return label if n == 1 else f"{label} ({n} seeds)"


def _worker_ticks(ax, shown: Sequence[int], slow: int | None, axis: str = "x") -> None:
    """Name the workers `shown` at ticks 0, 1, ... of `axis`; the slowest is marked under its name
    on the x axis, beside it on the y axis."""
    mark = "\nslowest" if axis == "x" else " slowest"
    names = [f"worker {w}" + (mark if w == slow else "") for w in shown]
    (ax.set_xticks if axis == "x" else ax.set_yticks)(range(len(shown)), names)


def _common_slowest(runs: Sequence[Run]) -> int | None:
    votes = [slowest_worker(r.frames) for r in runs]
    votes = [v for v in votes if v is not None]
    return max(set(votes), key=votes.count) if votes else None


def _extremes(values: dict, fmt: str) -> str:
    """"<max> under A, <min> under B", or "<value> under A" when all labels agree (or there is one)."""
    if not values:
        return "(no data)"
    hi, lo = max(values, key=values.get), min(values, key=values.get)
    if fmt.format(values[hi]) == fmt.format(values[lo]) and len(values) > 1:  # naming one would single it out
        return f"{fmt.format(values[hi])} under each of {', '.join(values)}"
    text = f"{fmt.format(values[hi])} under {hi}"
    if values[hi] != values[lo]:
        text += f", {fmt.format(values[lo])} under {lo}"
    return text


def _fmt_s(t: float | None) -> str:
    """Seconds to a target: None where the runs recorded no time for it (no such target in their
    eval.targets, or a simulation: no accuracy), inf where they never reached it."""
    if t is None:
        return "not recorded"
    return "never" if math.isinf(t) else f"{t:.2f} s"


# -- 1. test accuracy against wall time ---------------------------------------------------------


def _accuracy_claim(cmp: Comparison) -> str:
    reached = [(t, g) for t in sorted(cmp.targets, reverse=True) for g in cmp.groups
               if g.times.get(t) is not None and not math.isinf(g.times[t])]
    if not reached:
        return "Test accuracy against wall time: no run's summary records an accuracy target reached"
    target = reached[0][0]
    best = min((g for t, g in reached if t == target), key=lambda g: g.times[target])
    median = " (median over seeds)" if len(best.seeds) > 1 else ""
    claim = f"First to {target:.0%} test accuracy: {best.label} at {best.times[target]:.2f} s{median}"
    ref = next((g for g in cmp.groups if g.label == cmp.reference), None)
    if ref is not None and ref is not best:
        claim += f"; {ref.label}: {_fmt_s(ref.times[target])}"
    return claim


def _on_grid(curve, grid: np.ndarray) -> np.ndarray:
    """The accuracy last evaluated at or before each grid time (NaN before the first evaluation)."""
    t, acc = curve["t"].to_numpy(), curve["test_acc"].to_numpy()
    k = np.searchsorted(t, grid, side="right") - 1
    out = np.where(k >= 0, acc[np.clip(k, 0, None)], np.nan)
    out[grid > t[-1]] = np.nan  # not past the run's end
    return out


def accuracy_vs_time(runs: Sequence[Run], cmp: Comparison, path: Path) -> str:
    """One line per label: the run's evaluations, or with several seeds their median at each instant
    (bold) and the range over seeds (shaded)."""
    fig = Figure(figsize=(10, 6), layout="constrained")
    ax = fig.add_subplot()
    colour = colours(runs)
    curves = {label: [c for c in (accuracy_curve(r.frames) for r in group) if len(c)]
              for label, group in _by_label(runs).items()}
    end = max((float(c["t"].iloc[-1]) for cs in curves.values() for c in cs), default=1.0)
    grid = np.linspace(0.0, end, 800)
    lowest = 1.0
    several = False
    for label, cs in curves.items():
        if not cs:
            continue
        lowest = min(lowest, min(float(c["test_acc"].min()) for c in cs))
        if len(cs) == 1:
            # a few evaluations: a step line alone would hide them (one evaluation draws nothing)
            ax.plot(cs[0]["t"], 100 * cs[0]["test_acc"], color=colour[label], lw=1.8, drawstyle="steps-post",
                    marker="o" if len(cs[0]) < 20 else None, ms=4, label=label)
            continue
        several = True
        on_grid = 100 * np.stack([_on_grid(c, grid) for c in cs])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before the first evaluation
            median = np.nanmedian(on_grid, axis=0)
            lo, hi = np.nanmin(on_grid, axis=0), np.nanmax(on_grid, axis=0)
        ax.fill_between(grid, lo, hi, color=colour[label], alpha=0.15, lw=0, step="post")
        ax.plot(grid, median, color=colour[label], lw=2.0, drawstyle="steps-post",
                label=_legend_label(label, len(cs)))
    for target in cmp.targets:
        ax.axhline(100 * target, color="grey", ls=":", lw=1)
        ax.annotate(f"target {target:.0%}", (1.0, 100 * target), xycoords=("axes fraction", "data"),
                    xytext=(-4, 3), textcoords="offset points", ha="right", fontsize=9, color="dimgrey")
    # The first evaluations (near chance) squash the part that differs between models: start the axis
    # below the lowest target, and say so on the axis.
    floor = max(0.0, 100 * min(cmp.targets) - 20) if cmp.targets else 100 * lowest
    if not any(curves.values()):  # nothing drawn: the whole range (an axis from 100% has no height)
        floor = 0.0
    floor = min(floor, 90.0)  # every evaluation at 100%: still an axis with a height
    ax.set_ylim(floor, 100)
    ax.set_xlim(0, 1.01 * end)  # the last evaluation's marker whole, not cut by the frame
    ax.set_xlabel("wall time since the start of the run (s)")
    ax.set_ylabel("test accuracy (%)" + (f", axis from {floor:.0f}%" if floor > 100 * lowest else ""))
    ax.grid(alpha=0.3)
    if any(curves.values()):
        ax.legend(title="sync model" + ("\n(line: median over seeds,\nband: min–max)" if several else ""),
                  loc="lower right")
    else:  # the server's trace (rank 0) of every run is missing or damaged: say so on the empty axes
        ax.text(0.5, 0.5, "no test evaluation in these runs' traces", transform=ax.transAxes, ha="center")
    return _save(fig, path, _accuracy_claim(cmp))


# -- 2. per-worker timeline ---------------------------------------------------------------------


def representatives(runs: Sequence[Run], limit: int = 6) -> list[Run]:
    """One run per label (the lowest seed), at most ``limit``: the panels of the timeline."""
    out = []
    for group in _by_label(runs).values():
        out.append(min(group, key=lambda r: -1 if r.info.seed is None else r.info.seed))
    return out[:limit]


def default_window(runs: Sequence[Run]) -> tuple[float, float]:
    """(start, length) in seconds: about a dozen of the slowest worker's iterations, taken 40% into
    the shortest run (past the start-up, before any worker has finished)."""
    per_iteration, walls = [], []
    for r in runs:
        it = r.frames.table("iterations")
        if it.empty:
            continue
        per_iteration.append(float((it["compute_s"] + it["delay_s"] + it["push_s"]).groupby(it["worker"])
                                   .median().max()))
        walls.append(float(it["t_end"].max()))
    if not walls:
        return 0.0, 1.0
    length = min(max(12 * max(per_iteration), 0.05), 0.5 * min(walls))
    return 0.4 * min(walls), length


def _phase_spans(it, start: float, stop: float) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per phase of :data:`PHASES`: (worker, begin, end) of every iteration's phase that overlaps
    [start, stop], clipped to it (s)."""
    delay_begin = it["t_compute_end"] - it["delay_s"]
    bounds = [(it["t_start"], delay_begin), (delay_begin, it["t_compute_end"]),
              (it["t_compute_end"], it["t_push"]), (it["t_push"], it["t_end"])]
    worker = it["worker"].to_numpy()
    out = []
    for begin, end in bounds:
        b, e = np.clip(begin.to_numpy(), start, stop), np.clip(end.to_numpy(), start, stop)
        keep = e > b
        out.append((worker[keep], b[keep], e[keep]))
    return out


def _wait_share(it, start: float, stop: float) -> np.ndarray:
    """Per worker, the share of [start, stop] spent waiting for the pull."""
    b = np.clip(it["t_push"].to_numpy(), start, stop)
    e = np.clip(it["t_end"].to_numpy(), start, stop)
    waited = np.zeros(int(it["worker"].max()) + 1)
    np.add.at(waited, it["worker"].to_numpy(), e - b)
    return waited / (stop - start)


def shown_workers(run: Run) -> list[int]:
    """The workers a timeline panel shows: all of them, or for more than :data:`MANY_WORKERS`,
    :data:`TIMELINE_ROWS` spread evenly over their speeds (median iteration time), fastest to slowest."""
    workers = run.frames.workers
    if workers <= MANY_WORKERS:
        return list(range(workers))
    it = run.frames.table("iterations")
    by_speed = (it["compute_s"] + it["delay_s"]).groupby(it["worker"]).median().sort_values().index.tolist()
    picks = np.unique(np.linspace(0, len(by_speed) - 1, TIMELINE_ROWS).round().astype(int))
    return [int(by_speed[i]) for i in picks]


def timeline(runs: Sequence[Run], path: Path, window: tuple[float, float] | None = None) -> str:
    panels = representatives(runs)
    start, length = window or default_window(runs)
    stop = start + length
    rows = {id(p): shown_workers(p) for p in panels}
    height = 1.6 + sum(0.55 + 0.32 * max(len(rows[id(p)]), 1) for p in panels)
    fig = Figure(figsize=(12, height), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    claims = []
    for ax, run in zip(axes, panels, strict=True):
        it = run.frames.table("iterations")
        slow = slowest_worker(run.frames)
        workers = run.frames.workers
        win = it[(it["t_end"] > start) & (it["t_start"] < stop)]
        shown = rows[id(run)]
        for (_, colour), (worker, begin, end) in zip(PHASES, _phase_spans(win, start, stop), strict=True):
            for y, w in enumerate(shown):
                mine = worker == w
                if mine.any():
                    ax.broken_barh(list(zip(begin[mine], end[mine] - begin[mine], strict=True)), (y - 0.38, 0.76),
                                   facecolors=colour, edgecolor="none")
        for t in barrier_times(run.frames):
            if start <= t <= stop:
                ax.axvline(t, color="black", lw=1.0, ls="--", alpha=0.8)
        share = _wait_share(win, start, stop) if len(win) else np.zeros(workers)
        fast = [w for w in range(len(share)) if w != slow]
        fast_share = float(np.mean(share[fast])) if fast else math.nan
        slow_share = float(share[slow]) if slow is not None and slow < len(share) else math.nan
        claims.append((run.label, fast_share))
        sampled = f" ({len(shown)} of {workers} workers shown, by speed)" if len(shown) < workers else ""
        ax.set_title(f"{run.label}: the other workers wait {fast_share:.0%} of this window, "
                     f"worker {slow} (slowest) {slow_share:.0%}{sampled}", fontsize=11, loc="left")
        _worker_ticks(ax, shown, slow, axis="y")
        ax.set_ylim(-0.6, len(shown) - 0.4)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlim(start, stop)
    axes[-1].set_xlabel("wall time since the start of the run (s)")
    handles = [Patch(color=c, label=n) for n, c in PHASES]
    handles.append(Line2D([], [], color="black", ls="--", label="barrier: all workers released together"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=10)
    title = (f"Who waits for whom, t = {start:.2f}–{stop:.2f} s: the fast workers wait for the pull "
             + _extremes({label: share for label, share in claims if not math.isnan(share)}, "{:.0%} of the time"))
    return _save(fig, path, title)


# -- 3. waiting time per worker -----------------------------------------------------------------


def _grouped_positions(workers: int, groups: int, width: float = 0.8) -> np.ndarray:
    """x of group j's box/bar at worker w: (workers, groups) array."""
    step = width / groups
    return np.arange(workers)[:, None] + (np.arange(groups) - (groups - 1) / 2)[None, :] * step


def _per_worker_axes(runs: Sequence[Run], fill: float):
    """The common frame of the per-worker figures: one group of boxes or bars per worker, one member
    per sync model. Returns (runs by label, colours, workers, slowest worker, x positions (workers,
    labels), box width, figure, axes)."""
    by_label = _by_label(runs)
    workers = max(r.frames.workers for r in runs)
    fig = Figure(figsize=(11, 6), layout="constrained")
    return (by_label, colours(runs), workers, _common_slowest(runs), _grouped_positions(workers, len(by_label)),
            0.8 / len(by_label) * fill, fig, fig.add_subplot())


def _wait_scale(ax, waits_ms: np.ndarray) -> str:
    """Put the waiting axis on a symmetric-log scale and return its label's note.

    Waits span four decades (a pull answered at once: ~0.1 ms live, exactly 0 in a simulation; a
    barrier held for a straggler: tens of ms). A log axis cannot show 0 and a linear one flattens the
    short waits into a line; symlog is linear from 0 to ``linthresh`` and logarithmic above it, with
    ``linthresh`` the decade below the short waits, so no wait is moved and every box has a height.
    """
    positive = waits_ms[waits_ms > 0]
    low = float(np.percentile(positive, 5)) if len(positive) else 1.0
    linthresh = float(np.clip(10.0 ** math.floor(math.log10(low)), 1e-3, 1.0))
    ax.set_yscale("symlog", linthresh=linthresh, linscale=0.6)
    ax.set_ylim(bottom=-0.05 * linthresh)  # a line of zero waits stays clear of the axis
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(SymmetricalLogLocator(linthresh=linthresh, base=10, subs=(2, 3, 5)))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if v >= linthresh else ""))
    return f"log scale above {linthresh:g} ms, linear below"


def wait_distribution(runs: Sequence[Run], path: Path) -> str:
    if max(r.frames.workers for r in runs) > MANY_WORKERS:
        return _wait_bands(runs, path)
    by_label, colour, workers, slow, pos, width, fig, ax = _per_worker_axes(runs, 0.85)
    fast_median, drawn = {}, []
    for j, (label, group) in enumerate(by_label.items()):
        it = _concat([r.frames.table("iterations") for r in group])
        waits = [1000 * it.loc[it["worker"] == w, "wait_s"].to_numpy() for w in range(workers)]
        present = [w for w in range(workers) if len(waits[w])]
        if not present:
            continue
        drawn += [waits[w] for w in present]
        ax.boxplot([waits[w] for w in present], positions=pos[present, j], widths=width, whis=(5, 95),
                   showfliers=False, patch_artist=True, manage_ticks=False,
                   boxprops=dict(facecolor=colour[label], alpha=0.75, edgecolor="black"),
                   medianprops=dict(color="white" if colour[label] == "#000000" else "black", lw=1.5))
        fast = np.concatenate([waits[w] for w in present if w != slow] or [np.zeros(0)])
        fast_median[label] = float(np.median(fast)) if len(fast) else math.nan
    scale = _wait_scale(ax, np.concatenate(drawn) if drawn else np.zeros(0))
    ax.set_ylabel(f"wait for the pull per iteration (ms, {scale})")
    _worker_ticks(ax, range(workers), slow)
    ax.set_xlim(-0.6, workers - 0.4)
    ax.grid(axis="y", which="both", alpha=0.25)
    ax.legend(handles=[Patch(facecolor=colour[lab], alpha=0.75, edgecolor="black",
                             label=_legend_label(lab, len(g))) for lab, g in by_label.items()],
              title="sync model", fontsize=9, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    # under the axes, not on them: no box or whisker can run into it
    ax.set_xlabel("boxes: quartiles and median; whiskers: 5th–95th percentile", fontsize=8.5, color="dimgrey")
    known = {k: v for k, v in fast_median.items() if not math.isnan(v)}
    if known:
        title = "Waiting per iteration: the fast workers' median wait is " + _extremes(known, "{:.2f} ms")
    else:
        title = "Waiting per iteration, per worker"
    return _save(fig, path, title)


def _wait_bands(runs: Sequence[Run], path: Path) -> str:
    """Many workers: per sync model, each worker's median wait per iteration as a line over the workers
    and its 5th–95th percentile as a band."""
    by_label, colour = _by_label(runs), colours(runs)
    fig = Figure(figsize=(11, 6), layout="constrained")
    ax = fig.add_subplot()
    medians, drawn = {}, []
    for label, group in by_label.items():
        it = _concat([r.frames.table("iterations") for r in group])
        if not len(it):
            continue
        waits = (1000 * it["wait_s"]).groupby(it["worker"])
        q = waits.quantile([0.05, 0.5, 0.95]).unstack()
        ax.fill_between(q.index, q[0.05], q[0.95], color=colour[label], alpha=0.18, lw=0)
        ax.plot(q.index, q[0.5], color=colour[label], lw=1.2, label=_legend_label(label, len(group)))
        medians[label] = float(np.median(1000 * it["wait_s"]))
        drawn.append(1000 * it["wait_s"].to_numpy())
    scale = _wait_scale(ax, np.concatenate(drawn) if drawn else np.zeros(0))
    ax.set_xlabel("worker")
    ax.set_ylabel(f"wait for the pull per iteration (ms, {scale})")
    ax.grid(which="both", alpha=0.25)
    ax.legend(title="sync model (line: median per worker,\nband: 5th–95th percentile)", fontsize=9,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    title = ("Waiting per iteration over all workers: the median wait is " + _extremes(medians, "{:.2f} ms")
             if medians else "Waiting per iteration, per worker")
    return _save(fig, path, title)


def _concat(frames):
    import pandas as pd

    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["worker", "wait_s"])


# -- 4. iterations per second per worker --------------------------------------------------------


def iteration_rate(runs: Sequence[Run], path: Path) -> str:
    if max(r.frames.workers for r in runs) > MANY_WORKERS:
        return _rate_lines(runs, path)
    by_label, colour, workers, slow, pos, width, fig, ax = _per_worker_axes(runs, 0.9)
    ratio = {}
    for j, (label, group) in enumerate(by_label.items()):
        rates = np.full((len(group), workers), np.nan)
        for i, run in enumerate(group):
            stats = worker_stats(run.frames)
            for w, v in stats["iterations_per_s"].items():
                rates[i, int(w)] = v
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a worker whose trace is missing: NaN
            mean = np.nanmean(rates, axis=0)
            err = (np.stack([mean - np.nanmin(rates, axis=0), np.nanmax(rates, axis=0) - mean])
                   if len(group) > 1 else None)
        ax.bar(pos[:, j], mean, width=width, color=colour[label], alpha=0.85, edgecolor="black", lw=0.5,
               yerr=err, capsize=3, label=_legend_label(label, len(group)))
        if slow is not None and mean[slow] > 0:
            fast = [mean[w] for w in range(workers) if w != slow]
            ratio[label] = float(np.nanmean(fast) / mean[slow]) if fast else math.nan
    ax.set_ylabel("iterations per second" + (" (bars: mean over seeds; lines: min–max)" if any(
        len(g) > 1 for g in by_label.values()) else ""))
    _worker_ticks(ax, range(workers), slow)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(title="sync model", fontsize=9, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    known = {k: v for k, v in ratio.items() if not math.isnan(v)}
    if known:
        title = ("Iterations per second: against the slowest worker, the fast workers run "
                 + _extremes(known, "{:.1f}×"))
    else:
        title = "Iterations per second per worker"
    return _save(fig, path, title)


def _rate_lines(runs: Sequence[Run], path: Path) -> str:
    """Many workers: per sync model, each worker's iterations per second (mean over seeds), workers
    sorted from the fastest to the slowest, as a line."""
    by_label, colour = _by_label(runs), colours(runs)
    fig = Figure(figsize=(11, 6), layout="constrained")
    ax = fig.add_subplot()
    spread = {}
    for label, group in by_label.items():
        rates = [worker_stats(r.frames)["iterations_per_s"] for r in group]
        mean = sum(rates) / len(rates)
        ordered = np.sort(mean.dropna().to_numpy())[::-1]
        if not len(ordered):
            continue
        ax.plot(np.arange(len(ordered)), ordered, color=colour[label], lw=1.4, label=_legend_label(label, len(group)))
        if ordered[-1] > 0:
            spread[label] = float(ordered[0] / ordered[-1])
    ax.set_xlabel("workers, fastest to slowest")
    ax.set_ylabel("iterations per second")
    ax.grid(alpha=0.3)
    ax.legend(title="sync model", fontsize=9, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    title = ("Iterations per second over all workers: the fastest worker against the slowest, "
             + _extremes(spread, "{:.1f}×") if spread else "Iterations per second per worker")
    return _save(fig, path, title)


# -- 5. staleness -------------------------------------------------------------------------------


def staleness(runs: Sequence[Run], path: Path) -> str:
    by_label = _by_label(runs)
    colour = colours(runs)
    values = {lab: _concat_col([r.frames.table("pushes") for r in g], "staleness") for lab, g in by_label.items()}
    top = max((int(v.max()) for v in values.values() if len(v)), default=0)
    smallest = min((100 / len(v) for v in values.values() if len(v)), default=1.0)  # one push, in %
    cols = 1 if len(values) <= 3 else 2
    rows = math.ceil(len(values) / cols)
    fig = Figure(figsize=(11, 1.2 + 2.0 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
    for ax, (label, v) in zip(axes, values.items(), strict=False):
        if len(v):
            counts = np.bincount(v.astype(np.int64), minlength=top + 1)
            share = 100 * counts / counts.sum()
            ax.bar(np.arange(top + 1)[counts > 0], share[counts > 0], width=0.85, color=colour[label], alpha=0.85,
                   edgecolor="black", lw=0.4)
            ax.set_title(f"{label}: median {np.median(v):g}, max {v.max()} ({len(v)} pushes)", fontsize=10.5,
                         loc="left")
        else:
            ax.set_title(f"{label}: no pushes recorded", fontsize=10.5, loc="left")
        ax.grid(axis="y", alpha=0.3)
    for ax in axes[len(values):]:
        ax.set_visible(False)
    for i, ax in enumerate(axes[:len(values)]):
        if i + cols >= len(values):  # nothing drawn below it: this panel carries the x axis
            ax.set_xlabel("staleness (versions the global model moved on\nbetween this gradient's pull and its push)")
            ax.tick_params(labelbottom=True)
        if i % cols == 0:
            ax.set_ylabel("share of pushes\n(log scale)")
    # log scale: the rare large staleness values are what tells the models apart
    axes[0].set_yscale("log")
    axes[0].set_ylim(min(0.5 * smallest, 1.0), 150)
    axes[0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    ax0 = axes[0]
    ax0.set_xticks(range(0, top + 1, max(1, math.ceil((top + 1) / 16))))
    maxima = {lab: int(v.max()) for lab, v in values.items() if len(v)}
    if maxima:
        title = "Staleness of pushed gradients: the largest is " + _extremes(maxima, "{}")
    else:
        title = "Staleness of pushed gradients"
    return _save(fig, path, title)


def _concat_col(frames, column: str) -> np.ndarray:
    parts = [f[column].to_numpy() for f in frames if len(f)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


# -- 6. ZipLine: predicted against observed spread ----------------------------------------------


def zipline_spread(runs: Sequence[Run], path: Path) -> str | None:
    """None (and no file) when no run has ElasticBSP barriers."""
    data = [(r, spreads(r.frames)) for r in runs]
    data = [(r, s) for r, s in data if len(s)]
    if not data:
        return None
    fig = Figure(figsize=(12, 5.5), layout="constrained")
    ax, hist = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.1, 1]})
    colour = colours([r for r, _ in data])
    seen = set()
    all_err, high = [], 0.0
    for run, s in data:
        pred, obs = 1000 * s["predicted_spread"].to_numpy(), 1000 * s["observed_spread"].to_numpy()
        label = run.label if run.label not in seen else None
        seen.add(run.label)
        ax.scatter(pred, obs, s=18, alpha=0.6, color=colour[run.label], edgecolor="none",
                   label=_legend_label(run.label, sum(1 for r, _ in data if r.label == run.label)) if label else None)
        all_err.append(obs - pred)
        high = max(high, float(np.nanmax(pred)), float(np.nanmax(obs)))
    ax.plot([0, high * 1.05], [0, high * 1.05], color="grey", ls="--", lw=1, label="observed = predicted")
    ax.set_xlim(0, high * 1.05)
    ax.set_ylim(0, high * 1.05)
    ax.set_xlabel("predicted spread at the decision (ms)")
    ax.set_ylabel("observed spread: last − first arrival at the barrier (ms)")
    ax.set_title("one dot per barrier", fontsize=10.5, loc="left")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")
    err = np.concatenate(all_err)
    hist.hist(err, bins=min(40, max(10, len(err) // 5)), color="#D55E00", alpha=0.8, edgecolor="black", lw=0.4)
    hist.axvline(0, color="grey", ls="--", lw=1)
    hist.axvline(float(np.median(err)), color="black", lw=1.2, label=f"median {np.median(err):+.1f} ms")
    hist.set_xlabel("observed − predicted spread (ms)")
    hist.set_ylabel("barriers")
    hist.yaxis.set_major_locator(MaxNLocator(integer=True))  # a count of barriers: no 0.5 of one
    hist.set_title("prediction error", fontsize=10.5, loc="left")
    hist.grid(alpha=0.3)
    hist.legend(fontsize=9)
    pred_all = np.concatenate([1000 * s["predicted_spread"].to_numpy() for _, s in data])
    obs_all = np.concatenate([1000 * s["observed_spread"].to_numpy() for _, s in data])
    title = (f"ZipLine's barrier spread: observed {np.median(obs_all):.1f} ms against {np.median(pred_all):.1f} ms "
             f"predicted (medians over {len(err)} barriers)")
    return _save(fig, path, title)
