"""Fused CPU loops for the two passes the parameter server makes over every gradient: the NaN/Inf
check and the SGD update.

NumPy runs ``v = mu*v + g; p -= lr*v`` as four ufunc passes, and each pass reads and writes a whole
block; a compiled loop does it in one pass, reading ``p``, ``g``, ``v`` and writing ``p``, ``v`` once
(five streams, against three for an axpy). Numba compiles these loops (``README.md``, "Dependencies").

Each loop does exactly NumPy's float operations in NumPy's order, on the array's own dtype (the
scalars are cast to it first, as NumPy 2 does with Python scalars), and without fused multiply-add
(Numba's default), so that the fused and the NumPy paths give bit-identical parameters: the
single-process oracle and the BSP server agree whichever path each takes (tests/test_nn_optim.py).

The loops are compiled for writable, 1-D, contiguous float32 and float64 arrays only (explicit
signatures), so Numba's dispatcher is also the type check: any other argument raises ``TypeError``
before the loop runs, and the callers take their NumPy path. This matters below about 1e5 elements,
where a few attribute tests in Python cost as much as the loop itself.

Without Numba, :data:`AVAILABLE` is False and callers take their NumPy path. Numba is imported and
the loops compiled (or loaded from its cache) on first use, by an optimizer that chooses the fused
step: that costs a process about 1.7 s on a 2-core machine, which processes that never update a large
buffer should not pay (``optim.FUSED_MIN_SIZE``).
"""

from __future__ import annotations

import importlib.util
import warnings
from types import SimpleNamespace

import numpy as np

AVAILABLE = importlib.util.find_spec("numba") is not None

_compiled = None

#: the scalars of an update, in the array's dtype: ``coef = [lr, momentum, weight_decay, lr * momentum]``
#: (one small array is cheaper to pass through Numba's dispatch than four scalars)
_LR, _MU, _WD, _LR_MU = range(4)


def _loops() -> SimpleNamespace | None:
    """The compiled loops, compiled (or loaded from Numba's cache) on the first call; None (and
    :data:`AVAILABLE` False from then on) where Numba fails to import, e.g. with a NumPy too new for it."""
    global _compiled, AVAILABLE
    if _compiled is None and AVAILABLE:
        try:
            import numba
        except ImportError as e:
            warnings.warn(f"numba does not import ({e}); SGD and the NaN check take the slower NumPy path",
                          stacklevel=2)
            AVAILABLE = False
            return None

        def jit(signature, fn):
            # nogil: no Python objects inside; cache: compile once per machine, not once per rank and run
            sigs = [signature.replace("T", t) for t in ("f4", "f8")]
            return numba.njit(sigs, cache=True, nogil=True, boundscheck=False)(fn)

        _compiled = SimpleNamespace(sgd=jit("void(T[::1], T[::1], T[::1])", _sgd),
                                    momentum=jit("void(T[::1], T[::1], T[::1], T[::1])", _momentum),
                                    nesterov=jit("void(T[::1], T[::1], T[::1], T[::1])", _nesterov),
                                    finite=jit("b1(T[::1])", _finite))
    return _compiled


def _sgd(p, g, coef):
    lr, wd = coef[_LR], coef[_WD]
    if wd == 0:
        for i in range(p.shape[0]):
            p[i] = p[i] - g[i] * lr
    else:
        for i in range(p.shape[0]):
            gi = p[i] * wd + g[i]
            p[i] = p[i] - gi * lr


def _momentum(p, g, v, coef):
    lr, mu, wd = coef[_LR], coef[_MU], coef[_WD]
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


def _nesterov(p, g, v, coef):
    # NumPy's order: p -= lr * g, then p -= (lr * mu) * v
    lr, mu, wd, lr_mu = coef[_LR], coef[_MU], coef[_WD], coef[_LR_MU]
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


def _finite(a):
    # One pass over the bits: an exponent of all ones means Inf or NaN. A max over integers vectorizes
    # (a float reduction would not, without fastmath).
    if a.itemsize == 4:
        bits32, mask32 = a.view(np.uint32), np.uint32(0x7F800000)
        m32 = np.uint32(0)
        for i in range(bits32.shape[0]):
            m32 = max(m32, bits32[i] & mask32)
        return m32 != mask32
    bits64, mask64 = a.view(np.uint64), np.uint64(0x7FF0000000000000)
    m64 = np.uint64(0)
    for i in range(bits64.shape[0]):
        m64 = max(m64, bits64[i] & mask64)
    return m64 != mask64


def make_step(dtype, *, momentum: float, nesterov: bool, weight_decay: float):
    """The fused SGD update for one configuration: a function ``step(p, g, v, lr)`` that updates in
    place exactly as ``SGD._step_block`` does with NumPy (same operations, same order).

    The loop is chosen here, once. ``p``, ``g`` and ``v`` must be writable, 1-D, contiguous NumPy
    arrays of `dtype` (float32 or float64); anything else raises ``TypeError`` and changes nothing.
    ``v`` is not touched when ``momentum == 0``. Not thread-safe: the step keeps its scalars in one
    small array.
    """
    loops = _compiled or _loops()
    # NumPy casts a Python scalar to the array's dtype before it multiplies; so does this assignment
    coef = np.array([0.0, momentum, weight_decay, 0.0], dtype=dtype)
    if momentum == 0:
        sgd = loops.sgd

        def step(p, g, v, lr):
            coef[_LR] = lr
            sgd(p, g, coef)
    elif nesterov:
        nest = loops.nesterov

        def step(p, g, v, lr):
            coef[_LR], coef[_LR_MU] = lr, lr * momentum  # NumPy multiplies by the Python float lr * mu
            nest(p, g, v, coef)
    else:
        mom = loops.momentum

        def step(p, g, v, lr):
            coef[_LR] = lr
            mom(p, g, v, coef)
    return step


def all_finite(a) -> bool:
    """True when the float array `a` holds no NaN or Inf.

    Where this process has loaded the fused loops (a fused optimizer did) and `a` is a 1-D,
    contiguous float32 or float64 NumPy array: one pass over the bits, looking for an exponent of all
    ones, about 1.5x faster than two float reductions on 1e7 elements (as fast below 1e6). Otherwise
    min and max, which propagate NaN (and +-Inf is an extreme itself): two reductions without the
    temporary array of ``isfinite(a).all()``. The check never loads Numba itself: a worker that only
    checks its pushes would pay Numba's load (about 1.7 s) for nothing.
    """
    loops = _compiled
    if loops is not None and type(a) is np.ndarray:
        try:
            return loops.finite(a)
        except TypeError:  # not a dtype and layout the loop is compiled for
            pass
    return bool(np.isfinite(a.max()) and np.isfinite(a.min())) if a.size else True


def warm_up(dtype=np.float32) -> bool:
    """Import Numba and load every loop now (compiled for their signatures, or from Numba's cache), so
    that the first real step does not pay it inside a timed run. True when the fused loops are
    available for `dtype`."""
    return np.dtype(dtype) in (np.float32, np.float64) and (_compiled or _loops()) is not None
