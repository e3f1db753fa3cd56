"""Report of one or more runs: summary table (Markdown, CSV), comparison and PNG figures.

Usage::

    python analysis/report.py RUN_OR_SWEEP... --out DIR [--window START LENGTH]

the same as ``python -m ebsp_mpi report RUN_OR_SWEEP... --out DIR [--window START LENGTH]`` (this script
runs that subcommand). RUN_OR_SWEEP may be a run directory (``train --out``), a sweep directory
(``sweep --out``) or a directory holding several. See :mod:`ebsp_mpi.analysis.report` for what is
written; needs the ``analysis`` extra (``pip install -e ".[analysis]"``).
"""

from __future__ import annotations

import sys

from ebsp_mpi import cli


def main(argv=None) -> int:
    return cli.main(["report", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
