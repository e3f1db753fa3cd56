"""MPI set-up shared by the benchmarks that need ranks (``mpi``, ``ps``, ``overhead``).

mpi4py is imported inside the functions, so ``python -m ebsp_mpi bench nn`` never loads MPI.
"""

from __future__ import annotations

import contextlib

from ..errors import UsageError
from ..runtime.transport.env import world_size_from_env


def require_ranks(kind: str, at_least: int) -> None:
    """Refuse to start `kind` with fewer than `at_least` MPI ranks, naming the command to use."""
    size = world_size_from_env()
    if size < at_least:
        raise UsageError(f"bench {kind} needs at least {at_least} MPI ranks, got {size}; run it as "
                         f"mpiexec -n {max(at_least, 2)} python -m ebsp_mpi bench {kind}")


def world():
    """``COMM_WORLD`` (importing mpi4py here, not at module import)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def idle_barrier(comm, poll_s: float = 2e-3) -> None:
    """A barrier that sleeps while it waits: an idle rank must not spin on a core the others time.

    MPICH's blocking ``Barrier`` polls without yielding; with more ranks than cores that steals the
    measured ranks' CPU.
    """
    from ..runtime.transport.polling import Backoff, wait_all

    wait_all([comm.Ibarrier()], Backoff(first_s=poll_s / 8, max_s=poll_s))


def subgroup(comm, size: int):
    """The communicator of ranks 0..size-1 of `comm` (``None`` on the others)."""
    from mpi4py import MPI

    color = 0 if comm.Get_rank() < size else MPI.UNDEFINED
    sub = comm.Split(color, comm.Get_rank())
    return None if sub == MPI.COMM_NULL else sub


@contextlib.contextmanager
def abort_on_failure():
    """Take every rank down when one fails (printing its rank and message), rather than leave the
    others blocked in a collective."""
    try:
        yield
    except BaseException as e:  # noqa: BLE001 - any failure must end the whole job
        from ..runtime.rank.abort import abort

        abort(None, e)
