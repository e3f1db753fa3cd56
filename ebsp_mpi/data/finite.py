"""Refuse inputs with NaN or Inf when a dataset is loaded, not after training on them.

A non-finite input makes every gradient of its batch non-finite; the server rejects such pushes
(docs/design.md, "Launch and failure"), so a run on such data trains nothing and says so only in its
rejected-push count. One vectorised pass over the inputs at load time names the first bad sample.
"""

from __future__ import annotations

import numpy

from .errors import DatasetError

#: Bytes of input checked at a time: bounds the boolean temporary of ``isfinite`` on large arrays.
CHUNK_BYTES = 64 << 20

#: What a non-finite float32 input can come from, for the error message.
CAUSE = "holds NaN or Inf (or a number beyond float32's range, about +-3.4e38)"


def first_nonfinite(x: numpy.ndarray, chunk_bytes: int = CHUNK_BYTES) -> int | None:
    """Index along axis 0 of the first sample that holds a NaN or an Inf, or None if there is none.

    Parameters
    ----------
    x : numpy.ndarray
        Samples along axis 0, any shape; integer and boolean arrays are finite by construction.
    chunk_bytes : int
        Bytes of ``x`` checked at a time.
    """
    if x.dtype.kind not in "fc" or x.size == 0:
        return None
    rows = max(1, chunk_bytes // max(1, x[0].nbytes))
    for start in range(0, x.shape[0], rows):
        finite = numpy.isfinite(x[start:start + rows])
        if not finite.all():
            per_sample = finite.reshape(finite.shape[0], -1).all(axis=1)
            return start + int(numpy.argmin(per_sample))
    return None


def require_finite(x: numpy.ndarray, source: str, key: str) -> None:
    """Raise :class:`DatasetError` naming ``source``, ``key`` and the first sample with NaN or Inf.

    Parameters
    ----------
    x : numpy.ndarray
        The inputs, samples along axis 0.
    source : str
        Where they come from, e.g. ``"data.path = x.h5"``.
    key : str
        Their name there, e.g. ``"x"`` or ``"x_test"``.
    """
    index = first_nonfinite(x)
    if index is not None:
        raise DatasetError(f"{source}: {key}[{index}] {CAUSE}; every input must be a finite number: "
                           f"fix or drop that sample")
