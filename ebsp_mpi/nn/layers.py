"""Layers: ``Dense``, ``ReLU``, ``Flatten`` here; ``Conv2D`` and ``MaxPool2D`` in their own modules.

All of them follow :class:`ebsp_mpi.nn.base.Layer` and work on NumPy or CuPy arrays alike.
"""

from __future__ import annotations

import math

from .base import Layer
from .conv import Conv2D
from .params import ParamSpace, TensorSpec
from .pool import MaxPool2D

__all__ = ["Layer", "Dense", "Conv2D", "MaxPool2D", "ReLU", "Flatten"]


class Dense(Layer):
    """Fully connected layer ``y = x @ W + b``.

    Parameters
    ----------
    out : int
        Output features.
    init : str
        Initialiser of ``W`` (``"he_normal"`` suits a following ReLU; ``"glorot_uniform"`` too).

    Notes
    -----
    ``W`` has shape ``(in, out)`` so that forward, weight gradient ``x.T @ dy`` and input gradient
    ``dy @ W.T`` are each one GEMM on contiguous 2-D operands (transposes are free flags to BLAS).
    """

    def __init__(self, out: int, init: str = "he_normal"):
        if int(out) < 1:
            raise ValueError(f"Dense: out must be >= 1, got {out}")
        self.out = int(out)
        self.init = init

    def __repr__(self) -> str:
        return f"Dense({self.out})"

    def build(self, in_shape, prefix):
        if len(in_shape) != 1:
            raise ValueError(f"Dense expects a flat per-sample input (D,), got {tuple(in_shape)}; "
                             "put Flatten() before it")
        d = int(in_shape[0])
        self.in_shape = (d,)
        self.tensor_names = (f"{prefix}.W", f"{prefix}.b")
        specs = [TensorSpec(self.tensor_names[0], (d, self.out), self.init, d, self.out),
                 TensorSpec(self.tensor_names[1], (self.out,), "zeros", d, self.out)]
        return specs, (self.out,)

    def bind(self, space: ParamSpace) -> None:
        super().bind(space)
        w, b = self.tensor_names
        self.bind_arrays(space.param(w), space.param(b), space.grad_of(w), space.grad_of(b))

    def bind_arrays(self, W, b, dW, db) -> None:
        """Compute with these arrays as ``W``, ``b`` and their gradients, ``W`` and ``dW`` flat or
        ``(in, out)`` (``bind`` takes them from a ParamSpace; an OSDP on-demand layer from its fetch
        buffer, the gradients over the weights)."""
        shape = (self.in_shape[0], self.out)
        self.W, self.b, self.dW, self.db = W.reshape(shape), b, dW.reshape(shape), db

    def forward(self, x, train):
        y = self.xp.matmul(x, self.W)
        y += self.b
        if train:
            self._x = x
        return y

    reports_grad_blocks = True

    def backward(self, dy, need_dx=True, ready=None, block_elems: int = 0, dx_first=False):
        """Gradients of W and b from `dy`; ``dx`` when `need_dx`. With `dx_first`, ``dx`` (which reads W)
        is computed before ``dW`` is written: ``dW`` may then share W's memory (OSDP's on-demand layers).

        With `ready` and a `block_elems` smaller than W, ``dW`` is computed in blocks of whole rows,
        and ``ready(name of W, stop)`` is called after each block, ``stop`` being how many leading
        elements of ``dW`` are final: a worker can send them while the rest still computes (wait-free
        backprop below the layer). The last block has at most `block_elems` elements and each block
        before it is about twice the next (:func:`row_blocks`). Each element of ``dW`` is the same dot
        product over the batch either way.
        """
        xp, x = self.xp, self._x
        dx = xp.matmul(dy, self.W.T) if need_dx and dx_first else None
        rows = max(1, block_elems // self.out) if ready is not None and block_elems else x.shape[1]
        if rows >= x.shape[1]:
            xp.matmul(x.T, dy, out=self.dW)
        else:
            for r, stop in row_blocks(x.shape[1], rows):
                xp.matmul(x[:, r:stop].T, dy, out=self.dW[r:stop])
                ready(self.tensor_names[0], stop * self.out)
        xp.sum(dy, axis=0, out=self.db)
        self._x = None
        if need_dx and dx is None:
            dx = xp.matmul(dy, self.W.T)
        return dx

    # -- OSDP slices: a layer split along ``in``, one slice of W's rows at a time (nn.ondemand) -------

    def forward_slice(self, x, W, b, row0: int, temp):
        """Slice ``[row0, row0 + rows)`` of W (flat), with b on the last slice (empty before): adds its
        partial product ``x[:, rows] @ W_k`` into the output. The first slice writes it, the others
        go through `temp` (at least ``batch * out`` elements, shared by every split layer); the last
        adds b and returns y (the others None)."""
        xp, out = self.xp, self.out
        rows = W.size // out
        part, W = x[:, row0:row0 + rows], W.reshape(rows, out)
        if row0 == 0:
            self._x = x  # the layer's input, for every slice's backward
            self._y = xp.matmul(part, W)
        else:
            tmp = temp[:x.shape[0] * out].reshape(x.shape[0], out)
            xp.matmul(part, W, out=tmp)
            self._y += tmp
        if row0 + rows < self.in_shape[0]:
            return None
        y, self._y = self._y, None
        y += b
        return y

    def backward_slice(self, dy, W, db, row0: int, need_dx: bool):
        """Backward of slice ``[row0, row0 + rows)``, called last slice first: its columns of dx (it
        reads W), then ``dW_k`` written over W and, on the last slice, ``db`` into `db` (empty before).
        The call for ``row0 == 0`` returns dx (the others None)."""
        xp, x, out = self.xp, self._x, self.out
        rows = W.size // out
        W = W.reshape(rows, out)
        if row0 + rows == self.in_shape[0]:
            self._dx = xp.empty_like(x) if need_dx else None
            xp.sum(dy, axis=0, out=db)
        if need_dx:  # written in place: a temporary of the slice's columns of dx would add to the peak
            xp.matmul(dy, W.T, out=self._dx[:, row0:row0 + rows])
        xp.matmul(x[:, row0:row0 + rows].T, dy, out=W)
        if row0 > 0:
            return None
        dx, self._dx, self._x = self._dx, None, None
        return dx

    def backward_factors(self, dy, factors, need_dx=True, on_factors_ready=None):
        """Like :meth:`backward`, but the weight gradient leaves as sufficient factors (Poseidon's SFB).

        Writes ``V = x`` (the input of the last training forward, ``(K, d_in)``) and ``U = dy``
        (``(K, d_out)``) into this layer's block of `factors` (``dW = V.T @ U``), calls
        ``on_factors_ready(name of W)`` at once so that the block can be sent while ``db`` and ``dx``
        still compute, then computes ``db`` and, when `need_dx`, ``dx`` as :meth:`backward` does.
        ``dW`` in the gradient buffer is not written: it keeps whatever it held.

        Parameters
        ----------
        dy : xp.ndarray, shape (K, d_out)
            Gradient of the loss w.r.t. this layer's output (the loss's 1/K inside).
        factors : FactorSpace
            Holds a block for this layer's W, of batch K.
        need_dx : bool
            Compute and return ``dx`` (``None`` otherwise).
        on_factors_ready : callable, optional
            ``on_factors_ready(name of W)``, called once the block is final.
        """
        w = self.tensor_names[0]
        # Copies, not references: the caller's buffers may be reused before the block is sent.
        factors.V(w)[...] = self._x
        factors.U(w)[...] = dy
        if on_factors_ready is not None:
            on_factors_ready(w)
        self.xp.sum(dy, axis=0, out=self.db)
        self._x = None
        return self.xp.matmul(dy, self.W.T) if need_dx else None


def row_blocks(n: int, rows: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of the row blocks in which wait-free backprop computes a weight gradient of `n`
    rows, the last of them at most `rows` rows.

    Counted from the end: the remainder of `n` by `rows`, then `rows`, then twice as many each time,
    until the first block takes all that is left (at least as many rows as the block after it). Only
    the last block's chunks are sent with nothing left to hide them, so it stays small; the server
    copies what an earlier block released several times faster than the next block computes, so those
    can be bigger. Fewer blocks pay: each GEMM call repacks the shared operand. 784 rows with `rows`
    128 take 4 calls (384, 256, 128, 16 rows) instead of 7 equal ones, which cost 130 - 170 us more
    than one GEMM at batch 64; the 4 save 40 - 55 us of that.
    """
    sizes, left, size = [], n, rows
    if n % rows:
        sizes.append(n % rows)
        left -= n % rows
    while left > 0:
        sizes.append(left if left < 2 * size else size)
        left -= sizes[-1]
        size *= 2
    bounds, start = [], 0
    for size in reversed(sizes):
        bounds.append((start, start + size))
        start += size
    return bounds


class ReLU(Layer):
    """Rectifier ``max(x, 0)``; its gradient at 0 is taken as 0."""

    def forward(self, x, train):
        if train:
            self._mask = x > 0
        return self.xp.maximum(x, 0)

    def backward(self, dy, need_dx=True):
        mask, self._mask = self._mask, None
        return self.xp.multiply(dy, mask, dtype=dy.dtype) if need_dx else None


class Flatten(Layer):
    """``(N, *shape) -> (N, prod(shape))``; a view when the input is contiguous."""

    def build(self, in_shape, prefix):
        self.in_shape = tuple(int(d) for d in in_shape)
        return [], (math.prod(self.in_shape),)

    def forward(self, x, train):
        return x.reshape(x.shape[0], -1)

    def backward(self, dy, need_dx=True):
        return dy.reshape((dy.shape[0],) + self.in_shape) if need_dx else None
