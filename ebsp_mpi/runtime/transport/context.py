"""Where this process stands in the job: its communicators, rank, role and the run's time axis."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

from mpi4py import MPI

from .polling import Backoff
from .protocol import chunk_bytes_for


@dataclass
class Context:
    """Where this process stands in the job.

    Attributes
    ----------
    comm : MPI.Comm
        A duplicate of ``COMM_WORLD``: the library's traffic never matches a user's messages.
    rank, size : int
        Rank and world size.
    servers : int
        ``runtime.servers`` (k): ranks 0..k-1 are servers (rank 0 also schedules), ranks k..size-1 are
        workers 0..size-k-1. Set from the job once it is read (1 until then).
    local_rank : int
        Rank among the processes on this node (picks the GPU).
    hosts : list of str
        Every rank's host name, by rank (known once the job has started: ``runtime.launch._start``); a rank
        that stops on a silent peer names the other ranks of that peer's node (``rank.abort.node_note``).
    clock_offset : float
        Seconds to add to this rank's ``perf_counter`` to read rank 0's (measured at start-up).
    t0 : float
        Rank 0's ``perf_counter`` at the run's start: :meth:`now` counts from it. Set at setup, and
        again by :func:`~.clock.restart_clock` once every rank has built its part of the job.
    oversubscribed : bool
        More ranks of the job on this node than CPUs they may run on: waiting ranks must sleep
        (see :class:`~.polling.Backoff`).
    any_oversubscribed : bool
        Some node of the job is oversubscribed (the same on every rank).
    """

    comm: MPI.Comm
    rank: int
    size: int
    local_rank: int
    clock_offset: float = 0.0
    t0: float = 0.0
    oversubscribed: bool = True
    any_oversubscribed: bool = True
    factor_comm: MPI.Comm | None = None  # a second duplicate: sufficient factors (comm.hybrid) travel on it
    fetch_comm: MPI.Comm | None = None  # a third: OSDP's on-demand fetches (protocol.FETCH_TAG) travel on it
    servers: int = 1
    #: the ranks that share memory with this one (``COMM_TYPE_SHARED``), and their communicator
    node_comm: MPI.Comm | None = None
    node_ranks: list[int] = field(default_factory=list)
    #: the node's window of pushed gradients (``push_window``), where its workers' pushes are read in place
    push_window: object = None
    #: the run's identity (``ebsp_mpi.identity.Identity``), the same on every rank: its traces carry it
    identity: object = None
    hosts: list[str] = field(default_factory=list)

    @property
    def workers(self) -> int:
        return self.size - self.servers

    @property
    def is_server(self) -> bool:
        return self.rank < self.servers

    def worker_rank(self, worker: int) -> int:
        """The rank of worker index `worker`."""
        return self.servers + worker

    def worker_of(self, rank: int) -> int:
        """The worker index of `rank` (a worker's rank)."""
        return rank - self.servers

    def role_of(self, rank: int) -> str:
        """``"server"`` (rank 0 with one server), ``"server 1"``, or ``"worker 3"``: for messages."""
        return role_name(rank, self.servers)

    def now(self) -> float:
        """Seconds since the run's start on rank 0's clock (the time axis of every trace)."""
        return time.perf_counter() + self.clock_offset - self.t0

    @property
    def host(self) -> str:
        return socket.gethostname()

    def chunk_bytes(self, configured: int, total_bytes: int = 0) -> int:
        """The largest message of this job's pushes and replies (``runtime.chunk_bytes``; 0: automatic,
        from the model's `total_bytes` too where there are several servers)."""
        return chunk_bytes_for(configured, self.any_oversubscribed, total_bytes, self.servers)

    def backoff(self) -> Backoff:
        """How this rank waits for messages: sleeping only where the node has no core to spare."""
        return Backoff(spin=not self.oversubscribed)


def role_name(rank: int, servers: int) -> str:
    """What `rank` is in a job of `servers` servers, for messages: ``server``, ``server 1``, ``worker 0``."""
    if rank < servers:
        return "server" if servers == 1 else f"server {rank}"
    return f"worker {rank - servers}"
