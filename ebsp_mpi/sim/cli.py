"""``python -m ebsp_mpi simulate``: a run of the job's sync policy with virtual workers, no MPI.

::

    python -m ebsp_mpi simulate JOB.toml --workers 1024 --iterations 200 --out /tmp/sim
    python -m ebsp_mpi simulate --replay RUN_DIR --out /tmp/replayed      # the run's own job and times
    python -m ebsp_mpi simulate --sweep jobs/simulations/scaling.toml --out /tmp/scaling
    python -m ebsp_mpi simulate --train --workers 64 --iterations 50 --set data.batch_size=16   # real weights

``JOB`` and ``--set`` as for ``train``. The iteration times come from the job's straggler model
(``straggler.base_s`` and the rest; ``base_s = 0`` is taken as 10 ms), or with ``--replay`` from a
recorded run's traces. The run stops after ``--iterations`` (else ``stop.iterations``) pushes per
worker, or at ``stop.seconds``. The output is a run directory that ``report``, ``compare`` and
``timeline`` read as they read ``train``'s.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from ..errors import UsageError
from ..helptext import plain
from ..safe_text import directory, integer


def add_parser(subparsers) -> None:
    """Register ``simulate`` on the CLI's subparsers (``ebsp_mpi.cli``)."""
    p = subparsers.add_parser("simulate", help="simulate the job's sync model with N virtual workers (no MPI)",
                              description=plain(__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 2)[2]),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", nargs="?", metavar="JOB.toml",
                   help="job file (default: the replayed run's job with --replay, else the embedded default)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key, as for train (repeatable)")
    p.add_argument("--workers", "-n", type=integer, metavar="N",
                   help="virtual workers (default: sync.workers, or the replayed run's)")
    p.add_argument("--iterations", type=integer, metavar="K", help="pushes per worker (default: stop.iterations)")
    p.add_argument("--replay", metavar="RUN_DIR", help="replay the iteration times recorded in this run's traces")
    p.add_argument("--train", action="store_true",
                   help="real weights: every virtual worker computes its gradients on the version it was "
                        "released with, applied by the server's optimizer (with --replay of a run under its "
                        "own sync model: its pushes in their recorded order)")
    p.add_argument("--accept-mismatch", metavar="PIECE[,PIECE]",
                   help="with --replay: go on although these pieces of the run's identity differ from what the "
                        "replay uses: data (the dataset files), code, or all; the replay is then "
                        "not exact, and its summary says why")
    p.add_argument("--sweep", metavar="FILE", help="simulate every member of a sweep file, then tabulate them")
    p.add_argument("--out", type=directory, metavar="DIR",
                   help="run directory (default runs/<name>-simulated-<timestamp>)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(run=main)


def main(args) -> int:
    if args.accept_mismatch and not args.replay:
        raise UsageError("--accept-mismatch goes with --replay RUN_DIR: a new simulation has nothing to differ from")
    if args.sweep:
        if args.job or args.replay or args.overrides or args.workers is not None or args.iterations is not None:
            raise UsageError("simulate --sweep FILE: the sweep file names the jobs; give no JOB, --set, --workers, "
                             "--iterations or --replay")
        from .study import run_sweep, sweep_failure

        failed = sweep_failure(run_sweep(args.sweep, args.out, show_progress=not args.quiet, train=args.train))
        if failed:  # every member ran and is in the tables; as a live sweep, a failed one fails the command
            print(f"ebsp_mpi: error: {failed}", file=sys.stderr)
            return 1
        return 0
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers {args.workers}: needs at least 1 worker")
    if args.iterations is not None and args.iterations < 1:
        raise UsageError(f"--iterations {args.iterations}: needs at least 1")
    job = _job(args)
    provenance = None
    if args.replay:  # before its traces are read, and before the run directory: nothing left behind
        from ..identity import parse_accepted
        from .provenance import check_replay

        provenance = check_replay(args.replay, job, train=args.train, accept=parse_accepted(args.accept_mismatch))
    workers = _workers(args, job)
    # the run's job says how it ran (a replay of this run then runs the same)
    job.sync.workers = workers

    from ..data.memory import memory_phrase
    from ..outputs import make_run_dir, release_lock, remove_if_unused, training_failed
    from .run import check_workers_fit, describe, simulate_job

    check_workers_fit(job, workers, args.iterations, args.train)  # before the run directory: nothing to undo
    run_dir = make_run_dir(args.out, f"{job.name}-simulated")
    try:
        summary = simulate_job(job, workers, run_dir, replay=args.replay, iterations=args.iterations,
                               show_progress=not args.quiet, train=args.train, provenance=provenance)
    except MemoryError:  # past the estimate of check_workers_fit: the directory, empty when made, is this run's
        release_lock(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise UsageError(f"simulate with {workers} workers ran out of memory ({memory_phrase()}); simulate "
                         "fewer workers or iterations") from None
    except BaseException:  # a refusal, or anything else before the first file: no empty run directory left
        remove_if_unused(run_dir)
        raise
    release_lock(run_dir)
    print(describe(summary, run_dir))
    failed = training_failed(summary) if args.train else None
    if failed:  # the run went to its end, and its files stay: as a live run that diverged
        print(f"ebsp_mpi: error: {failed}", file=sys.stderr)
        return 1
    return 0


def _job(args):
    """The job: JOB with --set; with --replay and no JOB, the replayed run's own job with --set.

    ``--iterations K`` is one more override, ``stop.iterations=K``, applied before the job is validated:
    a job whose ``stop.*`` are all 0 is complete with it."""
    from ..config import apply_overrides, job_from_dict, load_job

    overrides = list(args.overrides)
    if args.iterations is not None:
        overrides.append(f"stop.iterations={args.iterations}")
    if args.job or not args.replay:
        return load_job(args.job, overrides)
    config = _replayed_config(Path(args.replay))
    return apply_overrides(job_from_dict(config, f"--replay {args.replay}"), overrides)


def _replayed_config(run_dir: Path) -> dict:
    from ..trace.reader import TraceError, read_summary, read_trace

    if not run_dir.is_dir():
        raise UsageError(f"--replay {run_dir}: no such directory (expected the --out of a train run)")
    summary, _ = read_summary(run_dir)
    config = summary.get("config")
    if not isinstance(config, dict):
        try:
            config = read_trace(run_dir / "trace" / "rank-0000.h5").config
        except TraceError:
            config = None
    if not config:
        raise UsageError(f"--replay {run_dir}: not a run directory (no summary.json or server trace naming its job)")
    return config


def _workers(args, job) -> int:
    if args.workers is not None:
        return args.workers
    if job.sync.workers:
        return job.sync.workers
    if args.replay:
        from .workers import read_replay

        return len(read_replay(Path(args.replay)))
    raise UsageError("simulate: how many workers? give --workers N (or --set sync.workers=N)")
