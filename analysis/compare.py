"""Time to each accuracy target and final accuracy per run, with the ratio to the BSP run.

Usage::

    python analysis/compare.py RUN_OR_SWEEP... [--out DIR] [--reference LABEL]

the same as ``python -m ebsp_mpi compare RUN_OR_SWEEP... [--out DIR] [--reference LABEL]`` (this script
runs that subcommand). Prints the comparison as Markdown; with ``--out`` also writes ``compare.md``,
``compare.csv`` and ``compare-models.csv`` there. Several seeds of one model (a sweep) give medians over
seeds and the per-seed ratios. Exit code 1 when a run did not finish, 2 on bad input. See
:mod:`ebsp_mpi.analysis.compare`.
"""

from __future__ import annotations

import sys

from ebsp_mpi import cli


def main(argv=None) -> int:
    return cli.main(["compare", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
