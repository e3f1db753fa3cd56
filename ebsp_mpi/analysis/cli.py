"""The analysis subcommands of ``python -m ebsp_mpi``: ``report``, ``compare`` and ``timeline``.

Usage::

    python -m ebsp_mpi report RUN_OR_SWEEP... --out DIR [--window START LENGTH]
    python -m ebsp_mpi compare RUN_OR_SWEEP... [--out DIR] [--reference LABEL]
    python -m ebsp_mpi timeline RUN_OR_SWEEP -o PATH

RUN_OR_SWEEP is a run directory (``train --out``), a sweep directory (``sweep --out``) or a directory
holding several (:func:`~ebsp_mpi.analysis.runs.find_runs`). The scripts in ``analysis/`` run the same
handlers.

This module imports the standard library only: :mod:`ebsp_mpi.cli` registers these parsers on every
start, and ``train`` must run without the ``analysis`` extra (pandas, matplotlib). Each handler imports
what it needs when it runs. Bad input raises :class:`~ebsp_mpi.errors.UsageError`, which
:func:`ebsp_mpi.cli.main` prints as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from ..errors import UsageError

#: what to run when pandas or matplotlib is missing
INSTALL_ANALYSIS = 'pip install -e ".[analysis]"'


def add_parsers(subparsers) -> None:
    """Register ``report``, ``compare`` and ``timeline`` on the CLI's subparsers (``ebsp_mpi.cli``)."""
    _add_report(subparsers)
    _add_compare(subparsers)
    _add_timeline(subparsers)


def _add_report(subparsers) -> None:
    p = subparsers.add_parser("report", help="summary tables, comparison and figures of runs or sweeps",
                              description="Report of one or more runs: summary table (Markdown, CSV), "
                                          "comparison and PNG figures, with report.md on one page. Needs "
                                          f"the analysis extra ({INSTALL_ANALYSIS}).")
    _runs_arg(p, nargs="+")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the tables and figures")
    p.add_argument("--window", nargs=2, type=float, metavar=("START", "LENGTH"),
                   help="timeline window in seconds (default: a dozen iterations of the slowest worker, "
                        "40%% into the run)")
    p.set_defaults(run=run_report, quiet=False)


def _add_compare(subparsers) -> None:
    p = subparsers.add_parser("compare", help="time to each accuracy target per run, with the ratio to BSP",
                              description="Time to each accuracy target and final accuracy per run, with the "
                                          "ratio to the BSP run of the same seed, printed as Markdown. Exit "
                                          "code 1 when a run did not finish.")
    _runs_arg(p, nargs="+")
    p.add_argument("--out", metavar="DIR", help="also write compare.md, compare.csv and compare-models.csv here")
    p.add_argument("--reference", metavar="LABEL", help="label of the runs to divide by (default: BSP)")
    p.set_defaults(run=run_compare, quiet=False)


def _add_timeline(subparsers) -> None:
    p = subparsers.add_parser("timeline", help="a run's traces as Chrome Trace Event JSON for Perfetto",
                              description="A run's traces as Chrome Trace Event JSON, one track per rank, to "
                                          "open at https://ui.perfetto.dev or in chrome://tracing. On a "
                                          "sweep (or a directory of runs), one <member>.json per run.")
    _runs_arg(p, nargs=None)
    p.add_argument("-o", "--output", required=True, metavar="PATH",
                   help="JSON file to write; for a sweep, the directory for one JSON file per run")
    p.set_defaults(run=run_timeline, quiet=False)


def _runs_arg(p: argparse.ArgumentParser, nargs) -> None:
    # "source", not "run": ebsp_mpi.cli calls args.run, the handler
    p.add_argument("runs" if nargs else "source", nargs=nargs, metavar="RUN_OR_SWEEP",
                   help="run directory (train --out), sweep directory (sweep --out) or a directory of them")


# -- report --------------------------------------------------------------------------------------


def run_report(args) -> int:
    """Run ``report``: write the tables and figures into ``args.out`` and name each file; 0."""
    write_report = _import_write_report()
    from ..trace import TraceError
    from .runs import find_runs

    find_runs(args.runs)  # a missing or empty directory fails here, before --out is created
    window = tuple(args.window) if args.window else None
    try:
        written = write_report(args.runs, args.out, window=window)
    except TraceError as err:  # no run with a readable trace: the input, not the code, is at fault
        raise UsageError(str(err)) from None
    for problem in written.problems:
        print(f"report: note: {problem}", file=sys.stderr)
    for name, title in written.titles.items():
        print(f"{written.out / name}: {title}")
    print(f"{written.out / 'report.md'}: the report on one page")
    return 0


def _import_write_report():
    """:func:`ebsp_mpi.analysis.report.write_report`, or a UsageError naming the extra to install."""
    try:
        from .report import write_report
    except ModuleNotFoundError as err:
        missing = (err.name or "").split(".")[0]
        if missing not in ("pandas", "matplotlib"):
            raise
        raise UsageError(f"report needs {missing} (the analysis extra): {INSTALL_ANALYSIS}") from None
    return write_report


# -- compare -------------------------------------------------------------------------------------


def run_compare(args) -> int:
    """Run ``compare``: print the comparison as Markdown; 0, or 1 when a run did not finish."""
    from . import compare as comparison
    from .runs import load_infos

    infos = load_infos(args.runs)
    try:
        cmp = comparison.compare(infos, reference=args.reference)
    except ValueError as err:  # --reference names no label of these runs
        raise UsageError(str(err)) from None
    sys.stdout.write(comparison.to_markdown(cmp))
    if args.out:
        for path in comparison.write(cmp, args.out):
            print(f"wrote {path}", file=sys.stderr)
    return 0 if all(r.info.finished for r in cmp.runs) else 1


# -- timeline ------------------------------------------------------------------------------------


def run_timeline(args) -> int:
    """Run ``timeline``: one JSON file for a run, one per run for a sweep or a directory of runs.

    Returns
    -------
    int
        0 when every run was written; 1 when a sweep member is missing or has no readable trace (the
        others are written, as ``compare`` exits 1 on a run that did not finish).
    """
    from .runs import find_runs, is_run_dir

    source, output = Path(args.source), Path(args.output)
    if is_run_dir(source):
        if output.is_dir():
            raise UsageError(f"-o {output}: a directory, but {source} is one run: give the JSON file's path")
        _write_timeline(source, output)
        return 0
    runs = find_runs([source])
    if output.exists() and not output.is_dir():
        raise UsageError(f"-o {output}: a file, but {source} holds several runs: give a directory for "
                         f"one JSON file per run")
    return _write_timelines(runs, output)


def _write_timelines(runs: list[Path], out_dir: Path) -> int:
    skipped = []
    for run, name in zip(runs, _file_names(runs), strict=True):
        if not run.is_dir():
            skipped.append(f"{run}: missing (the member failed before it started?)")
            continue
        try:
            _write_timeline(run, out_dir / f"{name}.json")
        except UsageError as err:
            skipped.append(str(err))
    if len(skipped) == len(runs):
        raise UsageError("no run with a readable trace: " + "; ".join(skipped))
    for problem in skipped:
        print(f"timeline: note: skipped {problem}", file=sys.stderr)
    return 1 if skipped else 0


def _file_names(runs: list[Path]) -> list[str]:
    """A JSON file name per run: its directory's name (the sweep member), prefixed by the directory
    above it where two runs share a name (the same member of two sweeps), so no file overwrites another."""
    names = [run.name for run in runs]
    return [f"{run.parent.name}-{run.name}" if names.count(run.name) > 1 else run.name for run in runs]


def _write_timeline(run: Path, path: Path) -> None:
    """Write one run's JSON to ``path`` and print one line naming it, its events and its ranks."""
    from ..trace import TraceError
    from . import perfetto

    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        try:
            doc = perfetto.write(run, path)
        except TraceError as err:
            raise UsageError(str(err)) from None
    # a damaged rank file is a warning from the reader: one line naming it, not a Python warning
    for w in caught:
        print(f"timeline: note: {run}: {w.message}", file=sys.stderr)
    ranks = sorted({e["pid"] for e in doc["traceEvents"]})
    missing = doc["otherData"]["missing_ranks"]
    print(f"{path}: {len(doc['traceEvents'])} events, tracks for ranks {ranks}"
          + (f"; no readable trace for ranks {missing}" if missing else ""))
