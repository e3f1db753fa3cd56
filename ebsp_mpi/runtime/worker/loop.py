"""Ranks k..N-1 (k = ``runtime.servers``): a worker pulls weights, computes a gradient on its shard of
the data, pushes it, and repeats.

What travels, and how, is the wire's (``runtime.worker.wiring``: strategies chosen once, from the run's
layout):

- the dense wire (``runtime.worker.wire_dense``, PS): gradient chunks to the servers that own them, the
  header to every server, the weights back;
- the sufficient factors of HybComm's SFB layers (``runtime.worker.wire_factors``), when ``comm.hybrid``
  chooses any;
- OSDP's on-demand layers (``runtime.worker.osdp``), fetched just before they compute, when the plan
  (``osdp.plan``) has any;
- with ``runtime.wait_free_backprop`` (Poseidon's WFBP) each gradient chunk, and each layer's factors,
  go out the moment the backward pass has made them final, while the earlier layers still compute;
  without it, after the backward pass.

The header, sent last to every server, completes the push (after any injected straggler delay). With
an OSDP plan the worker measures its peak memory (``runtime.worker.peak``) and reports it with its median
iteration time. Nothing it holds grows with the run's length: the iteration times behind the medians
are the last :data:`~ebsp_mpi.runtime.worker.peak.KEEP` in a fixed array.

A wait that hears nothing for ``runtime.stall_timeout_s`` names the ranks whose messages it still
lacks (the pull's parts, a fetch's servers, the servers a push goes to), not rank 0 alone.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from functools import partial

import numpy as np
from mpi4py import MPI

from ...backend import resolve_backend
from ...straggler import straggler_model
from ..rank.faults import fault_for
from ..rank.trace_file import open_rank_trace
from ..transport.context import Context
from ..transport.deadlines import Silence
from ..transport.keepalive import PARTING
from ..transport.polling import wait_all
from ..transport.protocol import ALIVE_TAG, PULL, STATS_TAG
from .osdp import measured
from .peak import IterationTimes, PeakMemory
from .wire_dense import Requests
from .wiring import joined, make_wiring

log = logging.getLogger(__name__)


@dataclass
class _Totals:
    """A worker's seconds over the run, for the summary."""

    wait: float = 0.0
    compute: float = 0.0
    delay: float = 0.0


class Worker:
    """Worker ``ctx.worker_of(ctx.rank)`` of a run (a ``RunDescription``); :meth:`run` returns its
    statistics for the summary."""

    def __init__(self, ctx: Context, description, run_dir, start_iteration: int = 0):
        job = description.job
        self.ctx, self.job, self.run_dir, self.description = ctx, job, run_dir, description
        self.index = ctx.worker_of(ctx.rank)
        self.start_iteration = start_iteration  # > 0: a resumed run, from the checkpoint's count
        self.backend = resolve_backend(job.backend, local_rank=ctx.local_rank)
        self.ds = description.dataset
        # from here on, what the worker allocates counts towards the peak a plan predicts
        plan = description.plan
        self.peak = None if plan is None else PeakMemory(self.backend, plan.predicted["peak_bytes"],
                                                         plan.doc.get("memory_limit_bytes"))
        with self._bounded():
            self._set_up(ctx, job, description, start_iteration)

    def _set_up(self, ctx: Context, job, description, start_iteration: int) -> None:
        """The model, its data, wire and trace (the allocations a plan's bound holds to, with the run's)."""
        self.model = description.model(xp=self.backend.xp, on_demand=True)
        window = ctx.push_window
        if window is not None and ctx.rank in window.gradients:  # the servers of this node read it in place
            self.model.use_grad_buffer(window.gradients[ctx.rank])
        self.stream = description.batch_stream(self.index)
        self.stream.seek(start_iteration)  # batches and jitter follow from the iteration: nothing else to restore
        self.straggler = straggler_model(job.straggler, ctx.workers, job.seed)
        self.wire = make_wiring(ctx, description, self.model, self.backend, self.index, self.run_dir,
                                start_iteration)
        self.times = IterationTimes()  # each iteration's start, and the fetches' wait by then: the medians
        # the server's keep-alive while it holds our pull or we wait for the end (comm.ALIVE, or PARTING last)
        self.alive_buf = np.zeros(1)
        self.keepalive = ctx.comm.Recv_init([self.alive_buf, MPI.DOUBLE], 0, ALIVE_TAG)
        self.trace = open_rank_trace(ctx, job, self.run_dir, role="worker", backend=self.backend.name,
                                     device=self.backend.describe(), append=start_iteration > 0)
        if start_iteration > 0:  # the iterations after the checkpoint are done again
            self.trace.truncate("iterations", "iteration", start_iteration - 1)
            # and any it counted that never reached this file are said to be lost (the server commits a
            # checkpoint only once our flush has come: a checkpoint of an older version may not have)
            self.trace.mark_lost("iterations", "iteration", start_iteration)
        self.fault = fault_for(ctx.rank, ctx.size)  # EBSP_INJECT_FAULT, to test the failure paths
        self.flush_requests, self.flushed = 0, 0.0  # replies that asked us to flush; 1.0: tell the next push

    def run(self) -> dict:
        with self._bounded():
            return self._run()

    def _run(self) -> dict:
        backoff = self.ctx.backoff()
        self.keepalive.Start()
        server = Silence(self.job.runtime.stall_timeout_s, "the server (rank 0)", self.keepalive, (0,))
        if self.wire.ondemand is not None:
            self.wire.ondemand.fetcher.wait = partial(self._wait_naming, backoff=backoff, silence=server)
        if self.peak is not None:
            self.peak.training(self._held_arrays())
        self.totals, self.iteration, self.version, self.row = _Totals(), self.start_iteration, None, None
        pull = self.wire.dense.start_first_pull()  # the initial weights, every tensor
        self.t_push = self.ctx.now()
        while True:
            self._wait_naming(pull.requests, pull.ranks, backoff, server)
            if self.wire.dense.pull_header[PULL.redo]:  # a BSP round was redone: its corrected weights follow
                again = self.wire.dense.post_redo()
                self._wait_naming(again.requests, again.ranks, backoff, server)
            t_start = self.ctx.now()
            if self._take_reply(pull.first, t_start):
                break
            if self.fault is not None and self.fault.due(self.iteration):
                self.fault.fire(f"iteration {self.iteration}")
            # the previous push was delivered before its reply came: complete it before the gradient
            # buffer is written again (and the factors' sends before the factors are)
            self._wait_naming(self.wire.outgoing.requests, self.wire.outgoing.ranks, backoff, server)
            loss, compute_s, delay = self._compute(t_start)
            pull = self._push(t_start, loss, compute_s, delay)
        self._wait_naming(self.wire.outgoing.requests, self.wire.outgoing.ranks, backoff, server)
        stats = self._finish(backoff)
        self._await_parting(backoff)
        return stats

    def _await_parting(self, backoff) -> None:
        """Once stopped and reported: the server's keep-alives, while slower workers finish and it takes
        in every one's statistics, until its last (``keepalive.PARTING``); a server silent for the stall
        timeout meanwhile is named. The receive stays posted until then, so none is left unmatched."""
        server = Silence(self.job.runtime.stall_timeout_s, "the server (rank 0)", ranks=(0,))
        while True:
            if not self.keepalive.Test():
                wait_all([self.keepalive], backoff, server)
            if self.alive_buf[0] == PARTING[0]:
                return
            self.keepalive.Start()

    def _take_reply(self, first: bool, t_start: float) -> bool:
        """Take in the reply just received: count it, end the previous iteration's trace row, and with
        the weights on the device; True when it is the stop reply."""
        for wire in self.wire.wires:
            wire.count_pull(first)
        self.times.start(t_start, self.wire.ondemand.fetcher.waited_s if self.wire.ondemand is not None else 0.0)
        self.totals.wait += t_start - self.t_push
        header = self.wire.dense.pull_header
        used, self.version, stop = self.version, int(header[PULL.version]), bool(header[PULL.stop])
        if self.wire.ondemand is not None:  # its fetches name the version: a server answers once it has closed it
            self.wire.ondemand.fetcher.version = self.version
        if self.wire.factors is not None and used is not None and not stop:
            self.wire.factors.step(header, used)
        with self._untraced():  # the trace is no part of what a plan predicts
            if self.row is not None:  # the previous iteration ends when its pull completes (a full buffer flushes)
                self.trace.append("iterations", **self.row, t_end=t_start, wait_s=t_start - self.t_push)
            if header[PULL.flush]:  # the server wrote a checkpoint: it commits it once our trace holds its rows
                self.flush_requests += 1
                if self.fault is not None and self.fault.due("flush") and self.flush_requests == 2:
                    self.fault.fire("the second request to flush the trace")
                self.trace.flush()
                self.flushed = 1.0
        if self.wire.buffers.staged and not stop:
            self.backend.copy_to_device(self.model.space.data, self.wire.buffers.params)
        return stop

    def _compute(self, t_start: float) -> tuple[float, float, float]:
        """The next gradient, and the straggler model's delay after it: ``(loss, compute seconds,
        injected delay seconds)``."""
        for wire in self.wire.wires:
            wire.begin_push()
        self.wire.finite.reset()
        c0 = time.perf_counter()
        loss = self.compute_gradient()
        compute_s = time.perf_counter() - c0
        delay = self.straggler.delay(self.index, self.iteration, compute_s, t_start)
        if delay > 0:
            time.sleep(delay)
        self.totals.compute += compute_s
        self.totals.delay += delay
        return loss, compute_s, delay

    def _push(self, t_start: float, loss: float, compute_s: float, delay: float) -> Requests:
        """Send what the backward pass did not, post the next pull's receives, then the header that
        completes the push; returns the pull's requests."""
        t_compute_end = self.ctx.now()
        for wire in self.wire.wires:
            wire.push_rest()
        pull = joined([wire.post_pull() for wire in self.wire.wires])
        wait_s, self.t_push = t_start - self.t_push, self.ctx.now()
        epoch = self.stream.epochs_done
        self.wire.dense.send_header(iteration=self.iteration, version=self.version, loss=loss, injected_delay_s=delay,
                               epoch=epoch, compute_s=compute_s, wait_s=wait_s, finite=float(self.wire.finite.ok),
                               flushed=self.flushed)
        self.flushed = 0.0
        # the iteration's trace row, less its end (t_end, wait_s): known when the next pull completes
        self.row = dict(iteration=self.iteration, t_start=t_start, t_compute_end=t_compute_end, t_push=self.t_push,
                        version=self.version, loss=loss, injected_delay_s=delay, epoch=epoch)
        self.iteration += 1
        with self._untraced():
            self.trace.maybe_flush()
        return pull

    def _finish(self, backoff) -> dict:
        """Close the trace and send the statistics to the server; returns them."""
        with self._untraced():
            self.trace.set_attrs(bytes=self.wire.bytes.as_dict())
            self.trace.close()
        if self.fault is not None and self.fault.due("end"):
            self.fault.fire("the end")
        totals = self.totals
        stats = {"iterations": self.iteration, "wait_seconds": totals.wait, "compute_seconds": totals.compute,
                 "injected_delay_seconds": totals.delay, "backend": self.backend.describe(),
                 "bytes": self.wire.bytes.as_dict()}
        if self.peak is not None:  # OSDP: what the plan predicted, measured
            peak_bytes = self.peak.stop()  # before the medians, whose first call imports NumPy code
            stats["osdp"] = measured(peak_bytes, self.peak.live_peak, self.times, self.wire.ondemand, self.iteration)
        wait_all([self.ctx.comm.isend(stats, dest=0, tag=STATS_TAG)], backoff)  # for the server's summary
        return stats

    def _bounded(self):
        """A block where an OSDP plan's bound on the device memory pool, reached, is one line
        (``PeakMemory.bounded``)."""
        return self.peak.bounded() if self.peak is not None else _NOTHING

    def _untraced(self):
        """A block whose passing allocations the measured peak leaves out (``PeakMemory.excluded``)."""
        return self.peak.excluded() if self.peak is not None else _NOTHING

    def _held_arrays(self) -> list:
        """The arrays this worker keeps for the whole run, for the peak memory (``runtime.worker.peak``)."""
        space = self.model.space
        return [space.data, space.grad] + (self.wire.ondemand.held_arrays() if self.wire.ondemand is not None else [])

    def compute_gradient(self) -> float:
        """The next minibatch's loss; its gradient is left in ``model.space.grad``, on the device (and
        with wait-free backprop partly sent already).

        The push-and-pull benchmark (``ebsp_mpi.bench.ps``) overrides this to time the messages alone.
        """
        idx = self.stream.next_indices()
        x, y = self.backend.asarray(self.ds.x_train[idx]), self.backend.asarray(self.ds.y_train[idx])
        loss = self.wire.gradient.loss_and_grad(x, y, **self.wire.grad_hooks)
        self.backend.synchronize()
        return loss

    def _wait_naming(self, requests: list, ranks: list[int], backoff, silence: Silence) -> None:
        """Complete `requests`, request k to or from rank ``ranks[k]``; a silence names the ranks of the
        requests still incomplete (a stopped shard server, not the server of the last pull)."""
        arrived: set[int] = set()
        silence.what = partial(self._silent, ranks, arrived)
        silence.ranks = partial(_missing, ranks, arrived)
        wait_all(requests, backoff, silence, arrived.update)

    def _silent(self, sources: list[int], arrived: set[int]) -> str:
        """Who has sent nothing of the reply this worker waits for (the stall watchdog's message)."""
        names = [f"the {self.ctx.role_of(r)} (rank {r})" for r in _missing(sources, arrived)]
        return ", ".join(names or ["the server (rank 0)"])


def _missing(sources: list[int], arrived: set[int]) -> list[int]:
    """The ranks whose requests (request k's is ``sources[k]``) are not in `arrived`; the server (rank
    0) where every request has come (a wait for its keep-alive alone)."""
    return sorted({sources[k] for k in range(len(sources)) if k not in arrived}) or [0]


#: the context of a block in a run without a measured peak (a nullcontext can be entered again)
_NOTHING = contextlib.nullcontext()
