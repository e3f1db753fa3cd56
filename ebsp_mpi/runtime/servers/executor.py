"""The order executor: how every server rank, rank 0 included, carries out the coordinator's orders.

Rank 0 decides (``sync.coordinator``) and turns each decision into orders (``runtime.servers.orders``); every
server rank, rank 0 too, carries them out on its shard here, in their order, through the same code:
take a push in (applied or rejected), close a BSP round and send its replies, answer a pull, send
the shard to rank 0, end. An order that needs a push not yet whole here waits at the head of the
queue until it is (the worker sent every part of it before rank 0 could decide on it, so the parts
are on their way); on rank 0, which decided on pushes it holds whole, no order ever waits.

What only rank 0 adds (the reply's header, the trace, the warning of a rejected push, the round's
members for SFB) comes through a :class:`Host`; ranks 1..k-1 have none.

Push counts are not kept here: each order carries its push's iteration, which the push's header
must match.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from mpi4py import MPI

from .host import Host
from .orders import ApplyOrder, EndOrder, Order, RejectOrder, ReplyOrder, RoundOrder, SnapshotOrder
from .probe import NO_PROBE
from ..transport.protocol import SNAP_TAG, ProtocolError


def _nothing() -> None:
    """Nothing to do while a server waits for its own sends."""


class OrderExecutor:
    """Carries out orders on one server's shard (``runtime.servers.shard.ShardStore``), in order.

    Parameters
    ----------
    store : ShardStore
    host : Host, optional
        Rank 0's part of each order; none on the other servers.
    on_idle : callable
        Run between polls while a round waits for replies still sending from the weights (rank 0:
        its watchdogs).
    fault : Fault or None
        ``EBSP_INJECT_FAULT`` on a server of one shard: due at its `taken`-th push taken in.
    taken : int
        The pushes taken in before this process (a resumed run's).
    probe : ServerProbe, optional
        Told when a BSP round's order begins and ends (a benchmark's; ``runtime.servers.probe``).
    """

    def __init__(self, store, host: Host | None = None, on_idle=_nothing, fault=None, taken: int = 0,
                 probe=NO_PROBE):
        self.store, self.host, self.on_idle, self.probe = store, host or Host(), on_idle, probe
        self.fault, self.taken = fault, taken
        n = store.n
        self.outstanding = np.zeros(n, dtype=bool)  # a push of the worker's is expected, not yet taken
        self.complete = np.zeros(n, dtype=bool)  # ... and all of it is here
        self.queue: deque[Order] = deque()  # orders not carried out yet
        self.snapshots: list = []  # shard sends to rank 0 in flight, with their buffers
        self.ended = False

    def arrived(self, workers: list[int]) -> None:
        """The pushes of `workers` are whole here (``ShardStore.take_parts``)."""
        self.complete[workers] = True

    def take(self, orders: list[Order]) -> None:
        """Queue `orders` behind those not carried out yet."""
        self.queue.extend(orders)

    def carry_out(self) -> bool:
        """Carry out the orders at the head of the queue, in order, as far as the pushes they need have
        come; True when any was."""
        did = False
        while self.queue and self._carry(self.queue[0]):
            self.queue.popleft()
            did = True
        return did

    def stream(self, backoff) -> bool:
        """BSP with ``runtime.stream_rounds``: apply and send the chunks every worker of the open round
        has pushed (``runtime.servers.round_stream``); True when any was. The round's close is its order's."""
        return self.store.stream is not None and self.store.stream_ready(backoff, self.on_idle)

    # -- one order --------------------------------------------------------------------------------

    def _carry(self, order: Order) -> bool:
        """Carry `order` out; False when it needs a push not whole here yet."""
        kind = type(order)
        if kind is ApplyOrder:
            if not self.complete[order.worker]:
                return False
            self._take_push(order.worker, order.iteration, applied=True)
            self.store.apply(order.worker, order.version)
        elif kind is RejectOrder:
            if not self.complete[order.worker]:
                return False
            self._take_push(order.worker, order.iteration, applied=False)
            self.host.rejected(order)
        elif kind is ReplyOrder:
            return self._reply(order)
        elif kind is RoundOrder:
            self.probe.round_begins()
            closed = self._round(order)
            self.probe.round_ends(closed)
            return closed
        elif kind is SnapshotOrder:
            self._send_snapshot(order.with_velocity)
        elif kind is EndOrder:
            self.ended = True
        return True

    def _take_push(self, w: int, iteration: int, applied: bool) -> None:
        """Take in `w`'s whole push, its `iteration`-th (its header must say so); `applied`: its header
        must not reject it."""
        if not self.complete[w]:
            raise ProtocolError(f"rank 0 ordered push {iteration} of worker {w} taken in before it was whole")
        if self.store.rejected(w, iteration) and applied:
            raise ProtocolError(f"rank 0 ordered push {iteration} of worker {w} applied, but its header says it "
                                f"holds NaN or Inf")
        self.outstanding[w] = self.complete[w] = False
        self.taken += 1
        if self.fault is not None and self.fault.due(self.taken):
            self.fault.fire(f"push {self.taken}")

    def _round(self, order: RoundOrder) -> bool:
        """BSP: the round's mean as one step (the chunks streamed already are not applied again), then
        its replies, each joining its chunk sends."""
        if not self.store.stream.all_in:  # the round's headers say which pushes are its members
            return False
        for w, iteration in zip(order.members, order.iterations, strict=True):
            self._take_push(w, iteration, applied=True)
        closed = self.store.close_round(order.members, order.version, self.store.ctx.backoff(), self.on_idle)
        if sorted(closed.sends) != sorted(r.worker for r in order.replies):
            raise ProtocolError(f"the round's weights went to workers {sorted(closed.sends)}, its replies are to "
                                f"{sorted(r.worker for r in order.replies)}")
        self.host.round_closed(order)
        for reply in order.replies:
            if not self._reply(reply, closed.sends[reply.worker], closed.redo):
                raise ProtocolError(f"a reply of the round to worker {reply.worker} before its push was whole")
        return True

    def _reply(self, order: ReplyOrder, sent: list | None = None, redo: bool = False) -> bool:
        """Answer a pull with this shard: from the reply buffer, or (a round's reply) the chunk sends
        `sent` already on their way. A push still outstanding at a reply is, under BSP, a stop reply's:
        the worker's last push, which the round still to come applies; it must be here first."""
        w, store = order.worker, self.store
        if self.outstanding[w]:
            if not self.complete[w]:
                return False
            if not order.stop:
                raise ProtocolError(f"rank 0 ordered a reply to worker {w} before its push was taken in")
        buffer = store.params if sent is not None else store.reply_buffer()
        store.reply(w, buffer, order.stop, self.host.reply_header(order, redo), sent, order.last)
        self.host.replied(order)
        if not order.stop:
            self.outstanding[w] = True
        return True

    def _send_snapshot(self, with_velocity: bool) -> None:
        """This shard to rank 0, as of the orders before this one: a BSP round that streams here already
        is not in it."""
        store, comm = self.store, self.store.ctx.comm
        parts = [store.before_round(store.params)[store.lo:store.hi]]
        if with_velocity:
            parts.append(store.before_round(store.opt.velocity)[store.lo:store.hi])
        for part in parts:
            self.snapshots.append((comm.Isend([part, MPI.FLOAT], 0, SNAP_TAG), part))
