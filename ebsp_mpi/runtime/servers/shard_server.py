"""Ranks 1..k-1 with ``runtime.servers = k``: a server of one shard, carrying out rank 0's orders.

It keeps a receive posted for every part of every worker's next push that comes to it (its chunks,
the factors of its SFB layers, the header), takes in rank 0's orders (``runtime.servers.orders``) and carries
them out through the order executor every server rank shares (``runtime.servers.executor``), rank 0 on its
own shard included. It answers the workers' OSDP fetches of its part of their on-demand layers at
once (``runtime.fetch``).

It watches rank 0 (orders or keep-alives at least every quarter of the stall timeout) and tells rank 0
that it lives while no order comes.
"""

from __future__ import annotations

import logging

import numpy as np
from mpi4py import MPI

from ...sync.registry import round_based as model_round_based
from .executor import OrderExecutor
from .orders import ORDER_WIDTH, decode_orders
from ..rank.faults import fault_for
from ..rank.trace_file import open_rank_trace
from .shard import ShardStore
from ..transport.context import Context
from ..transport.deadlines import Silence
from ..transport.fetch import FetchServer
from ..transport.keepalive import HOUSEKEEPING_S, KeepAlive
from ..transport.polling import wait_all
from ..transport.protocol import ALIVE_TAG, ORDER_TAG, STATS_TAG

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
        # OSDP: its part of the on-demand layers, fetched by the workers
        self.fetches = (FetchServer(ctx, self.layout, self.params, self.store.bytes, self.store.stream)
                        if self.layout.schedule else None)
        if resume is not None:  # this shard of the checkpoint's parameters and optimizer state
            from ...checkpoint import read_checkpoint

            ckpt = read_checkpoint(run_dir)
            lo, hi = self.store.lo, self.store.hi
            self.params[lo:hi] = ckpt.params[lo:hi]
            self.store.opt.velocity[lo:hi] = ckpt.velocity[lo:hi]
        n = ctx.workers
        self.order_buf = np.empty(ORDER_WIDTH * (2 * n + 8))
        self.alive_buf = np.zeros(1)
        self.alive_recv = ctx.comm.Recv_init([self.alive_buf, MPI.DOUBLE], 0, ALIVE_TAG)
        taken = 0 if resume is None else int(sum(resume.iterations))
        # EBSP_INJECT_FAULT, to test the failure paths
        self.executor = OrderExecutor(self.store, fault=fault_for(ctx.rank, ctx.size), taken=taken)
        self.alive = KeepAlive(ctx.comm, job.runtime.stall_timeout_s)  # to rank 0, while no order comes
        self.trace = open_rank_trace(ctx, job, run_dir, role="server", backend="numpy", device="cpu",
                                     append=resume is not None)
        self.trace.set_attrs(**self.layout.as_attrs())

    def run(self) -> dict:
        ctx, backoff = self.ctx, self.ctx.backoff()
        shard = self.store.shard
        log.info("server rank %d: elements [%d, %d) of %d", ctx.rank, shard.lo, shard.hi, self.params.size)
        self.alive_recv.Start()
        scheduler = Silence(self.job.runtime.stall_timeout_s, "the scheduler (rank 0)", self.alive_recv, (0,))
        self.alive.told(0, ctx.now())
        next_housekeeping = 0.0
        executor = self.executor
        while not executor.ended:
            arrived = self.store.take_parts()  # the workers are not watched here: rank 0 watches them
            if arrived.complete:
                executor.arrived(arrived.complete)
            progressed = arrived.parts > 0
            progressed |= executor.stream(backoff)
            if self._take_orders():
                scheduler.heard()
                progressed = True
            progressed |= executor.carry_out()
            if self.fetches is not None:
                progressed |= self.fetches.take()
            progressed |= self.store.complete_replies()
            now = ctx.now()
            if now >= next_housekeeping:
                scheduler.check()
                self.alive.tick(now, [0])
                executor.snapshots = [(r, b) for r, b in executor.snapshots if not r.Test()]
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
            self.executor.take(decode_orders(self.order_buf[:count]))
            took = True
        return took

    def _finish(self, scheduler: Silence) -> dict:
        fault = self.executor.fault
        if fault is not None and fault.due("end"):
            fault.fire("the end")
        wait_all([req for reply in self.store.replies for req in reply.requests], self.ctx.backoff())
        wait_all([r for r, _ in self.executor.snapshots], self.ctx.backoff())
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

