"""Command line: ``python -m ebsp_mpi {train,config,sweep,bench,simulate,profile,plan,report,compare,timeline} ...``.

- ``train``: train a job (under mpiexec: rank 0 serves, the rest are workers);
- ``config``: print the resolved job as TOML;
- ``sweep``: run every member of a sweep file with mpiexec, then compare them (:mod:`ebsp_mpi.sweep`);
- ``bench``: run a benchmark (:mod:`ebsp_mpi.bench.cli`);
- ``simulate``: the job's sync model with N virtual workers, no MPI (:mod:`ebsp_mpi.sim`);
- ``profile``, ``plan``: OSDP's per-layer profile and its plan under a memory limit
  (:mod:`ebsp_mpi.plan_cli`);
- ``report``, ``compare``, ``timeline``: the analysis of finished runs and sweeps: tables and figures,
  time to accuracy against BSP, Perfetto JSON (:mod:`ebsp_mpi.analysis.cli`).

Each subcommand imports what it needs only when it runs, so that ``train`` works without the
``analysis`` extra (pandas, matplotlib).

Errors a person can fix (a bad job value, a missing dataset file, an unusable backend) print one line
and exit with code 2, without a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from .config import check_workers, load_job, to_toml
from .errors import OutputError, UsageError
from .safe_text import directory

EXIT_USAGE = 2
EXIT_FAILURE = 1


def main(argv=None) -> int:
    from .runtime.transport.env import prepare_rank_env

    # before NumPy loads its BLAS and before MPI starts (this module imports neither at its top): a
    # rank's threads and MPICH's shared memory, for ``python -m ebsp_mpi`` and the ``ebsp-mpi`` script
    prepare_rank_env()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        return args.run(args)
    except (UsageError, FileExistsError) as e:
        return _one_line_error(e, EXIT_USAGE)
    except OutputError as e:
        return _one_line_error(e, EXIT_FAILURE)


def _one_line_error(e: Exception, code: int) -> int:
    from .runtime.transport.env import rank_from_env

    # under mpiexec every rank reads the same job and fails the same way: one line is enough
    if rank_from_env() == 0:
        print(f"ebsp_mpi: error: {e}", file=sys.stderr)
    return code


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; for `command` ``train`` or ``config``, only theirs. Every rank of an
    MPI job parses ``train``: building the other commands' parsers imports their modules, 40 - 80 ms
    of each rank's start-up."""
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    train = sub.add_parser("train", help="train a job (under mpiexec: rank 0 serves, the rest are workers)")
    _job_args(train)
    train.add_argument("--out", type=directory, metavar="DIR", help="run directory (default runs/<name>-<timestamp>)")
    train.add_argument("--resume", metavar="DIR",
                       help="continue the run in DIR from its checkpoint.h5 (its own job; JOB and --set may "
                            "change only stop.* and checkpoint.*)")
    train.add_argument("--accept-mismatch", metavar="PIECE[,PIECE]",
                       help="with --resume: go on although these pieces of the run's identity differ from what "
                            "the run was made from: run (its id), job, data (the dataset files), code, or all; "
                            "the summary records it")
    train.set_defaults(run=_train)

    config = sub.add_parser("config", help="print the resolved job as TOML (the embedded default without JOB)")
    _job_args(config)
    config.set_defaults(run=_config)
    if command in ("train", "config"):
        return parser

    # the models from the registry that builds them, so that a new one is named here too (its import,
    # ~0.2 s, is paid by the commands that show this text, not by every rank of an MPI job)
    from .sync.registry import POLICIES

    parser.description = ("Parameter-server training over MPI under a choice of synchronization model "
                          f"(sync.model: {', '.join(POLICIES)}).")

    from . import sweep  # standard library only until a sweep runs

    sweep.add_parser(sub)
    from .bench import cli as bench  # standard library only until a benchmark runs

    bench.add_parser(sub)
    from .sim import cli as simulate  # standard library only until a simulation runs

    simulate.add_parser(sub)
    from . import plan_cli as osdp  # standard library only until they run

    osdp.add_parsers(sub)
    from .analysis import cli as analysis  # standard library only until an analysis command runs

    analysis.add_parsers(sub)
    return parser


def _job_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", nargs="?", metavar="JOB.toml", help="job file (default: the embedded default job)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key, e.g. --set sync.model=ssp --set optim.lr=0.1 (repeatable)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def _config(args) -> int:
    sys.stdout.write(to_toml(load_job(args.job, args.overrides)))
    return 0


def _resumed_job(args, world_size: int):
    """The job of the run that ``--resume DIR`` continues, its workers (those of the checkpoint), its
    OSDP plan as read (the one the run trained with), and its identity, checked against what the run
    was made from (``ebsp_mpi.identity``)."""
    from .checkpoint import check_identity, check_plan_unchanged, check_traces_resumable, resume_job
    from .identity import parse_accepted
    from .run_description import read_osdp_plan

    if args.out:
        raise UsageError("--resume DIR continues the run in DIR: give no --out")
    accept = parse_accepted(args.accept_mismatch)
    job, ckpt = resume_job(args.resume, args.job, args.overrides, accept)
    try:
        plan = read_osdp_plan(job)
    except UsageError:  # gone or damaged: the check names the plan the run needs, if the checkpoint knows it
        if not ckpt.plan_sha256:
            raise
        plan = None
    check_plan_unchanged(args.resume, ckpt, plan.sha256 if plan is not None else "")
    # the launch's size first: the job's per-worker keys (straggler.slowdown) fit the run's workers only
    launched = world_size - job.runtime.servers if world_size > 1 else (job.sync.workers or 1)
    if launched != len(ckpt.iterations):
        ranks = len(ckpt.iterations) + job.runtime.servers
        raise UsageError(f"--resume {args.resume}: the run had {len(ckpt.iterations)} workers, this launch has "
                         f"{launched}; launch it as it was (world size {ranks} under MPI: "
                         f"{job.runtime.servers} server(s) and {len(ckpt.iterations)} workers)")
    workers = check_workers(job, world_size)
    left = work_left(job, ckpt)
    if left is not None:
        raise UsageError(f"--resume {args.resume}: nothing left to do: {left}; its files stay as they are")
    check_traces_resumable(args.resume, job, workers, world_size)
    return job, workers, plan, check_identity(args.resume, job, ckpt, accept)


def work_left(job, ckpt) -> str | None:
    """Why the run `ckpt` checkpointed has nothing left to do under `job`'s stop rule, or None: it
    has trained ``stop.seconds`` already, or every worker has pushed its last iteration (the server
    would stop each at once). Only ``stop.epochs`` needs the data set's size, so only then is it loaded."""
    from . import build

    stop, done = job.stop, [int(i) for i in ckpt.iterations]
    if stop.seconds and ckpt.run_seconds >= stop.seconds:
        return (f"the run has trained {ckpt.run_seconds:.1f} s and stop.seconds = {stop.seconds:g}; "
                f"raise stop.seconds to train on")
    if not stop.iterations and not stop.epochs:
        return None
    if stop.iterations and min(done) < stop.iterations and not stop.epochs:
        return None
    batches = [None] * len(done)
    if stop.epochs:
        ds = build.dataset(job)
        batches = [build.batch_stream(job, ds, w, len(done)).batches_per_epoch for w in range(len(done))]
    limits = [build.iteration_limit(job, b) if b is not None else stop.iterations for b in batches]
    if any(d < lim for d, lim in zip(done, limits, strict=True)):
        return None
    given = ", ".join(f"{key} = {value:g}" for key, value in (("stop.iterations", stop.iterations),
                                                            ("stop.epochs", stop.epochs)) if value)
    return (f"its workers have done {done} iterations, and {given} stop them at {limits}; raise "
            f"{'stop.iterations' if stop.iterations else 'stop.epochs'} to train on")


def _check_on_demand_layers(job, plan, world_size: int) -> None:
    """A plan that fetches layers on demand runs under mpiexec, with every gradient through the servers
    (docs/osdp.md): anything else is one line here, before any rank builds a model."""
    if plan is None or not plan.fetched_layers:
        return
    where = f"osdp.plan = {job.osdp.plan!r} fetches {', '.join(plan.fetched_layers)} on demand"
    if world_size == 1:
        raise UsageError(f"{where} from a parameter server: run it under mpiexec, with a server and workers")
    if job.comm.hybrid != "ps":
        raise UsageError(f"{where}, and its gradients go back through the server: set comm.hybrid = 'ps' "
                         f"(now {job.comm.hybrid!r})")


#: seconds a rank may spend starting MPI (``MPI_Init``) before it gives up; 0: no limit
MPI_INIT_TIMEOUT_ENV = "EBSP_MPI_INIT_TIMEOUT_S"
MPI_INIT_TIMEOUT_S = 300.0
#: the longest limit: a week (faulthandler's timer refuses what the platform's time_t cannot hold)
MPI_INIT_TIMEOUT_MAX_S = 7 * 24 * 3600.0
#: the shortest: a start of MPI takes a good part of a second on a loaded node; less would end every run
MPI_INIT_TIMEOUT_MIN_S = 1.0


def _start_mpi():
    """Import the MPI runtime, which starts MPI, within ``$EBSP_MPI_INIT_TIMEOUT_S`` (default 300 s);
    returns :func:`ebsp_mpi.runtime.launch.run_mpi`.

    A rank can wait in ``MPI_Init`` forever, printing nothing: ranks of a node given different
    ``MPIR_CVAR_*`` settings (an MPMD launch), a requeued Slurm job whose ranks meet the shared memory
    its killed first start left behind (slurm/README.md), or a process manager that never answers. No
    Python signal handler runs while the main thread is inside the MPI library: a watcher process
    forked before it (``runtime.rank.init_watch``) prints one line naming this rank's MPICH settings past the
    limit and kills the rank, and the launcher ends the job. Without ``fork``, faulthandler's watchdog
    thread prints where the rank was and exits with code 1.
    """
    import faulthandler

    from .runtime.transport.env import rank_from_env
    from .runtime.rank.init_watch import InitWatch, init_timeout_line
    from .runtime.rank.node_settings import disagreement, forget

    text = os.environ.get(MPI_INIT_TIMEOUT_ENV, "")
    try:  # ASCII only: float() takes other scripts' digits ('٥' is 5.0)
        timeout = float(text) if text.isascii() and text else MPI_INIT_TIMEOUT_S if not text else -1.0
    except ValueError:
        timeout = -1.0
    if not (timeout == 0 or MPI_INIT_TIMEOUT_MIN_S <= timeout <= MPI_INIT_TIMEOUT_MAX_S):
        raise UsageError(f"{MPI_INIT_TIMEOUT_ENV} = {text!r}: expected seconds from {MPI_INIT_TIMEOUT_MIN_S:g} to "
                         f"{MPI_INIT_TIMEOUT_MAX_S:g} (a week), or 0 (no limit)")
    differ, written = disagreement()
    if differ:  # every rank of the node knows; the node's first says it
        if os.environ.get("MPI_LOCALRANKID") == "0":
            print(f"ebsp_mpi: error: {differ}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)  # its file stays: a peer may not have read it yet
    watch = InitWatch(timeout, init_timeout_line(rank_from_env(), timeout)) if timeout and hasattr(os, "fork") \
        else None
    armed = bool(timeout) and watch is None and sys.__stderr__ is not None
    if armed:  # the process's own stderr: a file descriptor, which faulthandler's thread writes to
        faulthandler.dump_traceback_later(timeout, exit=True, file=sys.__stderr__)
    try:
        from .runtime.launch import run_mpi
    finally:
        if watch is not None:
            watch.done()
        forget(written)
        if armed:
            faulthandler.cancel_dump_traceback_later()
    return run_mpi


def _train(args) -> int:
    from .run_description import read_osdp_plan
    from .runtime.transport.env import world_size_from_env
    from .runtime.rank.faults import FAULT_ENV, parse_fault

    world_size = world_size_from_env()
    if args.resume:
        job, workers, plan, identity = _resumed_job(args, world_size)
    else:
        if args.accept_mismatch:
            raise UsageError("--accept-mismatch goes with --resume DIR: a new run has nothing to differ from")
        job = load_job(args.job, args.overrides)
        workers = check_workers(job, world_size)
        plan = read_osdp_plan(job)  # the one read of the plan file in this process: passed down from here
        identity = None  # a new run's: worked out where its id is made (rank 0, or the single process)
    # a bad value is one line here, not a rank's crash
    parse_fault(os.environ.get(FAULT_ENV, ""), world_size, job.runtime.servers)
    _check_on_demand_layers(job, plan, world_size)
    out = args.resume or args.out
    if world_size > 1:
        run_mpi = _start_mpi()
        return run_mpi(job, out, show_progress=not args.quiet, resume=bool(args.resume), plan=plan,
                       identity=identity)

    from . import reference
    from .outputs import describe_run, make_run_dir, release_lock, remove_if_unused, training_failed
    from .stop_signals import StopSignals

    run_dir = make_run_dir(out, job.name, resume=bool(args.resume))
    stop = StopSignals()
    try:
        summary = reference.train(job, run_dir, workers, show_progress=not args.quiet, resume=bool(args.resume),
                                  plan=plan, stop=stop, identity=identity)
    except UsageError:
        remove_if_unused(run_dir)  # bad input found while setting up: leave no empty run behind
        raise
    release_lock(run_dir)
    print(describe_run(summary, run_dir))
    failed = training_failed(summary)
    if failed:
        print(f"ebsp_mpi: error: {failed}", file=sys.stderr)
        return EXIT_FAILURE
    return stop.exit_code
