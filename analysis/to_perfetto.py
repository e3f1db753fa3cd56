"""A run's traces as Chrome Trace Event JSON, one track per rank, for Perfetto or chrome://tracing.

Usage::

    python analysis/to_perfetto.py RUN_DIR -o trace.json

Open the file at https://ui.perfetto.dev (Open trace file) or in chrome://tracing. See
:mod:`ebsp_mpi.analysis.perfetto` for the tracks and events.
"""

from __future__ import annotations

import argparse
import sys

from ebsp_mpi.analysis import perfetto
from ebsp_mpi.trace import TraceError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python analysis/to_perfetto.py", description=__doc__.splitlines()[0])
    p.add_argument("run", metavar="RUN_DIR", help="run directory (train --out)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="JSON file to write")
    args = p.parse_args(argv)
    try:
        doc = perfetto.write(args.run, args.output)
    except TraceError as err:
        print(f"to_perfetto: error: {err}", file=sys.stderr)
        return 2
    ranks = sorted({e["pid"] for e in doc["traceEvents"]})
    missing = doc["otherData"]["missing_ranks"]
    print(f"{args.output}: {len(doc['traceEvents'])} events, tracks for ranks {ranks}"
          + (f"; no readable trace for ranks {missing}" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
