"""The two passes over every gradient on the CPU: the server's SGD update, fused into one compiled
loop, and the worker's NaN/Inf check before it sends (one BLAS dot product, :func:`all_finite`).

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
import math
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

        def lazy(fn):
            # compiled per number of gradients on first use (a tuple's length is part of its type)
            return numba.njit(cache=True, nogil=True, boundscheck=False)(fn)

        global _mean_at
        _mean_at = numba.njit(inline="always")(_mean_at_py)
        _compiled = SimpleNamespace(sgd=jit("void(T[::1], T[::1], T[::1])", _sgd),
                                    momentum=jit("void(T[::1], T[::1], T[::1], T[::1])", _momentum),
                                    nesterov=jit("void(T[::1], T[::1], T[::1], T[::1])", _nesterov),
                                    mean_sgd=lazy(_mean_sgd), mean_momentum=lazy(_mean_momentum),
                                    mean_nesterov=lazy(_mean_nesterov))
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


# -- a BSP round's step: the mean of the members' gradients, fused into the update ------------------
#
# ``round_mean`` then the step would pass over the data five times more than needed (sum, scale,
# then read the mean again); these loops form each element's mean where they use it, with exactly
# round_mean's operations: summed in worker order, then scaled by 1/k as a float32, in the array's
# dtype. ``_INV`` is that scale.

_INV = 4


def _mean_at_py(gs, i, inv):
    s = gs[0][i] + gs[1][i]
    for j in range(2, len(gs)):
        s = s + gs[j][i]
    return s * inv


_mean_at = _mean_at_py  # compiled to an inlined function with the loops (_loops)


def _mean_sgd(p, gs, coef):
    lr, wd, inv = coef[_LR], coef[_WD], coef[_INV]
    if wd == 0:
        for i in range(p.shape[0]):
            p[i] = p[i] - _mean_at(gs, i, inv) * lr
    else:
        for i in range(p.shape[0]):
            gi = p[i] * wd + _mean_at(gs, i, inv)
            p[i] = p[i] - gi * lr


def _mean_momentum(p, gs, v, coef):
    lr, mu, wd, inv = coef[_LR], coef[_MU], coef[_WD], coef[_INV]
    if wd == 0:
        for i in range(p.shape[0]):
            vi = v[i] * mu + _mean_at(gs, i, inv)
            v[i] = vi
            p[i] = p[i] - vi * lr
    else:
        for i in range(p.shape[0]):
            gi = p[i] * wd + _mean_at(gs, i, inv)
            vi = v[i] * mu + gi
            v[i] = vi
            p[i] = p[i] - vi * lr


def _mean_nesterov(p, gs, v, coef):
    lr, mu, wd, lr_mu, inv = coef[_LR], coef[_MU], coef[_WD], coef[_LR_MU], coef[_INV]
    if wd == 0:
        for i in range(p.shape[0]):
            gi = _mean_at(gs, i, inv)
            vi = v[i] * mu + gi
            v[i] = vi
            p[i] = (p[i] - gi * lr) - vi * lr_mu
    else:
        for i in range(p.shape[0]):
            gi = p[i] * wd + _mean_at(gs, i, inv)
            vi = v[i] * mu + gi
            v[i] = vi
            p[i] = (p[i] - gi * lr) - vi * lr_mu


def make_mean_step(dtype, *, momentum: float, nesterov: bool, weight_decay: float):
    """The fused step on a round's mean: a function ``step(p, grads, v, lr)`` that updates in place
    exactly as ``round_mean`` of `grads` (a tuple of at least two gradients) then :func:`make_step`'s
    step would. Every array must be a writable, 1-D, contiguous NumPy array of `dtype`: the caller
    checks (a tuple's type is not checked by a signature; each length compiles once, then from the
    cache). Not thread-safe, as :func:`make_step`."""
    loops = _compiled or _loops()
    coef = np.array([0.0, momentum, weight_decay, 0.0, 0.0], dtype=dtype)
    kernel = loops.mean_sgd if momentum == 0 else loops.mean_nesterov if nesterov else loops.mean_momentum

    def step(p, grads, v, lr):
        # the float32 scale round_mean multiplies by, cast to the array's dtype as NumPy does
        coef[_LR], coef[_LR_MU], coef[_INV] = lr, lr * momentum, np.float32(1.0 / len(grads))
        if momentum == 0:
            kernel(p, grads, coef)
        else:
            kernel(p, grads, v, coef)
    return step


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

    A 1-D float32 or float64 NumPy array: its dot product with zeros, one BLAS pass, a block of
    :data:`CHECK_BLOCK` values at a time against one block of zeros made at import. Each product is 0
    for a finite value and NaN for a NaN or an Inf (0 * Inf is NaN), so the sum is finite exactly when
    every value is; it never overflows. The zeros stay one block, whatever the size of `a`: zeros as
    long as the gradient were an allocation the size of the model, which OSDP's peak memory counted
    against its plan (+47 % at a 24 MiB limit). Block by block is as fast as one dot (0.94 against
    1.17 ms on 3.5e6 float32: the block stays in cache), and faster than min and max. Otherwise (other
    dtypes, more dimensions, device arrays) min and max, which propagate NaN (and +-Inf is an extreme
    itself): two reductions without the temporary array of ``isfinite(a).all()``.
    """
    if type(a) is np.ndarray and a.ndim == 1 and (a.dtype == np.float32 or a.dtype == np.float64):
        zeros, n = _ZEROS[a.dtype], a.size
        with np.errstate(invalid="ignore"):  # 0 * Inf: a NaN product is the answer, not a warning
            total = 0.0
            for start in range(0, n - CHECK_BLOCK + 1, CHECK_BLOCK):
                total += a[start:start + CHECK_BLOCK].dot(zeros)
            rest = n % CHECK_BLOCK
            if rest:
                total += a[n - rest:].dot(zeros[:rest])
            # math.isfinite on the scalar: NumPy's isfinite and bool() cost 3.5 of 9 us on 9,738 float32
            return math.isfinite(total)
    return bool(np.isfinite(a.max()) and np.isfinite(a.min())) if a.size else True


#: values :func:`all_finite` checks per BLAS call: its zeros are one block of this many (64 KiB of float32)
CHECK_BLOCK = 16384
# made at import, before any run measures its peak: a fixed 192 KiB, whatever the model
_ZEROS = {np.dtype(np.float32): np.zeros(CHECK_BLOCK, np.float32),
          np.dtype(np.float64): np.zeros(CHECK_BLOCK, np.float64)}


def warm_up(dtype=np.float32) -> bool:
    """Import Numba and load every loop now (compiled for their signatures, or from Numba's cache), so
    that the first real step does not pay it inside a timed run. True when the fused loops are
    available for `dtype`."""
    return np.dtype(dtype) in (np.float32, np.float64) and (_compiled or _loops()) is not None
