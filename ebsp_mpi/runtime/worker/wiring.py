"""What a worker's messages travel through, chosen once from the run's layout: its buffers, the dense
wire (``wire_dense``), the sufficient factors of SFB layers (``wire_factors``), OSDP's on-demand layers
(``osdp``), and how the gradient is computed so that wait-free backprop sends each part as it is made.
The worker's loop (``loop``) only drives it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..transport.hybrid import ByteCounter
from .osdp import OnDemandLayers
from .wire_dense import DenseWire, FiniteCheck, Requests, WireBuffers
from .wire_factors import FactorWire


@dataclass
class Wiring:
    """A worker's wire, made once by :func:`make_wiring`."""

    buffers: WireBuffers  # the flat weights and gradient MPI uses (a host mirror: a GPU without CUDA-aware MPI)
    bytes: ByteCounter
    finite: FiniteCheck  # the push's NaN/Inf check, told every gradient sent
    dense: DenseWire
    factors: FactorWire | None  # the SFB layers' factors, where comm.hybrid chose any
    ondemand: OnDemandLayers | None  # OSDP's on-demand layers, where the plan has any
    wires: list  # the dense wire, and the factors' where there are any
    outgoing: Requests  # everything a push sends: completed before the gradient and factors are written again
    grad_hooks: dict  # the keywords of the gradient's loss_and_grad: wait-free backprop's sends
    gradient: object  # what computes the gradient (its loss_and_grad): the model, or its on-demand layers' step


def make_wiring(ctx, description, model, backend, index: int, run_dir, start_iteration: int) -> Wiring:
    """The wire of worker `index` (see the module docstring); `start_iteration` > 0: a resumed run, whose
    SFB layers step on from the checkpoint in `run_dir`."""
    job, layout = description.job, description.layout
    buffers = WireBuffers.of(model.space, backend, job.runtime.cuda_aware_mpi)
    nbytes, finite = ByteCounter(), FiniteCheck()
    names = {a.name for a in layout.sfb}
    sfb_chunk = np.array([t in names for t in layout.chunk_tensor], dtype=bool)
    dense = DenseWire(ctx, layout, buffers, nbytes, finite, sfb_chunk)
    factors = None
    if layout.sfb:
        velocity = None
        if layout.sfb_bsp and start_iteration > 0:  # resumed: the SFB layers step on from here
            from ...checkpoint import read_checkpoint

            velocity = read_checkpoint(run_dir).velocity
        factors = FactorWire(ctx, description, layout, index, buffers, nbytes, finite, velocity)
    wires = [dense] + ([factors] if factors else [])
    wait_free = job.runtime.wait_free_backprop
    grad_hooks = {"on_grad_ready": dense.push_ready if wait_free else None,
                  "block_elems": layout.chunk_bytes // buffers.grad.itemsize}
    ondemand = None
    if layout.schedule is not None:  # OSDP: the on-demand layers' buffer and messages
        ondemand = OnDemandLayers(ctx, layout, model, buffers, finite, nbytes, job.data.batch_size)
    elif factors:
        grad_hooks.update(factors.hooks(wait_free))
    return Wiring(buffers, nbytes, finite, dense, factors, ondemand, wires,
                  joined([wire.outgoing for wire in wires]), grad_hooks,
                  ondemand if ondemand is not None else model)


def joined(parts: list[Requests]) -> Requests:
    """The requests of `parts` as one list, to complete together."""
    if len(parts) == 1:  # the dense wire alone, as in most runs: its own, made once
        return parts[0]
    return Requests([r for p in parts for r in p.requests], [s for p in parts for s in p.ranks],
                    first=any(p.first for p in parts))
