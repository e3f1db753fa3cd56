"""Standardisation with the training split's statistics.

Statistics are taken per entry of axis 1 of ``x`` (shape ``(N, C, ...)``),
reduced over the samples and every other axis: per channel for images
``(N, C, H, W)``, per feature for vectors ``(N, D)``. Single-channel images (the
digits, MNIST) thus get one global mean and standard deviation.
"""

from __future__ import annotations

import numpy

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


def standardize(x_train: numpy.ndarray, x_test: numpy.ndarray):
    """Standardise both splits in place with the training split's statistics.

    Constant channels or features (std 0, e.g. a feature that is the same in
    every training sample) are divided by 1 instead, so they become 0 rather
    than NaN.

    Parameters
    ----------
    x_train, x_test : numpy.ndarray
        float32 arrays ``(N, C, ...)``, modified in place.

    Returns
    -------
    mean, std : numpy.ndarray
        The float32 statistics used, shape ``(C,)`` (std with zeros replaced by 1).
    """
    mean, std = channel_stats(x_train)
    std[std == 0.0] = 1.0
    shape = (1, -1) + (1,) * (x_train.ndim - 2)
    mean32 = mean.astype(numpy.float32)
    std32 = std.astype(numpy.float32)
    for x in (x_train, x_test):
        for start in range(0, x.shape[0], CHUNK):
            block = x[start:start + CHUNK]
            block -= mean32.reshape(shape)
            block /= std32.reshape(shape)
    return mean32, std32
