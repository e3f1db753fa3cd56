"""Keep-alive messages: a watched rank that has nothing to say still says that it lives."""

from __future__ import annotations

import math

import numpy as np
from mpi4py import MPI

from .polling import Backoff, wait_all
from .protocol import ALIVE_TAG

#: seconds between a server's housekeeping passes (keep-alives, watchdogs, trace flush; on rank 0 also
#: evaluation start, progress and stray messages)
HOUSEKEEPING_S = 0.05
#: what a keep-alive carries (never written, so always safe to send)
ALIVE = np.zeros(1)
#: what the server's last keep-alive to a worker carries, once every worker's statistics are in: no other
#: follows, and the worker may stop listening (``protocol.ALIVE_TAG``)
PARTING = np.ones(1)


class KeepAlive:
    """Keep-alive messages (``protocol.ALIVE_TAG``) from this rank to the peers that watch it: one to
    each peer that has been told nothing for a quarter of the stall timeout, so that the peer's
    watchdog fires on a dead or stopped rank, never on one that merely has nothing to say.

    Parameters
    ----------
    comm : MPI.Comm
    stall_timeout_s : float
        ``runtime.stall_timeout_s``.
    """

    def __init__(self, comm, stall_timeout_s: float):
        self.comm, self.interval = comm, stall_timeout_s / 4
        self.last_told: dict[int, float] = {}  # rank -> when this rank last sent it anything
        self.sends: list = []

    def told(self, rank: int, now: float) -> None:
        """A message went to `rank` at `now` (a reply, orders): it says as much as a keep-alive."""
        self.last_told[rank] = now

    def tick(self, now: float, ranks) -> None:
        """Send a keep-alive to each of `ranks` told nothing for a quarter of the stall timeout (at
        once to one never told anything), and let go of the sends that have completed."""
        for rank in ranks:
            if now - self.last_told.get(rank, -math.inf) >= self.interval:
                self.sends.append(self.comm.Isend([ALIVE, MPI.DOUBLE], rank, ALIVE_TAG))
                self.last_told[rank] = now
        self.sends = [r for r in self.sends if not r.Test()]

    def part(self, ranks) -> None:
        """The last keep-alive to each of `ranks`: :data:`PARTING`, after which none follows."""
        for rank in ranks:
            self.sends.append(self.comm.Isend([PARTING, MPI.DOUBLE], rank, ALIVE_TAG))

    def wait(self, backoff: Backoff) -> None:
        """Complete the keep-alives still in flight (small: complete already, or soon)."""
        wait_all(self.sends, backoff)
