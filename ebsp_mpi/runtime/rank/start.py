"""The start of every rank under MPI: the library's communicators, the node-local rank, one clock, and
the signal handlers that keep a stopping or failing job in one piece."""

from __future__ import annotations

import os

from mpi4py import MPI

from ..transport.clock import measure_clock_offset, restart_clock
from ..transport.context import Context
from .peer_death import survive_peer_failure_notices
from .signals import note_termination_requests


def setup(base: MPI.Comm | None = None) -> Context:
    """Duplicate the world communicator, find the node-local rank and put all ranks on one clock.

    `base` (default ``COMM_WORLD``) is the group of ranks that form the job; the benchmarks run the
    server with fewer workers than there are ranks by passing a part of the world.
    """
    survive_peer_failure_notices()
    note_termination_requests()
    comm = (MPI.COMM_WORLD if base is None else base).Dup()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ctx = Context(comm=comm, rank=comm.Get_rank(), size=comm.Get_size(), local_rank=local.Get_rank(),
                  factor_comm=comm.Dup(), fetch_comm=comm.Dup(), node_comm=local)
    ctx.node_ranks = local.allgather(ctx.rank)
    ctx.oversubscribed = local.Get_size() > len(set().union(*local.allgather(_cpus())))
    ctx.any_oversubscribed = comm.allreduce(ctx.oversubscribed, op=MPI.LOR)
    ctx.clock_offset = measure_clock_offset(comm)
    restart_clock(ctx)
    return ctx


def _cpus() -> set[int]:
    """The CPUs this process may run on (all of the machine's where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))
