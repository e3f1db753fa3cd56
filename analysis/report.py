"""Report of one or more runs: summary table (Markdown, CSV), comparison and PNG figures.

Usage::

    python analysis/report.py RUN_DIR... --out DIR [--window START LENGTH]

RUN_DIR may be a run directory (``train --out``), a sweep directory (``sweep --out``) or a directory
holding several. See :mod:`ebsp_mpi.analysis.report` for what is written.
"""

from __future__ import annotations

import argparse
import sys

from ebsp_mpi.analysis.report import write_report
from ebsp_mpi.errors import UsageError
from ebsp_mpi.trace import TraceError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python analysis/report.py", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run, sweep or parent directories")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the tables and figures")
    p.add_argument("--window", nargs=2, type=float, metavar=("START", "LENGTH"),
                   help="timeline window in seconds (default: a dozen iterations of the slowest worker, "
                        "40%% into the run)")
    args = p.parse_args(argv)
    try:
        report = write_report(args.runs, args.out, window=tuple(args.window) if args.window else None)
    except (UsageError, TraceError) as err:
        print(f"report: error: {err}", file=sys.stderr)
        return 2
    for problem in report.problems:
        print(f"report: note: {problem}", file=sys.stderr)
    for name, title in report.titles.items():
        print(f"{report.out / name}: {title}")
    print(f"{report.out / 'report.md'}: the report on one page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
