"""Time to each accuracy target and final accuracy per run, and their ratio to the BSP run.

Times come from ``summary.json``'s ``time_to_accuracy``: the first wall second (rank 0's clock) at
which the periodic test evaluation reached the target, so they are known to ``eval.every_seconds``.
A run that never reached a target counts as infinitely slow for it: medians over seeds stay defined
while fewer than half of the seeds missed it.

The ratio of a run is its time over the BSP run's time with the same seed (the median BSP time when
no BSP run has that seed); below 1 is faster than BSP. Per label (a sweep member over several seeds)
the table gives the median time over seeds and the median and list of the per-seed ratios.

Each run's throughput is its summary's ``samples_per_second`` (training samples over its seconds, all
workers together, the figure Horovod's and PyTorch's benchmarks report), shown beside the times and
never divided by another run's. A target reached at a run's first evaluation has a time that only
bounds the real one (``≤`` in the table, and a note names the runs).

Only a finished run (:attr:`RunInfo.finished`) is ever a reference: the reference label is one with a
finished run, and where the reference run of a seed did not finish, that seed's runs have no ratio
(the notes say so) rather than a ratio against a crashed run or the other seeds' median.

Standard library only: a sweep writes its comparison without the ``analysis`` extra.
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..safe_text import clean_text
from .diverged import diverged_lines
from .runs import RunInfo, section

INF = math.inf


@dataclass
class RunRow:
    """One run: final test accuracy, wall seconds, time to each target and ratio to BSP."""

    info: RunInfo
    final_accuracy: float | None
    wall_seconds: float | None
    times: dict = field(default_factory=dict)    # target -> seconds, inf if never reached
    ratios: dict = field(default_factory=dict)   # target -> time / BSP time, None if undefined
    samples_per_second: float | None = None      # training samples over the run's (virtual, if simulated) seconds
    first_eval: float | None = None              # seconds of the run's first evaluation

    @property
    def at_first_eval(self) -> list:
        """The targets reached at the run's first evaluation: their time says only "at most this"."""
        return [t for t, v in self.times.items()
                if v is not None and self.first_eval is not None and not math.isinf(v) and v <= self.first_eval]


@dataclass
class GroupRow:
    """One label over its seeds: medians, and the per-seed ratios to BSP."""

    label: str
    model: str
    seeds: list
    failed: int
    final_accuracy: float | None
    samples_per_second: float | None = None         # median over seeds
    times: dict = field(default_factory=dict)       # target -> median seconds (inf: most never reached)
    reached: dict = field(default_factory=dict)     # target -> seeds that reached it
    ratio: dict = field(default_factory=dict)       # target -> median of the per-seed ratios
    seed_ratios: dict = field(default_factory=dict)  # target -> [ratio or None per seed]


@dataclass
class Comparison:
    targets: list
    runs: list
    groups: list
    reference: str | None   # label of the BSP runs the ratios divide by
    eval_every: float | None = None
    failed_reference_seeds: list = field(default_factory=list)  # seeds whose reference run did not finish
    unfinished_reference: str | None = None  # a BSP label none of whose runs finished (so no ratios)

    @property
    def several_seeds(self) -> bool:
        return any(len(g.seeds) > 1 for g in self.groups)


def _targets(infos: list[RunInfo]) -> list[float]:
    keys = {float(k) for r in infos for k in (r.summary.get("time_to_accuracy") or {})}
    return sorted(keys)


def _time(info: RunInfo, target: float) -> float | None:
    """Seconds to ``target``; inf if never reached; None if the run did not finish."""
    if not info.finished:
        return None
    for key, value in (info.summary.get("time_to_accuracy") or {}).items():
        if float(key) == target:
            return INF if value is None else float(value)
    return None  # the run did not have this target in eval.targets


def _number(value) -> float | None:
    """A finite number of a summary, else None (a hand-edited or older summary may hold anything)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _first_eval(summary: dict) -> float | None:
    """Seconds of the run's first evaluation (``evals``: ``{t, ...}`` records, or ``[t, ...]`` rows)."""
    evals = summary.get("evals") or []
    first = evals[0] if isinstance(evals, list) and evals else None
    if isinstance(first, dict):
        return _number(first.get("t"))
    return _number(first[0]) if isinstance(first, list) and first else None


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ratio(t: float | None, ref: float | None) -> float | None:
    if t is None or ref is None or math.isinf(ref) or ref <= 0:
        return None
    return t / ref  # inf when the run never reached the target


def _reference_label(infos: list[RunInfo], reference: str | None) -> str | None:
    """The label to divide by: ``reference``, else a BSP label (``bsp`` first) with a finished run.

    Raises
    ------
    ValueError
        When ``reference`` is no label of these runs, or none of its runs finished.
    """
    finished = {r.label for r in infos if r.finished}
    if reference is not None:
        if reference not in {r.label for r in infos}:
            raise ValueError(f"reference label {reference!r} is not among the runs' labels "
                             f"{sorted({r.label for r in infos})}")
        if reference not in finished:
            raise ValueError(f"reference label {reference!r}: none of its runs finished, so there is nothing "
                             f"to divide by; finished labels are {sorted(finished)}")
        return reference
    bsp = [r.label for r in infos if r.model == "bsp" and r.finished]
    if not bsp:
        return None
    return "bsp" if "bsp" in bsp else bsp[0]


def _unfinished_bsp(infos: list[RunInfo]) -> str | None:
    """A BSP label none of whose runs finished (the note says why there are no ratios), or None."""
    labels = [r.label for r in infos if r.model == "bsp"]
    return next((label for label in labels if not any(r.finished for r in infos if r.label == label)), None)


def _eval_every(infos: list[RunInfo]) -> float | None:
    """The evaluation period (s) the runs share, or None when they differ or do not say."""
    every = {section(r.config, "eval").get("every_seconds") for r in infos}
    every = {e for e in every if isinstance(e, (int, float)) and not isinstance(e, bool)}
    return every.pop() if len(every) == 1 else None


def compare(infos: list[RunInfo], reference: str | None = None) -> Comparison:
    """Build the comparison of ``infos`` (see :func:`ebsp_mpi.analysis.runs.load_infos`).

    Parameters
    ----------
    infos : list of RunInfo
    reference : str, optional
        Label of the runs to divide by; default the BSP runs (label ``bsp`` if there is one).
    """
    targets = _targets(infos)
    ref_label = _reference_label(infos, reference)
    ref_runs = [r for r in infos if r.label == ref_label and r.finished]
    ref_by_seed = {t: {r.seed: _time(r, t) for r in ref_runs} for t in targets}
    ref_median = {t: _median(list(ref_by_seed[t].values())) for t in targets}
    # a seed whose reference run crashed has no ratio: the median of the other seeds would hide it
    failed_seeds = {r.seed for r in infos if r.label == ref_label and not r.finished} - {r.seed for r in ref_runs}

    # simulated runs count virtual seconds, live runs wall seconds: a ratio only within one clock
    ref_simulated = ref_runs[0].simulated if ref_runs else None
    rows = []
    for info in infos:
        times = {t: _time(info, t) for t in targets}
        other_clock = ref_simulated is not None and info.simulated != ref_simulated
        ref = {t: None if info.seed in failed_seeds or other_clock else ref_by_seed[t].get(info.seed, ref_median[t])
               for t in targets}
        s = info.summary
        rows.append(RunRow(info=info, final_accuracy=s.get("test_accuracy"), wall_seconds=s.get("wall_seconds"),
                           times=times, ratios={t: _ratio(times[t], ref[t]) for t in targets},
                           samples_per_second=_number(s.get("samples_per_second")), first_eval=_first_eval(s)))

    groups = []
    for label in dict.fromkeys(r.info.label for r in rows):
        members = [r for r in rows if r.info.label == label]
        done = [r for r in members if r.info.finished]
        groups.append(GroupRow(
            label=label, model=(done or members)[0].info.model, seeds=[r.info.seed for r in members],
            failed=len(members) - len(done),
            final_accuracy=_median([r.final_accuracy for r in done]),
            samples_per_second=_median([r.samples_per_second for r in done]),
            times={t: _median([r.times[t] for r in done]) for t in targets},
            reached={t: sum(1 for r in done if r.times[t] is not None and not math.isinf(r.times[t]))
                     for t in targets},
            ratio={t: _median([r.ratios[t] for r in done]) for t in targets},
            seed_ratios={t: [r.ratios[t] for r in members] for t in targets},
        ))
    return Comparison(targets=targets, runs=rows, groups=groups, reference=ref_label, eval_every=_eval_every(infos),
                      failed_reference_seeds=sorted(failed_seeds, key=lambda seed: (seed is None, seed or 0)),
                      unfinished_reference=None if ref_label else _unfinished_bsp(infos))


# -- text ---------------------------------------------------------------------------------------


def _fmt_time(t: float | None) -> str:
    if t is None:
        return "—"
    return "never" if math.isinf(t) else f"{t:.2f}"


def _fmt_ratio(x: float | None) -> str:
    if x is None:
        return "—"
    return "∞" if math.isinf(x) else f"{x:.2f}"


def _fmt_acc(a: float | None) -> str:
    return "—" if a is None else f"{a:.4f}"


def _fmt_rate(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def first_eval_note(cmp: Comparison) -> str | None:
    """One sentence naming the runs that reached a target at their first evaluation, or None.

    Such a time is the evaluation's, not the target's: the run got there at most that soon, and two
    runs that both did compare as equal (a ratio of 1.00) whatever their real pace."""
    hits = [r for r in cmp.runs if r.info.finished and r.at_first_eval]
    if not hits:
        return None
    names = ", ".join(f"{r.info.path.name} ({', '.join(f'{t:g}' for t in r.at_first_eval)} at "
                      f"{r.first_eval:.2f} s)" for r in hits[:4])
    names += f" and {len(hits) - 4} more" if len(hits) > 4 else ""
    return (f"{len(hits)} run(s) reached a target at their first evaluation: {names}; such a time (≤ in the "
            f"table) and its ratio only bound the real one: evaluate more often (eval.every_seconds)")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _target_headers(cmp: Comparison, per_seed: bool = False) -> list[str]:
    out = []
    for t in cmp.targets:
        out.append(f"time to {t:g} (s)")
        if cmp.reference:
            out.append(f"× {cmp.reference}")
            if per_seed:
                out.append(f"× {cmp.reference} per seed")
    return out


def to_markdown(cmp: Comparison) -> str:
    """The comparison as Markdown: a per-label table (medians over seeds) when some label has several
    seeds, then the per-run table, then notes on how the numbers were made."""
    parts = []
    if cmp.several_seeds:
        header = (["model", "seeds", "final test accuracy (median)", "samples/s (median)"]
                  + _target_headers(cmp, per_seed=True))
        rows = []
        for g in cmp.groups:
            row = [g.label, f"{len(g.seeds) - g.failed}" + (f" (+{g.failed} failed)" if g.failed else ""),
                   _fmt_acc(g.final_accuracy), _fmt_rate(g.samples_per_second)]
            for t in cmp.targets:
                n = len(g.seeds) - g.failed
                reached = "" if g.reached[t] == n else f" ({g.reached[t]}/{n} reached)"
                row.append(_fmt_time(g.times[t]) + reached)
                if cmp.reference:
                    row += [_fmt_ratio(g.ratio[t]), ", ".join(_fmt_ratio(x) for x in g.seed_ratios[t])]
            rows.append(row)
        parts += ["### Per model (median over seeds)", "", _table(header, rows), ""]
    header = ["run", "model", "seed", "final test accuracy", "wall (s)", "samples/s"] + _target_headers(cmp)
    rows = []
    for r in cmp.runs:
        info = r.info
        if not info.finished:
            rows.append([info.path.name, info.label, str(info.seed), f"failed: {info.problem}", "—"]
                        + ["—"] * (len(header) - 5))
            continue
        row = [info.path.name, info.label, str(info.seed), _fmt_acc(r.final_accuracy),
               "—" if r.wall_seconds is None else f"{r.wall_seconds:.1f}", _fmt_rate(r.samples_per_second)]
        for t in cmp.targets:
            row.append(("≤" if t in r.at_first_eval else "") + _fmt_time(r.times[t]))
            if cmp.reference:
                row.append(_fmt_ratio(r.ratios[t]))
        rows.append(row)
    parts += ["### Per run", "", _table(header, rows), ""]
    notes = ["Time to a target: first wall second (rank 0's clock) at which the periodic test evaluation"
             " reached that accuracy" + (f" (evaluated every {cmp.eval_every:g} s)" if cmp.eval_every else "")
             + "; \"never\": not reached in the run."]
    notes.append("samples/s: training samples over the run's seconds, all workers together"
                 + (" (virtual seconds for a simulated run)" if any(r.info.simulated for r in cmp.runs) else "")
                 + ".")
    first = first_eval_note(cmp)
    if first:
        notes.append(first[0].upper() + first[1:] + ".")
    notes += _reference_notes(cmp)
    parts += [f"- {n}" for n in notes]
    marked = diverged_lines([r.info for r in cmp.runs])  # after the notes: the tables' columns stay as they are
    return "\n".join(parts + ([""] + marked if marked else [])) + "\n"


def _reference_notes(cmp: Comparison) -> list[str]:
    """How the ratios were made, and why some or all are missing."""
    if cmp.unfinished_reference:
        why = f"No ratios: no run of {cmp.unfinished_reference} (BSP) finished, and a run that did not finish"
        return [f"{why} is no reference."]
    if not cmp.reference:
        return ["No BSP run among these runs: no ratios."]
    ratio = (f"× {cmp.reference}: time over the {cmp.reference} run's time with the same seed "
             f"(below 1: faster than {cmp.reference}); ∞: this run never reached the target; "
             f"—: {cmp.reference} never reached it.")
    notes = [ratio]
    kinds = {r.info.simulated for r in cmp.runs}
    if len(kinds) > 1:
        notes.append("Simulated runs (labels ending in (simulated)) count virtual seconds, live runs wall seconds: "
                     f"only runs on the clock of {cmp.reference} have a ratio to it (—: the other clock).")
    for seed in cmp.failed_reference_seeds:
        notes.append(f"Seed {seed}: the {cmp.reference} run did not finish, so the runs of seed {seed} have no "
                     f"ratio (—), not one against a crashed run.")
    return notes


def _csv_value(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "inf" if math.isinf(v) else repr(v)
    return str(v)


def write(cmp: Comparison, out_dir: str | Path, stem: str = "compare") -> list[Path]:
    """Write ``<stem>.md``, ``<stem>.csv`` (per run) and ``<stem>-models.csv`` (per label) to ``out_dir``.

    CSV cells: times in seconds, ``inf`` for never reached, empty for undefined.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{stem}.md"
    md.write_text(clean_text(f"## Comparison of {len(cmp.runs)} run(s)\n\n" + to_markdown(cmp), limit=None))

    per_run = out / f"{stem}.csv"
    with per_run.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "path", "label", "model", "seed", "finished", "final_test_accuracy", "wall_seconds",
                    "samples_per_second"]
                   + [c for t in cmp.targets for c in (f"time_to_{t:g}_s", f"ratio_to_reference_{t:g}")])
        for r in cmp.runs:
            i = r.info
            w.writerow([clean_text(i.path.name), clean_text(str(i.path)), clean_text(i.label), i.model,
                        _csv_value(i.seed), int(i.finished),
                        _csv_value(r.final_accuracy), _csv_value(r.wall_seconds), _csv_value(r.samples_per_second)]
                       + [_csv_value(x) for t in cmp.targets for x in (r.times[t], r.ratios[t])])

    per_group = out / f"{stem}-models.csv"
    with per_group.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "model", "seeds", "failed", "median_final_test_accuracy", "median_samples_per_second"]
                   + [c for t in cmp.targets for c in (f"median_time_to_{t:g}_s", f"reached_{t:g}",
                                                       f"median_ratio_to_reference_{t:g}",
                                                       f"ratios_to_reference_{t:g}")])
        for g in cmp.groups:
            w.writerow([clean_text(g.label), g.model, " ".join(map(str, g.seeds)), g.failed,
                        _csv_value(g.final_accuracy), _csv_value(g.samples_per_second)]
                       + [x for t in cmp.targets for x in (
                           _csv_value(g.times[t]), g.reached[t], _csv_value(g.ratio[t]),
                           " ".join(_csv_value(v) or "nan" for v in g.seed_ratios[t]))])
    return [md, per_run, per_group]
