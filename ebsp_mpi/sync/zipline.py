"""ZipLine: choose each worker's barrier among its predicted next pushes.

ElasticBSP (Zhao et al., ICDM 2019, Sec. 4) predicts, for each of n workers, the times of its next R
pushes: a matrix ``M`` of shape (n, R) whose rows are non-decreasing. A barrier picks one entry per
row (worker i is held at its ``index[i] + 1``-th next push); the workers that arrive first wait until
the last one arrives, so the cost of a choice is its *spread*, ``max - min`` of the chosen times.
ZipLine (Zhao et al., Machine Learning 2021, Sec. 4) finds the choice of least spread.

The tunable form adds a penalty ``λ · (barrier_time - now)`` to the spread: a larger λ prefers an
earlier barrier (a shorter superstep, hence less staleness) over a slightly smaller wait.

Three implementations return identical results, tie rule included:

- :func:`zipline` — production: the one-pass scan over the merged timeline, vectorised with NumPy
  (sorting dominates: O(nR log nR)).
- :func:`zipline_heap` — the same scan written plainly with :mod:`heapq` (the benchmark peer).
- :func:`zipline_brute` — all R**n combinations (the test oracle).

Robust ZipLine (:func:`zipline_robust`, oracle :func:`zipline_robust_brute`) takes each prediction as
an interval ``[M − z·σ, M + z·σ]`` (σ: the learned error scale of :mod:`.prediction_error`) and
minimises (largest upper end) − (smallest lower end); see "Robust ZipLine" below.

Definitions shared by all three
-------------------------------
Let ``T`` range over the entries of ``M``. The *canonical set at T* takes from each row i its latest
entry not after T, ``j_i(T) = max{j : M[i, j] <= T}`` (with equal timestamps in a row, the largest
column). It exists when ``T >= max_i M[i, 0]``; its maximum is T and its minimum is
``L(T) = min_i M[i, j_i(T)]``. Every choice whose maximum is T is dominated entry-wise by the
canonical set at T, so the optimum is attained by a canonical set.

The cost of a choice with spread ``s`` and maximum ``b`` is ``s`` when ``penalty == 0`` and
``s + penalty * (b - now)`` otherwise (evaluated in that order, in float64, by all three, so they agree
to the bit). ``now`` defaults to ``M.min()``, the earliest predicted push, so the penalty term is never
negative; the policy passes the decision time instead.

Tie rule ("the chronologically first candidate set"): among the choices of least cost, take those
with the smallest barrier time ``max``; among those, take the one whose column indices are largest
row by row — which is exactly the canonical set at that barrier time (it is the component-wise
maximum of all choices with that maximum, hence also their lexicographic maximum).

Robust ZipLine
--------------
Entry (i, k) becomes the interval ``[A[i, k], B[i, k]] = [M − z·σ, M + z·σ]``. A choice's *interval
spread* is ``max B − min A`` over the chosen entries, its barrier time ``U = max B`` (when the last
worker arrives, late side), and its cost ``interval spread + penalty · (U − now)``. The rows of A and
B need not be monotone (σ may grow faster with k than M does). For a bound U let each row take, among
its entries with ``B <= U``, the one of largest A (equal A: the largest column); call the least of
those A ``L(U)``. Every choice with ``max B = U`` has ``min A <= L(U)``, so the optimum is this
*canonical set* at the U that minimises ``U − L(U) + penalty·(U − now)``, and U ranges over the
entries of B. The tie rule is the same as above with the entry's key ``(A, column)`` in place of the
column: least cost, then least U, then the canonical set (the row-wise maximum of the keys among all
choices with ``max B <= U``, hence their lexicographic maximum). With z = 0 it is ZipLine exactly.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

#: zipline_brute refuses instances with more combinations than this (memory: 8·n bytes each).
BRUTE_LIMIT = 5_000_000


@dataclass(frozen=True)
class ZipLineResult:
    """The chosen barrier.

    Attributes
    ----------
    index : numpy.ndarray
        int64, shape (n,): the chosen column of each row of ``M`` (0-based; worker i's barrier is its
        ``index[i] + 1``-th next push when ``M`` holds pushes k = 1..R).
    spread : float
        ``max - min`` of the chosen times (seconds, or the unit of ``M``): the longest wait.
    barrier_time : float
        ``max`` of the chosen times: when the last worker is predicted to arrive.
    cost : float
        The minimised objective: ``spread`` plus ``penalty * (barrier_time - now)`` when penalty > 0.
    """

    index: np.ndarray
    spread: float
    barrier_time: float
    cost: float


def zipline(M, penalty: float = 0.0, now: float | None = None) -> ZipLineResult:
    """Least-spread barrier by the one-pass scan over the merged timeline (production form).

    The scan sweeps the merged, sorted list of all n·R predicted pushes as the window's right end T.
    At T the window's left end ``L(T)`` is the earliest entry on the merged timeline that its own row
    has not yet superseded — the first entry (in merged order) whose row successor comes after T.
    Keeping the running maximum of the successors' times along the merged order turns that into one
    ``searchsorted`` for all T at once. See the module docstring for the objective and the tie rule.

    Parameters
    ----------
    M : array_like, shape (n, R)
        Predicted push times, each row non-decreasing, all finite.
    penalty : float, optional
        λ >= 0 of the tunable ZipLine (ML 2021): cost = spread + λ·(barrier_time − now).
    now : float, optional
        Reference time of the penalty term (default ``M.min()``).

    Returns
    -------
    ZipLineResult

    Raises
    ------
    ValueError
        If ``M`` is not a non-empty 2-D finite array with non-decreasing rows, or penalty/now are bad.
    """
    M = _validated(M)
    penalty, now = _validated_penalty(M, penalty, now)

    # successor of each entry in its own row (+inf after the last): the entry is its row's latest
    # push not after T exactly while entry <= T < successor.
    successor = np.empty_like(M)
    successor[:, :-1] = M[:, 1:]
    successor[:, -1] = np.inf
    # the merged timeline; how equal timestamps are ordered does not change any result
    order = np.argsort(M, axis=None)
    timeline = M.ravel()[order]
    reach = np.maximum.accumulate(successor.ravel()[order])

    # only windows where every row has a push <= T count.
    first = int(np.searchsorted(timeline, M[:, 0].max(), side="left"))
    right = timeline[first:]
    left = timeline[np.searchsorted(reach, right, side="right")]
    cost = _cost(right - left, right, penalty, now)
    best = int(np.argmin(cost))  # first minimum: the smallest barrier time
    return _canonical(M, float(right[best]), penalty, now)


def zipline_heap(M, penalty: float = 0.0, now: float | None = None) -> ZipLineResult:
    """The same scan as :func:`zipline`, written plainly with :mod:`heapq` (O(nR log nR)).

    The rows are merged with ``heapq.merge``; a heap holds each row's current entry (superseded
    entries are dropped lazily when they surface), so its top is the window's left end.
    Parameters, result and tie rule as :func:`zipline`.
    """
    M = _validated(M)
    penalty, now = _validated_penalty(M, penalty, now)
    n, _ = M.shape
    rows = M.tolist()
    merged = heapq.merge(*([(v, i, j) for j, v in enumerate(row)] for i, row in enumerate(rows)))

    current = [-1] * n
    missing = n
    window: list[tuple[float, int, int]] = []
    best_cost = best_time = None

    def consider(T: float) -> None:
        nonlocal best_cost, best_time
        while current[window[0][1]] != window[0][2]:
            heapq.heappop(window)
        c = _cost(T - window[0][0], T, penalty, now)
        if best_cost is None or c < best_cost:  # strict: keep the earliest barrier time
            best_cost, best_time = c, T

    previous = None
    for v, i, j in merged:
        # all entries at one timestamp enter before the window ending there is judged
        if previous is not None and v != previous and missing == 0:
            consider(previous)
        if current[i] < 0:
            missing -= 1
        current[i] = j
        heapq.heappush(window, (v, i, j))
        previous = v
    consider(previous)
    return _canonical(M, best_time, penalty, now)


def zipline_brute(M, penalty: float = 0.0, now: float | None = None) -> ZipLineResult:
    """Exhaustive search over all R**n choices (the test oracle).

    Enumerates every combination of one column per row in lexicographic order, keeps those of least
    cost, then those of smallest barrier time, then the lexicographically largest index array (the
    module's tie rule, implemented here without using the canonical-set argument).

    Raises
    ------
    ValueError
        Also when R**n exceeds :data:`BRUTE_LIMIT`.
    """
    M = _validated(M)
    penalty, now = _validated_penalty(M, penalty, now)
    n, R = M.shape
    if R**n > BRUTE_LIMIT:
        raise ValueError(f"zipline_brute: R**n = {R}**{n} combinations exceeds {BRUTE_LIMIT}")

    index = np.indices((R,) * n).reshape(n, -1).T  # lexicographic order
    chosen = M[np.arange(n), index]
    high, low = chosen.max(axis=1), chosen.min(axis=1)
    cost = _cost(high - low, high, penalty, now)
    tied = np.flatnonzero(cost == cost.min())
    tied = tied[high[tied] == high[tied].min()]
    pick = tied[-1]
    return ZipLineResult(
        index=index[pick].astype(np.int64),
        spread=float(high[pick] - low[pick]),
        barrier_time=float(high[pick]),
        cost=float(cost[pick]),
    )


@dataclass(frozen=True)
class RobustZipLineResult:
    """The barrier chosen by robust ZipLine.

    Attributes
    ----------
    index : numpy.ndarray
        int64, shape (n,): the chosen column of each row (as :class:`ZipLineResult`).
    spread : float
        ``max - min`` of the chosen point predictions ``M`` (what ZipLine calls the spread).
    barrier_time : float
        ``max`` of the chosen point predictions.
    interval_spread : float
        ``max(M + z·σ) − min(M − z·σ)`` over the chosen entries: the wait the intervals allow.
    upper : float
        ``max(M + z·σ)`` over the chosen entries: the barrier time on the late side.
    cost : float
        The minimised objective: ``interval_spread`` plus ``penalty · (upper − now)`` when penalty > 0.
    """

    index: np.ndarray
    spread: float
    barrier_time: float
    interval_spread: float
    upper: float
    cost: float


def zipline_robust(M, sigma, z: float, penalty: float = 0.0, now: float | None = None) -> RobustZipLineResult:
    """Least interval spread over the predictions taken as intervals ``[M − z·σ, M + z·σ]``.

    A sweep of the bound U over the sorted upper ends, vectorised like :func:`zipline`. In each row,
    sorted by upper end, only the entries whose lower end exceeds every earlier one's ever serve as
    the row's choice (the *records*); record c serves while ``B_c <= U < S_c``, S_c being the upper end
    of its row's next record. Then ``L(U)`` is the least lower end of the records with ``S_c > U``
    (those a row has not superseded yet, the row's current one the least of them), found for every U
    at once with the running maximum of S along the records sorted by lower end, as in
    :func:`zipline`. O(nR log nR). See the module docstring for the objective and the tie rule.

    Parameters
    ----------
    M : array_like, shape (n, R)
        Predicted push times, rows non-decreasing, finite (seconds).
    sigma : array_like, shape (n, R)
        Error scale of each prediction, finite and >= 0 (seconds).
    z : float
        Width of the intervals in units of σ, finite and >= 0.
    penalty, now
        As in :func:`zipline`; the penalty weighs ``upper − now``.

    Returns
    -------
    RobustZipLineResult

    Raises
    ------
    ValueError
        For a bad ``M`` (as :func:`zipline`), a ``sigma`` of another shape, negative or not finite, or a
        bad z, penalty or now.
    """
    M, A, B = _intervals(M, sigma, z)
    penalty, now = _validated_penalty(M, penalty, now)
    n, R = M.shape
    if np.all(B[:, 1:] >= B[:, :-1]):  # the usual case (σ non-decreasing in k): rows already in order
        a, b = A, B
    else:
        rows = np.arange(n)[:, None]
        order = np.argsort(B, axis=1, kind="stable")
        a, b = A[rows, order], B[rows, order]
    # transposed, so that the accumulates run down columns, vectorised across the n rows (along
    # short rows they cost several times more per entry)
    a, b = np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)
    # a record's lower end beats every entry its row offers at a smaller or equal upper end; an entry
    # tied in B with a later record gets S = B and so never serves (it is harmless as a future entry:
    # its A exceeds everything the row offers below it)
    record = np.ones((R, n), dtype=bool)
    np.greater(a[1:], np.maximum.accumulate(a, axis=0)[:-1], out=record[1:])
    # upper end of the next record in the row: rows are sorted by B, so it is the least later one
    after = np.full((R, n), np.inf)
    if record.all():  # the usual case: every entry is a record, the next one is the next column
        after[:-1] = b[1:]
        ra, rs, rb = a.ravel(), after.ravel(), b.ravel()
    else:
        later = np.ascontiguousarray(np.where(record, b, np.inf)[::-1])
        after[:-1] = np.minimum.accumulate(later, axis=0)[::-1][1:]
        ra, rs, rb = a[record], after[record], b[record]

    by_lower = np.argsort(ra)  # the order of equal lower ends does not change L
    lower = ra[by_lower]
    reach = np.maximum.accumulate(rs[by_lower])
    # L changes only at a record's upper end; U starts where every row has an entry below it
    start = B.min(axis=1).max()
    right = np.sort(rb[rb >= start])
    left = lower[np.searchsorted(reach, right, side="right")]
    cost = _cost(right - left, right, penalty, now)
    best = int(np.argmin(cost))  # first minimum: the smallest barrier time
    return _canonical_robust(M, A, B, float(right[best]), penalty, now)


def zipline_robust_brute(M, sigma, z: float, penalty: float = 0.0, now: float | None = None) -> RobustZipLineResult:
    """All R**n choices of :func:`zipline_robust`'s problem (the test oracle).

    Keeps the choices of least cost, then those of least upper end, then the lexicographic maximum of
    the per-row keys ``(A, column)`` in row order — the tie rule, without the canonical-set argument.
    """
    M, A, B = _intervals(M, sigma, z)
    penalty, now = _validated_penalty(M, penalty, now)
    n, R = M.shape
    if R**n > BRUTE_LIMIT:
        raise ValueError(f"zipline_robust_brute: R**n = {R}**{n} combinations exceeds {BRUTE_LIMIT}")
    index = np.indices((R,) * n).reshape(n, -1).T
    lows, highs = A[np.arange(n), index], B[np.arange(n), index]
    high, low = highs.max(axis=1), lows.min(axis=1)
    cost = _cost(high - low, high, penalty, now)
    tied = np.flatnonzero(cost == cost.min())
    tied = tied[high[tied] == high[tied].min()]
    # lexsort: the last key is the primary one, so row 0's (A, column) goes last
    keys = []
    for i in reversed(range(n)):
        keys += [index[tied, i], lows[tied, i]]
    pick = tied[np.lexsort(keys)[-1]]
    chosen = M[np.arange(n), index[pick]]
    return RobustZipLineResult(index=index[pick].astype(np.int64), spread=float(chosen.max() - chosen.min()),
                               barrier_time=float(chosen.max()), interval_spread=float(high[pick] - low[pick]),
                               upper=float(high[pick]), cost=float(cost[pick]))


# -- shared pieces -----------------------------------------------------------------------------


def _cost(spread, barrier_time, penalty: float, now: float):
    """The objective, written once so that every implementation rounds identically."""
    if penalty == 0.0:
        return spread
    return spread + penalty * (barrier_time - now)


def _canonical(M: np.ndarray, T: float, penalty: float, now: float) -> ZipLineResult:
    """The canonical set at barrier time ``T``: each row's latest entry not after T."""
    index = np.count_nonzero(M <= T, axis=1).astype(np.int64) - 1
    chosen = M[np.arange(M.shape[0]), index]
    spread = float(chosen.max() - chosen.min())
    return ZipLineResult(index=index, spread=spread, barrier_time=T,
                         cost=float(_cost(spread, T, penalty, now)))


def _canonical_robust(M, A, B, U: float, penalty: float, now: float) -> RobustZipLineResult:
    """Each row's entry of largest lower end among those with upper end <= U (equal: the last)."""
    n, R = M.shape
    a = np.where(B <= U, A, -np.inf)
    best = a.max(axis=1, keepdims=True)
    # the last column holding the row's best lower end
    index = (R - 1 - np.argmax((a == best)[:, ::-1], axis=1)).astype(np.int64)
    rows = np.arange(n)
    chosen, low, high = M[rows, index], A[rows, index], B[rows, index]
    spread = float(high.max() - low.min())
    return RobustZipLineResult(index=index, spread=float(chosen.max() - chosen.min()),
                               barrier_time=float(chosen.max()), interval_spread=spread, upper=U,
                               cost=float(_cost(spread, U, penalty, now)))


def _intervals(M, sigma, z) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``M`` validated and the lower and upper ends ``M ∓ z·σ``."""
    M = _validated(M)
    try:
        sigma = np.asarray(sigma, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"ZipLine: sigma must be a numeric array: {exc}") from None
    if sigma.shape != M.shape:
        raise ValueError(f"ZipLine: sigma must have M's shape {M.shape}, got {sigma.shape}")
    if not np.all(np.isfinite(sigma) & (sigma >= 0)):
        bad = tuple(int(x) for x in np.argwhere(~(np.isfinite(sigma) & (sigma >= 0)))[0])
        raise ValueError(f"ZipLine: sigma must be finite and >= 0, sigma[{bad[0]}, {bad[1]}] = {sigma[bad]}")
    z = float(z)
    if not (np.isfinite(z) and z >= 0.0):
        raise ValueError(f"ZipLine: z must be finite and >= 0, got {z}")
    if z == 0.0:
        return M, M, M
    width = z * sigma
    return M, M - width, M + width


def _validated(M) -> np.ndarray:
    try:
        M = np.asarray(M, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"ZipLine: M must be a numeric (n, R) array: {exc}") from None
    if M.ndim != 2 or M.shape[0] < 1 or M.shape[1] < 1:
        raise ValueError(f"ZipLine: M must be a non-empty 2-D (n workers, R pushes) array, "
                         f"got shape {M.shape}")
    if not np.all(np.isfinite(M)):
        bad = tuple(int(x) for x in np.argwhere(~np.isfinite(M))[0])
        raise ValueError(f"ZipLine: M must be finite, M[{bad[0]}, {bad[1]}] = {M[bad]}")
    decreasing = np.argwhere(np.diff(M, axis=1) < 0)
    if decreasing.size:
        i, j = (int(x) for x in decreasing[0])
        raise ValueError(f"ZipLine: rows of M must be non-decreasing (predicted pushes in time order), "
                         f"row {i} has M[{i}, {j}] = {M[i, j]} > M[{i}, {j + 1}] = {M[i, j + 1]}")
    return M


def _validated_penalty(M: np.ndarray, penalty, now) -> tuple[float, float]:
    penalty = float(penalty)
    if not (np.isfinite(penalty) and penalty >= 0.0):
        raise ValueError(f"ZipLine: penalty must be finite and >= 0, got {penalty}")
    now = float(M.min()) if now is None else float(now)
    if not np.isfinite(now):
        raise ValueError(f"ZipLine: now must be finite, got {now}")
    return penalty, now
