"""A worker's sufficient-factor wire (HybComm's SFB, ``comm.hybrid``): the dense layers whose weight
gradient travels as its factors (the layer's input and the error at its output, K·(M+N) floats for
batch K instead of M·N).

Under BSP a worker sends its factors to every other worker and to the layer's server, receives the
others' with the reply, and steps those layers itself exactly as the server would (the mean of the
members' rebuilt gradients, named by the reply); so nobody pulls them after the first pull. Under the
other models the factors go to the layer's server alone, which rebuilds and applies that worker's
gradient. See docs/design.md, "Hybrid communication".
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ... import build
from ...nn.factors import FactorSpace, rebuild_gradient
from ..transport.hybrid import SFB, Stacked
from ..transport.protocol import PULL_FIELDS
from .wire_dense import FiniteCheck, Requests, WireBuffers


class FactorWire:
    """The SFB layers of one worker: their factors' buffers and messages, and under BSP their step.

    Parameters
    ----------
    ctx : Context
    run : RunDescription
    layout : Layout
        With SFB layers (``layout.sfb``).
    index : int
        This worker.
    buffers : WireBuffers
    bytes : ByteCounter
    check : FiniteCheck
    velocity : numpy.ndarray or None
        A resumed run's optimizer velocity (the checkpoint's), whose SFB layers' part this worker
        steps on with (BSP).
    """

    def __init__(self, ctx, run, layout, index: int, buffers: WireBuffers, bytes, check: FiniteCheck,
                 velocity=None):
        job, n = run.job, ctx.workers
        self.ctx, self.layers, self.bsp, self.index = ctx, layout.sfb, layout.sfb_bsp, index
        self.buf, self.bytes, self.check = buffers, bytes, check
        self.space = FactorSpace([(a.name, a.d_in, a.d_out) for a in self.layers], job.data.batch_size,
                                 xp=buffers.backend.xp)
        self.stacked = Stacked(self.layers, n, job.data.batch_size)
        others = [w for w in range(n) if w != index]
        self.sends: dict[str, list] = {}
        dests: list[int] = []  # the rank each send goes to
        for a in self.layers:
            # BSP: to every other worker and the layer's server; the other models: to that server alone
            destinations = [layout.server_of_layer(a)] + ([ctx.worker_rank(w) for w in others] if self.bsp else [])
            rows = self.stacked.rows(index)
            V, U = self.stacked.V[a.name][rows], self.stacked.U[a.name][rows]
            self.sends[a.name] = [ctx.factor_comm.Send_init([buf, MPI.FLOAT], dest, 2 * a.index + k)
                                  for dest in destinations for k, buf in ((0, V), (1, U))]
            dests += [dest for dest in destinations for _ in range(2)]
        self.outgoing = Requests([r for rs in self.sends.values() for r in rs], dests)
        self.sent = dict.fromkeys(self.sends, False)
        self.incoming = Requests([], [])
        if self.bsp:  # the round's other factors come with the reply; the step is this worker's
            self.incoming = Requests([r for r, _, _ in self.stacked.receives(ctx.factor_comm, ctx.worker_rank, others)],
                                     [ctx.worker_rank(w) for w in others for _ in range(2 * len(self.layers))])
            self.opt = build.optimizer(job, buffers.space.size)  # steps the SFB layers, on the host copy
            self.lr_at = build.schedule(job)
            self.grad = {a.name: np.empty((a.d_in, a.d_out), dtype=np.float32) for a in self.layers}
            if velocity is not None:  # resumed: the SFB layers' velocity as the server had it
                for a in self.layers:
                    self.opt.velocity[a.params] = velocity[a.params]

    def hooks(self, wait_free: bool) -> dict:
        """The model's keyword arguments of ``loss_and_grad``: where the factors go, and with wait-free
        backprop the call that sends a layer's as soon as they are final."""
        return {"factors": self.space, "on_factors_ready": self.send if wait_free else None}

    def begin_push(self) -> None:
        self.sent = dict.fromkeys(self.sends, False)

    def send(self, name: str) -> None:
        """Send layer `name`'s factors, final now: into this worker's rows of the stacked buffers (on
        the host), then to every destination."""
        me = self.stacked.rows(self.index)
        V, U = self.stacked.V[name][me], self.stacked.U[name][me]
        V[...] = self.buf.backend.to_host(self.space.V(name))
        U[...] = self.buf.backend.to_host(self.space.U(name))
        self.check(V.reshape(-1))
        self.check(U.reshape(-1))
        MPI.Prequest.Startall(self.sends[name])
        self.bytes.sent(name, SFB, (V.nbytes + U.nbytes) * (len(self.sends[name]) // 2))
        self.sent[name] = True

    def push_rest(self) -> None:
        """Send the factors of this push not sent yet (all of them without wait-free backprop)."""
        for a in self.layers:
            if not self.sent[a.name]:
                self.send(a.name)

    def post_pull(self) -> Requests:
        """Post the receives of the round's other factors, which come with the reply (BSP)."""
        if self.incoming.requests:
            MPI.Prequest.Startall(self.incoming.requests)
        return self.incoming

    def count_pull(self, first: bool) -> None:
        """Count the bytes of the round's factors just received (BSP, after the first pull)."""
        if not self.bsp or first:
            return
        rows = (self.ctx.workers - 1) * self.stacked.batch  # the other workers' factors
        for a in self.layers:
            self.bytes.received(a.name, SFB, rows * (a.d_in + a.d_out) * self.buf.params.itemsize)

    def step(self, pull_header: np.ndarray, version_used: int) -> None:
        """BSP: the round's step of each SFB layer, as the server takes it: the mean of the members'
        rebuilt gradients (the server names the members in its reply), one optimizer step at the
        learning rate of the version this worker's push was computed from."""
        if not self.bsp:
            return
        mask = pull_header[len(PULL_FIELDS):]
        members = [w for w in range(self.ctx.workers) if mask[w]]
        if not members:  # every push of the round was rejected: the weights stay as they are
            return
        lr, params, backend = self.lr_at(version_used), self.buf.params, self.buf.backend
        for a in self.layers:
            V, U = self.stacked.of(a, members)
            rebuild_gradient(V, U, self.grad[a.name], scale=1.0 / len(members))
            grad = self.grad[a.name].reshape(-1)
            if self.buf.host_params:
                self.opt.step(params[a.params], grad, lr, offset=a.offset)
            else:  # CUDA-aware MPI: the weights are on the device, the optimizer and its velocity on the host
                weights = backend.to_host(params[a.params])
                self.opt.step(weights, grad, lr, offset=a.offset)
                backend.copy_to_device(params[a.params], weights)
