"""OSDP on a worker: the on-demand layers' step and the fetches that feed it, and what the worker
measures of a plan (its peak memory, its median iteration and transfer-wait times).

The worker holds only its resident layers in its ``ParamSpace``; each on-demand unit's weights are
fetched into one preallocated buffer just before an item computes with them, and its gradient is
pushed from there (``runtime.fetch``, ``nn.ondemand``).
"""

from __future__ import annotations

from ...nn.ondemand import OnDemandStep
from ..transport.fetch import Fetcher


class OnDemandLayers:
    """The gradient computation of a worker with on-demand layers (``layout.schedule``).

    Parameters
    ----------
    ctx : Context
    layout : Layout
        With a schedule.
    model : Model
        Without the on-demand layers in its buffers.
    buffers : WireBuffers
    check : FiniteCheck
        Told every gradient the fetcher pushes.
    bytes : ByteCounter
    batch_size : int
    """

    def __init__(self, ctx, layout, model, buffers, check, bytes, batch_size: int):
        self.step = OnDemandStep(model, layout.schedule, batch_size)
        self.fetcher = Fetcher(ctx, layout, buffers.backend, buffers.staged, check, bytes)

    def loss_and_grad(self, x, y, on_grad_ready=None, block_elems: int = 0) -> float:
        """As ``Model.loss_and_grad``; the on-demand units' gradients go out through the fetcher."""
        return self.step.loss_and_grad(x, y, self.fetcher, on_grad_ready=on_grad_ready, block_elems=block_elems)

    def held_arrays(self) -> list:
        """The arrays kept for the whole run besides the model's: the fetch buffer and the step's temporary."""
        return [self.fetcher.buffer, self.step.temp]


def measured(peak_bytes: int, live_peak_bytes: int | None, times, ondemand: OnDemandLayers | None,
             iterations: int) -> dict:
    """What the worker measured of the plan, for the summary beside its prediction: the peak (on CuPy
    also the most its arrays held at once, else None), and the medians over the iterations, start to
    start, the first (warm-up) left out (a stall of the server, an evaluation slice of a large model
    takes some 0.1 s, moves neither)."""
    iteration_s, transfer_wait_s = times.medians()
    messages = ondemand.fetcher.messages / max(iterations, 1) if ondemand is not None else 0.0
    return {"peak_bytes": peak_bytes, "live_peak_bytes": live_peak_bytes, "iteration_s": iteration_s,
            "transfer_wait_s": transfer_wait_s, "transfer_messages": messages}
