"""Rank 0's side of the other servers (ranks 1..k-1 with ``runtime.servers = k``).

Rank 0 alone runs the sync policy. Whatever it does to its own shard (apply a push, apply a round,
answer a pull) it appends here as an order (``runtime.servers.orders``); :meth:`PeerServers.flush` sends the
orders gathered since the last flush to every other server as one message, so each carries them out
in rank 0's order, through the same executor as rank 0 (``runtime.servers.executor``). A snapshot (evaluation,
checkpoint, the final model) is an order too: each server sends its shard back once it has carried
out every order before it, so the pieces form the model rank 0 holds at that point. Servers and
rank 0 tell each other they live (``ALIVE_TAG``) while no order flows, and rank 0 names a server
that has gone silent.

With one server there are no peers, and every method does nothing.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .orders import EndOrder, Order, SnapshotOrder, encode_orders
from ..transport.deadlines import Silence
from ..transport.failures import StallError
from ..transport.keepalive import KeepAlive
from ..transport.polling import wait_all
from ..transport.protocol import ALIVE_TAG, ORDER_TAG, SNAP_TAG, STATS_TAG, ProtocolError


class PeerServers:
    """The order stream to ranks 1..k-1 and what rank 0 hears from them.

    Parameters
    ----------
    ctx : Context
    layout : Layout
        The shards (``layout.shards[s]`` is server s's).
    stall_timeout_s : float
        ``runtime.stall_timeout_s``: keep-alives go every quarter of it; a server silent for longer
        is named.
    """

    def __init__(self, ctx, layout, stall_timeout_s: float):
        self.ctx, self.layout, self.timeout = ctx, layout, stall_timeout_s
        self.ranks = list(range(1, ctx.servers))
        self.orders: list[Order] = []
        self.sends: list = []  # order sends in flight (their buffers kept alive with them)
        self.alive = KeepAlive(ctx.comm, stall_timeout_s)
        self.last_heard = dict.fromkeys(self.ranks, 0.0)
        self.stats: dict[int, dict | None] = dict.fromkeys(self.ranks)
        self.ended = False

    def start(self, t: float) -> None:
        for s in self.ranks:
            self.alive.told(s, t)
            self.last_heard[s] = t

    def order(self, order: Order) -> None:
        """Send `order` with the next flush (nothing with one server)."""
        if self.ranks:
            self.orders.append(order)

    def flush(self, now: float) -> None:
        """Send the orders gathered since the last flush, as one message to every other server."""
        if not self.orders:
            return
        buf = encode_orders(self.orders)
        self.orders = []
        for s in self.ranks:
            self.sends.append((self.ctx.comm.Isend([buf, MPI.DOUBLE], s, ORDER_TAG), buf))
            self.alive.told(s, now)

    def housekeeping(self, now: float) -> None:
        """Keep-alives to servers that have had no order for a quarter of the stall timeout, the
        completed sends, and the watchdog."""
        self.alive.tick(now, [] if self.ended else self.ranks)
        self.sends = [(r, buf) for r, buf in self.sends if not r.Test()]
        for s in self.ranks:
            if self.stats[s] is None and now - self.last_heard[s] > self.timeout:
                raise StallError(f"server rank {s} silent for {now - self.last_heard[s]:.1f} s "
                                 f"(runtime.stall_timeout_s = {self.timeout}); it may have died or hung", [s])

    def take(self, status: MPI.Status, now: float) -> bool:
        """Take a message a server sent on its own (a keep-alive, or its statistics after the end);
        False when `status` is not a server's."""
        source, tag = status.Get_source(), status.Get_tag()
        if source not in self.last_heard:
            return False
        if tag == ALIVE_TAG:
            self.ctx.comm.Recv([np.empty(1), MPI.DOUBLE], source, ALIVE_TAG)
        elif tag == STATS_TAG and self.ended and self.stats[source] is None:
            self.stats[source] = self.ctx.comm.recv(source=source, tag=STATS_TAG)
        else:
            raise ProtocolError(f"unexpected message from server rank {source} with tag {tag} "
                                f"({status.Get_count(MPI.BYTE)} bytes)")
        self.last_heard[source] = now
        return True

    def gather(self, params: np.ndarray, velocity: np.ndarray | None, whole: np.ndarray,
               whole_velocity: np.ndarray | None, backoff, on_idle=None) -> None:
        """Fill `whole` (and `whole_velocity`) with every shard as of the orders given so far: rank 0's
        own from `params` (`velocity`), the others' as they send them; ``on_idle()`` runs between polls
        that find nothing."""
        lo, hi = self.layout.shards[0].lo, self.layout.shards[0].hi
        np.copyto(whole[lo:hi], params[lo:hi])
        if whole_velocity is not None:
            np.copyto(whole_velocity[lo:hi], velocity[lo:hi])
        requests, sources = [], []
        for s in self.ranks:
            shard = self.layout.shards[s]
            requests.append(self.ctx.comm.Irecv([whole[shard.lo:shard.hi], MPI.FLOAT], s, SNAP_TAG))
            sources.append(s)
            if whole_velocity is not None:
                requests.append(self.ctx.comm.Irecv([whole_velocity[shard.lo:shard.hi], MPI.FLOAT], s, SNAP_TAG))
                sources.append(s)
        self.order(SnapshotOrder(whole_velocity is not None))
        self.flush(self.ctx.now())
        arrived: set[int] = set()
        silence = Silence(self.timeout, lambda: _named(_missing(sources, arrived)),
                          ranks=lambda: _missing(sources, arrived))
        wait_all(requests, backoff, silence, arrived.update, on_idle)
        now = self.ctx.now()
        for s in self.ranks:
            self.last_heard[s] = now

    def end(self, now: float) -> None:
        """Every worker has stopped: tell the servers, which then send their statistics."""
        self.order(EndOrder())
        self.flush(now)
        self.ended = True

    def wait_sends(self, backoff) -> None:
        wait_all([r for r, _ in self.sends], backoff)
        self.alive.wait(backoff)


def _missing(sources: list[int], arrived: set[int]) -> list[int]:
    """The ranks of `sources` (request k's is ``sources[k]``) whose requests are not in `arrived`."""
    return sorted({s for k, s in enumerate(sources) if k not in arrived})


def _named(missing: list[int]) -> str:
    return "server rank" + ("s " if len(missing) > 1 else " ") + ", ".join(map(str, missing))

