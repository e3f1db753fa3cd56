"""Ranks k..N-1 (k = ``runtime.servers``): a worker pulls weights, computes a gradient on its shard of
the data, pushes it, and repeats.

Messages go through persistent requests on preallocated buffers (the ``ParamSpace`` buffers on the
CPU; host staging buffers on a GPU unless ``runtime.cuda_aware_mpi``): the pull receives are posted
before the push header is sent, so the server's reply always finds them, and neither buffer is touched
while its request is active.

With ``runtime.wait_free_backprop`` (Poseidon's WFBP) each gradient chunk goes out the moment the
backward pass has written it, while the earlier layers still compute; a dense layer computes its
weight gradient in row blocks for this, the last one chunk or less (``nn.layers.row_blocks``). The
header, sent last to every server, completes the push (after any injected straggler delay). Each
chunk goes to the server that owns it, and each chunk of a reply comes from its owner; the reply's
header comes from rank 0 (``runtime.layout``).

With an OSDP plan (``osdp.plan``) the worker holds only its resident layers in its ``ParamSpace``; each
on-demand layer's weights are fetched into one preallocated buffer just before an item computes with
them, and its gradient is pushed from there (``runtime.fetch``, ``nn.ondemand``). The worker measures
its peak memory (``runtime.peak``) and reports it with its median iteration time. Nothing it holds
grows with the run's length: the iteration times behind the medians are the last
:data:`~ebsp_mpi.runtime.peak.KEEP` in a fixed array.

A wait that hears nothing for ``runtime.stall_timeout_s`` names the ranks whose messages it still
lacks (the pull's parts, a fetch's servers, the servers a push goes to), not rank 0 alone.
"""

from __future__ import annotations

import contextlib
import logging
import time
from functools import partial

import numpy as np
from mpi4py import MPI

from .. import build
from ..backend import resolve_backend
from ..config import JobConfig
from ..nn.factors import FactorSpace, rebuild_gradient
from ..nn.kernels import all_finite, warm_up
from ..nn.ondemand import OnDemandStep
from ..straggler import straggler_model
from .comm import Context, Silence, open_rank_trace, wait_all
from .faults import fault_for
from .fetch import Fetcher
from .hybrid import PS, SFB, ByteCounter, Stacked
from .layout import make_layout
from .peak import IterationTimes, PeakMemory
from .protocol import ALIVE_TAG, PULL, PULL_FIELDS, PULL_TAG, PUSH_FIELDS, PUSH_TAG, STATS_TAG, header, pack

log = logging.getLogger(__name__)


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
        self.peak = PeakMemory(self.backend) if description.plan is not None else None
        self.model = description.model(xp=self.backend.xp, on_demand=True)
        self.stream = description.batch_stream(self.index)
        self.stream.seek(start_iteration)  # batches and jitter follow from the iteration: nothing else to restore
        self.straggler = straggler_model(job.straggler, ctx.workers, job.seed)
        space = self.model.space
        direct = self.backend.name == "numpy" or job.runtime.cuda_aware_mpi
        # MPI reads and writes these; on a GPU without CUDA-aware MPI they are host mirrors
        self.params_buf = space.data if direct else np.empty(space.data.size, dtype=np.float32)
        self.grad_buf = space.grad if direct else np.empty(space.grad.size, dtype=np.float32)
        self.staged = not direct
        warm_up()  # the NaN/Inf check of every pushed chunk: compiled now, not in the first (timed) push
        self.layout = layout = make_layout(ctx, job, self.model, description.plan_doc)
        chunks, owner = layout.chunks, layout.owner
        self.chunk_elems = layout.chunk_bytes // self.grad_buf.itemsize
        comm = ctx.comm
        self._plan_hybrid(job)
        self.push_header = header(PUSH_FIELDS)
        self.pull_header = np.zeros(len(PULL_FIELDS) + (ctx.workers if self.sfb_bsp else 0))
        self.chunks = chunks
        # where each chunk lies in this worker's buffers (None: an on-demand unit's, never held there)
        self.local = [_local_slice(space, self.chunk_tensor[k], c) for k, c in enumerate(chunks)]
        held = [k for k, at in enumerate(self.local) if at is not None]
        self.pushes = [None if at is None else comm.Send_init([self.grad_buf[at], MPI.FLOAT], owner[k], chunks[k].tag)
                       for k, at in enumerate(self.local)]
        # the header last, to every server: it completes the push on each
        self.header_sends = [comm.Send_init([self.push_header, MPI.DOUBLE], s, PUSH_TAG) for s in range(ctx.servers)]
        self.started = np.zeros(len(chunks), dtype=bool)  # chunks of the current push already sent
        # an SFB layer's weight gradient goes as factors, an on-demand unit's from the fetch buffer
        self.never_sent = self.sfb_chunk | np.array([at is None for at in self.local], dtype=bool)
        self.started[self.never_sent] = True
        self.chunks_of = _chunks_of_tensors(space, chunks)  # tensor name -> indices of its chunks
        self.first_chunks = held
        chunk_pulls = {k: comm.Recv_init([self.params_buf[self.local[k]], MPI.FLOAT], owner[k], chunks[k].tag)
                       for k in held}
        self.pulls = [comm.Recv_init([self.pull_header, MPI.DOUBLE], 0, PULL_TAG)] + list(chunk_pulls.values())
        self.pull_source = [0] + [owner[k] for k in held]  # the rank each pull request hears from
        # after the first pull, BSP's replies leave out the SFB layers, which every worker steps itself
        self.pulled_chunks = [k for k in held if not (self.sfb_bsp and self.sfb_chunk[k])]
        self.later_pulls = [self.pulls[0]] + [chunk_pulls[k] for k in self.pulled_chunks]
        self.later_sources = [0] + [owner[k] for k in self.pulled_chunks]
        # everything a push sends: completed before the gradient and the factors are written again
        self.outgoing = [r for r in self.pushes if r is not None] + self.header_sends \
            + [r for rs in self.factor_sends.values() for r in rs]
        self.outgoing_ranks = [owner[k] for k, r in enumerate(self.pushes) if r is not None] \
            + list(range(ctx.servers)) + [d for ds in self.factor_dests.values() for d in ds]
        self.ondemand = self.fetcher = None
        if layout.schedule is not None:  # OSDP: the on-demand layers' buffer and messages
            self.ondemand = OnDemandStep(self.model, layout.schedule, job.data.batch_size)
            self.fetcher = Fetcher(ctx, layout, self.backend, self.staged, self._check_finite, self.bytes)
        # each iteration's start, and the fetcher's seconds waited so far at it: the medians of the summary
        self.times = IterationTimes()
        # the server's keep-alive while it holds our pull (its content is never read)
        self.alive_buf = np.zeros(1)
        self.keepalive = comm.Recv_init([self.alive_buf, MPI.DOUBLE], 0, ALIVE_TAG)
        self.trace = open_rank_trace(ctx, job, run_dir, role="worker", backend=self.backend.name,
                                     device=self.backend.describe(), append=start_iteration > 0)
        if start_iteration > 0:  # the iterations after the checkpoint are done again
            self.trace.truncate("iterations", "iteration", start_iteration - 1)
        self.fault = fault_for(ctx.rank, ctx.size)  # EBSP_INJECT_FAULT, to test the failure paths

    def _plan_hybrid(self, job: JobConfig) -> None:
        """comm.hybrid: which layers go as sufficient factors, and their messages (runtime.hybrid)."""
        ctx, space, layout = self.ctx, self.model.space, self.layout
        self.sfb, self.sfb_bsp = layout.sfb, layout.sfb_bsp
        names = {a.name for a in self.sfb}
        self.chunk_tensor = layout.chunk_tensor
        self.sfb_chunk = np.array([t in names for t in self.chunk_tensor], dtype=bool)
        self.bytes = ByteCounter()
        self.factor_sends: dict[str, list] = {}
        self.factor_dests: dict[str, list[int]] = {}  # the rank each of a layer's factor sends goes to
        self.factor_recvs: list = []
        if not self.sfb:
            return
        K, n, me = job.data.batch_size, ctx.workers, self.index
        self.factor_space = FactorSpace([(a.name, a.d_in, a.d_out) for a in self.sfb], K, xp=self.backend.xp)
        self.stacked = Stacked(self.sfb, n, K)
        others = [w for w in range(n) if w != me]
        for a in self.sfb:
            # BSP: to every other worker and the layer's server; the other models: to that server alone
            destinations = [layout.server_of_layer(a)] + ([ctx.worker_rank(w) for w in others] if self.sfb_bsp else [])
            V, U = self.stacked.V[a.name][self.stacked.rows(me)], self.stacked.U[a.name][self.stacked.rows(me)]
            self.factor_sends[a.name] = [ctx.factor_comm.Send_init([buf, MPI.FLOAT], dest, 2 * a.index + k)
                                         for dest in destinations for k, buf in ((0, V), (1, U))]
            self.factor_dests[a.name] = [dest for dest in destinations for _ in range(2)]
        if self.sfb_bsp:
            self.factor_recvs = [r for r, _, _ in self.stacked.receives(ctx.factor_comm, ctx.worker_rank, others)]
            self.factor_sources = [ctx.worker_rank(w) for w in others for _ in range(2 * len(self.sfb))]
            self.opt = build.optimizer(job, space.size)  # steps the SFB layers, on the host copy
            self.lr_at = build.schedule(job)
            self.sfb_grad = {a.name: np.empty((a.d_in, a.d_out), dtype=np.float32) for a in self.sfb}
            if self.start_iteration > 0:  # resumed: the SFB layers' velocity as the server had it
                from ..checkpoint import read_checkpoint

                velocity = read_checkpoint(self.run_dir).velocity
                for a in self.sfb:
                    self.opt.velocity[a.params] = velocity[a.params]

    def run(self) -> dict:
        ctx, backend, model = self.ctx, self.backend, self.model
        backoff = ctx.backoff()
        wait_total = compute_total = delay_total = 0.0
        iteration, row = self.start_iteration, None
        self.keepalive.Start()
        server = Silence(self.job.runtime.stall_timeout_s, "the server (rank 0)", self.keepalive)
        if self.fetcher is not None:
            self.fetcher.wait = partial(self._wait_naming, backoff=backoff, silence=server)
        if self.peak is not None:
            self.peak.training(self._held_arrays())
        MPI.Prequest.Startall(self.pulls)  # the initial weights, every tensor
        pulls, sources, version = self.pulls, self.pull_source, None
        t_push = ctx.now()
        while True:
            arrived: set[int] = set()
            server.what = partial(self._silent, sources, arrived)
            wait_all(pulls, backoff, server, arrived.update)
            self._count_pull(pulls is self.pulls)
            t_start = ctx.now()
            self.times.start(t_start, self.fetcher.waited_s if self.fetcher is not None else 0.0)
            wait_total += t_start - t_push
            used, version, stop = version, int(self.pull_header[PULL.version]), bool(self.pull_header[PULL.stop])
            if self.sfb_bsp and used is not None and not stop:
                self._step_sfb_layers(used)
            with self._untraced():  # the trace is no part of what a plan predicts
                if row is not None:  # the previous iteration ends when its pull completes (a full buffer flushes)
                    self.trace.append("iterations", **row, t_end=t_start, wait_s=t_start - t_push)
                if self.pull_header[PULL.flush]:  # the server wrote a checkpoint
                    self.trace.flush()
            if stop:
                break
            if self.staged:
                model.space.data[...] = backend.asarray(self.params_buf)

            if self.fault is not None and self.fault.due(iteration):
                self.fault.fire(f"iteration {iteration}")
            # the previous push was delivered before its reply came: complete it before the gradient
            # buffer is written again (and the factors' sends before the factors are)
            self._wait_naming(self.outgoing, self.outgoing_ranks, backoff, server)
            self.started[:] = self.never_sent
            self.finite = True  # every value of this push so far (its header says so)
            c0 = time.perf_counter()
            loss = self.compute_gradient()
            compute_s = time.perf_counter() - c0
            delay = self.straggler.delay(self.index, iteration, compute_s, t_start)
            if delay > 0:
                time.sleep(delay)
            compute_total += compute_s
            delay_total += delay
            t_compute_end = ctx.now()

            self._push_chunks(range(len(self.chunks)))  # those that wait-free backprop did not send
            for a in self.sfb:
                if not self.factors_sent[a.name]:
                    self._send_factors(a.name)
            pack(self.push_header, PUSH_FIELDS, iteration=iteration, version=version, loss=loss,
                 injected_delay_s=delay, epoch=self.stream.epochs_done, compute_s=compute_s, wait_s=t_start - t_push,
                 finite=float(self.finite))
            pulls, sources = self.later_pulls, self.later_sources
            MPI.Prequest.Startall(pulls)
            if self.sfb_bsp:  # the round's other factors come with the reply
                pulls, sources = pulls + self.factor_recvs, sources + self.factor_sources
                MPI.Prequest.Startall(self.factor_recvs)
            t_push = ctx.now()
            MPI.Prequest.Startall(self.header_sends)
            # the iteration's trace row, less its end (t_end, wait_s): known when the next pull completes
            row = dict(iteration=iteration, t_start=t_start, t_compute_end=t_compute_end, t_push=t_push,
                       version=version, loss=loss, injected_delay_s=delay, epoch=self.stream.epochs_done)
            iteration += 1
            with self._untraced():
                self.trace.maybe_flush()
        self._wait_naming(self.outgoing, self.outgoing_ranks, backoff, server)
        self.keepalive.Cancel()  # the server sends none after our stop reply
        self.keepalive.Wait()
        with self._untraced():
            self.trace.set_attrs(bytes=self.bytes.as_dict())
            self.trace.close()
        if self.fault is not None and self.fault.due("end"):
            self.fault.fire("the end")
        stats = {"iterations": iteration, "wait_seconds": wait_total, "compute_seconds": compute_total,
                 "injected_delay_seconds": delay_total, "backend": backend.describe(), "bytes": self.bytes.as_dict()}
        if self.peak is not None:  # OSDP: what the plan predicted, measured
            # medians over the iterations, start to start, the first (warm-up) left out: a stall of the
            # server (an evaluation slice of a large model takes some 0.1 s) moves neither
            peak = self.peak.stop()  # before the medians' temporaries
            iteration_s, transfer_wait_s = self.times.medians()
            fetcher = self.fetcher
            stats["osdp"] = {"peak_bytes": peak, "iteration_s": iteration_s,
                             "transfer_wait_s": transfer_wait_s,
                             "transfer_messages": fetcher.messages / max(iteration, 1) if fetcher else 0.0}
        wait_all([ctx.comm.isend(stats, dest=0, tag=STATS_TAG)], backoff)  # for the server's summary
        return stats

    def _untraced(self):
        """A block whose passing allocations the measured peak leaves out (``PeakMemory.excluded``)."""
        return self.peak.excluded() if self.peak is not None else contextlib.nullcontext()

    def _held_arrays(self) -> list:
        """The arrays this worker keeps for the whole run, for the peak memory (``runtime.peak``)."""
        space = self.model.space
        held = [space.data, space.grad]
        if self.ondemand is not None:
            held += [self.fetcher.buffer, self.ondemand.temp]
        return held

    def compute_gradient(self) -> float:
        """The next minibatch's loss; its gradient is left in ``model.space.grad``, on the device.

        The push-and-pull benchmark (``ebsp_mpi.bench.ps``) overrides this to time the messages alone.
        """
        idx = self.stream.next_indices()
        wfbp = self.job.runtime.wait_free_backprop
        self.factors_sent = dict.fromkeys(self.factor_sends, False)
        factors = {"factors": self.factor_space, "on_factors_ready": self._send_factors if wfbp else None} \
            if self.sfb else {}
        x, y = self.backend.asarray(self.ds.x_train[idx]), self.backend.asarray(self.ds.y_train[idx])
        ready = self._push_ready if wfbp else None
        if self.ondemand is not None:
            loss = self.ondemand.loss_and_grad(x, y, self.fetcher, on_grad_ready=ready, block_elems=self.chunk_elems)
        else:
            loss = self.model.loss_and_grad(x, y, on_grad_ready=ready, block_elems=self.chunk_elems, **factors)
        self.backend.synchronize()
        return loss

    def _send_factors(self, name: str) -> None:
        """Send layer `name`'s factors, final now: into this worker's rows of the stacked buffers (on
        the host), then to every destination."""
        me = self.stacked.rows(self.index)
        V, U = self.stacked.V[name][me], self.stacked.U[name][me]
        V[...] = self.backend.to_host(self.factor_space.V(name))
        U[...] = self.backend.to_host(self.factor_space.U(name))
        self._check_finite(V.reshape(-1))
        self._check_finite(U.reshape(-1))
        MPI.Prequest.Startall(self.factor_sends[name])
        self.bytes.sent(name, SFB, (V.nbytes + U.nbytes) * (len(self.factor_sends[name]) // 2))
        self.factors_sent[name] = True

    def _step_sfb_layers(self, version_used: int) -> None:
        """BSP with SFB: the round's step of each SFB layer, as the server takes it: the mean of the
        members' rebuilt gradients (the server names the members in its reply), one optimizer step at
        the learning rate of the version this worker's push was computed from."""
        mask = self.pull_header[len(PULL_FIELDS):]
        members = [w for w in range(self.ctx.workers) if mask[w]]
        if not members:  # every push of the round was rejected: the weights stay as they are
            return
        lr = self.lr_at(version_used)
        for a in self.sfb:
            V, U = self.stacked.of(a, members)
            rebuild_gradient(V, U, self.sfb_grad[a.name], scale=1.0 / len(members))
            grad = self.sfb_grad[a.name].reshape(-1)
            if self.staged or self.backend.name == "numpy":  # params_buf is host memory
                self.opt.step(self.params_buf[a.params], grad, lr, offset=a.offset)
            else:  # CUDA-aware MPI: the weights are on the device, the optimizer and its velocity on the host
                weights = self.backend.to_host(self.params_buf[a.params])
                self.opt.step(weights, grad, lr, offset=a.offset)
                self.params_buf[a.params] = self.backend.asarray(weights)

    def _wait_naming(self, requests: list, ranks: list[int], backoff, silence: Silence) -> None:
        """Complete `requests`, request k to or from rank ``ranks[k]``; a silence names the ranks of the
        requests still incomplete (a stopped shard server, not the server of the last pull)."""
        arrived: set[int] = set()
        silence.what = partial(self._silent, ranks, arrived)
        wait_all(requests, backoff, silence, arrived.update)

    def _silent(self, sources: list[int], arrived: set[int]) -> str:
        """Who has sent nothing of the reply this worker waits for (the stall watchdog's message)."""
        missing = sorted({sources[k] for k in range(len(sources)) if k not in arrived})
        names = [f"the {self.ctx.role_of(r)} (rank {r})" for r in missing] or ["the server (rank 0)"]
        return ", ".join(names)

    def _count_pull(self, whole: bool) -> None:
        """Count the bytes of the pull just received (and of the round's factors under BSP with SFB)."""
        for k in self.first_chunks if whole else self.pulled_chunks:
            self.bytes.received(self.chunk_tensor[k], PS, self.chunks[k].size * self.params_buf.itemsize)
        if self.sfb_bsp and not whole:
            rows = (self.ctx.workers - 1) * self.stacked.batch  # the other workers' factors
            for a in self.sfb:
                self.bytes.received(a.name, SFB, rows * (a.d_in + a.d_out) * self.params_buf.itemsize)

    def _push_ready(self, name: str, stop: int) -> None:
        """Wait-free backprop: send the chunks of tensor `name` that lie within its first `stop`
        elements, whose gradient the backward pass has just made final."""
        end = self.model.space.view(name).offset + stop
        self._push_chunks([k for k in self.chunks_of[name] if self.chunks[k].stop <= end])

    def _push_chunks(self, indices) -> None:
        """Start the sends of the gradient chunks `indices` that have not gone out yet in this push."""
        if not self.staged and self.backend.name != "numpy":
            self.backend.synchronize()  # CUDA-aware MPI reads the device buffer: the kernels must be done
        for k in indices:
            if self.started[k]:
                continue
            c, at = self.chunks[k], self.local[k]
            if self.staged:  # the device has finished this slice (synchronized by to_host)
                self.grad_buf[at] = self.backend.to_host(self.model.space.grad[at])
            # checked now, while the chunk is in cache
            self._check_finite(self.grad_buf[at])
            self.pushes[k].Start()
            self.started[k] = True
            self.bytes.sent(self.chunk_tensor[k], PS, c.size * self.grad_buf.itemsize)

    def _check_finite(self, values) -> None:
        """Whether every value of this push so far is finite: the header tells every server (all or
        nothing)."""
        self.finite = self.finite and all_finite(values)


def _local_slice(space, tensor: str, c) -> slice | None:
    """Where chunk `c` of `tensor` lies in the worker's ``ParamSpace`` buffers; None when the tensor
    is not held there (an OSDP on-demand layer's)."""
    if not space.holds(tensor):
        return None
    start = space.local_offset(tensor) + c.start - space.view(tensor).offset
    return slice(start, start + c.size)


def _chunks_of_tensors(space, chunks) -> dict[str, list[int]]:
    """Which chunks (by index) hold each tensor of `space`; chunks never straddle two tensors."""
    return {t.name: [k for k, c in enumerate(chunks) if t.offset <= c.start and c.stop <= t.offset + t.size]
            for t in space.tensors}
