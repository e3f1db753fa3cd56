"""Standardisation with the training split's statistics.

Statistics are taken per entry of axis 1 of ``x`` (shape ``(N, C, ...)``),
reduced over the samples and every other axis: per channel for images
``(N, C, H, W)``, per feature for vectors ``(N, D)``. Single-channel images (the
digits, MNIST) thus get one global mean and standard deviation.
"""

from __future__ import annotations

import numpy

from .errors import DatasetError
from .finite import first_nonfinite

# Samples per chunk: bounds the float64 temporaries to a few tens of MiB even
# for CIFAR-10 (50 000 x 3072 values).
CHUNK = 2048


def channel_stats(x: numpy.ndarray, chunk: int = CHUNK):
    """Mean and standard deviation per entry of axis 1, over all other axes.

    Two passes over chunks of samples, sums accumulated in float64 (the one-pass
    E[x^2] - E[x]^2 loses digits when the mean is large against the spread).
    Deviations are formed in float32 around the float32-rounded mean ``m32``
    (a float64 copy of every chunk would take five times as long); the exact
    variance follows as ``E[(x - m32)^2] - (mean - m32)^2``.

    Parameters
    ----------
    x : numpy.ndarray
        float32 array of shape ``(N, C, ...)`` with ``N >= 1``.
    chunk : int
        Samples per chunk.

    Returns
    -------
    mean, std : numpy.ndarray
        float64 arrays of shape ``(C,)``. A constant channel has std 0.
    """
    axes = (0,) + tuple(range(2, x.ndim))
    count = x.size // x.shape[1]
    total = numpy.zeros(x.shape[1], dtype=numpy.float64)
    for start in range(0, x.shape[0], chunk):
        total += x[start:start + chunk].sum(axis=axes, dtype=numpy.float64)
    mean = total / count
    centre = mean.astype(x.dtype)
    broadcast = centre.reshape((1, -1) + (1,) * (x.ndim - 2))
    squares = numpy.zeros_like(total)
    for start in range(0, x.shape[0], chunk):
        deviation = x[start:start + chunk] - broadcast
        deviation *= deviation
        squares += deviation.sum(axis=axes, dtype=numpy.float64)
    variance = squares / count - numpy.square(mean - centre.astype(numpy.float64))
    return mean, numpy.sqrt(numpy.maximum(variance, 0.0))


def standardize(x_train: numpy.ndarray, x_test: numpy.ndarray, source: str = "data"):
    """Standardise both splits in place with the training split's statistics.

    Constant channels or features (std 0, e.g. a feature that is the same in
    every training sample) are divided by 1 instead, so they become 0 rather
    than NaN.

    Parameters
    ----------
    x_train, x_test : numpy.ndarray
        float32 arrays ``(N, C, ...)`` of finite values, modified in place.
    source : str
        Names the data in error messages, e.g. ``"data.path = x.h5"``.

    Returns
    -------
    mean, std : numpy.ndarray
        The float32 statistics used, shape ``(C,)`` (std with zeros replaced by 1).

    Raises
    ------
    DatasetError
        When standardising would make a value NaN or Inf: a training feature spread beyond what
        float32 squares hold (about 1.8e19), or a test sample too far outside the training range.
    """
    # overflow is checked below and named in one line, not left to NumPy's RuntimeWarning
    with numpy.errstate(over="ignore", invalid="ignore"):
        mean, std = channel_stats(x_train)
        _require_finite_std(std, x_train.ndim, source)
        mean32 = mean.astype(numpy.float32)
        std32 = std.astype(numpy.float32)
        # after the cast: a float64 std below float32's smallest number would divide by 0
        std32[std32 == 0.0] = 1.0
        shape = (1, -1) + (1,) * (x_train.ndim - 2)
        for x in (x_train, x_test):
            for start in range(0, x.shape[0], CHUNK):
                block = x[start:start + CHUNK]
                block -= mean32.reshape(shape)
                block /= std32.reshape(shape)
    # A finite std bounds every training value's distance to the mean, so only the test split can
    # overflow here (a feature nearly constant in training and large in a test sample).
    index = first_nonfinite(x_test)
    if index is not None:
        raise DatasetError(f"{source}: test sample {index} becomes NaN or Inf when standardised with the "
                           f"training split's mean and std (it lies far outside the training range of a "
                           f"{_axis_word(x_test.ndim)}); rescale the data or set data.normalize = false")
    return mean32, std32


def _axis_word(ndim: int) -> str:
    return "feature" if ndim == 2 else "channel"


def _require_finite_std(std: numpy.ndarray, ndim: int, source: str) -> None:
    """Refuse a channel whose squared deviations overflowed float32 in :func:`channel_stats`."""
    bad = numpy.flatnonzero(~numpy.isfinite(std))
    if bad.size:
        raise DatasetError(f"{source}: {_axis_word(ndim)} {int(bad[0])} of the training inputs spreads too "
                           f"widely to standardise in float32 (deviations from its mean beyond about 1.8e19); "
                           f"rescale the data or set data.normalize = false")
