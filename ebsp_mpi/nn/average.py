"""The mean of a BSP round's gradients, in one place for every code that forms it.

The parameter server (``runtime.servers.server``), the single-process oracle (``reference``) and the benchmark
of the server's work (``bench.ps``) all call :func:`round_mean`, so BSP over MPI and the oracle do the
same float operations in the same order (docs/design.md, "Synchronization models": BSP equals the
reference trainer with ``sync.workers = n`` up to float summation order — here, bit for bit).
"""

from __future__ import annotations

import numpy as np


def round_mean(grads: list, out):
    """The mean of `grads`, summed in list order (worker order), into `out`.

    Parameters
    ----------
    grads : list of float32 arrays of one shape (NumPy or CuPy)
        The round's gradients (or the same chunk of each), in worker order.
    out : array or None
        Where the mean goes; may be None when `grads` holds a single gradient.

    Returns
    -------
    array
        `out`; or, for a single gradient, that gradient itself (its mean, bit for bit, with no copy).
    """
    if len(grads) == 1:
        return grads[0]
    np.add(grads[0], grads[1], out=out)  # NumPy dispatches to CuPy for device arrays
    for g in grads[2:]:
        out += g
    out *= np.float32(1.0 / len(grads))
    return out
