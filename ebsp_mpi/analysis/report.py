"""The report of one or more runs: a summary table (Markdown and CSV), the comparison, and the figures.

``python -m ebsp_mpi report RUN_DIR... [--out DIR]`` writes into DIR (default: ``report`` in the one directory
given, else in the current directory):

- ``summary.csv``, ``summary.md`` — one row per run (:func:`~ebsp_mpi.analysis.metrics.summary_row`);
- ``zipline.csv``, ``zipline.md`` — when an ElasticBSP run is among them, ZipLine's prediction error
  per label (:func:`~ebsp_mpi.analysis.metrics.spread_table`);
- ``compare.md``, ``compare.csv``, ``compare-models.csv`` — :mod:`~ebsp_mpi.analysis.compare`;
- ``accuracy.png``, ``timeline.png``, ``wait.png``, ``iterations.png``, ``staleness.png`` and, when an
  ElasticBSP run is among them, ``zipline.png`` (:mod:`~ebsp_mpi.analysis.figures`);
- ``report.md`` — all of it on one page, with each figure under its title.

A run that did not finish (a failed sweep member: no directory, a summary missing, unreadable or with a
null wall time) does not stop the report: it is a row marked "failed" in the comparison, never its
reference, its traces (if any) still make its figures, and it is named under "Problems" and in
:attr:`Report.unfinished`, for which the command exits 1 as ``compare`` does.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..safe_text import clean_text
from ..trace.frames import load_run
from ..trace.reader import TraceError
from . import compare, figures
from .metrics import Run, spread_table, summary_table
from .runs import load_infos

#: (file name, what the figure is about) in the order of the report.
FIGURES = (
    ("accuracy.png", "Test accuracy against wall time"),
    ("timeline.png", "Per-worker timeline: compute, push, wait; barriers as dashed lines"),
    ("wait.png", "Distribution of the waiting time per worker"),
    ("iterations.png", "Iterations per second per worker"),
    ("staleness.png", "Staleness histogram"),
    ("zipline.png", "ZipLine: predicted against observed barrier spread"),
)


@dataclass
class Report:
    """What :func:`write_report` wrote, and what it could not use.

    Attributes
    ----------
    out : pathlib.Path
    files : list of pathlib.Path
    titles : dict of str to str
        Figure file name to the title drawn on it.
    problems : list of str
        One sentence per thing missing or damaged, naming the file (report.md's "Problems").
    unfinished : list of RunInfo
        The runs that did not finish.
    """

    out: Path
    files: list = field(default_factory=list)
    titles: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    unfinished: list = field(default_factory=list)


def load_runs(paths: Iterable[str | os.PathLike]) -> tuple[list[Run], list, list[str]]:
    """The runs with traces, all runs' :class:`RunInfo` (for the comparison) and what was unreadable."""
    infos = load_infos(paths)
    runs, problems = [], []
    for info in infos:
        if not info.path.is_dir():
            problems.append(info.problem)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # collected in frames.problems and reported below
            try:
                frames = load_run(info.path)
            except TraceError as err:
                problems.append(str(err))
                continue
        problems += frames.problems
        if frames.table("iterations").empty:
            problems.append(f"{info.path}: no worker iterations in the trace; left out of the figures")
            continue
        runs.append(Run(info=info, frames=frames))
    return runs, infos, problems


#: columns shown with 4 decimals (fractions); other floats get 2 (seconds, rates)
_FINE = ("final_test_accuracy", "final_test_loss", "mean_wait_share")


def _fmt(column: str, v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, float):
        if math.isinf(v):
            return "never"
        if v.is_integer() and column not in _FINE and not column.endswith("_s"):
            return str(int(v))
        return f"{v:.4f}" if column in _FINE else f"{v:.2f}"
    return str(v)


def summary_markdown(table) -> str:
    header = list(table.columns)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for _, row in table.iterrows():
        lines.append("| " + " | ".join(_fmt(c, row[c]) for c in header) + " |")
    return "\n".join(lines) + "\n"


def write_report(paths: Iterable[str | os.PathLike], out: str | os.PathLike,
                 window: tuple[float, float] | None = None) -> Report:
    """Write the report of the runs under ``paths`` into ``out`` (created if needed).

    Parameters
    ----------
    paths : iterable of path
        Run directories, sweep directories or directories holding them.
    out : path
    window : (float, float), optional
        Start and length (s) of the timeline's window; default
        :func:`~ebsp_mpi.analysis.figures.default_window`.

    Raises
    ------
    UsageError
        When a path holds no run (from :func:`~ebsp_mpi.analysis.runs.find_runs`).
    TraceError
        When no run has a readable trace.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs, infos, problems = load_runs(paths)
    report = Report(out=out, problems=problems, unfinished=[i for i in infos if not i.finished])
    cmp = compare.compare(infos)
    report.files += compare.write(cmp, out)
    if not runs:
        raise TraceError("no run with readable worker iterations among " + ", ".join(str(i.path) for i in infos)
                         + (": " + "; ".join(problems) if problems else ""))

    table = summary_table(runs)
    (out / "summary.csv").write_text(clean_text(table.to_csv(index=False), limit=None))
    (out / "summary.md").write_text(clean_text(summary_markdown(table), limit=None))
    report.files += [out / "summary.csv", out / "summary.md"]
    zipline = spread_table(runs)
    if len(zipline):
        (out / "zipline.csv").write_text(clean_text(zipline.to_csv(index=False), limit=None))
        (out / "zipline.md").write_text(clean_text(summary_markdown(zipline), limit=None))
        report.files += [out / "zipline.csv", out / "zipline.md"]

    makers = {
        "accuracy.png": lambda p: figures.accuracy_vs_time(runs, cmp, p),
        "timeline.png": lambda p: figures.timeline(runs, p, window),
        "wait.png": lambda p: figures.wait_distribution(runs, p),
        "iterations.png": lambda p: figures.iteration_rate(runs, p),
        "staleness.png": lambda p: figures.staleness(runs, p),
        "zipline.png": lambda p: figures.zipline_spread(runs, p),
    }
    for name, _ in FIGURES:
        title = makers[name](out / name)
        if title is not None:
            report.titles[name] = title
            report.files.append(out / name)
    if "zipline.png" not in report.titles:
        report.problems.append("no ElasticBSP barriers among these runs: no ZipLine figure")

    report.files.append(_write_page(report, table, cmp, zipline))
    return report


def _write_page(report: Report, table, cmp: compare.Comparison, zipline) -> Path:
    failed = f"; {len(report.unfinished)} did not finish (see Problems)" if report.unfinished else ""
    lines = [f"# Report of {len(table)} run(s){failed}", ""]
    if report.problems:
        lines += ["## Problems", ""] + [f"- {p}" for p in report.problems] + [""]
    lines += ["## Summary", "", summary_markdown(table), ("Times in seconds on rank 0's clock; wait share: "
               "share of a worker's active span spent waiting for the pull, mean over workers."), "",
              "## Comparison", "", compare.to_markdown(cmp)]
    if len(zipline):
        note = ("Spreads in ms over the barriers of two or more workers, pooled over each label's runs: "
                "predicted when ZipLine chose the barrier, observed as last minus first arrival.")
        lines += ["## ZipLine's prediction error", "", summary_markdown(zipline), note, ""]
    lines += ["## Figures", ""]
    for name, topic in FIGURES:
        if name in report.titles:
            lines += [f"### {topic}", "", f"**{report.titles[name]}**", "", f"![{topic}]({name})", ""]
    path = report.out / "report.md"
    path.write_text(clean_text("\n".join(lines), limit=None))
    return path
