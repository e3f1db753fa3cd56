"""Time to each accuracy target and final accuracy per run, with the ratio to the BSP run.

Usage::

    python analysis/compare.py RUN_DIR... [--out DIR] [--reference LABEL]

Prints the comparison as Markdown; with ``--out`` also writes ``compare.md``, ``compare.csv`` and
``compare-models.csv`` there. Several seeds of one model (a sweep) give medians over seeds and the
per-seed ratios. See :mod:`ebsp_mpi.analysis.compare`.
"""

from __future__ import annotations

import argparse
import sys

from ebsp_mpi.analysis import compare
from ebsp_mpi.analysis.runs import load_infos
from ebsp_mpi.errors import UsageError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python analysis/compare.py", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run, sweep or parent directories")
    p.add_argument("--out", metavar="DIR", help="also write compare.md and the CSV files here")
    p.add_argument("--reference", metavar="LABEL", help="label of the runs to divide by (default: BSP)")
    args = p.parse_args(argv)
    try:
        infos = load_infos(args.runs)
        cmp = compare.compare(infos, reference=args.reference)
    except (UsageError, ValueError) as err:
        print(f"compare: error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(compare.to_markdown(cmp))
    if args.out:
        for path in compare.write(cmp, args.out):
            print(f"wrote {path}", file=sys.stderr)
    return 0 if all(r.info.finished for r in cmp.runs) else 1


if __name__ == "__main__":
    sys.exit(main())
