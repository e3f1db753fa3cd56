"""The ``sweep`` subcommand: its arguments and what it does with them."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from ..runtime.transport.env import find_mpiexec
from ..safe_text import ascii_digits, directory, integer
from .runner import default_out, plan, run_sweep, write_comparison, write_figures
from .sbatch import render_sbatch
from .spec import SweepError, check_members, load_sweep, resolve_ranks

#: what ``sweep --help`` says the command does (the module's docstring speaks to a reader of the code)
DESCRIPTION = ("Run every member of a sweep file (a base job and [[member]] override sets, repeated over its "
               "seeds) under mpiexec, one after the other, each with its own timeout and log (OUT/logs/); "
               "then write OUT/compare.md and, with the analysis extra, OUT/report/. Every member is checked "
               "before anything runs; a failed member is reported and the sweep goes on (exit code 1 at the end).")


def add_parser(subparsers) -> None:
    """Register ``sweep`` on the CLI's subparsers (``ebsp_mpi.cli``)."""
    p = subparsers.add_parser("sweep", help="run every member of a sweep file with mpiexec, then compare them",
                              description=DESCRIPTION)
    p.add_argument("file", metavar="FILE", help="sweep file, e.g. jobs/sweeps/stragglers.toml")
    p.add_argument("-n", dest="ranks", type=integer, metavar="N",
                   help="MPI ranks per member: the server and N-1 workers (default: ranks in FILE)")
    p.add_argument("--out", type=directory, metavar="DIR",
                   help="sweep directory (default runs/sweep-<name>-<timestamp>)")
    p.add_argument("--dry-run", action="store_true", help="print the members' commands and exit")
    p.add_argument("--mpiexec", metavar="CMD",
                   help="launcher, e.g. 'srun --mpi=pmi2' (default: $MPIEXEC, else the mpiexec next to "
                        "this Python, else mpiexec on PATH)")
    p.add_argument("--wrapper", metavar="CMD", default="",
                   help="command every rank runs Python under, e.g. slurm/gpu-bind.sh")
    p.add_argument("--member", type=integer, metavar="K",
                   help="run only member K (0-based; a Slurm array task), without the comparison")
    p.add_argument("--seeds", type=_seed_list, metavar="LIST",
                   help="run over these seeds instead of the file's, e.g. 3-9 or 0,2,4")
    p.add_argument("--no-report", action="store_true", help="write the comparison but not the figures")
    p.add_argument("--sbatch", metavar="PATH",
                   help="write slurm/sweep.sbatch rendered for this sweep to PATH ('-': stdout) and exit")
    p.set_defaults(run=main, quiet=False)


def _seed_list(text: str) -> list[int]:
    """``3-9`` or ``0,2,4`` (or a mix, ``0,3-5``) -> a list of seeds."""
    seeds = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not ascii_digits(lo) or (sep and not ascii_digits(hi)):
            raise argparse.ArgumentTypeError(f"{text!r}: expected seeds like 3-9 or 0,2,4")
        seeds += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    return seeds


def main(args) -> int:
    """Run the ``sweep`` subcommand; 0 when every member finished, 1 when any failed."""
    if args.seeds is not None and (args.sbatch or args.member is not None):
        raise SweepError("--seeds cannot be combined with --sbatch or --member: the array tasks read the "
                         "sweep file's seeds; write the seeds into the file instead")
    sweep = load_sweep(args.file, seeds=args.seeds)
    ranks = resolve_ranks(sweep, args.ranks)
    check_members(sweep, ranks)
    if args.member is not None and not 0 <= args.member < len(sweep.members):
        raise SweepError(f"--member {args.member}: {sweep.path} has members 0..{len(sweep.members) - 1}")

    if args.sbatch:
        text = render_sbatch(sweep, ranks, sweep_file=args.file, out=args.out)
        if args.sbatch == "-":
            sys.stdout.write(text)
        else:
            Path(args.sbatch).write_text(text)
            print(f"wrote {args.sbatch}: sbatch {args.sbatch} runs {len(sweep.members)} members as a job array")
        return 0

    out = Path(args.out) if args.out else default_out(sweep)
    mpiexec = find_mpiexec(args.mpiexec)
    wrapper = shlex.split(args.wrapper)
    if args.dry_run:
        chosen = plan(sweep, ranks, out, mpiexec, wrapper)
        if args.member is not None:
            chosen = [chosen[args.member]]
        for o in chosen:
            print(shlex.join(o.command))
        return 0

    if args.member is None and out.exists() and any(out.iterdir()):
        raise SweepError(f"--out {out}: exists and is not empty; choose another directory")
    if args.member is not None:
        member_dir = out / sweep.members[args.member].name
        if member_dir.exists() and any(member_dir.iterdir()):
            raise SweepError(f"{member_dir}: exists and is not empty (member {args.member} ran already?)")

    t0 = time.monotonic()
    print(f"sweep {sweep.name}: {len(sweep.members)} member(s) with {ranks} ranks each -> {out}", flush=True)
    outcomes = run_sweep(sweep, ranks, out, mpiexec, wrapper=wrapper, only=args.member)
    failed = [o for o in outcomes if o.status != "ok"]
    if args.member is not None:
        return 1 if failed else 0

    print(f"sweep {sweep.name}: {len(outcomes) - len(failed)}/{len(outcomes)} members finished in "
          f"{time.monotonic() - t0:.0f} s" + (f"; failed: {', '.join(o.name for o in failed)}" if failed else ""),
          flush=True)
    write_comparison(out)
    status = 1 if failed else 0
    if not args.no_report:
        try:
            write_figures(out)
        except Exception as err:  # noqa: BLE001 - the runs and the comparison are written; say what broke
            print(f"report: error: {type(err).__name__}: {err}; rerun python -m ebsp_mpi report {out} "
                  f"--out {out / 'report'}", file=sys.stderr)
            status = 1
    return status
