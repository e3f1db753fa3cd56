"""Ranks 1..N-1: a worker pulls weights, computes a gradient on its shard, pushes it, and repeats.

Messages go through persistent requests on preallocated buffers (the ``ParamSpace`` buffers on the
CPU; host staging buffers on a GPU unless ``runtime.cuda_aware_mpi``): the pull receives are posted
before the push header is sent, so the server's reply always finds them, and neither buffer is touched
while its request is active.

With ``runtime.wait_free_backprop`` (Poseidon's WFBP) each gradient chunk goes out the moment the
backward pass has written it, while the earlier layers still compute; a dense layer computes its
weight gradient in row blocks for this, the last one chunk or less (``nn.layers.row_blocks``). The
header, sent last, completes the push (after any injected straggler delay).
"""

from __future__ import annotations

import logging
import time

import numpy as np
from mpi4py import MPI

from .. import build
from ..backend import resolve_backend
from ..config import JobConfig
from ..straggler import straggler_model
from .comm import Context, Silence, open_rank_trace, wait_all
from .faults import fault_for
from .protocol import (ALIVE_TAG, PULL, PULL_FIELDS, PULL_TAG, PUSH_FIELDS, PUSH_TAG, STATS_TAG, header, pack,
                       plan_chunks)

log = logging.getLogger(__name__)


class Worker:
    """Worker ``ctx.rank - 1`` of a run; :meth:`run` returns its statistics for the summary."""

    def __init__(self, ctx: Context, job: JobConfig, run_dir, start_iteration: int = 0):
        self.ctx, self.job, self.run_dir = ctx, job, run_dir
        self.index = ctx.rank - 1
        self.start_iteration = start_iteration  # > 0: a resumed run, from the checkpoint's count
        self.backend = resolve_backend(job.backend, local_rank=ctx.local_rank)
        self.ds = build.dataset(job)
        self.model = build.model(job, self.ds, xp=self.backend.xp)
        self.stream = build.batch_stream(job, self.ds, self.index, ctx.workers)
        self.stream.seek(start_iteration)  # batches and jitter follow from the iteration: nothing else to restore
        self.straggler = straggler_model(job.straggler, ctx.workers, job.seed)
        space = self.model.space
        direct = self.backend.name == "numpy" or job.runtime.cuda_aware_mpi
        # MPI reads and writes these; on a GPU without CUDA-aware MPI they are host mirrors
        self.params_buf = space.data if direct else np.empty(space.size, dtype=np.float32)
        self.grad_buf = space.grad if direct else np.empty(space.size, dtype=np.float32)
        self.staged = not direct
        chunk_bytes = ctx.chunk_bytes(job.runtime.chunk_bytes)
        chunks = plan_chunks([(t.offset, t.size) for t in space.tensors], self.grad_buf.itemsize,
                             chunk_bytes, ctx.comm.Get_attr(MPI.TAG_UB))
        self.chunk_elems = chunk_bytes // self.grad_buf.itemsize
        comm = ctx.comm
        self.push_header = header(PUSH_FIELDS)
        self.pull_header = header(PULL_FIELDS)
        self.chunks = chunks
        self.pushes = [comm.Send_init([self.grad_buf[c.start:c.stop], MPI.FLOAT], 0, c.tag) for c in chunks]
        self.pushes.append(comm.Send_init([self.push_header, MPI.DOUBLE], 0, PUSH_TAG))
        self.started = np.zeros(len(chunks), dtype=bool)  # chunks of the current push already sent
        self.chunks_of = _chunks_of_tensors(space, chunks)  # tensor name -> indices of its chunks
        self.pulls = [comm.Recv_init([self.pull_header, MPI.DOUBLE], 0, PULL_TAG)]
        self.pulls += [comm.Recv_init([self.params_buf[c.start:c.stop], MPI.FLOAT], 0, c.tag) for c in chunks]
        # the server's keep-alive while it holds our pull (its content is never read)
        self.alive_buf = np.zeros(1)
        self.keepalive = comm.Recv_init([self.alive_buf, MPI.DOUBLE], 0, ALIVE_TAG)
        self.trace = open_rank_trace(ctx, job, run_dir, role="worker", backend=self.backend.name,
                                     device=self.backend.describe(), append=start_iteration > 0)
        if start_iteration > 0:  # the iterations after the checkpoint are done again
            self.trace.truncate("iterations", "iteration", start_iteration - 1)
        self.fault = fault_for(ctx.rank, ctx.size)  # EBSP_INJECT_FAULT, to test the failure paths

    def run(self) -> dict:
        ctx, backend, model = self.ctx, self.backend, self.model
        backoff = ctx.backoff()
        wait_total = compute_total = delay_total = 0.0
        iteration, row = self.start_iteration, None
        self.keepalive.Start()
        server = Silence(self.job.runtime.stall_timeout_s, "the server (rank 0)", self.keepalive)
        MPI.Prequest.Startall(self.pulls)  # the initial weights
        t_push = ctx.now()
        while True:
            wait_all(self.pulls, backoff, server)
            t_start = ctx.now()
            wait_total += t_start - t_push
            version, stop = int(self.pull_header[PULL.version]), bool(self.pull_header[PULL.stop])
            if row is not None:  # the previous iteration ends when its pull completes
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
            # buffer is written again
            wait_all(self.pushes, backoff, server)
            self.started[:] = False
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
            pack(self.push_header, PUSH_FIELDS, iteration=iteration, version=version, loss=loss,
                 injected_delay_s=delay, epoch=self.stream.epochs_done, compute_s=compute_s, wait_s=t_start - t_push)
            MPI.Prequest.Startall(self.pulls)
            t_push = ctx.now()
            self.pushes[-1].Start()
            # the iteration's trace row, less its end (t_end, wait_s): known when the next pull completes
            row = dict(iteration=iteration, t_start=t_start, t_compute_end=t_compute_end, t_push=t_push,
                       version=version, loss=loss, injected_delay_s=delay, epoch=self.stream.epochs_done)
            iteration += 1
            self.trace.maybe_flush()
        wait_all(self.pushes, backoff, server)
        self.keepalive.Cancel()  # the server sends none after our stop reply
        self.keepalive.Wait()
        self.trace.close()
        if self.fault is not None and self.fault.due("end"):
            self.fault.fire("the end")
        stats = {"iterations": iteration, "wait_seconds": wait_total, "compute_seconds": compute_total,
                 "injected_delay_seconds": delay_total, "backend": backend.describe()}
        wait_all([ctx.comm.isend(stats, dest=0, tag=STATS_TAG)], backoff)  # for the server's summary
        return stats

    def compute_gradient(self) -> float:
        """The next minibatch's loss; its gradient is left in ``model.space.grad``, on the device.

        The push-and-pull benchmark (``ebsp_mpi.bench.ps``) overrides this to time the messages alone.
        """
        idx = self.stream.next_indices()
        wfbp = self.job.runtime.wait_free_backprop
        loss = self.model.loss_and_grad(self.backend.asarray(self.ds.x_train[idx]),
                                        self.backend.asarray(self.ds.y_train[idx]),
                                        on_grad_ready=self._push_ready if wfbp else None,
                                        block_elems=self.chunk_elems)
        self.backend.synchronize()
        return loss

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
            if self.staged:  # the device has finished this slice (synchronized by to_host)
                c = self.chunks[k]
                self.grad_buf[c.start:c.stop] = self.backend.to_host(self.model.space.grad[c.start:c.stop])
            self.pushes[k].Start()
            self.started[k] = True


def _chunks_of_tensors(space, chunks) -> dict[str, list[int]]:
    """Which chunks (by index) hold each tensor of `space`; chunks never straddle two tensors."""
    return {t.name: [k for k, c in enumerate(chunks) if t.offset <= c.start and c.stop <= t.offset + t.size]
            for t in space.tensors}
