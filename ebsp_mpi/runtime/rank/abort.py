"""A failing rank takes the whole job down, saying which rank failed and why (never leave ranks hanging)."""

from __future__ import annotations

import math
import signal
import sys
import time
import traceback

from mpi4py import MPI

from ...errors import OutputError, UsageError
from ..transport.context import Context, role_name
from ..transport.failures import JobFailure, StallError

#: seconds between printing why the job stops and calling MPI_Abort
ABORT_GRACE_S = 0.5
#: seconds MPI_Abort may take before the rank exits by itself. Under Hydra, MPI_Abort asks the node's
#: proxy over its PMI socket and waits for the launcher: on a node whose link is cut neither answers
#: ever, and the rank would sleep in that read for good (nothing reaps ranks under mpiexec)
ABORT_BOUND_S = 10.0


def abort(ctx: Context | None, exc: BaseException) -> None:
    """Print which rank failed and why, then take the whole job down (never leave ranks hanging)."""
    rank = ctx.rank if ctx is not None else MPI.COMM_WORLD.Get_rank()
    role = ctx.role_of(rank) if ctx is not None else role_name(rank, 1)
    if isinstance(exc, (UsageError, OutputError, KeyboardInterrupt, JobFailure)):
        note = node_note(exc.ranks, ctx.hosts, rank, ctx.servers) if isinstance(exc, StallError) and ctx else ""
        text = f"ebsp_mpi: rank {rank} ({role}) stopped: {type(exc).__name__}: {exc}{note}\n"
    else:
        text = "".join(traceback.format_exception(exc)) + \
            f"ebsp_mpi: rank {rank} ({role}) failed: {type(exc).__name__}: {exc}\n"
    sys.stderr.write(text)
    sys.stderr.flush()
    # MPI_Abort makes the launcher kill every rank at once, and MPICH's Hydra may drop what it has not yet
    # forwarded from the ranks' pipes: give the message a moment to get out first
    time.sleep(ABORT_GRACE_S)
    # the kernel's timer, not a thread: SIGALRM's default action ends the process wherever it is blocked
    # (faulthandler's watchdog thread did not outlast MPICH's abort path)
    if hasattr(signal, "alarm"):
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(math.ceil(ABORT_BOUND_S))
    MPI.COMM_WORLD.Abort(2 if isinstance(exc, UsageError) else 1)


def node_note(silent, hosts: list[str], rank: int, servers: int) -> str:
    """Every rank on the nodes of the `silent` ranks, for a stall's message: when a node is lost (its
    link cut, its processes killed), the rank that stops names the one peer it waited for, but every
    rank of that node is gone with it. Nodes of this `rank`'s own are left out (it runs, so its node is
    not lost), and so is all of it where `hosts` (every rank's, by rank) is not known."""
    if not hosts:
        return ""
    nodes = sorted({hosts[r] for r in silent if 0 <= r < len(hosts) and hosts[r] != hosts[rank]})
    parts = [f"{node} runs " + ", ".join(f"rank {r} ({role_name(r, servers)})"
                                         for r, host in enumerate(hosts) if host == node) for node in nodes]
    return f"; a lost node takes all its ranks: {'; '.join(parts)}" if parts else ""
