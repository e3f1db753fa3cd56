"""A run's traces as Chrome Trace Event JSON, one track per rank, for Perfetto or chrome://tracing.

Usage::

    python analysis/to_perfetto.py RUN_OR_SWEEP -o PATH

the same as ``python -m ebsp_mpi timeline RUN_OR_SWEEP -o PATH`` (this script runs that subcommand). On
a run directory, PATH is the JSON file; on a sweep directory (or a directory of runs), PATH is a
directory that receives one ``<member>.json`` per run. Open a file at https://ui.perfetto.dev (Open
trace file) or in chrome://tracing. See :mod:`ebsp_mpi.analysis.perfetto` for the tracks and events.
"""

from __future__ import annotations

import sys

from ebsp_mpi import cli


def main(argv=None) -> int:
    return cli.main(["timeline", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
