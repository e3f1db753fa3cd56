"""Predict each worker's next R push times from its push history (ElasticBSP, ICDM 2019, Sec. 4.2).

The paper's predictor assumes a worker keeps its most recent iteration interval: its k-th next push is
``t_last + k · interval`` with ``interval = t_last − t_second_last`` (rule ``"last"``). Rule ``"ema"``
uses an exponential moving average of the intervals instead, which tolerates jitter; rule ``"median"``
the median of the worker's last :data:`MEDIAN_WINDOW` intervals, which also ignores a single outlier.
An interval measured once is off by its jitter, and the k-th prediction by k times that, so a rule
that averages several intervals cuts the error that grows with the lookahead (docs/simulation.md,
"ZipLine under uncertainty", measures it).

Only intervals between two pushes of the same *monitoring phase* are measured: :meth:`reset` (called
when a barrier releases) forgets the last push time, so the interval that spans the barrier — which
includes the time the worker was held — is never taken for an iteration time. The EMA itself is kept
across resets (it is the smoothed history), and so are the median's recent intervals.

Overdue workers (``predict(..., now=t)``): at time ``now`` a worker whose predicted next push
``t_last + interval`` already lies in the past has not pushed yet, so its iteration in progress is
longer than the interval. Taken from the decision time, its interval is at least ``now − t_last``;
``now`` widens the interval of such a worker to that, and its k-th push is predicted at
``t_last + k · (now − t_last)`` (the first at ``now``). A worker that entered a slow phase is the usual
cause (docs/simulation.md, "Unseen seeds, 1,024 workers"); the paper's predictor has no ``now``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence

import numpy as np

RULES = ("last", "ema", "median")

#: intervals the ``"median"`` rule takes the median of
MEDIAN_WINDOW = 5


class PushPredictor:
    """Per-worker push history and the predicted times of the next pushes.

    Parameters
    ----------
    workers : int
        Number of workers, indexed 0..workers-1.
    rule : {"last", "ema", "median"}
        ``"last"``: the most recent interval (the paper). ``"ema"``: an exponential moving average of
        the intervals, ``ema ← alpha · interval + (1 − alpha) · ema`` (the first interval seeds it).
        ``"median"``: the median of the last :data:`MEDIAN_WINDOW` intervals.
    ema_alpha : float
        Weight of the newest interval for ``"ema"``, in (0, 1].
    """

    def __init__(self, workers: int, rule: str = "last", ema_alpha: float = 0.5):
        if workers < 1:
            raise ValueError(f"PushPredictor needs at least one worker, got {workers}")
        if rule not in RULES:
            raise ValueError(f"predictor rule must be one of {RULES}, got {rule!r}")
        if not 0.0 < ema_alpha <= 1.0:
            raise ValueError(f"ema_alpha must be in (0, 1], got {ema_alpha}")
        self.workers = workers
        self.rule = rule
        self.ema_alpha = float(ema_alpha)
        # Python lists, not arrays: the policy reads and writes one worker per push
        self._last = [math.nan] * workers       # time of the latest push since the reset
        self._interval = [math.nan] * workers   # latest interval since the reset
        self._ema = [math.nan] * workers        # smoothed interval, kept across resets
        self._pushes = [0] * workers
        self._recent = [deque(maxlen=MEDIAN_WINDOW) for _ in range(workers)] if rule == "median" else None
        self._median = [math.nan] * workers     # median of _recent, kept with it

    def observe(self, worker: int, t: float) -> None:
        """Record a push of ``worker`` at time ``t`` (seconds, non-decreasing per worker)."""
        self._check(worker)
        last = self._last[worker]
        if last == last:  # not NaN: a push since the reset
            interval = t - last
            if interval < 0:
                raise ValueError(f"worker {worker} pushed at t={t}, before its previous push at t={last}")
            self._interval[worker] = interval
            ema = self._ema[worker]
            a = self.ema_alpha
            self._ema[worker] = interval if ema != ema else a * interval + (1.0 - a) * ema
            if self._recent is not None:
                recent = self._recent[worker]
                recent.append(interval)
                self._median[worker] = statistics.median(recent)
        self._last[worker] = t
        self._pushes[worker] += 1

    def reset(self, worker: int | None = None) -> None:
        """Start a new monitoring phase for ``worker`` (all workers when None)."""
        if worker is None:
            self._last = [math.nan] * self.workers
            self._interval = [math.nan] * self.workers
            self._pushes = [0] * self.workers
            return
        w = self._check(worker)
        self._last[w] = self._interval[w] = math.nan
        self._pushes[w] = 0

    def restart(self, worker: int, t: float) -> None:
        """``worker`` was released at ``t`` after being held: its next interval is measured from ``t``,
        so the time it was held is not taken for an iteration time (its rule's state is kept)."""
        self._last[self._check(worker)] = t

    def pushes(self, worker: int) -> int:
        """Pushes of ``worker`` observed since its last reset."""
        return self._pushes[self._check(worker)]

    def ready(self, worker: int, min_pushes: int = 2) -> bool:
        """Whether ``worker`` pushed ``min_pushes`` times since its reset and has an interval to use."""
        w = self._check(worker)
        return self._pushes[w] >= min_pushes and not math.isnan(self._rate(w))

    def interval(self, worker: int) -> float:
        """The interval (seconds per iteration) the rule predicts with; NaN when none is known."""
        return self._rate(self._check(worker))

    def latest_interval(self, worker: int) -> float:
        """The most recent interval of ``worker`` since its reset (seconds; NaN when none)."""
        return self._interval[self._check(worker)]

    def predict(self, workers: Sequence[int], R: int, first: int = 1, now: float | None = None) -> np.ndarray:
        """Predicted times of pushes k = first .. first+R−1 after each worker's latest push.

        Parameters
        ----------
        workers : sequence of int
            The rows, in this order.
        R : int
            Lookahead: pushes per worker.
        first : int
            1 (default) predicts future pushes only; 0 includes the latest push itself, as the
            authors' reference code does.
        now : float, optional
            The decision time (seconds). When given, a worker overdue at ``now`` (its latest push plus
            its interval lies before it) is predicted with the interval ``now − t_last`` (see the
            module docstring). None (default): the rule's interval as it is.

        Returns
        -------
        numpy.ndarray
            float64, shape (len(workers), R), rows non-decreasing.
        """
        if R < 1:
            raise ValueError(f"lookahead R must be >= 1, got {R}")
        rows = [self._check(w) for w in workers]
        last = np.array([self._last[w] for w in rows], dtype=np.float64)
        rate = np.array([self._rate(w) for w in rows], dtype=np.float64)
        unknown = np.flatnonzero(np.isnan(last) | np.isnan(rate))
        if unknown.size:
            raise ValueError(f"no push interval known yet for worker {int(rows[unknown[0]])} "
                             f"(it needs two pushes since its last reset)")
        if now is not None:
            # the iteration in progress has lasted now − last already: it is at least that long
            rate = np.maximum(rate, now - last)
        k = np.arange(first, first + R, dtype=np.float64)
        return last[:, None] + rate[:, None] * k[None, :]

    def _rate(self, w: int) -> float:
        if self.rule == "last":
            return self._interval[w]
        # the EMA and the median are only trusted once this phase measured an interval of its own
        if math.isnan(self._interval[w]):
            return math.nan
        return self._ema[w] if self.rule == "ema" else self._median[w]

    def _check(self, worker: int) -> int:
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker index {worker} out of range 0..{self.workers - 1}")
        return int(worker)
