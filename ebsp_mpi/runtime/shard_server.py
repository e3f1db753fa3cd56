"""Ranks 1..k-1 with ``runtime.servers = k``: a server of one shard, carrying out rank 0's orders.

It keeps a receive posted for every part of every worker's next push that comes to it (its chunks,
the factors of its SFB layers, the header), and carries out rank 0's orders (the ``protocol.*Order`` records) in
their order: apply a push, apply a round, answer a pull, send its shard to rank 0. It answers the
workers' OSDP fetches of its part of their on-demand layers at once (``runtime.fetch``). An order that
needs a push not yet complete here waits at the head of the queue until it is (the worker sent the
chunks before the header that rank 0 acted on, so they are on their way).

It watches rank 0 (orders or keep-alives at least every quarter of the stall timeout) and tells rank 0
that it lives while no order comes.
"""

from __future__ import annotations

import logging
from collections import deque

import numpy as np
from mpi4py import MPI

from ..sync.registry import round_based as model_round_based
from .rank.faults import fault_for
from .rank.trace_file import open_rank_trace
from .shard import ShardStore
from .transport.context import Context
from .transport.deadlines import Silence
from .transport.fetch import FetchServer
from .transport.keepalive import HOUSEKEEPING_S, KeepAlive
from .transport.layout import worker_limits
from .transport.polling import wait_all
from .transport.protocol import (ALIVE_TAG, ORDER_TAG, ORDER_WIDTH, SNAP_TAG, STATS_TAG, ApplyOrder, EndOrder,
                                 ProtocolError, ReplyOrder, RoundOrder, SnapshotOrder, decode_orders)

log = logging.getLogger(__name__)


class ShardServer:
    """Server rank ``ctx.rank`` (1 <= rank < k) of a run; :meth:`run` returns its statistics."""

    def __init__(self, ctx: Context, description, run_dir, resume=None):
        job = description.job
        self.ctx, self.job, self.run_dir = ctx, job, run_dir
        model = description.model()
        self.params = model.space.data
        self.layout = description.layout
        # rank 0 alone runs the policy; this server only needs to know whether it applies rounds
        round_based = model_round_based(job.sync)
        self.store = ShardStore(ctx, job, self.params, self.layout, ctx.rank, round_based,
                                resume.version if resume is not None else 0)
        self.limits = [float("inf") if lim is None else lim for lim in worker_limits(description.limits, self.layout)]
        # OSDP: its part of the on-demand layers, fetched by the workers
        self.fetches = (FetchServer(ctx, self.layout, self.params, self.store.bytes, self.store.stream)
                        if self.layout.schedule else None)
        if resume is not None:  # this shard of the checkpoint's parameters and optimizer state
            from ..checkpoint import read_checkpoint

            ckpt = read_checkpoint(run_dir)
            lo, hi = self.store.lo, self.store.hi
            self.params[lo:hi] = ckpt.params[lo:hi]
            self.store.opt.velocity[lo:hi] = ckpt.velocity[lo:hi]
        n = ctx.workers
        self.pushes = np.zeros(n, dtype=np.int64) if resume is None else np.array(resume.iterations, dtype=np.int64)
        self.outstanding = np.zeros(n, dtype=bool)  # a push of the worker's is expected, not yet taken
        self.complete = np.zeros(n, dtype=bool)  # ... and all of it is here
        self.queue: deque = deque()  # orders not carried out yet
        self.order_buf = np.empty(ORDER_WIDTH * (2 * n + 8))
        self.alive_buf = np.zeros(1)
        self.alive_recv = ctx.comm.Recv_init([self.alive_buf, MPI.DOUBLE], 0, ALIVE_TAG)
        self.sends: list = []  # snapshots in flight, with their buffers
        self.round_sends: dict[int, list] = {}  # BSP: the closed round's chunk sends, until its replies
        self.alive = KeepAlive(ctx.comm, job.runtime.stall_timeout_s)  # to rank 0, while no order comes
        self.ended = False
        self.trace = open_rank_trace(ctx, job, run_dir, role="server", backend="numpy", device="cpu",
                                     append=resume is not None)
        self.trace.set_attrs(**self.layout.as_attrs())
        self.fault = fault_for(ctx.rank, ctx.size)  # EBSP_INJECT_FAULT, to test the failure paths

    def run(self) -> dict:
        ctx, backoff = self.ctx, self.ctx.backoff()
        shard = self.store.shard
        log.info("server rank %d: elements [%d, %d) of %d", ctx.rank, shard.lo, shard.hi, self.params.size)
        self.alive_recv.Start()
        scheduler = Silence(self.job.runtime.stall_timeout_s, "the scheduler (rank 0)", self.alive_recv, (0,))
        self.alive.told(0, ctx.now())
        next_housekeeping = 0.0
        while not self.ended:
            arrived = self.store.take_parts()  # the workers are not watched here: rank 0 watches them
            self.complete[arrived.complete] = True
            progressed = arrived.parts > 0
            if self.store.stream is not None:
                progressed |= self.store.stream_ready(backoff, _nothing)
            if self._take_orders():
                scheduler.heard()
                progressed = True
            progressed |= self._carry_out()
            if self.fetches is not None:
                progressed |= self.fetches.take()
            progressed |= self.store.complete_replies()
            now = ctx.now()
            if now >= next_housekeeping:
                scheduler.check()
                self.alive.tick(now, [0])
                self.sends = [(r, b) for r, b in self.sends if not r.Test()]
                self.trace.maybe_flush()
                next_housekeeping = now + HOUSEKEEPING_S
            if progressed:
                backoff.reset()
            else:
                backoff.idle()
        return self._finish(scheduler)

    def _take_orders(self) -> bool:
        """Receive every order message that has come, into the queue."""
        comm, status, took = self.ctx.comm, MPI.Status(), False
        while comm.Iprobe(0, ORDER_TAG, status):
            count = status.Get_count(MPI.DOUBLE)
            if count > self.order_buf.size:  # a decision that released many workers at once
                self.order_buf = np.empty(count)
            comm.Recv([self.order_buf[:count], MPI.DOUBLE], 0, ORDER_TAG)
            self.queue.extend(decode_orders(self.order_buf[:count]))
            took = True
        return took

    def _carry_out(self) -> bool:
        """Carry out the orders at the head of the queue, in order, as far as the pushes they need
        have come."""
        did = False
        while self.queue:
            order = self.queue[0]
            kind = type(order)
            if kind is ApplyOrder:
                if not self._take_push(order.worker):
                    break
                self.store.apply(order.worker, order.version)
            elif kind is RoundOrder:
                if not self.store.stream.all_in:  # the round's headers say which pushes are its members
                    break
                for w in order.members:
                    self._take_push(w)
                closed = self.store.close_round(order.members, order.version, self.ctx.backoff(), _nothing)
                self.round_sends = closed.sends
            elif kind is ReplyOrder:
                if self.outstanding[order.worker] and not self.complete[order.worker]:
                    break
                self._reply(order.worker, order.stop)
            elif kind is SnapshotOrder:
                self._send_snapshot(order.with_velocity)
            elif kind is EndOrder:
                self.ended = True
            self.queue.popleft()
            did = True
        return did

    def _take_push(self, w: int) -> bool:
        """Count `w`'s push, once it is complete here (False: not yet)."""
        if not self.complete[w]:
            return False
        if self.store.rejected(w, int(self.pushes[w])):
            raise ProtocolError(f"rank 0 ordered push {int(self.pushes[w])} of worker {w} applied, but its "
                                f"header says it holds NaN or Inf")
        self.outstanding[w] = self.complete[w] = False
        self.pushes[w] += 1
        if self.fault is not None and self.fault.due(int(self.pushes.sum())):
            self.fault.fire(f"push {int(self.pushes.sum())}")
        return True

    def _reply(self, w: int, stop: bool) -> None:
        """Answer `w`'s pull with this shard. A push still outstanding at its reply is one rank 0
        rejected (an accepted one was ordered applied before), which is taken here; or, at a stop
        reply under BSP, the worker's last push, which the round still to come applies."""
        if self.outstanding[w]:
            if self.store.rejected(w, int(self.pushes[w])):
                self.outstanding[w] = self.complete[w] = False
                self.pushes[w] += 1
            elif not stop:
                raise ProtocolError(f"rank 0 ordered a reply to worker {w} before its push {int(self.pushes[w])} "
                                    f"was applied")
        last = self.pushes[w] + 1 >= self.limits[w]  # its next push is its last
        if w in self.round_sends:  # the round's reply: its weights are on their way
            self.store.reply(w, self.params, stop, sent=self.round_sends.pop(w), last=last)
        else:
            self.store.reply(w, self.store.reply_buffer(), stop, last=last)
        if not stop:
            self.outstanding[w] = True

    def _send_snapshot(self, with_velocity: bool) -> None:
        lo, hi = self.store.lo, self.store.hi
        # as of rank 0's order: a BSP round that streams here already is not in it
        parts = [self.store.before_round(self.params)[lo:hi]]
        if with_velocity:
            parts.append(self.store.before_round(self.store.opt.velocity)[lo:hi])
        for part in parts:
            self.sends.append((self.ctx.comm.Isend([part, MPI.FLOAT], 0, SNAP_TAG), part))

    def _finish(self, scheduler: Silence) -> dict:
        if self.fault is not None and self.fault.due("end"):
            self.fault.fire("the end")
        wait_all([req for reply in self.store.replies for req in reply.requests], self.ctx.backoff())
        wait_all([r for r, _ in self.sends], self.ctx.backoff())
        if self.fetches is not None:  # rank 0 ends a run once every worker has stopped: no fetch is coming
            self.fetches.close()
        self.alive.wait(self.ctx.backoff())
        self.alive_recv.Cancel()
        self.alive_recv.Wait()
        stats = {"bytes": self.store.bytes.as_dict()}
        self.trace.set_attrs(bytes=stats["bytes"])
        self.trace.close()
        wait_all([self.ctx.comm.isend(stats, dest=0, tag=STATS_TAG)], self.ctx.backoff())
        return stats


def _nothing() -> None:
    """Nothing to do while a shard server waits for its own sends (rank 0 watches the workers)."""
