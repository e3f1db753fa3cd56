"""The analysis subcommands of ``python -m ebsp_mpi``: ``report``, ``compare`` and ``timeline``.

Usage::

    python -m ebsp_mpi report RUN_OR_SWEEP... [--out DIR] [--window START LENGTH]
    python -m ebsp_mpi compare RUN_OR_SWEEP... [--out DIR] [--reference LABEL]
    python -m ebsp_mpi timeline RUN_OR_SWEEP -o PATH

RUN_OR_SWEEP is a run directory (``train --out``), a sweep directory (``sweep --out``) or a directory
holding several (:func:`~ebsp_mpi.analysis.runs.find_runs`). The scripts in ``analysis/`` run the same
handlers.

This module imports the standard library only: :mod:`ebsp_mpi.cli` registers these parsers on every
start, and ``train`` must run without the ``analysis`` extra (pandas, matplotlib). Each handler imports
what it needs when it runs.

Exit codes, the same for the three commands: 0 when every run finished and was analysed; 1 when some
run did not finish (a failed sweep member, a summary missing, unreadable or with a null wall time, no
readable trace for ``timeline``), after the others were analysed and each failed one was named on a
``<command>: note: ...`` line; 2 for input nothing can be made of (no run, no readable trace at all)
and for an output location that cannot be written (a read-only directory, a file where a directory
is needed): a :class:`~ebsp_mpi.errors.UsageError`, which :func:`ebsp_mpi.cli.main` prints as one line
``ebsp_mpi: error: ...``. A file that cannot be read or written is named in that line, never a
traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import UsageError
from ..safe_text import directory, number

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
                                          f"the analysis extra ({INSTALL_ANALYSIS}). Exit code 1 when a run "
                                          "did not finish (it is listed under Problems).")
    _runs_arg(p, nargs="+")
    p.add_argument("--out", type=directory, metavar="DIR",
                   help="directory for the tables and figures (default: RUN_OR_SWEEP/report for one directory, "
                        "as a sweep writes its own; ./report for several)")
    p.add_argument("--window", nargs=2, type=number, metavar=("START", "LENGTH"),
                   help="timeline window in seconds (default: a dozen iterations of the slowest worker, "
                        "40%% into the run)")
    p.set_defaults(run=run_report, quiet=False)


def _add_compare(subparsers) -> None:
    p = subparsers.add_parser("compare", help="time to each accuracy target per run, with the ratio to BSP",
                              description="Time to each accuracy target and final accuracy per run, with the "
                                          "ratio to the BSP run of the same seed, printed as Markdown. Exit "
                                          "code 1 when a run did not finish.")
    _runs_arg(p, nargs="+")
    p.add_argument("--out", type=directory, metavar="DIR",
                   help="also write compare.md, compare.csv and compare-models.csv here")
    p.add_argument("--reference", metavar="LABEL", help="label of the runs to divide by (default: BSP)")
    p.set_defaults(run=run_compare, quiet=False)


def _add_timeline(subparsers) -> None:
    p = subparsers.add_parser("timeline", help="a run's traces as Chrome Trace Event JSON for Perfetto",
                              description="A run's traces as Chrome Trace Event JSON, one track per rank, to "
                                          "open at https://ui.perfetto.dev or in chrome://tracing. On a "
                                          "sweep (or a directory of runs), one <member>.json per run. Exit "
                                          "code 1 when a run has no readable trace.")
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
    """Run ``report``: write the tables and figures into ``args.out`` and name each file.

    Returns
    -------
    int
        0; 1 when a run did not finish (as ``compare``): the report holds the others, and report.md's
        "Problems" and a ``report: note:`` line name each failed run.
    """
    write_report = _import_write_report()
    from ..trace import TraceError
    from .runs import find_runs

    out = default_report_dir(args.runs) if args.out is None else Path(args.out)
    with _file_errors(out):
        find_runs(args.runs)  # a missing or empty directory fails here, before --out is created
        window = _window(args.window)
        writable_dir(out, "--out")
        try:
            written = write_report(args.runs, out, window=window)
        except TraceError as err:  # no run with a readable trace: the input, not the code, is at fault
            raise UsageError(str(err)) from None
    for problem in written.problems:
        print(f"report: note: {problem}", file=sys.stderr)
    for name, title in written.titles.items():
        print(f"{written.out / name}: {title}")
    print(f"{written.out / 'report.md'}: the report on one page")
    return 1 if written.unfinished else 0


def default_report_dir(runs: list[str]) -> Path:
    """Where ``report`` writes without ``--out``: beside the runs it reports on when it is given one
    directory (``RUN_OR_SWEEP/report``, where ``sweep`` writes its report), else ``report`` in the
    current directory."""
    return Path(runs[0]) / "report" if len(runs) == 1 else Path("report")


def _window(values: list[float] | None) -> tuple[float, float] | None:
    """``--window START LENGTH`` as a tuple, or a UsageError: matplotlib takes no NaN or infinite
    limits, and a window of no length shows nothing."""
    if values is None:
        return None
    start, length = values
    if not (math.isfinite(start) and math.isfinite(length) and length > 0):
        raise UsageError(f"--window {start:g} {length:g}: START and LENGTH are seconds, finite, and LENGTH > 0")
    return start, length


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
    """Run ``compare``: print the comparison as Markdown (and write it under ``--out``).

    Returns
    -------
    int
        0; 1 when a run did not finish (as ``report``): its row says "failed" and why, and a
        ``compare: note:`` line names it.
    """
    from ..trace.frames import lost_iterations
    from . import compare as comparison
    from .runs import load_infos

    out = Path(args.out) if args.out else None
    with _file_errors(out):
        infos = load_infos(args.runs)
        try:
            cmp = comparison.compare(infos, reference=args.reference)
        except ValueError as err:  # --reference names no label of these runs, or none that finished
            raise UsageError(str(err)) from None
        if out is not None:
            writable_dir(out, "--out")  # before the table is printed, not after
        sys.stdout.write(comparison.to_markdown(cmp))
        written = comparison.write(cmp, out) if out is not None else []
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    first = comparison.first_eval_note(cmp)
    if first:
        print(f"compare: note: {first}", file=sys.stderr)
    unfinished = [r.info for r in cmp.runs if not r.info.finished]
    for info in unfinished:
        print(f"compare: note: {info.problem}", file=sys.stderr)
    for r in cmp.runs:  # a finished run whose traces miss iterations (killed between checkpoint and flush)
        for note in lost_iterations(r.info.path):
            print(f"compare: note: {note}", file=sys.stderr)
    return 1 if unfinished else 0


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
    with _file_errors(output):
        if is_run_dir(source):
            if output.is_dir():
                raise UsageError(f"-o {output}: a directory, but {source} is one run: give the JSON file's path")
            if output.parent.exists() and not output.parent.is_dir():
                raise UsageError(f"-o {output}: {output.parent} is a file, not a directory")
            writable_dir(output.parent, "-o")
            _write_timeline(source, output)
            return 0
        runs = find_runs([source])
        if output.exists() and not output.is_dir():
            raise UsageError(f"-o {output}: a file, but {source} holds several runs: give a directory for "
                             f"one JSON file per run")
        writable_dir(output, "-o")
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


# -- where the outputs go ------------------------------------------------------------------------


def writable_dir(path: Path, option: str) -> Path:
    """Create the output directory ``path`` if needed and check that a file can be made in it.

    Checked before any run is read, so that an output location that cannot be written costs one
    line, not a report's work and then a traceback.

    Parameters
    ----------
    path : pathlib.Path
    option : str
        The option that named it (``--out``, ``-o``), for the message.

    Raises
    ------
    UsageError
        When ``path`` is a file, or cannot be created or written (read-only, another user's).
    """
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: a file, but a directory is needed here")
    try:
        path.mkdir(parents=True, exist_ok=True)
        # permission bits, a read-only mount and ACLs all say no only when a file is made: make one
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror or err}") from None
    return path


def _inside(path: Path, root: Path) -> bool:
    path, root = path.absolute(), root.absolute()
    return path == root or root in path.parents


@contextmanager
def _file_errors(out: Path | None) -> Iterator[None]:
    """Turn an operating-system error on a named file into one line naming it: ``cannot write`` for a
    file under ``out`` (a disk that fills up after :func:`writable_dir`'s check), ``cannot read`` for
    an input (a run directory this user may not list). An error without a file name is left alone."""
    try:
        yield
    except OSError as err:
        if not isinstance(err.filename, (str, Path)):  # no file named (None), or a descriptor
            raise
        name = Path(err.filename)
        verb = "write" if out is not None and _inside(name, out) else "read"
        raise UsageError(f"cannot {verb} {name}: {err.strerror or err}") from None
