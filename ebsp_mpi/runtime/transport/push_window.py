"""Pushes read in place: a worker on a server's node computes its gradient into its part of an MPI-3
shared window (``Win.Allocate_shared``), and the server reads it there; only the push's header goes
as a message (it completes the push and says whether every value is finite, as always). The reply
still goes as messages.

Why: through shared memory MPI copies every pushed byte into the server's buffer, and that copy,
made by the receiving process, was most of a server's time on a round beside its update; reading in
place takes it away (``bench ps``, docs/performance.md).

What makes it safe: a worker writes its gradient again only once the reply to its push has come, and
every server reads a push before it replies to it (``runtime.servers.executor`` refuses a reply to a
push not taken in, save a stop reply, after which the worker computes nothing more). ``Win.Sync``
orders the memory on each side of the header: the worker's writes before it goes, the server's reads
after it has come.

Which pairs: a worker and a server on one node, unless the run has SFB layers (a server writes a
rebuilt gradient into the push's buffer), OSDP on-demand layers (their gradient leaves a fetch
buffer), the server streams its BSP rounds (it starts on each chunk's message,
``runtime.servers.round_stream``) or the worker's gradient is in device memory; only where the node's
shared memory has room (``env.shm_room``, and what is free); never with ``runtime.shared_pushes =
false``.

Every rank of a node first agrees (a nonblocking allreduce under the set-up's deadline), so a rank
whose set-up failed says no instead of leaving the others in the window's collective allocation.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from .deadlines import Deadline
from .env import SHM_DIR, shm_room
from .polling import wait_all

log = logging.getLogger(__name__)


@dataclass
class PushWindow:
    """The node's window of pushed gradients, open for the run (:func:`open_push_window`).

    Attributes
    ----------
    win : MPI.Win
        Locked for the run (passive target, ``MODE_NOCHECK``): :meth:`sync` is all either side needs.
    gradients : dict of int to numpy.ndarray
        Rank -> the gradient (float32, the whole model) of each worker of the node with a segment.
    readers : dict of int to list of int
        Rank of such a worker -> the server ranks that read its push in place.
    """

    win: MPI.Win
    gradients: dict[int, np.ndarray] = field(default_factory=dict)
    readers: dict[int, list[int]] = field(default_factory=dict)

    def servers_reading(self, worker_rank: int) -> list[int]:
        """The server ranks that read `worker_rank`'s push in place (none: it sends every chunk)."""
        return self.readers.get(worker_rank, [])

    def read_by(self, server_rank: int) -> dict[int, np.ndarray]:
        """Worker rank -> its gradient, for each worker whose push `server_rank` reads in place."""
        return {w: self.gradients[w] for w, servers in self.readers.items() if server_rank in servers}

    def sync(self) -> None:
        """A memory barrier for the window: the worker's gradient is written before its header goes,
        and the server reads it after the header has come."""
        self.win.Sync()

    def close(self) -> None:
        """Free the window: collective over the node, once its ranks are done with it."""
        self.win.Unlock_all()
        self.win.Free()


def open_push_window(ctx, layout, readers: list[int], gradient_on_host: bool, timeout_s: float) -> PushWindow | None:
    """Open the node's window, where any of its pairs can read pushes in place (see the module
    docstring); None elsewhere. Every rank of the job calls this at the same point of its set-up,
    unless ``runtime.shared_pushes`` is false on all.

    Parameters
    ----------
    layout : Layout or None
        The run's messages (``transport.layout``); None: this rank's set-up failed (it says no, then
        raises its own error).
    readers : list of int
        The server ranks that can take a push read in place: those that do not stream their rounds.
    gradient_on_host : bool
        A worker's gradient lives in host memory (the NumPy backend).
    timeout_s : float
        How long a rank waits for the others of its node (``runtime.setup_timeout_s``).

    Collective over ``ctx.node_comm``; the ranks of a node with no server or no worker return at once."""
    ranks = ctx.node_ranks
    if ctx.node_comm is None or not any(r < ctx.servers for r in ranks) or not any(r >= ctx.servers for r in ranks):
        return None
    servers = [r for r in ranks if r in readers]
    model_bytes = 0 if layout is None else 4 * sum(c.size for c in layout.chunks)
    needed = model_bytes * sum(r >= ctx.servers for r in ranks)
    can = layout is not None and needed <= _room()
    mine = model_bytes if can and _holds_segment(ctx, layout, servers, gradient_on_host) else 0
    # the node agrees: every rank can (the minimum), and some rank keeps its gradient there (the
    # maximum of mine, as the minimum of its negation)
    agreed = np.zeros(2, dtype=np.int64)
    wait_all([ctx.node_comm.Iallreduce(np.array([int(can), -mine], dtype=np.int64), agreed, op=MPI.MIN)],
             ctx.backoff(), Deadline(timeout_s, lambda: f"a rank of this node did not reach the shared window of "
                                                        f"pushes within {timeout_s:g} s (runtime.setup_timeout_s)",
                                     lambda: ()))
    if not agreed[0] or not agreed[1]:
        if not agreed[0] and layout is not None and ctx.rank == min(ranks):
            log.info("pushes on host %s go as messages: no room for %d bytes of shared memory, or a rank's "
                     "set-up failed", ctx.host, needed)
        return None
    info = MPI.Info.Create()
    info.Set("alloc_shared_noncontig", "true")  # each segment aligned on its own, next to its owner
    try:
        win = MPI.Win.Allocate_shared(mine, 4, info, comm=ctx.node_comm)
    except MPI.Exception as e:  # an MPI without shared windows fails alike on every rank of the node
        log.warning("pushes on host %s go as messages: the shared window failed (%s)", ctx.host, e)
        return None
    finally:
        info.Free()
    win.Lock_all(MPI.MODE_NOCHECK)
    window = PushWindow(win)
    for local, rank in enumerate(ranks):
        buf, _ = win.Shared_query(local)
        if len(buf):  # Open MPI rounds a segment up to whole pages
            window.gradients[rank] = np.frombuffer(buf, dtype=np.float32, count=model_bytes // 4)
            window.readers[rank] = servers
    return window


def _holds_segment(ctx, layout, servers: list[int], gradient_on_host: bool) -> bool:
    """This rank keeps its gradient in the window: a worker whose node has a server that reads in
    place, in a run whose layout allows it, with its gradient in host memory."""
    return (not ctx.is_server and bool(servers) and gradient_on_host and not layout.sfb
            and layout.schedule is None)


def _room() -> float:
    """The shared memory the node may still give to the window: what ``env.shm_room`` allows, and no
    more than half of what is free in ``/dev/shm``."""
    try:
        stat = os.statvfs(SHM_DIR)
        free = stat.f_bavail * stat.f_frsize / 2
    except OSError:
        free = float("inf")
    return min(shm_room(), free)
