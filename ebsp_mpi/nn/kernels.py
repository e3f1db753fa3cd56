"""Fused CPU loops for the two passes the parameter server makes over every gradient: the NaN/Inf
check and the SGD update.

NumPy runs ``v = mu*v + g; p -= lr*v`` as four ufunc passes, and each pass reads and writes a whole
block; a compiled loop does it in one pass, reading ``p``, ``g``, ``v`` and writing ``p``, ``v`` once
(five streams, against three for an axpy). Numba compiles these loops (``README.md``, "Dependencies").

Each loop does exactly NumPy's float operations in NumPy's order, on the array's own dtype (the
scalars are cast to it first, as NumPy 2 does with Python scalars), and without fused multiply-add
(Numba's default), so that the fused and the NumPy paths give bit-identical parameters: the
single-process oracle and the BSP server agree whichever path each takes (tests/test_nn_optim.py).

Without Numba, :data:`AVAILABLE` is False and callers take their NumPy path. Numba is imported and
the loops compiled on first use (importing it costs about 0.3 s, which commands that never update
parameters should not pay).
"""

from __future__ import annotations

import importlib.util
import warnings
from types import SimpleNamespace

import numpy as np

AVAILABLE = importlib.util.find_spec("numba") is not None

#: the exponent bits of a float32 / float64; all ones means Inf or NaN
_EXP32 = np.uint32(0x7F800000)
_EXP64 = np.uint64(0x7FF0000000000000)
_compiled = None


def _loops() -> SimpleNamespace | None:
    """The compiled loops, compiled (or loaded from Numba's cache) on the first call; None (and
    :data:`AVAILABLE` False from then on) where Numba fails to import, e.g. with a NumPy too new for it."""
    global _compiled, AVAILABLE
    if _compiled is None and AVAILABLE:
        try:
            import numba
        except ImportError as e:
            warnings.warn(f"numba does not import ({e}); SGD and the NaN check take the slower NumPy path")
            AVAILABLE = False
            return None

        # nogil: no Python objects inside; cache: compile once per machine, not once per rank and run
        jit = numba.njit(cache=True, nogil=True, boundscheck=False)
        _compiled = SimpleNamespace(sgd=jit(_sgd), momentum=jit(_momentum), nesterov=jit(_nesterov),
                                    max_exponent=jit(_max_exponent))
    return _compiled


def _sgd(p, g, lr, wd):
    if wd == 0:
        for i in range(p.shape[0]):
            p[i] = p[i] - g[i] * lr
    else:
        for i in range(p.shape[0]):
            gi = p[i] * wd + g[i]
            p[i] = p[i] - gi * lr


def _momentum(p, g, v, lr, mu, wd):
    if wd == 0:
        for i in range(p.shape[0]):
            vi = v[i] * mu + g[i]
            v[i] = vi
            p[i] = p[i] - vi * lr
    else:
        for i in range(p.shape[0]):
            gi = p[i] * wd + g[i]
            vi = v[i] * mu + gi
            v[i] = vi
            p[i] = p[i] - vi * lr


def _nesterov(p, g, v, lr, lr_mu, mu, wd):
    # NumPy's order: p -= lr * g, then p -= (lr * mu) * v
    if wd == 0:
        for i in range(p.shape[0]):
            gi = g[i]
            vi = v[i] * mu + gi
            v[i] = vi
            p[i] = (p[i] - gi * lr) - vi * lr_mu
    else:
        for i in range(p.shape[0]):
            gi = p[i] * wd + g[i]
            vi = v[i] * mu + gi
            v[i] = vi
            p[i] = (p[i] - gi * lr) - vi * lr_mu


def _max_exponent(bits, mask):
    # a max over integers vectorizes (a float reduction would not, without fastmath)
    m = mask ^ mask  # zero, of the mask's type
    for i in range(bits.shape[0]):
        m = max(m, bits[i] & mask)
    return m


def sgd_step(p: np.ndarray, g: np.ndarray, v: np.ndarray | None, *, lr: float, momentum: float,
             nesterov: bool, weight_decay: float) -> None:
    """One SGD step in place, as ``SGD._step_block`` does it with NumPy (same operations, same order).

    All arrays 1-D, contiguous, of one float dtype (:func:`fits` says so); ``v`` is None when
    ``momentum == 0``.
    """
    loops = _compiled or _loops()
    cast = np.float32 if p.dtype == np.float32 else np.float64
    lr_, wd = cast(lr), cast(weight_decay)
    if momentum == 0:
        loops.sgd(p, g, lr_, wd)
    elif nesterov:
        loops.nesterov(p, g, v, lr_, cast(lr * momentum), cast(momentum), wd)
    else:
        loops.momentum(p, g, v, lr_, cast(momentum), wd)


def all_finite(a) -> bool:
    """True when the float array `a` holds no NaN or Inf.

    Fused: one pass over the bits, looking for an exponent of all ones (about 2x faster than two
    float reductions). Otherwise min and max, which propagate NaN (and +-Inf is an extreme itself):
    two reductions without the temporary array of ``isfinite(a).all()``.
    """
    if not fits(a):
        return bool(np.isfinite(a.max()) and np.isfinite(a.min())) if a.size else True
    loops = _compiled  # fits() loaded them
    if a.dtype == np.float32:
        return loops.max_exponent(a.view(np.uint32), _EXP32) != _EXP32
    return loops.max_exponent(a.view(np.uint64), _EXP64) != _EXP64


def warm_up(dtype=np.float32) -> bool:
    """Import Numba and compile (or load from its cache) every loop for `dtype` now, so that the
    first real step does not pay it inside a timed run. True when the fused loops are available."""
    a = np.zeros(1, dtype=dtype)
    if not fits(a):
        return False
    for momentum, nesterov in ((0.0, False), (0.5, False), (0.5, True)):
        sgd_step(a, a.copy(), a.copy(), lr=0.0, momentum=momentum, nesterov=nesterov, weight_decay=0.0)
    all_finite(a)
    return True


def fits(*arrays) -> bool:
    """The fused loops apply: Numba is present and the arrays are 1-D, contiguous NumPy arrays of one
    dtype, float32 or float64. (Cheap tests only: the server asks this on every chunk.) Compiles or
    loads the loops on first use."""
    if not AVAILABLE or (_compiled is None and _loops() is None):
        return False
    dtype = arrays[0].dtype
    if dtype != np.float32 and dtype != np.float64:
        return False
    for a in arrays:
        if type(a) is not np.ndarray or a.dtype != dtype or a.ndim != 1 or a.strides[0] != a.itemsize:
            return False
    return True
