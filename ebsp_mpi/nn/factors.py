"""Sufficient factors of dense layers (Poseidon's SFB) in one flat buffer, and the gradient rebuilt from them.

For a dense layer ``y = x @ W + b`` with ``W`` of shape ``(d_in, d_out)``, the weight gradient of a
batch of K samples is ``dW = V.T @ U`` with ``V = x`` (K × d_in, the layer's input) and ``U = dy``
(K × d_out, the error at its output, the loss's 1/K already inside it): K·(d_in + d_out) floats on the
wire instead of d_in·d_out (Xie et al., "Distributed machine learning via sufficient factor
broadcasting", arXiv 2015; Poseidon, Zhang et al., USENIX ATC 2017, hybrid communication). Summed over P workers,
``sum_p V_p.T @ U_p`` is ONE GEMM on the factors stacked in worker order,
``[V_1; ...; V_P].T @ [U_1; ...; U_P]``.

Layout
------
A :class:`FactorSpace` holds, per SFB layer in forward order, ``V`` (K × d_in) then ``U`` (K × d_out),
each C-contiguous, back to back in one buffer (no gaps). The P workers' factors stacked for the
rebuild have the SAME layout with batch P·K: ``space.gathered(P)``. So a runtime that allgathers one
factor at a time (send ``space.V(name)``, receive into ``gathered.V(name)``; likewise ``U``) finds
every stacked factor in place, worker p's rows at ``p·K``, as MPI's allgather leaves them: stacking
costs nothing and the rebuild reads views. An allgather of the whole buffer (or of one layer's
``[V, U]`` block) instead leaves worker p's V at ``p·size`` (or ``p·block``), with its U between it
and worker p+1's V: no 2-D view spans those rows, and :func:`stack_factors` copies them, once, into a
preallocated gathered space.

Why not interleave ``[v_k | u_k]`` per row so that a whole block's allgather stacks for free (V and U
being column slices with a leading dimension)? NumPy's BLAS path takes such strided operands, but
CuPy copies every operand that is neither C- nor F-contiguous before calling cuBLAS, so on the GPU the
copy would only move into the GEMM; and the per-worker V and U would no longer be contiguous sends.
Two messages per layer instead of one is the price of the layout chosen here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy

from .losses import _array_module

__all__ = ["FactorBlock", "FactorSpace", "rebuild_gradient", "stack_factors"]


@dataclass(frozen=True)
class FactorBlock:
    """Where one SFB layer's factors live in a :class:`FactorSpace`'s flat buffer.

    Offsets and sizes count elements (not bytes) of the flat ``data`` buffer. The layer's block is
    ``data[offset:offset + size]``: ``V`` (``batch × d_in``) at ``offset``, then ``U``
    (``batch × d_out``) at ``u_offset``.

    Attributes
    ----------
    name : str
        Name of the layer's weight tensor in the ``ParamSpace`` (e.g. ``"dense1.W"``).
    d_in, d_out : int
        Shape of that weight, ``(d_in, d_out)``.
    offset, size : int
        Start and length of the whole block (``size = batch·(d_in + d_out)``).
    v_offset, v_size : int
        Start and length of ``V`` (``v_offset == offset``, ``v_size = batch·d_in``).
    u_offset, u_size : int
        Start and length of ``U`` (``u_offset = offset + v_size``, ``u_size = batch·d_out``).
    """

    name: str
    d_in: int
    d_out: int
    offset: int
    size: int
    v_offset: int
    v_size: int
    u_offset: int
    u_size: int


def _blocks(layers: Sequence[tuple[str, int, int]], batch: int) -> tuple[FactorBlock, ...]:
    """The blocks of ``layers`` packed back to back from offset 0, each ``V`` then ``U``."""
    blocks, offset, seen = [], 0, set()
    for name, d_in, d_out in layers:
        d_in, d_out = int(d_in), int(d_out)
        if name in seen:
            raise ValueError(f"FactorSpace: duplicate layer {name!r}")
        if d_in < 1 or d_out < 1:
            raise ValueError(f"FactorSpace: layer {name!r} has d_in={d_in}, d_out={d_out}; both must be >= 1")
        seen.add(name)
        v_size, u_size = batch * d_in, batch * d_out
        blocks.append(FactorBlock(name, d_in, d_out, offset, v_size + u_size,
                                  offset, v_size, offset + v_size, u_size))
        offset += v_size + u_size
    return tuple(blocks)


class FactorSpace:
    """The sufficient factors of a model's SFB layers for one batch, in ONE contiguous buffer.

    Parameters
    ----------
    layers : sequence of (str, int, int)
        ``(name of W, d_in, d_out)`` per SFB layer, in forward order (``Model.factor_layers()``
        gives them for a model's dense layers). Names must be unique.
    batch : int
        Samples per batch, K: the rows of every ``V`` and ``U``.
    xp : module
        Array module, ``numpy`` or ``cupy``.
    dtype : numpy dtype
        Element type (float32 for training, float64 for gradient checks).

    Attributes
    ----------
    blocks : tuple of FactorBlock
        The layers' blocks, in forward order, back to back from offset 0.
    batch : int
        K.
    size : int
        Total number of elements; ``nbytes`` is the buffer's size in bytes.
    data : xp.ndarray
        The flat ``(size,)`` buffer. Send it whole, or a layer's block (``block_data``) or factor
        (``V``, ``U``) alone as soon as the model reports it final (wait-free backprop).

    Notes
    -----
    The buffer carries no validity flag: a runtime that needs one adds its own.
    """

    def __init__(self, layers: Sequence[tuple[str, int, int]], batch: int, xp=numpy, dtype=numpy.float32):
        if int(batch) < 1:
            raise ValueError(f"FactorSpace: batch must be >= 1, got {batch}")
        self.xp = xp
        self.dtype = numpy.dtype(dtype)
        self.batch = int(batch)
        self.blocks = _blocks(layers, self.batch)
        self.size = sum(b.size for b in self.blocks)
        self.nbytes = self.size * self.dtype.itemsize
        self.data = xp.zeros(self.size, dtype=self.dtype)
        self._by_name = {b.name: b for b in self.blocks}

    def __repr__(self) -> str:
        return f"FactorSpace({len(self.blocks)} layers, batch {self.batch}, {self.size} elements, {self.dtype})"

    def __contains__(self, name) -> bool:
        return name in self._by_name

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the layers' weights, in forward order."""
        return tuple(b.name for b in self.blocks)

    def layers(self) -> list[tuple[str, int, int]]:
        """``(name of W, d_in, d_out)`` per layer, as the constructor takes them."""
        return [(b.name, b.d_in, b.d_out) for b in self.blocks]

    def block(self, name: str) -> FactorBlock:
        """The :class:`FactorBlock` of layer ``name`` (KeyError naming the known layers otherwise)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no SFB layer {name!r}; known: {list(self._by_name)}") from None

    def block_data(self, name: str):
        """Layer ``name``'s whole block, ``V`` then ``U``, as a flat view of ``data``."""
        b = self.block(name)
        return self.data[b.offset:b.offset + b.size]

    def V(self, name: str):
        """Layer ``name``'s input factor, a ``(batch, d_in)`` view of ``data``."""
        b = self.block(name)
        return self.data[b.v_offset:b.v_offset + b.v_size].reshape(self.batch, b.d_in)

    def U(self, name: str):
        """Layer ``name``'s output-error factor, a ``(batch, d_out)`` view of ``data``."""
        b = self.block(name)
        return self.data[b.u_offset:b.u_offset + b.u_size].reshape(self.batch, b.d_out)

    def gathered(self, workers: int) -> FactorSpace:
        """A new space with the same layers and batch ``workers·batch``: the stacked factors.

        Worker p's ``V`` of a layer is rows ``p·batch .. (p+1)·batch`` of the gathered ``V``, which is
        where an allgather of that factor alone puts it; :func:`rebuild_gradient` then reads views.
        """
        if int(workers) < 1:
            raise ValueError(f"FactorSpace.gathered: workers must be >= 1, got {workers}")
        return FactorSpace(self.layers(), int(workers) * self.batch, xp=self.xp, dtype=self.dtype)


def rebuild_gradient(V_all, U_all, out, scale: float = 1.0):
    """``out[...] = scale * V_all.T @ U_all``: a weight gradient from stacked sufficient factors.

    One GEMM written straight into ``out`` (no full-size temporary), then scaled in place.

    Parameters
    ----------
    V_all : xp.ndarray, shape (P·K, d_in)
        The P workers' input factors, stacked in worker order.
    U_all : xp.ndarray, shape (P·K, d_out)
        Their output-error factors, in the same order.
    out : xp.ndarray, shape (d_in, d_out)
        Where the gradient goes (e.g. ``space.grad_of("dense1.W")``); C-contiguous.
    scale : float
        Factor applied to the sum, e.g. ``1/P`` for the mean over P workers (the 1/K of each
        worker's loss is already inside its ``U``).

    Returns
    -------
    xp.ndarray
        ``out``.
    """
    if V_all.ndim != 2 or U_all.ndim != 2 or V_all.shape[0] != U_all.shape[0]:
        raise ValueError(f"rebuild_gradient: factors of shapes {tuple(V_all.shape)} and {tuple(U_all.shape)} "
                         "are not (P·K, d_in) and (P·K, d_out)")
    if tuple(out.shape) != (V_all.shape[1], U_all.shape[1]):
        raise ValueError(f"rebuild_gradient: out has shape {tuple(out.shape)}, expected "
                         f"({V_all.shape[1]}, {U_all.shape[1]})")
    xp = _array_module(out)
    xp.matmul(V_all.T, U_all, out=out)
    if scale != 1.0:
        # In the gradient's own type, as ``round_mean`` scales a round's sum: the same float operations.
        out *= out.dtype.type(scale)
    return out


def stack_factors(recv, space: FactorSpace, name: str, out: FactorSpace | None = None):
    """Layer ``name``'s stacked ``(V_all, U_all)`` from P workers' whole buffers back to back.

    Parameters
    ----------
    recv : xp.ndarray, shape (P·size,) or (P, size)
        P workers' whole ``space.data`` buffers in worker order, as an allgather of the whole buffer
        leaves them.
    space : FactorSpace
        The layout of one worker's buffer.
    name : str
        The layer (name of its W).
    out : FactorSpace, optional
        ``space.gathered(P)``, allocated once by the caller; needed when P > 1.

    Returns
    -------
    V_all : xp.ndarray, shape (P·K, d_in)
    U_all : xp.ndarray, shape (P·K, d_out)
        Views of ``recv`` when P == 1; otherwise ``out.V(name)`` and ``out.U(name)``, filled.

    Notes
    -----
    With P > 1 this copies: worker p's ``V`` sits at ``p·size + offset`` and worker p+1's at
    ``(p+1)·size + offset``, with the rest of worker p's buffer (its ``U`` and other layers) between
    them, so the stacked rows are not equally spaced and no 2-D view (which a GEMM needs) spans them.
    The copy is one pass of the layer's factors into ``out``'s preallocated views, no allocation.
    Allgathering each factor alone into ``space.gathered(P)`` avoids it (see the module's notes).
    """
    b = space.block(name)
    rows = recv.reshape(-1, space.size)
    workers = rows.shape[0]
    if workers == 1:
        return _views(rows[0], space, b)
    if out is None or out.batch != workers * space.batch or name not in out:
        raise ValueError(f"stack_factors: {workers} workers' factors need out = space.gathered({workers}), "
                         f"got {out!r}")
    V_all, U_all = out.V(name), out.U(name)
    V_all.reshape(workers, space.batch, b.d_in)[...] = \
        rows[:, b.v_offset:b.v_offset + b.v_size].reshape(workers, space.batch, b.d_in)
    U_all.reshape(workers, space.batch, b.d_out)[...] = \
        rows[:, b.u_offset:b.u_offset + b.u_size].reshape(workers, space.batch, b.d_out)
    return V_all, U_all


def _views(flat, space: FactorSpace, b: FactorBlock):
    """``(V, U)`` of block ``b`` as 2-D views of one worker's flat buffer ``flat`` laid out as ``space``."""
    return (flat[b.v_offset:b.v_offset + b.v_size].reshape(space.batch, b.d_in),
            flat[b.u_offset:b.u_offset + b.u_size].reshape(space.batch, b.d_out))
