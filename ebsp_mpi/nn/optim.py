"""SGD with momentum, Nesterov momentum and weight decay, in place on flat buffers."""

from __future__ import annotations

import numpy

from . import kernels
from .average import round_mean

# Elements per block on the CPU: p, grad, velocity and the scratch block (4 x 256 KiB in float32)
# stay in cache across the several ufunc passes of one block, so DRAM sees each array about once
# (measured: 2x faster than whole-buffer passes on 10M parameters; smaller blocks pay call overhead).
_CPU_BLOCK = 65536

# Below this many parameters the NumPy path is taken unless `fused` says otherwise: loading Numba costs
# a process about 1.7 s (its import and the compiled loops' cache), while on the digits MLP (~1e4
# parameters) the fused step saves about 18 us a step. Both paths give the same bits.
FUSED_MIN_SIZE = 65536


class SGD:
    """Stochastic gradient descent in the PyTorch convention (dampening 0).

    With ``g = grad + weight_decay * p``: ``v = momentum * v + g``; the step direction is
    ``d = g + momentum * v`` (Nesterov) or ``d = v``; then ``p -= lr * d``. With ``momentum = 0``
    no velocity is used: ``p -= lr * g``.

    Parameters
    ----------
    size : int
        Number of parameters (elements of the flat buffer this optimiser updates).
    momentum, weight_decay : float
        Non-negative coefficients.
    nesterov : bool
        Nesterov momentum (needs ``momentum > 0``).
    xp, dtype
        Array module and element type of the velocity and scratch buffers.
    fused : bool or None
        Update NumPy arrays with one compiled loop (:mod:`ebsp_mpi.nn.kernels`) instead of a few
        ufunc passes per cache block; both give bit-identical results. None (default): fused when
        Numba is installed and `size` is at least :data:`FUSED_MIN_SIZE`. CuPy arrays always take the
        ufunc path.

    Attributes
    ----------
    velocity : xp.ndarray, shape (size,)
        The momentum buffer, laid out like the parameter buffer.
    """

    def __init__(self, size: int, *, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0, xp=numpy, dtype=numpy.float32, fused: bool | None = None):
        if momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: momentum and weight_decay must be >= 0, got {momentum}, "
                             f"{weight_decay}")
        if nesterov and momentum == 0:
            raise ValueError("SGD: nesterov=True needs momentum > 0")
        self.size = int(size)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.weight_decay = float(weight_decay)
        self.xp = xp
        self.velocity = xp.zeros(self.size, dtype=dtype)
        # On a GPU one kernel per pass over the whole buffer is best; on the CPU, cache blocks.
        self.block = min(_CPU_BLOCK, self.size) if xp is numpy else self.size
        self._scratch = xp.empty(max(self.block, 1), dtype=dtype)
        if fused and not kernels.AVAILABLE:
            raise ValueError("SGD: fused=True needs Numba (pip install numba)")
        self.fused = (kernels.AVAILABLE and self.size >= FUSED_MIN_SIZE) if fused is None else bool(fused)
        if self.fused and xp is numpy:
            self.fused = kernels.warm_up(dtype)  # compile now, not in the first (timed) step
        fused_here = self.fused and xp is numpy
        self._fused_step = kernels.make_step(dtype, momentum=self.momentum, nesterov=self.nesterov,
                                             weight_decay=self.weight_decay) if fused_here else None
        self._fused_mean_step = kernels.make_mean_step(dtype, momentum=self.momentum, nesterov=self.nesterov,
                                                       weight_decay=self.weight_decay) if fused_here else None
        # On CuPy, one elementwise kernel instead of up to seven: the step is bound by memory traffic
        self._device_step = _device_step(xp, self.momentum, self.nesterov, self.weight_decay)

    def step(self, params, grad, lr: float, *, offset: int = 0) -> None:
        """Update ``params`` in place from ``grad`` (left unchanged) with learning rate ``lr``.

        Parameters
        ----------
        params, grad : xp.ndarray, shape (n,)
            Flat, contiguous parameter and gradient buffers, or slices of them (one tensor).
        lr : float
            Learning rate of this step.
        offset : int
            Position of ``params[0]`` in the full buffer, so that a per-tensor push updates the
            matching slice of ``velocity``.
        """
        n = params.shape[0]
        if params.ndim != 1 or grad.shape != params.shape or not 0 <= offset <= self.size - n:
            raise ValueError(f"SGD.step: need 1-D params and grad of one shape within the {self.size} "
                             f"elements of this optimiser; got params {tuple(params.shape)}, grad "
                             f"{tuple(grad.shape)}, offset {offset}")
        lr = float(lr)
        velocity = self.velocity if offset == 0 and n == self.size else self.velocity[offset:offset + n]
        if self._device_step is not None:
            self._device_step(params, grad, velocity, lr)
            return
        if self._fused_step is not None:
            try:
                self._fused_step(params, grad, velocity, lr)
                return
            except TypeError:  # not contiguous NumPy arrays of the velocity's dtype: the ufunc path
                pass
        for start in range(0, n, self.block):
            stop = min(start + self.block, n)
            self._step_block(params[start:stop], grad[start:stop],
                             self.velocity[offset + start:offset + stop],
                             self._scratch[:stop - start], lr)

    def step_mean(self, params, grads: list, lr: float, *, offset: int = 0, out=None) -> None:
        """One step on the mean of `grads` (a BSP round's: summed in list order, then scaled by 1/k),
        bit for bit as ``step(params, round_mean(grads, out), lr)``; `out` is the mean's buffer where
        it must be formed (None: a single gradient, or the fused loop, which forms each element's
        mean where it uses it and never writes `out`)."""
        n = params.shape[0]
        velocity = self.velocity[offset:offset + n]
        if self._fused_mean_step is not None and len(grads) > 1 and _fusable(params, grads, velocity):
            self._fused_mean_step(params, tuple(grads), velocity, float(lr))
            return
        self.step(params, round_mean(grads, out), lr, offset=offset)

    def _step_block(self, p, g, v, s, lr):
        xp, mu, wd = self.xp, self.momentum, self.weight_decay
        if wd:
            xp.multiply(p, wd, out=s)
            g = xp.add(s, g, out=s)
        if mu == 0:
            xp.multiply(g, lr, out=s)
            xp.subtract(p, s, out=p)
            return
        xp.multiply(v, mu, out=v)
        xp.add(v, g, out=v)
        if self.nesterov:
            # p -= lr * (g + mu * v), as two subtractions so that one scratch block suffices.
            xp.multiply(g, lr, out=s)
            xp.subtract(p, s, out=p)
            xp.multiply(v, lr * mu, out=s)
        else:
            xp.multiply(v, lr, out=s)
        xp.subtract(p, s, out=p)


def _fusable(params, grads: list, velocity) -> bool:
    """The fused loop on a round's mean takes these: writable, 1-D, contiguous NumPy arrays of one
    dtype and length (the loop has no signature that would check them)."""
    arrays = [params, velocity, *grads]
    return (all(type(a) is numpy.ndarray and a.ndim == 1 and a.flags.c_contiguous for a in arrays)
            and all(a.dtype == params.dtype and a.shape == params.shape for a in arrays)
            and params.flags.writeable and velocity.flags.writeable)


def _device_step(xp, momentum: float, nesterov: bool, weight_decay: float):
    """The whole update as one CuPy elementwise kernel, or None off CuPy.

    It does the NumPy path's float operations in the same order on the array's dtype, compiled
    without fused multiply-add (``--fmad=false``), so that it gives the NumPy path's parameters to the
    bit: a GPU worker's single-process oracle agrees with it whichever path each takes."""
    if not hasattr(xp, "ElementwiseKernel"):   # NumPy, or a stand-in without kernels
        return None
    body = ["T d = g;"]
    if weight_decay:
        body.append("d = p * wd + d;")   # s = p*wd; g = s + g: each product rounded, no FMA
    if momentum == 0:
        body.append("p = p - d * lr;")
    else:
        body.append("v = v * mu; v = v + d;")
        body.append("p = p - d * lr; p = p - v * lr_mu;" if nesterov else "p = p - v * lr;")
    kernel = xp.ElementwiseKernel("T g, T lr, T mu, T wd, T lr_mu", "T p, T v", " ".join(body),
                                  "ebsp_sgd_step", options=("--fmad=false",))

    def step(params, grad, velocity, lr):
        t = params.dtype.type
        kernel(grad, t(lr), t(momentum), t(weight_decay), t(lr * momentum), params, velocity)
    return step
