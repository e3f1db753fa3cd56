"""The error scale σ_i(k) of ElasticBSP's push-time predictions, learned online.

At a barrier decision the policy predicts worker i's k-th next push (k = 1..R, ``M[i, k-1]``); until
the worker is held at its r_i-th, each of its pushes shows how far off the prediction for that k was.
The error of a prediction k pushes ahead grows with k (the jitter of k iterations adds up, and an
interval estimated from one iteration is off by k times its own error), so the scale is kept per
worker *and* per lookahead k:

- ``E[i, k]``: an exponential moving average of worker i's squared errors at k (weight ``alpha``; the
  first error seeds it), and ``c[i, k]`` how many errors it has seen (counted up to ``1/alpha``, the
  EMA's memory);
- ``P[k]``: the pooled prior, the mean of ``E[·, k]`` over the workers that have seen k. For a k that
  nobody has seen yet (a barrier holds a worker at r_i <= R, so the observed k form a prefix 1..K) it
  is extrapolated as ``P[K] · (k/K)**γ``, γ the growth of the variance from k = 1 to K clipped to
  [1, 2] (1: independent jitter adds up; 2: the interval's error, multiplied by k), 2 while K = 1;
- ``ρ_i``: how noisy worker i is against the pool, the mean of ``E[i, k] / P[k]`` over its seen k,
  weighted by ``c`` and shrunk towards 1 with ``prior_weight`` pseudo-observations;
- ``σ_i(k)² = w · E[i, k] + (1 − w) · ρ_i · P[k]`` with ``w = c / (c + prior_weight)``: a worker's own
  errors take over from the pooled prior as its history grows.

Before any error was seen every σ is 0, so robust ZipLine starts as the paper's. All times in seconds.
The policy calls :meth:`observe` once per barrier with the errors of all its members (vectorised) and
:meth:`sigma` once per decision, so the per-push cost of the policy is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class PredictionErrorModel:
    """Per-worker, per-lookahead error scale of the push-time predictions.

    Parameters
    ----------
    workers : int
        Number of workers, indexed 0..workers-1.
    lookahead : int
        R: the largest k (pushes ahead) a prediction is made for.
    alpha : float
        EMA weight of the newest squared error, in (0, 1].
    prior_weight : float
        Pseudo-observations of the pooled prior (> 0): with c own errors at k, a worker's own EMA has
        weight ``c / (c + prior_weight)``.
    """

    def __init__(self, workers: int, lookahead: int, alpha: float = 0.2, prior_weight: float = 3.0):
        if workers < 1 or lookahead < 1:
            raise ValueError(f"PredictionErrorModel needs workers >= 1 and lookahead >= 1, got {workers}, {lookahead}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"PredictionErrorModel alpha must be in (0, 1], got {alpha}")
        if not (math.isfinite(prior_weight) and prior_weight > 0):
            raise ValueError(f"PredictionErrorModel prior_weight must be finite and > 0, got {prior_weight}")
        self.workers, self.lookahead = int(workers), int(lookahead)
        self.alpha, self.prior_weight = float(alpha), float(prior_weight)
        self._memory = math.ceil(1.0 / self.alpha)
        self._E = np.zeros((self.workers, self.lookahead))
        self._c = np.zeros((self.workers, self.lookahead))

    def observe(self, worker, k, error) -> None:
        """Record prediction errors (actual − predicted push time, seconds).

        Parameters
        ----------
        worker, k, error : array_like, same length
            Worker index, pushes ahead (1-based, 1..lookahead) and error of each observation; each
            (worker, k) pair at most once per call (one barrier).
        """
        worker = np.asarray(worker, dtype=np.int64)
        col = np.asarray(k, dtype=np.int64) - 1
        error = np.asarray(error, dtype=np.float64)
        if not (worker.shape == col.shape == error.shape):
            raise ValueError("PredictionErrorModel.observe: worker, k and error must have the same length")
        if worker.size == 0:
            return
        if worker.min() < 0 or worker.max() >= self.workers or col.min() < 0 or col.max() >= self.lookahead:
            raise ValueError(f"PredictionErrorModel.observe: a worker outside 0..{self.workers - 1} or a k "
                             f"outside 1..{self.lookahead}")
        if not np.all(np.isfinite(error)):
            raise ValueError("PredictionErrorModel.observe: errors must be finite")
        squared = error * error
        seen = self._c[worker, col] > 0
        old = self._E[worker, col]
        self._E[worker, col] = np.where(seen, old + self.alpha * (squared - old), squared)
        self._c[worker, col] = np.minimum(self._c[worker, col] + 1, self._memory)

    def pooled(self) -> np.ndarray:
        """``P[k]`` for k = 1..lookahead (seconds², zeros before any error was seen)."""
        seen = self._c > 0
        counts = seen.sum(axis=0)
        K = int(np.count_nonzero(counts))  # the seen k are a prefix (see the module docstring)
        P = np.zeros(self.lookahead)
        if K == 0:
            return P
        P[:K] = (self._E[:, :K] * seen[:, :K]).sum(axis=0) / np.maximum(counts[:K], 1)
        if K < self.lookahead:
            gamma = 2.0
            if K >= 2 and P[0] > 0 and P[K - 1] > 0:
                gamma = float(np.clip(math.log(P[K - 1] / P[0]) / math.log(K), 1.0, 2.0))
            k = np.arange(K + 1, self.lookahead + 1)
            P[K:] = P[K - 1] * (k / K) ** gamma
        return P

    def sigma(self, workers: Sequence[int] | np.ndarray, R: int | None = None) -> np.ndarray:
        """σ_i(k) for the given workers (rows) and k = 1..R (columns), seconds, shape (len, R)."""
        R = self.lookahead if R is None else int(R)
        if not 1 <= R <= self.lookahead:
            raise ValueError(f"PredictionErrorModel.sigma: R must be in 1..{self.lookahead}, got {R}")
        rows = np.asarray(workers, dtype=np.int64)
        P = self.pooled()[:R]
        E, c = self._E[rows, :R], self._c[rows, :R]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where((c > 0) & (P > 0), E / P, 0.0)
        rho = (self.prior_weight + (c * ratio).sum(axis=1)) / (self.prior_weight + c.sum(axis=1))
        w = c / (c + self.prior_weight)
        return np.sqrt(w * E + (1.0 - w) * rho[:, None] * P[None, :])

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the EMA ``E`` and the counts ``c`` (for tests and studies)."""
        return self._E.copy(), self._c.copy()
