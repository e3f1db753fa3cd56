"""Entry of ``mpiexec -n N python -m ebsp_mpi train``: set up, run the role of this rank, shut down.

Failure handling (docs/design.md, "Launch and failure"):

- during set-up (loading the dataset, building the model, opening traces) every rank sends its
  outcome to rank 0, which shares them all; every wait is polled, so that a rank dying meanwhile still
  aborts the job (``transport.polling.wait_all``), and a rank that has not reported ``runtime.setup_timeout_s``
  after rank 0 finished is named and the job aborted; if any rank failed, rank 0 prints the first
  error and every rank exits with code 2 (bad input) or 1 — cleanly, without ``MPI_Abort``;
- once training runs, an exception on any rank prints the rank and the message and calls
  ``MPI_Abort``, which ends every rank of the job with a non-zero exit code instead of leaving the
  others blocked in a receive;
- at the end each worker sends its statistics to the server, which waits for them by polling with
  the stall watchdog, and the ranks part in a polled ``Ibarrier``: a worker that dies or hangs after
  its last push still ends the job.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import traceback
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..backend import resolve_backend
from ..checkpoint import Checkpoint, read_checkpoint
from ..config import JobConfig, to_dict
from ..errors import OutputError, UsageError
from ..outputs import describe_run, make_run_dir, remove_if_unused, training_failed
from ..run_description import OsdpPlan, describe
from ..sync.registry import round_based
from .rank.abort import abort
from .rank.faults import fault_for
from .rank.peer_death import watch_peers
from .rank.placement import servers_alone_refusal
from .rank.signals import stop_signals, take_ctrl_c
from .rank.start import setup
from .transport.clock import restart_clock
from .transport.deadlines import Deadline, Silence
from .transport.env import world_size_from_env
from .transport.layout import make_layout
from .transport.polling import wait_all, wait_collective
from .transport.protocol import SETUP_TAG
from .transport.push_window import open_push_window

log = logging.getLogger(__name__)


def run_mpi(job: JobConfig, out: str | None, show_progress: bool = True, resume: bool = False, *,
            plan: OsdpPlan | None, identity=None) -> int:
    """Run this rank's part of the job; returns the process exit code. With `resume`, `out` is the run
    directory of a run to continue from its checkpoint. `plan`: the job's OSDP plan as the command line
    read it (``run_description.read_osdp_plan``; None: the job names none). `identity`: what the run is made from
    (``ebsp_mpi.identity``; a resumed run's checked against its checkpoint, with its run id), by
    default worked out here; a new run's id is rank 0's, shared with every rank."""
    ctx = _start(job)
    role, error, resumed_at, run_dir = None, None, 0.0, None
    try:
        run_dir, ckpt, ctx.identity = _run_dir(ctx, job, out, resume, identity)
        if ckpt is not None:
            resumed_at = ckpt.run_seconds
        role = make_role(ctx, job, run_dir, ckpt, show_progress, plan=plan, identity=ctx.identity)
        fault = fault_for(ctx.rank, ctx.size)  # EBSP_INJECT_FAULT, to test the failure paths
        if fault is not None and fault.due("setup"):
            fault.fire("set-up")
    except Exception as e:  # noqa: BLE001 - every rank reports its set-up outcome, whatever it was
        if isinstance(e, (UsageError, FileExistsError)):
            error = (2, f"{e}")
        elif isinstance(e, OutputError):  # a file of the run that cannot be written: one line too
            error = (1, f"{e}")
        else:
            error = (1, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    code = _set_up_outcome(ctx, error, run_dir if not resume else None, job.runtime.setup_timeout_s)
    if code:
        close_push_window(ctx)
        return code
    try:
        restart_clock(ctx, Silence(job.runtime.stall_timeout_s, "the server (rank 0)", ranks=(0,)))
        ctx.t0 -= resumed_at  # a resumed run's clock goes on from its checkpoint
        summary = role.run()  # a worker's ends by sending its statistics to the server
        # the ranks part together; a rank that stops answering now is named instead of waited for
        others = "a worker or server" if ctx.rank == 0 else "the server (rank 0)"
        wait_collective(ctx, ctx.comm.Ibarrier(), Silence(job.runtime.stall_timeout_s, others,
                                                                  ranks=() if ctx.rank == 0 else (0,)))
        close_push_window(ctx)
    except BaseException as e:  # noqa: BLE001 - any failure must take the whole job down
        abort(ctx, e)
        return 1  # MPI_Abort ends the process; should it come back, this rank has still failed
    if ctx.rank != 0:
        return stop_signals.exit_code  # 130 after Ctrl-C: the launcher reports the largest code
    print(describe_run(summary, role.run_dir))
    failed = training_failed(summary)
    if failed:
        print(f"ebsp_mpi: error: {failed}", file=sys.stderr)
        return 1
    return stop_signals.exit_code


def _start(job: JobConfig):
    """This rank's MPI context, once the launcher and MPI agree on the world; every rank's PID known
    to the watchers of dead peers."""
    world, announced = MPI.COMM_WORLD.Get_size(), world_size_from_env()
    if world != announced:  # srun --mpi=none, say: every task an MPI job of its own, each one's rank 0
        raise UsageError(f"the launcher started {announced} processes, but MPI sees a world of {world}: the "
                         f"launcher and this MPI library do not speak the same process-management interface "
                         f"(under srun: --mpi=$(python -m ebsp_mpi.slurm mpi); see slurm/README.md)")
    ctx = setup()
    take_ctrl_c()
    ctx.servers = job.runtime.servers
    if ctx.rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    # a launcher that kills the job when one rank dies may name only its PID: this maps PIDs to ranks;
    # rank 0 watches every rank, the others the servers (see rank.peer_death.watch_peers)
    procs = ctx.comm.allgather((ctx.host, os.getpid()))
    ctx.hosts = [host for host, _ in procs]
    watch_peers(procs if ctx.rank == 0 else procs[:ctx.servers], ctx.servers)
    if ctx.rank == 0:
        log.info("ranks: %s", ", ".join(f"{r} ({ctx.role_of(r)}) pid {pid} on {host}"
                                        for r, (host, pid) in enumerate(procs)))
    # every rank knows every host: all refuse alike, and rank 0 says it in one line
    refusal = servers_alone_refusal(ctx.hosts, ctx.servers) if job.runtime.servers_alone else ""
    if refusal:
        raise UsageError(refusal)
    return ctx


def _set_up_outcome(ctx, error: tuple[int, str] | None, new_run_dir: Path | None, timeout_s: float) -> int:
    """Every rank's set-up outcome, shared by polled messages: 0 when all succeeded, else the exit code
    (rank 0 prints the first error and removes `new_run_dir` if nothing was written to it). A rank
    that has not reported `timeout_s` after rank 0 finished its own set-up is named, and the job ends."""
    codes = np.zeros(ctx.size, dtype=np.int32)
    try:
        _share_codes(ctx, error[0] if error else 0, codes, timeout_s)
    except BaseException as e:  # noqa: BLE001 - a peer died or hung while this rank set up
        abort(ctx, e)
    if not codes.any():
        return 0
    errors = ctx.comm.gather(error, root=0)  # every rank is alive: each has sent its code
    if ctx.rank == 0:
        if new_run_dir is not None:
            remove_if_unused(new_run_dir)  # leave no empty run behind
        rank, (_, text) = next((r, e) for r, e in enumerate(errors) if e is not None)
        print(f"ebsp_mpi: error on rank {rank} ({ctx.role_of(rank)}): {text}", file=sys.stderr)
    return int(codes.max())


def _share_codes(ctx, code: int, codes: np.ndarray, timeout_s: float) -> None:
    """Fill `codes` with every rank's set-up exit code, on every rank. Each rank sends its own to rank
    0, which knows who has not reported once `timeout_s` have passed (a collective could not say),
    and then broadcasts them all. The others give rank 0 twice as long: it may finish its set-up
    after them, and a rank it waits for is its to name."""
    backoff = ctx.backoff()
    if ctx.rank == 0:
        codes[0] = code
        ranks = list(range(1, ctx.size))
        missing = set(ranks)

        def heard_from(done):
            missing.difference_update(ranks[i] for i in done)

        def say():
            who = ", ".join(f"rank {r} ({ctx.role_of(r)})" for r in sorted(missing))
            return (f"{who} had not finished setting up {timeout_s:g} s after rank 0 had (runtime.setup_timeout_s = "
                    f"{timeout_s:g}); it may have died or hung")

        receives = [ctx.comm.Irecv(codes[r:r + 1], r, SETUP_TAG) for r in ranks]
        wait_all(receives, backoff, Deadline(timeout_s, say, lambda: sorted(missing)), heard_from)
        wait_all([ctx.comm.Ibcast(codes, root=0)], backoff)  # every rank has reported: it waits for this
        return
    mine = np.array([code], np.int32)  # kept until the send completes
    send = ctx.comm.Isend(mine, 0, SETUP_TAG)
    outcome = ctx.comm.Ibcast(codes, root=0)
    wait_all([send, outcome], backoff, Deadline(
        2 * timeout_s, lambda: f"the server (rank 0) gave no set-up outcome {2 * timeout_s:g} s after rank "
                               f"{ctx.rank} had set up (runtime.setup_timeout_s = {timeout_s:g}); it may have "
                               f"died or hung", lambda: (0,)))


def make_role(ctx, job: JobConfig, run_dir: Path, ckpt: Checkpoint | None = None, show_progress: bool = True,
              worker_class=None, *, plan: OsdpPlan | None, identity=None, probe=None):
    """This rank's part of the job, ready to ``run()``: rank 0 the server and scheduler, ranks
    1..k-1 the other servers (``runtime.servers = k``), the rest workers (`worker_class`, default
    ``Worker``: a benchmark may pass its own, and a ``ServerProbe`` for rank 0). With `ckpt`, each
    continues from the checkpoint.

    The job is resolved here once into the run every role works from (``RunDescription``), with the
    layout of its messages on these ranks; `plan` is its OSDP plan as the command line read it
    (``read_osdp_plan``; None: the job names none)."""
    try:
        fault = fault_for(ctx.rank, ctx.size)  # EBSP_INJECT_FAULT, to test the failure paths
        if fault is not None and fault.due("data"):
            fault.fire("the data")
        description = describe(job, ctx.workers, plan, identity)
        description = dataclasses.replace(description, layout=make_layout(ctx, description))
    except BaseException:
        _open_push_window(ctx, job, None)  # this node's other ranks learn that this one cannot
        raise
    ctx.push_window = _open_push_window(ctx, job, description.layout)
    if ctx.rank == 0:
        from .servers.server import Server

        from .servers.probe import NO_PROBE

        return Server(ctx, description, run_dir, show_progress=show_progress, resume=ckpt, probe=probe or NO_PROBE)
    if ctx.is_server:
        from .servers.shard_server import ShardServer

        return ShardServer(ctx, description, run_dir, resume=ckpt)
    from .worker.loop import Worker

    start = 0 if ckpt is None else int(ckpt.iterations[ctx.worker_of(ctx.rank)])
    return (worker_class or Worker)(ctx, description, run_dir, start_iteration=start)


def _open_push_window(ctx, job: JobConfig, layout):
    """The node's window of pushes read in place (``transport.push_window``), where the job allows it;
    `layout` None: this rank's set-up failed."""
    if not job.runtime.shared_pushes:
        return None
    from .servers.round_stream import streams

    readers = [s for s in range(ctx.servers)
               if not (round_based(job.sync) and streams(job.runtime.stream_rounds, ctx, s))]
    on_host = not ctx.is_server and _numpy_backend(job, ctx)
    window = open_push_window(ctx, layout, readers, on_host, job.runtime.setup_timeout_s)
    if ctx.rank == 0 and window is not None and window.read_by(0):
        log.info("pushes read in place (shared memory) by the server: workers %s",
                 ", ".join(str(ctx.worker_of(r)) for r in sorted(window.read_by(0))))
    return window


def _numpy_backend(job: JobConfig, ctx) -> bool:
    """This rank's backend is NumPy (its gradient in host memory); False where it cannot be resolved
    (the worker's own set-up then says why)."""
    try:
        return resolve_backend(job.backend, local_rank=ctx.local_rank).name == "numpy"
    except Exception:  # noqa: BLE001 - the worker's set-up reports it
        return False


def close_push_window(ctx) -> None:
    """Free the node's window of pushes, once every rank is past the run (collective over the node)."""
    if ctx.push_window is not None:
        ctx.push_window.close()
        ctx.push_window = None


def _run_dir(ctx, job: JobConfig, out: str | None, resume: bool, identity=None):
    """Rank 0 creates the run directory (refusing a non-empty or unwritable one), or with `resume`
    takes the existing one and reads its checkpoint; every rank learns the path, the checkpoint's
    clock and counts (rank 0 keeps its arrays) and the run's identity (a new run's id made here), or
    the reason there is none (so that no rank waits for a path that never comes). Returns ``(path,
    checkpoint or None, identity)``."""
    from .. import identity as ids

    path, error, ckpt = None, None, None
    if ctx.rank == 0:
        try:
            path = str(make_run_dir(out, job.name, resume=resume))
            ckpt = read_checkpoint(path) if resume else None
            if identity is None:
                identity = ids.current(to_dict(job))
            if identity.run_id is None:
                identity = dataclasses.replace(identity, run_id=ids.new_run_id())
        except (FileExistsError, UsageError) as e:
            error = str(e)
    meta = None if ckpt is None else dataclasses.replace(ckpt, params=None, velocity=None)
    path, error, meta, identity = ctx.comm.bcast((path, error, meta, identity), root=0)
    if error:
        raise UsageError(error)
    return Path(path), (ckpt if ctx.rank == 0 else meta), identity
