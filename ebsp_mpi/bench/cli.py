"""``python -m ebsp_mpi bench KIND [--json FILE] [OPTIONS]``: run one benchmark, print its table and
optionally write its records as JSON.

Kinds that need ranks run under mpiexec (``mpiexec -n 3 python -m ebsp_mpi bench ps``); rank 0
prints and writes. ``python -m ebsp_mpi bench KIND --help`` lists a kind's own options.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import KINDS
from ..helptext import plain


def add_parser(subparsers) -> None:
    """Register ``bench`` on the CLI's subparsers (``ebsp_mpi.cli``)."""
    kinds = "\n".join(f"  {name:<9} {kind.help}" + (" (under mpiexec)" if kind.ranks > 1 else "")
                      for name, kind in KINDS.items())
    p = subparsers.add_parser("bench", help="run a benchmark: " + ", ".join(KINDS),
                              description=plain(__doc__.split("\n\n")[0]) + "\n\nkinds:\n" + kinds,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=list(KINDS), metavar="KIND", help="one of: " + ", ".join(KINDS))
    p.add_argument("--json", metavar="FILE", help="write the records (figure, reference, ratio) to FILE")
    # the kind parses the rest itself: its options are known only once its module is imported
    p.add_argument("options", nargs=argparse.REMAINDER, help="the kind's own options (see bench KIND --help)")
    p.set_defaults(run=main, quiet=False)


def main(args) -> int:
    """Run ``bench KIND``; its exit code (0 on success)."""
    from ..runtime.transport.env import rank_from_env

    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--json", metavar="FILE")
    late, rest = options.parse_known_args(args.options)  # --json may also come after KIND
    json_path = late.json or args.json
    kind = KINDS[args.kind]
    if kind.ranks == 1 and rank_from_env() != 0:
        return 0  # a single-process benchmark started under mpiexec runs once, on rank 0
    records: list[dict] = []
    code = importlib.import_module(kind.module).main(rest, records=records)
    if json_path and rank_from_env() == 0:
        if not records:  # a file of no records would read as a benchmark that measured nothing
            print(f"bench {args.kind}: no records, {json_path} not written", file=sys.stderr)
            return code or 1
        from .report import write_json

        write_json(json_path, records)
        print(f"wrote {len(records)} records to {json_path}")
    return code
