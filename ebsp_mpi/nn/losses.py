"""Softmax cross-entropy, computed stably (log-sum-exp with the row maximum subtracted)."""

from __future__ import annotations

import sys

import numpy


def _array_module(a):
    """``numpy`` or ``cupy``, whichever ``a`` belongs to (a CuPy array means CuPy is imported)."""
    if type(a).__module__.split(".")[0] == "cupy":
        return sys.modules["cupy"]
    return numpy


def _check(logits, labels):
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise ValueError(f"softmax cross-entropy: need logits (N, classes) and labels (N,), got "
                         f"{tuple(logits.shape)} and {tuple(labels.shape)}")


def log_softmax(logits):
    """Row-wise ``log softmax`` of ``(N, classes)`` logits, without overflow."""
    xp = _array_module(logits)
    shifted = logits - logits.max(axis=1, keepdims=True)
    shifted -= xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
    return shifted


def softmax_cross_entropy(logits, labels):
    """Mean softmax cross-entropy of a batch and its gradient w.r.t. the logits.

    Parameters
    ----------
    logits : xp.ndarray, shape (N, classes)
    labels : xp.ndarray of int, shape (N,)
        Class indices in ``[0, classes)``.

    Returns
    -------
    loss : float
        ``mean_n( logsumexp(logits[n]) - logits[n, labels[n]] )``.
    dlogits : xp.ndarray, shape (N, classes)
        ``(softmax(logits) - onehot(labels)) / N``, the gradient of ``loss``.
    """
    xp = _array_module(logits)
    labels = xp.asarray(labels)
    _check(logits, labels)
    n = logits.shape[0]
    rows = xp.arange(n)
    logp = log_softmax(logits)
    loss = -float(logp[rows, labels].sum()) / n
    grad = xp.exp(logp, out=logp)
    grad[rows, labels] -= 1          # one label per row: no repeated index, a plain scatter is safe
    grad *= 1.0 / n
    return loss, grad


def cross_entropy_sum(logits, labels):
    """Summed cross-entropy and number of correct argmax predictions, as 0-d device arrays.

    Used for evaluation: no gradient, and no host synchronisation until the caller converts.
    """
    xp = _array_module(logits)
    labels = xp.asarray(labels)
    _check(logits, labels)
    logp = log_softmax(logits)
    loss = -logp[xp.arange(logits.shape[0]), labels].sum()
    correct = (xp.argmax(logits, axis=1) == labels).sum()
    return loss, correct
